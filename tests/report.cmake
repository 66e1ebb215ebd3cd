# Area "report": the reports of `moecheck compare` (tools/report*.cpp): terminal text, the JSON
# schema (tools/REPORT-SCHEMA.md), the HTML page; report_browser_test renders the page in Debian's
# chromium (/usr/bin/chromium, installed by tools/install-deps.sh) and fails when it is missing.
set(MOECHECK_REPORT_SOURCES
  ${PROJECT_SOURCE_DIR}/tools/report_common.cpp
  ${PROJECT_SOURCE_DIR}/tools/report_text.cpp
  ${PROJECT_SOURCE_DIR}/tools/report_json.cpp
  ${PROJECT_SOURCE_DIR}/tools/report_html.cpp
  ${PROJECT_SOURCE_DIR}/tools/report_charts.cpp)
moecheck_add_test(report_test
  SOURCES report_test.cpp report_test_data.cpp ${MOECHECK_REPORT_SOURCES}
  LABELS report
  LIBS nlohmann_json::nlohmann_json fmt::fmt)
moecheck_add_test(report_browser_test
  SOURCES report_browser_test.cpp report_test_data.cpp ${MOECHECK_REPORT_SOURCES}
  LABELS report browser
  LIBS nlohmann_json::nlohmann_json fmt::fmt)
