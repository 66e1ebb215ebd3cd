// Hostile, truncated and malformed files through the real CLI: `moecheck inspect FILE` (and, for
// the h5py-written ones, run, reference, compare, repro, shrink and gate's golden corpus) runs as
// a subprocess and must exit with code 2
// (never by a signal, never 0 or 1) with a message on stderr naming the file and the offending
// dataset or attribute. Files come from
// tests/h5py/write_hostile.py (its manifest says what each must name) and from byte-level damage
// done here: truncated copies of the committed sample case, random bytes, empty and text files.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "tests/golden_test_support.hpp"

#ifndef MOECHECK_PYTHON3
#define MOECHECK_PYTHON3 "/usr/bin/python3"
#endif

namespace moecheck {
namespace {

std::string read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << bytes;
}

// Runs inspect (text and --json) on path; expects exit 2 and a message naming file and where.
void expect_input_error(const std::string& path, const std::string& where) {
  for (const bool json : {false, true}) {
    std::vector<std::string> argv = {test::binary("moecheck"), "inspect", path};
    if (json) argv.push_back("--json");
    const test::RunResult r = test::run_process(argv);
    SCOPED_TRACE(path + (json ? " --json" : "") + "\nstderr: " + r.err);
    ASSERT_EQ(r.signal, 0) << "killed by signal " << r.signal;
    EXPECT_EQ(r.exit_code, 2);
    EXPECT_NE(r.err.find("moecheck: error: " + path), std::string::npos);
    if (!where.empty()) {
      EXPECT_NE(r.err.find(": " + where + ": "), std::string::npos) << "expected " << where;
    }
  }
}

TEST(HostileFiles, WrittenWithH5py) {
  test::TempDir dir("hostile");
  const auto probe = test::run_process({MOECHECK_PYTHON3, "-c", "import h5py, numpy"});
  ASSERT_EQ(probe.exit_code, 0) << MOECHECK_PYTHON3 << " cannot import h5py/numpy: install python3-h5py and "
                                << "python3-numpy (tools/install-deps.sh)\n" << probe.err;
  const auto gen = test::run_process({MOECHECK_PYTHON3, test::source_path("tests/h5py/write_hostile.py"), dir.path().string()});
  ASSERT_EQ(gen.exit_code, 0) << gen.err;
  std::istringstream manifest(read_bytes(dir.file("manifest.tsv")));
  std::string line;
  int count = 0;
  while (std::getline(manifest, line)) {
    const size_t tab = line.find('\t');
    ASSERT_NE(tab, std::string::npos) << line;
    const std::string file = dir.file(line.substr(0, tab)), where = line.substr(tab + 1);
    ++count;
    if (where == "-") {  // the undamaged base case: valid
      const test::RunResult r = test::run_process({test::binary("moecheck"), "inspect", file});
      EXPECT_EQ(r.exit_code, 0) << r.err;
      continue;
    }
    expect_input_error(file, where);
    // Every command that uses a case applies the same rules first (golden/case_problem.hpp):
    // never a backend run on, or a verdict about, invalid data.
    // gate reads files from its golden corpus directory: one holding only this file.
    const std::string corpus = dir.file("corpus-" + std::to_string(count));
    std::filesystem::create_directories(corpus);
    std::filesystem::copy_file(file, corpus + "/case.h5");
    for (const std::vector<std::string>& cmd :
         {std::vector<std::string>{"run", file, "--backend", "emulated", "-o", dir.file("out.h5")},
          std::vector<std::string>{"reference", file, "-o", dir.file("out.h5")},
          std::vector<std::string>{"compare", file},
          std::vector<std::string>{"repro", file, "--backend", "emulated"},
          std::vector<std::string>{"shrink", file, "--backend", "emulated", "-o", dir.file("min.h5")},
          std::vector<std::string>{"gate", "--backend", "emulated", "--golden", corpus, "--cases", "1", "-q"}}) {
      std::vector<std::string> argv = {test::binary("moecheck")};
      argv.insert(argv.end(), cmd.begin(), cmd.end());
      const test::RunResult r = test::run_process(argv);
      SCOPED_TRACE(cmd[0] + " " + file + "\nstderr: " + r.err);
      ASSERT_EQ(r.signal, 0);
      EXPECT_EQ(r.exit_code, 2);
      const std::string named = cmd[0] == "gate" ? corpus + "/case.h5" : file, said = r.err + r.out;
      EXPECT_NE(said.find(named + ": "), std::string::npos) << "expected " << named;
      EXPECT_NE(said.find(": " + where + ": "), std::string::npos) << "expected " << where;
      EXPECT_FALSE(std::filesystem::exists(dir.file("out.h5")) || std::filesystem::exists(dir.file("min.h5")))
          << "an output was written from invalid input";
    }
  }
  EXPECT_GE(count, 40);
}

TEST(HostileFiles, TruncatedCopiesOfTheSample) {
  test::TempDir dir("truncated");
  const std::string sample = read_bytes(test::source_path("golden/cases/sample.h5"));
  ASSERT_GT(sample.size(), 100000u);
  const size_t n = sample.size();
  for (size_t len : {size_t(0), size_t(7), size_t(8), size_t(100), size_t(512), size_t(2048), size_t(4096), n / 10,
                     n / 3, n / 2, n - 4096, n - 1}) {
    const std::string path = dir.file("truncated_" + std::to_string(len) + ".h5");
    write_bytes(path, sample.substr(0, len));
    expect_input_error(path, "");
  }
}

TEST(HostileFiles, DamagedBytesOfTheSample) {
  // The HDF5 signature intact, metadata overwritten: the library must fail cleanly.
  test::TempDir dir("damaged");
  const std::string sample = read_bytes(test::source_path("golden/cases/sample.h5"));
  uint64_t state = 12345;  // fixed LCG (Knuth MMIX constants): the same damage everywhere
  for (size_t start : {size_t(8), size_t(48), size_t(96), size_t(800), size_t(2000)}) {
    std::string bytes = sample;
    for (size_t i = start; i < start + 64 && i < bytes.size(); ++i) {
      state = state * 6364136223846793005ull + 1442695040888963407ull;
      bytes[i] = char(state >> 56);
    }
    const std::string path = dir.file("damaged_" + std::to_string(start) + ".h5");
    write_bytes(path, bytes);
    const test::RunResult r = test::run_process({test::binary("moecheck"), "inspect", path});
    EXPECT_EQ(r.signal, 0) << path;
    // Damage may hit bytes HDF5 never reads (then the case is still valid); never a crash, and
    // anything else must be an input error naming the file.
    if (r.exit_code != 0) {
      EXPECT_EQ(r.exit_code, 2) << path << "\n" << r.err;
      EXPECT_NE(r.err.find(path), std::string::npos) << r.err;
    }
  }
}

TEST(HostileFiles, NotHdf5AtAll) {
  test::TempDir dir("nothdf5");
  std::string random(4096, '\0');
  uint64_t state = 777;
  for (char& c : random) {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    c = char(state >> 56);
  }
  write_bytes(dir.file("random.h5"), random);
  write_bytes(dir.file("empty.h5"), "");
  write_bytes(dir.file("text.h5"), "format = moecheck.case\nformat_version = 1\n");
  write_bytes(dir.file("hdf5_signature_only.h5"), std::string("\x89HDF\r\n\x1a\n", 8));
  for (const char* name : {"random.h5", "empty.h5", "text.h5", "hdf5_signature_only.h5"}) {
    expect_input_error(dir.file(name), "");
    const test::RunResult r = test::run_process({test::binary("moecheck"), "inspect", dir.file(name)});
    EXPECT_NE(r.err.find("not a readable HDF5 file"), std::string::npos) << r.err;
  }
  expect_input_error(dir.file("missing.h5"), "");
  EXPECT_NE(test::run_process({test::binary("moecheck"), "inspect", dir.file("missing.h5")}).err.find("no such file"),
            std::string::npos);
  expect_input_error(dir.path().string(), "");  // a directory
}

}  // namespace
}  // namespace moecheck
