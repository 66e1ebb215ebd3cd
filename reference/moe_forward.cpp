// The float64 MoE forward (see moe_forward.hpp for the tiers and their rounding steps).
//
// This file is the driver (plan, chunks of tokens, worker threads over experts, combine in slot
// order); the pieces it drives are in forward_stages.hpp.
#include "reference/moe_forward.hpp"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <fmt/format.h>
#include <mutex>
#include <thread>

#include "reference/errors.hpp"
#include "reference/forward_stages.hpp"
#include "reference/fp8_formats.hpp"
#include "reference/fp8_quant.hpp"
#include "reference/moe_combine.hpp"
#include "reference/parallel_jobs.hpp"
#include "reference/requant_projection.hpp"
#include "reference/tail_bound.hpp"
#include "reference/truncation_bound.hpp"

namespace moecheck {

std::string_view to_string(Tier t) { return t == Tier::ideal ? "ideal" : "quantized"; }
std::optional<Tier> parse_tier(std::string_view s) {
  if (s == "ideal") return Tier::ideal;
  if (s == "quantized") return Tier::quantized;
  return std::nullopt;
}

double silu(double g) { return g / (1.0 + std::exp(-g)); }
double silu_slope(double g) {
  const double sg = 1.0 / (1.0 + std::exp(-g));
  return sg * (1.0 + g * (1.0 - sg));
}
double round_to(double x, Precision p) { return p == Precision::bf16 ? double(bf16_round(x)) : double(fl32(x)); }

using namespace forward;

// ---- driver --------------------------------------------------------------------------
namespace {

// Slot outputs are held for a chunk of tokens at a time; this bounds that buffer.
constexpr int64_t kSlotBufferBytes = int64_t(512) << 20;

// The routing the forward uses (the case's own, or the caller's override) and its weights before
// the quantized tier rounds them.
Routing forward_routing(const MoeProblem& p, const ForwardOptions& opt, std::vector<double>& exact_weights) {
  const MoeConfig& c = p.config;
  Routing rt;
  if (opt.routing_override) {
    rt = *opt.routing_override;
    if (rt.tokens != p.tokens || rt.top_k != c.top_k)
      throw std::invalid_argument("moe_forward: routing_override has the wrong shape");
  } else {
    rt = route(c, p.logits, p.bias, p.tokens);
  }
  exact_weights = rt.weights;
  if (opt.tier == Tier::quantized) round_weights(rt, c.routing_weight_dtype);
  return rt;
}

// Every local expert a token routes to must be stored (InputError naming the token).
void require_stored_experts(const MoeProblem& p, const Routing& rt) {
  const MoeConfig& c = p.config;
  const int64_t k = c.top_k;
  std::vector<char> stored(static_cast<size_t>(c.num_experts), 0);
  for (int64_t e : p.stored_experts)
    if (e >= 0 && e < c.num_experts) stored[e] = 1;
  for (int64_t t = 0; t < p.tokens; ++t)
    for (int64_t j = 0; j < k; ++j) {
      const int32_t e = rt.ids[t * k + j];
      if (c.is_local(e) && !stored[e])
        throw InputError(p.source, "/weights/expert_ids",
                         fmt::format("token {} routes to local expert {}, which the case does not store", t, e));
    }
}

// The quantized tier's activations, once per token: the case's FP8 ones, else our group
// quantization of the hidden states.
void quantize_hidden(const MoeProblem& p, QuantizedHidden& qh) {
  const MoeConfig& c = p.config;
  if (p.hidden_fp8 && p.hidden_scale) {
    qh.codes = p.hidden_fp8;
    qh.scales = p.hidden_scale;
    return;
  }
  GroupQuantized g = group_quantize(p.hidden, p.tokens, c.hidden_size, c.group_size, act_quant_rule(c));
  qh.own_codes = std::move(g.codes);
  qh.own_scales = std::move(g.scales);
  qh.codes = qh.own_codes.data();
  qh.scales = qh.own_scales.data();
}

// The budget's constants: the two dot-product coefficients (or, for a chunked model, the
// promotion's and the chunk layouts), and act_dev [T, H], the deviation of the device's
// activations (scale and division slack; zero when the case carries the engine's own FP8
// activations).
void set_budget_constants(const MoeProblem& p, const BudgetModel& model, const QuantizedHidden& qh, BudgetCtx& bc,
                          std::vector<double>& act_dev) {
  const MoeConfig& c = p.config;
  const int64_t T = p.tokens, H = c.hidden_size, G = c.group_size;
  bc.model = &model;
  bc.chunked = uses_chunked_truncation(model.acc);
  if (bc.chunked) {
    bc.c1 = promotion_bound(H, c.weight_block, false);
    bc.c2 = promotion_bound(c.intermediate_size, c.weight_block, false);
    bc.L1 = ChunkLayout(H, c.weight_block, model.acc.instr_k);
    bc.L2 = ChunkLayout(c.intermediate_size, c.weight_block, model.acc.instr_k);
  } else {
    bc.c1 = dot_product_bound(model.acc, H, c.weight_block, false);
    bc.c2 = dot_product_bound(model.acc, c.intermediate_size, c.weight_block, false);
  }
  act_dev.assign(static_cast<size_t>(T * H), 0.0);
  if (!(p.hidden_fp8 && p.hidden_scale)) {
    const float* table = fp8_table(Fp8Format::e4m3fn);
    std::vector<double> x(G), deq(G);
    const int64_t hg = ceil_div(H, G);
    for (int64_t t = 0; t < T; ++t)
      for (int64_t g0 = 0; g0 < H; g0 += G) {
        const int64_t n = std::min(G, H - g0);
        for (int64_t i = 0; i < n; ++i) {
          x[i] = p.hidden[t * H + g0 + i];
          deq[i] = double(table[qh.codes[t * H + g0 + i]]) * double(qh.scales[t * hg + g0 / G]);
        }
        requant_deviation(x.data(), x.data(), deq.data(), n, act_quant_rule(c), model, act_dev.data() + t * H + g0);
      }
  }
  bc.act_dev = &act_dev;
}

// The result's budget and noise arrays, zeroed for T tokens.
void size_budget_outputs(ForwardResult& res, int64_t T, int64_t k, int64_t H) {
  res.budget.assign(static_cast<size_t>(T * H), 0.0);
  res.noise_var.assign(static_cast<size_t>(T * H), 0.0);
  res.slot_budget.assign(static_cast<size_t>(T * k * H), 0.0);
  res.slot_noise_var.assign(static_cast<size_t>(T * k * H), 0.0);
  res.slot_flip_projection.assign(static_cast<size_t>(T * k), 0.0);
  res.slot_flip_tail.assign(static_cast<size_t>(T * k * kFlipTailWidth), 0.0);
  res.slot_energy_tail.assign(static_cast<size_t>(T * k * kEnergyTailWidth), 0.0);
}

// The storage behind RequantSlots (requant_projection.hpp) for every slot of the layer: the
// re-quantization test's per-slot terms (BUDGETS.md §10.7).
struct RequantSlotStore {
  std::vector<float> r, fp, fstep;
  std::vector<double> hvar, hmean, hmb, delta, h, gsv, jcup, jcdn, jp, jrup, jrdn;
  void allocate(int64_t slots, int64_t H, int64_t I, int64_t G) {
    const size_t per_i = static_cast<size_t>(slots * I), per_g = static_cast<size_t>(slots * ceil_div(I, G));
    r.assign(static_cast<size_t>(slots * H), 0.0f);
    for (auto* v : {&hvar, &hmean, &hmb, &delta, &h, &jcup, &jcdn}) v->assign(per_i, 0.0);
    for (auto* v : {&gsv, &jp, &jrup, &jrdn}) v->assign(per_g, 0.0);
    fp.assign(per_i, 0.0f), fstep.assign(per_i, 0.0f);
  }
  RequantSlots view() {
    return {r.data(),  hvar.data(), hmean.data(), hmb.data(),  delta.data(), h.data(),  gsv.data(),
            jp.data(), jrup.data(), jrdn.data(),  jcup.data(), jcdn.data(),  fp.data(), fstep.data()};
  }
};

// Chunk [t0, t0 + nt)'s (token, slot) pairs of each local expert, in token order; the largest
// experts first, for load balance.
std::vector<ExpertJob> plan_chunk(const MoeConfig& c, const Routing& rt, int64_t t0, int64_t nt) {
  const int64_t k = c.top_k;
  std::vector<ExpertJob> jobs;
  std::vector<int64_t> job_of(static_cast<size_t>(c.num_experts), -1);
  for (int64_t tl = 0; tl < nt; ++tl)
    for (int64_t j = 0; j < k; ++j) {
      const int32_t e = rt.ids[(t0 + tl) * k + j];
      if (!c.is_local(e)) continue;
      if (job_of[e] < 0) {
        job_of[e] = static_cast<int64_t>(jobs.size());
        jobs.push_back({e, {}});
      }
      jobs[job_of[e]].slots.push_back(tl * k + j);
    }
  std::stable_sort(jobs.begin(), jobs.end(),
                   [](const ExpertJob& a, const ExpertJob& b) { return a.slots.size() > b.slots.size(); });
  return jobs;
}

// What the chunk's combine reads besides the routing: its slot outputs [nt, k, H], their
// budgets and ideal-tier outputs (when kept), the weights before rounding.
struct ChunkSlots {
  int64_t t0, nt;
  const double* out;
  const double* budget;  // null without a model
  const double* ideal;   // null without the ideal bound
  const std::vector<double>* exact_weights;
};

// Combine of a chunk's tokens under the case's combine recipe (moe_combine.hpp; BUDGETS.md §5,
// §9.1-9.2), into res's output (and budget, noise, ideal bound). Non-local slots hold 0 and are
// left out. Tokens are independent: blocks of them per thread.
void combine_chunk(const MoeConfig& c, const Routing& rt, const BudgetModel* model, const ChunkSlots& cs,
                   int threads, ForwardResult& res) {
  const int64_t k = c.top_k, H = c.hidden_size, t0 = cs.t0;
  auto combine_one = [&](int64_t tl, std::vector<SlotTerm>& terms) {
    const int64_t t = t0 + tl;
    terms.clear();
    for (int64_t j = 0; j < k; ++j) {
      if (!c.is_local(rt.ids[t * k + j])) continue;
      const double wj = rt.weights[t * k + j], w_exact = (*cs.exact_weights)[t * k + j];
      const double* y = cs.out + (tl * k + j) * H;
      if (cs.ideal) {  // |w y - w_q y_q| <= |w_q| dy + |w - w_q| (|y_q| + dy)
        const double dw = std::fabs(w_exact - wj);
        const double* qy = cs.ideal + (tl * k + j) * H;
        double* ib = res.ideal_bound.data() + t * H;
        for (int64_t i = 0; i < H; ++i) ib[i] += std::fabs(wj) * qy[i] + dw * (std::fabs(y[i]) + qy[i]);
      }
      SlotTerm term{rt.ids[t * k + j], wj, 0.0, y, nullptr};
      if (model) {
        term.dw = weight_deviation(w_exact, wj, c.routing_weight_dtype, c.num_experts + k, *model);
        term.dy = cs.budget + (tl * k + j) * H;
        term.vy = res.slot_noise_var.data() + (t0 + tl) * k * H + j * H;
      }
      terms.push_back(term);
    }
    CombineOut co{res.output.data() + t * H};
    if (model) co.budget = res.budget.data() + t * H, co.noise_var = res.noise_var.data() + t * H;
    combine_token(c.recipe.combine, terms, H, k, co);
  };
  constexpr int64_t kCombineTokens = 64;
  parallel_jobs<std::vector<SlotTerm>>(size_t(ceil_div(cs.nt, kCombineTokens)), threads,
                                       [&](size_t b, std::vector<SlotTerm>& terms) {
                                         const int64_t end = std::min(cs.nt, int64_t(b + 1) * kCombineTokens);
                                         for (int64_t tl = int64_t(b) * kCombineTokens; tl < end; ++tl)
                                           combine_one(tl, terms);
                                       });
}

}  // namespace

namespace {

void check_forward_arguments(const MoeProblem& p) {
  require_valid_config(p.config);
  if (p.tokens < 0 || !p.hidden || !p.logits || !p.load_expert)
    throw std::invalid_argument("moe_forward: hidden, logits and load_expert are required");
}

// What every chunk's experts share: the budget state, the chunking, the worker threads, and
// which experts ran. Not movable (the budget context points into act_dev and requant).
struct ForwardRun {
  const BudgetModel* model = nullptr;  // the quantized tier's budget model, if any
  bool ideal_bound = false;
  bool keep_slots = false;  // every slot output kept (asked for, or read by a budget)
  int threads = 1;
  int64_t chunk = 1;  // tokens per chunk; with keep_slots every token is one chunk, so the
                      // per-slot arrays are indexed by global slot
  BudgetCtx bc;
  std::vector<double> act_dev;
  RequantSlotStore requant;
  std::vector<double> slot_ideal_all;  // [T, k, H] with the ideal bound
  std::vector<double> chunk_slots;     // the chunk's slot outputs when they are not kept
  std::mutex load_mutex;               // load_expert and the progress callback: one thread at a time
  // Experts run in any chunk (int32_t: GCC 12 warns falsely, -Wfree-nonheap-object, on a char vector here).
  std::vector<int32_t> ran;
};

// The run's budget state and chunking, and res's outputs sized (zeros).
void set_up_run(const MoeProblem& p, const ForwardOptions& opt, const QuantizedHidden& qh, ForwardRun& run,
                ForwardResult& res) {
  const MoeConfig& c = p.config;
  const int64_t T = p.tokens, H = c.hidden_size, k = c.top_k;
  run.model = opt.tier == Tier::quantized ? opt.budget : nullptr;
  run.ideal_bound = opt.tier == Tier::quantized && opt.ideal_bound;
  run.keep_slots = opt.expert_outputs || run.model || run.ideal_bound;
  if (run.model) {
    set_budget_constants(p, *run.model, qh, run.bc, run.act_dev);
    size_budget_outputs(res, T, k, H);
    if (opt.requant_terms) {
      run.requant.allocate(T * k, H, c.intermediate_size, c.group_size);
      run.bc.requant = run.requant.view();
    }
  }
  run.bc.ideal = run.ideal_bound;
  if (run.ideal_bound) {
    res.ideal_bound.assign(static_cast<size_t>(T * H), 0.0);
    run.slot_ideal_all.assign(static_cast<size_t>(T * k * H), 0.0);
  }
  res.output.assign(static_cast<size_t>(T * H), 0.0);
  if (run.keep_slots) res.expert_outputs.assign(static_cast<size_t>(T * k * H), 0.0);

  // With another engine's products a chunk may hold 8x more slot outputs (4 GiB: every token of
  // a DeepSeek-V3 layer at T = 4096), since each chunk sends every expert's weights to it again.
  const int64_t slot_bytes = opt.products ? 8 * kSlotBufferBytes : kSlotBufferBytes;
  run.chunk = run.keep_slots ? std::max<int64_t>(T, 1)
                             : std::max<int64_t>(1, slot_bytes / (8 * k * std::max<int64_t>(H, 1)));
  run.threads = opt.threads > 0 ? opt.threads : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  run.ran.assign(static_cast<size_t>(c.num_experts), 0);
}

// Where chunk [t0, t0 + nt)'s slot outputs, budgets and ideal-tier sums go; the budget context
// pointed at the chunk's per-slot arrays.
struct ChunkBuffers {
  double* slots;
  double* budget;  // null without a model
  double* ideal;   // null without the ideal bound
};
ChunkBuffers chunk_buffers(const MoeProblem& p, int64_t t0, int64_t nt, ForwardRun& run, ForwardResult& res) {
  const int64_t k = p.config.top_k, H = p.config.hidden_size;
  ChunkBuffers b{};
  b.budget = run.model ? res.slot_budget.data() + t0 * k * H : nullptr;
  b.ideal = run.ideal_bound ? run.slot_ideal_all.data() + t0 * k * H : nullptr;
  if (run.model) {
    run.bc.slot_sys = res.slot_flip_projection.data() + t0 * k, run.bc.slot_var = res.slot_noise_var.data() + t0 * k * H;
    run.bc.slot_tail = res.slot_flip_tail.data() + t0 * k * kFlipTailWidth;
    run.bc.slot_energy_tail = res.slot_energy_tail.data() + t0 * k * kEnergyTailWidth;
  }
  if (run.keep_slots) {
    b.slots = res.expert_outputs.data() + t0 * k * H;
  } else {
    run.chunk_slots.assign(static_cast<size_t>(nt * k * H), 0.0);
    b.slots = run.chunk_slots.data();
  }
  return b;
}

// The chunk's experts, on the worker threads.
void run_chunk_experts(const MoeProblem& p, const ForwardOptions& opt, const QuantizedHidden& qh,
                       const std::vector<ExpertJob>& jobs, int64_t t0, const ChunkBuffers& b, ForwardRun& run) {
  std::atomic<int64_t> done{0};
  parallel_jobs<Scratch>(jobs.size(), run.threads, [&](size_t i, Scratch& s) {
    ExpertView w;
    {
      std::lock_guard<std::mutex> lock(run.load_mutex);
      w = p.load_expert(jobs[i].expert);
    }
    run_expert(p, opt.tier, w, jobs[i], t0, p.config.top_k, qh, b.slots, b.budget, b.ideal, run.bc, opt.products, s);
    const int64_t d = ++done;
    if (opt.progress) {
      std::lock_guard<std::mutex> lock(run.load_mutex);
      opt.progress(d, static_cast<int64_t>(jobs.size()));
    }
  });
}

// The chunk's combine, its re-quantization projections (with a model that asks for them), and
// the counts of products and experts run.
void finish_chunk(const MoeProblem& p, const ForwardOptions& opt, const std::vector<ExpertJob>& jobs, int64_t t0,
                  int64_t nt, const ChunkBuffers& b, const std::vector<double>& exact_weights, ForwardRun& run,
                  ForwardResult& res) {
  const MoeConfig& c = p.config;
  const Routing& rt = res.routing;
  combine_chunk(c, rt, run.model, {t0, nt, b.slots, b.budget, b.ideal, &exact_weights}, run.threads, res);
  if (run.model && opt.requant_terms) {
    std::vector<ExpertSlots> ex;
    for (const ExpertJob& j : jobs) ex.push_back({j.expert, &j.slots});
    requant_projections(p, rt, run.bc.requant, ex, run.threads, run.load_mutex, res);
  }
  for (const ExpertJob& j : jobs) {
    res.gemm_flops += weight_product_flops(c, static_cast<int64_t>(j.slots.size()));
    run.ran[j.expert] = 1;
  }
}

}  // namespace

double weight_product_flops(const MoeConfig& c, int64_t slots) {
  return 2.0 * static_cast<double>(slots) * double(c.hidden_size) * double(3 * c.intermediate_size);
}

ForwardResult moe_forward(const MoeProblem& p, const ForwardOptions& opt) {
  check_forward_arguments(p);
  ForwardResult res;
  res.tier = opt.tier;
  std::vector<double> exact_weights;  // before the quantized tier's rounding
  res.routing = forward_routing(p, opt, exact_weights);
  require_stored_experts(p, res.routing);
  QuantizedHidden qh;
  if (opt.tier == Tier::quantized) quantize_hidden(p, qh);
  ForwardRun run;
  set_up_run(p, opt, qh, run, res);
  for (int64_t t0 = 0; t0 < p.tokens; t0 += run.chunk) {
    const int64_t nt = std::min(run.chunk, p.tokens - t0);
    const std::vector<ExpertJob> jobs = plan_chunk(p.config, res.routing, t0, nt);
    const ChunkBuffers b = chunk_buffers(p, t0, nt, run, res);
    run_chunk_experts(p, opt, qh, jobs, t0, b, run);
    finish_chunk(p, opt, jobs, t0, nt, b, exact_weights, run, res);
  }
  res.experts_run = std::count(run.ran.begin(), run.ran.end(), 1);
  return res;
}

}  // namespace moecheck
