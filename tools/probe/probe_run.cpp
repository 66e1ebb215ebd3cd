// `moecheck probe`'s measurement (probe_run.hpp).
#include "tools/probe/probe_run.hpp"

#include <iostream>
#include <thread>

#include "reference/errors.hpp"
#ifdef MOECHECK_HAVE_CUDA
#include "kernels/cublaslt_probe.hpp"
#endif

namespace moecheck::probe {

namespace {

// Every family's tiles run through each instruction form asked for.
std::vector<ProbeRun> run_on_device(const ProbeRequest& o) {
#ifdef MOECHECK_HAVE_CUDA
  std::string why, name;
  if (!kernels::probe_device_usable(&why, &name)) throw InputError("", "probe", why + " (use --from DIR to fit outputs dumped on a GPU machine)");
  std::cerr << "probe: device " << name << "\n";
  std::vector<kernels::ProbeInstruction> forms;
  if (o.instruction != "mma-sync") forms.push_back(kernels::ProbeInstruction::wgmma);
  if (o.instruction != "wgmma") forms.push_back(kernels::ProbeInstruction::mma_sync);
  std::vector<ProbeRun> runs;
  for (const ProbeFamily& f : default_probe_families(o.dot_products)) {
    const kernels::ProbeTiles tiles = make_probe_tiles(f, o.seed);
    for (kernels::ProbeInstruction ins : forms) {
      ProbeRun r{f, ins, tiles, kernels::run_probe_tiles(tiles, ins)};
      runs.push_back(std::move(r));
    }
  }
  return runs;
#else
  (void)o;
  throw InputError("", "probe", "this moecheck was built without CUDA: use --from DIR with outputs dumped on a GPU machine");
#endif
}

// The default GEMM shapes through cuBLASLt (none when only mma.sync is probed).
std::vector<GemmProbeCase> run_gemms_on_device(const ProbeRequest& o) {
  std::vector<GemmProbeCase> cases;
#ifdef MOECHECK_HAVE_CUDA
  if (o.instruction == "mma-sync") return cases;
  for (GemmProbeCase c : default_gemm_probe_cases(o.seed)) {
    make_gemm_probe_inputs(c);
    c.d = kernels::run_cublaslt_block_gemm(c.a, c.sa, c.w, c.sw, c.m, c.n, c.k, &c.algo);
    cases.push_back(std::move(c));
  }
#else
  (void)o;
#endif
  return cases;
}

// The model fitted to one instruction form's runs, and checked family by family.
InstructionFit fit_instruction(kernels::ProbeInstruction ins, const std::vector<ProbeRun>& mine, int threads) {
  InstructionFit f;
  f.instruction = ins;
  f.fit = fit_model(mine, threads);
  for (const ProbeRun& r : mine) f.families.push_back({r.family.name, r.tiles.k(), check_model(f.fit.best, r)});
  return f;
}

std::vector<GemmFit> fit_gemms(const std::vector<GemmProbeCase>& cases, const TensorCoreModel& instr, int threads) {
  std::vector<GemmFit> fits;
  for (const GemmProbeCase& c : cases) fits.push_back({c.m, c.n, c.k, c.algo, fit_gemm_composition(c, instr, threads)});
  return fits;
}

std::string instruction_key(kernels::ProbeInstruction i) {
  return i == kernels::ProbeInstruction::wgmma ? "wgmma" : "mma-sync";
}

}  // namespace

bool ProbeResult::wgmma_exact() const {
  for (const InstructionFit& f : instructions)
    if (f.instruction == kernels::ProbeInstruction::wgmma) return f.exact();
  return true;
}

ProbeResult run_probe(const ProbeRequest& o) {
  ProbeResult res;
  res.seed = o.seed;
  const std::vector<ProbeRun> runs = o.from.empty() ? run_on_device(o) : read_probe_dump(o.from, &res.seed);
  const std::vector<GemmProbeCase> gemms = o.from.empty() ? run_gemms_on_device(o) : read_gemm_dump(o.from);
  if (!o.dump.empty()) {
    write_probe_dump(o.dump, res.seed, runs);
    if (!gemms.empty()) write_gemm_dump(o.dump, gemms);
  }
  const int threads = o.threads > 0 ? o.threads : int(std::max(1u, std::thread::hardware_concurrency()));
  for (kernels::ProbeInstruction ins : {kernels::ProbeInstruction::wgmma, kernels::ProbeInstruction::mma_sync}) {
    std::vector<ProbeRun> mine;
    for (const ProbeRun& r : runs)
      if (r.instruction == ins) mine.push_back(r);
    if (mine.empty()) continue;
    res.instructions.push_back(fit_instruction(ins, mine, threads));
    if (ins == kernels::ProbeInstruction::wgmma) res.gemms = fit_gemms(gemms, res.instructions.back().fit.best, threads);
  }
  return res;
}

nlohmann::json probe_report_json(const ProbeResult& r) {
  nlohmann::json report = {{"seed", r.seed}, {"instructions", nlohmann::json::array()}};
  for (const InstructionFit& f : r.instructions) {
    nlohmann::json fams = nlohmann::json::array();
    for (const FamilyCheck& c : f.families)
      fams.push_back({{"family", c.family}, {"k", c.k}, {"outputs", c.mismatches.checked},
                      {"mismatches", c.mismatches.values}, {"zero_sign", c.mismatches.zero_sign},
                      {"first_mismatch", c.mismatches.first}});
    nlohmann::json exact_models = nlohmann::json::array();
    for (const TensorCoreModel& m : f.fit.exact) exact_models.push_back(m.describe());
    report["instructions"].push_back({{"instruction", instruction_key(f.instruction)},
                                      {"model", f.fit.best.describe()},
                                      {"group", f.fit.best.group},
                                      {"frac_bits", f.fit.best.frac_bits},
                                      {"out_bits", f.fit.best.out_bits},
                                      {"mismatches", f.fit.best_mismatches},
                                      {"outputs", f.fit.checked},
                                      {"models_reproducing_all", exact_models},
                                      {"families", fams}});
  }
  if (!r.gemms.empty()) {
    nlohmann::json out = nlohmann::json::array();
    for (const GemmFit& g : r.gemms) {
      nlohmann::json comps = nlohmann::json::array();
      for (const auto& c : g.compositions)
        comps.push_back({{"composition", c.composition}, {"mismatches", c.mismatches}, {"outputs", c.outputs}});
      out.push_back({{"m", g.m}, {"n", g.n}, {"k", g.k}, {"algo", g.algo}, {"compositions", comps}});
    }
    report["cublaslt"] = out;
  }
  return report;
}

}  // namespace moecheck::probe
