// Backends by name, in-process (backend_run.hpp).
#include "tools/judge/backend_run.hpp"

#include <ctime>
#include <fmt/format.h>

#include "golden/engine_recipes.hpp"
#include "kernels/emulated/emulated_moe.hpp"
#include "reference/fp8_formats.hpp"
#include "tools/judge/exec_backend.hpp"
#include "tools/judge/reference_store.hpp"
#ifdef MOECHECK_HAVE_CUDA
#include "kernels/gpu_backend.hpp"
#endif

namespace moecheck::judge {

namespace {
std::string utc_now() {
  const std::time_t t = std::time(nullptr);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&t));
  return buf;
}
}  // namespace

BackendName parse_backend_name(const std::string& name) {
  // "@hopper": the emulated backends with the Hopper wgmma block sums measured by `moecheck probe`.
  const std::string suffix = "@hopper";
  BackendName b;
  if (is_exec_backend(name)) {  // a command line: taken as it is (exec_backend.hpp)
    exec_command_template(name);
    b.base = name;
    return b;
  }
  b.hopper = name.size() > suffix.size() && name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0;
  b.base = b.hopper ? name.substr(0, name.size() - suffix.size()) : name;
  if (b.faulty()) {
    const auto f = parse_fault(b.base.substr(7));
    if (!f || *f == Fault::none) {
      std::string names;
      for (Fault x : all_faults()) names += (names.empty() ? "" : ", ") + std::string(to_string(x));
      throw InputError("", "--backend", fmt::format("unknown fault '{}'; faults: {}", b.base.substr(7), names));
    }
  } else if (b.base != "emulated" && !b.gpu()) {
    throw InputError("", "--backend",
                     "must be emulated, faulty:<fault> (either with @hopper), cuda, cublaslt or exec:CMD, got '" + name + "'");
  }
  if (b.hopper && b.gpu())
    throw InputError("", "--backend", "'@hopper' applies to emulated and faulty:<fault> only, got '" + name + "'");
  return b;
}

BackendOutput run_backend(const CaseProblem& cp, const std::string& name, bool expert_outputs,
                          int64_t int32_threshold) {
  const BackendName b = parse_backend_name(name);
  if (b.exec()) return run_exec_backend(cp, name, expert_outputs);
  if (!b.gpu()) {
    static const TensorCoreModel wgmma = TensorCoreModel::hopper_wgmma();
    EmulatedOptions eo;
    eo.expert_outputs = expert_outputs;
    if (b.hopper) eo.tensor_core = &wgmma;
    if (int32_threshold > 0) eo.int32_overflow_threshold = int32_threshold;
    if (b.faulty()) eo.fault = *parse_fault(b.base.substr(7));
    BackendOutput r = run_emulated(cp.problem(), eo);
    r.backend = name;
    return r;
  }
  // Our GPU kernels implement the contract's default recipe only (docs/DEVICE-ALGORITHM.md §7):
  // a case with another engine recipe is refused rather than run with the wrong roundings.
  if (const std::vector<std::string> r = recipe_settings(cp.config().recipe); !r.empty())
    throw BackendUnsupported(cp.problem().source, "/config@" + r.front().substr(0, r.front().find('=')),
                     fmt::format("backend {} implements only the default engine recipe; this case asks for {} "
                                 "(run it with --backend emulated)",
                                 b.base, fmt::join(r, " ")));
#ifdef MOECHECK_HAVE_CUDA
  return kernels::run_gpu_backend(cp.problem(), cp.reader().hidden_dtype() == Precision::bf16,
                                  b.base == "cuda" ? kernels::GpuBackend::cuda : kernels::GpuBackend::cublaslt,
                                  expert_outputs);
#else
  (void)cp;
  throw InputError("", "--backend", "this moecheck was built without CUDA (nvcc not found at build time)");
#endif
}

void record_input_hashes(const CaseProblem::InputHashes& h, OutputData& d) {
  d.attributes["input_hash"] = h.combined;
  for (const auto& [part, hash] : h.parts) d.attributes["input_hash:" + part] = hash;
}

void check_input_hashes(const CaseProblem::InputHashes& h, const OutputInfo& out, const std::string& path) {
  const auto it = out.attributes.find("input_hash");
  if (it == out.attributes.end() || it->second == h.combined) return;  // none recorded (an engine's capture), or same
  std::string changed;
  for (const auto& [part, hash] : h.parts) {
    const auto p = out.attributes.find("input_hash:" + part);
    if (p != out.attributes.end() && p->second != hash) changed += (changed.empty() ? "" : ", ") + part;
  }
  if (changed.empty()) changed = "the inputs";
  throw InputError(path, "/outputs/" + out.name + "@input_hash",
                   changed + " changed since this output was recorded: run the backend again on the case as it is");
}

OutputData to_output_data(const BackendOutput& r) {
  OutputData d;
  d.attributes["backend"] = r.backend;
  d.attributes["device"] = r.device;
  d.attributes["created"] = utc_now();
  d.attributes["tool_version"] = MOECHECK_VERSION;
  d.attributes["budget_model"] = r.budget_model.empty() ? default_budget_model(r.backend) : r.budget_model;
  if (!r.output_f32.empty()) {
    d.output_dtype = Precision::f32;
    d.output = r.output_f32;
  } else {
    d.output_dtype = Precision::bf16;
    d.output.resize(r.output_bf16.size());
    for (size_t i = 0; i < r.output_bf16.size(); ++i) d.output[i] = bf16_decode(r.output_bf16[i]);
  }
  d.topk_ids = r.topk_ids;
  d.topk_weights = r.topk_weights;
  d.expert_outputs = r.expert_outputs;
  if (r.expert_outputs_bf16) d.expert_outputs_dtype = Precision::bf16;
  d.shard = r.shard;
  for (const BackendOutput& rank : r.ranks) {
    d.ranks.emplace_back(rank.output_bf16.size());
    for (size_t i = 0; i < rank.output_bf16.size(); ++i) d.ranks.back()[i] = bf16_decode(rank.output_bf16[i]);
  }
  return d;
}

GpuAvailability gpu_availability() {
  GpuAvailability a;
#ifdef MOECHECK_HAVE_CUDA
  const kernels::GpuInfo g = kernels::probe_gpu();
  a.usable = g.usable;
  a.device = g.device;
  a.why = g.why;
#else
  a.why = "this moecheck was built without CUDA (nvcc not found at build time)";
#endif
  return a;
}

}  // namespace moecheck::judge
