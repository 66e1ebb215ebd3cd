// The safetensors reader (safetensors.hpp): structural checks, then nlohmann::json for the
// header's values, then the per-tensor and coverage rules. No fmt here on purpose: this file and
// its header are all the libFuzzer target needs (tests/checkpoint_fuzz.sh builds them with clang).
#include "tools/checkpoint/safetensors.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <bit>
#include <cerrno>
#include <cstring>
#include <set>
#include <tuple>
#include <utility>

#include <nlohmann/json.hpp>

static_assert(std::endian::native == std::endian::little, "safetensors data is little-endian; so must the host be");

namespace moecheck::ckpt {

namespace {

struct DtypeName {
  Dtype dtype;
  std::string_view name;
  int bits;
};
constexpr std::array<DtypeName, 22> kDtypes = {{
    {Dtype::BOOL, "BOOL", 8},         {Dtype::F4, "F4", 4},           {Dtype::F6_E2M3, "F6_E2M3", 6},
    {Dtype::F6_E3M2, "F6_E3M2", 6},   {Dtype::U8, "U8", 8},           {Dtype::I8, "I8", 8},
    {Dtype::F8_E5M2, "F8_E5M2", 8},   {Dtype::F8_E4M3, "F8_E4M3", 8}, {Dtype::F8_E8M0, "F8_E8M0", 8},
    {Dtype::F8_E4M3FNUZ, "F8_E4M3FNUZ", 8}, {Dtype::F8_E5M2FNUZ, "F8_E5M2FNUZ", 8},
    {Dtype::I16, "I16", 16},          {Dtype::U16, "U16", 16},        {Dtype::F16, "F16", 16},
    {Dtype::BF16, "BF16", 16},        {Dtype::I32, "I32", 32},        {Dtype::U32, "U32", 32},
    {Dtype::F32, "F32", 32},          {Dtype::C64, "C64", 64},        {Dtype::F64, "F64", 64},
    {Dtype::I64, "I64", 64},          {Dtype::U64, "U64", 64},
}};

std::string quote_name(std::string_view s) {
  // Names in messages: printable ASCII as is, anything else as \xNN (a hostile name must not
  // put control characters on the user's terminal), at most 200 characters.
  std::string out = "\"";
  for (size_t i = 0; i < s.size() && i < 200; ++i) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    if (c >= 0x20 && c < 0x7F && c != '"' && c != '\\') {
      out += static_cast<char>(c);
    } else {
      static const char* hex = "0123456789abcdef";
      out += "\\x";
      out += hex[c >> 4];
      out += hex[c & 15];
    }
  }
  if (s.size() > 200) out += "...";
  return out + "\"";
}

std::string safe_name(std::string_view s) {
  const std::string q = quote_name(s);
  return q.substr(1, q.size() - 2);
}

// Offset of the first byte that is not part of a well-formed UTF-8 sequence (RFC 3629: no
// overlong forms, no surrogates, nothing above U+10FFFF), or npos.
size_t invalid_utf8_at(std::string_view s) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  const size_t n = s.size();
  size_t i = 0;
  while (i < n) {
    const unsigned char c = p[i];
    if (c < 0x80) {
      ++i;
      continue;
    }
    size_t len = 0;
    uint32_t cp = 0, min = 0;
    if ((c & 0xE0) == 0xC0) len = 2, cp = c & 0x1F, min = 0x80;
    else if ((c & 0xF0) == 0xE0) len = 3, cp = c & 0x0F, min = 0x800;
    else if ((c & 0xF8) == 0xF0) len = 4, cp = c & 0x07, min = 0x10000;
    else return i;
    if (n - i < len) return i;
    for (size_t j = 1; j < len; ++j) {
      if ((p[i + j] & 0xC0) != 0x80) return i;
      cp = (cp << 6) | (p[i + j] & 0x3F);
    }
    if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return i;
    i += len;
  }
  return std::string_view::npos;
}

// SAX pass over the text: nesting depth and duplicate keys (nlohmann's DOM keeps the last of
// two equal keys silently; the format forbids duplicates). Stops at the first problem.
class StructureCheck {
 public:
  using json = nlohmann::json;
  explicit StructureCheck(int max_depth) : max_depth_(max_depth) {}
  std::string problem;

  bool null() { return true; }
  bool boolean(bool) { return true; }
  bool number_integer(json::number_integer_t) { return true; }
  bool number_unsigned(json::number_unsigned_t) { return true; }
  bool number_float(json::number_float_t, const json::string_t&) { return true; }
  bool string(json::string_t&) { return true; }
  bool binary(json::binary_t&) { return true; }
  bool start_object(std::size_t) { return open(true); }
  bool end_object() { return close(); }
  bool start_array(std::size_t) { return open(false); }
  bool end_array() { return close(); }
  bool key(json::string_t& k) {
    if (!frames_.empty() && !frames_.back().keys.insert(k).second) {
      problem = "duplicate key " + quote_name(k) + " in a JSON object (the format forbids duplicates)";
      return false;
    }
    return true;
  }
  bool parse_error(std::size_t position, const std::string&, const nlohmann::detail::exception& e) {
    // e.what() reads "[json.exception.parse_error.101] parse error at line 1, column 5: ...".
    std::string what = e.what();
    const size_t colon = what.find("] ");
    if (colon != std::string::npos) what = what.substr(colon + 2);
    problem = "not valid JSON (at byte " + std::to_string(position) + "): " + safe_name(what);
    return false;
  }

 private:
  struct Frame {
    bool object = false;
    std::set<std::string> keys;
  };
  bool open(bool object) {
    if (static_cast<int>(frames_.size()) >= max_depth_) {
      problem = "JSON nested deeper than " + std::to_string(max_depth_) + " levels";
      return false;
    }
    frames_.push_back(Frame{object, {}});
    return true;
  }
  bool close() {
    if (!frames_.empty()) frames_.pop_back();
    return true;
  }
  int max_depth_;
  std::vector<Frame> frames_;
};

[[noreturn]] void fail(const std::string& file, const std::string& where, const std::string& rule) {
  throw InputError(file, where, rule);
}

uint64_t read_u64_le(const uint8_t* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

std::string type_name(const nlohmann::json& j) { return j.type_name(); }

uint64_t unsigned_value(const nlohmann::json& j, const std::string& file, const std::string& where,
                        const std::string& what) {
  if (!j.is_number_unsigned())
    fail(file, where, what + " must be a non-negative integer below 2^64, got " +
                          (j.is_number() ? safe_name(j.dump()) : std::string("a ") + type_name(j)));
  return j.get<uint64_t>();
}

TensorInfo parse_tensor(const std::string& name, const nlohmann::json& j, uint64_t data_bytes,
                        const std::string& file) {
  const std::string where = safe_name(name);
  if (!j.is_object()) fail(file, where, std::string("a tensor entry must be a JSON object, got a ") + type_name(j));
  for (const auto& [k, v] : j.items()) {
    (void)v;
    if (k != "dtype" && k != "shape" && k != "data_offsets")
      fail(file, where, "unknown key " + quote_name(k) + " (a tensor entry has exactly dtype, shape, data_offsets)");
  }
  for (const char* k : {"dtype", "shape", "data_offsets"})
    if (!j.contains(k)) fail(file, where, std::string("missing \"") + k + "\" (a tensor entry has dtype, shape, data_offsets)");

  TensorInfo t;
  t.name = name;
  const auto& dt = j["dtype"];
  if (!dt.is_string()) fail(file, where, std::string("dtype must be a string, got a ") + type_name(dt));
  const auto parsed = parse_dtype(dt.get_ref<const std::string&>());
  if (!parsed) fail(file, where, "unknown dtype " + quote_name(dt.get_ref<const std::string&>()) + " (known: " + dtype_names() + ")");
  t.dtype = *parsed;

  const auto& sh = j["shape"];
  if (!sh.is_array()) fail(file, where, std::string("shape must be an array, got a ") + type_name(sh));
  if (sh.size() > kMaxRank) fail(file, where, "shape has " + std::to_string(sh.size()) + " dimensions (at most " + std::to_string(kMaxRank) + ")");
  t.elements = 1;
  for (const auto& d : sh) {
    const uint64_t v = unsigned_value(d, file, where, "every shape dimension");
    t.shape.push_back(v);
  }
  for (const uint64_t v : t.shape)
    if (__builtin_mul_overflow(t.elements, v, &t.elements))
      fail(file, where, "shape " + shape_text(t.shape) + " has more than 2^64 elements");
  uint64_t bits = 0;
  if (__builtin_mul_overflow(t.elements, static_cast<uint64_t>(dtype_bits(t.dtype)), &bits))
    fail(file, where, "shape " + shape_text(t.shape) + " of dtype " + std::string(to_string(t.dtype)) + " needs more than 2^64 bits");
  if (bits % 8 != 0)
    fail(file, where, std::to_string(t.elements) + " elements of " + std::string(to_string(t.dtype)) +
                          " do not end on a byte boundary");
  const uint64_t need = bits / 8;

  const auto& off = j["data_offsets"];
  if (!off.is_array() || off.size() != 2)
    fail(file, where, "data_offsets must be an array [begin, end] of two integers, got " +
                          (off.is_array() ? std::to_string(off.size()) + " elements" : std::string("a ") + type_name(off)));
  t.begin = unsigned_value(off[0], file, where, "data_offsets begin");
  t.end = unsigned_value(off[1], file, where, "data_offsets end");
  const std::string offsets = "data_offsets [" + std::to_string(t.begin) + ", " + std::to_string(t.end) + "]";
  if (t.begin > t.end) fail(file, where, offsets + ": begin is after end");
  if (t.end > data_bytes)
    fail(file, where, offsets + " run past the end of the data region (" + std::to_string(data_bytes) +
                          " bytes): offsets out of range, or the file is truncated");
  if (t.end - t.begin != need)
    fail(file, where, offsets + " hold " + std::to_string(t.end - t.begin) + " bytes, but dtype " +
                          std::string(to_string(t.dtype)) + " and shape " + shape_text(t.shape) + " need " +
                          std::to_string(need) + " bytes");
  return t;
}

}  // namespace

std::optional<Dtype> parse_dtype(std::string_view s) {
  for (const auto& d : kDtypes)
    if (d.name == s) return d.dtype;
  return std::nullopt;
}

std::string_view to_string(Dtype d) {
  for (const auto& x : kDtypes)
    if (x.dtype == d) return x.name;
  return "?";
}

int dtype_bits(Dtype d) {
  for (const auto& x : kDtypes)
    if (x.dtype == d) return x.bits;
  return 8;
}

std::string dtype_names() {
  std::string s;
  for (const auto& d : kDtypes) s += (s.empty() ? "" : ", ") + std::string(d.name);
  return s;
}

std::string shape_text(const std::vector<uint64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

const TensorInfo* SafetensorsHeader::find(const std::string& name) const {
  const auto it = tensors.find(name);
  return it == tensors.end() ? nullptr : &it->second;
}

void check_json_text(std::string_view text, const std::string& file, const std::string& where, int max_depth) {
  const size_t bad = invalid_utf8_at(text);
  if (bad != std::string_view::npos)
    fail(file, where, "not valid UTF-8 (byte " + std::to_string(bad) + " of the JSON text)");
  // nlohmann's lexer takes a NUL byte for the end of the input ("{}\0anything" would parse);
  // JSON has no place for a raw NUL (not whitespace, not allowed inside strings): refuse it.
  if (const size_t nul = text.find('\0'); nul != std::string_view::npos)
    fail(file, where, "not valid JSON (a NUL byte at byte " + std::to_string(nul) + "; the header may be padded with spaces only)");
  StructureCheck check(max_depth);
  const bool ok = nlohmann::json::sax_parse(text.begin(), text.end(), &check, nlohmann::json::input_format_t::json, true);
  if (!ok || !check.problem.empty())
    fail(file, where, check.problem.empty() ? std::string("not valid JSON") : check.problem);
}

SafetensorsHeader parse_safetensors(std::span<const uint8_t> bytes, const std::string& file) {
  SafetensorsHeader h;
  if (bytes.size() < 8)
    fail(file, "header length", "the file has " + std::to_string(bytes.size()) +
                                    " bytes, fewer than the 8-byte header length (truncated or not a safetensors file)");
  h.header_bytes = read_u64_le(bytes.data());
  const uint64_t after = bytes.size() - 8;
  if (h.header_bytes > kMaxHeaderBytes)
    fail(file, "header length", "header length " + std::to_string(h.header_bytes) + " exceeds the limit of " +
                                    std::to_string(kMaxHeaderBytes) + " bytes" +
                                    (h.header_bytes > after ? " (and runs past the end of the file)" : ""));
  if (h.header_bytes > after)
    fail(file, "header length", "header length " + std::to_string(h.header_bytes) + " runs past the end of the file (" +
                                    std::to_string(after) + " bytes follow the length): truncated or corrupt");
  if (h.header_bytes < 2) fail(file, "header", "header of " + std::to_string(h.header_bytes) + " bytes cannot hold a JSON object");
  h.data_start = 8 + h.header_bytes;
  h.data_bytes = bytes.size() - h.data_start;

  const std::string_view text(reinterpret_cast<const char*>(bytes.data() + 8), h.header_bytes);
  check_json_text(text, file, "header", kMaxJsonDepth);
  nlohmann::json root;
  try {
    root = nlohmann::json::parse(text.begin(), text.end());
  } catch (const nlohmann::json::exception& e) {
    fail(file, "header", std::string("not valid JSON: ") + safe_name(e.what()));
  }
  if (!root.is_object()) fail(file, "header", std::string("must be a JSON object, got a ") + type_name(root));

  for (const auto& [name, value] : root.items()) {
    if (name == "__metadata__") {
      if (!value.is_object()) fail(file, "__metadata__", std::string("must be an object of strings, got a ") + type_name(value));
      for (const auto& [k, v] : value.items()) {
        if (!v.is_string())
          fail(file, "__metadata__", "value of " + quote_name(k) + " must be a string, got a " + type_name(v));
        h.metadata[k] = v.get<std::string>();
      }
      continue;
    }
    if (name.empty()) fail(file, "header", "a tensor has an empty name");
    h.tensors.emplace(name, parse_tensor(name, value, h.data_bytes, file));
  }

  // Coverage: sorted by offset, the tensors tile [0, data_bytes) exactly.
  std::vector<const TensorInfo*> order;
  order.reserve(h.tensors.size());
  for (const auto& [n, t] : h.tensors) order.push_back(&t);
  std::sort(order.begin(), order.end(), [](const TensorInfo* a, const TensorInfo* b) {
    return std::tie(a->begin, a->end, a->name) < std::tie(b->begin, b->end, b->name);
  });
  uint64_t expected = 0;
  const TensorInfo* prev = nullptr;
  for (const TensorInfo* t : order) {
    const std::string offsets = "data_offsets [" + std::to_string(t->begin) + ", " + std::to_string(t->end) + "]";
    if (t->begin < expected)
      fail(file, safe_name(t->name), offsets + " overlap tensor " + quote_name(prev->name) + " [" +
                                         std::to_string(prev->begin) + ", " + std::to_string(prev->end) + "]");
    if (t->begin > expected)
      fail(file, safe_name(t->name), offsets + " leave bytes [" + std::to_string(expected) + ", " +
                                         std::to_string(t->begin) + ") of the data region to no tensor (the tensors "
                                         "must cover the data region contiguously)");
    expected = t->end;
    prev = t;
  }
  if (expected != h.data_bytes)
    fail(file, "", "the data region has " + std::to_string(h.data_bytes) + " bytes but the tensors end at byte " +
                       std::to_string(expected) + " (trailing bytes after the last tensor)");
  return h;
}

// --- MappedFile ----------------------------------------------------------------------------

MappedFile::MappedFile(const std::string& path) : path_(path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    const int err = errno;
    throw InputError(path, "", err == ENOENT ? "no such file" : std::string("cannot open: ") + std::strerror(err));
  }
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    throw InputError(path, "", "not a regular file");
  }
  size_ = static_cast<size_t>(st.st_size);
  if (size_ > 0) {
    void* p = ::mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, fd, 0);
    if (p == MAP_FAILED) {
      const int err = errno;
      ::close(fd);
      throw InputError(path, "", std::string("cannot memory-map: ") + std::strerror(err));
    }
    data_ = static_cast<const uint8_t*>(p);
  }
  ::close(fd);
}

MappedFile::~MappedFile() {
  if (data_) ::munmap(const_cast<uint8_t*>(data_), size_);
}

void MappedFile::release(uint64_t offset, uint64_t length) const {
  if (!data_ || offset >= size_) return;
  const uint64_t page = static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
  const uint64_t end = std::min<uint64_t>(size_, offset + length);
  const uint64_t first = offset / page * page;
  // Only whole pages inside the range's page span; the neighbours' pages come back on demand.
  ::madvise(const_cast<uint8_t*>(data_) + first, end - first, MADV_DONTNEED);
}

// --- SafetensorsFile -----------------------------------------------------------------------

SafetensorsFile::SafetensorsFile(const std::string& path) : map_(path), header_(parse_safetensors(map_.bytes(), path)) {}

std::optional<TensorView> SafetensorsFile::find(const std::string& name) const {
  const TensorInfo* t = header_.find(name);
  if (!t) return std::nullopt;
  return TensorView{&map_.path(), t, map_.bytes().subspan(header_.data_start + t->begin, t->bytes())};
}

void SafetensorsFile::release(const TensorView& t) const { map_.release(header_.data_start + t.info->begin, t.info->bytes()); }

}  // namespace moecheck::ckpt
