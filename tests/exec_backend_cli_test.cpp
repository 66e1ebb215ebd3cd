// `--backend exec:CMD` through the binary (tools/judge/exec_backend.hpp): the numpy kernel of
// tests/exec/numpy_moe_kernel.py passes the gate and its mutants fail it; shrink minimizes a
// failing case through the same command; a command that exits non-zero, outlives the timeout,
// writes garbage, writes nothing or writes a malformed output file is the backend's failure
// (exit 1, the command and its output shown); bad option values are exit 2; an interrupted
// moecheck kills the command's process group and removes the scratch directory. Each test runs
// moecheck with TMPDIR set to a directory of its own, which must be empty afterwards (no scratch
// left behind). The tests that run the kernel skip, saying why, when python3 lacks numpy or h5py.
#include <gtest/gtest.h>
#include <signal.h>
#include <stdlib.h>

#include <chrono>
#include <csignal>
#include <filesystem>
#include <fstream>
#include <regex>
#include <thread>

#include "golden/case_file.hpp"
#include "tests/golden_test_support.hpp"

namespace moecheck {
namespace {

namespace fs = std::filesystem;

std::vector<std::string> entries(const fs::path& dir) {
  std::vector<std::string> v;
  for (const auto& e : fs::directory_iterator(dir)) v.push_back(e.path().filename().string());
  return v;
}

std::string slurp(const std::string& path) {
  std::ifstream f(path);
  return std::string(std::istreambuf_iterator<char>(f), {});
}

// Whether pid still runs: neither gone nor a zombie (an orphan killed with its group may wait a
// moment for its reaper, which in a container need not be prompt). Polled for up to 2 s, since
// a SIGKILL is delivered asynchronously.
bool alive(pid_t pid) {
  for (int i = 0; i < 200; ++i) {
    const std::string stat = slurp("/proc/" + std::to_string(pid) + "/stat");
    const size_t paren = stat.rfind(')');
    if (stat.empty() || (paren != std::string::npos && paren + 2 < stat.size() && stat[paren + 2] == 'Z')) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return true;
}

// The interpreter of the kernel: the one CMake found, or $MOECHECK_TEST_PYTHON3 (to see the skip).
std::string python3() {
  const char* p = std::getenv("MOECHECK_TEST_PYTHON3");
  return p && *p ? p : MOECHECK_PYTHON3;
}

std::string kernel_command(const std::string& fault = "", const std::string& extra = "") {
  std::string cmd = "exec:" + python3() + " " + test::source_path("tests/exec/numpy_moe_kernel.py") +
                    " {case} {out}";
  if (!fault.empty()) cmd += " --fault " + fault;
  if (!extra.empty()) cmd += " " + extra;
  return cmd;
}

// What python3 lacks to run the kernel ("" when nothing).
std::string kernel_unavailable() {
  const test::RunResult r = test::run_process({python3(), "-c", "import numpy, h5py"});
  return r.exit_code == 0 ? "" : python3() + " cannot import numpy and h5py (install python3-numpy python3-h5py): " + r.err;
}

#define SKIP_WITHOUT_KERNEL()                                         \
  do {                                                                \
    if (const std::string why = kernel_unavailable(); !why.empty())   \
      GTEST_SKIP() << why;                                            \
  } while (0)

// Every test gets its own TMPDIR (the scratch directories go there) and a small case.
class ExecBackend : public ::testing::Test {
 protected:
  void SetUp() override {
    ::setenv("TMPDIR", tmp_.path().c_str(), 1);
    case_ = dir_.file("c.h5");
    const test::RunResult r = test::run_moecheck({"make-case", "--preset", "tiny-deepseek", "--tokens", "6", "--seed", "3", "-o", case_});
    ASSERT_EQ(r.exit_code, 0) << r.err;
  }
  void TearDown() override { ::unsetenv("TMPDIR"); }
  // No scratch directory (nor anything else) left in TMPDIR.
  void expect_no_scratch() { EXPECT_TRUE(entries(tmp_.path()).empty()) << "left behind: " << entries(tmp_.path()).front(); }
  // run CASE --backend B: a backend failure, exit 1, stderr naming the command and `what`; no output recorded.
  void expect_backend_failure(const std::string& backend, const std::vector<std::string>& what,
                              std::vector<std::string> extra = {}) {
    std::vector<std::string> args = {"run", case_, "--backend", backend};
    args.insert(args.end(), extra.begin(), extra.end());
    const test::RunResult r = test::run_moecheck(args);
    EXPECT_EQ(r.exit_code, 1) << r.err;
    EXPECT_NE(r.err.find("moecheck: error: backend 'exec:"), std::string::npos) << r.err;
    EXPECT_NE(r.err.find("    command: /bin/sh -c "), std::string::npos) << r.err;
    for (const std::string& w : what) EXPECT_NE(r.err.find(w), std::string::npos) << "no '" << w << "' in:\n" << r.err;
    EXPECT_TRUE(CaseReader(case_).outputs().empty()) << "an output was recorded after a failure";
    expect_no_scratch();
  }
  test::TempDir tmp_{"exec-tmpdir"}, dir_{"exec-case"};
  std::string case_;
};

TEST_F(ExecBackend, CorrectKernelPassesTheGate) {
  SKIP_WITHOUT_KERNEL();
  const test::RunResult r =
      test::run_moecheck({"gate", "--backend", kernel_command(), "--cases", "30", "--seed", "1", "--no-golden", "-q"});
  EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("sweep: 30 cases run, 30 passed, 0 failed"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("gate: PASS"), std::string::npos) << r.out;
  expect_no_scratch();  // the passing gate's work directory included
}

TEST_F(ExecBackend, MutantsFailTheGateWithTheirReplayCommand) {
  SKIP_WITHOUT_KERNEL();
  for (const std::string fault : {"gate_up_swap", "output_scale_2pct", "last_token_zeroed"}) {
    const test::RunResult r = test::run_moecheck({"gate", "--backend", kernel_command(fault), "--cases", "30", "--seed",
                                                  "1", "--no-golden", "-q", "--shrink", "0"});
    EXPECT_EQ(r.exit_code, 1) << fault << "\n" << r.out << r.err;
    EXPECT_NE(r.out.find("gate: FAIL"), std::string::npos) << r.out;
    // Every failure names its case, seed and a replay command with the command line quoted.
    const std::regex replay("replay:    moecheck gate --backend 'exec:[^']*--fault " + fault + "' --seed 1 --case [0-9]+");
    EXPECT_TRUE(std::regex_search(r.out, replay)) << r.out;
    const std::regex work("work directory kept: (\\S+)");
    std::smatch m;
    if (std::regex_search(r.out, m, work)) fs::remove_all(m[1].str());
  }
}

TEST_F(ExecBackend, ReplayOfAFailingGateCase) {
  SKIP_WITHOUT_KERNEL();
  // Case 1 of seed 1 fails with gate_up_swap (MutantsFailTheGate shows it fails some); the
  // replay runs that case alone and fails alike.
  const test::RunResult r = test::run_moecheck({"gate", "--backend", kernel_command("gate_up_swap"), "--seed", "1", "--case",
                                                "1", "-q", "--shrink", "0"});
  EXPECT_EQ(r.exit_code, 1) << r.out << r.err;
  EXPECT_NE(r.out.find("sweep: 1 cases run, 0 passed, 1 failed"), std::string::npos) << r.out;
  const std::regex work("work directory kept: (\\S+)");
  std::smatch m;
  if (std::regex_search(r.out, m, work)) fs::remove_all(m[1].str());
}

// A command exiting 77 declines the case: the gate counts it as unsupported (not judged) with
// the reason the command printed, and passes on the cases it judged; a gate whose cases were all
// declined judged nothing and does not pass (exit 2); `run` of a declined case is exit 2, nothing
// recorded.
TEST_F(ExecBackend, DeclinedCasesAreCountedNotJudged) {
  SKIP_WITHOUT_KERNEL();
  const test::RunResult r = test::run_moecheck(
      {"gate", "--backend", kernel_command("", "--max-tokens 8"), "--cases", "12", "--seed", "1", "--no-golden", "-q"});
  EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_TRUE(std::regex_search(r.out, std::regex("sweep: 12 cases run, [1-9][0-9]* passed, 0 failed, [1-9][0-9]* "
                                                  "unsupported by the backend \\(not judged\\)")))
      << r.out;
  EXPECT_NE(r.out.find(" x the command declines this case (exit status 77): numpy_moe_kernel: unsupported: this "
                       "kernel takes at most 8 tokens"),
            std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("gate: PASS"), std::string::npos) << r.out;
  expect_no_scratch();
}

TEST_F(ExecBackend, AGateWhoseCasesAreAllDeclinedDoesNotPass) {
  SKIP_WITHOUT_KERNEL();
  const test::RunResult r = test::run_moecheck(
      {"gate", "--backend", kernel_command("", "--max-tokens 0"), "--cases", "3", "--seed", "1", "--no-golden", "-q"});
  EXPECT_EQ(r.exit_code, 2) << r.out << r.err;
  EXPECT_NE(r.out.find("no sweep case was judged (3 unsupported"), std::string::npos) << r.out;
  expect_no_scratch();
  const test::RunResult run = test::run_moecheck({"run", case_, "--backend", kernel_command("", "--max-tokens 2")});
  EXPECT_EQ(run.exit_code, 2) << run.err;
  EXPECT_NE(run.err.find(case_ + ": the command declines this case (exit status 77): numpy_moe_kernel: unsupported: "
                         "this kernel takes at most 2 tokens"),
            std::string::npos)
      << run.err;
  EXPECT_TRUE(CaseReader(case_).outputs().empty());
  expect_no_scratch();
}

TEST_F(ExecBackend, RunRecordsTheOutputWithItsBudgetModel) {
  SKIP_WITHOUT_KERNEL();
  const test::RunResult r = test::run_moecheck({"run", case_, "--backend", kernel_command()});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const std::vector<OutputInfo> outs = CaseReader(case_).outputs();
  ASSERT_EQ(outs.size(), 1u);
  EXPECT_EQ(outs[0].name, "exec");
  EXPECT_EQ(outs[0].attributes.at("budget_model"), "fp32");
  const test::RunResult c = test::run_moecheck({"compare", case_, "--output", "exec"});
  EXPECT_EQ(c.exit_code, 0) << c.out << c.err;
  expect_no_scratch();
}

TEST_F(ExecBackend, ShrinkThroughTheCommand) {
  SKIP_WITHOUT_KERNEL();
  const std::string min = dir_.file("min.h5");
  const test::RunResult r = test::run_moecheck(
      {"shrink", case_, "--backend", kernel_command("gate_up_swap"), "--max-attempts", "25", "-q", "-o", min});
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  const std::regex tokens("T 6 -> ([0-9]+)");
  std::smatch m;
  ASSERT_TRUE(std::regex_search(r.out, m, tokens)) << r.out;
  EXPECT_LT(std::stoi(m[1].str()), 6) << r.out;
  // The replay names the command quoted, and the recorded failing output fails compare.
  EXPECT_NE(r.out.find("--backend 'exec:"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("--output exec"), std::string::npos) << r.out;
  const test::RunResult c = test::run_moecheck({"compare", min, "--output", "exec"});
  EXPECT_EQ(c.exit_code, 1) << c.out << c.err;
  expect_no_scratch();
}

TEST_F(ExecBackend, NonZeroExitIsTheBackendsFailure) {
  expect_backend_failure("exec:echo to-stdout; echo to-stderr >&2; exit 3 # {case} {out}",
                         {"the exec backend's command failed", "exit status 3", "to-stdout", "to-stderr"});
}

TEST_F(ExecBackend, DeathBySignalIsTheBackendsFailure) {
  expect_backend_failure("exec:kill -SEGV $$ # {out}", {"killed by signal 11 (SIGSEGV)"});
}

// moecheck blocks SIGINT/SIGTERM in all its threads (golden/interrupt.hpp), and a spawned child
// inherits the mask and ignored dispositions: the command must see neither. moecheck runs here
// with SIGINT and SIGTERM ignored (inherited from this test), the shell prints its own mask with
// builtins only: a forked reader (grep /proc/$$/status) sees dash 0.5.12 with every signal
// blocked while it forks and waits (SigBlk fffffffe7ffbfeff on a 2-core machine), and a child's
// /proc/self shows the mask dash gave it, not the one moecheck gave dash.
TEST_F(ExecBackend, CommandRunsWithSignalsUnblockedAndDefault) {
  const auto old_int = std::signal(SIGINT, SIG_IGN), old_term = std::signal(SIGTERM, SIG_IGN);
  const test::RunResult r =
      test::run_moecheck({"run", case_, "--backend",
                          "exec:while read -r l; do case $l in Sig[BI]*) echo \"$l\";; esac; done < /proc/$$/status; "
                          "exit 3 # {out}"});
  std::signal(SIGINT, old_int), std::signal(SIGTERM, old_term);
  EXPECT_EQ(r.exit_code, 1) << r.err;
  std::smatch m;
  ASSERT_TRUE(std::regex_search(r.err, m, std::regex("SigBlk:\\s+([0-9a-f]+)"))) << r.err;
  EXPECT_EQ(std::stoull(m[1].str(), nullptr, 16), 0u) << "blocked signals in the command:\n" << r.err;
  ASSERT_TRUE(std::regex_search(r.err, m, std::regex("SigIgn:\\s+([0-9a-f]+)"))) << r.err;
  const unsigned long long ignored = std::stoull(m[1].str(), nullptr, 16);
  EXPECT_EQ(ignored & ((1ull << (SIGINT - 1)) | (1ull << (SIGTERM - 1))), 0u) << "SIGINT/SIGTERM ignored:\n" << r.err;
  expect_no_scratch();
}

TEST_F(ExecBackend, TimeoutKillsTheWholeGroup) {
  // The shell starts a background sleep and waits: both are in the command's process group.
  const std::string pidfile = dir_.file("pid");
  const auto t0 = std::chrono::steady_clock::now();
  expect_backend_failure("exec:sleep 30 & echo $! > " + pidfile + "; echo waiting; wait # {out}",
                         {"timed out (--exec-timeout 0.5 s)", "waiting"}, {"--exec-timeout", "0.5"});
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 20);
  const pid_t sleeper = std::stoi(slurp(pidfile));
  EXPECT_FALSE(alive(sleeper)) << "the command's background process " << sleeper << " survived the timeout";
}

TEST_F(ExecBackend, NoOutputFileIsTheBackendsFailure) {
  expect_backend_failure("exec:true {case} {out}", {"the command wrote no output file", "exit status 0"});
}

TEST_F(ExecBackend, GarbageOutputIsTheBackendsFailure) {
  expect_backend_failure("exec:echo garbage > {out}", {"not an HDF5 file"});
}

TEST_F(ExecBackend, MalformedOutputFilesAreTheBackendsFailure) {
  SKIP_WITHOUT_KERNEL();
  const std::string py = "exec:" + python3() + " -c ";
  // T = 6, H = 256, k = 4 for this case (tiny-deepseek).
  const std::vector<std::pair<std::string, std::string>> bad = {
      {"import h5py,sys; f=h5py.File(sys.argv[1],'w'); f['x']=1", "/outputs: required group missing"},
      {"import h5py,sys,numpy as n; f=h5py.File(sys.argv[1],'w'); f['outputs/a/output']=n.zeros((6,256),'f4'); "
       "f['outputs/b/output']=n.zeros((6,256),'f4')",
       "must hold exactly one output group, got 2"},
      {"import h5py,sys,numpy as n; f=h5py.File(sys.argv[1],'w'); f['outputs/a/output']=n.zeros((5,256),'f4')",
       "/outputs/a/output: shape must be [T, H] = [6, 256], got [5, 256]"},
      {"import h5py,sys,numpy as n; f=h5py.File(sys.argv[1],'w'); f['outputs/a/output']=n.zeros((6,256),'f8')",
       "/outputs/a/output: must be float32"},
      {"import h5py,sys,numpy as n; f=h5py.File(sys.argv[1],'w'); g=f.create_group('outputs/a'); "
       "g['output']=n.zeros((6,256),'f4'); g.attrs['budget_model']='fp31'",
       "/outputs/a@budget_model: must be fp32"},
      {"import h5py,sys,numpy as n; f=h5py.File(sys.argv[1],'w'); f['outputs/a/topk_ids']=n.zeros((6,4),'i4')",
       "/outputs/a/output: required dataset missing"},
  };
  for (const auto& [script, what] : bad) expect_backend_failure(py + "\"" + script + "\" {out}", {what});
}

TEST_F(ExecBackend, BadOptionValuesAreBadInput) {
  for (const std::string b : {"exec:", "exec:   ", "exec:python3 kernel.py {case}"}) {
    const test::RunResult r = test::run_moecheck({"run", case_, "--backend", b});
    EXPECT_EQ(r.exit_code, 2) << b << ": " << r.err;
    EXPECT_NE(r.err.find("moecheck: error: --backend: exec:CMD"), std::string::npos) << r.err;
  }
  const test::RunResult t = test::run_moecheck({"run", case_, "--backend", "exec:true {out}", "--exec-timeout", "0"});
  EXPECT_EQ(t.exit_code, 2) << t.err;
  // faults needs {fault} in CMD and the mutants' names.
  const test::RunResult f1 = test::run_moecheck({"faults", "--backend", "exec:true {out}", "--faults", "a"});
  EXPECT_EQ(f1.exit_code, 2) << f1.err;
  EXPECT_NE(f1.err.find("faults needs {fault} in CMD"), std::string::npos) << f1.err;
  const test::RunResult f2 = test::run_moecheck({"faults", "--backend", "exec:true {out} {fault}"});
  EXPECT_EQ(f2.exit_code, 2) << f2.err;
  expect_no_scratch();
}

TEST_F(ExecBackend, InterruptKillsTheCommandAndRemovesTheScratch) {
  for (const int sig : {SIGINT, SIGTERM}) {
    const std::string pidfile = dir_.file("pid-" + std::to_string(sig));
    bool sent = false;
    const test::RunResult r = test::run_process_interrupted(
        {test::binary("moecheck"), "run", case_, "--backend", "exec:echo $$ > " + pidfile + "; sleep 60; true {out}"}, sig,
        [&](const std::string&) { return !slurp(pidfile).empty(); }, &sent, 30);
    ASSERT_TRUE(sent) << r.err;
    EXPECT_EQ(r.exit_code, 128 + sig) << r.err;
    EXPECT_NE(r.err.find("killed the process group"), std::string::npos) << r.err;
    EXPECT_NE(r.err.find("removed " + tmp_.path().string() + "/moecheck-exec-"), std::string::npos) << r.err;
    const pid_t shell = std::stoi(slurp(pidfile));
    EXPECT_FALSE(alive(shell)) << "the command " << shell << " survived moecheck's interruption";
    expect_no_scratch();
  }
}

TEST_F(ExecBackend, FaultsTableOfTheKernelsMutants) {
  SKIP_WITHOUT_KERNEL();
  const test::RunResult r = test::run_moecheck({"faults", "--backend", kernel_command("{fault}"), "--faults",
                                                "gate_up_swap,output_scale_2pct,last_token_zeroed", "--cases", "4", "-q"});
  EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("| `{fault}=none` (correct) | - | - | - | - | - | - | 0 / 4 |"), std::string::npos) << r.out;
  // Each mutant's golden/bugs case is caught.
  for (const std::string f : {"gate_up_swap", "output_scale_2pct", "last_token_zeroed"})
    EXPECT_TRUE(std::regex_search(r.out, std::regex("\\| `\\{fault\\}=" + f + "` \\| caught: "))) << f << "\n" << r.out;
  expect_no_scratch();
}

}  // namespace
}  // namespace moecheck
