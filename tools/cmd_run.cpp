// `moecheck run CASE --backend B [--name N] [--expert-outputs] [-o OUT]`: runs a backend on a case
// and records /outputs/<name> (output, topk_ids, topk_weights, optionally expert_outputs) with
// the backend, device, tool version, creation time and budget model, atomically into the case
// or into a copy OUT. Backends: emulated, faulty:<fault> (the emulated backend with one bug
// class switched on, kernels/emulated/emulated_moe.hpp), cuda, cublaslt (need a Hopper GPU).
#include <ctime>
#include <fmt/format.h>
#include <iostream>

#include "golden/case_problem.hpp"
#include "kernels/emulated/emulated_moe.hpp"
#include "reference/fp8_formats.hpp"
#include "tools/cli_common.hpp"
#include "tools/reference_store.hpp"
#ifdef MOECHECK_HAVE_CUDA
#include "kernels/gpu_backend.hpp"
#endif

namespace moecheck::cli {

namespace {
std::string utc_now() {
  const std::time_t t = std::time(nullptr);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&t));
  return buf;
}
}  // namespace

BackendOutput run_backend(const CaseProblem& cp, const std::string& backend, bool expert_outputs,
                          int64_t int32_threshold) {
  if (backend == "emulated" || backend.rfind("faulty:", 0) == 0) {
    EmulatedOptions eo;
    eo.expert_outputs = expert_outputs;
    if (int32_threshold > 0) eo.int32_overflow_threshold = int32_threshold;
    if (backend != "emulated") {
      const auto f = parse_fault(backend.substr(7));
      if (!f || *f == Fault::none) {
        std::string names;
        for (Fault x : all_faults()) names += (names.empty() ? "" : ", ") + std::string(to_string(x));
        throw InputError("", "--backend", fmt::format("unknown fault '{}'; faults: {}", backend.substr(7), names));
      }
      eo.fault = *f;
    }
    BackendOutput r = run_emulated(cp.problem(), eo);
    r.backend = backend;
    return r;
  }
  if (backend == "cuda" || backend == "cublaslt") {
#ifdef MOECHECK_HAVE_CUDA
    return kernels::run_gpu_backend(cp.problem(), cp.reader().hidden_dtype() == Precision::bf16,
                                    backend == "cuda" ? kernels::GpuBackend::cuda : kernels::GpuBackend::cublaslt,
                                    expert_outputs);
#else
    throw InputError("", "--backend", "this moecheck was built without CUDA (nvcc not found at build time)");
#endif
  }
  throw InputError("", "--backend", "must be emulated, faulty:<fault>, cuda or cublaslt, got '" + backend + "'");
}

OutputData to_output_data(const BackendOutput& r) {
  OutputData d;
  d.attributes["backend"] = r.backend;
  d.attributes["device"] = r.device;
  d.attributes["created"] = utc_now();
  d.attributes["tool_version"] = MOECHECK_VERSION;
  d.attributes["budget_model"] = default_budget_model(r.backend);
  d.output_dtype = Precision::bf16;
  d.output.resize(r.output_bf16.size());
  for (size_t i = 0; i < r.output_bf16.size(); ++i) d.output[i] = bf16_decode(r.output_bf16[i]);
  d.topk_ids = r.topk_ids;
  d.topk_weights = r.topk_weights;
  d.expert_outputs = r.expert_outputs;
  return d;
}

void register_run(CLI::App& app) {
  auto* sub = app.add_subcommand("run", "run a backend on a case and record its output in /outputs/<name>");
  struct Opts {
    std::string path, backend, name, out;
    bool expert_outputs = false;
    int64_t int32_threshold = 0;
  };
  auto o = std::make_shared<Opts>();
  sub->add_option("CASE", o->path, "case file")->required();
  sub->add_option("--backend", o->backend, "emulated | faulty:<fault> | cuda | cublaslt")->required();
  sub->add_option("--name", o->name, "output name (default: the backend name)");
  sub->add_flag("--expert-outputs", o->expert_outputs, "also record each slot's output before weighting");
  sub->add_option("--int32-threshold", o->int32_threshold,
                  "faulty:int32_overflow only: the flat index at which the emulated int32 wraps");
  sub->add_option("-o,--output", o->out, "record into a copy OUT instead of the case");
  set_runner(sub, [o]() {
    const std::string name = o->name.empty() ? o->backend : o->name;
    if (!is_valid_output_name(name))  // before any work is done
      throw InputError("", "--name", "output names are 1-128 characters of [A-Za-z0-9_.:+-], got '" + name + "'");
    const CaseProblem cp(o->path);
    const BackendOutput r = run_backend(cp, o->backend, o->expert_outputs, o->int32_threshold);
    add_output_to_case(o->path, name, to_output_data(r), o->out);
    std::cerr << fmt::format("moecheck: /outputs/{} recorded in {} (backend {}, device {})\n", name,
                             o->out.empty() ? o->path : o->out, r.backend, r.device);
    return kExitOk;
  });
}

}  // namespace moecheck::cli
