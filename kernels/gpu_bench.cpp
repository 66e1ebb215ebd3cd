// Timing of the GPU backends (contract: gpu_bench.hpp): the synthetic layer is filled on the
// device (bench_fill.cu), then each batch size is run and timed with CUDA events.
#include "kernels/gpu_bench.hpp"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <functional>
#include <memory>
#include <set>
#include <string>
#include <type_traits>
#include <vector>

#include "kernels/bench_fill.hpp"
#include "kernels/cublaslt_moe.hpp"
#include "kernels/cuda_check.hpp"
#include "kernels/device_buffer.hpp"
#include "kernels/fp8_block_scale_moe.hpp"
#include "reference/errors.hpp"

namespace moecheck::kernels {

namespace {

struct Events {
  std::vector<cudaEvent_t> e;
  cudaEvent_t get(size_t i) {
    while (e.size() <= i) {
      cudaEvent_t x;
      MOECHECK_CUDA_CHECK(cudaEventCreate(&x));
      e.push_back(x);
    }
    return e[i];
  }
  ~Events() {
    for (auto x : e) cudaEventDestroy(x);
  }
};

// One forward pass captured as a CUDA graph (what engines replay for decode steps), or the reason
// the capture failed (then only stream launches are timed).
struct CapturedGraph {
  cudaGraphExec_t exec = nullptr;
  std::string failed;
  CapturedGraph() = default;
  CapturedGraph(const CapturedGraph&) = delete;
  CapturedGraph& operator=(const CapturedGraph&) = delete;
  ~CapturedGraph() {
    if (exec) cudaGraphExecDestroy(exec);
  }
};

void capture_graph(cudaStream_t s, const std::function<void()>& enqueue, CapturedGraph& g) {
  MOECHECK_CUDA_CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
  std::string why;
  try {
    enqueue();
  } catch (const std::exception& e) {
    why = e.what();
  }
  cudaGraph_t graph = nullptr;
  const cudaError_t end = cudaStreamEndCapture(s, &graph);
  if (why.empty() && end != cudaSuccess) why = std::string("cudaStreamEndCapture: ") + cudaGetErrorString(end);
  if (why.empty()) {
    const cudaError_t inst = cudaGraphInstantiate(&g.exec, graph, 0);
    if (inst != cudaSuccess) why = std::string("cudaGraphInstantiate: ") + cudaGetErrorString(inst);
  }
  if (graph) cudaGraphDestroy(graph);
  if (!why.empty()) {
    (void)cudaGetLastError();  // a failed capture leaves a non-sticky error behind
    g.exec = nullptr;
    g.failed = why;
  }
}

double median_of(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}
double quantile_of(std::vector<double> v, double q) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<size_t>(q * static_cast<double>(v.size())))];
}

// Device-to-device copy rate: (read + write bytes) / time, median of 10 copies of 1 GiB.
double measure_copy_gbs(cudaStream_t s) {
  const size_t n = size_t{1} << 30;
  DeviceBuffer a(n), b(n);
  MOECHECK_CUDA_CHECK(cudaMemsetAsync(a.p, 1, n, s));
  Events ev;
  std::vector<double> ms;
  for (int i = 0; i < 12; ++i) {
    MOECHECK_CUDA_CHECK(cudaEventRecord(ev.get(0), s));
    MOECHECK_CUDA_CHECK(cudaMemcpyAsync(b.p, a.p, n, cudaMemcpyDeviceToDevice, s));
    MOECHECK_CUDA_CHECK(cudaEventRecord(ev.get(1), s));
    MOECHECK_CUDA_CHECK(cudaEventSynchronize(ev.get(1)));
    float t = 0;
    MOECHECK_CUDA_CHECK(cudaEventElapsedTime(&t, ev.get(0), ev.get(1)));
    if (i >= 2) ms.push_back(t);
  }
  return 2.0 * static_cast<double>(n) / (median_of(ms) * 1e-3) / 1e9;
}

}  // namespace

GpuBenchResult run_gpu_bench(const GpuBenchOptions& o, const std::function<void(const std::string&)>& progress) {
  const GpuInfo info = probe_gpu();
  if (!info.usable) throw InputError("", "--backend", info.why);
  const MoeConfig& c = o.config;
  if (o.tokens.empty()) throw InputError("", "--tokens", "give at least one batch size");
  const int64_t T_max = *std::max_element(o.tokens.begin(), o.tokens.end());
  const int64_t H = c.hidden_size, I = c.intermediate_size, E = c.num_experts, El = c.local_experts(), k = c.top_k;
  const size_t w13_n = size_t(2 * I * H) * El, w2_n = size_t(H * I) * El;
  const size_t s13_n = size_t(2 * I / 128) * (H / 128) * El, s2_n = size_t(H / 128) * (I / 128) * El;
  const double expert_bytes = double(2 * I * H + H * I) + 4.0 * double((2 * I / 128) * (H / 128) + (H / 128) * (I / 128));

  GpuBenchResult res;
  res.device = info.device;
  res.backend = o.backend == GpuBackend::cuda ? "cuda" : "cublaslt";
  res.weight_gib = expert_bytes * double(El) / double(1 << 30);
  int dev = 0, l2 = 0;
  MOECHECK_CUDA_CHECK(cudaGetDevice(&dev));
  MOECHECK_CUDA_CHECK(cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, dev));
  res.l2_bytes = l2;

  cudaStream_t s = nullptr;
  MOECHECK_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  std::unique_ptr<std::remove_pointer_t<cudaStream_t>, void (*)(cudaStream_t)> stream_guard(s, [](cudaStream_t x) { cudaStreamDestroy(x); });

  progress("measuring the device-to-device copy rate (1 GiB copies)");
  res.hbm_copy_gbs = measure_copy_gbs(s);

  progress("filling the layer on the device: " + std::to_string(El) + " experts, " +
           std::to_string(res.weight_gib).substr(0, 5) + " GiB of FP8 weights and scales");
  DeviceBuffer w13(w13_n), w2(w2_n), s13(4 * s13_n), s2(4 * s2_n);
  // Block scales ~2^-7: dequantized weights of order 448 / 128 ~ 3.5 at most, outputs O(10-100)
  // on the normal-ish inputs below, far from float32 or bf16 overflow.
  fill_fp8(w13.p, w13_n, o.seed * 8 + 1);
  fill_fp8(w2.p, w2_n, o.seed * 8 + 2);
  fill_float(s13.p, s13_n, o.seed * 8 + 3, 1.0f / 128, true);
  fill_float(s2.p, s2_n, o.seed * 8 + 4, 1.0f / 128, true);
  // The cuda backend reads its own weight layout (made once, not timed); cublaslt the row-major one.
  // Packed on the default stream, after the fills there (s does not wait for that stream).
  const bool tiles = o.backend == GpuBackend::cuda;
  std::unique_ptr<DeviceBuffer> t13, t2;
  if (tiles) {
    t13 = std::make_unique<DeviceBuffer>(w13_n), t2 = std::make_unique<DeviceBuffer>(w2_n);
    launch_pack_layer_weight_tiles(c, w13.as<uint8_t>(), w2.as<uint8_t>(), t13->as<uint8_t>(), t2->as<uint8_t>(),
                                   nullptr);
  }
  const int sets = std::max(1, o.input_sets);
  DeviceBuffer hidden(2 * size_t(T_max * H) * sets), logits(4 * size_t(T_max * E) * sets),
      bias(o.routing_bias ? 4 * size_t(E) : 0), out(2 * size_t(T_max * H));
  fill_bf16(hidden.p, size_t(T_max * H) * sets, o.seed * 8 + 5);
  fill_float(logits.p, size_t(T_max * E) * sets, o.seed * 8 + 6, 1.0f, false);
  if (o.routing_bias) fill_float(bias.p, size_t(E), o.seed * 8 + 7, 0.1f, false);
  const size_t flush_n = std::max<size_t>(size_t(2) * l2, size_t(256) << 20);
  DeviceBuffer flush(flush_n);
  MOECHECK_CUDA_CHECK(cudaMemset(flush.p, 0, flush.bytes));  // its values do not matter; defined all the same
  DeviceBuffer sink(4);
  // Before each timed run the L2 is filled with clean lines of `flush` by reading it: the run then
  // finds none of its weights in L2 and owes no write-back of the previous run's lines. A memset
  // flush would leave the L2 full of dirty lines for the layer's first reads to write back, a
  // cost an engine's decode step does not pay (4% of T = 1's time on the H100).
  auto evict_l2 = [&] { read_through(flush.p, flush.bytes, sink.as<uint32_t>(), s); };
  MOECHECK_CUDA_CHECK(cudaDeviceSynchronize());

  std::unique_ptr<MoeWorkspace> ws_cuda;
  std::unique_ptr<CublasLtMoeWorkspace> ws_lt;
  if (o.backend == GpuBackend::cuda)
    ws_cuda = std::make_unique<MoeWorkspace>(c, T_max);
  else
    ws_lt = std::make_unique<CublasLtMoeWorkspace>(c, T_max);
  const MoeBuffers& buf = ws_cuda ? ws_cuda->buffers() : ws_lt->buffers();

  Events ev;
  std::vector<std::string> stage_names;
  size_t marks = 0;
  bool recording = false;
  StageHook hook = [&](const char* stage, cudaStream_t st) {
    if (!recording) return;
    if (stage_names.size() <= marks) stage_names.push_back(stage);
    MOECHECK_CUDA_CHECK(cudaEventRecord(ev.get(1 + marks), st));
    ++marks;
  };
  if (ws_cuda) ws_cuda->set_stage_hook(hook);
  if (ws_lt) ws_lt->set_stage_hook(hook);

  auto run_once = [&](int64_t T, int set) {
    Fp8BlockScaleMoeInputs in;
    in.routing_logits = logits.as<float>() + size_t(set) * T_max * E;
    in.routing_bias = o.routing_bias ? bias.as<float>() : nullptr;
    in.hidden_states_bf16 = hidden.as<uint16_t>() + size_t(set) * T_max * H;
    in.gemm1_weights = w13.as<uint8_t>(), in.gemm1_weights_scale = s13.as<float>();
    in.gemm2_weights = w2.as<uint8_t>(), in.gemm2_weights_scale = s2.as<float>();
    if (tiles) {
      in.gemm1_weights = t13->as<uint8_t>(), in.gemm2_weights = t2->as<uint8_t>();
      in.weight_layout = WeightLayout::block_tiles;
    }
    in.num_tokens = T;
    Fp8BlockScaleMoeOutputs ou;
    ou.output = out.as<uint16_t>();
    if (ws_cuda)
      fp8_block_scale_moe_from_bf16(c, in, ou, *ws_cuda, s);
    else
      cublaslt_fp8_block_scale_moe_from_bf16(c, in, ou, *ws_lt, s);
  };

  for (const int64_t T : o.tokens) {
    GpuBenchRow row;
    row.tokens = T;
    stage_names.clear();  // the stages depend on T (the small-batch prologue takes three's place)
    // Warm-up, and the routing of each input set (slots and experts hit).
    MOECHECK_CUDA_CHECK(cudaMemsetAsync(out.p, 0xFF, out.bytes, s));  // NaN: an unwritten element shows
    double slots = 0, hit = 0;
    for (int set = 0; set < sets; ++set) {
      for (int w = 0; w < std::max(1, o.warmup); ++w) run_once(T, set);
      std::vector<int32_t> ids(size_t(T * k));
      MOECHECK_CUDA_CHECK(cudaMemcpyAsync(ids.data(), buf.topk_ids, 4 * ids.size(), cudaMemcpyDeviceToHost, s));
      MOECHECK_CUDA_CHECK(cudaStreamSynchronize(s));
      std::set<int32_t> experts;
      for (int32_t id : ids)
        if (id >= c.local_expert_offset && id < c.local_expert_offset + El) experts.insert(id), slots += 1;
      hit += double(experts.size());
    }
    row.slots = static_cast<int64_t>(std::llround(slots / sets));
    row.experts_hit = hit / sets;
    // The same pass of each input set as one CUDA graph (no stage marks inside).
    std::vector<std::unique_ptr<CapturedGraph>> graphs;
    for (int set = 0; set < sets && row.graph_failed.empty(); ++set) {
      graphs.push_back(std::make_unique<CapturedGraph>());
      capture_graph(s, [&] { run_once(T, set); }, *graphs.back());
      row.graph_failed = graphs.back()->failed;
    }
    if (!row.graph_failed.empty()) graphs.clear();

    std::vector<double> total, total_graph;
    std::vector<std::vector<double>> per_stage;
    const auto t0 = std::chrono::steady_clock::now();
    for (int it = 0; it < o.max_iters; ++it) {
      const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      if (it >= o.min_iters && elapsed >= o.min_seconds) break;
      evict_l2();
      MOECHECK_CUDA_CHECK(cudaEventRecord(ev.get(0), s));
      marks = 0;
      recording = true;
      run_once(T, it % sets);
      recording = false;
      MOECHECK_CUDA_CHECK(cudaEventSynchronize(ev.get(marks)));
      float ms = 0;
      MOECHECK_CUDA_CHECK(cudaEventElapsedTime(&ms, ev.get(0), ev.get(marks)));
      total.push_back(ms);
      per_stage.resize(std::max(per_stage.size(), marks));
      for (size_t m = 0; m < marks; ++m) {
        MOECHECK_CUDA_CHECK(cudaEventElapsedTime(&ms, ev.get(m), ev.get(m + 1)));
        per_stage[m].push_back(ms);
      }
      if (!graphs.empty()) {  // the graph replay of the same set, after its own L2 flush
        evict_l2();
        MOECHECK_CUDA_CHECK(cudaEventRecord(ev.get(0), s));
        MOECHECK_CUDA_CHECK(cudaGraphLaunch(graphs[size_t(it % sets)]->exec, s));
        MOECHECK_CUDA_CHECK(cudaEventRecord(ev.get(1), s));
        MOECHECK_CUDA_CHECK(cudaEventSynchronize(ev.get(1)));
        MOECHECK_CUDA_CHECK(cudaEventElapsedTime(&ms, ev.get(0), ev.get(1)));
        total_graph.push_back(ms);
      }
      row.iters = it + 1;
    }
    row.median_ms = median_of(total);
    row.p10_ms = quantile_of(total, 0.1);
    row.p90_ms = quantile_of(total, 0.9);
    if (!total_graph.empty()) {
      row.graph_median_ms = median_of(total_graph);
      row.graph_p10_ms = quantile_of(total_graph, 0.1);
      row.graph_p90_ms = quantile_of(total_graph, 0.9);
    }
    for (size_t m = 0; m < per_stage.size() && m < stage_names.size(); ++m)
      row.stages.push_back({stage_names[m], median_of(per_stage[m])});
    row.flops = 2.0 * double(row.slots) * double(2 * I * H + H * I);
    row.min_bytes = row.experts_hit * expert_bytes + double(T) * (2.0 * H + 4.0 * E + 2.0 * H);

    // The last run's output: finite, nonzero norm (CUTLASS testbeds' check).
    std::vector<uint16_t> o16(size_t(T * H));
    MOECHECK_CUDA_CHECK(cudaMemcpyAsync(o16.data(), out.p, 2 * o16.size(), cudaMemcpyDeviceToHost, s));
    MOECHECK_CUDA_CHECK(cudaStreamSynchronize(s));
    int64_t nonfinite = 0;
    double norm2 = 0;
    for (uint16_t b : o16) {
      if ((b & 0x7F80) == 0x7F80) {
        ++nonfinite;
        continue;
      }
      uint32_t u = uint32_t(b) << 16;
      float f;
      std::memcpy(&f, &u, 4);
      norm2 += double(f) * f;
    }
    row.output_ok = nonfinite == 0 && norm2 > 0;
    row.output_check = nonfinite ? std::to_string(nonfinite) + " non-finite elements"
                                 : (norm2 > 0 ? "finite, rms " + std::to_string(std::sqrt(norm2 / double(T * H)))
                                              : "all zero");
    if (ws_lt)
      for (const auto& a : ws_lt->last_algorithms())
        row.algorithms += (row.algorithms.empty() ? "" : "; ") + std::string("gemm") + std::to_string(a.gemm) +
                          " m=" + std::to_string(a.m) + " x" + std::to_string(a.experts) + ": " + a.algo;
    progress("T=" + std::to_string(T) + ": " + std::to_string(row.iters) + " runs, median " +
             std::to_string(row.median_ms) + " ms" +
             (row.graph_failed.empty() ? ", as a CUDA graph " + std::to_string(row.graph_median_ms) + " ms"
                                       : ", no CUDA graph: " + row.graph_failed));
    res.rows.push_back(std::move(row));
  }
  if (ws_cuda) ws_cuda->set_stage_hook({});
  if (ws_lt) ws_lt->set_stage_hook({});
  return res;
}

}  // namespace moecheck::kernels
