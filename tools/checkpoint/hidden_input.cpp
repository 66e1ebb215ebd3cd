// Captured hidden states (hidden_input.hpp): a strict .npy parser and the HDF5 path.
#include "tools/checkpoint/hidden_input.hpp"

#include <cmath>
#include <cstring>
#include <optional>

#include <fmt/format.h>

#include "golden/case_file.hpp"
#include "golden/hdf5_io.hpp"
#include "reference/errors.hpp"
#include "reference/fp8_formats.hpp"
#include "tools/checkpoint/safetensors.hpp"

namespace moecheck::ckpt {

namespace {

constexpr uint64_t kMaxNpyHeader = 1u << 20;

// The header dict of a .npy file: a Python literal {'key': value, ...} whose values are
// strings, True/False or tuples of non-negative integers. Anything else is refused.
class DictParser {
 public:
  DictParser(std::string_view s, const std::string& file) : s_(s), file_(file) {}

  struct Value {
    enum Kind { string, boolean, tuple } kind = string;
    std::string text;
    bool flag = false;
    std::vector<uint64_t> ints;
  };

  std::vector<std::pair<std::string, Value>> parse() {
    std::vector<std::pair<std::string, Value>> out;
    expect('{');
    while (true) {
      skip();
      if (peek() == '}') {
        ++i_;
        break;
      }
      std::string key = quoted_string();
      for (const auto& [k, v] : out)
        if (k == key) fail(fmt::format("duplicate key '{}'", key));
      expect(':');
      out.emplace_back(std::move(key), value());
      skip();
      if (peek() == ',') {
        ++i_;
        continue;
      }
      expect('}');
      break;
    }
    skip();
    if (i_ != s_.size()) fail("trailing characters after the header dict");
    return out;
  }

 private:
  [[noreturn]] void fail(const std::string& rule) const {
    throw InputError(file_, "npy header", fmt::format("{} (at character {})", rule, i_));
  }
  void skip() {
    while (i_ < s_.size() && (s_[i_] == ' ' || s_[i_] == '\n' || s_[i_] == '\t' || s_[i_] == '\r')) ++i_;
  }
  char peek() const { return i_ < s_.size() ? s_[i_] : '\0'; }
  void expect(char c) {
    skip();
    if (peek() != c) fail(fmt::format("expected '{}'", c));
    ++i_;
  }
  std::string quoted_string() {
    skip();
    const char q = peek();
    if (q != '\'' && q != '"') fail("expected a quoted string");
    ++i_;
    const size_t start = i_;
    while (i_ < s_.size() && s_[i_] != q) {
      if (s_[i_] == '\\' || static_cast<unsigned char>(s_[i_]) < 0x20) fail("escapes and control characters are not accepted");
      ++i_;
    }
    if (i_ >= s_.size()) fail("unterminated string");
    return std::string(s_.substr(start, i_++ - start));
  }
  Value value() {
    skip();
    Value v;
    if (peek() == '\'' || peek() == '"') {
      v.kind = Value::string;
      v.text = quoted_string();
    } else if (s_.substr(i_, 4) == "True") {
      v.kind = Value::boolean, v.flag = true, i_ += 4;
    } else if (s_.substr(i_, 5) == "False") {
      v.kind = Value::boolean, v.flag = false, i_ += 5;
    } else if (peek() == '(') {
      v.kind = Value::tuple;
      ++i_;
      while (true) {
        skip();
        if (peek() == ')') {
          ++i_;
          break;
        }
        uint64_t n = 0;
        const size_t start = i_;
        while (i_ < s_.size() && s_[i_] >= '0' && s_[i_] <= '9') {
          if (n > (uint64_t(1) << 40)) fail("dimension too large");
          n = n * 10 + uint64_t(s_[i_++] - '0');
        }
        if (i_ == start) fail("expected a non-negative integer in the shape tuple");
        v.ints.push_back(n);
        skip();
        if (peek() == ',') {
          ++i_;
          continue;
        }
        if (peek() != ')') fail("expected ',' or ')' in the shape tuple");
      }
    } else {
      fail("expected a string, True, False or a tuple");
    }
    return v;
  }

  std::string_view s_;
  const std::string& file_;
  size_t i_ = 0;
};

HiddenStates check_dims(const std::string& file, const std::string& where, uint64_t T, uint64_t H) {
  if (T < 1 || T > uint64_t(kMaxTokens))
    throw InputError(file, where, fmt::format("tokens (dimension 0) must be in [1, 2^24], got {}", T));
  if (H < 1 || H > (uint64_t(1) << 24))
    throw InputError(file, where, fmt::format("hidden size (dimension 1) must be in [1, 2^24], got {}", H));
  HiddenStates h;
  h.tokens = int64_t(T), h.hidden = int64_t(H);
  return h;
}

HiddenStates read_hdf5(const std::string& path, const std::string& dataset) {
  h5::silence();
  const H5::H5File f = h5::guard(path, "", [&] { return H5::H5File(path, H5F_ACC_RDONLY); });
  auto exists = [&](const std::string& name) {
    try {
      return f.nameExists(name);
    } catch (const H5::Exception&) {
      return false;
    }
  };
  std::string name = dataset;
  if (!exists(name)) {
    if (dataset == "hidden_states" && exists("/inputs") && exists("/inputs/hidden_states")) name = "/inputs/hidden_states";
    else throw InputError(path, dataset, "dataset missing (--hidden-dataset names the dataset holding [T, H])");
  }
  const H5::DataSet ds = h5::guard(path, name, [&] { return f.openDataSet(name); });
  const auto dims = h5::guard(path, name, [&] { return h5::extent(ds); });
  if (dims.size() != 2) throw InputError(path, name, fmt::format("must have rank 2 [T, H], got {}", h5::shape_text(dims)));
  if (const std::string s = h5::guard(path, name, [&] { return h5::storage_problem(ds); }); !s.empty())
    throw InputError(path, name, s);
  HiddenStates h = check_dims(path, name, dims[0], dims[1]);
  const h5::TypeInfo ti = h5::guard(path, name, [&] { return h5::type_info(ds.getDataType()); });
  if (h5::is_f32(ti)) {
    h.dtype = Precision::f32;
    h.values = h5::read_box_as<float>(ds, H5::PredType::NATIVE_FLOAT, {0, 0}, dims, path, name);
  } else if (h5::is_uint(ti, 2)) {
    std::string tag;
    if (h5::guard(path, name, [&] { return ds.attrExists("dtype"); }))
      tag = h5::read_string_attr(h5::guard(path, name, [&] { return ds.openAttribute("dtype"); }), path, name + "@dtype");
    if (tag != "bfloat16") throw InputError(path, name, "uint16 data needs attribute dtype = \"bfloat16\" (bfloat16 bits)");
    const auto bits = h5::read_box_as<uint16_t>(ds, H5::PredType::NATIVE_UINT16, {0, 0}, dims, path, name);
    h.dtype = Precision::bf16;
    h.values.resize(bits.size());
    for (size_t i = 0; i < bits.size(); ++i) h.values[i] = bf16_decode(bits[i]);
  } else {
    throw InputError(path, name,
                     fmt::format("must be float32, or uint16 holding bfloat16 bits with attribute dtype = \"bfloat16\"; got {}",
                                 ti.name()));
  }
  return h;
}

}  // namespace

HiddenStates parse_npy(const std::vector<uint8_t>& b, const std::string& file) {
  static const uint8_t magic[6] = {0x93, 'N', 'U', 'M', 'P', 'Y'};
  if (b.size() < 10 || std::memcmp(b.data(), magic, 6) != 0) throw InputError(file, "", "not a .npy file (no \\x93NUMPY magic)");
  const int major = b[6];
  uint64_t len = 0, start = 0;
  if (major == 1) {
    len = uint64_t(b[8]) | (uint64_t(b[9]) << 8);
    start = 10;
  } else if (major == 2 || major == 3) {
    if (b.size() < 12) throw InputError(file, "npy header", "truncated before the header length");
    len = uint64_t(b[8]) | (uint64_t(b[9]) << 8) | (uint64_t(b[10]) << 16) | (uint64_t(b[11]) << 24);
    start = 12;
  } else {
    throw InputError(file, "npy header", fmt::format("unsupported .npy format version {}.{} (1.0, 2.0 and 3.0 are read)", major, b[7]));
  }
  if (len > kMaxNpyHeader) throw InputError(file, "npy header", fmt::format("header of {} bytes exceeds 1 MiB", len));
  if (start + len > b.size()) throw InputError(file, "npy header", "header runs past the end of the file (truncated)");
  const std::string_view text(reinterpret_cast<const char*>(b.data() + start), len);
  for (const char c : text)
    if (static_cast<unsigned char>(c) >= 0x80 && major < 3) throw InputError(file, "npy header", "non-ASCII byte in a version 1/2 header");
  const auto dict = DictParser(text, file).parse();
  std::optional<std::string> descr;
  std::optional<bool> fortran;
  std::optional<std::vector<uint64_t>> shape;
  for (const auto& [k, v] : dict) {
    if (k == "descr" && v.kind == DictParser::Value::string) descr = v.text;
    else if (k == "fortran_order" && v.kind == DictParser::Value::boolean) fortran = v.flag;
    else if (k == "shape" && v.kind == DictParser::Value::tuple) shape = v.ints;
    else throw InputError(file, "npy header", fmt::format("unexpected key or value type '{}' (descr, fortran_order, shape)", k));
  }
  if (!descr || !fortran || !shape) throw InputError(file, "npy header", "needs the keys descr, fortran_order and shape");
  if (*fortran) throw InputError(file, "npy header", "fortran_order True is not accepted (save a C-contiguous array)");
  if (shape->size() != 2)
    throw InputError(file, "npy header", fmt::format("shape must be (T, H), got rank {}", shape->size()));
  HiddenStates h = check_dims(file, "npy header", (*shape)[0], (*shape)[1]);
  size_t elem = 0;
  if (*descr == "<f4") elem = 4, h.dtype = Precision::f32;
  else if (*descr == "<u2") elem = 2, h.dtype = Precision::bf16;
  else if (*descr == "<V2" || *descr == "|V2")
    throw InputError(file, "npy header", "descr '|V2' (opaque 2 bytes, how numpy saves ml_dtypes.bfloat16) is refused: save "
                                         "the bfloat16 bits as uint16 ('<u2': t.view(torch.int16).numpy().view(np.uint16))");
  else
    throw InputError(file, "npy header", fmt::format("descr '{}' is not accepted ('<f4' float32 or '<u2' bfloat16 bits)", *descr));
  const uint64_t n = uint64_t(h.tokens) * uint64_t(h.hidden);
  const uint64_t data = b.size() - start - len;
  if (data != n * elem)
    throw InputError(file, "", fmt::format("holds {} data bytes, shape ({}, {}) of '{}' needs {}{}", data, h.tokens, h.hidden, *descr,
                                           n * elem, data < n * elem ? " (truncated)" : ""));
  h.values.resize(n);
  const uint8_t* p = b.data() + start + len;
  if (elem == 4) {
    std::memcpy(h.values.data(), p, n * 4);
  } else {
    for (uint64_t i = 0; i < n; ++i) h.values[i] = bf16_decode(uint16_t(p[2 * i] | (p[2 * i + 1] << 8)));
  }
  for (uint64_t i = 0; i < n; ++i)
    if (!std::isfinite(h.values[i]))
      throw InputError(file, "", fmt::format("hidden states must be finite; token {}, column {} is {}", i / uint64_t(h.hidden),
                                             i % uint64_t(h.hidden), h.values[i]));
  return h;
}

HiddenStates read_hidden_states_file(const std::string& path, const std::string& dataset) {
  const MappedFile m(path);
  const auto bytes = m.bytes();
  static const uint8_t npy[6] = {0x93, 'N', 'U', 'M', 'P', 'Y'};
  static const uint8_t hdf5[8] = {0x89, 'H', 'D', 'F', '\r', '\n', 0x1A, '\n'};
  if (bytes.size() >= 6 && std::memcmp(bytes.data(), npy, 6) == 0)
    return parse_npy(std::vector<uint8_t>(bytes.begin(), bytes.end()), path);
  if (bytes.size() >= 8 && std::memcmp(bytes.data(), hdf5, 8) == 0) {
    HiddenStates h = read_hdf5(path, dataset);
    for (size_t i = 0; i < h.values.size(); ++i)
      if (!std::isfinite(h.values[i]))
        throw InputError(path, dataset, fmt::format("hidden states must be finite; token {}, column {} is {}",
                                                    i / size_t(h.hidden), i % size_t(h.hidden), h.values[i]));
    return h;
  }
  throw InputError(path, "", "neither a .npy file nor an HDF5 file (no \\x93NUMPY or \\x89HDF signature)");
}

}  // namespace moecheck::ckpt
