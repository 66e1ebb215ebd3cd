// Helpers for the case-format tests (see golden_test_support.hpp).
#include "tests/golden_test_support.hpp"

#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <csignal>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <thread>

#include "reference/fp8_quant.hpp"

namespace moecheck::test {

TempDir::TempDir(const std::string& tag) {
  static std::atomic<int> counter{0};
  path_ = std::filesystem::temp_directory_path() /
          ("moecheck-golden-" + std::to_string(::getpid()) + "-" + std::to_string(counter++) + "-" + tag);
  std::filesystem::remove_all(path_);
  std::filesystem::create_directories(path_);
}

TempDir::~TempDir() {
  if (std::getenv("MOECHECK_KEEP_TEMP")) return;
  std::error_code ec;
  std::filesystem::remove_all(path_, ec);
}

SmallCase small_case() {
  SmallCase s;
  CaseHeader& h = s.header;
  MoeConfig& c = h.config;
  c.num_experts = 8;
  c.top_k = 2;
  c.hidden_size = 160;
  c.intermediate_size = 96;
  c.routing = RoutingMethod::deepseek_v3;
  c.n_group = 2;
  c.topk_group = 1;
  c.routed_scaling_factor = 2.5;
  h.tokens = 5;
  h.description = "small test case";
  h.source = "tests/golden_test_support.cpp";
  h.hidden_dtype = Precision::bf16;
  h.hidden_fp8 = true;
  h.routing_bias = true;
  const int64_t T = h.tokens, H = c.hidden_size, I = c.intermediate_size, E = c.num_experts, B = c.weight_block;
  const int64_t G = ceil_div(H, c.group_size);
  // Small integers over powers of two: exact in bf16, float32 and every decoding.
  for (int64_t i = 0; i < T * H; ++i) s.hidden.push_back(float((i * 37) % 29 - 14) / 8.0f);
  for (int64_t i = 0; i < T * H; ++i) s.hidden_fp8.push_back(uint8_t(((i * 11) % 126) | (i % 4 == 0 ? 0x80 : 0)));
  for (int64_t i = 0; i < T * G; ++i) s.hidden_scale.push_back(std::ldexp(1.0f, -3 - int(i % 3)));
  for (int64_t i = 0; i < T * E; ++i) s.logits.push_back(float((i * 13) % 17 - 8) / 4.0f);
  for (int64_t e = 0; e < E; ++e) s.bias.push_back(float(e % 3) / 8.0f - 0.125f);
  for (int64_t slot = 0; slot < E; ++slot) {
    ExpertWeights w;
    w.expert = slot;
    auto codes = [&](int64_t n, int64_t salt) {
      std::vector<uint8_t> q(static_cast<size_t>(n));
      for (int64_t i = 0; i < n; ++i) q[size_t(i)] = uint8_t(((i * 13 + slot + salt) % 126) | (i % 5 == 0 ? 0x80 : 0));
      return q;
    };
    auto scales = [&](int64_t n, int64_t salt) {
      std::vector<float> v(static_cast<size_t>(n));
      for (int64_t i = 0; i < n; ++i) v[size_t(i)] = std::ldexp(1.0f, -6 - int((i + slot + salt) % 5));
      return v;
    };
    w.w13 = codes(2 * I * H, 0);
    w.w13_scale = scales(ceil_div(2 * I, B) * ceil_div(H, B), 0);
    w.w2 = codes(H * I, 7);
    w.w2_scale = scales(ceil_div(H, B) * ceil_div(I, B), 3);
    s.experts.push_back(std::move(w));
  }
  return s;
}

void write_case(const std::string& path, const SmallCase& s) {
  CaseWriter w(path, s.header);
  w.write_hidden_states(s.hidden);
  if (s.header.hidden_fp8) w.write_hidden_fp8(s.hidden_fp8, s.hidden_scale);
  w.write_router_logits(s.logits);
  if (s.header.routing_bias) w.write_routing_bias(s.bias);
  for (size_t slot = 0; slot < s.experts.size(); ++slot) w.write_expert(int64_t(slot), s.experts[slot]);
  w.commit();
}

void mutate(const std::string& path, const std::function<void(H5::H5File&)>& f) {
  H5::Exception::dontPrint();
  H5::H5File file(path, H5F_ACC_RDWR);
  f(file);
  file.close();
}

void set_attr(const H5::H5Object& o, const std::string& name, const std::string& v) {
  if (o.attrExists(name)) o.removeAttr(name);
  H5::StrType st(H5::PredType::C_S1, H5T_VARIABLE);
  o.createAttribute(name, st, H5::DataSpace(H5S_SCALAR)).write(st, v);
}

void set_attr(const H5::H5Object& o, const std::string& name, int64_t v) {
  if (o.attrExists(name)) o.removeAttr(name);
  o.createAttribute(name, H5::PredType::STD_I64LE, H5::DataSpace(H5S_SCALAR)).write(H5::PredType::NATIVE_INT64, &v);
}

void set_attr(const H5::H5Object& o, const std::string& name, double v) {
  if (o.attrExists(name)) o.removeAttr(name);
  o.createAttribute(name, H5::PredType::IEEE_F64LE, H5::DataSpace(H5S_SCALAR)).write(H5::PredType::NATIVE_DOUBLE, &v);
}

void unlink(H5::H5File& f, const std::string& path) { f.unlink(path); }

void replace_dataset(H5::H5File& f, const std::string& path, const H5::PredType& type, const std::vector<hsize_t>& dims,
                     double fill) {
  if (f.nameExists(path)) f.unlink(path);
  hsize_t n = 1;
  for (hsize_t d : dims) n *= d;
  H5::DataSet ds = f.createDataSet(path, type, H5::DataSpace(int(dims.size()), dims.data()));
  if (n > 0) {
    std::vector<double> v(n, fill);
    ds.write(v.data(), H5::PredType::NATIVE_DOUBLE);
  }
}

void poke_float(H5::H5File& f, const std::string& path, size_t index, float value) {
  H5::DataSet ds = f.openDataSet(path);
  std::vector<float> v(size_t(ds.getSpace().getSimpleExtentNpoints()));
  ds.read(v.data(), H5::PredType::NATIVE_FLOAT);
  v.at(index) = value;
  ds.write(v.data(), H5::PredType::NATIVE_FLOAT);
}

void poke_byte(H5::H5File& f, const std::string& path, size_t index, uint8_t value) {
  H5::DataSet ds = f.openDataSet(path);
  std::vector<uint8_t> v(size_t(ds.getSpace().getSimpleExtentNpoints()));
  ds.read(v.data(), H5::PredType::NATIVE_UINT8);
  v.at(index) = value;
  ds.write(v.data(), H5::PredType::NATIVE_UINT8);
}

namespace {
std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}
}  // namespace

void for_each_mutation(const std::vector<uint8_t>& seed, int count, const CounterRng& rng, uint64_t* draw,
                       const std::function<void(const std::vector<uint8_t>&)>& f) {
  for (int m = 0; m < count && !seed.empty(); ++m) {
    std::vector<uint8_t> b = seed;
    const int edits = 1 + int(rng.bits((*draw)++) % 4);
    for (int k = 0; k < edits; ++k) {
      const size_t at = rng.bits((*draw)++) % b.size();
      b[at] = uint8_t(rng.bits((*draw)++));
    }
    f(b);
  }
}

RunResult run_process(const std::vector<std::string>& argv) {
  return run_process_interrupted(argv, 0, nullptr, nullptr);
}

RunResult run_process_interrupted(const std::vector<std::string>& argv, int sig,
                                  const std::function<bool(const std::string& out)>& ready, bool* sent,
                                  double timeout_s) {
  if (argv.empty()) throw std::invalid_argument("run_process: empty argv");
  TempDir io("run");
  const std::string out = io.file("stdout"), err = io.file("stderr");
  const pid_t pid = ::fork();
  if (pid < 0) throw std::runtime_error("run_process: fork failed");
  if (pid == 0) {
    const int o = ::open(out.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    const int e = ::open(err.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    const int in = ::open("/dev/null", O_RDONLY);
    if (o < 0 || e < 0 || in < 0) ::_exit(126);
    ::dup2(in, 0);
    ::dup2(o, 1);
    ::dup2(e, 2);
    std::vector<char*> args;
    for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    ::execv(args[0], args.data());
    ::_exit(127);
  }
  int status = 0;
  bool ended = false;
  if (sent) *sent = false;
  if (ready) {
    const auto t0 = std::chrono::steady_clock::now();
    while (!(ended = ::waitpid(pid, &status, WNOHANG) == pid)) {
      if (ready(slurp(out))) {
        ::kill(pid, sig);
        if (sent) *sent = true;
        break;
      }
      if (std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() > timeout_s) {
        ::kill(pid, SIGKILL);
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
  }
  if (!ended) ::waitpid(pid, &status, 0);
  RunResult r;
  if (WIFEXITED(status)) r.exit_code = WEXITSTATUS(status);
  if (WIFSIGNALED(status)) r.signal = WTERMSIG(status);
  r.out = slurp(out);
  r.err = slurp(err);
  return r;
}

std::string binary(const std::string& name) {
  const char* dir = std::getenv("MOECHECK_BINARY_DIR");
  if (!dir) throw std::runtime_error("MOECHECK_BINARY_DIR is not set (run the tests through ctest)");
  return (std::filesystem::path(dir) / name).string();
}

std::string source_path(const std::string& rel) {
  const char* dir = std::getenv("MOECHECK_SOURCE_DIR");
  if (!dir) throw std::runtime_error("MOECHECK_SOURCE_DIR is not set (run the tests through ctest)");
  return (std::filesystem::path(dir) / rel).string();
}

RunResult run_moecheck(std::vector<std::string> args) {
  args.insert(args.begin(), binary("moecheck"));
  return run_process(args);
}

}  // namespace moecheck::test
