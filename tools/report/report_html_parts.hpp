// Internal to the HTML report (report_html.cpp builds the page, report_charts.cpp the three
// inline SVG charts of each output). Not part of the report API (report.hpp).
#pragma once

#include <string>
#include <string_view>

#include "tools/report/report.hpp"

namespace moecheck::report::html {

// Text made safe for HTML element content and attribute values (& < > " ').
std::string esc(std::string_view s);

// Chart limits that keep a page small (< ~2 MB for a 512-token DeepSeek-V3 case).
inline constexpr size_t kMaxScatterPoints = 4000;  // elements drawn in the scatter
inline constexpr size_t kMaxScatterOver = 1000;    // of them, at most this many over-budget ones
inline constexpr int64_t kMaxHeatRows = 256;       // token rows of the heatmap (max over a bin)
inline constexpr int64_t kHeatBlock = 128;         // hidden columns per heatmap cell

// Per-expert max ratio bars (by global expert id) against the budget line at ratio 1, log y;
// experts whose bias or energy test failed are marked above their bar. <svg class="bars">.
std::string expert_bars_svg(const CompareResult& r);

// |observed - reference| against |reference| (log-log) with each element's budget as a second
// point cloud; without the observed output, ratio against |reference| with the line ratio = 1.
// <svg class="scatter">, followed by a caption paragraph; index: the output's position (unique ids).
std::string scatter_svg(const CompareResult& r, const OutputData* data, size_t index);

// Max ratio per (token, 128-column block), tokens binned to <= kMaxHeatRows rows by the max.
// <svg class="heatmap">, followed by a caption paragraph.
std::string heatmap_svg(const CompareResult& r);

}  // namespace moecheck::report::html
