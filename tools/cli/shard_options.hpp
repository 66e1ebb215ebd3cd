// The options that run a backend over N tensor- or expert-parallel ranks, shared by run, gate and
// shrink: --tp N | --ep N [--shard-fault F] [--fault-rank R] (tools/judge/sharded_run.hpp).
#pragma once

#include <CLI/CLI.hpp>

#include <cstdint>
#include <string>

#include "tools/judge/sharded_run.hpp"

namespace moecheck::cli {

struct ShardOptions {
  int64_t tp = 0, ep = 0, fault_rank = -1;
  std::string shard_fault;
};

void add_shard_options(CLI::App* sub, ShardOptions& o);

// The request the options make (none without --tp and --ep). InputError naming the option for a
// sharding fault that does not exist or an option that needs --tp / --ep; the backend's own
// checks are judge::check_shard_request's.
judge::ShardRequest shard_request(const ShardOptions& o);

}  // namespace moecheck::cli
