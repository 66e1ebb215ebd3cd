// Defensive HDF5 helpers (see hdf5_io.hpp for the contract).
#include "golden/hdf5_io.hpp"

#include <fmt/format.h>

#include <limits>
#include <mutex>

namespace moecheck::h5 {

namespace {

// Owns a raw HDF5 identifier obtained through the C API.
struct Hid {
  hid_t id = -1;
  herr_t (*close)(hid_t) = nullptr;
  Hid(hid_t i, herr_t (*c)(hid_t)) : id(i), close(c) {}
  Hid(const Hid&) = delete;
  Hid& operator=(const Hid&) = delete;
  ~Hid() {
    if (id >= 0 && close) close(id);
  }
};

[[noreturn]] void fail(const std::string& where_fn, const std::string& what) {
  throw H5::Exception(where_fn, what);
}

herr_t collect_error(unsigned, const H5E_error2_t* err, void* data) {
  auto* out = static_cast<std::vector<std::string>*>(data);
  if (err && err->desc) out->push_back(err->desc);
  return 0;
}

herr_t collect_link(hid_t, const char* name, const H5L_info_t* info, void* data) {
  auto* out = static_cast<std::vector<std::pair<std::string, H5L_type_t>>*>(data);
  out->emplace_back(name, info->type);
  return 0;
}

uint64_t npoints(const H5::Attribute& a) { return static_cast<uint64_t>(a.getSpace().getSimpleExtentNpoints()); }

void require_single(const H5::Attribute& a, const std::string& file, const std::string& where) {
  const uint64_t n = npoints(a);
  if (n != 1) throw InputError(file, where, fmt::format("must be a single value, got {} elements", n));
}

}  // namespace

void silence() {
  static std::once_flag once;
  std::call_once(once, [] { H5::Exception::dontPrint(); });
}

std::string describe(const H5::Exception& e) {
  // The C error stack (still recorded with printing off) names the root cause, e.g.
  // "truncated file: eof = ..." or "file signature not found"; the C++ message names the call.
  std::vector<std::string> stack;
  H5Ewalk2(H5E_DEFAULT, H5E_WALK_DOWNWARD, collect_error, &stack);
  std::string msg = e.getDetailMsg();
  if (!stack.empty() && stack.back() != msg) msg += " (" + stack.back() + ")";
  return msg;
}

// --- Types -------------------------------------------------------------------------------
std::string TypeInfo::name() const {
  switch (cls) {
    case TypeClass::floating:
      if (ieee) return fmt::format("float{}", size * 8);
      return fmt::format("non-IEEE float of {} bytes", size);
    case TypeClass::integer: return fmt::format("{}int{}", is_signed ? "" : "u", size * 8);
    case TypeClass::string: return "string";
    case TypeClass::other: break;
  }
  return size ? fmt::format("non-numeric type of {} bytes", size) : "non-numeric type";
}

TypeInfo type_info(const H5::DataType& t) {
  TypeInfo info;
  const hid_t id = t.getId();
  info.size = H5Tget_size(id);
  switch (H5Tget_class(id)) {
    case H5T_FLOAT: {
      info.cls = TypeClass::floating;
      size_t spos = 0, epos = 0, esize = 0, mpos = 0, msize = 0;
      H5Tget_fields(id, &spos, &epos, &esize, &mpos, &msize);
      const size_t ebias = H5Tget_ebias(id);
      const size_t prec = H5Tget_precision(id);
      const int offset = H5Tget_offset(id);
      if (info.size == 4)
        info.ieee = spos == 31 && epos == 23 && esize == 8 && mpos == 0 && msize == 23 && ebias == 127 &&
                    prec == 32 && offset == 0;
      else if (info.size == 8)
        info.ieee = spos == 63 && epos == 52 && esize == 11 && mpos == 0 && msize == 52 && ebias == 1023 &&
                    prec == 64 && offset == 0;
      break;
    }
    case H5T_INTEGER:
      info.cls = TypeClass::integer;
      info.is_signed = H5Tget_sign(id) == H5T_SGN_2;
      break;
    case H5T_STRING: info.cls = TypeClass::string; break;
    default: info.cls = TypeClass::other; break;
  }
  return info;
}

std::optional<uint64_t> checked_bytes(const std::vector<uint64_t>& dims, uint64_t elem) {
  uint64_t total = elem;
  for (uint64_t d : dims) {
    if (d != 0 && total > std::numeric_limits<uint64_t>::max() / d) return std::nullopt;
    total *= d;
  }
  return total;
}

// --- Links ------------------------------------------------------------------------------
std::vector<Member> members(const H5::Group& g, const std::string& file, const std::string& where) {
  return guard(file, where, [&] {
    std::vector<std::pair<std::string, H5L_type_t>> links;
    hsize_t idx = 0;
    if (H5Literate(g.getId(), H5_INDEX_NAME, H5_ITER_INC, &idx, collect_link, &links) < 0)
      fail("H5Literate", "can't iterate over the group's links");
    std::vector<Member> out;
    for (const auto& [name, type] : links) {
      LinkKind kind = LinkKind::other_link;
      if (type == H5L_TYPE_SOFT) kind = LinkKind::soft_link;
      if (type == H5L_TYPE_EXTERNAL) kind = LinkKind::external_link;
      if (type == H5L_TYPE_HARD) {
        const H5O_type_t ot = g.childObjType(name);
        kind = ot == H5O_TYPE_GROUP ? LinkKind::group : ot == H5O_TYPE_DATASET ? LinkKind::dataset : LinkKind::other_object;
      }
      out.push_back({name, kind});
    }
    return out;
  });
}

std::string to_string(LinkKind k) {
  switch (k) {
    case LinkKind::group: return "group";
    case LinkKind::dataset: return "dataset";
    case LinkKind::other_object: return "named datatype";
    case LinkKind::soft_link: return "soft link";
    case LinkKind::external_link: return "external link";
    case LinkKind::other_link: return "user-defined link";
  }
  return "?";
}

// --- Attributes -------------------------------------------------------------------------
std::vector<std::string> attribute_names(const H5::H5Object& o, const std::string& file, const std::string& where) {
  return guard(file, where, [&] {
    std::vector<std::string> names;
    const int n = o.getNumAttrs();
    for (int i = 0; i < n; ++i) names.push_back(o.openAttribute(static_cast<unsigned>(i)).getName());
    return names;
  });
}

int64_t read_int_attr(const H5::Attribute& a, const std::string& file, const std::string& where) {
  return guard(file, where, [&]() -> int64_t {
    const TypeInfo t = type_info(a.getDataType());
    if (t.cls != TypeClass::integer || t.size > 8)
      throw InputError(file, where, "must be an integer (any integer type of up to 8 bytes), got " + t.name());
    require_single(a, file, where);
    if (!t.is_signed && t.size == 8) {
      uint64_t u = 0;
      a.read(H5::PredType::NATIVE_UINT64, &u);
      if (u > uint64_t(std::numeric_limits<int64_t>::max()))
        throw InputError(file, where, fmt::format("integer {} is out of range", u));
      return static_cast<int64_t>(u);
    }
    int64_t v = 0;
    a.read(H5::PredType::NATIVE_INT64, &v);
    return v;
  });
}

double read_real_attr(const H5::Attribute& a, const std::string& file, const std::string& where) {
  return guard(file, where, [&] {
    const TypeInfo t = type_info(a.getDataType());
    if (t.cls != TypeClass::floating && t.cls != TypeClass::integer)
      throw InputError(file, where, "must be a number (float or integer type), got " + t.name());
    require_single(a, file, where);
    double v = 0;
    a.read(H5::PredType::NATIVE_DOUBLE, &v);
    return v;
  });
}

std::string read_string_attr(const H5::Attribute& a, const std::string& file, const std::string& where) {
  return guard(file, where, [&] {
    const TypeInfo t = type_info(a.getDataType());
    if (t.cls != TypeClass::string) throw InputError(file, where, "must be a string, got " + t.name());
    // One element only: reading an array of strings into one buffer would overrun it.
    require_single(a, file, where);
    Hid ftype(H5Aget_type(a.getId()), H5Tclose);
    if (ftype.id < 0) fail("H5Aget_type", "can't get the attribute type");
    std::string s;
    if (H5Tis_variable_str(ftype.id) > 0) {
      Hid mtype(H5Tcopy(H5T_C_S1), H5Tclose);
      H5Tset_size(mtype.id, H5T_VARIABLE);
      H5Tset_cset(mtype.id, H5Tget_cset(ftype.id));
      char* p = nullptr;
      if (H5Aread(a.getId(), mtype.id, &p) < 0) fail("H5Aread", "can't read the variable-length string");
      if (p) {
        s = p;
        H5free_memory(p);
      }
    } else {
      const uint64_t n = H5Tget_size(ftype.id);
      if (n > kMaxStringBytes) throw InputError(file, where, fmt::format("string of {} bytes exceeds 1 MiB", n));
      std::vector<char> buf(n + 1, '\0');
      if (H5Aread(a.getId(), ftype.id, buf.data()) < 0) fail("H5Aread", "can't read the fixed-length string");
      s.assign(buf.data());  // up to the first NUL (null-terminated and null-padded strings)
      if (H5Tget_strpad(ftype.id) == H5T_STR_SPACEPAD)
        while (!s.empty() && s.back() == ' ') s.pop_back();
    }
    if (s.size() > kMaxStringBytes) throw InputError(file, where, "string exceeds 1 MiB");
    return s;
  });
}

std::string attr_as_text(const H5::Attribute& a, const std::string& file, const std::string& where) {
  const TypeInfo t = guard(file, where, [&] { return type_info(a.getDataType()); });
  const uint64_t n = guard(file, where, [&] { return npoints(a); });
  if (n != 1) return fmt::format("<{} values of {}>", n, t.name());
  if (t.cls == TypeClass::string) return read_string_attr(a, file, where);
  if (t.cls == TypeClass::integer && t.size <= 8) return std::to_string(read_int_attr(a, file, where));
  if (t.cls == TypeClass::floating) return fmt::format("{}", read_real_attr(a, file, where));
  return fmt::format("<{}>", t.name());
}

void write_attr(const H5::H5Object& o, const std::string& name, const std::string& value) {
  if (o.attrExists(name)) o.removeAttr(name);
  H5::StrType st(H5::PredType::C_S1, H5T_VARIABLE);
  st.setCset(H5T_CSET_UTF8);
  H5::Attribute a = o.createAttribute(name, st, H5::DataSpace(H5S_SCALAR));
  a.write(st, value);
}

void write_attr(const H5::H5Object& o, const std::string& name, int64_t value) {
  if (o.attrExists(name)) o.removeAttr(name);
  o.createAttribute(name, H5::PredType::STD_I64LE, H5::DataSpace(H5S_SCALAR)).write(H5::PredType::NATIVE_INT64, &value);
}

void write_attr(const H5::H5Object& o, const std::string& name, double value) {
  if (o.attrExists(name)) o.removeAttr(name);
  o.createAttribute(name, H5::PredType::IEEE_F64LE, H5::DataSpace(H5S_SCALAR)).write(H5::PredType::NATIVE_DOUBLE, &value);
}

// --- Datasets ---------------------------------------------------------------------------
std::vector<uint64_t> extent(const H5::DataSet& ds) {
  const H5::DataSpace space = ds.getSpace();
  const int rank = space.getSimpleExtentNdims();
  std::vector<hsize_t> d(static_cast<size_t>(rank > 0 ? rank : 0));
  if (rank > 0) space.getSimpleExtentDims(d.data());
  return {d.begin(), d.end()};
}

std::string shape_text(const std::vector<uint64_t>& dims) { return fmt::format("[{}]", fmt::join(dims, ", ")); }

void read_box(const H5::DataSet& ds, const H5::PredType& mem, void* buf, const std::vector<uint64_t>& offset,
              const std::vector<uint64_t>& count) {
  H5::DataSpace file_space = ds.getSpace();
  const std::vector<hsize_t> off(offset.begin(), offset.end()), cnt(count.begin(), count.end());
  file_space.selectHyperslab(H5S_SELECT_SET, cnt.data(), off.data());
  H5::DataSpace mem_space(static_cast<int>(cnt.size()), cnt.data());
  ds.read(buf, mem, mem_space, file_space);
}

void write_box(const H5::DataSet& ds, const H5::PredType& mem, const void* buf, const std::vector<uint64_t>& offset,
               const std::vector<uint64_t>& count) {
  H5::DataSpace file_space = ds.getSpace();
  const std::vector<hsize_t> off(offset.begin(), offset.end()), cnt(count.begin(), count.end());
  file_space.selectHyperslab(H5S_SELECT_SET, cnt.data(), off.data());
  H5::DataSpace mem_space(static_cast<int>(cnt.size()), cnt.data());
  ds.write(buf, mem, mem_space, file_space);
}

std::string storage_problem(const H5::DataSet& ds) {
  const H5::DSetCreatPropList p = ds.getCreatePlist();
  if (p.getExternalCount() > 0) return "external raw data files are not allowed (the data must be inside the case file)";
  const H5D_layout_t layout = p.getLayout();
  if (layout == H5D_VIRTUAL) return "virtual datasets are not allowed (the data must be inside the case file)";
  const std::vector<uint64_t> dims = extent(ds);
  const auto bytes = checked_bytes(dims, ds.getDataType().getSize());
  if (!bytes) return "dataset size overflows 64 bits";
  if (*bytes == 0) return "";
  if (layout == H5D_CONTIGUOUS) {
    const uint64_t stored = ds.getStorageSize();
    if (stored == 0) return "no data written (storage not allocated)";
    if (stored < *bytes)
      return fmt::format("storage holds {} bytes, expected {} (partially written file?)", stored, *bytes);
  } else if (layout == H5D_CHUNKED) {
    std::vector<hsize_t> chunk(dims.size());
    p.getChunk(static_cast<int>(dims.size()), chunk.data());
    uint64_t expected = 1;
    for (size_t i = 0; i < dims.size(); ++i) {
      const uint64_t c = chunk[i] ? (dims[i] + chunk[i] - 1) / chunk[i] : 0;
      if (c != 0 && expected > std::numeric_limits<uint64_t>::max() / c) return "chunk count overflows 64 bits";
      expected *= c;
    }
    hsize_t written = 0;
    const H5::DataSpace all = ds.getSpace();  // HDF5 1.10.8 refuses H5S_ALL here
    if (H5Dget_num_chunks(ds.getId(), all.getId(), &written) < 0) fail("H5Dget_num_chunks", "can't count chunks");
    if (written == 0) return "no data written (no chunk allocated)";
    if (written < expected)
      return fmt::format("only {} of {} chunks are written (partially written file?)", written, expected);
  }
  return "";
}

H5::DataSet create_dataset(const H5::Group& parent, const std::string& name, const H5::DataType& type,
                           const std::vector<uint64_t>& dims, const std::vector<uint64_t>& chunk, int deflate) {
  const std::vector<hsize_t> d(dims.begin(), dims.end());
  H5::DataSpace space(static_cast<int>(d.size()), d.data());
  H5::DSetCreatPropList dcpl;
  if (!chunk.empty()) {
    const std::vector<hsize_t> c(chunk.begin(), chunk.end());
    dcpl.setChunk(static_cast<int>(c.size()), c.data());
    if (deflate > 0) dcpl.setDeflate(deflate);
  }
  H5Pset_obj_track_times(dcpl.getId(), false);
  return parent.createDataSet(name, type, space, dcpl);
}

H5::Group create_group(const H5::Group& parent, const std::string& name) {
  Hid gcpl(H5Pcreate(H5P_GROUP_CREATE), H5Pclose);
  H5Pset_obj_track_times(gcpl.id, false);
  const hid_t g = H5Gcreate2(parent.getId(), name.c_str(), H5P_DEFAULT, gcpl.id, H5P_DEFAULT);
  if (g < 0) fail("H5Gcreate2", "can't create group " + name);
  H5::Group group(g);  // takes a reference of its own
  H5Gclose(g);
  return group;
}

std::vector<uint64_t> chunk_for(const std::vector<uint64_t>& dims, uint64_t elem, size_t axis, uint64_t max_bytes,
                                uint64_t align) {
  std::vector<uint64_t> c(dims.size(), 1);
  uint64_t slice = elem;
  for (size_t i = axis + 1; i < dims.size(); ++i) {
    c[i] = dims[i];
    slice *= dims[i];
  }
  uint64_t n = std::max<uint64_t>(1, max_bytes / std::max<uint64_t>(1, slice));
  if (align > 1 && n >= align) n -= n % align;
  c[axis] = std::min(n, std::max<uint64_t>(1, dims[axis]));
  return c;
}

}  // namespace moecheck::h5
