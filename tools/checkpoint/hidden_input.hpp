// Hidden states a user captured, for `moecheck dump --hidden-states FILE`: a [T, H] matrix of
// float32 or bfloat16, in a .npy file or an HDF5 file (told apart by their signatures).
//
//   .npy (NumPy format versions 1.0, 2.0, 3.0; our own strict parser of the header dict):
//     descr '<f4' float32, or '<u2' bfloat16 bits (torch: t.view(torch.int16).numpy().view(np.uint16),
//     as in golden/FORMAT.md); fortran_order False; shape (T, H); the data fills the file exactly.
//     ml_dtypes' bfloat16 saved by numpy is '<V2' (opaque) and refused with that hint.
//   HDF5: the dataset `dataset` (default "hidden_states"; a moecheck case's "/inputs/hidden_states"
//     works too), rank 2, float32, or uint16 with attribute dtype = "bfloat16" (FORMAT.md's encoding).
// Problems are InputError(file, where, rule).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "reference/moe_config.hpp"

namespace moecheck::ckpt {

struct HiddenStates {
  int64_t tokens = 0, hidden = 0;
  Precision dtype = Precision::f32;  // what the file stores (bf16 values are exact in float)
  std::vector<float> values;         // [T, H]
};

HiddenStates read_hidden_states_file(const std::string& path, const std::string& dataset = "hidden_states");
// The .npy parser on bytes (tests; `file` names the file in messages).
HiddenStates parse_npy(const std::vector<uint8_t>& bytes, const std::string& file);

}  // namespace moecheck::ckpt
