// Model fit and check for `moecheck probe` (probe_fit.hpp).
#include "tools/probe/probe_fit.hpp"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <list>
#include <map>
#include <thread>

#include <nlohmann/json.hpp>

#include "golden/interrupt.hpp"
#include "reference/errors.hpp"

namespace moecheck::probe {

namespace {

using kernels::kProbeTileM;
using kernels::kProbeTileN;
constexpr int64_t kPerTile = kProbeTileM * kProbeTileN;

uint32_t bits_of(float x) {
  uint32_t u;
  std::memcpy(&u, &x, 4);
  return u;
}

float model_output(const TensorCoreModel& model, const ProbeRun& run, int64_t i) {
  const kernels::ProbeTiles& t = run.tiles;
  const int64_t tile = i / kPerTile, m = (i % kPerTile) / kProbeTileN, n = i % kProbeTileN;
  const int64_t K = t.k();
  return tc_chain(model, &t.a[(tile * kProbeTileM + m) * K], &t.b[(tile * kProbeTileN + n) * K],
                  kernels::kProbeInstrK, t.nk, t.c[i]);
}

}  // namespace

void parallel_for(int64_t n, int threads, const std::function<void(int64_t)>& f) {
  threads = std::max(1, std::min<int>(threads, int(std::max<int64_t>(1, n))));
  std::atomic<int64_t> next{0};
  std::vector<std::thread> pool;
  for (int w = 0; w < threads; ++w)
    pool.emplace_back([&] {
      for (int64_t i; (i = next.fetch_add(1)) < n;) f(i);
    });
  for (auto& th : pool) th.join();
}

Mismatches check_model(const TensorCoreModel& model, const ProbeRun& run, int64_t stride, int64_t stop_after) {
  Mismatches r;
  const int64_t n = int64_t(run.d.size());
  for (int64_t i = 0; i < n; i += stride) {
    const float want = model_output(model, run, i), got = run.d[i];
    ++r.checked;
    if (bits_of(want) == bits_of(got)) continue;
    if (want == got) {
      ++r.zero_sign;  // +0 vs -0
      continue;
    }
    if (r.first < 0) r.first = i;
    if (++r.values > stop_after && stop_after > 0) break;
  }
  return r;
}

std::vector<TensorCoreModel> candidate_models() {
  using M = TensorCoreModel;
  std::vector<M> out;
  for (int group : {32, 16, 8, 4})
    for (int frac = 8; frac <= 30; ++frac)
      for (M::Exponent ex : {M::Exponent::field_sum, M::Exponent::exact})
        for (M::Cut cut : {M::Cut::toward_zero, M::Cut::toward_minus_inf})
          for (bool c_aligned : {true, false})
            for (int out_bits = 24; out_bits >= 12; --out_bits)
              for (int mode = 0; mode < 3; ++mode) {
                M m;
                m.group = group;
                m.frac_bits = frac;
                m.exponent = ex;
                m.cut = cut;
                m.c_aligned = c_aligned;
                m.out_bits = out_bits;
                m.out_cut = mode == 1 ? M::Cut::toward_minus_inf : M::Cut::toward_zero;
                m.out_nearest = mode == 2;
                out.push_back(m);
              }
  return out;
}

FitResult fit_model(const std::vector<ProbeRun>& runs, int threads) {
  const std::vector<TensorCoreModel> cands = candidate_models();
  // Screen: about 256 outputs of each run, a candidate dropped after 64 mismatches (enough to
  // rank near misses when no candidate reproduces the hardware).
  std::vector<int64_t> screen(cands.size(), 0);
  parallel_for(int64_t(cands.size()), threads, [&](int64_t c) {
    int64_t bad = 0;
    for (const ProbeRun& r : runs) {
      const int64_t stride = std::max<int64_t>(1, int64_t(r.d.size()) / 256) | 1;
      bad += check_model(cands[c], r, stride, 64).values;
      if (bad > 64) break;
    }
    screen[c] = bad;
  });
  std::vector<size_t> order(cands.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(), [&](size_t x, size_t y) { return screen[x] < screen[y]; });
  // Check: the best 24 of the screen on every output.
  const size_t top = std::min<size_t>(24, order.size());
  std::vector<int64_t> full(top, 0);
  int64_t checked = 0;
  for (const ProbeRun& r : runs) checked += int64_t(r.d.size());
  for (size_t j = 0; j < top; ++j) {
    std::atomic<int64_t> bad{0};
    for (const ProbeRun& r : runs) {
      const int64_t chunks = (int64_t(r.d.size()) + 4095) / 4096;
      parallel_for(chunks, threads, [&](int64_t ch) {
        int64_t local = 0;
        for (int64_t i = ch * 4096; i < std::min<int64_t>(int64_t(r.d.size()), (ch + 1) * 4096); ++i) {
          const float want = model_output(cands[order[j]], r, i);
          if (want != r.d[i] && !(std::isnan(want) && std::isnan(r.d[i]))) ++local;
        }
        bad += local;
      });
    }
    full[j] = bad;
  }
  FitResult res;
  res.checked = checked;
  res.searched = int64_t(cands.size());
  size_t best = 0;
  for (size_t j = 0; j < top; ++j) {
    if (full[j] == 0) res.exact.push_back(cands[order[j]]);
    if (full[j] < full[best]) best = j;
  }
  res.best = cands[order[best]];
  res.best_mismatches = full[best];
  return res;
}

uint64_t probe_input_hash(const kernels::ProbeTiles& t) {
  uint64_t h = 1469598103934665603ull;
  auto mix = [&](const void* p, size_t n) {
    const auto* b = static_cast<const uint8_t*>(p);
    for (size_t i = 0; i < n; ++i) h = (h ^ b[i]) * 1099511628211ull;
  };
  mix(t.a.data(), t.a.size());
  mix(t.b.data(), t.b.size());
  mix(t.c.data(), t.c.size() * sizeof(float));
  return h;
}

void write_probe_dump(const std::string& dir, uint64_t seed, const std::vector<ProbeRun>& runs) {
  std::filesystem::create_directories(dir);
  nlohmann::json manifest = {{"seed", seed}, {"format", "moecheck probe dump 1"}, {"runs", nlohmann::json::array()}};
  // One file per instruction form, the families' outputs one after another.
  std::map<std::string, int64_t> offsets;
  std::map<std::string, std::ofstream> files;
  std::list<interrupt::ScratchPath> scratch;  // the .tmp files until renamed
  for (const ProbeRun& r : runs) {
    const std::string file =
        std::string("probe-") + (r.instruction == kernels::ProbeInstruction::wgmma ? "wgmma" : "mma-sync") + ".bin";
    auto it = files.find(file);
    if (it == files.end()) {
      scratch.emplace_back(dir + "/" + file + ".tmp");
      it = files.emplace(file, std::ofstream(scratch.back().path(), std::ios::binary)).first;
    }
    it->second.write(reinterpret_cast<const char*>(r.d.data()), std::streamsize(r.d.size() * sizeof(float)));
    if (!it->second) throw InputError(dir + "/" + file + ".tmp", "", "cannot write the probe dump");
    manifest["runs"].push_back({{"file", file},
                                {"offset", offsets[file]},
                                {"instruction", kernels::probe_instruction_name(r.instruction)},
                                {"family", r.family.name},
                                {"nk", r.family.nk},
                                {"tiles", r.family.tiles},
                                {"input_hash", probe_input_hash(r.tiles)}});
    offsets[file] += int64_t(r.d.size());
  }
  for (auto& [file, out] : files) {
    out.close();
    std::filesystem::rename(dir + "/" + file + ".tmp", dir + "/" + file);
  }
  for (interrupt::ScratchPath& s : scratch) s.release();
  std::ofstream(dir + "/probe-manifest.json") << manifest.dump(1) << "\n";
}

std::vector<ProbeRun> read_probe_dump(const std::string& dir, uint64_t* seed) {
  const std::string mpath = dir + "/probe-manifest.json";
  std::ifstream in(mpath);
  if (!in) throw InputError(mpath, "", "cannot open the probe manifest");
  nlohmann::json manifest;
  try {
    manifest = nlohmann::json::parse(in);
  } catch (const std::exception& e) {
    throw InputError(mpath, "", std::string("not valid JSON: ") + e.what());
  }
  const uint64_t s = manifest.at("seed").get<uint64_t>();
  if (seed) *seed = s;
  std::vector<ProbeRun> runs;
  for (const auto& j : manifest.at("runs")) {
    ProbeRun r;
    r.family = {j.at("family").get<std::string>(), j.at("nk").get<int>(), j.at("tiles").get<int64_t>()};
    r.instruction = j.at("instruction").get<std::string>().rfind("wgmma", 0) == 0 ? kernels::ProbeInstruction::wgmma
                                                                                  : kernels::ProbeInstruction::mma_sync;
    r.tiles = make_probe_tiles(r.family, s);
    const std::string path = dir + "/" + j.at("file").get<std::string>();
    if (probe_input_hash(r.tiles) != j.at("input_hash").get<uint64_t>())
      throw InputError(path, "input_hash", "the regenerated test vectors differ from those the dump was made from");
    r.d.resize(r.tiles.c.size());
    std::ifstream f(path, std::ios::binary);
    f.seekg(std::streamoff(j.at("offset").get<int64_t>() * int64_t(sizeof(float))));
    f.read(reinterpret_cast<char*>(r.d.data()), std::streamsize(r.d.size() * sizeof(float)));
    if (!f) throw InputError(path, r.family.name, "expected " + std::to_string(r.d.size()) + " float32 outputs at offset " +
                                                      std::to_string(j.at("offset").get<int64_t>()));
    runs.push_back(std::move(r));
  }
  return runs;
}

}  // namespace moecheck::probe
