// `moecheck bench --backend cuda[,cublaslt] [--preset P] [--tokens 1,8,64,512,4096] [--tp N]`:
// prints the GPU backends' timing (kernels/gpu_bench.hpp: CUDA events after warm-up, medians,
// L2 flushed, inputs rotated) per batch size, total (launched kernel by kernel, and replayed as
// a CUDA graph) and per stage, beside the device's limits,
// and keeps the figures as a JSON file. With several backends, each is run in turn on the same
// synthetic layer, and a last table puts them side by side with the memory floor.
//
// Ceilings. Memory: the device-to-device copy rate measured in the same run ((read + write)
// bytes / time), and the datasheet HBM rate. Arithmetic: the datasheet's dense FP8 tensor-core
// rate of H100 / H200 SXM (NVIDIA H200 Tensor Core GPU datasheet: FP8 3,958 TFLOP/s "with
// sparsity", i.e. 1,979 dense; HBM3e 4.8 TB/s; H100 SXM: the same rate, HBM3 3.35 TB/s). Both
// backends run the FP8 tensor cores (wgmma e4m3). Other devices: no datasheet figures printed.
//
// Work and bytes counted: FLOPs = 2 * slots * (2I*H + H*I) over the (token, slot) pairs routed
// to local experts (padding rows excluded); minimum bytes = the FP8 weights and scales of every
// expert hit once, plus the bf16 hidden states, float32 logits and bf16 output once. At small
// batches the layer is bound by reading the weights of the experts hit: the floor is those bytes
// at the measured copy rate, and GB/s against the copy rate is the figure that matters; at large
// batches TFLOP/s is.
#include <fmt/format.h>

#include <algorithm>
#include <iostream>
#include <nlohmann/json.hpp>

#include "golden/model_presets.hpp"
#include "reference/errors.hpp"
#include "reference/moe_sharding.hpp"
#include "tools/bench/bench.hpp"
#include "tools/report/report.hpp"
#ifdef MOECHECK_HAVE_CUDA
#include "kernels/gpu_bench.hpp"
#endif

namespace moecheck::bench {

#ifdef MOECHECK_HAVE_CUDA
namespace {
struct Datasheet {
  double fp8_tflops = 0, hbm_gbs = 0;
  std::string name;
};
Datasheet datasheet_for(const std::string& device) {
  if (device.find("H200") != std::string::npos) return {1979, 4800, "H200 SXM datasheet"};
  if (device.find("H100") != std::string::npos) return {1979, 3350, "H100 SXM datasheet"};
  return {};
}

double floor_ms(const kernels::GpuBenchRow& row, double copy_gbs) { return row.min_bytes / (copy_gbs * 1e9) * 1e3; }
std::string graph_cell(const kernels::GpuBenchRow& row) {
  return row.graph_failed.empty() ? fmt::format("{:.4f}", row.graph_median_ms) : "-";
}

// One backend's section of the text and its JSON object.
std::string describe_run(const kernels::GpuBenchResult& r, const kernels::GpuBenchOptions& o, const std::string& layer,
                         nlohmann::json& j) {
  const Datasheet ds = datasheet_for(r.device);
  const MoeConfig& c = o.config;
  std::string text;
  auto line = [&](const std::string& s) { text += s + "\n"; };
  line(fmt::format("moecheck bench: backend {} on {}", r.backend, r.device));
  line(fmt::format("layer {}: E={} top-{} H={} I={} ({} routing), {} local experts, {:.2f} GiB of FP8 weights + scales",
                   layer, c.num_experts, c.top_k, c.hidden_size, c.intermediate_size, to_string(c.routing),
                   c.local_experts(), r.weight_gib));
  line(fmt::format("ceilings: device copy {:.0f} GB/s measured now{}", r.hbm_copy_gbs,
                   ds.hbm_gbs > 0 ? fmt::format(" (HBM {:.0f} GB/s, {})", ds.hbm_gbs, ds.name) : ""));
  if (ds.fp8_tflops > 0) line(fmt::format("          dense FP8 {:.0f} TFLOP/s ({})", ds.fp8_tflops, ds.name));
  line(fmt::format("method: CUDA events; {} warm-up runs per input set, then the median of >= {} runs and >= {} s "
                   "per batch; L2 ({} MiB) refilled with clean lines of another buffer before each run; {} input "
                   "sets rotated; bf16 entry (activation quantization timed)",
                   o.warmup, o.min_iters, o.min_seconds, r.l2_bytes >> 20, o.input_sets));
  line("");
  line(fmt::format("{:>6} {:>7} {:>8} {:>10} {:>17} {:>9} {:>9} {:>8} {:>7} {:>8} {:>7}  {}", "tokens", "slots",
                   "experts", "median ms", "p10-p90 ms", "graph ms", "floor ms", "TFLOP/s",
                   ds.fp8_tflops > 0 ? "%peak" : "", "GB/s", "%copy", "output"));
  for (const auto& row : r.rows) {
    const double tf = row.flops / (row.median_ms * 1e-3) / 1e12;
    const double gbs = row.min_bytes / (row.median_ms * 1e-3) / 1e9;
    line(fmt::format("{:>6} {:>7} {:>8.1f} {:>10.4f} {:>8.4f}-{:<8.4f} {:>9} {:>9.4f} {:>8.1f} {:>7} {:>8.0f} {:>6.1f}%  {}",
                     row.tokens, row.slots, row.experts_hit, row.median_ms, row.p10_ms, row.p90_ms,
                     graph_cell(row), floor_ms(row, r.hbm_copy_gbs), tf,
                     ds.fp8_tflops > 0 ? fmt::format("{:.1f}%", 100 * tf / ds.fp8_tflops) : "", gbs,
                     100 * gbs / r.hbm_copy_gbs, row.output_ok ? "ok" : "BAD: " + row.output_check));
  }
  for (const auto& row : r.rows)
    if (!row.graph_failed.empty()) line(fmt::format("T={}: not captured as a CUDA graph: {}", row.tokens, row.graph_failed));
  line("(median ms and TFLOP/s, GB/s: launched kernel by kernel with a CUDA event between stages; graph ms: the same "
       "pass replayed as one CUDA graph, as engines replay decode steps; cuda backend, T <= 16: the stages after the "
       "one-launch prologue are programmatic dependent launches, which the events between stages serialize, unless "
       "MOECHECK_DEPENDENT_LAUNCH=off)");
  line("");
  line("per-stage medians (ms; each stage from the previous stage's mark, so launch gaps count to the stage after them):");
  if (!r.rows.empty()) {
    std::vector<std::string> names;  // every row's stages, in first-seen order ("-" where a row has none)
    for (const auto& row : r.rows)
      for (const auto& s : row.stages)
        if (std::find(names.begin(), names.end(), s.stage) == names.end()) names.push_back(s.stage);
    std::string head = fmt::format("{:>6}", "tokens");
    for (const auto& n : names) head += fmt::format(" {:>12}", n);
    line(head);
    for (const auto& row : r.rows) {
      std::string l = fmt::format("{:>6}", row.tokens);
      for (const auto& n : names) {
        const auto it = std::find_if(row.stages.begin(), row.stages.end(), [&](const auto& s) { return s.stage == n; });
        l += it == row.stages.end() ? fmt::format(" {:>12}", "-") : fmt::format(" {:>12.4f}", it->median_ms);
      }
      line(l);
    }
  }
  for (const auto& row : r.rows)
    if (!row.algorithms.empty()) line(fmt::format("cuBLASLt at T={}: {}", row.tokens, row.algorithms));

  j["backend"] = r.backend;
  j["device"] = r.device;
  j["ceilings"] = {{"copy_gbs_measured", r.hbm_copy_gbs}, {"hbm_gbs_datasheet", ds.hbm_gbs},
                   {"fp8_dense_tflops_datasheet", ds.fp8_tflops}, {"datasheet", ds.name}, {"l2_bytes", r.l2_bytes}};
  for (const auto& row : r.rows) {
    nlohmann::json jr{{"tokens", row.tokens}, {"slots", row.slots}, {"experts_hit", row.experts_hit},
                      {"iters", row.iters}, {"median_ms", row.median_ms}, {"p10_ms", row.p10_ms},
                      {"p90_ms", row.p90_ms}, {"graph_median_ms", row.graph_median_ms},
                      {"graph_p10_ms", row.graph_p10_ms}, {"graph_p90_ms", row.graph_p90_ms},
                      {"graph_failed", row.graph_failed}, {"floor_ms", floor_ms(row, r.hbm_copy_gbs)}, {"flops", row.flops},
                      {"min_bytes", row.min_bytes}, {"tflops", row.flops / (row.median_ms * 1e-3) / 1e12},
                      {"gbs", row.min_bytes / (row.median_ms * 1e-3) / 1e9}, {"output_ok", row.output_ok},
                      {"output_check", row.output_check}, {"algorithms", row.algorithms}};
    for (const auto& s : row.stages) jr["stages_ms"][s.stage] = s.median_ms;
    j["rows"].push_back(jr);
  }
  return text;
}

// The backends side by side: total against the floor (the first run's copy rate), then per stage.
std::string side_by_side(const std::vector<kernels::GpuBenchResult>& runs) {
  std::string text;
  auto line = [&](const std::string& s) { text += s + "\n"; };
  const double copy = runs.front().hbm_copy_gbs;
  line(fmt::format("side by side (ms, median; floor = the experts' weights and the layer's I/O at {:.0f} GB/s, "
                   "the copy rate of the first run):", copy));
  std::string head = fmt::format("{:>6} {:>9}", "tokens", "floor");
  for (const auto& r : runs)
    head += fmt::format(" {:>10} {:>7} {:>10} {:>7}", r.backend, "x floor", r.backend + " graph", "x floor");
  line(head);
  for (size_t i = 0; i < runs.front().rows.size(); ++i) {
    const auto& base = runs.front().rows[i];
    const double f = floor_ms(base, copy);
    std::string l = fmt::format("{:>6} {:>9.4f}", base.tokens, f);
    for (const auto& r : runs) {
      const auto& row = r.rows[i];
      l += fmt::format(" {:>10.4f} {:>7.2f} {:>10} {:>7}", row.median_ms, row.median_ms / f, graph_cell(row),
                       row.graph_failed.empty() ? fmt::format("{:.2f}", row.graph_median_ms / f) : "-");
    }
    line(l);
  }
  line("");
  line("per stage (ms):");
  for (size_t i = 0; i < runs.front().rows.size(); ++i) {
    std::vector<std::string> stages;  // union, in run order
    for (const auto& r : runs)
      for (const auto& s : r.rows[i].stages)
        if (std::find(stages.begin(), stages.end(), s.stage) == stages.end()) stages.push_back(s.stage);
    std::string h = fmt::format("{:>6} {:>9}", fmt::format("T={}", runs.front().rows[i].tokens), "");
    for (const auto& s : stages) h += fmt::format(" {:>12}", s);
    line(h);
    for (const auto& r : runs) {
      std::string l = fmt::format("{:>6} {:>9}", "", r.backend);
      for (const auto& name : stages) {
        const auto& st = r.rows[i].stages;
        const auto it = std::find_if(st.begin(), st.end(), [&](const auto& s) { return s.stage == name; });
        l += it == st.end() ? fmt::format(" {:>12}", "-") : fmt::format(" {:>12.4f}", it->median_ms);
      }
      line(l);
    }
  }
  return text;
}

}  // namespace
#endif

int bench_gpu(const GpuBenchRequest& q) {
#ifndef MOECHECK_HAVE_CUDA
  (void)q;
  throw InputError("", "--backend", "this moecheck was built without CUDA (nvcc not found at build time)");
#else
  const ModelPreset* p = find_model_preset(q.preset);
  if (!p) throw InputError("", "--preset", "unknown preset '" + q.preset + "'; presets: " + model_preset_names());
  if (q.backends.empty()) throw InputError("", "--backend", "give cuda, cublaslt or both (cuda,cublaslt)");
  for (const std::string& b : q.backends)
    if (b != "cuda" && b != "cublaslt")
      throw InputError("", "--backend", "bench times the GPU backends: cuda or cublaslt, got '" + b + "'");
  kernels::GpuBenchOptions o;
  o.config = p->config;
  o.routing_bias = p->routing_bias;
  o.tokens = q.tokens;
  o.seed = q.seed;
  o.min_iters = q.min_iters;
  o.min_seconds = q.min_seconds;
  o.input_sets = q.input_sets;
  const ShardPlan tp{ShardKind::tp, q.tp};
  if (const std::string rule = shard_split_rule(o.config, tp); !rule.empty()) throw InputError("", "--tp", rule);
  o.config.intermediate_size = shard_range(o.config, tp, 0).size;
  for (int64_t t : o.tokens)
    if (t < 1 || t > (int64_t(1) << 20)) throw InputError("", "--tokens", fmt::format("{} is outside [1, 2^20]", t));
  std::string names;
  for (const std::string& b : q.backends) names += (names.empty() ? "" : "+") + b;
  const std::string layer = fmt::format("{}{}", p->name, q.tp > 1 ? fmt::format(" (tp {}, rank 0)", q.tp) : "");
  const std::string out_path =
      q.output.empty() ? fmt::format("moecheck-bench-{}-{}{}.json", names, p->name, q.tp > 1 ? fmt::format("-tp{}", q.tp) : "")
                       : q.output;

  nlohmann::json j;
  j["tool"] = "moecheck bench";
  j["tool_version"] = MOECHECK_VERSION;
  j["layer"] = {{"preset", p->name}, {"tp", q.tp}, {"num_experts", o.config.num_experts}, {"top_k", o.config.top_k},
                {"hidden_size", o.config.hidden_size}, {"intermediate_size", o.config.intermediate_size},
                {"routing", std::string(to_string(o.config.routing))}};
  j["method"] = {{"warmup_per_input_set", o.warmup}, {"min_iters", o.min_iters}, {"min_seconds", o.min_seconds},
                 {"input_sets", o.input_sets}, {"l2_flushed", true}, {"entry", "bf16"}};
  std::vector<kernels::GpuBenchResult> runs;
  std::string text;
  for (const std::string& b : q.backends) {
    o.backend = b == "cuda" ? kernels::GpuBackend::cuda : kernels::GpuBackend::cublaslt;
    runs.push_back(kernels::run_gpu_bench(o, [](const std::string& s) { std::cerr << "moecheck: bench: " << s << "\n"; }));
    nlohmann::json jr;
    const std::string part = describe_run(runs.back(), o, layer, jr);
    std::cout << (text.empty() ? "" : "\n") << part << std::flush;
    text += (text.empty() ? "" : "\n") + part;
    j["layer"]["weight_gib"] = runs.back().weight_gib;
    j["runs"].push_back(jr);
  }
  if (runs.size() > 1) {
    const std::string part = side_by_side(runs);
    std::cout << "\n" << part << std::flush;
    text += "\n" + part;
  }
  j["text"] = text;
  report::write_file_atomically(out_path, j.dump(2) + "\n", "--output");
  std::cerr << "moecheck: bench figures written to " << out_path << "\n";
  for (const auto& r : runs)
    for (const auto& row : r.rows)
      if (!row.output_ok) return 1;  // a benchmark of a kernel that writes garbage is not a figure
  return 0;
#endif
}

}  // namespace moecheck::bench
