// The float path's x86 kernels behind truncation_bound_panel_f32 (contract and margins:
// truncation_bound.hpp): the AVX2 block kernel over four weight rows at once, and its AVX-512 form
// for two input rows (truncation_kernels_x86.cpp). Private to the reference library.
#pragma once

#include <cstdint>
#include <vector>

#include "reference/truncation_bound.hpp"
#include "reference/truncation_pair.hpp"

namespace moecheck::truncation_detail {

// Margins of the float path (truncation_bound.hpp): chunk maxima, thresholds, chunk sums.
using truncation_pair::kAbs;
using truncation_pair::kMaxRel;
using truncation_pair::kSumAbs;
using truncation_pair::kSumRel;

// truncation_bound_panel_f32's work for weight rows [0, o) with o a multiple of four, where the
// build has the kernels, `kernel` is not the portable loop and every chunk is 32 long (blocks of
// at most 8 chunks); returns o (0 where the kernels do not apply: the caller's portable loop
// takes every row). g1 = 2^(1-p), r1 = g1 + 2^-24; bfirst: the blocks' first chunks (C at the
// end); bmx [nr, nb]: per weight row the blocks' largest |dec|. finite is cleared where a
// result is not finite.
int64_t panel_f32_x86(const ChunkLayout& L, double g1, double r1, const float* af, const float* hf, const float* lf,
                      int64_t lda, const double* dcum, int64_t n, const float* dec, const float* mag, int64_t ldw,
                      const float* scale, int64_t nr, double* err, int64_t lderr, const float* in, double* abs_out,
                      const float* maga, double* var, const RowCodes* codes, const std::vector<int64_t>& bfirst,
                      const std::vector<double>& bmx, TruncationKernel kernel, bool& finite);

}  // namespace moecheck::truncation_detail
