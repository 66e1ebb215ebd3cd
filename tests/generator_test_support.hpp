// Shared pieces of the generator tests (case_generator_test.cpp, make_case_cli_test.cpp):
// a scratch directory, reading a whole (small) case back with CaseReader, and bitwise
// comparison of what two cases store.
#pragma once

#include <gtest/gtest.h>

#include <bit>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include <unistd.h>

#include "golden/case_file.hpp"

namespace moecheck::testing {

// A per-process directory under the build tree (or /tmp), removed by the destructor.
class ScratchDir {
 public:
  explicit ScratchDir(const std::string& name) {
    const char* bin = std::getenv("MOECHECK_BINARY_DIR");
    const std::filesystem::path base = bin ? std::filesystem::path(bin) / "test-scratch" : std::filesystem::temp_directory_path();
    dir_ = base / (name + "-" + std::to_string(::getpid()));
    std::filesystem::create_directories(dir_);
  }
  ~ScratchDir() {
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }
  std::string file(const std::string& name) const { return (dir_ / name).string(); }
  const std::filesystem::path& path() const { return dir_; }

 private:
  std::filesystem::path dir_;
};

// Everything a generated case stores (no outputs or references), read back through CaseReader.
struct CaseData {
  MoeConfig config;
  int64_t tokens = 0;
  std::string source, description;
  std::vector<float> hidden, logits;
  std::optional<std::vector<float>> bias;
  std::vector<int64_t> expert_ids;
  std::vector<ExpertWeights> experts;  // in slot order
};

inline CaseData read_case(const std::string& path) {
  const CaseReader r(path);
  CaseData d;
  d.config = r.config();
  d.tokens = r.tokens();
  d.source = r.source().value_or("");
  d.description = r.description().value_or("");
  d.hidden = r.read_hidden_states();
  d.logits = r.read_router_logits();
  d.bias = r.read_routing_bias();
  d.expert_ids = r.expert_ids();
  for (int64_t s = 0; s < r.stored_experts(); ++s) d.experts.push_back(r.read_expert_slot(s));
  return d;
}

// Bit equality of float vectors (so that -0 != +0 and NaN payloads count).
inline bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
}

inline bool same_expert(const ExpertWeights& a, const ExpertWeights& b) {
  return a.w13 == b.w13 && a.w2 == b.w2 && same_bits(a.w13_scale, b.w13_scale) && same_bits(a.w2_scale, b.w2_scale);
}

// The datasets of two cases are bit-identical (attributes such as `source` may differ).
inline void expect_same_data(const CaseData& a, const CaseData& b) {
  EXPECT_EQ(a.tokens, b.tokens);
  EXPECT_TRUE(same_bits(a.hidden, b.hidden)) << "hidden_states differ";
  EXPECT_TRUE(same_bits(a.logits, b.logits)) << "router_logits differ";
  ASSERT_EQ(a.bias.has_value(), b.bias.has_value());
  if (a.bias) {
    EXPECT_TRUE(same_bits(*a.bias, *b.bias)) << "routing_bias differs";
  }
  ASSERT_EQ(a.expert_ids, b.expert_ids);
  ASSERT_EQ(a.experts.size(), b.experts.size());
  for (size_t i = 0; i < a.experts.size(); ++i)
    EXPECT_TRUE(same_expert(a.experts[i], b.experts[i])) << "expert slot " << i << " (id " << a.expert_ids[i] << ") differs";
}

}  // namespace moecheck::testing
