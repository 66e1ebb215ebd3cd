// Computing, storing and reusing the reference from the CLI (reference_store.hpp).
#include "tools/judge/reference_store.hpp"

#include <chrono>
#include <cmath>
#include <fmt/format.h>
#include <iostream>
#include <unistd.h>

#include "reference/errors.hpp"
#include "reference/noise_model.hpp"
#ifdef MOECHECK_HAVE_CUDA
#include "kernels/fp64_weight_products.hpp"
#endif

namespace moecheck::judge {

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
    d.slot_noise_var = r.slot_noise_var;
    const int64_t T = r.routing.tokens;
    if (T > 0 && r.requant.complete(T, int64_t(r.output.size()) / T)) {
      d.requant_direction = r.requant.direction;
      for (size_t t = 0; t < r.requant.signal.size(); ++t)
        d.requant_terms.insert(d.requant_terms.end(),
                               {r.requant.signal[t], r.requant.var[t], r.requant.mean[t], r.requant.mean_bound[t]});
    }
  }
  add_reference_to_case(case_path, std::string(to_string(tier)), d, out_path);
}

ForwardResult quantized_reference(const CaseProblem& cp, const std::string& input_hash, const std::string& model_name,
                                  bool progress, bool* reused, bool requant_terms) {
  *reused = false;
  const BudgetModel model = parse_budget_model(model_name);
  if (auto stored = cp.reader().read_reference("quantized")) {
    const auto it = stored->attributes.find("budget_model");
    const auto rev = stored->attributes.find("noise_model");
    const bool current = rev != stored->attributes.end() && rev->second == kNoiseModelRevision;
    const int64_t T = cp.tokens(), k = cp.config().top_k, H = cp.config().hidden_size;
    // The re-quantization terms are reused only when whole and sane (finite; the variance and the
    // mean's bound >= 0), else computed again: a damaged store changes no judgement.
    bool has_requant =
        stored->requant_direction.size() == size_t(T * H) && stored->requant_terms.size() == size_t(T * 4);
    for (size_t i = 0; has_requant && i < stored->requant_direction.size(); ++i)
      has_requant = std::isfinite(stored->requant_direction[i]);
    for (int64_t t = 0; has_requant && t < T; ++t) {
      const double* q = &stored->requant_terms[size_t(t * 4)];
      has_requant = std::isfinite(q[0]) && std::isfinite(q[2]) && q[1] >= 0 && q[1] < INFINITY && q[3] >= 0 &&
                    q[3] < INFINITY;
    }
    const bool matches =
        stored->input_hash == input_hash && it != stored->attributes.end() && it->second == model_name &&
        stored->budget.size() == size_t(T * H) && stored->slot_budget.size() == size_t(T * k * H) &&
        stored->expert_outputs.size() == size_t(T * k * H) && stored->noise_var.size() == size_t(T * H) &&
        stored->slot_flip_projection.size() == size_t(T * k) && stored->slot_noise_var.size() == size_t(T * k * H);
    if (matches && !current && progress)
      std::cerr << "moecheck: the stored /reference/quantized was written by an older noise model (attribute "
                   "noise_model is not \"" << kNoiseModelRevision << "\"): computing the reference; `moecheck "
                   "reference` stores it again\n";
    if (matches && current && requant_terms && !has_requant && progress)
      std::cerr << "moecheck: the stored /reference/quantized has no usable re-quantization terms (written by an "
                   "older moecheck, or damaged): computing the reference; `moecheck reference` stores them\n";
    if (matches && current && (has_requant || !requant_terms)) {
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
      r.slot_noise_var = std::move(stored->slot_noise_var);
      if (has_requant && requant_terms) {
        r.requant.direction = std::move(stored->requant_direction);
        for (int64_t t = 0; t < T; ++t) {
          const double* q = &stored->requant_terms[size_t(t * 4)];
          r.requant.signal.push_back(q[0]), r.requant.var.push_back(q[1]);
          r.requant.mean.push_back(q[2]), r.requant.mean_bound.push_back(q[3]);
        }
      }
      *reused = true;
      return r;
    }
  }
  return compute_reference(cp, Tier::quantized, &model, true, progress, requant_terms);
}

}  // namespace moecheck::judge
