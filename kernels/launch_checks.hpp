// Argument checks shared by the stage launchers (kernels/*.cu): each throws
// std::invalid_argument naming the stage and the rule, before anything is launched.
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>

namespace moecheck::kernels {

// fl32(eps / 448), the scale an all-small group gets; the reference's eps rule (scales finite
// and > 0). fl32(fl64(eps / 448)) is the once-rounded quotient (reference/fp8_quant.cpp).
inline float eps_scale_or_throw(double eps, const char* who) {
  const float s = static_cast<float>(eps / 448.0);
  if (!(eps > 0.0) || !(eps < 1e30) || s == 0.0f)
    throw std::invalid_argument(std::string(who) + ": eps must be finite and >= 448 * 2^-149, got " +
                                std::to_string(eps));
  return s;
}

inline void require_ptr(const void* p, const char* who, const char* name, unsigned align = 1) {
  if (p == nullptr) throw std::invalid_argument(std::string(who) + ": " + name + " is a null pointer");
  if (reinterpret_cast<uintptr_t>(p) % align != 0)
    throw std::invalid_argument(std::string(who) + ": " + name + " must be " + std::to_string(align) +
                                "-byte aligned");
}

inline void require(bool ok, const char* who, const std::string& rule) {
  if (!ok) throw std::invalid_argument(std::string(who) + ": " + rule);
}

// A grid dimension x must stay below 2^31.
inline unsigned grid_x(int64_t blocks, const char* who) {
  require(blocks >= 0 && blocks <= 0x7FFFFFFF, who, "problem too large for one launch");
  return static_cast<unsigned>(blocks);
}

}  // namespace moecheck::kernels
