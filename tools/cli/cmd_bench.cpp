// `moecheck bench --backend cuda[,cublaslt] [--preset NAME] [--tokens 1,8,...] [--tp N] [-o FILE]`:
// the GPU backends' timing (tools/bench/bench_gpu.cpp); `moecheck bench reference [--preset NAME]
// [--tokens N] [--seed S] [--threads N] [--compare [--budget-model M]...] [--repeat N] [--device cpu|cuda]`: figures of the float64 reference on a
// synthetic layer of a real model's shape (tools/bench/bench_reference.cpp).
#include "golden/model_presets.hpp"
#include "reference/errors.hpp"
#include "tools/bench/bench.hpp"
#include "tools/cli/cli_common.hpp"
#include "tools/judge/reference_store.hpp"

namespace moecheck::cli {

void register_bench(CLI::App& app) {
  auto* sub = app.add_subcommand("bench", "benchmarks that print figures (not tests)");
  auto* ref = sub->add_subcommand("reference", "float64 reference: wall time, GFLOP/s vs this machine's GEMM rate, peak RSS");
  sub->require_subcommand(0, 1);
  auto g = std::make_shared<bench::GpuBenchRequest>();
  sub->add_option("--backend", g->backends, "GPU backends to time: cuda, cublaslt, or cuda,cublaslt (side by side)")
      ->delimiter(',')
      ->check(CLI::IsMember({"cuda", "cublaslt"}));
  sub->add_option("--preset", g->preset, "model preset (moecheck make-case --list-presets)");
  sub->add_option("--tokens", g->tokens, "batch sizes, comma-separated")->delimiter(',');
  sub->add_option("--tp", g->tp, "tensor-parallel degree: rank 0's slice of I")->check(CLI::Range(int64_t(1), int64_t(64)));
  sub->add_option("--seed", g->seed, "seed of the synthetic layer")->check(seed_text());
  sub->add_option("--min-iters", g->min_iters, "timed runs per batch size, at least")->check(CLI::Range(1, 100000));
  sub->add_option("--min-seconds", g->min_seconds, "timed seconds per batch size, at least")->check(CLI::Range(0.0, 600.0));
  sub->add_option("--input-sets", g->input_sets, "distinct input sets rotated")->check(CLI::Range(1, 64));
  sub->add_option("-o,--output", g->output,
                  "where the figures are kept as JSON (default moecheck-bench-<backend>[+<backend>]-<preset>[-tpN].json)");
  set_runner(sub, [g]() {
    if (g->backends.empty())
      throw InputError("", "--backend",
                       "give --backend cuda, cublaslt or cuda,cublaslt, or a subcommand (moecheck bench reference)");
    return bench::bench_gpu(*g);
  });
  struct Opts {
    std::string preset = "deepseek-v3";
    int64_t tokens = 512;
    uint64_t seed = 1;
    int threads = 0;
    bool compare = false;
    std::vector<std::string> models;
    int repeat = 3;
    std::string device = "cpu";
  };
  auto o = std::make_shared<Opts>();
  ref->add_option("--preset", o->preset, "model preset (moecheck make-case --list-presets)");
  ref->add_option("--tokens", o->tokens, "tokens in the batch")->check(CLI::Range(int64_t(1), int64_t(1) << 20));
  ref->add_option("--seed", o->seed, "seed of the synthetic layer")->check(seed_text());
  ref->add_option("--threads", o->threads, "worker threads (0: all cores)");
  ref->add_flag("--compare", o->compare, "also time what moecheck compare adds (budgets and judging)");
  ref->add_option("--budget-model", o->models,
                  "with --compare: the budget models to time, repeatable (default: fp32 and hopper; " +
                      budget_model_names() + ")")
      ->check(budget_model_validator());
  ref->add_option("--repeat", o->repeat, "timed runs of each measurement; medians are reported (default 3)")
      ->check(CLI::Range(1, 100));
  ref->add_option("--device", o->device,
                  "cuda: also time the reference with its weight products on the GPU, beside the CPU's")
      ->check(CLI::IsMember({"cpu", "cuda"}));
  set_runner(ref, [o]() {
    const ModelPreset* p = find_model_preset(o->preset);
    if (!p) throw InputError("", "--preset", "unknown preset '" + o->preset + "'; presets: " + model_preset_names());
    bench::BenchShape shape{std::string(p->name), p->config, p->routing_bias};
    std::vector<std::string> models;
    if (o->compare) models = o->models.empty() ? std::vector<std::string>{"fp32", "hopper"} : o->models;
    const std::unique_ptr<WeightProducts> products = judge::reference_products(o->device);
    return bench::bench_reference(shape, o->tokens, o->seed, o->threads, models, o->repeat, products.get());
  });
}

}  // namespace moecheck::cli
