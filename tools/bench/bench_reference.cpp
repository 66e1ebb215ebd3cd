// `moecheck bench reference`: wall time, achieved float64 GFLOP/s and peak RSS of the float64
// quantized-tier reference on a synthetic layer of a real model's shape, beside this machine's
// float64 GEMM rate measured in the same run on the per-expert GEMM shape.
//
// The layer lives in memory as FP8 (as a case's experts would after loading); its generation is
// not timed. The GEMM rate is Eigen's double GEMM of the same [tokens-per-expert x H] x [H x 2I]
// shape on already dequantized operands, with as many threads working on independent products as
// the reference uses: the ceiling the reference's own GEMMs could reach.
#include <Eigen/Core>
#include <algorithm>
#include <chrono>
#include <ctime>
#include <fmt/format.h>
#include <fstream>
#include <iostream>
#include <thread>

#include "reference/counter_rng.hpp"
#include "reference/fp8_quant.hpp"
#include "reference/fp8_formats.hpp"
#include "reference/moe_compare.hpp"
#include "reference/moe_forward.hpp"
#include "tools/bench/bench.hpp"
#include "tools/judge/reference_store.hpp"

namespace moecheck::bench {

namespace {
using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }
// CPU seconds of all of this process's threads: on a machine shared with other work the wall
// times above stretch with the load, the CPU time much less (the ratios of both are printed).
double process_cpu_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return double(ts.tv_sec) + 1e-9 * double(ts.tv_nsec);
}

// Peak resident set size of this process (VmHWM), bytes.
double peak_rss_bytes() {
  std::ifstream f("/proc/self/status");
  std::string line;
  while (std::getline(f, line))
    if (line.rfind("VmHWM:", 0) == 0) return std::stod(line.substr(6)) * 1024.0;
  return 0;
}

struct MemoryLayer {
  std::vector<std::vector<uint8_t>> w13, w2;
  std::vector<std::vector<float>> s13, s2;
  std::vector<float> hidden, logits, bias;
};

void fill_codes(std::vector<uint8_t>& v, const CounterRng& r) {
  for (size_t i = 0; i < v.size(); i += 8) {
    uint64_t b = r.bits(i / 8);
    for (size_t j = 0; j < 8 && i + j < v.size(); ++j, b >>= 8) {
      uint8_t c = static_cast<uint8_t>(b);
      if ((c & 0x7F) == 0x7F) c ^= 1;  // never the NaN code
      // Keep magnitudes moderate (|code value| <= 16) so the synthetic outputs stay in range.
      if ((c & 0x78) > 0x50) c = static_cast<uint8_t>((c & 0x87) | 0x50);
      v[i + j] = c;
    }
  }
}

double measure_gemm_rate(int64_t m, int64_t n, int64_t kdim, int threads) {
  using Mat = Eigen::Matrix<double, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
  const int reps = 3;
  auto one = [&] {
    Mat a = Mat::Random(m, kdim), b = Mat::Random(n, kdim), c(m, n);
    c.noalias() = a * b.transpose();  // warm-up
    const auto t0 = Clock::now();
    for (int r = 0; r < reps; ++r) c.noalias() = a * b.transpose();
    return seconds_since(t0);
  };
  // All threads multiply in parallel (each its own operands); the slowest one's time counts.
  std::vector<double> times(threads);
  std::vector<std::thread> pool;
  for (int i = 0; i < threads; ++i) pool.emplace_back([&, i] { times[i] = one(); });
  for (auto& t : pool) t.join();
  const double tmax = *std::max_element(times.begin(), times.end());
  return double(threads) * reps * 2.0 * double(m) * double(n) * double(kdim) / tmax;
}
// The median of a few timings (the mean of the middle two for an even count).
double median_of(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}
}  // namespace

int bench_reference(const BenchShape& shape, int64_t tokens, uint64_t seed, int threads,
                    const std::vector<std::string>& compare_models, int repeat, WeightProducts* products) {
  if (threads <= 0) threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  MoeConfig c = shape.config;
  const int64_t E = c.num_experts, H = c.hidden_size, I = c.intermediate_size, B = c.weight_block;
  std::cerr << fmt::format("bench reference: {} (E={}, H={}, I={}, top-{}), {} tokens, {} threads\n", shape.name, E, H,
                           I, c.top_k, tokens, threads);
  // ---- synthetic layer (not timed) ----
  const auto tg = Clock::now();
  MemoryLayer L;
  L.w13.resize(E), L.w2.resize(E), L.s13.resize(E), L.s2.resize(E);
  {
    std::vector<std::thread> pool;
    for (int th = 0; th < threads; ++th)
      pool.emplace_back([&, th] {
        for (int64_t e = th; e < E; e += threads) {
          L.w13[e].resize(2 * I * H), L.w2[e].resize(H * I);
          fill_codes(L.w13[e], CounterRng{seed, 1000 + uint64_t(e) * 2});
          fill_codes(L.w2[e], CounterRng{seed, 1001 + uint64_t(e) * 2});
          const CounterRng sr{seed, 900000 + uint64_t(e)};
          L.s13[e].resize(ceil_div(2 * I, B) * ceil_div(H, B));
          L.s2[e].resize(ceil_div(H, B) * ceil_div(I, B));
          for (size_t i = 0; i < L.s13[e].size(); ++i) L.s13[e][i] = float(0.01 * (1 + sr.uniform(i)));
          for (size_t i = 0; i < L.s2[e].size(); ++i) L.s2[e][i] = float(0.01 * (1 + sr.uniform(1u << 30 | i)));
        }
      });
    for (auto& t : pool) t.join();
  }
  const CounterRng hr{seed, 1}, lr{seed, 2}, br{seed, 3};
  L.hidden.resize(tokens * H), L.logits.resize(tokens * E), L.bias.resize(E);
  for (int64_t i = 0; i < tokens * H; ++i) L.hidden[i] = static_cast<float>(hr.normal(2 * i));
  for (int64_t i = 0; i < tokens * E; ++i) L.logits[i] = static_cast<float>(lr.normal(2 * i));
  for (int64_t i = 0; i < E; ++i) L.bias[i] = static_cast<float>(0.1 * br.normal(2 * i));
  const double gen_s = seconds_since(tg);
  const double fp8_bytes = double(E) * double(3 * I * H);

  MoeProblem p;
  p.config = c;
  p.tokens = tokens;
  p.hidden = L.hidden.data();
  p.logits = L.logits.data();
  p.bias = shape.uses_bias ? L.bias.data() : nullptr;
  for (int64_t e = 0; e < E; ++e) p.stored_experts.push_back(e);
  p.load_expert = [&L](int64_t e) {
    return ExpertView{L.w13[e].data(), L.s13[e].data(), L.w2[e].data(), L.s2[e].data(), {}};
  };
  p.source = "bench";

  // ---- the reference (timed) ----
  ForwardOptions opt;
  opt.tier = Tier::quantized;
  opt.threads = threads;
  // The reference and each compare model run in turn, `repeat` rounds, so that a slow spell of
  // the machine falls on all of them alike; the figures are medians (and the ratios are of
  // medians).
  std::vector<double> ref_s, dev_s, ref_cpu;
  std::vector<std::vector<double>> cmp_s(compare_models.size()), cmp_cpu(compare_models.size());
  ForwardResult r, rd;
  double cpu_rss = 0;
  for (int round = 0; round < repeat; ++round) {
    const auto t0 = Clock::now();
    const double c0 = process_cpu_seconds();
    r = moe_forward(p, opt);
    ref_s.push_back(seconds_since(t0));
    ref_cpu.push_back(process_cpu_seconds() - c0);
    // What `moecheck compare` adds: the budgeted forward and the judging of one output (the
    // reference's own output rounded to bf16 stands in for a backend's).
    for (size_t i = 0; i < compare_models.size(); ++i) {
      const auto tc = Clock::now();
      const double cc = process_cpu_seconds();
      CompareOptions copt;
      copt.model = parse_budget_model(compare_models[i]);
      ForwardOptions fb = opt;
      fb.budget = &copt.model;
      fb.requant_terms = copt.requant_test;
      const ForwardResult rb = moe_forward(p, fb);
      Observation obs;
      obs.name = "bench";
      for (double v : rb.output) obs.output.push_back(bf16_round(v));
      obs.topk_ids = rb.routing.ids;
      const CompareResult cr = compare_output(p, rb, obs, copt);
      cmp_s[i].push_back(seconds_since(tc));
      cmp_cpu[i].push_back(process_cpu_seconds() - cc);
      if (!cr.pass) std::cerr << "bench: the reference's own output failed its " << compare_models[i] << " budget (a bug)\n";
    }
    // The GPU's products last, so that the peak RSS of the CPU's own passes is measured first.
    if (round == 0) cpu_rss = peak_rss_bytes();
    if (products) {
      ForwardOptions od = opt;
      od.products = products;
      const auto td = Clock::now();
      rd = moe_forward(p, od);
      dev_s.push_back(seconds_since(td));
    }
    std::cerr << fmt::format("bench reference: round {} of {} done\n", round + 1, repeat);
  }
  const double wall = median_of(ref_s);
  const double achieved = r.gemm_flops / wall;

  // ---- this machine's float64 GEMM rate on the per-expert shape ----
  const int64_t m = std::max<int64_t>(1, (tokens * c.top_k + E - 1) / E);
  const double rate = measure_gemm_rate(m, 2 * I, H, threads);
  // For context: a compute-bound square product (the per-expert shape above is memory-bound when
  // its weight is already a double matrix; the reference reads FP8 and dequantizes in cache).
  const double square = measure_gemm_rate(1024, 1024, 1024, threads);
  const double rss = cpu_rss, rss_all = peak_rss_bytes();
  // The forward holds every slot's output (T k H doubles) until the combine sums them in slot
  // order; the rest is the FP8 layer and a fixed allowance.
  const double slot_bytes = 8.0 * double(tokens) * double(c.top_k) * double(H);
  const double bound = fp8_bytes + slot_bytes + 1024.0 * 1024 * 1024;

  fmt::print("bench reference: {} tokens={} experts run={} (generation {:.1f} s, not timed)\n", shape.name, tokens,
             r.experts_run, gen_s);
  fmt::print("  wall time            {:10.3f} s (median of {}, range {:.3f} - {:.3f})\n", wall, repeat,
             *std::min_element(ref_s.begin(), ref_s.end()), *std::max_element(ref_s.begin(), ref_s.end()));
  fmt::print("  CPU time             {:10.3f} s (all threads, median of {})\n", median_of(ref_cpu), repeat);
  fmt::print("  GEMM work            {:10.1f} GFLOP\n", r.gemm_flops * 1e-9);
  fmt::print("  achieved             {:10.2f} GFLOP/s (float64)\n", achieved * 1e-9);
  fmt::print("  machine GEMM rate    {:10.2f} GFLOP/s (Eigen double, [{} x {}] x [{} x {}], {} threads)\n", rate * 1e-9,
             m, H, H, 2 * I, threads);
  fmt::print("  ratio                {:10.1f} % of the measured GEMM rate (target >= 70 %)\n", 100 * achieved / rate);
  fmt::print("  square GEMM rate     {:10.2f} GFLOP/s (Eigen double, 1024^3, {} threads): the reference reaches {:.1f} %\n",
             square * 1e-9, threads, 100 * achieved / square);
  if (products) {
    const double t = median_of(dev_s);
    double largest = 0, diff = 0;
    int64_t same = 0;
    for (size_t i = 0; i < r.output.size(); ++i) {
      largest = std::max(largest, std::fabs(r.output[i]));
      diff = std::max(diff, std::fabs(r.output[i] - rd.output[i]));
      same += r.output[i] == rd.output[i];
    }
    fmt::print("  on the GPU           {:10.3f} s (median of {}, range {:.3f} - {:.3f}) = {:.1f} x faster than the CPU's; "
               "{:.2f} GFLOP/s; {}\n",
               t, repeat, *std::min_element(dev_s.begin(), dev_s.end()), *std::max_element(dev_s.begin(), dev_s.end()),
               wall / t, r.gemm_flops / t * 1e-9, products->describe());
    fmt::print("  GPU vs CPU output    largest |difference| {:.3g} = {:.3g} of the largest |output|; {} of {} bit-identical "
               "(bound: BUDGETS.md §11)\n",
               diff, diff / std::max(largest, 1e-300), same, r.output.size());
    fmt::print("  GPU engine           {} (all rounds)\n", products->activity());
  }
  for (size_t i = 0; i < compare_models.size(); ++i) {
    const double t = median_of(cmp_s[i]);
    fmt::print("  compare, budget model {:<7} {:.3f} s = {:.2f} x the reference's time (target < 3; range {:.3f} - {:.3f} s)\n",
               compare_models[i], t, t / wall, *std::min_element(cmp_s[i].begin(), cmp_s[i].end()),
               *std::max_element(cmp_s[i].begin(), cmp_s[i].end()));
    const double tc = median_of(cmp_cpu[i]);
    fmt::print("    CPU time                    {:.3f} s = {:.2f} x the reference's CPU time\n", tc, tc / median_of(ref_cpu));
  }
  fmt::print("  peak RSS             {:10.2f} GiB (bound: FP8 bytes {:.2f} GiB + slot outputs {:.2f} GiB + 1 GiB = "
             "{:.2f} GiB) {}\n",
             rss / (1 << 30), fp8_bytes / (1 << 30), slot_bytes / (1 << 30), bound / (1 << 30),
             rss <= bound ? "ok" : "OVER");
  if (products)
    fmt::print("  peak RSS with the GPU run {:5.2f} GiB (its forward holds up to 4 GiB of slot outputs per chunk, so "
               "each expert's weights cross PCIe once per chunk)\n",
               rss_all / (1 << 30));
  return 0;
}

}  // namespace moecheck::bench
