// Checkpoint directories (checkpoint.hpp): the single-file and sharded layouts, lazy shards,
// dtype/shape expectations, and float32 decoding of router tensors.
#include "tools/checkpoint/checkpoint.hpp"

#include <bit>
#include <cstring>
#include <filesystem>
#include <set>
#include <fstream>
#include <sstream>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "reference/fp8_formats.hpp"

namespace moecheck::ckpt {

namespace fs = std::filesystem;

namespace {

// A shard name from the index must name a file inside the checkpoint directory.
bool plain_file_name(const std::string& s) {
  return !s.empty() && s.find('/') == std::string::npos && s.find('\\') == std::string::npos && s != "." &&
         s != ".." && s.find('\0') == std::string::npos;
}

float f16_to_float(uint16_t h) {
  // IEEE binary16 -> binary32, exact (subnormals, infinities and NaN included).
  const uint32_t sign = uint32_t(h >> 15) << 31;
  const uint32_t exp = (h >> 10) & 0x1F, mant = h & 0x3FF;
  uint32_t bits;
  if (exp == 0x1F) {
    bits = sign | 0x7F800000u | (mant << 13);
  } else if (exp != 0) {
    bits = sign | ((exp + 112) << 23) | (mant << 13);
  } else {
    // 0 or subnormal: mant * 2^-24, exact in float.
    const float v = static_cast<float>(mant) * 0x1p-24f;
    return sign ? -v : v;
  }
  return std::bit_cast<float>(bits);
}

}  // namespace

std::string read_json_file(const std::string& path, uint64_t max_bytes) {
  std::error_code ec;
  if (!fs::exists(path, ec)) throw InputError(path, "", "no such file");
  if (!fs::is_regular_file(path, ec)) throw InputError(path, "", "not a regular file");
  const uint64_t size = fs::file_size(path, ec);
  if (ec) throw InputError(path, "", "cannot read its size: " + ec.message());
  if (size > max_bytes) throw InputError(path, "", fmt::format("file of {} bytes exceeds the {}-byte limit", size, max_bytes));
  std::ifstream in(path, std::ios::binary);
  if (!in) throw InputError(path, "", "cannot open for reading");
  std::string text(size, '\0');
  if (size && !in.read(text.data(), std::streamsize(size))) throw InputError(path, "", "read error");
  check_json_text(text, path, "", 64);
  return text;
}

Checkpoint::Checkpoint(const std::string& dir) : dir_(dir) {
  std::error_code ec;
  if (!fs::exists(dir, ec)) throw InputError(dir, "", "no such checkpoint directory");
  if (!fs::is_directory(dir, ec)) throw InputError(dir, "", "not a directory (--checkpoint takes the checkpoint directory)");
  const std::string index = (fs::path(dir) / kIndexFile).string();
  const std::string single = (fs::path(dir) / kSingleFile).string();
  if (fs::exists(index, ec)) {
    sharded_ = true;
    listing_ = index;
    const nlohmann::json j = nlohmann::json::parse(read_json_file(index, kMaxIndexBytes));
    if (!j.is_object()) throw InputError(index, "", "must be a JSON object with a \"weight_map\"");
    if (!j.contains("weight_map")) throw InputError(index, "weight_map", "missing (the index maps each tensor to its shard)");
    const auto& wm = j["weight_map"];
    if (!wm.is_object()) throw InputError(index, "weight_map", std::string("must be an object, got a ") + wm.type_name());
    for (const auto& [name, file] : wm.items()) {
      if (!file.is_string())
        throw InputError(index, "weight_map", fmt::format("entry \"{}\" must be a shard file name (string), got a {}", name, file.type_name()));
      const std::string f = file.get<std::string>();
      if (!plain_file_name(f))
        throw InputError(index, "weight_map",
                         fmt::format("entry \"{}\": shard \"{}\" is not a plain file name in the checkpoint directory", name, f));
      weight_map_[name] = f;
    }
    if (j.contains("metadata") && !j["metadata"].is_object())
      throw InputError(index, "metadata", std::string("must be an object, got a ") + j["metadata"].type_name());
  } else if (fs::exists(single, ec)) {
    listing_ = single;
    shard(kSingleFile);  // the single file is opened (and checked) right away
  } else {
    throw InputError(dir, "", fmt::format("neither {} nor {} is there: not a Hugging Face safetensors checkpoint", kIndexFile,
                                          kSingleFile));
  }
}

Checkpoint::~Checkpoint() = default;

const SafetensorsFile& Checkpoint::shard(const std::string& file) const {
  auto it = shards_.find(file);
  if (it == shards_.end())
    it = shards_.emplace(file, std::make_unique<SafetensorsFile>((fs::path(dir_) / file).string())).first;
  return *it->second;
}

bool Checkpoint::contains(const std::string& name) const {
  if (sharded_) return weight_map_.count(name) != 0;
  return shard(kSingleFile).header().find(name) != nullptr;
}

TensorView Checkpoint::tensor(const std::string& name) const {
  if (sharded_) {
    const auto it = weight_map_.find(name);
    if (it == weight_map_.end()) throw InputError(listing_, name, "missing tensor (not in the index's weight_map)");
    const SafetensorsFile& f = shard(it->second);
    const auto t = f.find(name);
    if (!t) throw InputError(f.path(), name, fmt::format("missing tensor (the index {} puts it in this shard)", kIndexFile));
    return *t;
  }
  const auto t = shard(kSingleFile).find(name);
  if (!t) throw InputError(listing_, name, "missing tensor");
  return *t;
}

TensorView Checkpoint::expect(const std::string& name, std::span<const Dtype> dtypes, const std::vector<uint64_t>& shape) const {
  const TensorView t = tensor(name);
  bool ok = false;
  std::string names;
  for (const Dtype d : dtypes) {
    ok = ok || t.info->dtype == d;
    names += (names.empty() ? "" : " or ") + std::string(to_string(d));
  }
  if (!ok) throw InputError(*t.file, name, fmt::format("dtype must be {}, got {}", names, to_string(t.info->dtype)));
  if (t.info->shape != shape)
    throw InputError(*t.file, name, fmt::format("shape must be {}, got {}", shape_text(shape), shape_text(t.info->shape)));
  return t;
}

void Checkpoint::release(const TensorView& t) const {
  for (const auto& [f, s] : shards_)
    if (&s->path() == t.file) s->release(t);
}

int64_t Checkpoint::shards_opened() const { return static_cast<int64_t>(shards_.size()); }

int64_t Checkpoint::shard_count() const {
  if (!sharded_) return 1;
  std::set<std::string> files;
  for (const auto& [n, f] : weight_map_) files.insert(f);
  return static_cast<int64_t>(files.size());
}

std::vector<float> to_float32(const TensorView& t) {
  const uint64_t n = t.info->elements;
  std::vector<float> out(n);
  const uint8_t* p = t.data.data();
  switch (t.info->dtype) {
    case Dtype::F32:
      std::memcpy(out.data(), p, n * 4);  // the data may be unaligned: copy, never cast the pointer
      break;
    case Dtype::BF16:
      for (uint64_t i = 0; i < n; ++i) out[i] = bf16_decode(uint16_t(p[2 * i] | (p[2 * i + 1] << 8)));
      break;
    case Dtype::F16:
      for (uint64_t i = 0; i < n; ++i) out[i] = f16_to_float(uint16_t(p[2 * i] | (p[2 * i + 1] << 8)));
      break;
    default:
      throw InputError(*t.file, t.info->name, fmt::format("dtype must be F32, BF16 or F16, got {}", to_string(t.info->dtype)));
  }
  return out;
}

}  // namespace moecheck::ckpt
