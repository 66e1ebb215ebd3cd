// Computing, storing and reusing the reference from the CLI (reference_store.hpp).
#include "tools/judge/reference_store.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <fmt/format.h>
#include <iostream>
#include <optional>
#include <unistd.h>

#include "reference/errors.hpp"
#include "reference/noise_model.hpp"
#include "reference/tail_bound.hpp"
#ifdef MOECHECK_HAVE_CUDA
#include "kernels/fp64_weight_products.hpp"
#endif

namespace moecheck::judge {

namespace {

// The re-quantization test's per-token terms as stored: [T, 4] rows (signal, var, mean,
// mean_bound), golden/FORMAT.md.
std::vector<double> pack_requant_terms(const RequantTerms& q) {
  std::vector<double> rows;
  for (size_t t = 0; t < q.signal.size(); ++t) rows.insert(rows.end(), {q.signal[t], q.var[t], q.mean[t], q.mean_bound[t]});
  return rows;
}

// A stored crossing tail (FlipTail) is sane when every entry is >= 0: it holds sizes, counts,
// probabilities and variances (infinite where a term is); NaN is not sane.
bool sane_tail(const std::vector<double>& tail) {
  return std::all_of(tail.begin(), tail.end(), [](double v) { return v >= 0; });
}

// The stored terms when whole and sane (finite; the variance and the mean's bound >= 0), else
// nullopt: a damaged store is computed again and changes no judgement.
std::optional<RequantTerms> stored_requant_terms(ReferenceData& stored, int64_t T, int64_t H, int64_t k) {
  if (stored.requant_direction.size() != size_t(T * H) || stored.requant_terms.size() != size_t(T * 4) ||
      stored.requant_flip_tail.size() != size_t(T * k * kFlipTailWidth))
    return std::nullopt;
  for (const double d : stored.requant_direction)
    if (!std::isfinite(d)) return std::nullopt;
  RequantTerms q;
  for (int64_t t = 0; t < T; ++t) {
    const double* r = &stored.requant_terms[size_t(t * 4)];
    if (!(std::isfinite(r[0]) && std::isfinite(r[2]) && r[1] >= 0 && r[1] < INFINITY && r[3] >= 0 && r[3] < INFINITY))
      return std::nullopt;
    q.signal.push_back(r[0]), q.var.push_back(r[1]), q.mean.push_back(r[2]), q.mean_bound.push_back(r[3]);
  }
  if (!sane_tail(stored.requant_flip_tail)) return std::nullopt;
  q.direction = std::move(stored.requant_direction);
  q.tail = std::move(stored.requant_flip_tail);
  return q;
}

}  // namespace

ForwardResult compute_reference(const CaseProblem& cp, Tier tier, const BudgetModel* model, bool expert_outputs,
                                bool progress, bool requant_terms, WeightProducts* products) {
  ForwardOptions opt;
  opt.products = products;
  opt.requant_terms = requant_terms;
  opt.tier = tier;
  opt.expert_outputs = expert_outputs;
  opt.budget = model;
  const bool tty = isatty(STDERR_FILENO);
  const auto t0 = std::chrono::steady_clock::now();
  int64_t last_pct = -1;
  if (progress)
    opt.progress = [&](int64_t done, int64_t total) {
      const int64_t pct = total ? done * 100 / total : 100;
      if (tty) {
        std::cerr << fmt::format("\rmoecheck: reference/{}: expert {}/{} ({}%)", to_string(tier), done, total, pct)
                  << std::flush;
      } else if (pct / 10 != last_pct / 10 || done == total) {
        std::cerr << fmt::format("moecheck: reference/{}: expert {}/{} ({}%, {:.1f} s)\n", to_string(tier), done,
                                 total, pct,
                                 std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
      }
      last_pct = pct;
    };
  ForwardResult r = moe_forward(cp.problem(), opt);
  if (progress && tty) std::cerr << "\n";
  return r;
}

std::unique_ptr<WeightProducts> reference_products(const std::string& device) {
  if (device == "cpu") return nullptr;
  if (device != "cuda") throw InputError("", "--device", "must be cpu or cuda, got '" + device + "'");
#ifdef MOECHECK_HAVE_CUDA
  return kernels::make_cuda_weight_products();
#else
  throw InputError("", "--device", "cuda: this moecheck was built without CUDA (nvcc was not found when it was configured)");
#endif
}

ReferenceDevice::ReferenceDevice(std::string name) : name_(std::move(name)) {
  if (name_ != "cpu" && name_ != "cuda" && name_ != "auto")
    throw InputError("", "--device", "must be cpu, cuda or auto, got '" + name_ + "'");
  if (name_ == "cuda") gpu_ = reference_products("cuda"), tried_ = true;
}

WeightProducts* ReferenceDevice::for_case(const MoeConfig& c, int64_t tokens) {
  if (name_ == "cpu") return nullptr;
  std::lock_guard<std::mutex> lock(m_);
  if (name_ == "auto") {
    // Every slot routed to a local expert: the bound before routing (with EP fewer run).
    if (weight_product_flops(c, tokens * c.top_k) < kAutoGpuFlops) return nullptr;
    if (!tried_) {
      tried_ = true;
      try {
        gpu_ = reference_products("cuda");
      } catch (const InputError& e) {
        why_not_ = e.rule();
      }
    }
  }
  return gpu_.get();
}

std::string ReferenceDevice::why_not_gpu() const {
  std::lock_guard<std::mutex> lock(m_);
  return why_not_;
}

std::string products_device(const WeightProducts* products) { return products ? products->describe() : "this CPU"; }

void store_reference(const std::string& case_path, Tier tier, const ForwardResult& r, const std::string& input_hash,
                     const std::string& budget_model, bool expert_outputs, const std::string& out_path,
                     const std::string& device) {
  ReferenceData d;
  if (!device.empty()) d.attributes["device"] = device;
  d.tool_version = MOECHECK_VERSION;
  d.input_hash = input_hash;
  d.output = r.output;
  d.topk_ids = r.routing.ids;
  d.topk_weights = r.routing.weights;
  d.selection_margin = r.routing.margin;
  if (expert_outputs || !r.budget.empty()) d.expert_outputs = r.expert_outputs;
  if (!r.budget.empty()) {
    d.attributes["budget_model"] = budget_model;
    d.attributes["noise_model"] = kNoiseModelRevision;
    d.budget = r.budget;
    d.slot_budget = r.slot_budget;
    d.noise_var = r.noise_var;
    d.slot_flip_projection = r.slot_flip_projection;
    d.slot_flip_tail = r.slot_flip_tail;
    d.slot_energy_tail = r.slot_energy_tail;
    d.slot_noise_var = r.slot_noise_var;
    const int64_t T = r.routing.tokens;
    if (T > 0 && r.requant.complete(T, int64_t(r.output.size()) / T, r.routing.top_k)) {
      d.requant_direction = r.requant.direction;
      d.requant_terms = pack_requant_terms(r.requant);
      d.requant_flip_tail = r.requant.tail;
    }
  }
  add_reference_to_case(case_path, std::string(to_string(tier)), d, out_path);
}

ForwardResult quantized_reference(const CaseProblem& cp, const std::string& input_hash, const std::string& model_name,
                                  bool progress, bool* reused, bool requant_terms, const ProductsSource& products) {
  *reused = false;
  const BudgetModel model = parse_budget_model(model_name);
  if (auto stored = cp.reader().read_reference("quantized")) {
    const auto it = stored->attributes.find("budget_model");
    const auto rev = stored->attributes.find("noise_model");
    const bool current = rev != stored->attributes.end() && rev->second == kNoiseModelRevision;
    const int64_t T = cp.tokens(), k = cp.config().top_k, H = cp.config().hidden_size;
    std::optional<RequantTerms> requant = requant_terms ? stored_requant_terms(*stored, T, H, k) : std::nullopt;
    const bool has_requant = requant.has_value();
    const bool matches =
        stored->input_hash == input_hash && it != stored->attributes.end() && it->second == model_name &&
        stored->budget.size() == size_t(T * H) && stored->slot_budget.size() == size_t(T * k * H) &&
        stored->expert_outputs.size() == size_t(T * k * H) && stored->noise_var.size() == size_t(T * H) &&
        stored->slot_flip_projection.size() == size_t(T * k) && stored->slot_noise_var.size() == size_t(T * k * H);
    if (matches && !current && progress)
      std::cerr << "moecheck: the stored /reference/quantized was written by an older noise model (attribute "
                   "noise_model is not \"" << kNoiseModelRevision << "\"): computing the reference; `moecheck "
                   "reference` stores it again\n";
    // Written by this revision but without the crossings' tails: damaged (revision 6 always has both).
    const bool has_tail = stored->slot_flip_tail.size() == size_t(T * k * kFlipTailWidth) &&
                          stored->slot_energy_tail.size() == size_t(T * k * kEnergyTailWidth) &&
                          sane_tail(stored->slot_flip_tail) && sane_tail(stored->slot_energy_tail);
    if (matches && current && !has_tail && progress)
      std::cerr << "moecheck: the stored /reference/quantized has no usable slot_flip_tail or slot_energy_tail (damaged): computing "
                   "the reference; `moecheck reference` stores it again\n";
    if (matches && current && has_tail && requant_terms && !has_requant && progress)
      std::cerr << "moecheck: the stored /reference/quantized has no usable re-quantization terms (written by an "
                   "older moecheck, or damaged): computing the reference; `moecheck reference` stores them\n";
    if (matches && current && has_tail && (has_requant || !requant_terms)) {
      ForwardResult r;
      r.tier = Tier::quantized;
      r.routing.tokens = T, r.routing.top_k = k;
      r.routing.ids = stored->topk_ids;
      r.routing.weights = stored->topk_weights;
      r.routing.margin = stored->selection_margin;
      r.output = std::move(stored->output);
      r.expert_outputs = std::move(stored->expert_outputs);
      r.budget = std::move(stored->budget);
      r.slot_budget = std::move(stored->slot_budget);
      r.noise_var = std::move(stored->noise_var);
      r.slot_flip_projection = std::move(stored->slot_flip_projection);
      r.slot_flip_tail = std::move(stored->slot_flip_tail);
      r.slot_energy_tail = std::move(stored->slot_energy_tail);
      r.slot_noise_var = std::move(stored->slot_noise_var);
      if (requant) r.requant = std::move(*requant);
      *reused = true;
      return r;
    }
  }
  return compute_reference(cp, Tier::quantized, &model, true, progress, requant_terms,
                           products ? products() : nullptr);
}

}  // namespace moecheck::judge
