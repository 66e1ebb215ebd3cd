// `moecheck shrink CASE (--backend B [--tp N | --ep N ...] | --output NAME) -o MIN [--max-attempts N]
//  [--int32-threshold N] [--budget-model M] [--no-record]`: minimizes a failing case while it still fails
// (tools/sweep/case_shrink.hpp: fewer tokens, fewer experts, fewer 128-blocks of H and I, zeroed
// groups) and writes MIN atomically, its description naming what it was shrunk from, the
// failure and the replay command; with --backend the failing output is recorded in MIN as
// /outputs/<B>. Exit 0 when MIN was written, 1 when CASE does not fail (nothing to shrink),
// 2 for bad input.
#include <fmt/format.h>
#include <unistd.h>

#include <iostream>

#include "tools/cli/cli_common.hpp"
#include "tools/cli/shard_options.hpp"
#include "tools/judge/exec_backend.hpp"
#include "tools/judge/reference_store.hpp"
#include "tools/sweep/case_shrink.hpp"

namespace moecheck::cli {

void register_shrink(CLI::App& app) {
  auto* sub = app.add_subcommand("shrink", "minimize a failing case while it still fails (delta debugging)");
  struct Opts {
    std::string path, backend, output, out;
    int max_attempts = 400;
    int64_t int32_threshold = 0;
    std::string control, model;
    bool no_record = false, no_control = false, quiet = false, allow_vacuous = false;
    ShardOptions shard;
  };
  auto o = std::make_shared<Opts>();
  sub->add_option("CASE", o->path, "the failing case")->required();
  auto* b = sub->add_option("--backend", o->backend, "the backend that fails on it: emulated | faulty:<fault> | cuda | cublaslt | exec:CMD");
  sub->add_option("--output", o->output, "judge this recorded output instead (only tokens and experts can be removed)")->excludes(b);
  sub->add_option("-o", o->out, "the minimal case to write")->check(output_file())->required();
  sub->add_option("--max-attempts", o->max_attempts, "candidates tried at most (default 400)");
  sub->add_option("--int32-threshold", o->int32_threshold, "faulty:int32_overflow: the wrap index")->check(at_least(1));
  sub->add_option("--budget-model", o->model,
                  "judge with this model (default: the backend's or the recorded output's): " + budget_model_names())
      ->check(budget_model_validator());
  sub->add_option("--control", o->control, "a backend that must pass on every kept candidate (default for faulty:*: emulated)");
  sub->add_flag("--no-control", o->no_control, "no control backend");
  sub->add_flag("--no-record", o->no_record, "do not record the failing output in the minimal case");
  sub->add_flag("--allow-vacuous", o->allow_vacuous, "a vacuous output (its checks would not see it zeroed: BUDGETS.md §10.6) does not fail");
  sub->add_flag("-q,--quiet", o->quiet, "no progress output");
  add_exec_timeout_option(sub);
  add_shard_options(sub, o->shard);
  set_runner(sub, [o]() {
    if (o->backend.empty() && o->output.empty()) throw InputError("", "--backend", "give --backend B or --output NAME");
    sweep::ShrinkOptions so;
    so.check.shard = shard_request(o->shard);
    if (so.check.shard.plan && o->backend.empty())
      throw InputError("", "--output", "--tp and --ep run a backend; a recorded output keeps its own ranks");
    if (!o->backend.empty()) judge::check_shard_request(o->backend, so.check.shard);
    so.check.backend = o->backend;
    so.check.output = o->output;
    so.check.int32_threshold = o->int32_threshold;
    so.check.budget_model = o->model;
    so.check.allow_vacuous = o->allow_vacuous;
    so.max_attempts = o->max_attempts;
    so.record = !o->no_record;
    so.control = o->control;
    so.no_control = o->no_control;
    if (!o->quiet) so.progress = [](const std::string& s) { std::cerr << "moecheck: " << s << "\n"; };
    const sweep::ShrinkResult r = sweep::shrink_case(o->path, o->out, so);
    if (r.initial.status == judge::CheckStatus::input_error || r.initial.unsupported())
      throw InputError(o->path, "", r.initial.reason);
    if (!r.initial.failed()) {
      std::cout << fmt::format("{} does not fail with {}: nothing to shrink\n", o->path,
                               o->backend.empty() ? "/outputs/" + o->output : o->backend);
      return kExitCheckFailed;
    }
    if (r.control_failed_initially)
      std::cout << fmt::format("note: the control backend fails on {} too; shrunk without a control\n", o->path);
    std::cout << fmt::format("wrote {}: {} ({} attempts, {} kept)\n  fails: {}\n{}  replay: {}\n", o->out, r.summary(),
                             r.attempts, r.accepted, r.final.reason,
                             r.control.empty() ? "" : fmt::format("  control: {} passes on it\n", r.control), r.replay);
    return kExitOk;
  });
}

}  // namespace moecheck::cli
