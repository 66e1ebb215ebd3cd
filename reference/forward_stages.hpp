// The pieces of the float64 forward (moe_forward.hpp) that its files share:
//   forward_panels.cpp  gemm_fp8_weight: a product with an FP8 weight, dequantized a few rows at
//                       a time, and the budget's extra products from the same panels
//   forward_expert.cpp  run_expert: the two GEMMs of one expert with the tier's roundings in
//                       between, and the budget's and the noise model's terms beside them
//   moe_forward.cpp     the driver: plan, chunks of tokens, worker threads over experts,
//                       combine in slot order
// Internal to reference/: the contract for callers is moe_forward.hpp.
#pragma once

#include <Eigen/Core>
#include <cstdint>
#include <utility>
#include <vector>

#include "reference/moe_forward.hpp"
#include "reference/noise_model.hpp"
#include "reference/requant_projection.hpp"
#include "reference/truncation_bound.hpp"
#include "reference/truncation_pair.hpp"

namespace moecheck::forward {

using RowMat = Eigen::Matrix<double, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
using RowMap = Eigen::Map<RowMat>;
using ConstRowMap = Eigen::Map<const RowMat>;

// ---- plan ----------------------------------------------------------------------------
struct ExpertJob {
  int64_t expert = 0;              // global id
  std::vector<int64_t> slots;      // t_local * k + j, ascending (token order)
};

// ---- panels --------------------------------------------------------------------------
// Rows of a weight dequantized per GEMM call: 32 rows x H doubles (1.8 MiB at H = 7168) stay in
// L2/L3 while the GEMM reads them.
constexpr int64_t kPanelRows = 32;

// The float operands of the truncation bound's fast path (truncation_bound.hpp): the panel's
// e4m3 values dec and mag = |dec| (NaN where zero), [kPanelRows, K] each.
// maga: their alignment magnitudes max(|dec|, 2^-6) (NaN where zero; truncation_bound.hpp).
struct Float32Panel {
  float* dec;
  float* mag;
  float* maga;
};

// A float buffer of n values that starts on a 64-byte boundary, inside v (resized for the
// room); why: forward_panels.cpp.
float* aligned_floats(std::vector<float>& v, size_t n);

// The weights' alignment magnitude A(w) (truncation_bound.hpp): an e4m3 subnormal code aligns as
// 2^-6 of its block's scale.
using truncation_pair::kSubnormalAlign;

// Products computed from the same dequantized panels as the main one (the budgets' extras):
// abs: out = in * |W|^T, the sums of magnitudes; back: back = out * W [n, K], the main product's
// output multiplied back through W (the flip projections <W2[:, i], y> of BUDGETS.md §7 for
// every i at once, contiguous, instead of a strided walk down W2's columns per flip).
struct AbsProduct {
  const RowMat* in;
  RowMat* out;
};
// The chunked truncation bound of a truncating accumulator (truncation_bound.hpp): per row of
// the input its chunk maxima and deviation sums, out err [n, N] = sum over blocks of E_b. The
// float32 path is used when the rows' float inputs exist (rows_f32) and it answers; else the
// double one.
struct TruncationProduct {
  const ChunkLayout* layout;
  const AccumulatorModel* acc;
  const RowMat* hi;
  const RowMat* lo;
  const RowMat* dcum;
  RowMat* err;
  std::vector<double>* scratch;
  RowMat* var = nullptr;  // [n, N] the noise model's variance proxy of the same error (BUDGETS.md §10.1)
  const float* af = nullptr;  // [n, K] float inputs of the rows
  const float* hf = nullptr;
  const float* lf = nullptr;
  // The first magnitude product's input rounded up ([n, K]; null: not fused): the float path
  // then computes that product too, from the same pass (truncation_bound.hpp).
  const float* abs_in = nullptr;
  bool rows_f32 = false;
  Float32Panel panel{};  // buffers for the weights' float operands ([kPanelRows, K] each)
  std::vector<double>* walign = nullptr;  // buffer for the double path's A(w) panel
  const RowCodes* codes = nullptr;        // the rows' codes for the variance's per-term losses (float path)
};
// The float32 products (the squares of the noise model, the re-quantization direction: each needs
// a few digits; float halves the GEMM's cost): the input converted once per call into `in`, the
// panel's (squared) weights into `panel`, the product into `out` before it is widened.
struct Float32Buffers {
  std::vector<float> panel, in, out;
};
// out [n, ceil(K/group)]: per row and group g of K, the projection of the group's own part of the
// product, (in_g W_g^T)[r, :], on the whole product row (in W^T)[r, :], in float32 (a variance
// needs a few digits): how a common factor on group g moves the row along itself (BUDGETS.md §7).
struct GroupProjection {
  const RowMat* in = nullptr;
  RowMat* out = nullptr;
  int64_t group = 0;
  std::vector<float> panel, a, part, whole;
};
struct PanelExtras {
  AbsProduct abs[2];
  int n_abs = 0;
  RowMat* back = nullptr;
  // When given, back is needed only at these (row, column) pairs (the flip-able intermediates of
  // each row): computed as dot products when they are few, else as the whole product.
  const std::vector<std::vector<std::pair<int64_t, double>>>* back_only = nullptr;
  // With back: col_sq [K] = the squared norms of W's columns, sum over the N rows of W[:, k]^2
  // (how far a flip of input k moves the whole output: the energy test's crossings, §10.8), at
  // the back_only columns when the back product is sparse (0 elsewhere), else at every column.
  std::vector<double>* col_sq = nullptr;
  const TruncationProduct* trunc = nullptr;  // needs n_abs > 0 (it reads the |W| panel)
  // sq: out = in * (W o W)^T, the sums of squares of the noise model (BUDGETS.md §10.2), through
  // the float32 buffers sq_buf.
  AbsProduct sq{};
  Float32Buffers* sq_buf = nullptr;
  // lin: out = in * W^T in float32 through lin_buf (the re-quantization direction, §10.7: a test
  // direction needs a few digits, as a variance does).
  AbsProduct lin{};
  Float32Buffers* lin_buf = nullptr;
  GroupProjection* grp = nullptr;
  void add_abs(const RowMat* in, RowMat* out) { abs[n_abs++] = {in, out}; }
  void add_sq(const RowMat* in, RowMat* out, Float32Buffers* buf) { sq = {in, out}, sq_buf = buf; }
  void add_lin(const RowMat* in, RowMat* out, Float32Buffers* buf) { lin = {in, out}, lin_buf = buf; }
  // Whether any product beside the main one is asked for.
  bool any() const { return n_abs || back || col_sq || trunc || sq.in || lin.in || grp; }
};

// out [n, N] = a [n, K] * W^T, W the [N, K] FP8 weight, dequantized panel by panel (and |W|
// from the same codes through a table of magnitudes, when extras ask for it). With products
// (weight_products.hpp): the product and the extras on that engine where it runs them all, else
// on these panels.
void gemm_fp8_weight(const RowMat& a, const uint8_t* codes, const float* scales, int64_t N, int64_t K, int64_t B,
                     RowMat& out, std::vector<double>& panel, std::vector<double>& lut, const PanelExtras& ex = {},
                     std::vector<double>* abs_panel = nullptr, WeightProducts* products = nullptr);

// ---- expert --------------------------------------------------------------------------
struct Scratch {
  RowMat a, x, h, y;
  RowMat da, dx, dh, dy;  // budget: magnitude inputs and their sums through |W|
  RowMat qa, qx, qh, qy;  // ideal bound: quantization errors and their sums through |W|
  RowMat yw;              // budget: y W2 [n, I], the flip projections
  std::vector<double> w2_col_sq;  // budget: W2's squared column norms [I] (at the flips' columns)
  RowMat hdev;            // budget: deviation of the device's re-quantized h [n, I]
  RowMat thi, tlo, tdcum, terr;  // budget, truncating model: chunk inputs and the E_b sums
  RowMat da2, vx, hvar, vy, tvar;  // noise model (BUDGETS.md §10): squared inputs; GEMM1, h, slot, truncation variances
  std::vector<double> panel, lut, abs_panel, tscratch;
  Float32Buffers sq_buf;  // noise model: the squares products in float32
  // Re-quantization test (§10.7): the weighted h_deq - h [n, I] and its GEMM2 [n, H], h_deq - h
  // itself, RequantMoments.
  RowMat hq, rq, hdelta, hmean, hmb, hfv, hcell;
  Float32Buffers lin_buf;
  // Noise model: the relative variance of each group's float32 scale [n, I/G] and the projection of
  // each group's part of GEMM2 on the slot output [n, I/G] (BUDGETS.md §7).
  RowMat gsv, gproj;
  // Noise model: the groups' scale jumps (ScaleJumps): the moved codes' parts [n, I], the
  // probabilities and the scales' relative moves [n, I/G].
  RowMat jcup, jcdn, jp, jrup, jrdn;
  RowMat fp, fstep;  // noise model: each code's crossing probability and step (CodeFlips) [n, I]
  std::vector<char> listed;  // [I] the columns already in a row's flip list
  GroupProjection grp;
  std::vector<float> taf, thf, tlf, tin, tdec, tmag, tmaga;  // truncation bound, float path: rows, panel
  RowMat tfloor, hfloor;         // truncation bound: the rows' alignment floors (BUDGETS.md §2.1)
  std::vector<double> twalign;   // truncation bound, double path: the panel's A(w)
  std::vector<double> ilo, ihi, iref, idev;
  std::vector<std::vector<std::pair<int64_t, double>>> flips;  // per row: (i, dh_i) of flip-able h
  std::vector<float> hrow;
  std::vector<uint8_t> hcodes;
  std::vector<float> hscales;
  std::vector<uint8_t> qcodes;                  // noise model: h's codes [n, I] and scales [n, I/G] for GEMM2
  std::vector<float> qscales;
  std::vector<float> tcode, tfield;             // noise model: the rows' RowCodes [n, K]
  std::vector<double> tcs;
  std::vector<uint8_t> tknown;
  RowCodes trc{};
};

// Activations of the quantized tier, quantized once per token: codes [T, H], scales [T, H/G].
struct QuantizedHidden {
  const uint8_t* codes = nullptr;
  const float* scales = nullptr;
  std::vector<uint8_t> own_codes;
  std::vector<float> own_scales;
};

// Budget state shared by the experts: the model and the two dot-product constants.
struct BudgetCtx {
  const BudgetModel* model = nullptr;
  // Coefficients of sum |a||w| for GEMM1 (K = H) and GEMM2 (K = I): dot_product_bound, or with
  // the chunked truncation bound (BUDGETS.md §2.1) promotion_bound, the block accumulation then
  // bounded chunk by chunk along the layouts L1 (K = H) and L2 (K = I).
  double c1 = 0, c2 = 0;
  bool chunked = false;
  ChunkLayout L1, L2;
  const std::vector<double>* act_dev = nullptr;  // [T, H] deviation of the device's activations
  bool ideal = false;                             // also the ideal-tier bound (BUDGETS.md §8)
  double* slot_sys = nullptr;                     // [chunk T * k] flip projections per slot
  double* slot_tail = nullptr;                    // [chunk T * k, kFlipTailWidth] their flips' tails
  double* slot_energy_tail = nullptr;             // [chunk T * k, kEnergyTailWidth] the same crossings' norms
  double* slot_var = nullptr;                     // [chunk T * k * H] noise model per slot (BUDGETS.md §10.2)
  RequantSlots requant;                           // re-quantization test's per-slot terms (§10.7)
};

// One expert's slots (job) of the chunk of tokens from t0: writes their outputs before weighting
// into slot_out [chunk T, k, H] and, with a budget, slot_budget and the BudgetCtx's per-slot
// arrays; with the ideal bound, slot_ideal.
void run_expert(const MoeProblem& p, Tier tier, const ExpertView& w, const ExpertJob& job, int64_t t0, int64_t k,
                const QuantizedHidden& qh, double* slot_out, double* slot_budget, double* slot_ideal, const BudgetCtx& bc,
                WeightProducts* products, Scratch& s);

}  // namespace moecheck::forward
