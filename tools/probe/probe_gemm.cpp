// Compositions of the tensor-core instruction into a block-scaled GEMM (probe_gemm.hpp).
#include "tools/probe/probe_gemm.hpp"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <thread>

#include "reference/counter_rng.hpp"
#include "reference/fp8_formats.hpp"
#include "tools/probe/probe_fit.hpp"

namespace moecheck::probe {

namespace {

constexpr int64_t kBlock = 128;

// Quantizes v (n values) to e4m3 with one float32 scale amax / 448 (the recipe's rule).
float quantize_group(const double* v, int64_t n, uint8_t* codes) {
  double amax = 0;
  for (int64_t i = 0; i < n; ++i) amax = std::max(amax, std::fabs(v[i]));
  const float s = float(std::max(amax, 1e-10) / 448.0);
  for (int64_t i = 0; i < n; ++i) codes[i] = fp8_encode(double(float(v[i]) / s), Fp8Format::e4m3fn);
  return s;
}

}  // namespace

std::vector<GemmProbeCase> default_gemm_probe_cases(uint64_t seed) {
  std::vector<GemmProbeCase> cases;
  for (auto [m, n, k] : {std::tuple<int64_t, int64_t, int64_t>{64, 256, 1024}, {64, 4096, 7168}, {128, 7168, 2048},
                         {16, 2048, 7168}}) {
    GemmProbeCase c;
    c.m = m, c.n = n, c.k = k, c.seed = seed;
    cases.push_back(c);
  }
  return cases;
}

void make_gemm_probe_inputs(GemmProbeCase& c) {
  const int64_t L = c.k / kBlock;
  const CounterRng act{c.seed, 0x6A000 + uint64_t(c.k)}, wt{c.seed, 0x6B000 + uint64_t(c.n)};
  c.a.assign(size_t(c.m * c.k), 0);
  c.w.assign(size_t(c.n * c.k), 0);
  c.sa.assign(size_t(c.m * L), 0);
  c.sw.assign(size_t((c.n / kBlock) * L), 0);
  std::vector<double> row(size_t(c.k));
  for (int64_t m = 0; m < c.m; ++m) {
    const double mag = std::ldexp(1.0, int(m % 7) - 3);  // per-token magnitude
    for (int64_t k = 0; k < c.k; ++k) row[size_t(k)] = mag * act.normal(uint64_t(m * c.k + k));
    for (int64_t b = 0; b < L; ++b) c.sa[size_t(m * L + b)] = quantize_group(&row[size_t(b * kBlock)], kBlock, &c.a[size_t(m * c.k + b * kBlock)]);
  }
  std::vector<double> blk(size_t(kBlock * kBlock));
  std::vector<uint8_t> q(blk.size());
  for (int64_t nb = 0; nb < c.n / kBlock; ++nb)
    for (int64_t b = 0; b < L; ++b) {
      for (int64_t i = 0; i < kBlock; ++i)
        for (int64_t j = 0; j < kBlock; ++j)
          blk[size_t(i * kBlock + j)] = 0.02 * wt.normal(uint64_t(((nb * kBlock + i) * c.k) + b * kBlock + j));
      c.sw[size_t(nb * L + b)] = quantize_group(blk.data(), int64_t(blk.size()), q.data());
      for (int64_t i = 0; i < kBlock; ++i)
        std::copy_n(&q[size_t(i * kBlock)], kBlock, &c.w[size_t((nb * kBlock + i) * c.k + b * kBlock)]);
    }
}

std::vector<GemmCompositionResult> fit_gemm_composition(const GemmProbeCase& c, const TensorCoreModel& instr,
                                                        int threads) {
  const int64_t L = c.k / kBlock;
  // The block sums p_b of every output, from the instruction model (the costly part, done once).
  std::vector<float> p(size_t(c.m * c.n * L));
  parallel_for(c.m, threads, [&](int64_t m) {
    for (int64_t n = 0; n < c.n; ++n)
      for (int64_t b = 0; b < L; ++b)
        p[size_t((m * c.n + n) * L + b)] =
            tc_chain(instr, &c.a[size_t(m * c.k + b * kBlock)], &c.w[size_t(n * c.k + b * kBlock)], 32, 4, 0.0f);
  });
  auto scale = [&](int64_t m, int64_t n, int64_t b) { return c.sa[size_t(m * L + b)] * c.sw[size_t((n / kBlock) * L + b)]; };
  auto ffma_range = [&](int64_t m, int64_t n, int64_t b0, int64_t b1) {
    float acc = 0.0f;
    for (int64_t b = b0; b < b1; ++b) acc = std::fmaf(scale(m, n, b), p[size_t((m * c.n + n) * L + b)], acc);
    return acc;
  };
  std::vector<GemmCompositionResult> out;
  auto score = [&](const std::string& name, auto&& value) {
    std::atomic<int64_t> bad{0};
    parallel_for(c.m, threads, [&](int64_t m) {
      int64_t local = 0;
      for (int64_t n = 0; n < c.n; ++n)
        if (value(m, n) != c.d[size_t(m * c.n + n)]) ++local;
      bad += local;
    });
    out.push_back({name, bad.load(), c.m * c.n});
  };
  score("ffma", [&](int64_t m, int64_t n) { return ffma_range(m, n, 0, L); });
  score("mul-add", [&](int64_t m, int64_t n) {
    float acc = 0.0f;
    for (int64_t b = 0; b < L; ++b) {
      volatile float t = scale(m, n, b) * p[size_t((m * c.n + n) * L + b)];  // two roundings: no contraction
      acc = acc + t;
    }
    return acc;
  });
  for (int64_t s : {2, 3, 4, 7, 8}) {
    if (s > L) continue;
    score("split-K " + std::to_string(s), [&, s](int64_t m, int64_t n) {
      float total = 0.0f;
      for (int64_t i = 0; i < s; ++i) total += ffma_range(m, n, L * i / s, L * (i + 1) / s);
      return total;
    });
  }
  std::stable_sort(out.begin(), out.end(), [](const auto& x, const auto& y) { return x.mismatches < y.mismatches; });
  return out;
}

}  // namespace moecheck::probe

#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "golden/interrupt.hpp"
#include "reference/errors.hpp"

namespace moecheck::probe {

void write_gemm_dump(const std::string& dir, const std::vector<GemmProbeCase>& cases) {
  std::filesystem::create_directories(dir);
  nlohmann::json j = nlohmann::json::array();
  const std::string bin = dir + "/probe-gemm.bin";
  interrupt::ScratchPath scratch(bin + ".tmp");
  std::ofstream out(bin + ".tmp", std::ios::binary);
  for (const GemmProbeCase& c : cases) {
    out.write(reinterpret_cast<const char*>(c.d.data()), std::streamsize(c.d.size() * sizeof(float)));
    j.push_back({{"m", c.m}, {"n", c.n}, {"k", c.k}, {"seed", c.seed}, {"algo", c.algo}});
  }
  out.close();
  if (!out) throw InputError(bin, "", "cannot write the GEMM probe outputs");
  std::filesystem::rename(bin + ".tmp", bin);
  scratch.release();
  std::ofstream(dir + "/probe-gemm.json") << j.dump(1) << "\n";
}

std::vector<GemmProbeCase> read_gemm_dump(const std::string& dir) {
  const std::string mpath = dir + "/probe-gemm.json", bin = dir + "/probe-gemm.bin";
  if (!std::filesystem::exists(mpath)) return {};
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(std::ifstream(mpath));
  } catch (const std::exception& e) {
    throw InputError(mpath, "", std::string("not valid JSON: ") + e.what());
  }
  std::ifstream in(bin, std::ios::binary);
  if (!in) throw InputError(bin, "", "cannot open the GEMM probe outputs");
  std::vector<GemmProbeCase> cases;
  for (const auto& e : j) {
    GemmProbeCase c;
    c.m = e.at("m"), c.n = e.at("n"), c.k = e.at("k"), c.seed = e.at("seed"), c.algo = e.at("algo");
    make_gemm_probe_inputs(c);
    c.d.resize(size_t(c.m * c.n));
    in.read(reinterpret_cast<char*>(c.d.data()), std::streamsize(c.d.size() * sizeof(float)));
    if (!in) throw InputError(bin, "", "fewer outputs than probe-gemm.json lists");
    cases.push_back(std::move(c));
  }
  return cases;
}

}  // namespace moecheck::probe
