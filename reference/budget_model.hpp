// The budget models by name: which accumulator model (and float32 slack) an output is judged
// with, how a name is written on the command line and in case files (the budget_model attribute
// of /outputs/<name> and /reference/quantized), and which model a backend's outputs get when
// nothing names one. Everything the CLI, the case writers and the reports say about budget
// models comes from here; the numbers of each preset live in AccumulatorModel (moe_budget.hpp).
//
// Names:
//   fp32      AccumulatorModel::fp32()                 float32 round-to-nearest sums (CPU, CUDA cores)
//   hmma-f32  AccumulatorModel::hmma_f32()             f16 HMMA with a float32 accumulator (mma.sync e4m3 on sm_90)
//   hopper    AccumulatorModel::hopper_tensor_core()   truncating FP8 tensor cores (BUDGETS.md §2.1)
//   bits:N    N kept bits, round-to-nearest            N in [8, 53]
//   trunc:N   N kept bits, truncating                  N in [8, 53]
#pragma once

#include <map>
#include <optional>
#include <string>
#include <string_view>

#include "reference/moe_budget.hpp"

namespace moecheck {

// "fp32 | hmma-f32 | hopper | bits:N | trunc:N": the accepted names, for messages and --help.
std::string budget_model_names();

// The model a name denotes; nullopt for a name that is not one.
std::optional<BudgetModel> try_parse_budget_model(std::string_view name);
// The same, throwing InputError(file, where, "must be ...") for an unknown name.
BudgetModel parse_budget_model(const std::string& name, const std::string& file = "",
                               const std::string& where = "--budget-model");

// The name of an accumulator model: the preset's name where it is one, else bits:N / trunc:N.
std::string budget_model_name(const AccumulatorModel& acc);

// The model a backend's outputs are judged with when none is named: emulated and faulty:* ->
// fp32 (float32 round-to-nearest on the CPU); cuda, cublaslt and anything else (an engine's dump)
// -> hopper (FP8 tensor cores: both our backends run wgmma e4m3). Outputs recorded by the
// earlier mma.sync cuda kernels carry budget_model = hmma-f32 and keep it.
std::string default_budget_model(std::string_view backend);

// The model a recorded output is judged with: its budget_model attribute, else the default of
// its backend attribute (an output without either is an engine's: hopper).
std::string budget_model_of_output(const std::map<std::string, std::string>& attributes);

// One line for reports: the accumulator (AccumulatorModel::describe()) and the float32 slack counts.
std::string describe_budget_model(const BudgetModel& m);

}  // namespace moecheck
