// `moecheck probe [--instruction wgmma|mma-sync|all] [--dot-products N] [--seed S] [--dump DIR]
//  [--from DIR] [--threads N] [--json FILE]`: measures how the GPU's FP8 tensor-core instructions
// accumulate (e4m3 x e4m3 -> float32). Runs the test-vector families (probe_vectors.hpp) on the
// device, fits the bit-level model (reference/tensor_core_model.hpp) to every output and reports
// the model with the count of outputs it does not reproduce bit for bit (0 expected). `--from`
// refits outputs dumped on a GPU machine (`--dump`) on any machine.
// Exit: 0 the model reproduces every wgmma output (the instruction engines' FP8 GEMMs run), 1 it
// does not, 2 input error or no usable device. mma.sync is reported for information: sm_90
// lowers it to an f16 unpack and HMMA, whose accumulation this model family does not describe.
#include <chrono>
#include <fstream>
#include <iostream>
#include <thread>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "reference/errors.hpp"
#include "tools/cli/cli_common.hpp"
#include "tools/probe/probe_fit.hpp"
#include "tools/probe/probe_gemm.hpp"
#ifdef MOECHECK_HAVE_CUDA
#include "kernels/cublaslt_probe.hpp"
#endif

namespace moecheck::cli {

namespace {

struct ProbeOptions {
  std::string instruction = "all";
  int64_t dot_products = int64_t(1) << 20;
  uint64_t seed = 1;
  std::string dump, from, json;
  int threads = 0;
};

std::vector<probe::ProbeRun> run_on_device(const ProbeOptions& o) {
#ifdef MOECHECK_HAVE_CUDA
  std::string why, name;
  if (!kernels::probe_device_usable(&why, &name)) throw InputError("", "probe", why + " (use --from DIR to fit outputs dumped on a GPU machine)");
  std::cerr << "probe: device " << name << "\n";
  std::vector<kernels::ProbeInstruction> forms;
  if (o.instruction != "mma-sync") forms.push_back(kernels::ProbeInstruction::wgmma);
  if (o.instruction != "wgmma") forms.push_back(kernels::ProbeInstruction::mma_sync);
  std::vector<probe::ProbeRun> runs;
  for (const probe::ProbeFamily& f : probe::default_probe_families(o.dot_products)) {
    const kernels::ProbeTiles tiles = probe::make_probe_tiles(f, o.seed);
    for (kernels::ProbeInstruction ins : forms) {
      probe::ProbeRun r{f, ins, tiles, kernels::run_probe_tiles(tiles, ins)};
      runs.push_back(std::move(r));
    }
  }
  return runs;
#else
  (void)o;
  throw InputError("", "probe", "this moecheck was built without CUDA: use --from DIR with outputs dumped on a GPU machine");
#endif
}

std::vector<probe::GemmProbeCase> run_gemms_on_device(const ProbeOptions& o) {
  std::vector<probe::GemmProbeCase> cases;
#ifdef MOECHECK_HAVE_CUDA
  if (o.instruction == "mma-sync") return cases;
  for (probe::GemmProbeCase c : probe::default_gemm_probe_cases(o.seed)) {
    probe::make_gemm_probe_inputs(c);
    c.d = kernels::run_cublaslt_block_gemm(c.a, c.sa, c.w, c.sw, c.m, c.n, c.k, &c.algo);
    cases.push_back(std::move(c));
  }
#else
  (void)o;
#endif
  return cases;
}

void report_gemms(const std::vector<probe::GemmProbeCase>& cases, const TensorCoreModel& instr, int threads,
                  nlohmann::json& report) {
  if (cases.empty()) return;
  std::cout << "== cuBLASLt block-scaled FP8 GEMM (BLK128x128 weights, VEC128 activations, float32 out) ==\n";
  nlohmann::json out = nlohmann::json::array();
  for (const probe::GemmProbeCase& c : cases) {
    const auto fits = probe::fit_gemm_composition(c, instr, threads);
    std::cout << fmt::format("  M {} N {} K {} ({}):\n", c.m, c.n, c.k, c.algo);
    nlohmann::json comps = nlohmann::json::array();
    for (const auto& f : fits) {
      std::cout << fmt::format("    {:<10} {:>8} of {} outputs differ\n", f.composition, f.mismatches, f.outputs);
      comps.push_back({{"composition", f.composition}, {"mismatches", f.mismatches}, {"outputs", f.outputs}});
    }
    out.push_back({{"m", c.m}, {"n", c.n}, {"k", c.k}, {"algo", c.algo}, {"compositions", comps}});
  }
  report["cublaslt"] = out;
}

std::string instruction_key(kernels::ProbeInstruction i) {
  return i == kernels::ProbeInstruction::wgmma ? "wgmma" : "mma-sync";
}

int run_probe(const ProbeOptions& o) {
  const auto t0 = std::chrono::steady_clock::now();
  uint64_t seed = o.seed;
  std::vector<probe::ProbeRun> runs = o.from.empty() ? run_on_device(o) : probe::read_probe_dump(o.from, &seed);
  std::vector<probe::GemmProbeCase> gemms = o.from.empty() ? run_gemms_on_device(o) : probe::read_gemm_dump(o.from);
  if (!o.dump.empty()) {
    probe::write_probe_dump(o.dump, seed, runs);
    if (!gemms.empty()) probe::write_gemm_dump(o.dump, gemms);
  }
  const int threads = o.threads > 0 ? o.threads : int(std::max(1u, std::thread::hardware_concurrency()));
  nlohmann::json report = {{"seed", seed}, {"instructions", nlohmann::json::array()}};
  bool all_exact = true;
  TensorCoreModel wgmma_model;
  bool have_wgmma = false;
  for (kernels::ProbeInstruction ins : {kernels::ProbeInstruction::wgmma, kernels::ProbeInstruction::mma_sync}) {
    std::vector<probe::ProbeRun> mine;
    for (const probe::ProbeRun& r : runs)
      if (r.instruction == ins) mine.push_back(r);
    if (mine.empty()) continue;
    const probe::FitResult fit = probe::fit_model(mine, threads);
    const bool exact = fit.best_mismatches == 0;
    if (ins == kernels::ProbeInstruction::wgmma) wgmma_model = fit.best, have_wgmma = true, all_exact = exact;
    std::cout << fmt::format("== {} ({} dot products, seed {}) ==\n", kernels::probe_instruction_name(ins), fit.checked, seed);
    std::cout << fmt::format("  model: {}\n", fit.best.describe());
    std::cout << fmt::format("  {} of {} outputs differ from the model{}\n", fit.best_mismatches, fit.checked,
                             exact ? " (bit-exact)" : "");
    if (fit.exact.size() == 1)
      std::cout << fmt::format("  no other of the {} models searched reproduces them\n", fit.searched);
    if (fit.exact.size() > 1)
      std::cout << fmt::format("  {} searched models reproduce every output: the vectors do not tell them apart:\n",
                               fit.exact.size());
    if (ins == kernels::ProbeInstruction::mma_sync && !exact)
      std::cout << "  (not modelled: sm_90 runs mma.sync e4m3 as an f16 unpack and HMMA.16816.F32; informational)\n";
    for (size_t i = 1; i < fit.exact.size(); ++i) std::cout << "    " << fit.exact[i].describe() << "\n";
    nlohmann::json fams = nlohmann::json::array();
    for (const probe::ProbeRun& r : mine) {
      const probe::Mismatches m = probe::check_model(fit.best, r);
      std::cout << fmt::format("    {:<12} K = {:<4} {:>8} outputs  {:>6} differ  {:>6} differ only in the sign of 0\n",
                               r.family.name, r.tiles.k(), m.checked, m.values, m.zero_sign);
      fams.push_back({{"family", r.family.name}, {"k", r.tiles.k()}, {"outputs", m.checked},
                      {"mismatches", m.values}, {"zero_sign", m.zero_sign}, {"first_mismatch", m.first}});
    }
    nlohmann::json exact_models = nlohmann::json::array();
    for (const TensorCoreModel& m : fit.exact) exact_models.push_back(m.describe());
    report["instructions"].push_back({{"instruction", instruction_key(ins)},
                                      {"model", fit.best.describe()},
                                      {"group", fit.best.group},
                                      {"frac_bits", fit.best.frac_bits},
                                      {"out_bits", fit.best.out_bits},
                                      {"mismatches", fit.best_mismatches},
                                      {"outputs", fit.checked},
                                      {"models_reproducing_all", exact_models},
                                      {"families", fams}});
  }
  if (have_wgmma) report_gemms(gemms, wgmma_model, threads, report);
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::cerr << fmt::format("probe: {:.1f} s\n", secs);
  if (!o.json.empty()) {
    std::ofstream out(o.json);
    out << report.dump(1) << "\n";
    if (!out) throw InputError(o.json, "", "cannot write the JSON report");
  }
  return all_exact ? kExitOk : kExitCheckFailed;
}

}  // namespace

void register_probe(CLI::App& app) {
  auto o = std::make_shared<ProbeOptions>();
  CLI::App* sub = app.add_subcommand("probe", "measure the FP8 tensor-core accumulation of this GPU and fit a bit-exact model");
  sub->add_option("--instruction", o->instruction, "wgmma | mma-sync | all")
      ->check(CLI::IsMember({"wgmma", "mma-sync", "all"}));
  sub->add_option("--dot-products", o->dot_products, "dot products per instruction form (default 2^20)")
      ->check(CLI::Range(int64_t(512), int64_t(1) << 26));
  sub->add_option("--seed", o->seed, "seed of the test vectors")->check(seed_text());
  sub->add_option("--dump", o->dump, "also write the raw outputs to this folder (refit them with --from)");
  sub->add_option("--from", o->from, "fit the outputs dumped in this folder instead of running on a GPU");
  sub->add_option("--threads", o->threads, "CPU threads for the fit (default: all)")->check(CLI::Range(1, 1024));
  sub->add_option("--json", o->json, "write the measured model and the per-family counts as JSON");
  set_runner(sub, [o] { return run_probe(*o); });
}

}  // namespace moecheck::cli
