// A Hugging Face checkpoint directory: one model.safetensors, or shards listed by
// model.safetensors.index.json ({"metadata": {...}, "weight_map": {"tensor": "shard file"}};
// tools/checkpoint/README.md). Shards are opened (memory-mapped, header fully checked) the
// first time one of their tensors is asked for, so dumping one layer touches only the shards
// that hold it.
//
// tensor() checks that the tensor exists where the index says and, through expect(), that its
// dtype and shape are what the caller needs: InputError(file, tensor name, rule) otherwise.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "tools/checkpoint/safetensors.hpp"

namespace moecheck::ckpt {

inline constexpr const char* kIndexFile = "model.safetensors.index.json";
inline constexpr const char* kSingleFile = "model.safetensors";
inline constexpr uint64_t kMaxIndexBytes = 256ull << 20;  // DeepSeek-V3's index is ~9 MB

class Checkpoint {
 public:
  explicit Checkpoint(const std::string& dir);
  ~Checkpoint();
  Checkpoint(const Checkpoint&) = delete;
  Checkpoint& operator=(const Checkpoint&) = delete;

  const std::string& dir() const { return dir_; }
  bool sharded() const { return sharded_; }
  // Where tensor names come from: the index file or the single file (for messages).
  const std::string& listing() const { return listing_; }
  bool contains(const std::string& name) const;
  // The tensor's bytes (opens its shard on first use). InputError naming the index or the file
  // when it is missing.
  TensorView tensor(const std::string& name) const;
  // tensor() plus: dtype one of `dtypes`, shape equal to `shape`.
  TensorView expect(const std::string& name, std::span<const Dtype> dtypes, const std::vector<uint64_t>& shape) const;
  void release(const TensorView& t) const;  // drop the tensor's pages from the resident set
  int64_t shards_opened() const;
  int64_t shard_count() const;

 private:
  const SafetensorsFile& shard(const std::string& file) const;
  std::string dir_, listing_;
  bool sharded_ = false;
  std::map<std::string, std::string> weight_map_;  // sharded: tensor -> shard file name
  mutable std::map<std::string, std::unique_ptr<SafetensorsFile>> shards_;
};

// Values of a tensor of dtype F32, BF16 or F16 as float32 (exact: every such value is a float).
std::vector<float> to_float32(const TensorView& t);

// Reads a small JSON file (config.json, the index) after check_json_text(): InputError naming
// the file otherwise. max_bytes bounds the file size before it is read.
std::string read_json_file(const std::string& path, uint64_t max_bytes);

}  // namespace moecheck::ckpt
