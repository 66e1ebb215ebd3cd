// The inline SVG charts of the HTML compare report (report_html_parts.hpp): per-expert bars,
// error-vs-magnitude scatter, token x hidden-block heatmap. Plain SVG 1.1 text, no script: the
// page renders in any browser, offline.
//
// Size discipline: point clouds are one <path> per colour of zero-length round-capped segments
// ("M x y h0", ~10 bytes a point) and heatmap cells one <path> per colour class of run-merged
// unit rectangles in a viewBox of cell units, so a 512-token, 7168-column output costs a few
// hundred kB at most.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "tools/report/report_html_parts.hpp"

namespace moecheck::report::html {

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr const char* kOkColor = "#4c78a8";
constexpr const char* kOverColor = "#e45756";
constexpr const char* kBudgetColor = "#f2a33a";
constexpr const char* kBiasColor = "#7b3294";
constexpr const char* kEnergyColor = "#1b1b1b";

// A base-10 logarithmic axis over whole decades [lo, hi] mapped to pixels [p_lo, p_hi].
struct LogAxis {
  int lo = -3, hi = 1;
  double p_lo = 0, p_hi = 1;
  double pos(double v) const {
    const double l = v > 0 ? std::clamp(std::log10(v), double(lo), double(hi)) : double(lo);
    return p_lo + (l - lo) / double(hi - lo) * (p_hi - p_lo);
  }
};

// Decades covering [vmin, vmax] (both > 0), at least min_span and at most max_span of them
// (the top is kept: large errors matter more than tiny ones).
LogAxis make_axis(double vmin, double vmax, double p_lo, double p_hi, int min_span, int max_span) {
  LogAxis a;
  a.lo = static_cast<int>(std::floor(std::log10(vmin)));
  a.hi = static_cast<int>(std::ceil(std::log10(vmax)));
  if (a.hi - a.lo < min_span) a.lo = a.hi - min_span;
  if (a.hi - a.lo > max_span) a.lo = a.hi - max_span;
  a.p_lo = p_lo, a.p_hi = p_hi;
  return a;
}

std::string decade_label(int k) {
  if (k >= -2 && k <= 3) return fmt::format("{}", std::pow(10.0, k));
  return fmt::format("1e{}", k);
}

std::string f1(double v) { return fmt::format("{:.1f}", v); }

// Decade grid lines and labels of a vertical (y) and a horizontal (x) log axis.
std::string y_grid(const LogAxis& a, double x0, double x1) {
  std::string s;
  const int step = a.hi - a.lo > 8 ? 2 : 1;
  for (int k = a.lo; k <= a.hi; ++k) {
    const double y = a.pos(std::pow(10.0, k));
    s += fmt::format("<line x1='{}' y1='{}' x2='{}' y2='{}' class='grid'/>", f1(x0), f1(y), f1(x1), f1(y));
    if ((k - a.lo) % step == 0)
      s += fmt::format("<text x='{}' y='{}' class='tick' text-anchor='end'>{}</text>", f1(x0 - 4), f1(y + 3),
                       decade_label(k));
  }
  return s;
}
std::string x_grid(const LogAxis& a, double y0, double y1) {
  std::string s;
  const int step = a.hi - a.lo > 8 ? 2 : 1;
  for (int k = a.lo; k <= a.hi; ++k) {
    const double x = a.pos(std::pow(10.0, k));
    s += fmt::format("<line x1='{}' y1='{}' x2='{}' y2='{}' class='grid'/>", f1(x), f1(y0), f1(x), f1(y1));
    if ((k - a.lo) % step == 0)
      s += fmt::format("<text x='{}' y='{}' class='tick' text-anchor='middle'>{}</text>", f1(x), f1(y0 + 14),
                       decade_label(k));
  }
  return s;
}

std::string svg_open(const char* cls, int w, int h, const std::string& label) {
  return fmt::format("<svg class='{}' xmlns='http://www.w3.org/2000/svg' width='{}' height='{}' viewBox='0 0 {} {}' "
                     "role='img' aria-label='{}'>",
                     cls, w, h, w, h, esc(label));
}

double finite_or(double x, double alt) { return std::isfinite(x) ? x : alt; }

}  // namespace

// ---- per-expert bars ---------------------------------------------------------------------------
std::string expert_bars_svg(const CompareResult& r) {
  constexpr int W = 1180, H = 290, L = 62, R = 16, T = 34, B = 40;
  std::vector<const ExpertVerdict*> ex;
  for (const ExpertVerdict& v : r.experts) ex.push_back(&v);
  std::sort(ex.begin(), ex.end(), [](auto* a, auto* b) { return a->expert < b->expert; });
  std::string s = svg_open("bars", W, H, "max ratio per expert of output " + r.name);
  if (ex.empty())
    return s + "<text x='20' y='40'>no local expert received a token</text></svg>";
  // The axis always holds the budget line (ratio 1): ratios above kTop are drawn full height (a
  // broken output reaches 1e25, which would otherwise push ratio 1 below the axis's floor).
  constexpr double kTop = 1e8;
  double vmin = 1e-2, vmax = 10;
  bool any_top = false;
  for (auto* v : ex) {
    const double m = std::isnan(v->max_ratio) ? kInf : v->max_ratio;
    if (!(m <= kTop)) any_top = true;
    else if (m > 0) vmin = std::min(vmin, m), vmax = std::max(vmax, m);
  }
  const LogAxis ya = make_axis(vmin, vmax, H - B, T, 3, 10);
  s += y_grid(ya, L, W - R);
  // Bars at most 40 px apart, centred: a handful of experts should not look like a wall.
  const double pw = W - L - R, bw = std::min(pw / double(ex.size()), 40.0), gap = bw > 4 ? bw * 0.2 : 0;
  const double x0 = L + (pw - bw * double(ex.size())) / 2;
  const size_t label_step = std::max<size_t>(1, (ex.size() + 23) / 24);
  for (size_t i = 0; i < ex.size(); ++i) {
    const ExpertVerdict& v = *ex[i];
    const double m = std::isnan(v.max_ratio) ? kInf : v.max_ratio;
    const double x = x0 + i * bw + gap / 2, y = !(m <= kTop) ? T : ya.pos(m), bh = (H - B) - y;
    // Over budget: an element over 1, or failures attributed to it (a combined-output-only run
    // blames an expert by its tokens, whose max ratio may still read <= 1 on its own slots).
    const bool over = !(m <= 1.0) || v.blamed;
    s += fmt::format("<rect class='bar' data-expert='{}' x='{}' y='{}' width='{}' height='{}' fill='{}'><title>expert {}: "
                     "max ratio {}, bias {}, energy {}, {}</title></rect>",
                     v.expert, f1(x), f1(y), f1(std::max(bw - gap, 0.6)), f1(std::max(bh, 0.0)),
                     over ? kOverColor : kOkColor, v.expert, num(v.max_ratio), v.bias_ok ? "ok" : "FAIL",
                     v.energy_ok ? "ok" : "FAIL", v.pass ? "pass" : "FAIL");
    const double cx = x + (bw - gap) / 2, mk = std::clamp(bw - gap, 3.0, 7.0);
    if (!v.bias_ok)  // a downward triangle above the plot
      s += fmt::format("<path class='mark-bias' d='M{} {}h{}l{} {}z' fill='{}'><title>expert {}: bias test failed</title></path>",
                       f1(cx - mk / 2), T - 14, f1(mk), f1(-mk / 2), f1(mk), kBiasColor, v.expert);
    if (!v.energy_ok)
      s += fmt::format("<rect class='mark-energy' x='{}' y='{}' width='{}' height='{}' fill='{}'><title>expert {}: energy "
                       "test failed</title></rect>",
                       f1(cx - mk / 2), T - 6, f1(mk), f1(std::min(mk, 5.0)), kEnergyColor, v.expert);
    if (i % label_step == 0)
      s += fmt::format("<text x='{}' y='{}' class='tick' text-anchor='middle'>{}</text>", f1(cx), H - B + 14, v.expert);
  }
  const double y1 = ya.pos(1.0);
  s += fmt::format("<line x1='{}' y1='{}' x2='{}' y2='{}' class='budget-line'/>", L, f1(y1), W - R, f1(y1));
  s += fmt::format("<text x='{}' y='{}' class='note' text-anchor='end'>budget: ratio 1</text>", W - R - 4, f1(y1 - 4));
  s += fmt::format("<line x1='{}' y1='{}' x2='{}' y2='{}' class='axis'/>", L, H - B, W - R, H - B);
  s += fmt::format("<text x='{}' y='{}' class='label' text-anchor='middle'>global expert id</text>", L + pw / 2, H - 6);
  s += fmt::format("<text transform='translate(14 {}) rotate(-90)' class='label' text-anchor='middle'>max ratio "
                   "(log)</text>",
                   (T + H - B) / 2);
  // Legend in the top margin.
  s += fmt::format("<g class='legend'><rect x='{}' y='4' width='10' height='10' fill='{}'/><text x='{}' y='13'>ratio &lt;= "
                   "1</text><rect x='{}' y='4' width='10' height='10' fill='{}'/><text x='{}' y='13'>over budget{}</text>"
                   "<path d='M{} 5h9l-4.5 9z' fill='{}'/><text x='{}' y='13'>bias test failed</text><rect x='{}' y='7' "
                   "width='9' height='5' fill='{}'/><text x='{}' y='13'>energy test failed</text></g>",
                   L, kOkColor, L + 14, L + 90, kOverColor, L + 104, any_top ? " (full height: above 1e8 or infinite)" : "",
                   L + 300, kBiasColor, L + 313, L + 430, kEnergyColor, L + 443);
  return s + "</svg>";
}

// ---- error vs magnitude ----------------------------------------------------------------------------
namespace {

// The scatter's view of one output: element i's y value, whether it is over budget, and its
// budget, from the observed output (|observed - reference|) or else the kept ratios.
struct ScatterData {
  const CompareResult& r;
  const OutputData* data;
  size_t n;
  bool have_ratio, have_ref, have_obs;
  ScatterData(const CompareResult& res, const OutputData* d)
      : r(res), data(d), n(size_t(res.tokens * res.hidden)), have_ratio(res.ratio.size() == n),
        have_ref(res.reference_output.size() == n),
        have_obs(d != nullptr && d->observed.size() == n && have_ref) {}
  // |observed - reference| (or the ratio); < 0 = not drawable.
  double y(size_t i) const {
    if (std::fabs(r.reference_output[i]) <= 0) return -1;
    if (have_obs) {
      const double o = data->observed[i];
      return std::isfinite(o) ? std::fabs(o - r.reference_output[i]) : -1;
    }
    return std::isfinite(r.ratio[i]) ? r.ratio[i] : -1;
  }
  double x(size_t i) const { return std::fabs(r.reference_output[i]); }
  bool over(size_t i) const { return have_ratio && !(r.ratio[i] <= 1.0f); }
  // Budget of a drawn element, recovered exactly from its ratio: |d| / ratio.
  double budget(size_t i) const {
    const double q = have_ratio ? r.ratio[i] : 0;
    return have_obs && q > 0 && std::isfinite(q) ? y(i) / q : -1.0;
  }
};

// The elements drawn: the worst over-budget ones first, then a regular stride of the rest
// (deterministic), with the counts the caption reports.
struct ScatterSample {
  std::vector<size_t> drawn;
  size_t n_worst = 0, stride = 1, equal = 0, hidden = 0;
};
ScatterSample scatter_sample(const ScatterData& d) {
  ScatterSample out;
  std::vector<std::pair<float, size_t>> worst;
  size_t drawable = 0;
  for (size_t i = 0; i < d.n; ++i) {
    const double y = d.y(i);
    if (y > 0) {
      ++drawable;
      if (d.over(i)) worst.push_back({d.r.ratio[i], i});
    } else if (y == 0) ++out.equal;
    else ++out.hidden;
  }
  out.n_worst = std::min(worst.size(), kMaxScatterOver);
  std::partial_sort(worst.begin(), worst.begin() + out.n_worst, worst.end(),
                    [](auto& a, auto& b) { return a.first > b.first || (a.first == b.first && a.second < b.second); });
  worst.resize(out.n_worst);
  std::vector<size_t> pick;
  for (auto& w : worst) pick.push_back(w.second);
  std::sort(pick.begin(), pick.end());
  const size_t rest = drawable - out.n_worst, room = kMaxScatterPoints - out.n_worst;
  out.stride = rest > room ? (rest + room - 1) / room : 1;
  size_t seen = 0;
  for (size_t i = 0; i < d.n; ++i) {
    if (!(d.y(i) > 0) || std::binary_search(pick.begin(), pick.end(), i)) continue;
    if (seen++ % out.stride == 0) out.drawn.push_back(i);
  }
  out.drawn.insert(out.drawn.end(), pick.begin(), pick.end());
  return out;
}

// Log axes covering the drawn points and their budgets (a default box when none are drawn; the
// ratio view always shows 0.1 to 10).
std::pair<LogAxis, LogAxis> scatter_axes(const ScatterData& d, const std::vector<size_t>& drawn, int W, int H, int L,
                                         int R, int T, int B) {
  double xmin = kInf, xmax = 0, ymin = kInf, ymax = 0;
  for (size_t i : drawn) {
    const double x = d.x(i), y = d.y(i), b = d.budget(i);
    xmin = std::min(xmin, x), xmax = std::max(xmax, x), ymin = std::min(ymin, y), ymax = std::max(ymax, y);
    if (b > 0) ymin = std::min(ymin, b), ymax = std::max(ymax, b);
  }
  if (drawn.empty()) xmin = 1e-3, xmax = 1, ymin = 1e-3, ymax = 1;
  if (!d.have_obs) ymin = std::min(ymin, 0.1), ymax = std::max(ymax, 10.0);
  return {make_axis(xmin, xmax, L, W - R, 2, 12), make_axis(ymin, ymax, H - B, T, 2, 14)};
}

}  // namespace

std::string scatter_svg(const CompareResult& r, const OutputData* data, size_t index) {
  constexpr int W = 580, H = 440, L = 64, R = 16, T = 26, B = 46;
  const ScatterData d(r, data);
  std::string s = svg_open("scatter", W, H, "error against magnitude, output " + r.name);
  if (!d.have_ref || (!d.have_obs && !d.have_ratio))
    return s + "<text x='20' y='40'>not available: needs the observed output or the kept ratios</text></svg>";
  const ScatterSample sm = scatter_sample(d);
  const auto [xa, ya] = scatter_axes(d, sm.drawn, W, H, L, R, T, B);
  s += y_grid(ya, L, W - R) + x_grid(xa, H - B, T);
  s += fmt::format("<defs><clipPath id='clip-{0}'><rect x='{1}' y='{2}' width='{3}' height='{4}'/></clipPath></defs>",
                   index, L, T, W - L - R, H - B - T);
  std::string d_ok, d_over, d_budget;
  for (size_t i : sm.drawn) {
    const std::string p = fmt::format("M{:.0f} {:.0f}h0", xa.pos(d.x(i)), ya.pos(d.y(i)));
    (d.over(i) ? d_over : d_ok) += p;
    const double b = d.budget(i);
    if (b > 0) d_budget += fmt::format("M{:.0f} {:.0f}h0", xa.pos(d.x(i)), ya.pos(b));
  }
  s += fmt::format("<g clip-path='url(#clip-{})' stroke-linecap='round' fill='none'>", index);
  if (d.have_obs) {
    // Orientation: one bf16 half-ulp at the lowest relative resolution, |d| = 2^-9 |ref|.
    const double x0 = std::pow(10.0, xa.lo), x1 = std::pow(10.0, xa.hi);
    s += fmt::format("<line x1='{}' y1='{}' x2='{}' y2='{}' class='guide'/>", f1(xa.pos(x0)), f1(ya.pos(x0 * 0x1p-9)),
                     f1(xa.pos(x1)), f1(ya.pos(x1 * 0x1p-9)));
    s += fmt::format("<path class='pts-budget' d='{}' stroke='{}' stroke-width='2.6' stroke-opacity='0.55'/>", d_budget,
                     kBudgetColor);
  } else {
    const double y1 = ya.pos(1.0);
    s += fmt::format("<line x1='{}' y1='{}' x2='{}' y2='{}' class='budget-line'/>", L, f1(y1), W - R, f1(y1));
  }
  s += fmt::format("<path class='pts-ok' d='{}' stroke='{}' stroke-width='2.6' stroke-opacity='0.7'/>", d_ok, kOkColor);
  s += fmt::format("<path class='pts-over' d='{}' stroke='{}' stroke-width='3.2'/>", d_over, kOverColor);
  s += "</g>";
  s += fmt::format("<rect x='{}' y='{}' width='{}' height='{}' class='frame'/>", L, T, W - L - R, H - B - T);
  s += fmt::format("<text x='{}' y='{}' class='label' text-anchor='middle'>|reference| (log)</text>", L + (W - L - R) / 2,
                   H - 8);
  s += fmt::format("<text transform='translate(14 {}) rotate(-90)' class='label' text-anchor='middle'>{}</text>",
                   (T + H - B) / 2, d.have_obs ? "|observed - reference| (log)" : "ratio (log)");
  s += fmt::format("<g class='legend'><circle cx='{}' cy='12' r='3' fill='{}'/><text x='{}' y='16'>within budget</text>"
                   "<circle cx='{}' cy='12' r='3' fill='{}'/><text x='{}' y='16'>over budget</text>",
                   L + 4, kOkColor, L + 11, L + 110, kOverColor, L + 117);
  if (d.have_obs)
    s += fmt::format("<circle cx='{}' cy='12' r='3' fill='{}'/><text x='{}' y='16'>the element's budget</text>"
                     "<line x1='{}' y1='12' x2='{}' y2='12' class='guide'/><text x='{}' y='16'>2^-9 |ref|</text>",
                     L + 206, kBudgetColor, L + 213, L + 350, L + 370, L + 374);
  s += "</g></svg>";
  s += fmt::format("<p class='caption'>{} of {} elements drawn ({} over budget, the worst first; {})", sm.drawn.size(),
                   d.n, sm.n_worst,
                   sm.stride > 1 ? fmt::format("of the rest every {}th", sm.stride) : std::string("all the rest"));
  if (sm.equal) s += fmt::format("; {} equal to the reference not drawn", sm.equal);
  if (sm.hidden) s += fmt::format("; {} with a zero reference or a non-finite value not drawn", sm.hidden);
  return s + ".</p>";
}

// ---- token x hidden-block heatmap ----------------------------------------------------------------
namespace {

// Classes of a cell's max ratio: 0 exactly, then decades up to 1, then over-budget bands.
constexpr double kHeatEdge[] = {0, 1e-3, 1e-2, 1e-1, 0.5, 1, 10, 1000};
constexpr const char* kHeatColor[] = {"#ffffff", "#eef4fa", "#d4e4f2", "#a9c9e4", "#6fa3d0",
                                      "#2f6fb0", "#fdae61", "#f46d43", "#a50026"};
constexpr const char* kHeatLabel[] = {"0", "&le;1e-3", "&le;0.01", "&le;0.1", "&le;0.5",
                                      "&le;1", "&le;10", "&le;1e3", "&gt;1e3"};
constexpr int kHeatLabelChars[] = {1, 5, 5, 4, 4, 2, 3, 4, 4};  // as displayed, for the legend layout
constexpr int kHeatClasses = 9;

int heat_class(double v) {
  int c = 0;
  while (c < kHeatClasses - 1 && v > kHeatEdge[c]) ++c;
  return c;
}

// The class of each (row, block) cell [rows, blocks]: the highest of its ratios' classes, a row
// holding tokens t with t rows / T = row; NaN counts as infinite.
std::vector<int> heat_cells(const CompareResult& r, int64_t rows, int64_t blocks) {
  std::vector<int> cell(size_t(rows * blocks), 0);
  for (int64_t t = 0; t < r.tokens; ++t) {
    const int64_t row = t * rows / r.tokens;
    for (int64_t h = 0; h < r.hidden; ++h) {
      const float v = r.ratio[t * r.hidden + h];
      int& c = cell[row * blocks + h / kHeatBlock];
      c = std::max(c, heat_class(std::isnan(v) ? kInf : double(v)));
    }
  }
  return cell;
}

// One path per class (class 0 is the background), each a run of equal cells in a row as one rectangle.
std::vector<std::string> heat_paths(const std::vector<int>& cell, int64_t rows, int64_t blocks) {
  std::vector<std::string> paths(kHeatClasses);
  for (int64_t y = 0; y < rows; ++y)
    for (int64_t b = 0; b < blocks;) {
      const int c = cell[y * blocks + b];
      int64_t e = b + 1;
      while (e < blocks && cell[y * blocks + e] == c) ++e;
      if (c > 0) paths[c] += fmt::format("M{} {}h{}v1h-{}z", b, y, e - b, e - b);
      b = e;
    }
  return paths;
}

// The plot's frame position and size (pixels) and its grid (rows x blocks).
struct HeatFrame {
  int left, top, width, height;
  int64_t rows, blocks;
};

std::string heat_axes(const CompareResult& r, const HeatFrame& f) {
  std::string s;
  for (int i = 0; i <= 8; ++i) {  // token ticks
    const int64_t row = std::min<int64_t>(f.rows - 1, i * f.rows / 8);
    const double y = f.top + (row + 0.5) * f.height / double(f.rows);
    s += fmt::format("<text x='{}' y='{}' class='tick' text-anchor='end'>{}</text>", f.left - 4, f1(y + 3),
                     row * r.tokens / f.rows);
  }
  const int64_t xstep = std::max<int64_t>(1, (f.blocks + 7) / 8);
  for (int64_t b = 0; b < f.blocks; b += xstep)
    s += fmt::format("<text x='{}' y='{}' class='tick' text-anchor='middle'>{}</text>",
                     f1(f.left + (b + 0.5) * f.width / double(f.blocks)), f.top + f.height + 14, b * kHeatBlock);
  s += fmt::format("<text x='{}' y='{}' class='label' text-anchor='middle'>hidden column (block start)</text>",
                   f.left + f.width / 2, f.top + f.height + 30);
  s += fmt::format("<text transform='translate(14 {}) rotate(-90)' class='label' text-anchor='middle'>token</text>",
                   f.top + f.height / 2);
  return s;
}

std::string heat_legend(int left, int bottom) {
  std::string s = fmt::format("<g class='legend'><text x='{}' y='{}' text-anchor='end'>max ratio</text>", left - 6,
                              bottom - 16);
  for (int c = 0, x = left; c < kHeatClasses; x += 15 + 7 * kHeatLabelChars[c] + 10, ++c)
    s += fmt::format("<rect x='{}' y='{}' width='12' height='12' fill='{}' stroke='#999' stroke-width='0.5'/>"
                     "<text x='{}' y='{}'>{}</text>",
                     x, bottom - 26, kHeatColor[c], x + 15, bottom - 16, kHeatLabel[c]);
  return s + "</g>";
}

}  // namespace

std::string heatmap_svg(const CompareResult& r) {
  constexpr int W = 580, H = 440, L = 64, R = 16, T = 26, B = 74;
  const size_t n = size_t(r.tokens * r.hidden);
  std::string s = svg_open("heatmap", W, H, "max ratio per token and 128-column block, output " + r.name);
  if (r.ratio.size() != n || n == 0)
    return s + "<text x='20' y='40'>not available: the ratios were not kept</text></svg>";
  const int64_t rows = std::min(r.tokens, kMaxHeatRows), blocks = (r.hidden + kHeatBlock - 1) / kHeatBlock;
  const std::vector<std::string> paths = heat_paths(heat_cells(r, rows, blocks), rows, blocks);
  const HeatFrame f{L, T, W - L - R, H - T - B, rows, blocks};
  s += fmt::format("<rect x='{}' y='{}' width='{}' height='{}' fill='{}'/>", L, T, f.width, f.height, kHeatColor[0]);
  s += fmt::format("<svg x='{}' y='{}' width='{}' height='{}' viewBox='0 0 {} {}' preserveAspectRatio='none' "
                   "shape-rendering='crispEdges'>",
                   L, T, f.width, f.height, blocks, rows);
  for (int c = 1; c < kHeatClasses; ++c)
    if (!paths[c].empty()) s += fmt::format("<path class='heat-{}' d='{}' fill='{}'/>", c, paths[c], kHeatColor[c]);
  s += "</svg>";
  s += fmt::format("<rect x='{}' y='{}' width='{}' height='{}' class='frame'/>", L, T, f.width, f.height);
  s += heat_axes(r, f);
  s += heat_legend(L, H);
  s += "</svg>";
  s += fmt::format("<p class='caption'>Max ratio per (token, {}-column block): {} tokens in {} rows{}, {} blocks; "
                   "infinite and NaN ratios count as &gt;1e3.</p>",
                   kHeatBlock, r.tokens, rows,
                   rows < r.tokens ? fmt::format(" (each row the max over {} tokens)", finite_or(double(r.tokens) / rows, 1))
                                   : "",
                   blocks);
  return s;
}

}  // namespace moecheck::report::html
