// run_emulated: the layer of the emulated backend (emulated_moe.hpp states the numerics).
//
// Phases: checks -> routing (emulated_routing.cpp) -> the GEMM1 A operand (given FP8 hidden
// states or our group quantization) -> which slots are local, which weights they use, every
// needed expert stored -> one task per local expert with tokens (gather, GEMM1, SiLU * up,
// re-quantization, GEMM2), threads taking tasks from a counter -> finalize in slot order.
// Each task writes only its own slots' rows, and finalize runs after all tasks, so the result
// is bitwise independent of the thread count and of scheduling.
#include <algorithm>
#include <atomic>
#include <cmath>
#include <exception>
#include <mutex>
#include <stdexcept>
#include <thread>

#include <fmt/format.h>

#include "kernels/emulated/emulated_internal.hpp"
#include "reference/errors.hpp"
#include "reference/fp8_formats.hpp"

namespace moecheck {
namespace {

using emulated::block_scale_gemm;
using emulated::decode_e4m3;
using emulated::quantize_row;
using emulated::QuantRule;

float round_to(float x, Precision p) { return p == Precision::bf16 ? bf16_round(x) : x; }

// Scales [R, C] of one expert as the GEMM reads them: row-major, or (fault) as if they were
// stored [C, R].
std::vector<float> weight_scales(const float* s, int64_t R, int64_t C, Fault fault) {
  std::vector<float> out(s, s + R * C);
  // faulty weight_scale_transposed: docs/BUG-CLASSES.md #4 (block-scale layout read with the wrong order)
  if (fault == Fault::weight_scale_transposed)
    for (int64_t r = 0; r < R; ++r)
      for (int64_t c = 0; c < C; ++c) out[r * C + c] = s[c * R + r];
  return out;
}

struct Layer {
  // The layer's sizes and quantization rule (the faults that change the rule included).
  Layer(const MoeProblem& prob, const EmulatedOptions& o)
      : p(prob), opt(o), T(prob.tokens), E(prob.config.num_experts), k(prob.config.top_k),
        H(prob.config.hidden_size), I(prob.config.intermediate_size), G(prob.config.group_size),
        KBH((H + G - 1) / G), KBI((I + G - 1) / G),
        rule{prob.config.scale_format,
             prob.config.act_eps,
             o.fault == Fault::zero_group_nan,
             o.fault == Fault::ue8m0_mismatch,
             prob.config.recipe.act_scale_floor == ActScaleFloor::none,
             prob.config.recipe.quant_divide == QuantDivide::reciprocal} {}
  const MoeProblem& p;
  const EmulatedOptions& opt;
  const int64_t T, E, k, H, I, G, KBH, KBI;
  const QuantRule rule;
  const uint8_t* act_codes = nullptr;  // [T, H]: the case's, or own_codes
  const float* act_scales = nullptr;   // [T, KBH]: the case's, or own_scales
  std::vector<uint8_t> own_codes;      // our quantization of the hidden states, when the case has none
  std::vector<float> own_scales;
  std::vector<float> weights; // [T, k] routing weights
  std::vector<int64_t> row;   // [T, k] row of slot_out, -1 when the slot is not local
  std::vector<float> slot_out;  // [local slots, H] GEMM2 outputs
  int64_t garbage_expert = -1;
  int64_t doubled_expert = -1;  // Fault::w2_scale_doubled
  std::mutex load_mutex;

  void run_expert(int64_t wid, const std::vector<int64_t>& slots);
  // C = block-scaled A W^T with the block sums opt.tensor_core asks for.
  void gemm(int64_t M, int64_t N, int64_t K, const float* a, const float* sa, const uint8_t* w, const float* sw,
            float* C) const;
};

void Layer::gemm(int64_t M, int64_t N, int64_t K, const float* a, const float* sa, const uint8_t* w, const float* sw,
                 float* C) const {
  if (opt.tensor_core) emulated::block_scale_gemm_tc(*opt.tensor_core, M, N, K, G, a, sa, w, sw, C);
  else block_scale_gemm(M, N, K, G, a, sa, w, sw, C);
}

void Layer::run_expert(int64_t wid, const std::vector<int64_t>& slots) {
  const Precision ip = p.config.intermediate_dtype;
  const int64_t M = static_cast<int64_t>(slots.size());
  ExpertView wt;
  {
    std::lock_guard<std::mutex> lock(load_mutex);  // the loader contract: one call at a time
    wt = p.load_expert(wid);
  }
  if (!wt.w13 || !wt.w13_scale || !wt.w2 || !wt.w2_scale)
    throw std::invalid_argument(fmt::format("emulated: load_expert({}) returned null weights", wid));

  // Gather the A operand of GEMM1: the expert's tokens' codes, decoded, and their scales.
  std::vector<float> a(M * H), sa(M * KBH);
  for (int64_t m = 0; m < M; ++m) {
    const int64_t t = slots[m] / k;
    decode_e4m3(act_codes + t * H, H, a.data() + m * H);
    for (int64_t b = 0; b < KBH; ++b)
      // faulty act_scale_transposed: docs/BUG-CLASSES.md #4 ([T, H/G] scales read as if [H/G, T])
      sa[m * KBH + b] = opt.fault == Fault::act_scale_transposed ? act_scales[b * T + t] : act_scales[t * KBH + b];
  }
  const std::vector<float> s13 = weight_scales(wt.w13_scale, (2 * I + G - 1) / G, KBH, opt.fault);
  std::vector<float> s2 = weight_scales(wt.w2_scale, (H + G - 1) / G, KBI, opt.fault);
  // faulty w2_scale_doubled: one expert's down-projection scale applied twice over
  if (wid == doubled_expert)
    for (float& v : s2) v *= 2.0f;

  // GEMM1, rounded to intermediate_dtype.
  std::vector<float> x(M * 2 * I);
  gemm(M, 2 * I, H, a.data(), sa.data(), wt.w13, s13.data(), x.data());
  for (float& v : x) v = round_to(v, ip);

  // h = silu(gate) * up (float32), rounded; re-quantized per group along I.
  bool gate_first = p.config.gate_up_layout == GateUpLayout::gate_up;
  // faulty gate_up_swap: docs/BUG-CLASSES.md #14 (w13 / w31 order not applied: silu of the up half)
  if (opt.fault == Fault::gate_up_swap) gate_first = !gate_first;
  const int64_t gate_off = gate_first ? 0 : I, up_off = gate_first ? I : 0;
  std::vector<float> h(M * I), hv(M * I), hs(M * KBI);
  std::vector<uint8_t> hc(M * I);
  for (int64_t m = 0; m < M; ++m) {
    const float* xm = x.data() + m * 2 * I;
    for (int64_t i = 0; i < I; ++i) {
      const float g = xm[gate_off + i], u = xm[up_off + i];
      const float silu = round_to(g / (1.0f + std::exp(-g)), p.config.recipe.silu_dtype);
      h[m * I + i] = round_to(silu * u, ip);
    }
    quantize_row(h.data() + m * I, I, G, rule, hc.data() + m * I, hs.data() + m * KBI);
  }
  decode_e4m3(hc.data(), M * I, hv.data());

  // GEMM2 straight into the slots' rows, rounded to expert_output_dtype.
  std::vector<float> y(M * H);
  if (opt.fault == Fault::no_requant) {
    // faulty no_requant: the intermediate goes to GEMM2 unquantized (unit scales, float32 sums)
    std::fill(hs.begin(), hs.end(), 1.0f);
    block_scale_gemm(M, H, I, G, h.data(), hs.data(), wt.w2, s2.data(), y.data());
  } else {
    gemm(M, H, I, hv.data(), hs.data(), wt.w2, s2.data(), y.data());
  }
  for (float& v : y) v = round_to(v, p.config.recipe.expert_output_dtype);
  // faulty empty_expert_garbage: docs/BUG-CLASSES.md #11/#13 (rows of a sparsely used expert never written)
  if (wid == garbage_expert) std::fill(y.begin(), y.end(), kGarbage);
  for (int64_t m = 0; m < M; ++m) std::copy_n(y.data() + m * H, H, slot_out.data() + row[slots[m]] * H);

  if (EmulatedTrace* tr = opt.trace) {
    for (int64_t m = 0; m < M; ++m) {
      const int64_t s = slots[m];
      std::copy_n(x.data() + m * 2 * I, 2 * I, tr->gemm1.data() + s * 2 * I);
      std::copy_n(h.data() + m * I, I, tr->h.data() + s * I);
      std::copy_n(hc.data() + m * I, I, tr->h_codes.data() + s * I);
      std::copy_n(hs.data() + m * KBI, KBI, tr->h_scales.data() + s * KBI);
    }
  }
}

void check_problem(const MoeProblem& p, const EmulatedOptions& opt) {
  const std::vector<std::string> bad = config_problems(p.config);
  if (!bad.empty()) {
    std::string msg = "emulated: invalid config:";
    for (const auto& b : bad) msg += " " + b + ";";
    throw std::invalid_argument(msg);
  }
  if (p.config.group_size != p.config.weight_block)
    throw std::invalid_argument(fmt::format("emulated: group_size ({}) must equal weight_block ({})",
                                            p.config.group_size, p.config.weight_block));
  if (opt.int32_overflow_threshold < 1)
    throw std::invalid_argument("emulated: int32_overflow_threshold must be >= 1");
  if (p.tokens < 0 || !p.logits || !p.load_expert || (!p.hidden && !(p.hidden_fp8 && p.hidden_scale)))
    throw std::invalid_argument("emulated: tokens >= 0, logits, load_expert and hidden states are required");
}

BackendOutput output_shell(const Layer& L, const EmulatedOptions& opt) {
  BackendOutput out;
  out.tokens = L.T, out.hidden = L.H, out.top_k = L.k;
  out.backend = opt.fault == Fault::none ? "emulated" : "faulty:" + std::string(to_string(opt.fault));
  if (opt.tensor_core) out.backend += "@hopper";
  out.device = "cpu (float32 emulation)";
  out.accumulator_bits = 24;
  return out;
}

// GEMM1's A operand: the case's FP8 hidden states, or our quantization of the hidden states.
void set_activations(Layer& L) {
  const MoeProblem& p = L.p;
  if (p.hidden_fp8 && p.hidden_scale) {
    L.act_codes = p.hidden_fp8, L.act_scales = p.hidden_scale;
    return;
  }
  L.own_codes.resize(L.T * L.H), L.own_scales.resize(L.T * L.KBH);
  for (int64_t t = 0; t < L.T; ++t)
    quantize_row(p.hidden + t * L.H, L.H, L.G, L.rule, L.own_codes.data() + t * L.H, L.own_scales.data() + t * L.KBH);
  L.act_codes = L.own_codes.data(), L.act_scales = L.own_scales.data();
}

// The local slots, grouped by local expert (each expert's in slot order), the row of slot_out
// each one fills (L.row), and the experts with slots (the tasks).
struct LocalWork {
  std::vector<std::vector<int64_t>> slots_of;  // by local index
  std::vector<int64_t> tasks;                  // local indices with slots
  int64_t rows = 0;
};
LocalWork assign_local_slots(const MoeProblem& p, const EmulatedOptions& opt, const std::vector<int32_t>& ids,
                             Layer& L) {
  const int64_t off = p.config.local_expert_offset, nloc = p.config.local_experts();
  std::vector<int64_t> stored = p.stored_experts;
  std::sort(stored.begin(), stored.end());
  LocalWork w;
  w.slots_of.resize(nloc);
  L.row.assign(L.T * L.k, -1);
  for (int64_t s = 0; s < L.T * L.k; ++s) {
    const int64_t e = ids[s];
    // faulty ep_offset_ignored: docs/BUG-CLASSES.md #23 (local index taken as the global id)
    const int64_t li = opt.fault == Fault::ep_offset_ignored ? e : e - off;
    if (li < 0 || li >= nloc) continue;
    if (!std::binary_search(stored.begin(), stored.end(), off + li))
      throw InputError(p.source, "/weights/expert_ids",
                       fmt::format("token {} routes to local expert {}, which the case does not store", s / L.k,
                                   off + li));
    w.slots_of[li].push_back(s);
    L.row[s] = w.rows++;
  }
  for (int64_t li = 0; li < nloc; ++li)
    if (!w.slots_of[li].empty()) w.tasks.push_back(li);
  L.slot_out.assign(w.rows * L.H, 0.0f);
  return w;
}

// The expert a fault targets: empty_expert_garbage the least used local expert with slots;
// w2_scale_doubled the busiest one whose output is not ~0 (a dead expert, block scales ~1e-26 in
// the generator's realistic cases, would hide the fault): some w2 block scale above 2^-60.
void choose_fault_experts(const MoeProblem& p, const EmulatedOptions& opt, const LocalWork& w, Layer& L) {
  const int64_t off = p.config.local_expert_offset;
  if (opt.fault == Fault::empty_expert_garbage && !w.tasks.empty()) {
    int64_t best = w.tasks[0];
    for (int64_t li : w.tasks)
      if (w.slots_of[li].size() < w.slots_of[best].size()) best = li;
    L.garbage_expert = off + best;
  }
  if (opt.fault == Fault::w2_scale_doubled) {
    int64_t best = -1;
    for (int64_t li : w.tasks) {
      if (best >= 0 && w.slots_of[li].size() <= w.slots_of[best].size()) continue;
      const ExpertView v = p.load_expert(off + li);
      const int64_t n = L.KBH * L.KBI;  // w2's scales: ceil(H/G) x ceil(I/G) blocks
      if (v.w2_scale && std::any_of(v.w2_scale, v.w2_scale + n, [](float s) { return std::fabs(s) > 0x1p-60f; }))
        best = li;
    }
    L.doubled_expert = best >= 0 ? off + best : -1;
  }
}

void size_trace(const Layer& L, EmulatedTrace* tr) {
  if (tr == nullptr) return;
  const int64_t T = L.T, k = L.k, H = L.H, I = L.I;
  tr->act_codes.assign(L.act_codes, L.act_codes + T * H);
  tr->act_scales.assign(L.act_scales, L.act_scales + T * L.KBH);
  tr->gemm1.assign(T * k * 2 * I, 0.0f);
  tr->h.assign(T * k * I, 0.0f);
  tr->h_codes.assign(T * k * I, 0);
  tr->h_scales.assign(T * k * L.KBI, 0.0f);
}

// One task per local expert with slots, threads taking tasks from a counter; the first error
// stops the others and is rethrown here.
void run_experts(Layer& L, const LocalWork& w, int requested_threads) {
  const int64_t off = L.p.config.local_expert_offset;
  int threads = requested_threads > 0 ? requested_threads : static_cast<int>(std::thread::hardware_concurrency());
  threads = static_cast<int>(std::clamp<int64_t>(threads, 1, std::max<int64_t>(1, w.tasks.size())));
  std::atomic<size_t> next{0};
  std::atomic<bool> failed{false};
  std::exception_ptr error;
  std::mutex error_mutex;
  auto worker = [&] {
    while (!failed) {
      const size_t i = next++;
      if (i >= w.tasks.size()) break;
      try {
        L.run_expert(off + w.tasks[i], w.slots_of[w.tasks[i]]);
      } catch (...) {
        std::lock_guard<std::mutex> lock(error_mutex);
        if (!error) error = std::current_exception();
        failed = true;
      }
    }
  };
  if (threads == 1) {
    worker();
  } else {
    std::vector<std::thread> pool;
    for (int i = 0; i < threads; ++i) pool.emplace_back(worker);
    for (auto& th : pool) th.join();
  }
  if (error) std::rethrow_exception(error);
}

// The combine under the case's recipe (emulated_combine.cpp), the output-side faults, and the
// slot outputs when asked for.
void finalize_output(const MoeProblem& p, const EmulatedOptions& opt, const Layer& L, int64_t rows,
                     BackendOutput& out) {
  const int64_t T = L.T, k = L.k, H = L.H;
  out.output_bf16.assign(T * H, 0);
  const int64_t thr = opt.int32_overflow_threshold;
  // The wrap reads beyond the slot buffer only through rows whose end passes the threshold.
  const int64_t wrap = opt.fault == Fault::int32_overflow && rows * H > thr ? thr : 0;
  emulated::finalize(p.config.recipe.combine, T, k, H, out.topk_ids.data(), L.weights.data(), L.row.data(),
                     L.slot_out.data(), wrap, out.output_bf16.data());
  // faulty output_scale_2pct: a constant 2% off, applied to the float32 output before its rounding
  // (here to the bf16 output, rounded again: the same to within one bf16 step)
  if (opt.fault == Fault::output_scale_2pct)
    for (uint16_t& v : out.output_bf16) v = bf16_encode(bf16_decode(v) * 1.02f);
  // faulty last_token_zeroed: the last output row never written
  if (opt.fault == Fault::last_token_zeroed && T > 0) std::fill_n(out.output_bf16.data() + (T - 1) * H, H, uint16_t(0));
  if (opt.expert_outputs) {
    out.expert_outputs.assign(T * k * H, 0.0f);
    for (int64_t s = 0; s < T * k; ++s)
      if (L.row[s] >= 0) std::copy_n(L.slot_out.data() + L.row[s] * H, H, out.expert_outputs.data() + s * H);
  }
}

}  // namespace

BackendOutput run_emulated(const MoeProblem& p, const EmulatedOptions& opt) {
  check_problem(p, opt);
  Layer L(p, opt);
  BackendOutput out = output_shell(L, opt);

  emulated::RoutingF32 rt = emulated::route_f32(p.config, p.logits, p.bias, L.T, opt.fault);
  out.topk_ids = rt.ids;
  L.weights = rt.weights;
  out.topk_weights = std::move(rt.weights);

  set_activations(L);
  const LocalWork work = assign_local_slots(p, opt, out.topk_ids, L);
  choose_fault_experts(p, opt, work, L);
  size_trace(L, opt.trace);
  run_experts(L, work, opt.threads);
  finalize_output(p, opt, L, work.rows, out);
  return out;
}

// ---- fault names ---------------------------------------------------------------------
namespace {
constexpr std::pair<Fault, std::string_view> kFaultNames[] = {
    {Fault::none, "none"},
    {Fault::gate_up_swap, "gate_up_swap"},
    {Fault::scaling_factor_missing, "scaling_factor_missing"},
    {Fault::scaling_factor_twice, "scaling_factor_twice"},
    {Fault::bias_ignored, "bias_ignored"},
    {Fault::bias_bf16, "bias_bf16"},
    {Fault::act_scale_transposed, "act_scale_transposed"},
    {Fault::weight_scale_transposed, "weight_scale_transposed"},
    {Fault::zero_group_nan, "zero_group_nan"},
    {Fault::empty_expert_garbage, "empty_expert_garbage"},
    {Fault::ep_offset_ignored, "ep_offset_ignored"},
    {Fault::ue8m0_mismatch, "ue8m0_mismatch"},
    {Fault::group_mask_zero, "group_mask_zero"},
    {Fault::int32_overflow, "int32_overflow"},
    {Fault::no_renormalize, "no_renormalize"},
    {Fault::w2_scale_doubled, "w2_scale_doubled"},
    {Fault::no_requant, "no_requant"},
    {Fault::output_scale_2pct, "output_scale_2pct"},
    {Fault::last_token_zeroed, "last_token_zeroed"},
};
}  // namespace

std::string_view to_string(Fault f) {
  for (const auto& [v, name] : kFaultNames)
    if (v == f) return name;
  return "?";
}

std::optional<Fault> parse_fault(std::string_view s) {
  for (const auto& [v, name] : kFaultNames)
    if (name == s) return v;
  return std::nullopt;
}

const std::vector<Fault>& all_faults() {
  static const std::vector<Fault> v = [] {
    std::vector<Fault> r;
    for (const auto& [f, name] : kFaultNames)
      if (f != Fault::none) r.push_back(f);
    return r;
  }();
  return v;
}

}  // namespace moecheck
