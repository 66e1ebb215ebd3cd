// Clean interruption (golden/interrupt.hpp) through the binary: SIGINT or SIGTERM in the middle of
// make-case and of gate removes the temporary and the work directory, says where the run
// stopped, and exits 130 / 143; a gate run with --keep keeps its work directory.
#include <gtest/gtest.h>

#include <csignal>
#include <filesystem>
#include <regex>

#include "tests/golden_test_support.hpp"

namespace moecheck {
namespace {

namespace fs = std::filesystem;

bool holds_temporary(const fs::path& dir) {
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec))
    if (e.path().filename().string().find(".tmp.") != std::string::npos) return true;
  return false;
}

std::vector<std::string> entries(const fs::path& dir) {
  std::vector<std::string> v;
  for (const auto& e : fs::directory_iterator(dir)) v.push_back(e.path().filename().string());
  return v;
}

// make-case of a layer large enough (8 DeepSeek-V3 experts, 350 MB) to be caught while writing.
TEST(Interrupt, MakeCaseRemovesItsTemporary) {
  for (const int sig : {SIGINT, SIGTERM}) {
    test::TempDir dir("interrupt-make-case");
    const std::string c = dir.file("q.h5");
    bool sent = false;
    const test::RunResult r = test::run_process_interrupted(
        {test::binary("moecheck"), "make-case", "--preset", "deepseek-v3", "--tokens", "4", "--seed", "1",
         "--experts-limit", "8", "-o", c},
        sig, [&](const std::string&) { return holds_temporary(dir.path()); }, &sent);
    ASSERT_TRUE(sent) << "make-case ended before its temporary was seen: " << r.err;
    EXPECT_EQ(r.exit_code, 128 + sig) << r.err;
    EXPECT_NE(r.err.find(sig == SIGINT ? "interrupted by SIGINT during make-case" : "interrupted by SIGTERM"),
              std::string::npos)
        << r.err;
    EXPECT_NE(r.err.find("removed " + c + ".tmp."), std::string::npos) << r.err;
    EXPECT_TRUE(entries(dir.path()).empty()) << "left behind: " << entries(dir.path()).front();
  }
}

std::string work_directory(const std::string& out) {
  std::smatch m;
  static const std::regex re("gate: work directory (\\S+)");
  return std::regex_search(out, m, re) ? m[1].str() : std::string();
}

// gate writes one case after another into its work directory; interrupted once the second case
// is there.
test::RunResult interrupted_gate(int sig, bool keep, std::string* work) {
  std::vector<std::string> argv = {test::binary("moecheck"), "gate", "--backend", "emulated", "--cases", "10000",
                                   "--seed", "1", "--no-golden", "-q"};
  if (keep) argv.push_back("--keep");
  bool sent = false;
  const test::RunResult r = test::run_process_interrupted(
      argv, sig,
      [&](const std::string& out) {
        *work = work_directory(out);
        std::error_code ec;
        return !work->empty() && fs::exists(fs::path(*work) / "case-1.h5", ec);
      },
      &sent);
  EXPECT_TRUE(sent) << r.out << r.err;
  return r;
}

TEST(Interrupt, GateRemovesItsWorkDirectory) {
  std::string work;
  const test::RunResult r = interrupted_gate(SIGTERM, false, &work);
  EXPECT_EQ(r.exit_code, 143) << r.err;
  EXPECT_NE(r.err.find("interrupted by SIGTERM during gate: case "), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("removed " + work), std::string::npos) << r.err;
  EXPECT_FALSE(fs::exists(work)) << work;
}

TEST(Interrupt, GateKeepsItsWorkDirectoryWithKeep) {
  std::string work;
  const test::RunResult r = interrupted_gate(SIGINT, true, &work);
  EXPECT_EQ(r.exit_code, 130) << r.err;
  ASSERT_TRUE(fs::is_directory(work)) << r.err;
  EXPECT_FALSE(holds_temporary(work)) << "a partial case was left in " << work;
  fs::remove_all(work);
}

}  // namespace
}  // namespace moecheck
