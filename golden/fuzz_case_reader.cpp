// libFuzzer target for the case reader and its rules (CaseReader, and CaseReader::validate through
// CaseProblem). Fuzzing HDF5's own byte format would mostly exercise libhdf5 (not ours, and not
// instrumented); instead the input is a list of edits at the level of the data model, applied
// to a small valid case: attributes set to other integers, doubles or strings, elements of
// datasets poked (NaN, Inf, negative, huge, random bits), datasets and attributes deleted,
// datasets replaced by others of another shape or type. The contract under test: whatever the
// edits, opening and validating either succeeds (and then the input hash and every recorded
// output read without error) or throws InputError; anything else (another exception, a crash,
// a sanitizer report, a leak) is a bug.
//
// Built two ways: by tests/case_reader_fuzz.sh with clang (-DMOECHECK_FUZZ=ON: a bounded fuzzing
// run), and into tests/case_reader_fuzz_replay_test with the normal compiler (the seed corpus
// golden/fuzz_corpus/ and mutations of it on every test run). Edit encoding: 8 bytes per edit,
// [op, target, a0..a3, b0, b1], at most 16; a short tail is ignored. MOECHECK_FUZZ_VERBOSE=1 prints
// each input's outcome (valid, or the InputError) on stderr.
#include <H5Cpp.h>
#include <stdlib.h>
#include <unistd.h>

#include <array>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "golden/case_file.hpp"
#include "golden/case_problem.hpp"
#include "reference/errors.hpp"

namespace {

using namespace moecheck;

constexpr int64_t T = 3, E = 4, K = 2, H = 256, I = 128;

const std::array<const char*, 11> kDatasets = {
    "/inputs/hidden_states", "/inputs/hidden_states_fp8", "/inputs/hidden_states_scale", "/inputs/router_logits",
    "/inputs/routing_bias",  "/weights/w13",              "/weights/w13_scale",          "/weights/w2",
    "/weights/w2_scale",     "/outputs/emulated/output",  "/outputs/emulated/topk_ids"};
const std::array<const char*, 6> kHolders = {"/", "/config", "/inputs/hidden_states", "/weights/w13", "/outputs/emulated",
                                             "/inputs/hidden_states_fp8"};
const std::array<const char*, 24> kAttrs = {
    "num_experts", "top_k", "hidden_size", "intermediate_size", "routing", "n_group", "topk_group",
    "routed_scaling_factor", "local_expert_offset", "local_num_experts", "scale_format", "gate_up_layout",
    "intermediate_dtype", "routing_weight_dtype", "group_size", "weight_block", "act_eps", "format",
    "format_version", "dtype", "backend", "combine", "act_scale", "budget_model"};
const std::array<const char*, 12> kStrings = {"deepseek_v3", "renormalize", "softmax_topk", "ue8m0", "f32", "bf16",
                                              "up_gate", "bfloat16", "float8_e4m3fn", "", "\xff\xfe garbage",
                                              "moecheck.case"};

// A valid case in a directory of its own, removed at exit.
struct BaseCase {
  std::string dir, path;
  BaseCase();
  ~BaseCase() {
    std::error_code ec;
    std::filesystem::remove_all(dir, ec);
  }
};

const BaseCase& base_case() {
  static const BaseCase b;
  return b;
}

BaseCase::BaseCase() {
  dir = (std::filesystem::temp_directory_path() / "moecheck-fuzz-XXXXXX").string();
  if (!mkdtemp(dir.data())) std::abort();
  path = dir + "/base.h5";
  CaseHeader h;
  MoeConfig& c = h.config;
  c.num_experts = E, c.top_k = K, c.hidden_size = H, c.intermediate_size = I;
  c.routing = RoutingMethod::deepseek_v3, c.n_group = 2, c.topk_group = 1, c.routed_scaling_factor = 2.5;
  h.tokens = T, h.routing_bias = true, h.hidden_fp8 = true;
  CaseWriter w(path, h);
  std::vector<float> x(T * H), logits(T * E), bias(E, 0.05f), scales(T * (H / 128), 1.0f / 64);
  std::vector<uint8_t> codes(T * H);
  for (int64_t i = 0; i < T * H; ++i) x[i] = float((i % 17) - 8) / 8, codes[i] = uint8_t((i * 37) % 0x7E);
  for (int64_t i = 0; i < T * E; ++i) logits[i] = float((i * 7) % 11) / 4 - 1;
  w.write_hidden_states(x);
  w.write_hidden_fp8(codes, scales);
  w.write_router_logits(logits);
  w.write_routing_bias(bias);
  for (int64_t e = 0; e < E; ++e) {
    ExpertWeights ew;
    ew.w13.assign(2 * I * H, uint8_t(0x30 + e));
    ew.w13_scale.assign((2 * I / 128) * (H / 128), 1e-3f);
    ew.w2.assign(H * I, uint8_t(0xB0 + e));
    ew.w2_scale.assign((H / 128) * (I / 128), 2e-3f);
    w.write_expert(e, ew);
  }
  OutputData out;
  out.attributes["backend"] = "emulated";
  out.output.assign(T * H, 0.25f);
  out.topk_ids = {0, 1, 2, 3, 0, 2};
  w.add_output("emulated", out);
  w.commit();
}

// Does `path` (absolute) name an object? Every prefix is checked: H5Lexists fails on a missing
// intermediate group.
bool exists(const H5::H5File& f, const std::string& path) {
  for (size_t at = path.find('/', 1);; at = path.find('/', at + 1)) {
    if (!f.nameExists(path.substr(0, at))) return false;
    if (at == std::string::npos) return true;
  }
}

uint32_t u32(const uint8_t* p) { return uint32_t(p[0]) | uint32_t(p[1]) << 8 | uint32_t(p[2]) << 16 | uint32_t(p[3]) << 24; }

double special(uint8_t sel, uint32_t bits) {
  const double v[] = {std::nan(""), INFINITY, -INFINITY, -1.0, 0.0, -0.0, 1e38, 1e-45, 448.0, 2.5e-300, 3.5};
  const size_t n = sizeof(v) / sizeof(v[0]);
  if (sel % 16 < n) return v[sel % 16];
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

const H5::PredType& some_type(uint8_t sel) {
  static const H5::PredType* t[] = {&H5::PredType::NATIVE_UINT8,  &H5::PredType::NATIVE_UINT16, &H5::PredType::NATIVE_INT32,
                                    &H5::PredType::NATIVE_INT64,  &H5::PredType::NATIVE_FLOAT,  &H5::PredType::NATIVE_DOUBLE,
                                    &H5::PredType::NATIVE_INT8};
  return *t[sel % 7];
}

void set_attr(H5::H5File& f, const uint8_t* e) {
  const std::string holder = kHolders[e[1] % kHolders.size()], name = kAttrs[(e[1] / 8 + e[7]) % kAttrs.size()];
  H5::H5Object* obj = nullptr;
  std::optional<H5::Group> g;  // H5::Group and H5::DataSet have no usable operator=
  std::optional<H5::DataSet> d;
  if (holder == "/" || exists(f, holder)) {
    if (holder == "/" || f.childObjType(holder) == H5O_TYPE_GROUP)
      obj = &g.emplace(f.openGroup(holder));
    else
      obj = &d.emplace(f.openDataSet(holder));
  }
  if (!obj) return;
  if (obj->attrExists(name)) obj->removeAttr(name);
  const H5::DataSpace scalar(H5S_SCALAR);
  if (e[0] % 8 == 0) {  // integer: small or any int32
    const int64_t v = (e[6] & 1) ? int64_t(int8_t(e[2])) : int64_t(int32_t(u32(e + 2)));
    obj->createAttribute(name, H5::PredType::NATIVE_INT64, scalar).write(H5::PredType::NATIVE_INT64, &v);
  } else if (e[0] % 8 == 1) {
    const double v = special(e[6], u32(e + 2));
    obj->createAttribute(name, H5::PredType::NATIVE_DOUBLE, scalar).write(H5::PredType::NATIVE_DOUBLE, &v);
  } else {
    const H5::StrType st(H5::PredType::C_S1, H5T_VARIABLE);
    const std::string v = kStrings[e[2] % kStrings.size()];
    obj->createAttribute(name, st, scalar).write(st, v);
  }
}

void poke(H5::H5File& f, const uint8_t* e) {
  const std::string path = kDatasets[e[1] % kDatasets.size()];
  if (!exists(f, path)) return;
  H5::DataSet d = f.openDataSet(path);
  const H5::DataType type = d.getDataType();
  const size_t size = type.getSize(), n = size_t(d.getSpace().getSimpleExtentNpoints());
  if (n == 0 || size == 0 || size > 8 || n > (size_t(1) << 22)) return;
  std::vector<uint8_t> raw(n * size);
  d.read(raw.data(), type);
  const size_t at = size_t(u32(e + 2)) % n;
  if (type.getClass() == H5T_FLOAT && size == 4) {
    const float v = float(special(e[6], u32(e + 2) * 2654435761u));
    std::memcpy(&raw[at * size], &v, 4);
  } else {
    for (size_t b = 0; b < size; ++b) raw[at * size + b] = b == 0 ? e[6] : (b == 1 ? e[7] : raw[at * size + b]);
  }
  d.write(raw.data(), type);
}

void replace(H5::H5File& f, const uint8_t* e) {
  const std::string path = kDatasets[e[1] % kDatasets.size()];
  if (!exists(f, path.substr(0, path.rfind('/')))) return;
  std::vector<hsize_t> dims;
  if (e[0] % 8 == 5) {  // another shape
    const int rank = 1 + e[6] % 4;
    for (int r = 0; r < rank; ++r) dims.push_back(hsize_t(e[2 + r] % 9 == 8 ? 0 : e[2 + r] % 300));
  } else {  // the same shape, another type
    if (!exists(f, path)) return;
    const H5::DataSpace s = f.openDataSet(path).getSpace();
    dims.resize(size_t(s.getSimpleExtentNdims()));
    s.getSimpleExtentDims(dims.data());
  }
  hsize_t n = 1;
  for (hsize_t v : dims) n *= v;
  if (n > (hsize_t(1) << 22)) return;
  if (exists(f, path)) f.unlink(path);
  const H5::PredType& t = some_type(e[7]);
  H5::DataSet d = f.createDataSet(path, t, H5::DataSpace(int(dims.size()), dims.data()));
  std::vector<uint8_t> fill(size_t(n) * t.getSize(), e[6]);
  if (n) d.write(fill.data(), t);
}

void remove_object(H5::H5File& f, const uint8_t* e) {
  const std::string path = kDatasets[e[1] % kDatasets.size()];
  if (e[6] & 1) {
    const std::string parent = path.substr(0, path.rfind('/'));
    if (exists(f, parent)) f.unlink(parent);
  } else if (exists(f, path)) {
    f.unlink(path);
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  H5::Exception::dontPrint();
  const BaseCase& base = base_case();
  const std::string path = base.dir + "/case.h5";
  std::filesystem::copy_file(base.path, path, std::filesystem::copy_options::overwrite_existing);
  {
    H5::H5File f(path, H5F_ACC_RDWR);
    for (size_t i = 0; i + 8 <= size && i < 8 * 16; i += 8) {
      const uint8_t* e = data + i;
      try {
        switch (e[0] % 8) {
          case 0: case 1: case 2: set_attr(f, e); break;
          case 3: poke(f, e); break;
          case 4: remove_object(f, e); break;
          default: replace(f, e); break;
        }
      } catch (const H5::Exception&) {
        // an edit HDF5 refuses (a name in use, a bad type for the place) is simply not made
      }
    }
  }
  try {
    const CaseProblem cp(path);
    (void)cp.input_hashes();
    for (const OutputInfo& o : cp.reader().outputs()) (void)cp.reader().read_output(o.name);
    if (std::getenv("MOECHECK_FUZZ_VERBOSE")) std::fprintf(stderr, "valid\n");
  } catch (const InputError& e) {
    // the expected outcome for a case that breaks a rule
    if (std::getenv("MOECHECK_FUZZ_VERBOSE")) std::fprintf(stderr, "InputError: %s\n", e.what());
  }
  return 0;
}
