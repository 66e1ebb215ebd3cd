// Stage "attribution" of compare_output (compare_stages.hpp): an error confined to one expert is
// reported on that expert, not smeared over every expert its tokens also visited.
//
//   With slot outputs recorded: each slot is judged against its own slot budget, so an expert's
//   elementwise verdict comes from its own slots; a failing token none of whose local slots fails
//   is token-local.
//   Without: a token fails when any element of its output row does. Among the experts most of
//   whose tokens fail, the one explaining the most still-unexplained failing tokens is blamed
//   first (greedy set cover) and its failing tokens count as explained. Failing tokens no blamed
//   expert explains are token-local (e.g. a NaN from an all-zero activation group).
#include <algorithm>

#include "reference/compare_stages.hpp"

namespace moecheck::compare {

namespace {

void blame_by_slots(const MoeConfig& c, const JudgedReference& J, const Ratios& X, Attribution& A, CompareResult& R) {
  const int64_t k = c.top_k;
  for (auto& v : R.experts)
    for (int64_t s : A.slots_of[static_cast<int32_t>(v.expert)]) v.max_ratio = std::max(v.max_ratio, X.slot_max[s]);
  for (auto& v : R.experts) v.blamed = !(v.max_ratio <= 1.0);
  for (int64_t t = 0; t < static_cast<int64_t>(X.token_max.size()); ++t) {
    if (X.token_max[t] <= 1.0) continue;
    bool explained = false;
    for (int64_t j = 0; j < k; ++j) explained |= c.is_local(J.ids[t * k + j]) && !(X.slot_max[t * k + j] <= 1.0);
    if (!explained) R.failing_tokens_unexplained.push_back(t);
  }
}

void blame_by_set_cover(const MoeConfig& c, const Ratios& X, Attribution& A, CompareResult& R) {
  const int64_t k = c.top_k, T = static_cast<int64_t>(X.token_max.size());
  auto fails = [&](int64_t t) { return !(X.token_max[t] <= 1.0); };
  std::vector<char> covered(T, 0);
  for (;;) {
    int best = -1;
    double best_frac = 0;
    int64_t best_count = 0;
    for (size_t x = 0; x < R.experts.size(); ++x) {
      int64_t fail = 0, n = 0, prev = -1;
      for (int64_t s : A.slots_of[static_cast<int32_t>(R.experts[x].expert)]) {
        const int64_t t = s / k;
        if (t == prev) continue;
        prev = t, ++n;
        fail += fails(t) && !covered[t];
      }
      const double frac = n ? double(fail) / double(n) : 0;
      if (frac >= 0.5 && (fail > best_count || (fail == best_count && frac > best_frac)))
        best = static_cast<int>(x), best_frac = frac, best_count = fail;
    }
    if (best < 0) break;
    R.experts[best].blamed = true;
    for (int64_t s : A.slots_of[static_cast<int32_t>(R.experts[best].expert)])
      if (fails(s / k)) covered[s / k] = 1, A.owner[s / k] = static_cast<int32_t>(R.experts[best].expert);
  }
  // Failing tokens count for the expert they were attributed to; unexplained ones are reported
  // per token, not smeared over the token's experts.
  for (auto& v : R.experts)
    for (int64_t s : A.slots_of[static_cast<int32_t>(v.expert)]) {
      const int64_t t = s / k;
      if (A.owner[t] == v.expert || !fails(t)) v.max_ratio = std::max(v.max_ratio, X.token_max[t]);
    }
  for (int64_t t = 0; t < T; ++t)
    if (fails(t) && A.owner[t] < 0) R.failing_tokens_unexplained.push_back(t);
}

}  // namespace

Attribution attribute_failures(const MoeProblem& p, const JudgedReference& J, const Ratios& X, CompareResult& R) {
  const MoeConfig& c = p.config;
  const int64_t T = p.tokens, k = c.top_k;
  Attribution A;
  for (int64_t s = 0; s < T * k; ++s)
    if (c.is_local(J.ids[s])) A.slots_of[J.ids[s]].push_back(s);
  for (const auto& [e, sl] : A.slots_of) {
    A.index[e] = R.experts.size();
    ExpertVerdict v;
    v.expert = e, v.slots = static_cast<int64_t>(sl.size());
    std::vector<int64_t> toks;
    for (int64_t s : sl) toks.push_back(s / k);
    toks.erase(std::unique(toks.begin(), toks.end()), toks.end());
    v.tokens = static_cast<int64_t>(toks.size());
    R.experts.push_back(v);
  }
  A.owner.assign(T, -1);
  if (X.have_slots)
    blame_by_slots(c, J, X, A, R);
  else
    blame_by_set_cover(c, X, A, R);
  return A;
}

}  // namespace moecheck::compare
