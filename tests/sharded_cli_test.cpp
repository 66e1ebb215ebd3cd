// A layer over N tensor- or expert-parallel ranks through the binary (issue 18, CPU side):
// `run --tp N / --ep N` records the reduced output and every rank's partial, `compare` judges the
// layer, each rank and the reduction in every report, and names the rank at fault; the case file
// round-trips; hostile rank datasets and impossible requests exit 2 and change nothing; `gate
// --tp 2` passes the emulated backend and fails a sharding fault, replayable.
//
// The case is sharded_emulated_test's layer (tests/small_layer.hpp dsv3_small(1024): E = 16,
// top-4, H = 256, I = 1024, so both kinds split into 2, 4 and 8 ranks), written as a case file.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <regex>
#include <sstream>

#include "golden/case_file.hpp"
#include "reference/moe_sharding.hpp"
#include "tests/golden_test_support.hpp"
#include "tests/small_layer.hpp"

namespace moecheck {
namespace {

using Json = nlohmann::json;
const auto moecheck = test::run_moecheck;

// The layer as a case file (its source and description say so).
void write_layer_case(const std::string& path) {
  const testing::SmallLayer L = testing::make_small_layer(testing::dsv3_small(1024), 24, 7, true);
  CaseHeader h;
  h.config = L.config;
  h.tokens = L.tokens;
  h.routing_bias = true;
  h.description = "tests/sharded_cli_test.cpp: dsv3_small(1024), T = 24, seed 7";
  h.source = "tests/small_layer.hpp make_small_layer";
  CaseWriter w(path, h);
  w.write_hidden_states(L.hidden);
  w.write_router_logits(L.logits);
  w.write_routing_bias(L.bias);
  for (size_t s = 0; s < L.stored.size(); ++s) {
    ExpertWeights e;
    e.w13 = L.w13[s], e.w13_scale = L.w13_scale[s], e.w2 = L.w2[s], e.w2_scale = L.w2_scale[s];
    w.write_expert(int64_t(s), e);
  }
  w.commit();
}

Json read_json(const std::string& path) {
  std::ifstream f(path);
  return Json::parse(f);
}

std::string slurp(const std::string& path) {
  std::ifstream f(path);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

bool has(const std::string& s, const std::string& what) { return s.find(what) != std::string::npos; }

// One recorded output's JSON object of a compare --json document.
const Json& output_of(const Json& doc, const std::string& name) {
  for (const Json& o : doc["outputs"])
    if (o["name"] == name) return o;
  throw std::runtime_error("no output " + name);
}

TEST(ShardedCli, RunOverTwoFourAndEightRanksPassesCompare) {
  test::TempDir dir("sharded-pass");
  const std::string c = dir.file("c.h5");
  write_layer_case(c);
  std::vector<std::string> names;
  for (const char* kind : {"tp", "ep"})
    for (const char* n : {"2", "4", "8"}) {
      const auto r = moecheck({"run", c, "--backend", "emulated", std::string("--") + kind, n});
      ASSERT_EQ(r.exit_code, 0) << r.err;
      names.push_back(std::string("emulated.") + kind + n);
      EXPECT_TRUE(has(r.err, "/outputs/" + names.back() + " recorded")) << r.err;
      EXPECT_TRUE(has(r.err, std::string(n) + " rank outputs in /outputs/" + names.back() + "/ranks")) << r.err;
    }
  const auto r = moecheck({"compare", c, "-q", "--json", dir.file("r.json"), "--html", dir.file("r.html"), "--junit",
                           dir.file("r.xml")});
  EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_TRUE(has(r.out, "sharding: tp 8, judged as one layer above")) << r.out;
  EXPECT_TRUE(has(r.out, "    rank 7: PASS")) << r.out;
  EXPECT_TRUE(has(r.out, "    reduction: PASS (0 elements outside")) << r.out;
  EXPECT_TRUE(has(r.out, "\n0 of ")) << r.out;
  const Json doc = read_json(dir.file("r.json"));
  EXPECT_EQ(doc["status"], "pass");
  ASSERT_EQ(doc["outputs"].size(), names.size());
  for (const std::string& name : names) {
    const Json& o = output_of(doc, name);
    EXPECT_EQ(o["status"], "pass") << name;
    const Json& s = o["sharding"];
    ASSERT_TRUE(s.is_object()) << name;
    EXPECT_EQ(s["shard"], name.substr(9, 2) + " " + name.substr(11)) << name;
    EXPECT_EQ(s["status"], "pass") << name;
    EXPECT_EQ(s["ranks"].size(), size_t(std::stoi(name.substr(11)))) << name;
    EXPECT_EQ(s["reduction"]["elements_outside"], 0) << name;
    EXPECT_TRUE(s["reduction"]["blamed_rank"].is_null()) << name;
  }
  EXPECT_TRUE(has(slurp(dir.file("r.html")), "<h3>Ranks (ep 8)</h3>"));
  EXPECT_FALSE(has(slurp(dir.file("r.xml")), "<failure "));
}

// Each sharding fault (and ep_offset_ignored on one rank) fails compare, exit 1, and the text and
// the JSON name the rank at fault, or the reduction where no one rank is.
TEST(ShardedCli, EachShardingFaultFailsWithItsRankNamed) {
  test::TempDir dir("sharded-faults");
  const std::string c = dir.file("c.h5");
  write_layer_case(c);
  struct Fault {
    std::vector<std::string> args;
    std::string name, text;   // the output's default name, a line the text report must hold
    std::vector<int> failing;  // sharding.failing_ranks
    int blamed;                // sharding.reduction.blamed_rank, -1: null
  };
  const Fault faults[] = {
      {{"--backend", "emulated", "--tp", "4", "--shard-fault", "tp_slice_misplaced", "--fault-rank", "1"},
       "emulated.tp4.tp_slice_misplaced", "    rank 1: FAIL", {1}, -1},
      {{"--backend", "faulty:ep_offset_ignored", "--ep", "4"}, "faulty:ep_offset_ignored.ep4", "    rank 3: FAIL", {3}, -1},
      {{"--backend", "faulty:ep_offset_ignored", "--ep", "8", "--fault-rank", "5"}, "faulty:ep_offset_ignored.ep8",
       "    rank 5: FAIL", {5}, -1},
      {{"--backend", "emulated", "--tp", "4", "--shard-fault", "rank_added_twice", "--fault-rank", "2"},
       "emulated.tp4.rank_added_twice", "the residual is rank 2's partial x 1.0", {}, 2},
      {{"--backend", "emulated", "--ep", "2", "--shard-fault", "rank_added_twice"}, "emulated.ep2.rank_added_twice",
       "the residual is rank 1's partial x 1.0", {}, 1},
      {{"--backend", "emulated", "--tp", "8", "--shard-fault", "reduce_bf16"}, "emulated.tp8.reduce_bf16",
       "    reduction: FAIL (", {}, -1},
  };
  for (const Fault& f : faults) {
    std::vector<std::string> run = {"run", c};
    run.insert(run.end(), f.args.begin(), f.args.end());
    ASSERT_EQ(moecheck(run).exit_code, 0) << f.name;
    const std::string json = dir.file(f.name + ".json");
    const auto r = moecheck({"compare", c, "--output", f.name, "-q", "--json", json});
    EXPECT_EQ(r.exit_code, 1) << f.name << "\n" << r.out;
    EXPECT_TRUE(has(r.out, f.text)) << f.name << "\n" << r.out;
    const Json doc = read_json(json);
    const Json& s = output_of(doc, f.name)["sharding"];
    EXPECT_EQ(s["status"], "fail") << f.name;
    EXPECT_EQ(s["failing_ranks"].get<std::vector<int>>(), f.failing) << f.name << "\n" << s.dump();
    if (f.blamed >= 0) {
      EXPECT_EQ(s["reduction"]["blamed_rank"], f.blamed) << f.name;
      EXPECT_NEAR(s["reduction"]["beta"].get<double>(), 1.0, 0.05) << f.name;
    } else {
      EXPECT_TRUE(s["reduction"]["blamed_rank"].is_null()) << f.name << "\n" << s.dump();
    }
    if (f.failing.empty()) {
      EXPECT_EQ(s["reduction"]["status"], "fail") << f.name;
    }
  }
}

// A re-quantization skipped on one expert-parallel rank of four is diluted over the layer (its
// beta there was -0.65 against a threshold of 0.66 on this case): each rank runs the
// re-quantization test on its own shard (BUDGETS.md §12), which names the rank.
TEST(ShardedCli, ASkippedRequantizationOnOneRankIsNamed) {
  test::TempDir dir("sharded-requant");
  const std::string c = dir.file("c.h5"), json = dir.file("r.json");
  ASSERT_EQ(moecheck({"make-case", "--preset", "small-deepseek", "--recipe", "sglang", "--tokens", "16", "--seed", "2",
                      "-q", "-o", c})
                .exit_code,
            0);
  ASSERT_EQ(moecheck({"run", c, "--backend", "emulated@hopper", "--ep", "4", "--name", "ok"}).exit_code, 0);
  ASSERT_EQ(moecheck({"run", c, "--backend", "faulty:no_requant@hopper", "--ep", "4", "--fault-rank", "2", "--name",
                      "skipped"})
                .exit_code,
            0);
  EXPECT_EQ(moecheck({"compare", c, "--output", "ok", "-q"}).exit_code, 0);
  const auto r = moecheck({"compare", c, "--output", "skipped", "-q", "--json", json});
  EXPECT_EQ(r.exit_code, 1) << r.out << r.err;
  std::ifstream in(json);
  const nlohmann::json s = nlohmann::json::parse(in)["outputs"][0]["sharding"];
  EXPECT_EQ(s["failing_ranks"].get<std::vector<int>>(), std::vector<int>{2}) << s.dump();
}

// The case file holds the reduced output and every rank's partial; the recorded output is the
// contract's reduction of the recorded partials; a case without ranks reads as before.
TEST(ShardedCli, TheCaseFileRoundTrips) {
  test::TempDir dir("sharded-file");
  const std::string c = dir.file("c.h5"), copy = dir.file("copy.h5");
  write_layer_case(c);
  ASSERT_EQ(moecheck({"run", c, "--backend", "emulated"}).exit_code, 0);
  ASSERT_EQ(moecheck({"run", c, "--backend", "emulated", "--tp", "4", "--name", "layer", "-o", copy}).exit_code, 0);
  EXPECT_EQ(CaseReader(c).outputs().size(), 1u);  // -o: the case itself unchanged
  const CaseReader rd(copy);
  EXPECT_TRUE(rd.validate().empty());
  for (const OutputInfo& o : rd.outputs()) EXPECT_EQ(o.shard, o.name == "layer" ? "tp 4" : "") << o.name;
  const OutputData d = rd.read_output("layer");
  EXPECT_EQ(d.shard, "tp 4");
  EXPECT_EQ(d.output_dtype, Precision::bf16);
  EXPECT_EQ(d.ranks_dtype, Precision::bf16);
  ASSERT_EQ(d.ranks.size(), 4u);
  EXPECT_EQ(reduce_partials(d.ranks), d.output);
  EXPECT_TRUE(d.expert_outputs.empty());
  EXPECT_EQ(d.attributes.at("shard_options"), "--tp 4");
  EXPECT_TRUE(d.attributes.count("input_hash"));
  EXPECT_TRUE(rd.read_output("emulated").ranks.empty());
  const auto ins = moecheck({"inspect", copy, "--json"});
  ASSERT_EQ(ins.exit_code, 0) << ins.err;
  for (const Json& o : Json::parse(ins.out)["outputs"]) {
    if (o["name"] == "layer") {
      EXPECT_EQ(o["shard"], "tp 4");
      EXPECT_EQ(o["datasets"].size(), 3u + 4u) << o.dump();
    } else {
      EXPECT_TRUE(o["shard"].is_null());
    }
  }
  EXPECT_EQ(moecheck({"compare", copy, "-q"}).exit_code, 0);
}

// A case whose ranks break the format: exit 2 naming the file, the dataset and the rule, from
// compare and from every other reader; nothing is written.
TEST(ShardedCli, HostileRankDatasetsExitTwo) {
  test::TempDir dir("sharded-hostile");
  const std::string good = dir.file("good.h5");
  write_layer_case(good);
  ASSERT_EQ(moecheck({"run", good, "--backend", "emulated", "--tp", "4"}).exit_code, 0);
  const std::string g = "/outputs/emulated.tp4/ranks";
  struct Hostile {
    std::string name;
    std::function<void(H5::H5File&)> edit;
    std::string where, rule;
  };
  const Hostile hostile[] = {
      {"missing", [&](H5::H5File& f) { test::unlink(f, g + "/3"); }, g, "holds 3 members; shard = \"tp 4\" needs one dataset per rank, named 0 to 3"},
      {"extra", [&](H5::H5File& f) { test::replace_dataset(f, g + "/4", H5::PredType::IEEE_F32LE, {24, 256}); }, g,
       "holds 5 members"},
      {"shape", [&](H5::H5File& f) { test::replace_dataset(f, g + "/1", H5::PredType::IEEE_F32LE, {24, 255}); },
       g + "/1", "shape must be [T, H] = [24, 256], got [24, 255]"},
      {"dtype", [&](H5::H5File& f) { test::replace_dataset(f, g + "/2", H5::PredType::IEEE_F64LE, {24, 256}); }, g + "/2",
       "must be float32, or uint16 holding bfloat16 bits"},
      {"split", [&](H5::H5File& f) { test::set_attr(f.openGroup(g), "shard", std::string("tp 3")); }, g + "@shard",
       "intermediate_size I = 1024 must split into 3 equal slices"},
      {"text", [&](H5::H5File& f) { test::set_attr(f.openGroup(g), "shard", std::string("4 ranks")); }, g + "@shard",
       "must be \"tp N\" or \"ep N\""},
      {"attr", [&](H5::H5File& f) { f.openGroup(g).removeAttr("shard"); }, g + "@shard", "required attribute missing"},
  };
  for (const Hostile& h : hostile) {
    const std::string c = dir.file(h.name + ".h5");
    std::filesystem::copy_file(good, c);
    test::mutate(c, h.edit);
    const auto before = std::filesystem::last_write_time(c);
    const std::string want = c + ": " + h.where + ": " + h.rule;
    for (std::vector<std::string> args : {std::vector<std::string>{"compare", c, "-q"},
                                          {"run", c, "--backend", "emulated", "--tp", "2"}, {"inspect", c}}) {
      const auto r = moecheck(args);
      EXPECT_EQ(r.exit_code, 2) << h.name << " " << args[0] << "\n" << r.out << r.err;
      EXPECT_TRUE(has(r.err + r.out, want)) << h.name << " " << args[0] << ": want '" << want << "'\n" << r.out << r.err;
    }
    EXPECT_EQ(std::filesystem::last_write_time(c), before) << h.name;
  }
  std::vector<std::string> left;
  for (const auto& e : std::filesystem::directory_iterator(dir.path()))
    if (has(e.path().filename().string(), ".tmp.")) left.push_back(e.path().string());
  EXPECT_TRUE(left.empty()) << left.front();
}

// What cannot run over ranks here, or cannot split this layer: exit 2 with the option or the
// split's rule, and the case unchanged.
TEST(ShardedCli, ImpossibleRequestsExitTwoAndWriteNothing) {
  test::TempDir dir("sharded-usage");
  const std::string c = dir.file("c.h5");
  write_layer_case(c);
  ASSERT_EQ(moecheck({"run", c, "--backend", "emulated", "--ep", "2"}).exit_code, 0);
  struct Bad {
    std::vector<std::string> args;
    std::string want;
  };
  const Bad bad[] = {
      {{"run", c, "--backend", "cuda", "--tp", "2"}, "--backend: cuda cannot run over 2 ranks: multi-GPU runs through NCCL are not built yet"},
      {{"run", c, "--backend", "cublaslt", "--ep", "2"}, "NCCL"},
      {{"run", c, "--backend", "exec:true {case} {out}", "--tp", "2"}, "--backend: an exec:CMD backend cannot run over 2 ranks"},
      {{"run", c, "--backend", "emulated", "--tp", "3"}, c + ": tp 3: intermediate_size I = 1024 must split into 3 equal slices"},
      {{"run", c, "--backend", "emulated", "--tp", "16"}, "(I/N = 64)"},
      {{"run", c, "--backend", "emulated", "--ep", "3"}, c + ": ep 3: num_experts E = 16 does not divide into 3"},
      {{"run", c, "--backend", "faulty:gate_up_swap", "--tp", "4", "--fault-rank", "4"}, "--fault-rank: must be in [0, 4) for tp 4, got 4"},
      {{"run", c, "--backend", "emulated", "--tp", "4", "--fault-rank", "1"}, "--fault-rank: names the rank"},
      {{"run", c, "--backend", "emulated", "--ep", "2", "--shard-fault", "tp_slice_misplaced"}, "--shard-fault: tp_slice_misplaced"},
      {{"run", c, "--backend", "emulated", "--shard-fault", "reduce_bf16"}, "--shard-fault: a sharding fault needs --tp N or --ep N"},
      {{"run", c, "--backend", "emulated", "--tp", "2", "--shard-fault", "nope"}, "--shard-fault"},
      {{"run", c, "--backend", "emulated", "--tp", "2", "--ep", "2"}, "excludes"},
      {{"run", c, "--backend", "emulated", "--tp", "2", "--expert-outputs"}, "--expert-outputs: a run over ranks records no slot outputs"},
      {{"compare", c, "--tier", "ideal", "-q"}, "--tier: the ideal tier does not judge /outputs/emulated.ep2"},
      {{"gate", "--backend", "cuda", "--tp", "2", "--cases", "1"}, "NCCL"},
      {{"shrink", c, "--output", "emulated.ep2", "--tp", "2", "-o", dir.file("min.h5")}, "--output: --tp and --ep run a backend"},
  };
  const auto before = std::filesystem::last_write_time(c);
  for (const Bad& b : bad) {
    const auto r = moecheck(b.args);
    EXPECT_EQ(r.exit_code, 2) << b.args[2] << " " << b.want << "\n" << r.out << r.err;
    EXPECT_TRUE(has(r.err, b.want)) << "want '" << b.want << "'\n" << r.err;
  }
  EXPECT_EQ(std::filesystem::last_write_time(c), before);
  EXPECT_EQ(CaseReader(c).outputs().size(), 1u);
  EXPECT_FALSE(std::filesystem::exists(dir.file("min.h5")));
  // --help says where a faulty backend's fault runs.
  const auto help = moecheck({"run", "--help"});
  EXPECT_TRUE(has(help.out, "the one rank a faulty:<fault> backend's fault")) << help.out;
}

// gate --tp 2: the sweep's cases drawn as whole layers and split (a preset whose I does not split
// is declined with the rule); the correct backend passes; a sharding fault fails, its failure
// named by rank, shrunk and replayable over the same ranks.
TEST(ShardedCli, GateOverRanksPassesEmulatedAndFailsAShardingFault) {
  test::TempDir dir("sharded-gate");
  const std::vector<std::string> common = {"--cases", "4", "--seed", "1", "--no-golden", "-q", "--presets",
                                           "tiny-deepseek,small-deepseek"};
  auto gate = [&](std::vector<std::string> args) {
    args.insert(args.begin(), "gate");
    args.insert(args.end(), common.begin(), common.end());
    return moecheck(args);
  };
  const auto ok = gate({"--backend", "emulated", "--tp", "2"});
  EXPECT_EQ(ok.exit_code, 0) << ok.out << ok.err;
  EXPECT_TRUE(has(ok.out, "sweep: 4 cases run, 4 passed, 0 failed")) << ok.out;
  EXPECT_TRUE(has(ok.out, "every sweep case run over 2 ranks (--tp 2)")) << ok.out;

  const std::string work = dir.file("work");
  const auto bad = gate({"--backend", "emulated", "--tp", "2", "--shard-fault", "rank_added_twice", "--work-dir", work});
  ASSERT_EQ(bad.exit_code, 1) << bad.out << bad.err;
  EXPECT_TRUE(has(bad.out, "rank 1's partial x")) << bad.out;
  EXPECT_FALSE(has(bad.out, "not this fault's doing")) << bad.out;
  EXPECT_TRUE(has(bad.out, "--tp 2 --shard-fault rank_added_twice --fault-rank 1")) << bad.out;
  // The shrunk case replays the failure over the same ranks, and the correct run passes on it.
  const std::regex shrunk("shrunk: +(\\S+-min\\.h5) ");
  std::smatch m;
  ASSERT_TRUE(std::regex_search(bad.out, m, shrunk)) << bad.out;
  const std::string min = m[1];
  EXPECT_EQ(moecheck({"compare", min, "--output", "emulated.tp2.rank_added_twice", "-q"}).exit_code, 1);
  ASSERT_EQ(moecheck({"run", min, "--backend", "emulated", "--tp", "2", "-o", dir.file("ok.h5")}).exit_code, 0);
  EXPECT_EQ(moecheck({"compare", dir.file("ok.h5"), "--output", "emulated.tp2", "-q"}).exit_code, 0);

  // faulty:<fault> over ranks fails on its rank; a preset whose I = 128 cannot split is declined.
  const auto ep = gate({"--backend", "faulty:ep_offset_ignored", "--ep", "2", "--shrink", "0"});
  EXPECT_EQ(ep.exit_code, 1) << ep.out;
  EXPECT_TRUE(has(ep.out, "[rank 1: ")) << ep.out;
  const auto declined = moecheck({"gate", "--backend", "emulated", "--tp", "2", "--cases", "2", "--seed", "1",
                                  "--no-golden", "-q", "--presets", "tiny-qwen"});
  EXPECT_EQ(declined.exit_code, 2) << declined.out;
  EXPECT_TRUE(has(declined.out, "2 unsupported by the backend (not judged)")) << declined.out;
  EXPECT_TRUE(has(declined.out, "2 x intermediate_size I = 128 must split into 2 equal slices")) << declined.out;
}

}  // namespace
}  // namespace moecheck
