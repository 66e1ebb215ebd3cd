// How far one array computed two ways lies apart, value by value: the figures BUDGETS.md §11
// reports for the reference's and the budget's products on another engine (the tests'
// budget_differences, `bench reference --device cuda`).
#pragma once

#include <cstdint>
#include <vector>

namespace moecheck {

struct ArrayAgreement {
  int64_t values = 0, identical = 0;  // values compared; of them, equal bit for bit
  // The largest |a - b| / max(|a|, |b|) (1 where only one side is finite; infinity where the
  // sizes differ), and where: index and both values (cpu: the first array, engine: the second).
  double largest_rel = 0;
  int64_t where = -1;
  double cpu = 0, engine = 0;
};

ArrayAgreement array_agreement(const std::vector<double>& cpu, const std::vector<double>& engine);

}  // namespace moecheck
