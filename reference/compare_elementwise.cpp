// Stage "elementwise" of compare_output (compare_stages.hpp): the LAPACK-style ratio
// |observed - reference| / budget of every output element, and of every slot output when the
// backend recorded them. An element passes when its ratio is at most 1; a non-finite observation
// is infinitely far (never "nan <= 1").
#include <algorithm>

#include "reference/compare_stages.hpp"
#include "reference/moe_budget.hpp"

namespace moecheck::compare {

namespace {

// A backend may record its slots in any order (sorted by expert id, say): row j of its
// expert_outputs belongs to its own topk_ids[t, j]. Where its expert set is the judged one (the
// reference's, or its own after a near-tie re-run), the rows are put into the judged order.
std::vector<float> slots_in_judged_order(const Observation& obs, const std::vector<int32_t>& ids, int64_t T,
                                         int64_t k, int64_t H) {
  std::vector<float> out = obs.expert_outputs;
  for (int64_t t = 0; t < T; ++t)
    for (int64_t j = 0; j < k; ++j) {
      const int32_t* bid = &obs.topk_ids[t * k];
      const int64_t jb = std::find(bid, bid + k, ids[t * k + j]) - bid;
      if (jb < k && jb != j) std::copy_n(&obs.expert_outputs[(t * k + jb) * H], H, &out[(t * k + j) * H]);
    }
  return out;
}

}  // namespace

Ratios elementwise_ratios(const MoeProblem& p, const JudgedReference& J, const Observation& obs, bool keep_ratios,
                          CompareResult& R) {
  const MoeConfig& c = p.config;
  const int64_t T = p.tokens, H = c.hidden_size, k = c.top_k;
  Ratios X;
  if (keep_ratios) R.ratio.assign(size_t(T * H), 0.0f);
  X.token_max.assign(T, 0.0);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t h = 0; h < H; ++h) {
      const double r = ratio_of(obs.output[t * H + h], J.output[t * H + h], J.budget[t * H + h]);
      if (keep_ratios) R.ratio[t * H + h] = static_cast<float>(r);
      R.elements_over += !(r <= 1.0);
      if (r > X.token_max[t]) X.token_max[t] = r;
      if (r > R.max_ratio || (R.worst_token < 0 && r >= R.max_ratio)) R.max_ratio = r, R.worst_token = t, R.worst_col = h;
    }

  X.have_slots = !obs.expert_outputs.empty();
  X.slot_max.assign(size_t(T * k), 0.0);
  if (!X.have_slots) return X;
  if (!obs.topk_ids.empty()) X.reordered = slots_in_judged_order(obs, J.ids, T, k, H);
  X.slots = obs.topk_ids.empty() ? obs.expert_outputs.data() : X.reordered.data();
  for (int64_t s = 0; s < T * k; ++s) {
    if (!c.is_local(J.ids[s])) continue;
    for (int64_t h = 0; h < H; ++h) {
      const double yr = J.slot_output[s * H + h], b = J.slot_budget[s * H + h];
      // Slot outputs stored as bf16 carry one more rounding than the budget's float32 value.
      const double bud = obs.expert_outputs_bf16 ? output_budget_bf16(yr, b) : b;
      X.slot_max[s] = std::max(X.slot_max[s], ratio_of(X.slots[s * H + h], yr, bud));
    }
  }
  return X;
}

}  // namespace moecheck::compare
