// Our own reader of the safetensors format (huggingface/safetensors README "Format" and its
// reader safetensors/src/tensor.rs): an 8-byte little-endian header length N, N bytes of a
// UTF-8 JSON header, then the data region. tools/checkpoint/README.md lists every rule checked.
//
// parse_safetensors() checks the whole structure on a byte buffer (the fuzz target calls it on
// arbitrary bytes): header length within the file and under 100,000,000 bytes, valid UTF-8, a
// JSON object nested at most kMaxJsonDepth deep with no duplicate keys, every tensor with a known
// dtype, a shape whose byte count does not overflow 64 bits and equals end - begin, offsets
// inside the data region, and the tensors covering the data region exactly (sorted by offset:
// each begins where the previous ended, the first at 0, the last at the end of the file; holes
// are refused like overlaps, as the reference reader does). Data bytes are never read here.
// Every violation is InputError(file, where, rule), where = "header length", "header", a tensor
// name, or "__metadata__".
//
// SafetensorsFile memory-maps a file read-only and parses it; tensor bytes are spans into the
// mapping, so only the pages of the tensors actually used are read from disk, and release()
// drops them from this process's resident set again.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "reference/errors.hpp"

namespace moecheck::ckpt {

inline constexpr uint64_t kMaxHeaderBytes = 100'000'000;  // MAX_HEADER_SIZE of the reference reader
inline constexpr int kMaxJsonDepth = 16;                  // a valid header nests 3 deep
inline constexpr size_t kMaxRank = 64;                    // dimensions per tensor

// The dtype strings of the format (safetensors/src/tensor.rs `Dtype`). F8_E4M3 is torch's
// float8_e4m3fn; F4 and F6_* are sub-byte types (4 and 6 bits per element).
enum class Dtype {
  BOOL, F4, F6_E2M3, F6_E3M2, U8, I8, F8_E5M2, F8_E4M3, F8_E8M0, F8_E4M3FNUZ, F8_E5M2FNUZ,
  I16, U16, F16, BF16, I32, U32, F32, C64, F64, I64, U64,
};
std::optional<Dtype> parse_dtype(std::string_view s);
std::string_view to_string(Dtype d);
int dtype_bits(Dtype d);  // bits per element
std::string dtype_names();  // "BOOL, F4, ..." for messages

struct TensorInfo {
  std::string name;
  Dtype dtype = Dtype::U8;
  std::vector<uint64_t> shape;
  uint64_t elements = 0;     // product of shape (1 for rank 0)
  uint64_t begin = 0, end = 0;  // data_offsets, relative to the data region; end is one past
  uint64_t bytes() const { return end - begin; }
};

struct SafetensorsHeader {
  uint64_t header_bytes = 0;  // N
  uint64_t data_start = 0;    // 8 + N: file offset of the data region
  uint64_t data_bytes = 0;    // size of the data region
  std::map<std::string, std::string> metadata;  // __metadata__ (string -> string)
  std::map<std::string, TensorInfo> tensors;
  const TensorInfo* find(const std::string& name) const;
};

// Checks and parses a whole file given as bytes (see the top of this file for the rules).
// `file` only names the file in messages.
SafetensorsHeader parse_safetensors(std::span<const uint8_t> file_bytes, const std::string& file);

// Structural pre-check of a JSON text shared by every JSON file of a checkpoint (header,
// config.json, model.safetensors.index.json): valid UTF-8, nesting at most max_depth, no
// duplicate key in any object, syntactically valid. InputError(file, where, rule) otherwise.
void check_json_text(std::string_view text, const std::string& file, const std::string& where, int max_depth);

// "[2048, 7168]"
std::string shape_text(const std::vector<uint64_t>& shape);

// A read-only memory mapping of a whole regular file (empty files map to an empty span).
class MappedFile {
 public:
  explicit MappedFile(const std::string& path);  // InputError: no such file, not regular, unreadable
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;
  std::span<const uint8_t> bytes() const { return {data_, size_}; }
  const std::string& path() const { return path_; }
  // Drops the pages of [offset, offset + length) from the resident set (they are re-read from
  // the file if touched again). A hint: never fails.
  void release(uint64_t offset, uint64_t length) const;

 private:
  std::string path_;
  const uint8_t* data_ = nullptr;
  size_t size_ = 0;
};

// One tensor's bytes inside its file's mapping.
struct TensorView {
  const std::string* file = nullptr;  // the shard's path
  const TensorInfo* info = nullptr;
  std::span<const uint8_t> data;
};

class SafetensorsFile {
 public:
  explicit SafetensorsFile(const std::string& path);
  const std::string& path() const { return map_.path(); }
  const SafetensorsHeader& header() const { return header_; }
  std::optional<TensorView> find(const std::string& name) const;
  void release(const TensorView& t) const;

 private:
  MappedFile map_;
  SafetensorsHeader header_;
};

}  // namespace moecheck::ckpt
