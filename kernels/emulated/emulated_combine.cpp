// Finalize of the emulated backend: the routing-weighted combine of the slot outputs under the
// case's combine recipe (emulated_moe.hpp "finalize"; the reference's side is
// reference/moe_combine.hpp). Every float32 operation is written out (no FMA contraction).
#include <algorithm>
#include <vector>

#include "kernels/emulated/emulated_internal.hpp"
#include "reference/fp8_formats.hpp"

namespace moecheck::emulated {

void finalize(Combine how, int64_t T, int64_t k, int64_t H, const int32_t* ids, const float* weights,
              const int64_t* row, const float* slot_out, int64_t wrap, uint16_t* out_bf16) {
  // Slot value (row r, column i), read through the int32 wrap of the fault when it is on.
  auto y = [&](int64_t r, int64_t i) {
    const int64_t f = r * H + i;
    // faulty int32_overflow: docs/BUG-CLASSES.md #22 (row * H computed in int32 wraps)
    return slot_out[wrap > 0 && f >= wrap ? f % wrap : f];
  };
  std::vector<float> acc(H);
  std::vector<int64_t> order(k);
  for (int64_t t = 0; t < T; ++t) {
    std::fill(acc.begin(), acc.end(), 0.0f);
    // Slots in the order the engine adds them: slot order, or ascending expert id.
    for (int64_t j = 0; j < k; ++j) order[j] = t * k + j;
    if (how == Combine::bf16_expert_order)
      std::sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return ids[a] < ids[b]; });
    for (int64_t s : order) {
      const int64_t r = row[s];
      if (r < 0) continue;
      const float w = weights[s];
      for (int64_t i = 0; i < H; ++i) {
        const float p = w * y(r, i);  // fl32(w * y)
        if (how == Combine::f32)
          acc[i] += p;  // float32 sum of the products, rounded to bf16 once at the end
        else if (how == Combine::bf16_slots)
          acc[i] += bf16_round(p);  // bf16 slot value (GEMM2 epilogue), float32 sum
        else
          acc[i] = bf16_round(acc[i] + bf16_round(p));  // bf16 buffer, index_add_ per expert
      }
    }
    for (int64_t i = 0; i < H; ++i) out_bf16[t * H + i] = bf16_encode(acc[i]);
  }
}

}  // namespace moecheck::emulated
