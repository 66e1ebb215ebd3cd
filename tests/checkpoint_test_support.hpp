// Tiny Hugging Face FP8 checkpoints for the `moecheck dump` tests (tests/checkpoint.cmake):
// real tensor names and dtype strings of each model family (DeepSeek-V3, Kimi-K2, GLM-4.5,
// Qwen3-MoE), a dense first layer, shared experts where the family has them, config.json, and
// optionally sharded through model.safetensors.index.json. The safetensors writer here is
// independent of tools/checkpoint (it builds the header with nlohmann::json and lays the data
// out itself) so the reader is tested against a second implementation of the format.
//
// Every value is a pure function of (spec, tensor, index) (CounterRng), so a test recomputes the
// bytes it expects in the case without reading the checkpoint back.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace moecheck::testing::ckpt {

enum class Layout { deepseek_v3, kimi_k2, glm4_moe, qwen3_moe };
const char* layout_name(Layout l);

struct TinySpec {
  Layout layout = Layout::deepseek_v3;
  int64_t E = 8, H = 256, I = 256, top_k = 2, layers = 2, first_dense = 1;
  bool sharded = false;
  bool ue8m0 = false;
  bool reverse_data_order = false;  // lay the data out in reverse name order (readers must not assume order)
  std::string gate_dtype = "BF16";  // mlp.gate.weight
  uint64_t seed = 1;
};

// One tensor to write: raw little-endian bytes.
struct StTensor {
  std::string name, dtype;
  std::vector<uint64_t> shape;
  std::vector<uint8_t> data;
};

// proj: 0 gate_proj, 1 up_proj, 2 down_proj (shape [I, H], [I, H], [H, I]).
uint8_t expert_code(const TinySpec& s, int64_t layer, int64_t expert, int proj, uint64_t index);
float expert_scale(const TinySpec& s, int64_t layer, int64_t expert, int proj, uint64_t block_index);

std::vector<StTensor> tiny_tensors(const TinySpec& s);
nlohmann::json tiny_config(const TinySpec& s);

// A safetensors file from tensors; edit (optional) may change the header JSON before it is
// serialized (hostile files), data_edit the final bytes.
using HeaderEdit = std::function<void(nlohmann::json&)>;
std::vector<uint8_t> safetensors_bytes(const std::vector<StTensor>& tensors, bool reverse_order = false,
                                       const HeaderEdit& edit = {});
// A file from a raw header text and data bytes: [u64 len][header][data].
std::vector<uint8_t> raw_safetensors(const std::string& header, const std::vector<uint8_t>& data);
void write_bytes(const std::string& path, const std::vector<uint8_t>& bytes);

// config.json + model.safetensors, or config.json + 3 shards + model.safetensors.index.json.
// tensors_edit (optional) may change the tensor list first, shard_edit the header of each shard.
void write_tiny_checkpoint(const std::string& dir, const TinySpec& s,
                           const std::function<void(std::vector<StTensor>&)>& tensors_edit = {},
                           const HeaderEdit& header_edit = {});

// The shard file (name inside dir) holding `tensor` in a checkpoint written by write_tiny_checkpoint.
std::string shard_of(const std::string& dir, const std::string& tensor);

// .npy files: float32 ('<f4') or bfloat16 bits ('<u2').
void write_npy_f32(const std::string& path, int64_t rows, int64_t cols, const std::vector<float>& v);
void write_npy_u16(const std::string& path, int64_t rows, int64_t cols, const std::vector<uint16_t>& v);

}  // namespace moecheck::testing::ckpt
