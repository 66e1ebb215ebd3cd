// Backends over N ranks (sharded_run.hpp).
#include "tools/judge/sharded_run.hpp"

#include <fmt/format.h>

#include "reference/fp8_formats.hpp"
#include "tools/judge/backend_run.hpp"
#include "tools/judge/case_check.hpp"
#include "tools/judge/exec_backend.hpp"

namespace moecheck::judge {

void check_shard_request(const std::string& backend, const ShardRequest& s) {
  if (!s.plan) {
    if (s.faulty()) throw InputError("", "--shard-fault", "a sharding fault needs --tp N or --ep N");
    if (s.fault_rank >= 0) throw InputError("", "--fault-rank", "needs --tp N or --ep N");
    return;
  }
  const BackendName b = parse_backend_name(backend);
  if (b.gpu() || b.exec())
    throw InputError("", "--backend",
                     fmt::format("{} cannot run over {} ranks: multi-GPU runs through NCCL are not built yet; --tp and "
                                 "--ep run on the emulated backends (emulated, faulty:<fault>, either with @hopper)",
                                 b.exec() ? "an exec:CMD backend" : b.base, s.plan->ranks));
  if (s.fault_rank >= s.plan->ranks)
    throw InputError("", "--fault-rank", fmt::format("must be in [0, {}) for {}, got {}", s.plan->ranks, to_string(*s.plan),
                                                     s.fault_rank));
  if (s.fault == ShardFault::tp_slice_misplaced && s.plan->kind != ShardKind::tp)
    throw InputError("", "--shard-fault", "tp_slice_misplaced misplaces a TP rank's I-slice: it needs --tp N");
  if (s.fault_rank >= 0 && !b.faulty() && s.fault != ShardFault::tp_slice_misplaced && s.fault != ShardFault::rank_added_twice)
    throw InputError("", "--fault-rank",
                     "names the rank of a faulty:<fault> backend's fault or of --shard-fault tp_slice_misplaced / "
                     "rank_added_twice; there is no such fault here");
}

BackendOutput run_sharded_backend(const CaseProblem& cp, const std::string& backend, const ShardRequest& s,
                                  int64_t int32_threshold) {
  check_shard_request(backend, s);
  if (!s.plan) throw std::logic_error("run_sharded_backend: no --tp or --ep");
  const BackendName b = parse_backend_name(backend);
  try {
    require_shardable(cp.config(), *s.plan, cp.reader().path());
  } catch (const InputError& e) {  // the case, not the backend: declined
    throw BackendUnsupported(e.file(), e.where(), e.rule());
  }
  static const TensorCoreModel wgmma = TensorCoreModel::hopper_wgmma();
  ShardedOptions so;
  so.shard_fault = s.fault;
  so.fault_rank = s.resolved_fault_rank();
  if (b.faulty()) so.fault = *parse_fault(b.base.substr(7));
  if (b.hopper) so.tensor_core = &wgmma;
  if (int32_threshold > 0) so.int32_overflow_threshold = int32_threshold;
  ShardedOutput out = run_emulated_sharded(cp.problem(), *s.plan, so);
  BackendOutput r;
  r.tokens = out.ranks.front().tokens, r.hidden = out.ranks.front().hidden, r.top_k = out.ranks.front().top_k;
  r.topk_ids = out.ranks.front().topk_ids;
  r.topk_weights = out.ranks.front().topk_weights;
  for (float v : out.output) r.output_bf16.push_back(bf16_encode(v));  // bf16 values: exact
  r.backend = backend;
  r.device = fmt::format("{}, {} in one process", out.ranks.front().device, to_string(*s.plan));
  r.shard = to_string(*s.plan);
  r.ranks = std::move(out.ranks);
  for (BackendOutput& rank : r.ranks) rank.backend = backend;
  return r;
}

ShardedObservation sharded_observation_of(const BackendOutput& b) {
  ShardedObservation o;
  BackendOutput layer = b;
  layer.ranks.clear();
  o.layer = observation_of(layer);
  for (const BackendOutput& r : b.ranks) o.ranks.push_back(observation_of(r));
  return o;
}

ShardedObservation sharded_observation_of(const std::string& name, OutputData&& d) {
  ShardedObservation o;
  std::vector<std::vector<float>> ranks = std::move(d.ranks);
  o.layer = observation_of(name, std::move(d));
  for (size_t r = 0; r < ranks.size(); ++r) {
    Observation x;
    x.name = fmt::format("rank {}", r);
    x.output = std::move(ranks[r]);
    x.topk_ids = o.layer.topk_ids;
    o.ranks.push_back(std::move(x));
  }
  return o;
}

std::string shard_arguments(const ShardRequest& s, bool backend_faulty) {
  if (!s.plan) return "";
  std::string a = fmt::format(" --{} {}", to_string(s.plan->kind), s.plan->ranks);
  if (s.faulty()) a += fmt::format(" --shard-fault {}", to_string(s.fault));
  if ((s.faulty() && s.fault != ShardFault::reduce_bf16) || backend_faulty)
    a += fmt::format(" --fault-rank {}", s.resolved_fault_rank());
  return a;
}

std::string sharded_output_name(const std::string& backend, const ShardRequest& s) {
  std::string name = default_output_name(backend);
  if (!s.plan) return name;
  name += fmt::format(".{}{}", to_string(s.plan->kind), s.plan->ranks);
  if (s.faulty()) name += fmt::format(".{}", to_string(s.fault));
  return name;
}

}  // namespace moecheck::judge
