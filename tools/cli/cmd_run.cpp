// `moecheck run CASE --backend B [--name N] [--expert-outputs] [--tp N | --ep N [--shard-fault F]
// [--fault-rank R]] [-o OUT]`: runs a backend on a case and records /outputs/<name> (output,
// topk_ids, topk_weights, optionally expert_outputs) with the backend, device, tool version,
// creation time and budget model, atomically into the case or into a copy OUT. Backends:
// emulated, faulty:<fault> (the emulated backend with one bug class switched on,
// kernels/emulated/emulated_moe.hpp), cuda, cublaslt (need a Hopper GPU), exec:CMD.
// With --tp N / --ep N the emulated backends run the layer over N ranks and their reduction
// (tools/judge/sharded_run.hpp) and the record holds the reduced output and each rank's partial
// (/outputs/<name>/ranks, golden/FORMAT.md); a faulty:<fault> backend's fault then runs on one
// rank (--fault-rank).
#include <algorithm>
#include <fmt/format.h>
#include <iostream>

#include "golden/case_problem.hpp"
#include "tools/cli/cli_common.hpp"
#include "tools/cli/shard_options.hpp"
#include "tools/judge/backend_run.hpp"
#include "tools/judge/exec_backend.hpp"

namespace moecheck::cli {

void register_run(CLI::App& app) {
  auto* sub = app.add_subcommand("run", "run a backend on a case (or over N ranks: --tp / --ep) and record its output in "
                                        "/outputs/<name>");
  struct Opts {
    std::string path, backend, name, out;
    bool expert_outputs = false;
    int64_t int32_threshold = 0;
    ShardOptions shard;
  };
  auto o = std::make_shared<Opts>();
  sub->add_option("CASE", o->path, "case file")->required();
  sub->add_option("--backend", o->backend, "emulated | faulty:<fault> | cuda | cublaslt | exec:CMD")->required();
  sub->add_option("--name", o->name, "output name (default: the backend name, '@' written as '+')");
  sub->add_flag("--expert-outputs", o->expert_outputs, "also record each slot's output before weighting");
  sub->add_option("--int32-threshold", o->int32_threshold,
                  "faulty:int32_overflow only: the flat index at which the emulated int32 wraps")->check(at_least(1));
  add_exec_timeout_option(sub);
  add_shard_options(sub, o->shard);
  sub->add_option("-o,--output", o->out, "record into a copy OUT instead of the case")->check(output_file());
  set_runner(sub, [o]() {
    const judge::ShardRequest shard = shard_request(o->shard);
    judge::check_shard_request(o->backend, shard);
    if (shard.plan && o->expert_outputs)
      throw InputError("", "--expert-outputs",
                       "a run over ranks records no slot outputs (a TP rank's are partial sums); the layer, each rank "
                       "and their reduction are judged from the outputs");
    // A backend name with a model (faulty:F@hopper) is not an output name as is, nor a command line.
    const std::string name = o->name.empty() ? judge::sharded_output_name(o->backend, shard) : o->name;
    if (!is_valid_output_name(name))  // before any work is done
      throw InputError("", "--name", "output names are 1-128 characters of [A-Za-z0-9_.:+-], got '" + name + "'");
    const CaseProblem cp(o->path);
    BackendOutput r;
    try {
      r = shard.plan ? judge::run_sharded_backend(cp, o->backend, shard, o->int32_threshold)
                     : judge::run_backend(cp, o->backend, o->expert_outputs, o->int32_threshold);
    } catch (const judge::ExecFailure& e) {  // the backend's failure, not bad input: exit 1, nothing recorded
      print_error(fmt::format("backend {} failed on {}: {}", judge::shell_quote(o->backend), o->path, e.what()));
      return kExitCheckFailed;
    }
    OutputData d = judge::to_output_data(r);
    judge::record_input_hashes(cp.input_hashes(), d);
    // How the ranks ran, faults included ("--tp 4 --shard-fault rank_added_twice --fault-rank 3").
    if (shard.plan)
      d.attributes["shard_options"] = judge::shard_arguments(shard, judge::parse_backend_name(o->backend).faulty()).substr(1);
    add_output_to_case(o->path, name, d, o->out);
    std::cerr << fmt::format("moecheck: /outputs/{} recorded in {} (backend {}, device {}{})\n", name,
                             o->out.empty() ? o->path : o->out, r.backend, r.device,
                             r.ranks.empty() ? "" : fmt::format("; {} rank outputs in /outputs/{}/ranks", r.ranks.size(), name));
    return kExitOk;
  });
}

}  // namespace moecheck::cli
