// The re-quantization test's reference terms (BUDGETS.md §10.7), computed by moe_forward under a
// budget model.
//
// A skipped (or misplaced) re-quantization of the intermediate moves token t's output by
// -r_t, r_t = sum over its local slots j of w_j W2_j (h_deq - h)_j: the reference knows that
// direction exactly. compare regresses the observed deviation d_t on r_t; for a correct device
// the projection <d_t, r_t> is noise plus the small mean of the re-quantization's crossings.
// This pass supplies, per token, r_t and the two terms of that projection that come from the
// intermediate's deviations X_{j,i} (which move every output element of slot j at once, so the
// elements' own variances do not describe their projection):
//   var_t  = sum_{j,i} w_j^2 var(X_{j,i}) g_{j,i}^2,   g_j = W2_j^T r_t  (exact projections),
//   mean_t = sum_{j,i} w_j E X_{j,i} g_{j,i}            (E <X's share of d_t, r_t>, signed: the
//            crossings move toward the nearer cell boundary, against h_deq - h, coherently),
//   mean_bound_t = sum_{j,i} |w_j| hmean_bound_{j,i} |g_{j,i}|  (what has no known sign).
#pragma once

#include <cstdint>
#include <mutex>
#include <vector>

#include "reference/moe_forward.hpp"

namespace moecheck {

// Per slot t*k+j, filled by the forward's first pass (each slot by the expert that ran it).
struct RequantSlots {
  float* r = nullptr;       // [T*k, H] W2_j (h_deq - h)_j, before the routing weight
  double* hvar = nullptr;   // [T*k, I] second moment of X_{j,i} (noise_model.hpp RequantMoments::var)
  double* hmean = nullptr;  // [T*k, I] E X_{j,i}
  double* hmean_bound = nullptr;  // [T*k, I] |E X_{j,i} - hmean| <= hmean_bound
};

// One local expert and its slots t*k+j.
struct ExpertSlots {
  int64_t expert = 0;
  const std::vector<int64_t>* slots = nullptr;
};

// Fills res.requant_direction [T, H], res.requant_var, requant_mean, requant_mean_bound [T] from
// the slots' terms: r_t in double, then a second pass over the experts (W2_j^T r_t, one expert
// per thread, loads serialised by load_mutex as in the forward).
void requant_projections(const MoeProblem& p, const Routing& rt, const RequantSlots& in,
                         const std::vector<ExpertSlots>& experts, int threads, std::mutex& load_mutex,
                         ForwardResult& res);

}  // namespace moecheck
