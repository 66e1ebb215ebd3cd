// Delta debugging of failing cases (case_shrink.hpp).
#include "tools/sweep/case_shrink.hpp"

#include <algorithm>
#include <filesystem>
#include <fmt/format.h>
#include <set>
#include <unistd.h>

#include "golden/case_file.hpp"
#include "golden/interrupt.hpp"
#include "reference/moe_routing.hpp"
#include "tools/judge/backend_run.hpp"
#include "tools/judge/exec_backend.hpp"

namespace moecheck::sweep {

namespace {

// A case held in memory, everything CaseWriter needs to write it again.
struct CaseData {
  CaseHeader header;
  std::vector<float> hidden, logits, bias;
  HiddenFp8 fp8;
  std::vector<ExpertWeights> experts;  // by slot; experts[s].expert = global id
  std::string output_name;             // the recorded output judged (--output mode), else ""
  OutputData output;
  int64_t T() const { return header.tokens; }
  const MoeConfig& config() const { return header.config; }
};

CaseData load(const std::string& path, const std::string& output_name) {
  const CaseReader r(path);
  CaseData d;
  CaseHeader& h = d.header;
  h.config = r.config();
  h.tokens = r.tokens();
  h.description = r.description().value_or("");
  h.source = r.source().value_or("");
  h.hidden_dtype = r.hidden_dtype();
  h.hidden_fp8 = r.has_hidden_fp8();
  h.routing_bias = r.has_routing_bias();
  for (const DatasetInfo& ds : r.datasets())
    if (ds.path == "/inputs/routing_bias") h.routing_bias_dtype = ds.dtype == "bfloat16" ? Precision::bf16 : Precision::f32;
  d.hidden = r.read_hidden_states();
  d.logits = r.read_router_logits();
  if (h.routing_bias) d.bias = *r.read_routing_bias();
  if (h.hidden_fp8) d.fp8 = r.read_hidden_fp8();
  for (int64_t s = 0; s < r.stored_experts(); ++s) d.experts.push_back(r.read_expert_slot(s));
  if (!output_name.empty()) {
    d.output_name = output_name;
    d.output = r.read_output(output_name);
    // The candidates hold other inputs than this output's recording (golden/FORMAT.md
    // "input_hash"): its input hashes no longer describe them.
    std::erase_if(d.output.attributes, [](const auto& a) { return a.first.rfind("input_hash", 0) == 0; });
  }
  return d;
}

void save(const CaseData& d, const std::string& path, int deflate, const std::string& record_name = "",
          const OutputData* record = nullptr) {
  CaseHeader h = d.header;
  const MoeConfig& c = h.config;
  h.expert_ids.clear();
  bool all = int64_t(d.experts.size()) == c.local_experts();
  for (size_t s = 0; s < d.experts.size() && all; ++s) all = d.experts[s].expert == c.local_expert_offset + int64_t(s);
  if (!all)
    for (const ExpertWeights& w : d.experts) h.expert_ids.push_back(w.expert);
  h.deflate = deflate;
  CaseWriter w(path, h);
  w.write_hidden_states(d.hidden);
  if (h.hidden_fp8) w.write_hidden_fp8(d.fp8.codes, d.fp8.scales);
  w.write_router_logits(d.logits);
  if (h.routing_bias) w.write_routing_bias(d.bias);
  for (size_t s = 0; s < d.experts.size(); ++s) w.write_expert(int64_t(s), d.experts[s]);
  if (!d.output_name.empty()) w.add_output(d.output_name, d.output);
  if (record) w.add_output(record_name, *record);
  w.commit();
}

// Rows `keep` of a row-major [n, width] array.
template <class V>
V rows(const V& v, int64_t width, const std::vector<int64_t>& keep) {
  V o;
  if (v.empty()) return o;
  o.reserve(keep.size() * size_t(width));
  for (int64_t t : keep) o.insert(o.end(), v.begin() + t * width, v.begin() + (t + 1) * width);
  return o;
}

CaseData keep_tokens(const CaseData& d, const std::vector<int64_t>& keep) {
  CaseData o = d;
  const MoeConfig& c = d.config();
  const int64_t H = c.hidden_size, G = c.group_size, k = c.top_k;
  o.header.tokens = int64_t(keep.size());
  o.hidden = rows(d.hidden, H, keep);
  o.logits = rows(d.logits, c.num_experts, keep);
  o.fp8.codes = rows(d.fp8.codes, H, keep);
  o.fp8.scales = rows(d.fp8.scales, (H + G - 1) / G, keep);
  if (!d.output_name.empty()) {
    o.output.output = rows(d.output.output, H, keep);
    o.output.topk_ids = rows(d.output.topk_ids, k, keep);
    o.output.topk_weights = rows(d.output.topk_weights, k, keep);
    o.output.expert_outputs = rows(d.output.expert_outputs, k * H, keep);
    for (size_t r = 0; r < d.output.ranks.size(); ++r) o.output.ranks[r] = rows(d.output.ranks[r], H, keep);
  }
  return o;
}

// Columns [c0, c1) of a row-major [n, width] array removed.
template <class V>
V drop_cols(const V& v, int64_t width, int64_t c0, int64_t c1) {
  V o;
  if (v.empty()) return o;
  const int64_t n = int64_t(v.size()) / width;
  o.reserve(size_t(n * (width - (c1 - c0))));
  for (int64_t r = 0; r < n; ++r) {
    o.insert(o.end(), v.begin() + r * width, v.begin() + r * width + c0);
    o.insert(o.end(), v.begin() + r * width + c1, v.begin() + (r + 1) * width);
  }
  return o;
}
// Rows [r0, r1) of a row-major [n, width] array removed.
template <class V>
V drop_rows(const V& v, int64_t width, int64_t r0, int64_t r1) {
  V o = v;
  o.erase(o.begin() + r0 * width, o.begin() + r1 * width);
  return o;
}

int64_t blocks(int64_t n, int64_t b) { return (n + b - 1) / b; }

// H block hb (columns [hb B, min(H, (hb+1) B))) removed everywhere H appears.
CaseData drop_h_block(const CaseData& d, int64_t hb) {
  CaseData o = d;
  const MoeConfig& c = d.config();
  const int64_t H = c.hidden_size, I = c.intermediate_size, B = c.weight_block, G = c.group_size;
  const int64_t h0 = hb * B, h1 = std::min(H, h0 + B), HB = blocks(H, B), IB = blocks(I, B);
  o.header.config.hidden_size = H - (h1 - h0);
  o.hidden = drop_cols(d.hidden, H, h0, h1);
  o.fp8.codes = drop_cols(d.fp8.codes, H, h0, h1);
  o.fp8.scales = drop_cols(d.fp8.scales, blocks(H, G), hb, hb + 1);
  for (ExpertWeights& w : o.experts) {
    w.w13 = drop_cols(w.w13, H, h0, h1);
    w.w13_scale = drop_cols(w.w13_scale, HB, hb, hb + 1);
    w.w2 = drop_rows(w.w2, I, h0, h1);
    w.w2_scale = drop_rows(w.w2_scale, IB, hb, hb + 1);
  }
  return o;
}

// I block ib removed from both halves of w13 and from w2 (I a multiple of B).
CaseData drop_i_block(const CaseData& d, int64_t ib) {
  CaseData o = d;
  const MoeConfig& c = d.config();
  const int64_t H = c.hidden_size, I = c.intermediate_size, B = c.weight_block;
  const int64_t i0 = ib * B, i1 = i0 + B, HB = blocks(H, B), IB = I / B;
  o.header.config.intermediate_size = I - B;
  for (ExpertWeights& w : o.experts) {
    // The second half first, so the first half's indices stay put.
    w.w13 = drop_rows(drop_rows(w.w13, H, I + i0, I + i1), H, i0, i1);
    w.w13_scale = drop_rows(drop_rows(w.w13_scale, HB, IB + ib, IB + ib + 1), HB, ib, ib + 1);
    w.w2 = drop_cols(w.w2, I, i0, i1);
    w.w2_scale = drop_cols(w.w2_scale, IB, ib, ib + 1);
  }
  return o;
}

// Stored experts limited to those in [lo, hi) that the reference routes a kept token to (at
// least one: the format stores one expert or more), with the local range set to [lo, hi).
std::optional<CaseData> restrict_experts(const CaseData& d, int64_t lo, int64_t hi) {
  CaseData o = d;
  MoeConfig& c = o.header.config;
  c.local_expert_offset = lo, c.local_num_experts = hi - lo;
  const Routing r = route(c, d.logits.data(), d.bias.empty() ? nullptr : d.bias.data(), d.T());
  std::set<int64_t> used;
  for (int32_t id : r.ids)
    if (id >= lo && id < hi) used.insert(id);
  o.experts.clear();
  for (const ExpertWeights& w : d.experts)
    if (used.count(w.expert)) o.experts.push_back(w);
  if (o.experts.empty()) {
    for (const ExpertWeights& w : d.experts)
      if (w.expert >= lo && w.expert < hi) {
        o.experts.push_back(w);
        break;
      }
  }
  if (o.experts.empty()) return std::nullopt;
  return o;
}

// A failure's kind: a judged failure and a backend that threw are different bugs.
bool judged(const judge::CheckOutcome& o) { return !o.results.empty(); }
// Elements over budget (or non-finite): the value evidence, which a shrink must not trade for a
// bare routing mismatch (a shard where neither choice is local still differs in its ids).
bool values_fail(const judge::CheckOutcome& o) {
  for (const CompareResult& r : o.results)
    if (r.elements_over > 0) return true;
  return false;
}

}  // namespace

std::string ShrinkResult::summary() const {
  std::string s = fmt::format("T {} -> {}, stored experts {} -> {}", tokens[0], tokens[1], stored[0], stored[1]);
  if (local[0] != local[1]) s += fmt::format(", local experts {} -> {}", local[0], local[1]);
  s += fmt::format(", H {} -> {}, I {} -> {}", hidden[0], hidden[1], inter[0], inter[1]);
  if (zeroed_groups) s += fmt::format(", {} hidden groups zeroed", zeroed_groups);
  return s;
}

namespace {

// One shrink: the case as it stands (`cur`), the outcome of its last check, and the passes that
// try smaller candidates, each kept when it still fails the same way (attempt).
class Shrinker {
 public:
  Shrinker(const std::string& case_path, const std::string& out_path, const ShrinkOptions& opt, ShrinkResult& res)
      : case_path_(case_path), out_path_(out_path), opt_(opt), chk_(opt.check), res_(res),
        backend_mode_(!chk_.backend.empty()),
        cur_(load(case_path, backend_mode_ ? "" : chk_.output)), was_judged_(judged(res.initial)),
        had_values_(values_fail(res.initial)), last_(res.initial),
        tmp_(scratch_path(out_path, opt)), scratch_(tmp_) {
    set_up_control();
    note(0);
  }

  // Tokens and experts; in backend mode also weight blocks, a second round, and zeroed groups.
  void run() {
    shrink_tokens();
    shrink_experts();
    if (backend_mode_) {
      shrink_blocks();
      shrink_tokens();
      shrink_experts();
      simplify_values();
    }
    note(1);
    res_.final = last_;
  }

  // The minimal case: what it was shrunk from and how to replay it, and (backend mode) the
  // failing output recorded so `moecheck compare MIN` shows the failure without a backend.
  void write();

 private:
  static std::string scratch_path(const std::string& out_path, const ShrinkOptions& opt) {
    namespace fs = std::filesystem;
    const fs::path dir = opt.work_dir.empty() ? fs::absolute(out_path).parent_path() : fs::path(opt.work_dir);
    return (dir / fmt::format(".shrink-candidate.{}.h5", getpid())).string();
  }

  // The control: the correct backend must pass on every candidate kept (dropped, and said so,
  // when it fails the original case already).
  void set_up_control() {
    if (backend_mode_ && !opt_.no_control) {
      const bool faulty = chk_.backend.rfind("faulty:", 0) == 0 || chk_.shard.faulty();
      control_.backend = !opt_.control.empty() ? opt_.control : faulty ? "emulated" : "";
      control_.shard = {chk_.shard.plan, ShardFault::none, -1};  // the same ranks, none at fault
      control_.int32_threshold = chk_.int32_threshold;
      control_.budget_model = chk_.budget_model;
      control_.allow_vacuous = chk_.allow_vacuous;
      if (!control_.backend.empty() && judge::check_case(case_path_, control_).status != judge::CheckStatus::pass) {
        res_.control_failed_initially = true;
        control_.backend.clear();
      }
    }
    res_.control = control_.backend;
  }

  void note(int i) {
    res_.tokens[i] = cur_.T(), res_.stored[i] = int64_t(cur_.experts.size());
    res_.local[i] = cur_.config().local_experts();
    res_.hidden[i] = cur_.config().hidden_size, res_.inter[i] = cur_.config().intermediate_size;
  }

  // Does the candidate still fail the same way? Written, checked, kept in cur_ when it does.
  bool attempt(const CaseData& cand, const std::string& what) {
    if (res_.attempts >= opt_.max_attempts) return false;
    ++res_.attempts;
    save(cand, tmp_, 0);
    judge::CheckOutcome o = judge::check_case(tmp_, chk_);
    const bool control_ok =
        o.failed() && judged(o) == was_judged_ && (!had_values_ || values_fail(o)) &&
        (control_.backend.empty() || judge::check_case(tmp_, control_).status == judge::CheckStatus::pass);
    std::error_code ec;
    std::filesystem::remove(tmp_, ec);
    if (!control_ok) return false;
    cur_ = cand;
    last_ = std::move(o);
    ++res_.accepted;
    if (opt_.progress)
      opt_.progress(fmt::format("shrink: {} (attempt {}): T={} experts={} H={} I={}", what, res_.attempts, cur_.T(),
                                cur_.experts.size(), cur_.config().hidden_size, cur_.config().intermediate_size));
    return true;
  }

  // ddmin: try each of n chunks alone, then each complement; refine n when neither fails.
  void shrink_tokens() {
    std::vector<int64_t> keep(size_t(cur_.T()));
    for (size_t i = 0; i < keep.size(); ++i) keep[i] = int64_t(i);
    const CaseData base = cur_;
    size_t n = 2;
    while (keep.size() >= 2 && res_.attempts < opt_.max_attempts) {
      const size_t chunk = (keep.size() + n - 1) / n;
      bool reduced = false;
      std::vector<std::vector<int64_t>> parts;
      for (size_t i = 0; i < keep.size(); i += chunk)
        parts.emplace_back(keep.begin() + std::ptrdiff_t(i),
                           keep.begin() + std::ptrdiff_t(std::min(keep.size(), i + chunk)));
      for (size_t i = 0; i < parts.size() && !reduced; ++i)
        if (attempt(keep_tokens(base, parts[i]), fmt::format("{} of {} tokens", parts[i].size(), keep.size()))) {
          keep = parts[i], n = 2, reduced = true;
        }
      for (size_t i = 0; i < parts.size() && !reduced && parts.size() > 2; ++i) {
        std::vector<int64_t> rest;
        for (size_t j = 0; j < parts.size(); ++j)
          if (j != i) rest.insert(rest.end(), parts[j].begin(), parts[j].end());
        if (attempt(keep_tokens(base, rest), fmt::format("{} of {} tokens", rest.size(), keep.size()))) {
          keep = rest, n = std::max<size_t>(n - 1, 2), reduced = true;
        }
      }
      if (!reduced) {
        if (n >= keep.size()) break;
        n = std::min(keep.size(), 2 * n);
      }
    }
  }

  // The routed experts only; in backend mode, then the local range halved from either end.
  void shrink_experts() {
    const MoeConfig& c = cur_.config();
    int64_t lo = c.local_expert_offset, hi = lo + c.local_experts();
    if (auto cand = restrict_experts(cur_, lo, hi); cand && cand->experts.size() < cur_.experts.size())
      attempt(*cand, "routed experts only");
    if (!backend_mode_) return;  // the recording's values depend on which experts are local
    for (int64_t step = (hi - lo) / 2; step >= 1; step /= 2) {
      while (hi - lo > step) {
        bool cut = false;
        if (auto cand = restrict_experts(cur_, lo, hi - step);
            cand && attempt(*cand, fmt::format("local experts [{}, {})", lo, hi - step)))
          hi -= step, cut = true;
        else if (auto cand2 = restrict_experts(cur_, lo + step, hi);
                 cand2 && attempt(*cand2, fmt::format("local experts [{}, {})", lo + step, hi)))
          lo += step, cut = true;
        if (!cut) break;
      }
    }
  }

  void shrink_blocks() {
    const int64_t B = cur_.config().weight_block;
    if (cur_.config().group_size != B) return;  // the slicing keeps group and block boundaries together
    for (int64_t hb = blocks(cur_.config().hidden_size, B) - 1; hb >= 0 && cur_.config().hidden_size > B; --hb)
      attempt(drop_h_block(cur_, hb), fmt::format("H block {} dropped", hb));
    if (cur_.config().intermediate_size % B != 0) return;  // a ragged I mixes gate and up rows in one w13 block
    for (int64_t ib = cur_.config().intermediate_size / B - 1; ib >= 0 && cur_.config().intermediate_size > B; --ib)
      attempt(drop_i_block(cur_, ib), fmt::format("I block {} dropped", ib));
  }

  void simplify_values() {
    const MoeConfig& c = cur_.config();
    if (cur_.header.hidden_fp8) return;  // the engine's own activations: not ours to rewrite
    const int64_t H = c.hidden_size, G = c.group_size;
    for (int64_t t = 0; t < cur_.T(); ++t)
      for (int64_t g = 0; g * G < H; ++g) {
        CaseData cand = cur_;
        bool nonzero = false, rest_nonzero = false;
        for (int64_t h = 0; h < H; ++h) {
          float& x = cand.hidden[size_t(t * H + h)];
          if (h >= g * G && h < (g + 1) * G) {
            nonzero |= x != 0.0f;
            x = 0.0f;
          } else {
            rest_nonzero |= x != 0.0f;
          }
        }
        // A token left all zero has output 0, where no relative check (ours or the familiar
        // ones) says anything: keep one nonzero group per token.
        if (nonzero && rest_nonzero && attempt(cand, fmt::format("token {} group {} zeroed", t, g)))
          ++res_.zeroed_groups;
      }
  }

  const std::string case_path_, out_path_;
  const ShrinkOptions& opt_;
  const judge::CheckOptions& chk_;
  ShrinkResult& res_;
  const bool backend_mode_;
  CaseData cur_;
  const bool was_judged_, had_values_;
  judge::CheckOutcome last_;
  judge::CheckOptions control_;
  const std::string tmp_;
  const interrupt::ScratchPath scratch_;
};

void Shrinker::write() {
  const std::string from = opt_.origin.empty() ? case_path_ : opt_.origin;
  const std::string model_opt = chk_.budget_model.empty() ? "" : " --budget-model " + chk_.budget_model;
  res_.replay = backend_mode_
                    ? judge::replay_command(out_path_, chk_.backend, chk_.int32_threshold, chk_.budget_model, chk_.shard)
                    : fmt::format("moecheck compare {} --output {}{}", out_path_, chk_.output, model_opt);
  CaseData out = cur_;
  // source: the commands that regenerate the case (the input's own source, then this shrink).
  const std::string shrink_cmd = fmt::format(
      "moecheck shrink {} {}{}{} -o {}", case_path_,
      backend_mode_ ? "--backend " + judge::shell_quote(chk_.backend) +
                          judge::shard_arguments(chk_.shard, judge::parse_backend_name(chk_.backend).faulty())
                    : "--output " + chk_.output,
      chk_.int32_threshold > 0 ? fmt::format(" --int32-threshold {}", chk_.int32_threshold) : "", model_opt, out_path_);
  out.header.source = cur_.header.source.empty() ? shrink_cmd : cur_.header.source + " && " + shrink_cmd;
  out.header.description = fmt::format(
      "minimal failing case, shrunk by moecheck {} from {} ({}); fails with {}: {}{}; replay: {}. Original: {}",
      MOECHECK_VERSION, from, res_.summary(), backend_mode_ ? chk_.backend : "/outputs/" + chk_.output, last_.reason,
      res_.control.empty() ? "" : fmt::format("; {} passes on it", res_.control), res_.replay,
      cur_.header.description);
  if (backend_mode_ && opt_.record && last_.run) {
    OutputData rec = judge::to_output_data(*last_.run);
    rec.attributes["replay"] = res_.replay;
    if (chk_.int32_threshold > 0) rec.attributes["int32_threshold"] = std::to_string(chk_.int32_threshold);
    if (!chk_.budget_model.empty()) rec.attributes["budget_model"] = chk_.budget_model;
    save(out, out_path_, 6, judge::sharded_output_name(chk_.backend, chk_.shard), &rec);
  } else {
    save(out, out_path_, 6);
  }
}

}  // namespace

ShrinkResult shrink_case(const std::string& case_path, const std::string& out_path, const ShrinkOptions& opt) {
  ShrinkResult res;
  res.initial = judge::check_case(case_path, opt.check);
  if (!res.initial.failed()) return res;
  Shrinker shrinker(case_path, out_path, opt, res);
  shrinker.run();
  shrinker.write();
  return res;
}

}  // namespace moecheck::sweep
