// `moecheck make-case` through the real binary (${MOECHECK_BINARY_DIR}/moecheck): listing,
// a written case that validates and whose `source` attribute regenerates it bit for bit, a
// dry run that writes nothing, and exit code 2 with a message naming the option for every
// bad argument (no file left behind).
#include <gtest/gtest.h>

#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>

#include "golden/model_presets.hpp"
#include "tests/generator_test_support.hpp"

namespace moecheck {
namespace {

struct CliRun {
  int rc = -1;
  std::string out;  // stdout and stderr together
};

std::string binary() {
  const char* bin = std::getenv("MOECHECK_BINARY_DIR");
  return std::string(bin ? bin : ".") + "/moecheck";
}

CliRun run(const std::string& args) {
  CliRun r;
  const std::string cmd = binary() + " " + args + " 2>&1";
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) return r;
  std::array<char, 4096> buf;
  size_t n;
  while ((n = fread(buf.data(), 1, buf.size(), p)) > 0) r.out.append(buf.data(), n);
  const int status = pclose(p);
  r.rc = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

TEST(MakeCaseCli, ListPresetsShowsEveryPresetWithItsValues) {
  const CliRun r = run("make-case --list-presets");
  ASSERT_EQ(r.rc, 0) << r.out;
  for (const ModelPreset& p : model_presets()) EXPECT_TRUE(contains(r.out, std::string(p.name))) << p.name;
  EXPECT_TRUE(contains(r.out, "deepseek-r1"));
  EXPECT_TRUE(contains(r.out, "7168"));
  EXPECT_TRUE(contains(r.out, "2.827"));
  EXPECT_TRUE(contains(r.out, "config.json"));
}

TEST(MakeCaseCli, WrittenCaseValidatesAndItsSourceRegeneratesIt) {
  const testing::ScratchDir dir("cli-make-case");
  const std::string a = dir.file("a.h5");
  const CliRun r = run("make-case --preset tiny-deepseek --tokens 6 --seed 42 --tp 2 --tp-rank 1 --ep 2 --ep-rank 1 "
                    "--near-ties --scale-format ue8m0 --gate-up-layout up_gate -o " + a);
  ASSERT_EQ(r.rc, 0) << r.out;
  const CaseReader reader(a);
  EXPECT_TRUE(reader.validate().empty());
  EXPECT_EQ(reader.config().intermediate_size, 128);
  EXPECT_EQ(reader.config().local_expert_offset, 8);
  EXPECT_EQ(reader.config().scale_format, ScaleFormat::ue8m0);
  EXPECT_EQ(reader.config().gate_up_layout, GateUpLayout::up_gate);
  const std::string source = reader.source().value_or("");
  ASSERT_EQ(source.rfind("moecheck make-case ", 0), 0u) << source;
  EXPECT_TRUE(contains(source, "--seed 42"));
  // Re-run the recorded command (with another output) and compare every dataset.
  const size_t o = source.rfind(" -o ");
  ASSERT_NE(o, std::string::npos);
  const std::string b = dir.file("b.h5");
  const CliRun again = run(source.substr(std::string("moecheck ").size(), o - std::string("moecheck ").size()) + " -o " + b);
  ASSERT_EQ(again.rc, 0) << again.out;
  testing::expect_same_data(testing::read_case(a), testing::read_case(b));
}

TEST(MakeCaseCli, DryRunWritesNothing) {
  const testing::ScratchDir dir("cli-dry-run");
  const std::string out = dir.file("never.h5");
  const CliRun r = run("make-case --preset deepseek-v3 --tokens 4 --seed 1 --routed-only --dry-run -o " + out);
  ASSERT_EQ(r.rc, 0) << r.out;
  EXPECT_TRUE(contains(r.out, "experts:"));
  EXPECT_TRUE(contains(r.out, "w13 ["));
  EXPECT_FALSE(std::filesystem::exists(out));
}

TEST(MakeCaseCli, BadArgumentsExitTwoNamingTheOption) {
  const testing::ScratchDir dir("cli-bad");
  const std::string out = dir.file("bad.h5");
  struct Bad {
    std::string args, want1, want2;
  };
  const Bad bad[] = {
      {"--preset nosuch --tokens 2 --seed 1 -o " + out, "--preset", "unknown preset \"nosuch\""},
      {"--preset tiny-qwen --tokens 2 --seed 1 --tp 2 -o " + out, "--tp", "multiple of the 128-wide weight block"},
      {"--preset qwen3-30b-a3b --tokens 2 --seed 1 --tp 4 -o " + out, "--tp", "I/N = 192"},
      {"--preset tiny-deepseek --tokens 2 --seed 1 --ep 3 -o " + out, "--ep", "does not divide"},
      {"--preset tiny-deepseek --tokens 2 --seed 1 --ep 2 --ep-rank 2 -o " + out, "--ep-rank", "[0, --ep = 2)"},
      {"--preset tiny-deepseek --tokens 0 --seed 1 -o " + out, "--tokens", "[1, 2^24]"},
      {"--preset tiny-deepseek --tokens -3 --seed 1 -o " + out, "--tokens", "got -3"},
      {"--preset tiny-deepseek --tokens 2 --seed 1", "-o", "required"},
      {"--preset tiny-deepseek --tokens 2 -o " + out, "--seed", "required"},
      {"--tokens 2 --seed 1 -o " + out, "--preset", "required"},
      {"--preset tiny-deepseek --tokens 2 --seed 1 --dist gaussian -o " + out, "--dist", "realistic | uniform"},
      {"--preset tiny-deepseek --tokens 2 --seed 1 --scale-format e8m0 -o " + out, "--scale-format", "f32 | ue8m0"},
      {"--preset tiny-deepseek --tokens 2 --seed 1 --no-such-flag -o " + out, "no-such-flag", ""},
      {"--preset tiny-deepseek --tokens 2 --seed 1 -o " + dir.file("missing-dir/x.h5"), "missing-dir", ""},
  };
  for (const Bad& b : bad) {
    const CliRun r = run("make-case " + b.args);
    EXPECT_EQ(r.rc, 2) << b.args << "\n" << r.out;
    EXPECT_TRUE(contains(r.out, "moecheck: error: ")) << r.out;
    EXPECT_TRUE(contains(r.out, b.want1)) << b.args << "\n" << r.out;
    EXPECT_TRUE(contains(r.out, b.want2)) << b.args << "\n" << r.out;
    EXPECT_FALSE(std::filesystem::exists(out)) << b.args;
  }
  // Nothing but the (absent) output was ever created in the directory: no temporaries left.
  EXPECT_TRUE(std::filesystem::is_empty(dir.path()));
}

}  // namespace
}  // namespace moecheck
