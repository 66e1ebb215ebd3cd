// The bug corpus (golden/bugs/, golden/bugs/README.md): one minimal case per fault of the
// faulty:<fault> backend, each a regression test of the checking pipeline:
//   - the case is valid, small, and holds the fault's recorded output /outputs/faulty:<fault>;
//   - `compare` flags that recording (exit 1), and re-running the fault still fails;
//   - the correct backend (emulated) passes on the same case (the failure is the fault's);
//   - where the fault is local, the report names the right place: empty_expert_garbage the local
//     expert with the fewest tokens, zero_group_nan the token with the all-zero group.
// Regenerate the corpus with tools/make-bug-corpus.sh.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>
#include <map>
#include <set>

#include "golden/case_file.hpp"
#include "kernels/emulated/emulated_moe.hpp"
#include "tests/golden_test_support.hpp"

namespace moecheck {
namespace {

using nlohmann::json;
using test::run_process;

const auto moecheck = test::run_moecheck;

json read_json(const std::string& path) {
  std::ifstream f(path);
  return json::parse(f);
}

std::string bug_case(Fault f) { return test::source_path("golden/bugs/" + std::string(to_string(f)) + ".h5"); }

// Global ids of the failing experts and the tokens failing alone, from a compare --json report.
std::set<int64_t> failing_experts(const json& out) {
  std::set<int64_t> s;
  for (const json& e : out["experts"])
    if (e["status"] == "fail") s.insert(e["expert"].get<int64_t>());
  return s;
}

class BugCase : public ::testing::TestWithParam<Fault> {};

TEST_P(BugCase, IsCaughtAndNamed) {
  const Fault f = GetParam();
  const std::string path = bug_case(f), name = "faulty:" + std::string(to_string(f));
  ASSERT_TRUE(std::filesystem::exists(path)) << path << " missing: run tools/make-bug-corpus.sh";
  EXPECT_LE(std::filesystem::file_size(path), 256u * 1024) << "bug cases must stay small";
  const CaseReader rd(path);
  EXPECT_TRUE(rd.validate().empty());
  std::map<std::string, std::string> attrs;
  for (const OutputInfo& o : rd.outputs())
    if (o.name == name) attrs = o.attributes;
  ASSERT_EQ(attrs.count("backend"), 1u) << path << " has no /outputs/" << name;
  EXPECT_EQ(attrs["backend"], name);
  std::vector<std::string> thr;
  if (attrs.count("int32_threshold")) thr = {"--int32-threshold", attrs["int32_threshold"]};

  test::TempDir dir("bug-case");
  // The recording is flagged.
  auto r = moecheck({"compare", path, "--output", name, "-q", "--json", dir.file("rec.json")});
  EXPECT_EQ(r.exit_code, 1) << r.out << r.err;
  // Running the fault again is flagged too.
  std::vector<std::string> run = {"run", path, "--backend", name, "--expert-outputs", "-o", dir.file("re.h5")};
  run.insert(run.end(), thr.begin(), thr.end());
  ASSERT_EQ(moecheck(run).exit_code, 0);
  r = moecheck({"compare", dir.file("re.h5"), "--output", name, "-q", "--json", dir.file("re.json")});
  EXPECT_EQ(r.exit_code, 1) << r.out;
  // The correct backend passes on the same case.
  ASSERT_EQ(moecheck({"run", path, "--backend", "emulated", "--expert-outputs", "-o", dir.file("ok.h5")}).exit_code, 0);
  r = moecheck({"compare", dir.file("ok.h5"), "--output", "emulated", "-q"});
  EXPECT_EQ(r.exit_code, 0) << r.out;

  const json rep = read_json(dir.file("re.json"))["outputs"][0];
  const OutputData rec = rd.read_output(name);
  const MoeConfig& c = rd.config();
  const int64_t T = rd.tokens(), k = c.top_k, H = c.hidden_size;
  if (f == Fault::empty_expert_garbage) {
    // The local expert with the fewest tokens (ties: lowest id) is the one never written.
    std::map<int64_t, int64_t> tokens;
    for (int32_t e : rec.topk_ids)
      if (c.is_local(e)) ++tokens[e];
    ASSERT_FALSE(tokens.empty());
    int64_t want = tokens.begin()->first;
    for (const auto& [e, n] : tokens)
      if (n < tokens[want]) want = e;
    EXPECT_EQ(failing_experts(rep), std::set<int64_t>{want}) << rep.dump();
  }
  if (f == Fault::zero_group_nan) {
    // The token with an all-zero activation group is the one reported, with non-finite values.
    const std::vector<float> h = rd.read_hidden_states();
    std::set<int64_t> zero_tokens;
    for (int64_t t = 0; t < T; ++t)
      for (int64_t g = 0; g * c.group_size < H; ++g) {
        bool zero = true;
        for (int64_t i = g * c.group_size; i < std::min(H, (g + 1) * c.group_size); ++i) zero = zero && h[t * H + i] == 0.0f;
        if (zero) zero_tokens.insert(t);
      }
    ASSERT_FALSE(zero_tokens.empty());
    EXPECT_TRUE(zero_tokens.count(rep["worst"]["token"].get<int64_t>())) << rep.dump();
    EXPECT_GT(rep["metrics"]["nonfinite"].get<int64_t>(), 0);
  }
  // Every expert the report blames is one the case stores (a routed expert of the reference or
  // of the backend; a subset case stores nothing else).
  const std::set<int64_t> stored(rd.expert_ids().begin(), rd.expert_ids().end());
  for (int64_t e : failing_experts(rep)) EXPECT_TRUE(stored.count(e)) << "expert " << e << " blamed but not stored";
  EXPECT_FALSE(rep["routing"]["mismatched"].empty() && failing_experts(rep).empty() && rep["token_failures"].empty())
      << "a failure must name an expert, a token or a routing mismatch: " << rep.dump();
  (void)k;
}

INSTANTIATE_TEST_SUITE_P(AllFaults, BugCase, ::testing::ValuesIn(all_faults()),
                         [](const auto& info) { return std::string(to_string(info.param)); });

TEST(BugCorpus, OneCasePerFaultAndSmall) {
  uintmax_t total = 0;
  int n = 0;
  for (const auto& e : std::filesystem::directory_iterator(test::source_path("golden/bugs")))
    if (e.path().extension() == ".h5") {
      total += e.file_size(), ++n;
      EXPECT_TRUE(parse_fault(e.path().stem().string()).has_value()) << e.path() << " is not named after a fault";
    }
  EXPECT_EQ(n, int(all_faults().size()));
  EXPECT_LT(total, 2u << 20) << "the bug corpus must stay well under 2 MB";
}

}  // namespace
}  // namespace moecheck
