// CaseReader::validate(): the data checks of FORMAT.md "Validation rules" on top of the
// structural ones. Everything streams: hidden states and logits by blocks of token rows, weights
// one expert at a time, so memory stays at one expert's weights or ~8 MiB of rows.
//
// What is checked: inputs finite; FP8 codes (weights, and the engine's own quantized hidden
// states) never the NaN codes 0x7F/0xFF of float8_e4m3fn; every scale finite and > 0, and a power
// of two in [2^-127, 2^127] when scale_format = ue8m0. Outputs are results under test and are
// not checked here (a NaN output is a compare failure, not a malformed file).
#include <cmath>
#include <functional>

#include <fmt/format.h>

#include "golden/case_reader_impl.hpp"
#include "reference/fp8_quant.hpp"

namespace moecheck {

namespace {

constexpr uint64_t kBlockBytes = uint64_t(8) << 20;

// Counts violations of one rule over one dataset and remembers where the first one was.
struct Tally {
  int64_t count = 0;
  std::string first;
  void hit(const std::function<std::string()>& where) {
    if (count++ == 0) first = where();
  }
  // "<rule>; 3 values are not finite (first at token 2, column 7: nan)"
  void report(std::vector<Problem>& out, const std::string& path, const std::string& rule, const char* one,
              const char* many) const {
    if (count > 0) out.push_back({path, fmt::format("{}; {} {} (first at {})", rule, count, count == 1 ? one : many, first)});
  }
};

bool is_nan_code(uint8_t c) { return (c & 0x7F) == 0x7F; }

bool is_ue8m0(float s) {
  int e = 0;
  return std::frexp(s, &e) == 0.5f && e - 1 >= -127 && e - 1 <= 127;
}

class DataCheck {
 public:
  DataCheck(const CaseReader::Impl& m, std::vector<Problem>& out) : m_(m), out_(out) {}

  void run() {
    guarded("/inputs/hidden_states", [&] { finite_rows("/inputs/hidden_states", m_.config.hidden_size); });
    guarded("/inputs/router_logits", [&] { finite_rows("/inputs/router_logits", m_.config.num_experts); });
    guarded("/inputs/routing_bias", [&] { bias(); });
    guarded("/inputs/hidden_states_fp8", [&] { hidden_fp8(); });
    guarded("/weights", [&] { weights(); });
  }

 private:
  template <class F>
  void guarded(const std::string& where, F&& f) {
    try {
      f();
    } catch (const InputError& e) {
      out_.push_back({e.where(), e.rule()});
    } catch (const H5::Exception& e) {
      out_.push_back({where, "HDF5 error: " + h5::describe(e)});
    }
  }

  int64_t rows_per_block(int64_t cols) const {
    return std::max<int64_t>(1, int64_t(kBlockBytes / uint64_t(std::max<int64_t>(1, cols) * 4)));
  }

  void finite_rows(const std::string& p, int64_t cols) {
    if (!m_.good.count(p)) return;
    Tally bad;
    const int64_t step = rows_per_block(cols);
    for (int64_t t0 = 0; t0 < m_.tokens; t0 += step) {
      const int64_t n = std::min(step, m_.tokens - t0);
      const std::vector<float> x = m_.read_float_rows(p, t0, n);
      for (size_t i = 0; i < x.size(); ++i)
        if (!std::isfinite(x[i]))
          bad.hit([&] { return fmt::format("token {}, column {}: {}", t0 + int64_t(i) / cols, int64_t(i) % cols, x[i]); });
    }
    bad.report(out_, p, "must be finite", "value is not finite", "values are not finite");
  }

  void bias() {
    const std::string p = "/inputs/routing_bias";
    if (!m_.good.count(p)) return;
    Tally bad;
    const std::vector<float> b = m_.read_float_rows(p, 0, m_.config.num_experts);
    for (size_t e = 0; e < b.size(); ++e)
      if (!std::isfinite(b[e])) bad.hit([&] { return fmt::format("expert {}: {}", e, b[e]); });
    bad.report(out_, p, "must be finite", "value is not finite", "values are not finite");
  }

  // Scale rules: finite and > 0; powers of two for ue8m0. allow_zero: a 0 is also accepted (an
  // activation scale under act_scale_floor = none, where an all-zero group has amax / 448 = 0).
  void scales(const std::vector<float>& s, int64_t cols, Tally& bad, Tally& not_pow2,
              const std::function<std::string(int64_t, int64_t)>& where, bool allow_zero = false) const {
    for (size_t i = 0; i < s.size(); ++i) {
      const int64_t r = int64_t(i) / cols, c = int64_t(i) % cols;
      if (allow_zero && s[i] == 0) continue;
      if (!(std::isfinite(s[i]) && s[i] > 0))
        bad.hit([&] { return fmt::format("{}: {}", where(r, c), s[i]); });
      else if (m_.config.scale_format == ScaleFormat::ue8m0 && !is_ue8m0(s[i]))
        not_pow2.hit([&] { return fmt::format("{}: {}", where(r, c), s[i]); });
    }
  }

  void report_scales(const std::string& p, const Tally& bad, const Tally& not_pow2, bool allow_zero = false) {
    bad.report(out_, p, allow_zero ? "scales must be finite and >= 0 (0 only for act_scale_floor = none)" : "scales must be finite and > 0",
               "scale is not", "scales are not");
    not_pow2.report(out_, p, "scale_format = ue8m0 needs powers of two in [2^-127, 2^127]", "scale is not",
                    "scales are not");
  }

  void hidden_fp8() {
    const std::string cp = "/inputs/hidden_states_fp8", sp = "/inputs/hidden_states_scale";
    if (!m_.good.count(cp) || !m_.good.count(sp)) return;
    const int64_t H = m_.config.hidden_size, G = ceil_div(H, m_.config.group_size);
    Tally nan_codes, bad, not_pow2;
    // act_scale_floor = none: a zero group's scale is 0 (its codes must still be numbers: the
    // 0/0 = NaN codes of an unguarded kernel are refused like any NaN code).
    const bool no_floor = m_.config.recipe.act_scale_floor == ActScaleFloor::none;
    const int64_t step = rows_per_block(H);
    for (int64_t t0 = 0; t0 < m_.tokens; t0 += step) {
      const int64_t n = std::min(step, m_.tokens - t0);
      const HiddenFp8 q = m_.read_hidden_fp8(t0, n);
      for (size_t i = 0; i < q.codes.size(); ++i)
        if (is_nan_code(q.codes[i]))
          nan_codes.hit([&] { return fmt::format("token {}, column {}", t0 + int64_t(i) / H, int64_t(i) % H); });
      scales(q.scales, G, bad, not_pow2,
             [&](int64_t r, int64_t c) { return fmt::format("token {}, group {}", t0 + r, c); }, no_floor);
    }
    nan_codes.report(out_, cp, "must not hold the NaN codes 0x7F/0xFF", "code is NaN", "codes are NaN");
    report_scales(sp, bad, not_pow2, no_floor);
  }

  void weights() {
    for (const char* n : {"/weights/w13", "/weights/w13_scale", "/weights/w2", "/weights/w2_scale"})
      if (!m_.good.count(n)) return;
    const MoeConfig& c = m_.config;
    const int64_t H = c.hidden_size, I = c.intermediate_size, B = c.weight_block;
    Tally nan13, nan2, bad13, bad2, pow13, pow2;
    for (size_t slot = 0; slot < m_.expert_ids.size(); ++slot) {
      const ExpertWeights w = m_.read_expert_slot(int64_t(slot));
      auto codes = [&](const std::vector<uint8_t>& q, int64_t cols, Tally& t) {
        for (size_t i = 0; i < q.size(); ++i)
          if (is_nan_code(q[i]))
            t.hit([&] { return fmt::format("expert {}, row {}, column {}", w.expert, int64_t(i) / cols, int64_t(i) % cols); });
      };
      auto block = [&](int64_t r, int64_t col) { return fmt::format("expert {}, block [{}, {}]", w.expert, r, col); };
      codes(w.w13, H, nan13);
      codes(w.w2, I, nan2);
      scales(w.w13_scale, ceil_div(H, B), bad13, pow13, block);
      scales(w.w2_scale, ceil_div(I, B), bad2, pow2, block);
    }
    nan13.report(out_, "/weights/w13", "must not hold the NaN codes 0x7F/0xFF", "code is NaN", "codes are NaN");
    nan2.report(out_, "/weights/w2", "must not hold the NaN codes 0x7F/0xFF", "code is NaN", "codes are NaN");
    report_scales("/weights/w13_scale", bad13, pow13);
    report_scales("/weights/w2_scale", bad2, pow2);
  }

  const CaseReader::Impl& m_;
  std::vector<Problem>& out_;
};

}  // namespace

std::vector<Problem> CaseReader::validate() const {
  std::vector<Problem> out = impl_->problems;
  if (impl_->file && impl_->config_ok && impl_->tokens >= 1) DataCheck(*impl_, out).run();
  return out;
}

}  // namespace moecheck
