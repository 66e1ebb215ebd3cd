// The judge through the binary: the same data gives the same verdict whether the reference is
// computed or read back from /reference/quantized, and every judging command takes
// --budget-model and names the model in its report.
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>

#include "tests/golden_test_support.hpp"

namespace moecheck {
namespace {

using test::run_process;

const auto moecheck = test::run_moecheck;

nlohmann::json read_json(const std::string& path) {
  std::ifstream f(path);
  return nlohmann::json::parse(f);
}

// A faulty output on a fresh case (no stored reference yet).
std::string faulty_case(test::TempDir& dir, const std::string& fault, int tokens = 16) {
  const std::string c = dir.file("c.h5");
  EXPECT_EQ(moecheck({"make-case", "--preset", "tiny-deepseek", "--tokens", std::to_string(tokens), "--seed", "1", "-q",
                      "-o", c})
                .exit_code,
            0);
  EXPECT_EQ(moecheck({"run", c, "--backend", fault}).exit_code, 0);
  return c;
}

TEST(JudgeCli, StoredReferenceGivesTheSameVerdict) {
  test::TempDir dir("judge-stored");
  const std::string c = faulty_case(dir, "faulty:act_scale_transposed");
  auto r = moecheck({"compare", c, "-q", "--json", dir.file("computed.json")});
  ASSERT_EQ(r.exit_code, 1) << r.out << r.err;
  ASSERT_EQ(moecheck({"reference", c, "-q"}).exit_code, 0);
  r = moecheck({"compare", c, "--json", dir.file("stored.json")});
  ASSERT_EQ(r.exit_code, 1) << r.out << r.err;
  ASSERT_NE(r.err.find("reused from /reference/quantized"), std::string::npos) << r.err;
  nlohmann::json a = read_json(dir.file("computed.json")), b = read_json(dir.file("stored.json"));
  ASSERT_EQ(a["outputs"].size(), 1u);
  // Every statistic of every expert, not only the verdicts.
  const auto& ea = a["outputs"][0]["experts"];
  const auto& eb = b["outputs"][0]["experts"];
  ASSERT_EQ(ea.size(), eb.size());
  for (size_t i = 0; i < ea.size(); ++i) {
    EXPECT_EQ(ea[i]["expert"], eb[i]["expert"]);
    EXPECT_EQ(ea[i]["bias"], eb[i]["bias"]) << "expert " << ea[i]["expert"];
    EXPECT_EQ(ea[i]["energy"], eb[i]["energy"]) << "expert " << ea[i]["expert"];
  }
  a.erase("reference_seconds"), b.erase("reference_seconds"), a.erase("reference_device"), b.erase("reference_device");
  EXPECT_EQ(a, b);
}

// A stored reference whose noise-model terms are of an older revision (attribute noise_model absent
// or different: written before the flip projections held the groups' shared scale term) is not
// reused: compare says so and judges as with a computed reference.
TEST(JudgeCli, StoredReferenceOfAnOlderNoiseModelIsComputedAgain) {
  test::TempDir dir("judge-stored-old");
  const std::string c = faulty_case(dir, "faulty:act_scale_transposed");
  ASSERT_EQ(moecheck({"compare", c, "-q", "--json", dir.file("computed.json")}).exit_code, 1);
  ASSERT_EQ(moecheck({"reference", c, "-q"}).exit_code, 0);
  test::mutate(c, [](H5::H5File& f) { test::set_attr(f.openGroup("/reference/quantized"), "noise_model", "1"); });
  const auto r = moecheck({"compare", c, "--json", dir.file("stored.json")});
  ASSERT_EQ(r.exit_code, 1) << r.out << r.err;
  EXPECT_NE(r.err.find("older noise model"), std::string::npos) << r.err;
  EXPECT_EQ(r.err.find("reused from /reference/quantized"), std::string::npos) << r.err;
  nlohmann::json a = read_json(dir.file("computed.json")), b = read_json(dir.file("stored.json"));
  a.erase("reference_seconds"), b.erase("reference_seconds"), a.erase("reference_device"), b.erase("reference_device");
  EXPECT_EQ(a, b);
}

// Near-tie tokens are re-run by the reference under the routing the output explains best; with
// --requant-test those rows need the test's terms too (it read past them and crashed: seeds 1
// and 2 of this case).
TEST(JudgeCli, RequantTestFollowsTheReRunNearTieTokens) {
  test::TempDir dir("judge-requant-ties");
  for (const char* seed : {"1", "2"}) {
    const std::string c = dir.file(std::string("c") + seed + ".h5");
    ASSERT_EQ(moecheck({"make-case", "--preset", "tiny-deepseek", "--tokens", "16", "--seed", seed, "--near-ties",
                        "-q", "-o", c})
                  .exit_code,
              0);
    ASSERT_EQ(moecheck({"run", c, "--backend", "emulated@hopper"}).exit_code, 0);
    const auto r = moecheck({"compare", c, "--requant-test", "-q", "--json", dir.file("r.json")});
    ASSERT_EQ(r.exit_code, 0) << "seed " << seed << "\n" << r.out << r.err;
    const auto requant = read_json(dir.file("r.json"))["outputs"][0]["requant"];
    EXPECT_TRUE(requant["fitted"].get<bool>()) << "seed " << seed << ": " << requant.dump();
    EXPECT_TRUE(requant["ok"].get<bool>()) << "seed " << seed << ": " << requant.dump();
  }
}

TEST(JudgeCli, ShrinkAndReproTakeTheBudgetModel) {
  test::TempDir dir("judge-model");
  const std::string c = faulty_case(dir, "faulty:scaling_factor_twice", 4);
  auto r = moecheck({"repro", c, "--backend", "emulated", "--budget-model", "hmma-f32"});
  EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("budget model hmma-f32"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("--budget-model hmma-f32"), std::string::npos) << r.out;  // in the replay command
  r = moecheck({"repro", c, "--budget-model", "bits:99"});
  EXPECT_EQ(r.exit_code, 2) << r.out << r.err;
  r = moecheck({"shrink", c, "--output", "faulty:scaling_factor_twice", "--budget-model", "trunc:20", "-q", "-o",
                dir.file("min.h5")});
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("--budget-model trunc:20"), std::string::npos) << r.out;
  r = moecheck({"compare", dir.file("min.h5"), "-q", "--budget-model", "trunc:20", "--json", dir.file("min.json")});
  EXPECT_EQ(r.exit_code, 1) << r.out << r.err;
  EXPECT_EQ(read_json(dir.file("min.json"))["outputs"][0]["budget_model"], "trunc:20");
  EXPECT_NE(r.out.find("budget model: trunc:20"), std::string::npos) << r.out;
}

// A vacuous output (budget > |reference| on most elements, here under bits:8) exits 1 and is
// labelled VACUOUS in every report; --allow-vacuous exits 0 but never calls it PASS.
TEST(JudgeCli, VacuousOutputIsFlagged) {
  test::TempDir dir("judge-vacuous");
  const std::string c = faulty_case(dir, "emulated", 8);
  auto r = moecheck({"compare", c, "-q", "--budget-model", "bits:8", "--json", dir.file("v.json"), "--html",
                     dir.file("v.html")});
  EXPECT_EQ(r.exit_code, 1) << r.out << r.err;
  EXPECT_NE(r.out.find("VACUOUS"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("PASS"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("power (what this check could have seen)"), std::string::npos) << r.out;
  const nlohmann::json j = read_json(dir.file("v.json"));
  EXPECT_EQ(j["status"], "vacuous");
  EXPECT_EQ(j["outputs"][0]["status"], "vacuous");
  EXPECT_EQ(j["outputs"][0]["power"]["vacuous"], true);
  std::ifstream html(dir.file("v.html"));
  const std::string page((std::istreambuf_iterator<char>(html)), std::istreambuf_iterator<char>());
  EXPECT_NE(page.find("VACUOUS"), std::string::npos);
  r = moecheck({"compare", c, "-q", "--budget-model", "bits:8", "--allow-vacuous"});
  EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("VACUOUS"), std::string::npos) << r.out;
  r = moecheck({"repro", c, "--output", "emulated", "--budget-model", "bits:8"});
  EXPECT_EQ(r.exit_code, 1) << r.out << r.err;
  // The same output under its own model is judged and passes, with its power stated.
  r = moecheck({"compare", c, "-q", "--json", dir.file("p.json")});
  EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
  const nlohmann::json p = read_json(dir.file("p.json"));
  EXPECT_EQ(p["outputs"][0]["status"], "pass");
  EXPECT_LT(p["outputs"][0]["power"]["scale_error"].get<double>(),
            j["outputs"][0]["power"]["scale_error"].get<double>());
}

std::string read_text(const std::string& path) {
  std::ifstream f(path);
  return std::string((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
}

TEST(JudgeCli, CompareWritesJunit) {
  test::TempDir dir("judge-junit");
  const std::string c = faulty_case(dir, "emulated", 8);
  ASSERT_EQ(moecheck({"run", c, "--backend", "faulty:gate_up_swap"}).exit_code, 0);
  auto r = moecheck({"compare", c, "-q", "--junit", dir.file("j.xml")});
  EXPECT_EQ(r.exit_code, 1) << r.out << r.err;
  const std::string x = read_text(dir.file("j.xml"));
  EXPECT_NE(x.find("<testsuites name=\"moecheck compare\" tests=\"2\" failures=\"1\""), std::string::npos) << x;
  EXPECT_NE(x.find("<testcase classname=\"" + c + "\" name=\"emulated\""), std::string::npos) << x;
  const size_t f = x.find("name=\"faulty:gate_up_swap\"");
  ASSERT_NE(f, std::string::npos) << x;
  EXPECT_NE(x.find("<failure message=\"faulty:gate_up_swap: expert", f), std::string::npos) << x;
  // A vacuous output allowed by --allow-vacuous is skipped (with its power), not passed.
  r = moecheck({"compare", c, "-q", "--output", "emulated", "--budget-model", "bits:8", "--allow-vacuous", "--junit",
                dir.file("v.xml")});
  EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_NE(read_text(dir.file("v.xml")).find("<skipped message=\"vacuous (allowed): "), std::string::npos)
      << read_text(dir.file("v.xml"));
  // Bad path: exit 2 naming the option, nothing written.
  r = moecheck({"compare", c, "-q", "--junit", dir.file("no/such/dir/j.xml")});
  EXPECT_EQ(r.exit_code, 2) << r.out << r.err;
}

}  // namespace
}  // namespace moecheck
