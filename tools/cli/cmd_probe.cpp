// `moecheck probe [--instruction wgmma|mma-sync|all] [--dot-products N] [--seed S] [--dump DIR]
//  [--from DIR] [--threads N] [--json FILE]`: measures how the GPU's FP8 tensor-core instructions
// accumulate (e4m3 x e4m3 -> float32). Runs the test-vector families (probe_vectors.hpp) on the
// device, fits the bit-level model (reference/tensor_core_model.hpp) to every output and reports
// the model with the count of outputs it does not reproduce bit for bit (0 expected). `--from`
// refits outputs dumped on a GPU machine (`--dump`) on any machine.
// Exit: 0 the model reproduces every wgmma output (the instruction engines' FP8 GEMMs run), 1 it
// does not, 2 input error or no usable device. mma.sync is reported for information: sm_90
// lowers it to an f16 unpack and HMMA, whose accumulation this model family does not describe.
//
// The measurement is probe::run_probe (tools/probe/probe_run.hpp); this file prints its tables
// and writes the JSON document.
#include <chrono>
#include <fstream>
#include <iostream>

#include <fmt/format.h>

#include "reference/errors.hpp"
#include "tools/cli/cli_common.hpp"
#include "tools/probe/probe_run.hpp"

namespace moecheck::cli {

namespace {

void print_instruction(const probe::InstructionFit& f, uint64_t seed) {
  const probe::FitResult& fit = f.fit;
  const bool exact = f.exact();
  std::cout << fmt::format("== {} ({} dot products, seed {}) ==\n", kernels::probe_instruction_name(f.instruction), fit.checked, seed);
  std::cout << fmt::format("  model: {}\n", fit.best.describe());
  std::cout << fmt::format("  {} of {} outputs differ from the model{}\n", fit.best_mismatches, fit.checked,
                           exact ? " (bit-exact)" : "");
  if (fit.exact.size() == 1)
    std::cout << fmt::format("  no other of the {} models searched reproduces them\n", fit.searched);
  if (fit.exact.size() > 1)
    std::cout << fmt::format("  {} searched models reproduce every output: the vectors do not tell them apart:\n",
                             fit.exact.size());
  if (f.instruction == kernels::ProbeInstruction::mma_sync && !exact)
    std::cout << "  (not modelled: sm_90 runs mma.sync e4m3 as an f16 unpack and HMMA.16816.F32; informational)\n";
  for (size_t i = 1; i < fit.exact.size(); ++i) std::cout << "    " << fit.exact[i].describe() << "\n";
  for (const probe::FamilyCheck& c : f.families)
    std::cout << fmt::format("    {:<12} K = {:<4} {:>8} outputs  {:>6} differ  {:>6} differ only in the sign of 0\n",
                             c.family, c.k, c.mismatches.checked, c.mismatches.values, c.mismatches.zero_sign);
}

void print_gemms(const std::vector<probe::GemmFit>& gemms) {
  if (gemms.empty()) return;
  std::cout << "== cuBLASLt block-scaled FP8 GEMM (BLK128x128 weights, VEC128 activations, float32 out) ==\n";
  for (const probe::GemmFit& g : gemms) {
    std::cout << fmt::format("  M {} N {} K {} ({}):\n", g.m, g.n, g.k, g.algo);
    for (const auto& f : g.compositions)
      std::cout << fmt::format("    {:<10} {:>8} of {} outputs differ\n", f.composition, f.mismatches, f.outputs);
  }
}

int run_probe(const probe::ProbeRequest& req, const std::string& json) {
  const auto t0 = std::chrono::steady_clock::now();
  const probe::ProbeResult r = probe::run_probe(req);
  for (const probe::InstructionFit& f : r.instructions) print_instruction(f, r.seed);
  print_gemms(r.gemms);
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::cerr << fmt::format("probe: {:.1f} s\n", secs);
  if (!json.empty()) {
    std::ofstream out(json);
    out << probe::probe_report_json(r).dump(1) << "\n";
    if (!out) throw InputError(json, "", "cannot write the JSON report");
  }
  return r.wgmma_exact() ? kExitOk : kExitCheckFailed;
}

}  // namespace

void register_probe(CLI::App& app) {
  struct Opts {
    probe::ProbeRequest req;
    std::string json;
  };
  auto o = std::make_shared<Opts>();
  CLI::App* sub = app.add_subcommand("probe", "measure the FP8 tensor-core accumulation of this GPU and fit a bit-exact model");
  sub->add_option("--instruction", o->req.instruction, "wgmma | mma-sync | all")
      ->check(CLI::IsMember({"wgmma", "mma-sync", "all"}));
  sub->add_option("--dot-products", o->req.dot_products, "dot products per instruction form (default 2^20)")
      ->check(CLI::Range(int64_t(512), int64_t(1) << 26));
  sub->add_option("--seed", o->req.seed, "seed of the test vectors")->check(seed_text());
  sub->add_option("--dump", o->req.dump, "also write the raw outputs to this folder (refit them with --from)");
  sub->add_option("--from", o->req.from, "fit the outputs dumped in this folder instead of running on a GPU");
  sub->add_option("--threads", o->req.threads, "CPU threads for the fit (default: all)")->check(CLI::Range(1, 1024));
  sub->add_option("--json", o->json, "write the measured model and the per-family counts as JSON");
  set_runner(sub, [o] { return run_probe(o->req, o->json); });
}

}  // namespace moecheck::cli
