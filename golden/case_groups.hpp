// Writing the parts of a case that both CaseWriter and the atomic add_*_to_case functions
// write: /config, typed datasets, /outputs/<name> and /reference/<tier>. Internal to golden/.
#pragma once

#include <H5Cpp.h>

#include "golden/case_file.hpp"

namespace moecheck::groups {

// Largest chunk written (weights: one expert slab [1, rows, cols] of at most this many bytes).
inline constexpr uint64_t kChunkBytes = uint64_t(4) << 20;

// Every /config attribute, explicitly (also those at their defaults).
void write_config(const H5::Group& config, const MoeConfig& c);

// A float tensor: float32, or bfloat16 bits (RNE of the values) in uint16 with dtype = "bfloat16".
// Chunked along `axis` (rows) when it has more than one row.
void write_float_tensor(const H5::Group& g, const std::string& name, const std::vector<uint64_t>& dims,
                        std::span<const float> values, Precision storage, int deflate = 0);
void write_bf16_bits(const H5::Group& g, const std::string& name, const std::vector<uint64_t>& dims,
                     std::span<const uint16_t> bits, int deflate = 0);
void write_f64(const H5::Group& g, const std::string& name, const std::vector<uint64_t>& dims,
               std::span<const double> values);
void write_i32(const H5::Group& g, const std::string& name, const std::vector<uint64_t>& dims,
               std::span<const int32_t> values);

// /outputs/<name> and /reference/<tier> in their parent group (which must not hold `name` yet).
// Sizes are checked against (c, T): std::invalid_argument on a mismatch (a caller bug).
void write_output(const H5::Group& outputs, const std::string& name, const OutputData& o, const MoeConfig& c,
                  int64_t T);
void write_reference(const H5::Group& reference, const std::string& tier, const ReferenceData& r,
                     const MoeConfig& c, int64_t T);

// "<path>.tmp.<pid>": the temporary a file is written to before its rename.
std::string temporary_for(const std::string& path);

}  // namespace moecheck::groups
