// Synthetic cases from model presets: the library behind `moecheck make-case` (golden/GENERATOR.md).
//
// Every value comes from CounterRng (Philox) at a fixed (seed, stream, index) followed by plain
// IEEE arithmetic (+ - * / sqrt, exact power-of-two scaling) compiled without FMA contraction,
// so the same options give bit-identical datasets on every machine. Indices are those of the
// FULL, unsharded layer: a TP rank's weights are exactly the corresponding rows / columns of the
// unsliced case, an EP rank's experts exactly the unsliced case's experts, and a token's inputs
// do not depend on how many tokens the case has.
//
// Use: plan_case() checks the options (InputError naming the option and the rule), draws the
// inputs, routes them (reference/moe_routing.hpp) and decides which experts to store;
// write_case() then draws and writes one expert at a time (never the whole layer in memory)
// through CaseWriter, atomically.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "golden/case_file.hpp"
#include "golden/model_presets.hpp"
#include "reference/counter_rng.hpp"
#include "reference/moe_routing.hpp"

namespace moecheck {

inline constexpr int kGeneratorVersion = 3;  // bump when any generated value changes

// realistic: outlier channels, heavy tails, zero groups, tiny / huge tokens, block scales over
//            ~3 decades plus tiny-scale blocks and dead experts (the default);
// uniform:   one plain distribution per tensor (what engines' own tests use: the baseline);
// adversarial: realistic at higher rates, plus near-ties, exact e4m3 rounding midpoints, an
//            all-zero logit row, negative and huge routing biases, scales down to ~1e-29.
enum class Distribution { realistic, uniform, adversarial };
std::string_view to_string(Distribution d);
std::optional<Distribution> parse_distribution(std::string_view s);

struct GeneratorOptions {
  std::string preset;
  int64_t tokens = 0;
  uint64_t seed = 0;
  int64_t tp = 1, tp_rank = 0;  // slices I: rank r keeps rows/columns [r*I/tp, (r+1)*I/tp)
  int64_t ep = 1, ep_rank = 0;  // local experts [r*E/ep, (r+1)*E/ep)
  Distribution dist = Distribution::realistic;
  bool near_ties = false;       // plant ties / 1-ulp near-ties at the k-th place (always on for adversarial)
  bool routed_only = false;     // store only the local experts some token routes to
  int64_t experts_limit = 0;    // > 0: store at most this many (the lowest ids) of the chosen experts (tests)
  ScaleFormat scale_format = ScaleFormat::f32;
  Precision intermediate_dtype = Precision::f32;
  Precision routing_weight_dtype = Precision::f32;
  EngineRecipe recipe;                        // /config engine-recipe attributes (FORMAT.md)
  GateUpLayout gate_up_layout = GateUpLayout::gate_up;
  Precision hidden_dtype = Precision::bf16;   // storage of /inputs/hidden_states
  Precision bias_dtype = Precision::f32;      // storage of /inputs/routing_bias (bf16: values rounded first)
};

// Everything decided before the first weight is drawn.
struct CasePlan {
  GeneratorOptions options;
  const ModelPreset* preset = nullptr;
  CaseHeader header;                  // sliced config, T, description, source, expert_ids
  int64_t full_intermediate = 0;      // I of the unsharded layer
  int64_t intermediate_offset = 0;    // first full-layer row/column of this TP rank
  std::vector<int64_t> stored;        // global ids of the experts to write, increasing
  std::vector<int64_t> dead_experts;  // global ids whose block scales are ~1e-23 (or less)
  std::vector<float> hidden;          // [T, H], already rounded to hidden_dtype
  std::vector<float> logits;          // [T, E]
  std::vector<float> bias;            // [E] or empty, already rounded to bias_dtype
  Routing routing;                    // the reference routing of the tokens (global ids)

  int64_t expert_bytes() const;       // FP8 codes + float32 scales of one stored expert
  int64_t weight_bytes() const { return expert_bytes() * int64_t(stored.size()); }
};

// The command line that regenerates the case (recorded as the root attribute `source`):
// "moecheck make-case --preset P --tokens T --seed S [non-default options] -o PATH".
std::string make_case_command(const GeneratorOptions& o, const std::string& out_path);

// Checks the options and draws the inputs. InputError("", "--tp", rule) etc. on bad options.
CasePlan plan_case(const GeneratorOptions& o, const std::string& out_path);

// The block-quantized weights of one expert (global id) of the plan's (sliced) layer.
ExpertWeights generate_expert(const CasePlan& plan, int64_t global_expert);

// Writes the plan's case to out_path atomically, expert by expert; progress(done, total, expert)
// is called after each expert.
using GeneratorProgress = std::function<void(int64_t done, int64_t total, int64_t expert)>;
void write_case(const CasePlan& plan, const std::string& out_path, const GeneratorProgress& progress = {});

// normal(first), ..., normal(first + n - 1) of rng, each equal bit for bit to CounterRng::normal,
// at half the cost (both values of a Box-Muller pair come from one Philox block and one log).
void fill_normals(const CounterRng& rng, uint64_t first, size_t n, double* out);

}  // namespace moecheck
