# Area "report": the reports of `moecheck compare` (tools/report/): terminal text, the JSON
# schema (tools/report/REPORT-SCHEMA.md), the HTML page; report_browser_test renders the page in Debian's
# chromium (/usr/bin/chromium, installed by tools/install-deps.sh) and fails when it is missing.
moecheck_add_test(report_test
  SOURCES report_test.cpp report_test_data.cpp
  LABELS report
  LIBS moecheck_report nlohmann_json::nlohmann_json fmt::fmt)
moecheck_add_test(report_browser_test
  SOURCES report_browser_test.cpp report_test_data.cpp
  LABELS report browser
  LIBS moecheck_report nlohmann_json::nlohmann_json fmt::fmt)
