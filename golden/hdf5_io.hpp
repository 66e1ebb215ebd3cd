// Thin, defensive helpers over the HDF5 C++ API for the case format (golden/FORMAT.md).
//
// Contract: every function here either succeeds or throws InputError(file, where, rule); an
// H5::Exception never escapes (guard() converts it, naming the dataset or attribute). Reads check
// type class, size and sign before touching data, and every byte count is computed with overflow
// checks and bounded by kMaxReadBytes before anything is allocated, so a hostile file cannot make
// us allocate absurd buffers or read into a buffer of the wrong size.
#pragma once

#include <H5Cpp.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "reference/errors.hpp"

namespace moecheck::h5 {

// Largest single read we accept (64 GiB); the format is read expert by expert and token block by
// token block, so real cases stay far below it.
constexpr uint64_t kMaxReadBytes = uint64_t(64) << 30;
// Longest string attribute we accept.
constexpr uint64_t kMaxStringBytes = uint64_t(1) << 20;

// Turn off HDF5's automatic error printing (we report errors ourselves). Idempotent.
void silence();

// The innermost useful message of an HDF5 exception ("H5Dread: can't read data").
std::string describe(const H5::Exception& e);

// Runs f(), converting an H5::Exception into InputError(file, where, "HDF5 error: ...").
template <class F>
auto guard(const std::string& file, const std::string& where, F&& f) -> decltype(f()) {
  try {
    return f();
  } catch (const H5::Exception& e) {
    throw InputError(file, where, "HDF5 error: " + describe(e));
  }
}

// --- Types -------------------------------------------------------------------------------
enum class TypeClass { floating, integer, string, other };
struct TypeInfo {
  TypeClass cls = TypeClass::other;
  uint64_t size = 0;
  bool is_signed = false;
  bool ieee = false;  // floating: IEEE 754 field layout for its size (binary32 / binary64)
  // "float32", "float64", "float16-like(2 bytes)", "int8", "uint16", "string", "compound", ...
  std::string name() const;
};
TypeInfo type_info(const H5::DataType& t);
inline bool is_f32(const TypeInfo& t) { return t.cls == TypeClass::floating && t.size == 4 && t.ieee; }
inline bool is_f64(const TypeInfo& t) { return t.cls == TypeClass::floating && t.size == 8 && t.ieee; }
inline bool is_uint(const TypeInfo& t, uint64_t size) {
  return t.cls == TypeClass::integer && !t.is_signed && t.size == size;
}

// dims[0] * ... * dims[n-1] * elem, or nullopt on uint64 overflow.
std::optional<uint64_t> checked_bytes(const std::vector<uint64_t>& dims, uint64_t elem);

// --- Links ------------------------------------------------------------------------------
// Only hard links are part of the format: a soft or external link could point anywhere
// (another file included), so members() reports them and the validator refuses them.
enum class LinkKind { group, dataset, other_object, soft_link, external_link, other_link };
struct Member {
  std::string name;
  LinkKind kind;
};
std::vector<Member> members(const H5::Group& g, const std::string& file, const std::string& where);
std::string to_string(LinkKind k);

// --- Attributes -------------------------------------------------------------------------
std::vector<std::string> attribute_names(const H5::H5Object& o, const std::string& file, const std::string& where);
// Each reader requires exactly one element and the right type class; `where` names the
// attribute ("/config@top_k") in the InputError it throws otherwise.
int64_t read_int_attr(const H5::Attribute& a, const std::string& file, const std::string& where);
double read_real_attr(const H5::Attribute& a, const std::string& file, const std::string& where);
std::string read_string_attr(const H5::Attribute& a, const std::string& file, const std::string& where);
// Any attribute as text for display (inspect): strings as is, numbers formatted, others "<type>".
std::string attr_as_text(const H5::Attribute& a, const std::string& file, const std::string& where);

void write_attr(const H5::H5Object& o, const std::string& name, const std::string& value);  // var-length UTF-8
void write_attr(const H5::H5Object& o, const std::string& name, int64_t value);             // int64
void write_attr(const H5::H5Object& o, const std::string& name, double value);              // float64

// --- Datasets ---------------------------------------------------------------------------
std::vector<uint64_t> extent(const H5::DataSet& ds);
std::string shape_text(const std::vector<uint64_t>& dims);  // "[16, 256]"

// Reads the box [offset, offset + count) of ds into buf (count elements of mem type, row-major).
// The caller has checked the box against the extent and sized buf.
void read_box(const H5::DataSet& ds, const H5::PredType& mem, void* buf, const std::vector<uint64_t>& offset,
              const std::vector<uint64_t>& count);
void write_box(const H5::DataSet& ds, const H5::PredType& mem, const void* buf, const std::vector<uint64_t>& offset,
               const std::vector<uint64_t>& count);

// Allocates a vector for `count` elements of T after checking the byte count against
// kMaxReadBytes (InputError naming `where` otherwise) and reads the box into it.
template <class T>
std::vector<T> read_box_as(const H5::DataSet& ds, const H5::PredType& mem, const std::vector<uint64_t>& offset,
                           const std::vector<uint64_t>& count, const std::string& file, const std::string& where);

// Whether the dataset's raw data is actually stored: "" if so, else the rule it breaks
// (external or virtual storage, no data written, only some chunks written).
std::string storage_problem(const H5::DataSet& ds);

// New dataset `name` in parent; chunk empty = contiguous layout; deflate 0 = no filter.
// Object modification times are not recorded, so the same content gives the same bytes.
H5::DataSet create_dataset(const H5::Group& parent, const std::string& name, const H5::DataType& type,
                           const std::vector<uint64_t>& dims, const std::vector<uint64_t>& chunk = {},
                           int deflate = 0);
H5::Group create_group(const H5::Group& parent, const std::string& name);

// Chunk shape for a row-major array of elem-byte elements, split along `axis`: dimensions before
// it are 1 (one expert per chunk for weights), those after it whole, and along `axis` as many
// slices as fit in max_bytes (at least 1; rounded down to a multiple of `align` when >= align).
std::vector<uint64_t> chunk_for(const std::vector<uint64_t>& dims, uint64_t elem, size_t axis, uint64_t max_bytes,
                                uint64_t align = 1);

// ---------------------------------------------------------------------------------------
template <class T>
std::vector<T> read_box_as(const H5::DataSet& ds, const H5::PredType& mem, const std::vector<uint64_t>& offset,
                           const std::vector<uint64_t>& count, const std::string& file, const std::string& where) {
  const auto bytes = checked_bytes(count, sizeof(T));
  if (!bytes || *bytes > kMaxReadBytes)
    throw InputError(file, where, "read of " + shape_text(count) + " elements exceeds the 64 GiB read limit");
  std::vector<T> out(*bytes / sizeof(T));
  if (!out.empty()) guard(file, where, [&] { read_box(ds, mem, out.data(), offset, count); });
  return out;
}

}  // namespace moecheck::h5
