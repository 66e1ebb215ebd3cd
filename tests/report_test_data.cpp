// Compare results for the report tests (report_test_data.hpp). Values come from CounterRng
// (fixed seeds), so every run and machine builds the same results and the same pages.
#include "tests/report_test_data.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <map>

#include "reference/counter_rng.hpp"
#include "reference/moe_forward.hpp"
#include "tests/small_layer.hpp"

namespace moecheck::testing {

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

// Ratios log-uniform in [1e-4, top) and a reference of unit scale, for every element.
void fill_arrays(CompareResult& r, uint64_t seed, double top) {
  const CounterRng u{seed, 1}, g{seed, 2};
  const size_t n = size_t(r.tokens * r.hidden);
  r.elements = static_cast<int64_t>(n);
  r.ratio.resize(n);
  r.reference_output.resize(n);
  for (size_t i = 0; i < n; ++i) {
    r.ratio[i] = static_cast<float>(top * std::pow(10.0, -4 * u.uniform(i)));
    r.reference_output[i] = g.normal(2 * i);
  }
}

ExpertVerdict good_expert(int64_t id, const CounterRng& u, uint64_t i) {
  ExpertVerdict v;
  v.expert = id;
  v.tokens = 3 + static_cast<int64_t>(u.bits(i) % 20);
  v.slots = v.tokens;
  v.max_ratio = 0.1 + 0.8 * u.uniform(i + 1000);
  v.rel_l2 = 1e-3 * (1 + u.uniform(i + 2000));
  v.beta = 2e-6 * (u.uniform(i + 3000) - 0.5);
  v.beta_se = 3e-6, v.beta_allow = 2.4e-6;
  v.energy_ratio = 0.1 + 0.2 * u.uniform(i + 4000), v.energy_limit = 1.3;
  return v;
}

FamiliarMetrics good_metrics() {
  FamiliarMetrics m;
  m.max_abs = 3.1e-3, m.max_rel = 4.2e-3, m.rel_l2 = 1.2e-3, m.sqnr_db = 58.4, m.cos_diff = 7.2e-7;
  m.mean_rel = 9.5e-4, m.nmse = 1.44e-6, m.allclose_fraction = 1.0, m.nonfinite = 0;
  m.deepgemm_pass = m.sglang_pass = m.vllm_pass = m.nmse_pass = true;
  return m;
}

// Per-expert results sorted as compare_output sorts them: failing first, then by max ratio.
void sort_worst_first(CompareResult& r) {
  std::stable_sort(r.experts.begin(), r.experts.end(), [](const ExpertVerdict& a, const ExpertVerdict& b) {
    if (a.pass != b.pass) return !a.pass;
    return a.max_ratio > b.max_ratio;
  });
}

}  // namespace

CompareResult passing_result() {
  CompareResult r;
  r.name = "emulated";
  r.tokens = 8, r.hidden = 256, r.top_k = 2;
  fill_arrays(r, 11, 0.9);
  const CounterRng u{11, 3};
  for (int64_t e = 0; e < 4; ++e) r.experts.push_back(good_expert(e, u, e));
  sort_worst_first(r);
  r.max_ratio = r.experts.front().max_ratio, r.worst_token = 1, r.worst_col = 17;
  r.metrics = good_metrics();
  r.checks = 3 * 4 + 2;
  return r;
}

CompareResult failing_result() {
  CompareResult r;
  r.name = "cuda";
  r.pass = false;
  r.tokens = 32, r.hidden = 384, r.top_k = 4;
  fill_arrays(r, 12, 0.95);
  // 40 elements over budget, on tokens of expert 117; the worst at (7, 100).
  for (int64_t i = 0; i < 40; ++i) r.ratio[(7 + i % 4) * r.hidden + 60 + i] = static_cast<float>(1.5 + 0.25 * i);
  r.ratio[7 * r.hidden + 100] = 12.5f;
  r.elements_over = 40;
  r.max_ratio = 12.5, r.worst_token = 7, r.worst_col = 100;
  const CounterRng u{12, 3};
  for (int64_t e = 100; e < 130; ++e) r.experts.push_back(good_expert(e, u, e));
  ExpertVerdict& blamed = r.experts[17];  // expert 117
  blamed.max_ratio = 12.5, blamed.blamed = true, blamed.pass = false;
  blamed.beta = 1.21e-2, blamed.beta_se = 1.4e-4, blamed.bias_ok = false;
  blamed.energy_ratio = 84.2, blamed.energy_ok = false;
  ExpertVerdict& biased = r.experts[4];  // expert 104: inside every budget, scale off
  biased.beta = 4.1e-4, biased.beta_se = 2.0e-5, biased.bias_ok = false, biased.pass = false;
  sort_worst_first(r);
  r.mismatched = {3, 9};
  r.ambiguous = {5};
  r.mismatched_tokens = 3, r.ambiguous_tokens = 1;
  r.metrics = good_metrics();  // the familiar checks all miss this fault
  r.checks = 3 * 30 + 2;
  r.checks_failed = 3 + 1 + 1;  // expert 117: elementwise, bias, energy; expert 104: bias; routing
  return r;
}

CompareResult nonfinite_result() {
  CompareResult r;
  r.name = "faulty:nan_token";
  r.pass = false;
  r.tokens = 6, r.hidden = 200, r.top_k = 2;
  fill_arrays(r, 13, 0.5);
  r.ratio[2 * r.hidden + 5] = std::numeric_limits<float>::infinity();
  r.ratio[2 * r.hidden + 6] = std::numeric_limits<float>::quiet_NaN();
  r.elements_over = 2;
  r.max_ratio = kInf, r.worst_token = 2, r.worst_col = 5;
  const CounterRng u{13, 3};
  for (int64_t e = 0; e < 3; ++e) r.experts.push_back(good_expert(e, u, e));
  r.experts[1].max_ratio = kInf, r.experts[1].energy_ratio = std::nan(""), r.experts[1].energy_ok = false;
  r.experts[1].pass = false;
  sort_worst_first(r);
  r.failing_tokens_unexplained = {2};
  r.metrics = good_metrics();
  r.metrics.sqnr_db = kInf, r.metrics.rel_l2 = std::nan(""), r.metrics.nonfinite = 1;
  r.metrics.deepgemm_pass = r.metrics.sglang_pass = r.metrics.vllm_pass = r.metrics.nmse_pass = false;
  r.checks = 3 * 3 + 2;
  r.checks_failed = 2 + 1;  // expert 1: elementwise and energy; token-local
  return r;
}

CompareResult many_failing_result() {
  CompareResult r = failing_result();
  r.name = "faulty:many";
  for (size_t i = 0; i < r.experts.size(); ++i)
    if (r.experts[i].expert < 125) r.experts[i].bias_ok = false, r.experts[i].pass = false;
  sort_worst_first(r);
  r.checks_failed = 3 + 25 + 1;
  return r;
}

BigCase big_result() {
  BigCase b;
  CompareResult& r = b.result;
  r.name = "cuda";
  r.tokens = 512, r.hidden = 7168, r.top_k = 8;
  fill_arrays(r, 14, 1.3);  // ~7% of the elements over budget: a worst case for the page size
  const CounterRng u{14, 3}, s{14, 4};
  b.observed.resize(r.ratio.size());
  for (size_t i = 0; i < r.ratio.size(); ++i) {
    const double budget = 0x1p-8 * (std::fabs(r.reference_output[i]) + 1e-3);
    r.elements_over += r.ratio[i] > 1;
    b.observed[i] = static_cast<float>(r.reference_output[i] + (s.bits(i) & 1 ? 1 : -1) * r.ratio[i] * budget);
  }
  for (int64_t e = 0; e < 256; ++e) r.experts.push_back(good_expert(e, u, e));
  sort_worst_first(r);
  r.max_ratio = 1.3, r.worst_token = 0, r.worst_col = 0;
  r.pass = false;
  r.metrics = good_metrics();
  r.checks = 3 * 256 + 2;
  r.checks_failed = 1;
  return b;
}

Realistic realistic() {
  Realistic R;
  MoeConfig c;
  c.num_experts = 32, c.top_k = 4, c.hidden_size = 1024, c.intermediate_size = 256;
  c.routing = RoutingMethod::renormalize;
  const int64_t T = 128, E = c.num_experts, k = c.top_k, H = c.hidden_size;
  SmallLayer L = make_small_layer(c, T, 20240611, false);
  R.config = c, R.tokens = T, R.nan_token = 77, R.mismatch_token = 10, R.tie_token = 20;

  // An exact tie for the k-th place of the tie token (renormalize: selection by logit).
  std::vector<int32_t> order(E);
  for (int32_t e = 0; e < E; ++e) order[e] = e;
  const float* lg = &L.logits[R.tie_token * E];
  std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return lg[a] > lg[b]; });
  L.logits[R.tie_token * E + order[k]] = lg[order[k - 1]];
  const int32_t tie_a = order[k - 1], tie_b = order[k];

  const MoeProblem p = L.problem();
  CompareOptions opt;
  ForwardOptions fo;
  fo.tier = Tier::quantized, fo.budget = &opt.model;
  const auto t0 = std::chrono::steady_clock::now();
  const ForwardResult ref = moe_forward(p, fo);
  R.reference_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();

  // The backends resolve the tie the other way: same weights (equal logits), other expert.
  Routing dev = ref.routing;
  for (int64_t j = 0; j < k; ++j) {
    int32_t& id = dev.ids[R.tie_token * k + j];
    if (id == tie_a) id = tie_b;
    else if (id == tie_b) id = tie_a;
  }
  ForwardOptions fd;
  fd.tier = Tier::quantized, fd.expert_outputs = true, fd.routing_override = &dev;
  const ForwardResult dv = moe_forward(p, fd);

  // The most used expert gets the scale fault.
  std::map<int32_t, int> uses;
  for (int32_t id : dv.routing.ids) ++uses[id];
  R.scaled_expert = std::max_element(uses.begin(), uses.end(), [](auto& a, auto& b) { return a.second < b.second; })->first;

  // Noise uniform within kNoise of each budget: a correct device's typical error is far below
  // the worst-case bound (reference/BUDGETS.md §10).
  constexpr double kNoise = 0.05;
  enum class Fault { none, scale_expert, nan_token };
  auto observe = [&](Fault fault, const char* name, uint64_t stream) {
    Observation o;
    o.name = name;
    o.topk_ids = dv.routing.ids;
    o.output.resize(size_t(T * H));
    const CounterRng nz{20240611, stream};
    for (int64_t i = 0; i < T * H; ++i) {
      const bool tie_row = i / H == R.tie_token;  // its budget is recomputed for the other expert
      o.output[i] = static_cast<float>(dv.output[i] + (tie_row ? 0.0 : kNoise * (2 * nz.uniform(i) - 1) * ref.budget[i]));
    }
    // Per-slot outputs recorded too, so compare can attribute each failure to its expert.
    o.expert_outputs.resize(size_t(T * k * H));
    for (int64_t i = 0; i < T * k * H; ++i) {
      const bool tie_row = i / (k * H) == R.tie_token;
      const double d = kNoise * (2 * nz.uniform(uint64_t(1) << 40 | i) - 1) * ref.slot_budget[i];
      o.expert_outputs[i] = static_cast<float>(dv.expert_outputs[i] + (tie_row ? 0.0 : d));
    }
    if (fault == Fault::scale_expert) {
      for (int64_t s = 0; s < T * k; ++s)
        if (dv.routing.ids[s] == R.scaled_expert)
          for (int64_t h = 0; h < H; ++h) {
            o.output[(s / k) * H + h] += static_cast<float>(0.012 * dv.routing.weights[s] * dv.expert_outputs[s * H + h]);
            o.expert_outputs[s * H + h] *= 1.012f;
          }
      // A wrong expert for one token (its output is still the reference's choice).
      int32_t* ids = &o.topk_ids[R.mismatch_token * k];
      for (int32_t e = 0; e < E; ++e)
        if (std::find(ids, ids + k, e) == ids + k) {
          ids[k - 1] = e;
          break;
        }
    }
    if (fault == Fault::nan_token) o.output[R.nan_token * H + 3] = std::numeric_limits<float>::quiet_NaN();
    return o;
  };
  const Observation obs[] = {observe(Fault::scale_expert, "faulty:scale_expert", 1),
                             observe(Fault::nan_token, "faulty:nan_token", 2), observe(Fault::none, "emulated", 3)};
  for (const Observation& o : obs) {
    R.results.push_back(compare_output(p, ref, o, opt));
    R.observed.push_back(o.output);
  }
  return R;
}

}  // namespace moecheck::testing
