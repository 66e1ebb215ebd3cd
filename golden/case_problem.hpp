// A case file as the reference and the CPU backends see it: its inputs loaded into memory (they
// are small: T x H and T x E), its experts loaded one at a time through the reader on demand, and
// the hash of everything the reference reads (so a stored reference can be recognised as stale).
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "golden/case_file.hpp"
#include "reference/moe_forward.hpp"

namespace moecheck {

class CaseProblem {
 public:
  // Opens the case and applies every rule `moecheck inspect` applies (CaseReader::validate: finite
  // inputs, finite positive scales, no NaN-coded weights, ...) before anything uses it: a case
  // that breaks one throws InputError(path, where, rule) for the first, so no command runs a
  // backend on, or judges an output against, invalid data. Reads the data once more for that.
  explicit CaseProblem(const std::string& path);

  const CaseReader& reader() const { return *reader_; }
  const MoeConfig& config() const { return reader_->config(); }
  int64_t tokens() const { return reader_->tokens(); }
  // The problem the forward and the backends take; experts are read from the file when asked for.
  const MoeProblem& problem() const { return problem_; }

  // 64-bit hash (hex) of the config and of every byte the reference reads: hidden states (and
  // the engine's FP8 activations), router logits, bias, and every stored expert's weights and
  // scales in expert-id order. Reads the weights once, expert by expert.
  std::string input_hash() const;
  // The same pass, also per part: the combined hash above, and one per input the reference reads
  // ("/config", "/inputs/hidden_states" (with the engine's FP8 activations), "/inputs/router_logits",
  // "/inputs/routing_bias", "/weights"), so a changed input can be named.
  struct InputHashes {
    std::string combined;
    std::map<std::string, std::string> parts;
  };
  InputHashes input_hashes() const;

 private:
  std::unique_ptr<CaseReader> reader_;
  std::vector<float> hidden_, logits_, bias_;
  HiddenFp8 fp8_;
  MoeProblem problem_;
};

}  // namespace moecheck
