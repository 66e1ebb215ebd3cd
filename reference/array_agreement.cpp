#include "reference/array_agreement.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>

namespace moecheck {

ArrayAgreement array_agreement(const std::vector<double>& cpu, const std::vector<double>& engine) {
  ArrayAgreement d;
  if (cpu.size() != engine.size()) {
    d.values = int64_t(std::max(cpu.size(), engine.size()));
    d.largest_rel = INFINITY;
    return d;
  }
  d.values = int64_t(cpu.size());
  for (size_t i = 0; i < cpu.size(); ++i) {
    const double a = cpu[i], b = engine[i];
    if (std::memcmp(&a, &b, sizeof(double)) == 0) {
      ++d.identical;
      continue;
    }
    const double m = std::max(std::fabs(a), std::fabs(b));
    const double rel = std::isfinite(a) != std::isfinite(b) ? 1.0 : m > 0 ? std::fabs(a - b) / m : 0.0;
    if (!(rel <= d.largest_rel)) d.largest_rel = rel, d.where = int64_t(i), d.cpu = a, d.engine = b;
  }
  return d;
}

}  // namespace moecheck
