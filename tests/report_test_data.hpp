// Compare results for the report tests (tests/report_test.cpp, tests/report_browser_test.cpp).
//
// Hand-built ones (every field set here, so each test knows the facts the report must show):
//   passing     4 experts, everything within budget
//   failing     30 experts (global ids 100..129): 117 blamed with failing bias and energy
//               tests, 104 failing only its bias test; 2 routing mismatches and 1 near-tie
//   nonfinite   infinite ratios, a NaN energy ratio, an infinite SQNR, a token-local failure
//   many        25 of 30 experts failing (all of them must be listed)
//   big         512 tokens x 7168 columns, 256 experts (the page-size limit)
// And one computed by compare_output on a small layer with injected faults (realistic()): the
// data of the README screenshot.
#pragma once

#include <cstdint>
#include <vector>

#include "reference/moe_compare.hpp"
#include "reference/moe_config.hpp"

namespace moecheck::testing {

CompareResult passing_result();
CompareResult failing_result();
CompareResult nonfinite_result();
CompareResult many_failing_result();

struct BigCase {
  CompareResult result;
  std::vector<float> observed;  // [T, H]
};
BigCase big_result();

struct Realistic {
  MoeConfig config;
  int64_t tokens = 0;
  std::vector<CompareResult> results;         // faulty:scale_expert, faulty:nan_token, emulated
  std::vector<std::vector<float>> observed;   // their recorded outputs
  int64_t scaled_expert = -1;                 // expert whose contribution the fault scales
  int64_t nan_token = -1, mismatch_token = -1, tie_token = -1;
  double reference_seconds = 0;
};
// E=32 k=4 H=1024 I=256, 128 tokens (seed fixed); three recorded outputs, each with noise within
// 0.05 of every budget and per-slot expert outputs (so compare attributes failures per slot):
//   faulty:scale_expert  the most used expert's contribution 1.2% too large, and one token
//                        routed to a wrong expert
//   faulty:nan_token     one NaN (a token-local fault)
//   emulated             nothing else: passes
// One token is an exact routing tie that every output resolves the other way (accepted).
Realistic realistic();

}  // namespace moecheck::testing
