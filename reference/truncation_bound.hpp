// The chunked accumulation bound of a truncating tensor-core accumulator (BUDGETS.md §2.1).
//
// Contract. A device accumulates the products of one K block (weight_block wide) with
// instructions of m products (AccumulatorModel::instr_k). Each instruction aligns its m products
// and the running sum to the largest exponent E among them, truncates every term to the grid
// g = 2^(E - p + 1) (p = kept_bits), adds them exactly, may truncate the result to p bits once
// more, and writes it to a float32 register. With Mu >= the largest term (its products and the
// register) and G = 2^(1-p) Mu >= g, instruction c errs by at most
//     T_c = G [register nonzero] + G #{ k : 0 < |p_k| < 256 G^ }                (truncation)
//     R_c = (2^(1-p) + 2^-24) ( |S_c| + D_c + E_{c-1} + T_c )                    (result)
// where G^ >= G is the same grid from the count-free recurrence: E^ in place of E, every product
// of the chunk counted (T^_c = G^ ([register nonzero] + m)), so that E^ >= E and G^ >= G by
// induction. Counting below 256 G^ rather than 256 G counts a superset (only loosens: by the
// products in the band [256 G, 256 G^), G^ / G - 1 <= ~4 (m + 1) 2^(1-p), 1.6 % at p = 14), and
// takes the counts off the recurrence's latency chain: they become independent work.
// The product rule: an e4m3 value has an ulp >= |v| / 16 (normal: v < 16 2^(e-3); subnormal:
// v <= 7 2^-9), so a product of two codes is a multiple of a power of two >= |p| / 256 and is
// exact on any power-of-two grid <= |p| / 256; all terms of a block share the scale sa sw, so
// the rule holds for dequantized values too. Only nonzero products below 256 G (1/32 of the largest
// term at p = 14) can lose bits, each less than one step g <= G, whether the hardware truncates
// toward zero or toward -inf (the latter may move a tiny negative product by a whole step, so
// min(|p|, G) would not be a bound).
// Here S_c is the exact partial sum of the block through chunk c (double), the device's operands
// may deviate by da from the reference's (|p_k| lies between (|a| - da)|w| and (|a| + da)|w|), D_c = (sum of da over the block through c) * max |w| of the
// block bounds the resulting drift of the device's partial sum, and E_{c-1} the error
// accumulated in the block before chunk c; Mu = max( max_k (|a_k| + da_k)|w_k|, |S_{c-1}| + D_{c-1}
// + E_{c-1} ). The block's error is E_b = sum_c (T_c + R_c), the output's sum_b E_b (the
// promotion and the deviation terms are added by the caller, BUDGETS.md §2). Unlike the magnitude
// bound c_blk sum |a||w|, this follows the running sum's actual size (on i.i.d. data |S_c| grows
// like sqrt(c), sum |a||w| like c) and charges only the products that can lose bits.
//
// Used only for models whose truncation dominates the float32 terms (kept_bits < 24): for a
// 24-bit model the magnitude bound is already of the order of the register roundings.
#pragma once

#include <cstdint>
#include <vector>

#include "reference/moe_budget.hpp"

namespace moecheck {

// True when the budget uses this file's chunked bound for the model (truncating, < 24 bits).
bool uses_chunked_truncation(const AccumulatorModel& acc);

// Where the chunks of a K-long dot product with blocks of `block` lie: chunk c covers
// [start[c], start[c + 1]); chunks never cross a block; first_in_block[c] marks the first chunk
// of each block and block_of[c] its block.
struct ChunkLayout {
  int64_t K = 0, block = 0, m = 0;
  std::vector<int64_t> start;
  std::vector<int64_t> block_of;
  std::vector<char> first_in_block;
  ChunkLayout() = default;
  ChunkLayout(int64_t K, int64_t block, int64_t m);
  int64_t chunks() const { return int64_t(block_of.size()); }
};

// Alignment magnitude (BUDGETS.md §2.1, "Exponent-field alignment"). The hardware aligns to the
// largest exponent-FIELD sum e(a) + e(b), not to the largest product: an e4m3 subnormal has field
// exponent -6 and a significand below 1, so its products can set a grid up to 8 times (64 for two
// subnormals) coarser than their own size. The bound therefore takes the chunk's largest term as
// max_k A(a_k) A(w_k) with A(x) = max(|x|, 2^-6 s) for x != 0 (s the operand's scale: 2^-6 s is
// the alignment magnitude of every subnormal code), and A(x) = |x| for normal codes.
//
// Per-row inputs of the bound for one operand row a[K] whose device value may deviate by da[K]
// (nullptr: no deviation): hi[k] = |a_k| + da_k, raised to align_floor[k] where hi[k] > 0 (the
// row's A floor, 2^-6 times the largest scale the device may use for k's group; nullptr: none),
// lo[k] = max(|a_k| - da_k, 0), and dcum[c] = sum of da over the block of chunk c, through chunk
// c (layout.chunks() values). hi only enters the chunk maxima (and hi > 0 marks possibly nonzero
// operands), so the floor loosens nothing else.
void truncation_row_inputs(const ChunkLayout& L, const double* a, const double* da, double* hi, double* lo,
                           double* dcum, const double* align_floor = nullptr);

// err[r * lderr + o] = sum over blocks of E_b for rows r < n of a (row stride lda) against rows
// o < nr of the weight panel w (stride ldw; wabs = |w|, same layout). hi, lo (stride lda) and
// dcum (stride L.chunks()): the rows' truncation_row_inputs. walign: the weights' alignment
// magnitudes A(w) (same layout; nullptr: wabs), used for the chunk maxima only. scratch is
// resized as needed.
void truncation_bound_panel(const ChunkLayout& L, const AccumulatorModel& acc, const double* a, const double* hi,
                            const double* lo, int64_t lda, const double* dcum, int64_t n, const double* w,
                            const double* wabs, int64_t ldw, int64_t nr, double* err, int64_t lderr,
                            std::vector<double>& scratch, const double* walign = nullptr, double* var = nullptr);
// var (optional, same layout as err): the statistical model's variance proxy of the same
// accumulation error (BUDGETS.md §10.1): sum over chunks of G T_c + (r1 Q_c)^2, the terms that may
// lose bits taken as independent zero-mean terms of range (-G, G), the result cut likewise.

// ---- float32 fast path ----------------------------------------------------------------------
// The same bound evaluated in float32 (8 lanes per AVX2 register instead of 4, a quarter of the
// bytes per weight), made safe by directed rounding and outward margins. The weights enter as
// the panel's e4m3 values dec (exact in float) and the scale s_b of each K block (w = dec s_b;
// all rows of a panel share one block row of scales), so every float product is of an exactly
// represented weight value:
//   * hf = f32_up(hi) >= hi, so hi |w| = |s| hi |dec| <= |s| (fl(hf |dec|) (1 + 2^-23) + 2^-149)
//     (round to nearest, subnormal results included): the chunk maximum used is
//     mh = |s| (max fl(hf |dec|) (1 + 2^-22) + 2^-148);
//   * lf = f32_down(lo) <= lo, so lo |w| < 256 G^ implies fl(lf |dec|) < float(256 G^ (1 + 2^-22)
//     / |s| + 2^-148) (rounded to nearest, still >= 256 G^ / |s| (1 + 2^-24) + 2^-150): every
//     product the contract counts is counted (a few more may be, which only loosens);
//   * the chunk sums are float: af = float(a) (|a - af| <= 2^-24 |a| + 2^-150), products and sums
//     in float with at most 7 roundings per term (AVX2: four FMA per lane, three to reduce the
//     lanes; the portable loop sums the exact products af dec in double), so the sum S_c in
//     double is within Delta_c = sum over the block's chunks through c of delta_c = 2^-15 mh_c +
//     2^-134 |s| of the exact one (32 (2^-24 + gamma_7) <= 2^-16; 2^-134 covers the underflow of
//     32 conversions and 64 operations of <= 2^-150 |dec|, |dec| <= 448), and |S_c| + Delta_c is
//     used wherever the contract has |S_c|;
//   * products that are exactly zero are never counted, as in the contract: lf is NaN where hi = 0
//     and mag = |dec| is NaN where dec = 0 (NaN compares false, and max ignores it);
//   * non-finite values (operands beyond float range, NaN codes or scales) make the call return
//     false: the caller then uses truncation_bound_panel.
// The result is >= the double evaluation. It exceeds it by the margins above and where a product
// ties the threshold exactly (frequent with e4m3 codes): the float test counts such a product,
// the exact one does not.
float f32_up(double x);    // the least float >= x (x >= 0; +inf beyond FLT_MAX)
float f32_down(double x);  // the greatest float <= x (x >= 0)
// Per-row float inputs from a and truncation_row_inputs' hi and lo: af = float(a) (nearest),
// hf = f32_up(hi), lf = hi > 0 ? f32_down(lo) : NaN. False when some hi is beyond float range
// (use the double path for this row's panels then).
bool truncation_row_inputs_f32(int64_t K, const double* a, const double* hi, const double* lo, float* af, float* hf,
                               float* lf);
// err as truncation_bound_panel for weight rows given as dec and mag = dec != 0 ? |dec| : NaN
// (float, stride ldw) with w = dec * scale[k / L.block]. With in (rows of a non-negative input
// rounded up, stride lda) also abs_out[r * lderr + o] >= sum_k in_k |w_k|, the magnitude product
// the budget needs beside the bound, from the same pass over the operands (float sums widened by
// (1 + 2^-20) and 2^-144 |s| per chunk: gamma_7 and underflow). False when a non-finite value
// arose (err and abs_out are then unspecified).
// maga: the weights' alignment magnitudes in the code domain, max(|dec|, 2^-6) (NaN where dec =
// 0; nullptr: mag), used for the chunk maxima only.
//
// codes (optional, with var): the rows' FP8 codes, for the per-term losses of the noise model
// (below); nullptr: every term that may lose bits counts a whole grid step (BUDGETS.md §10.1).
struct RowCodes;
bool truncation_bound_panel_f32(const ChunkLayout& L, const AccumulatorModel& acc, const float* af, const float* hf,
                                const float* lf, int64_t lda, const double* dcum, int64_t n, const float* dec,
                                const float* mag, int64_t ldw, const float* scale, int64_t nr, double* err,
                                int64_t lderr, const float* in = nullptr, double* abs_out = nullptr,
                                const float* maga = nullptr, double* var = nullptr, const RowCodes* codes = nullptr);

// The float path's kernels: the widest the build has (an AVX-512 form that holds two input rows
// per register where both use their codes, else the AVX2 form), the AVX2 form (one input row per
// register, four weight rows at once), or the portable loop. The AVX-512 and AVX2 forms give the
// same results bit for bit; the portable loop orders its sums differently and agrees with them to
// a few float roundings. Process-wide; for tests that compare the forms. The default is widest.
enum class TruncationKernel { widest, avx2, portable };
void set_truncation_kernel(TruncationKernel k);

// ---- the noise model's per-term losses (BUDGETS.md §10.1) -----------------------------------
// Inside a K block every term is a product of two e4m3 codes times the block's two scales, and
// the device aligns and truncates the code products. Where the device's code is the reference's,
// the bits it loses are known exactly: a grid g (a power of two in code units) removes |p| mod g
// from the product p of the codes, and a grid bound gv >= g removes more (g divides gv), so
// (|p| mod gv)^2 bounds the term's square. gv is the chunk's alignment power from exponent
// fields (2^e(a) 2^e(w), 2^-6 for subnormals: the measured instruction's, §2.1) and the register
// bound of the count-free recurrence, times 2^(1-p): the device's grid is never coarser. The
// sign of each loss is the product's; A1 (§10.4) takes the signs as independent and symmetric,
// so a term counts its loss squared. Where the device's code may differ (the operand's
// deviation reaches 1/32 of it: no longer the same e4m3 code), the term counts gv^2 / 3 as before.
// Per row, stride lda ([n, K]) unless said: code, the code's e4m3 value where the device's code
// is the reference's (NaN where it may differ); field >= the alignment power in code units of
// the device's operand (2^e of the code where known, hi / scale rounded up where not; NaN where
// the operand is 0); scale [n, nb] the row's group scale per K block (block = group: the device
// promotes per block), 0 where the block takes the whole-step model (a scale <= 0 or not finite);
// known [n, nb] 1 where every code of the row's block is known (the fast form).
struct RowCodes {
  const float* code;
  const float* field;
  const double* scale;
  int64_t nb;
  const uint8_t* known;
};
// One row's code and field from its FP8 codes and group scales (group size = L.block; the caller
// passes none otherwise), its deviations dev (nullptr: 0) and truncation_row_inputs' hi.
void truncation_row_codes(const ChunkLayout& L, const uint8_t* codes, const float* scales, const double* dev,
                          const double* hi, float* code, float* field, double* block_scale, uint8_t* block_known);

}  // namespace moecheck
