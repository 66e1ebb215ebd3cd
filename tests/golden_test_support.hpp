// Helpers for the case-format tests (tests/golden_*_test.cpp): temporary directories, a small
// deterministic case written through CaseWriter, in-place HDF5 mutations that break one rule,
// and running a program (the moecheck binary, python3) as a subprocess.
#pragma once

#include <H5Cpp.h>

#include <cstdint>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include "golden/case_file.hpp"
#include "reference/counter_rng.hpp"

namespace moecheck::test {

// A fresh directory under the system temp dir, removed on destruction
// (kept when MOECHECK_KEEP_TEMP is set, for debugging).
class TempDir {
 public:
  explicit TempDir(const std::string& tag);
  ~TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::filesystem::path& path() const { return path_; }
  std::string file(const std::string& name) const { return (path_ / name).string(); }

 private:
  std::filesystem::path path_;
};

// Everything a small case holds, as given to CaseWriter (experts by slot).
struct SmallCase {
  CaseHeader header;
  std::vector<float> hidden;  // bf16-exact values
  std::vector<uint8_t> hidden_fp8;
  std::vector<float> hidden_scale;
  std::vector<float> logits, bias;
  std::vector<ExpertWeights> experts;
};

// E = 8, top_k = 2, H = 160, I = 96 (ragged: 2 x 2 blocks in w13, 2 x 1 in w2), T = 5,
// deepseek_v3 (n_group 2, topk_group 1, routed_scaling_factor 2.5) with a float32 bias,
// bf16 hidden states and the engine's FP8 activations. Every scale is a power of two, so
// the case is valid with scale_format = ue8m0 too.
SmallCase small_case();
void write_case(const std::string& path, const SmallCase& c);

// Opens path read-write and applies f (a test's rule-breaking edit).
void mutate(const std::string& path, const std::function<void(H5::H5File&)>& f);
// Edits of one object: attributes replaced with the given type, a dataset replaced or removed.
void set_attr(const H5::H5Object& o, const std::string& name, const std::string& v);
void set_attr(const H5::H5Object& o, const std::string& name, int64_t v);
void set_attr(const H5::H5Object& o, const std::string& name, double v);
void unlink(H5::H5File& f, const std::string& path);
// Replaces dataset `path` by one of `type` and shape dims, filled with `fill` (converted).
void replace_dataset(H5::H5File& f, const std::string& path, const H5::PredType& type,
                     const std::vector<hsize_t>& dims, double fill = 1.0);
// Overwrites element `index` (flat, row-major) of a float32/uint8 dataset.
void poke_float(H5::H5File& f, const std::string& path, size_t index, float value);
void poke_byte(H5::H5File& f, const std::string& path, size_t index, uint8_t value);

// A fuzz target's byte mutations, the same everywhere: `count` copies of `seed` with 1 to 4 bytes
// replaced, drawn from rng at indices *draw on (advanced), each handed to f. None for an empty seed.
void for_each_mutation(const std::vector<uint8_t>& seed, int count, const CounterRng& rng, uint64_t* draw,
                       const std::function<void(const std::vector<uint8_t>&)>& f);

struct RunResult {
  int exit_code = -1;  // when the process exited
  int signal = 0;      // when it was killed by a signal (a crash)
  std::string out, err;
};
// Runs argv[0] (a path) with its arguments, capturing stdout and stderr.
RunResult run_process(const std::vector<std::string>& argv);
// The same, sent `sig` once ready(stdout so far) holds (polled every 5 ms); `sent` says whether
// the signal went out before the process ended or timeout_s passed.
RunResult run_process_interrupted(const std::vector<std::string>& argv, int sig,
                                  const std::function<bool(const std::string& out)>& ready, bool* sent,
                                  double timeout_s = 120);

// The built moecheck binary run with these arguments.
RunResult run_moecheck(std::vector<std::string> args);

// $MOECHECK_BINARY_DIR/<name> and $MOECHECK_SOURCE_DIR/<rel>.
std::string binary(const std::string& name);
std::string source_path(const std::string& rel);

}  // namespace moecheck::test
