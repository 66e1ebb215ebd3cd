// Minimizing a failing case while it still fails (`moecheck shrink`, and the gate's automatic
// shrinking): delta debugging (Zeller and Hildebrandt, "Simplifying and Isolating
// Failure-Inducing Input", IEEE TSE 2002: ddmin) over the parts of a case that can be removed
// without changing what the rest of it means.
//
// Steps, in order, each candidate written to a temporary case and kept when check_case still
// reports a failure (CheckStatus::fail, not an input error) with the same backend:
//   tokens      ddmin over the token set (tokens are independent: a token's output depends only on
//               its own hidden row and logits);
//   experts     store only the local experts the kept tokens route to (FORMAT.md subset storage,
//               /weights/expert_ids), then narrow the EP shard's local range from either end
//               (slots of experts outside it contribute 0, as on a real shard);
//   H blocks    drop whole 128-column blocks of H: hidden columns, w13 columns and scale columns,
//               w2 rows and scale rows (routing comes from the logits, so it does not move);
//   I blocks    drop whole 128-blocks of I from both halves of w13 (rows and scale rows) and
//               from w2 (columns and scale columns), when I is a multiple of the block;
//   values      zero the hidden values of a token's 128-group (then quantized to exact zeros),
//               group by group, where that still fails.
// Then tokens and experts once more. When a recorded output is judged instead of a backend
// (--output NAME) only tokens and unrouted experts can be removed (its rows are sliced along,
// its ranks' too); every other step would change what the recording should have been. A backend
// run over ranks (CheckOptions::shard) keeps only candidates the split still fits (the others are
// declined, not failures), and its control runs over the same ranks with none at fault.
// The attempts are bounded (ShrinkOptions::max_attempts); progress goes to a callback.
#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include "tools/judge/case_check.hpp"

namespace moecheck::sweep {

struct ShrinkOptions {
  judge::CheckOptions check;  // the failure to keep: backend (or recorded output), int32 threshold
  // A backend that must pass on every kept candidate (default for faulty:<fault>: emulated), so
  // the minimal case shows the fault and not something the correct backend fails on too. Not
  // applied when it already fails on the input (ShrinkResult::control_failed_initially).
  std::string control;
  bool no_control = false;   // no control backend at all
  int max_attempts = 400;    // candidates tried at most
  bool record = true;        // record the backend's failing output in the minimal case (/outputs/<backend>)
  std::string origin;        // what the case was shrunk from, for the description (default: the input path)
  std::string work_dir;      // temporaries (default: the output's directory)
  std::function<void(const std::string&)> progress;  // one line per accepted step
};

struct ShrinkResult {
  judge::CheckOutcome initial, final;
  int attempts = 0, accepted = 0;
  int64_t tokens[2] = {0, 0}, stored[2] = {0, 0}, local[2] = {0, 0}, hidden[2] = {0, 0}, inter[2] = {0, 0};
  int64_t zeroed_groups = 0;
  std::string control;       // the control backend used ("" none)
  bool control_failed_initially = false;
  std::string replay;        // the command that replays the failure on the written case
  std::string summary() const;  // "T 24 -> 1, stored experts 16 -> 4, H 256 -> 128, I 256 -> 128"
};

// Shrinks case_path into out_path (written atomically). When the input does not fail, writes
// nothing and returns initial.status != fail. Throws InputError for an unreadable input.
ShrinkResult shrink_case(const std::string& case_path, const std::string& out_path, const ShrinkOptions& opt);

}  // namespace moecheck::sweep
