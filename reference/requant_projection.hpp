// The re-quantization test's reference terms (BUDGETS.md §10.7), computed by moe_forward under a
// budget model.
//
// A skipped (or misplaced) re-quantization of the intermediate moves token t's output by
// -r_t, r_t = sum over its local slots j of w_j W2_j delta_j, delta = h_deq - h: the reference
// knows that move exactly. compare projects the observed deviation d_t on a test direction
//   q_t = sum_j w_j W2_j (a o delta)_j,   a_{j,i} = requant_weight(var(X_{j,i}), cell_{j,i}),
// which keeps the intermediates a correct device leaves on the reference's code and fades out
// those the model says may cross a cell boundary (a crossing moves the output along r_t too, by a
// whole code step). Any weights computed from the reference alone keep the test exact, as long
// as its variance is computed for the same q_t; these maximise its power (BUDGETS.md §10.7).
// For a correct device <d_t, q_t> is noise plus the small mean of the crossings; for a skipped
// step it is -<r_t, q_t>. This pass supplies, per token, q_t, that signal, and the two terms of
// the projection that come from the intermediate's deviations X_{j,i} (which move every output
// element of slot j at once, so the elements' own variances do not describe their projection):
//   signal_t = <r_t, q_t> = sum_{j,i} w_j delta_{j,i} g_{j,i},   g_j = W2_j^T q_t,
//   var_t  = sum_{j,i} w_j^2 var(X_{j,i}) g_{j,i}^2              (exact projections)
//            + sum_{j,g} w_j^2 Var(e_{j,g}) (sum_{i in g} h_{j,i} g_{j,i})^2   (a group's float32
//            scale off by a factor 1 + e moves its whole part of y by e, BUDGETS.md §7: shared by
//            the group, so its projection is the group's sum; groups independent)
//            + sum_{j,g} w_j^2 jump_var(p_g, <dh_up, g_j>_g, <dh_dn, g_j>_g)   (the scale's jumps
//            re-quantize the group: ScaleJumps, dh = rel h + code),
//   mean_t = sum_{j,i} w_j E X_{j,i} g_{j,i}            (E <X's share of d_t, q_t>, signed: the
//            crossings move toward the nearer cell boundary, against delta, coherently),
//   mean_bound_t = sum_{j,i} |w_j| hmean_bound_{j,i} |g_{j,i}|  (what has no known sign).
#pragma once

#include <cstdint>
#include <mutex>
#include <vector>

#include "reference/moe_forward.hpp"

namespace moecheck {

// Per slot t*k+j, filled by the forward's first pass (each slot by the expert that ran it).
struct RequantSlots {
  float* r = nullptr;       // [T*k, H] W2_j (a o delta)_j, before the routing weight
  double* hvar = nullptr;   // [T*k, I] second moment of X_{j,i} (noise_model.hpp RequantMoments::var)
  double* hmean = nullptr;  // [T*k, I] E X_{j,i}
  double* hmean_bound = nullptr;  // [T*k, I] |E X_{j,i} - hmean| <= hmean_bound
  double* delta = nullptr;        // [T*k, I] h_deq - h
  double* h = nullptr;            // [T*k, I] h_deq, GEMM2's input
  double* group_scale_var = nullptr;  // [T*k, ceil(I/G)] Var(e_g) of each group's float32 scale (§7)
  // The groups' scale jumps (noise_model.hpp ScaleJumps): p, rel_up, rel_dn [T*k, ceil(I/G)],
  // code_up, code_dn [T*k, I].
  double* jump_p = nullptr;
  double* jump_rel_up = nullptr;
  double* jump_rel_dn = nullptr;
  double* jump_code_up = nullptr;
  double* jump_code_dn = nullptr;
  // Each code's own crossing (noise_model.hpp CodeFlips): probability and step [T*k, I].
  float* flip_p = nullptr;
  float* flip_step = nullptr;
};

// The test direction's weight of one intermediate whose crossings' second moment is var and
// whose code moves by cell: 1 / (1 + var / (kRequantWeightCell cell^2)), about 1 where a crossing
// is unlikely, about kRequantWeightCell / p where the crossing probability p is larger.
inline constexpr double kRequantWeightCell = 0.01;
double requant_weight(double var, double cell);

// One local expert and its slots t*k+j.
struct ExpertSlots {
  int64_t expert = 0;
  const std::vector<int64_t>* slots = nullptr;
};

// Fills res.requant: the direction (q) [T, H] and signal, var, mean,
// mean_bound [T] from the slots' terms: q_t in double, then a second pass over the
// experts (W2_j^T q_t, one expert per thread, loads serialised by load_mutex as in the forward).
void requant_projections(const MoeProblem& p, const Routing& rt, const RequantSlots& in,
                         const std::vector<ExpertSlots>& experts, int threads, std::mutex& load_mutex,
                         ForwardResult& res);

}  // namespace moecheck
