// Budget models by name (contract: budget_model.hpp).
#include "reference/budget_model.hpp"

#include <charconv>
#include <fmt/format.h>

#include "reference/errors.hpp"

namespace moecheck {

namespace {
constexpr int kMinBits = 8, kMaxBits = 53;  // below 8 the budget exceeds any output; 53 = double
}  // namespace

std::string budget_model_names() { return "fp32 | hmma-f32 | hopper | bits:N | trunc:N"; }

std::optional<BudgetModel> try_parse_budget_model(std::string_view s) {
  BudgetModel m;
  if (s == "fp32") {
    m.acc = AccumulatorModel::fp32();
    return m;
  }
  if (s == "hmma-f32") {
    m.acc = AccumulatorModel::hmma_f32();
    return m;
  }
  if (s == "hopper") {
    m.acc = AccumulatorModel::hopper_tensor_core();
    return m;
  }
  for (const std::string_view prefix : {"bits:", "trunc:"}) {
    if (!s.starts_with(prefix)) continue;
    const std::string_view digits = s.substr(prefix.size());
    int n = 0;
    const auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), n);
    if (ec != std::errc() || end != digits.data() + digits.size() || n < kMinBits || n > kMaxBits)
      return std::nullopt;
    m.acc.kept_bits = n;
    m.acc.truncating = prefix == "trunc:";
    return m;
  }
  return std::nullopt;
}

BudgetModel parse_budget_model(const std::string& name, const std::string& file, const std::string& where) {
  if (auto m = try_parse_budget_model(name)) return *m;
  throw InputError(file, where,
                   fmt::format("must be {} (N in [{}, {}]), got '{}'", budget_model_names(), kMinBits, kMaxBits, name));
}

std::string budget_model_name(const AccumulatorModel& acc) {
  if (acc == AccumulatorModel::fp32()) return "fp32";
  if (acc == AccumulatorModel::hopper_tensor_core()) return "hopper";
  if (acc == AccumulatorModel::hmma_f32()) return "hmma-f32";
  return fmt::format("{}:{}", acc.truncating ? "trunc" : "bits", acc.kept_bits);
}

std::string default_budget_model(std::string_view backend) {
  // The emulated backends judge by their block sums: float32, or the measured Hopper wgmma ("@hopper");
  // cuda and cublaslt run wgmma.
  if (backend.starts_with("emulated") || backend.starts_with("faulty:"))
    return backend.ends_with("@hopper") ? "hopper" : "fp32";
  return "hopper";
}

std::string budget_model_of_output(const std::map<std::string, std::string>& attributes) {
  if (const auto it = attributes.find("budget_model"); it != attributes.end()) return it->second;
  const auto be = attributes.find("backend");
  return default_budget_model(be != attributes.end() ? std::string_view(be->second) : std::string_view());
}

std::string describe_budget_model(const BudgetModel& m) {
  return fmt::format("accumulator {}; float32 slack (ulps of 2^-24): scale {}, divide {}, silu {}, routing {}",
                     m.acc.describe(), m.scale_ulps, m.divide_ulps, m.silu_ulps, m.routing_ulps);
}

}  // namespace moecheck
