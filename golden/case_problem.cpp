// CaseProblem: a case's inputs in memory, its experts on demand, and its input hash.
#include "golden/case_problem.hpp"

#include <cstring>
#include <fmt/format.h>

namespace moecheck {

namespace {
// A streaming 64-bit hash of our own (not cryptographic: it detects changed inputs, it does not
// resist forgery). 8-byte words folded with a multiply-xorshift mix, the length mixed in at the end.
class Hash64 {
 public:
  void bytes(const void* p, size_t n) {
    const auto* b = static_cast<const unsigned char*>(p);
    len_ += n;
    size_t i = 0;
    if (fill_ == 0)  // fast path: whole little-endian words (same result as the byte loop)
      for (; i + 8 <= n; i += 8) {
        std::memcpy(&word_, b + i, 8);
        flush();
      }
    for (; i < n; ++i) {
      word_ |= uint64_t(b[i]) << (8 * fill_);
      if (++fill_ == 8) flush();
    }
  }
  template <class T>
  void vec(const std::vector<T>& v) {
    const uint64_t n = v.size();
    bytes(&n, sizeof n);
    bytes(v.data(), v.size() * sizeof(T));
  }
  void str(std::string_view s) {
    const uint64_t n = s.size();
    bytes(&n, sizeof n);
    bytes(s.data(), s.size());
  }
  uint64_t digest() {
    if (fill_) flush();
    return mix(h_ ^ len_);
  }

 private:
  static uint64_t mix(uint64_t x) {
    x ^= x >> 31;
    x *= 0x7fb5d329728ea185ULL;
    x ^= x >> 27;
    x *= 0x81dadef4bc2dd44dULL;
    x ^= x >> 33;
    return x;
  }
  void flush() {
    h_ = mix(h_ ^ (word_ + 0x9e3779b97f4a7c15ULL)) * 0xff51afd7ed558ccdULL;
    word_ = 0, fill_ = 0;
  }
  uint64_t h_ = 0x243f6a8885a308d3ULL, word_ = 0, len_ = 0;
  int fill_ = 0;
};
}  // namespace

CaseProblem::CaseProblem(const std::string& path) : reader_(std::make_unique<CaseReader>(path)) {
  const CaseReader& r = *reader_;
  if (const std::vector<Problem> problems = r.validate(); !problems.empty()) {
    const std::string more =
        problems.size() > 1 ? fmt::format(" (and {} more: moecheck inspect lists them)", problems.size() - 1) : "";
    throw InputError(path, problems[0].where, problems[0].rule + more);
  }
  hidden_ = r.read_hidden_states();
  logits_ = r.read_router_logits();
  if (auto b = r.read_routing_bias()) bias_ = std::move(*b);
  if (r.has_hidden_fp8()) fp8_ = r.read_hidden_fp8();
  MoeProblem& p = problem_;
  p.config = r.config();
  p.tokens = r.tokens();
  p.hidden = hidden_.data();
  p.logits = logits_.data();
  p.bias = bias_.empty() ? nullptr : bias_.data();
  if (r.has_hidden_fp8()) p.hidden_fp8 = fp8_.codes.data(), p.hidden_scale = fp8_.scales.data();
  p.stored_experts = r.expert_ids();
  p.source = r.path();
  const CaseReader* reader = reader_.get();
  p.load_expert = [reader](int64_t e) {
    auto w = std::make_shared<ExpertWeights>(reader->read_expert(e));
    ExpertView v{w->w13.data(), w->w13_scale.data(), w->w2.data(), w->w2_scale.data(), {}};
    v.owner = w;
    return v;
  };
}

std::string CaseProblem::input_hash() const { return input_hashes().combined; }

CaseProblem::InputHashes CaseProblem::input_hashes() const {
  Hash64 h, hc, hx, hl, hb, hw;
  const MoeConfig& c = config();
  h.str("moecheck.case.inputs.v1");
  const int64_t ints[] = {c.num_experts, c.top_k, c.hidden_size, c.intermediate_size, int64_t(c.routing),
                          c.n_group, c.topk_group, int64_t(c.gate_up_layout), int64_t(c.scale_format),
                          int64_t(c.intermediate_dtype), int64_t(c.routing_weight_dtype), c.group_size,
                          c.weight_block, c.local_expert_offset, c.local_experts(), tokens()};
  h.bytes(ints, sizeof ints);
  h.bytes(&c.routed_scaling_factor, sizeof(double));
  h.bytes(&c.act_eps, sizeof(double));
  hc.bytes(ints, sizeof ints);
  hc.bytes(&c.routed_scaling_factor, sizeof(double));
  hc.bytes(&c.act_eps, sizeof(double));
  // The recipe enters the hash only when it is not the default, so the stored references of
  // cases written before recipes existed stay current.
  if (!c.recipe.is_default()) {
    const EngineRecipe& r = c.recipe;
    const int64_t rc[] = {int64_t(r.combine), int64_t(r.act_scale_floor), int64_t(r.quant_divide),
                          int64_t(r.expert_output_dtype), int64_t(r.silu_dtype)};
    h.str("recipe");
    h.bytes(rc, sizeof rc);
    hc.bytes(rc, sizeof rc);
  }
  h.vec(hidden_), h.vec(logits_), h.vec(bias_), h.vec(fp8_.codes), h.vec(fp8_.scales);
  hx.vec(hidden_), hx.vec(fp8_.codes), hx.vec(fp8_.scales), hl.vec(logits_), hb.vec(bias_);
  for (int64_t e : reader_->expert_ids()) {
    const ExpertWeights w = reader_->read_expert(e);
    h.bytes(&e, sizeof e);
    h.vec(w.w13), h.vec(w.w13_scale), h.vec(w.w2), h.vec(w.w2_scale);
    hw.bytes(&e, sizeof e);
    hw.vec(w.w13), hw.vec(w.w13_scale), hw.vec(w.w2), hw.vec(w.w2_scale);
  }
  auto hex = [](Hash64& x) { return fmt::format("{:016x}", x.digest()); };
  return {hex(h),
          {{"/config", hex(hc)},
           {"/inputs/hidden_states", hex(hx)},
           {"/inputs/router_logits", hex(hl)},
           {"/inputs/routing_bias", hex(hb)},
           {"/weights", hex(hw)}}};
}

}  // namespace moecheck
