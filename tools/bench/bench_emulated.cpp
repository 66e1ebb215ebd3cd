// bench_emulated: wall time of the emulated backend on a DeepSeek-V3-sized synthetic layer
// (E = 256, H = 7168, I = 2048, top-8, deepseek_v3 routing with bias, n_group 8, topk_group 4,
// rsf 2.5). Not a test: it prints timings.
//
//   bench_emulated [--tokens 64] [--threads 0] [--pool 8] [--fresh] [--seed 1]
//
// Data as tests/small_layer.hpp makes it (CounterRng, so any machine gets the same layer):
// bf16-exact hidden states N(0, 4), N(0, 1) logits, a small N(0, 0.02^2) bias (a larger one would
// send every token to the same few experts), uniform non-NaN e4m3 codes,
// block scales 2^-(6..11) * [1, 2). A full layer is 11 GiB of codes, so experts are generated
// expert by expert: --pool N makes N distinct experts up front and expert e uses pool[e mod N]
// (the timing is the backend's alone; N * 44 MiB exceeds the caches, so weights still stream
// from memory); --fresh generates each expert inside the loader instead (the loader is called
// one at a time, so generation then dominates).
#include <chrono>
#include <ctime>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "kernels/emulated/emulated_moe.hpp"
#include "reference/counter_rng.hpp"
#include "reference/fp8_formats.hpp"

namespace {

using namespace moecheck;
using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

struct ExpertData {
  std::vector<uint8_t> w13, w2;
  std::vector<float> s13, s2;
};

// 16 codes per Philox block; NaN codes (0x7F, 0xFF) become 0x7E / 0xFE (+-448).
void fill_codes(const CounterRng& r, std::vector<uint8_t>& v) {
  for (size_t i = 0; i < v.size(); i += 16) {
    const auto b = r.block(i / 16);
    uint8_t bytes[16];
    std::memcpy(bytes, b.data(), 16);
    for (size_t j = 0; j < 16 && i + j < v.size(); ++j) {
      uint8_t c = bytes[j];
      if ((c & 0x7F) == 0x7F) c ^= 0x01;
      v[i + j] = c;
    }
  }
}

void fill_scales(const CounterRng& r, std::vector<float>& v) {
  for (size_t i = 0; i < v.size(); ++i)
    v[i] = std::ldexp(1.0f + static_cast<float>(r.uniform(2 * i)), -6 - static_cast<int>(r.bits(2 * i + 1) % 6));
}

std::shared_ptr<ExpertData> make_expert(const MoeConfig& c, uint64_t seed, int64_t e) {
  const int64_t H = c.hidden_size, I = c.intermediate_size, B = c.weight_block;
  auto d = std::make_shared<ExpertData>();
  d->w13.resize(2 * I * H), d->w2.resize(H * I);
  d->s13.resize(((2 * I + B - 1) / B) * ((H + B - 1) / B)), d->s2.resize(((H + B - 1) / B) * ((I + B - 1) / B));
  const uint64_t st = 100 + static_cast<uint64_t>(e) * 4;
  fill_codes(CounterRng{seed, st}, d->w13);
  fill_codes(CounterRng{seed, st + 1}, d->w2);
  fill_scales(CounterRng{seed, st + 2}, d->s13);
  fill_scales(CounterRng{seed, st + 3}, d->s2);
  return d;
}

}  // namespace

int main(int argc, char** argv) {
  int64_t tokens = 64, pool_size = 8;
  int threads = 0;
  bool fresh = false;
  uint64_t seed = 1;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> long long {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "bench_emulated: %s needs a value\n", a.c_str());
        std::exit(2);
      }
      return std::atoll(argv[++i]);
    };
    if (a == "--tokens") tokens = value();
    else if (a == "--threads") threads = static_cast<int>(value());
    else if (a == "--pool") pool_size = value();
    else if (a == "--seed") seed = static_cast<uint64_t>(value());
    else if (a == "--fresh") fresh = true;
    else {
      std::fprintf(stderr, "usage: bench_emulated [--tokens N] [--threads N] [--pool N] [--fresh] [--seed S]\n");
      return 2;
    }
  }
  if (tokens < 1 || pool_size < 1) {
    std::fprintf(stderr, "bench_emulated: --tokens and --pool must be >= 1\n");
    return 2;
  }

  MoeConfig c;
  c.num_experts = 256, c.top_k = 8, c.hidden_size = 7168, c.intermediate_size = 2048;
  c.routing = RoutingMethod::deepseek_v3, c.n_group = 8, c.topk_group = 4, c.routed_scaling_factor = 2.5;
  const int64_t H = c.hidden_size, E = c.num_experts;

  auto t0 = Clock::now();
  std::vector<float> hidden(tokens * H), logits(tokens * E), bias(E);
  const CounterRng hr{seed, 1}, lr{seed, 2}, br{seed, 3};
  for (int64_t i = 0; i < tokens * H; ++i) hidden[i] = bf16_round(hr.normal(2 * i) * 2.0);
  for (int64_t i = 0; i < tokens * E; ++i) logits[i] = static_cast<float>(lr.normal(2 * i));
  for (int64_t i = 0; i < E; ++i) bias[i] = static_cast<float>(br.normal(2 * i) * 0.02);
  std::vector<std::shared_ptr<ExpertData>> pool;
  if (!fresh)
    for (int64_t e = 0; e < pool_size; ++e) pool.push_back(make_expert(c, seed, e));
  std::printf("generated inputs%s in %.2f s\n", fresh ? "" : " and the expert pool", seconds_since(t0));

  double load_seconds = 0;
  int64_t loads = 0;
  MoeProblem p;
  p.config = c;
  p.tokens = tokens;
  p.hidden = hidden.data();
  p.logits = logits.data();
  p.bias = bias.data();
  for (int64_t e = 0; e < E; ++e) p.stored_experts.push_back(e);
  p.source = "bench_emulated";
  p.load_expert = [&](int64_t e) {
    const auto l0 = Clock::now();
    std::shared_ptr<ExpertData> d = fresh ? make_expert(c, seed, e) : pool[e % pool_size];
    load_seconds += seconds_since(l0);  // calls are serialised by the backend
    ++loads;
    return ExpertView{d->w13.data(), d->s13.data(), d->w2.data(), d->s2.data(), d};
  };

  EmulatedOptions opt;
  opt.threads = threads;
  t0 = Clock::now();
  const std::clock_t c0 = std::clock();
  const BackendOutput out = run_emulated(p, opt);
  const double wall = seconds_since(t0);
  const double cpu = static_cast<double>(std::clock() - c0) / CLOCKS_PER_SEC;  // all threads
  const double flops = 2.0 * tokens * c.top_k * (3.0 * c.intermediate_size * H);
  double checksum = 0;
  uint64_t hash = 0xcbf29ce484222325ull;  // FNV-1a of the output bits: equal runs are bitwise equal
  for (uint16_t b : out.output_bf16) {
    checksum += bf16_decode(b);
    hash = (hash ^ b) * 0x100000001b3ull;
  }
  std::printf("emulated: T=%lld E=%lld H=%lld I=%lld top-%lld, %lld experts loaded, threads=%d\n",
              static_cast<long long>(tokens), static_cast<long long>(E), static_cast<long long>(H),
              static_cast<long long>(c.intermediate_size), static_cast<long long>(c.top_k),
              static_cast<long long>(loads), threads);
  std::printf("wall %.3f s, cpu %.3f s (all threads; loader %.3f s, serialised), %.1f GFLOP/s wall\n", wall, cpu,
              load_seconds, flops / wall * 1e-9);
  std::printf("output sum %.9g, bits hash %016llx\n", checksum, static_cast<unsigned long long>(hash));
  return 0;
}
