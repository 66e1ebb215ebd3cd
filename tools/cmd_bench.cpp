// `moecheck bench reference [--preset NAME] [--tokens N] [--seed S] [--threads N]`: figures of the
// float64 reference on a synthetic layer of a real model's shape (tools/bench_reference.cpp).
// The GPU backends' benchmark (`moecheck bench --backend cuda|cublaslt ...`) is part 4/6.
#include "golden/model_presets.hpp"
#include "reference/errors.hpp"
#include "tools/bench.hpp"
#include "tools/cli_common.hpp"

namespace moecheck::cli {

void register_bench(CLI::App& app) {
  auto* sub = app.add_subcommand("bench", "benchmarks that print figures (not tests)");
  auto* ref = sub->add_subcommand("reference", "float64 reference: wall time, GFLOP/s vs this machine's GEMM rate, peak RSS");
  sub->require_subcommand(1);
  struct Opts {
    std::string preset = "deepseek-v3";
    int64_t tokens = 512;
    uint64_t seed = 1;
    int threads = 0;
    bool compare = false;
  };
  auto o = std::make_shared<Opts>();
  ref->add_option("--preset", o->preset, "model preset (moecheck make-case --list-presets)");
  ref->add_option("--tokens", o->tokens, "tokens in the batch")->check(CLI::Range(int64_t(1), int64_t(1) << 20));
  ref->add_option("--seed", o->seed, "seed of the synthetic layer");
  ref->add_option("--threads", o->threads, "worker threads (0: all cores)");
  ref->add_flag("--compare", o->compare, "also time what moecheck compare adds (budgets and judging)");
  set_runner(ref, [o]() {
    const ModelPreset* p = find_model_preset(o->preset);
    if (!p) throw InputError("", "--preset", "unknown preset '" + o->preset + "'; presets: " + model_preset_names());
    BenchShape shape{std::string(p->name), p->config, p->routing_bias};
    return bench_reference(shape, o->tokens, o->seed, o->threads, o->compare);
  });
}

}  // namespace moecheck::cli
