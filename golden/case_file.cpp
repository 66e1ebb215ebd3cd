// Adding an output or a reference tier to an existing case, atomically: copy the case to a
// temporary next to the destination, write the group into the copy, check the copy with a strict
// CaseReader, and rename it over the destination. The original is never opened for writing, so
// an interrupted `moecheck run` or `moecheck reference` leaves it as it was.
#include <filesystem>

#include "golden/case_file.hpp"
#include "golden/case_groups.hpp"
#include "golden/hdf5_io.hpp"
#include "golden/interrupt.hpp"

namespace moecheck {

namespace {

// write(file, config, T) adds its group to the open copy.
template <class F>
void update_case(const std::string& case_path, const std::string& out_path, F&& write) {
  h5::silence();
  MoeConfig config;
  int64_t tokens = 0;
  {
    const CaseReader base(case_path);  // strict: only a valid case is extended
    config = base.config();
    tokens = base.tokens();
  }
  const std::string target = out_path.empty() ? case_path : out_path;
  const std::string tmp = groups::temporary_for(target);
  interrupt::ScratchPath scratch(tmp);
  try {
    std::error_code ec;
    std::filesystem::copy_file(case_path, tmp, std::filesystem::copy_options::overwrite_existing, ec);
    if (ec) throw InputError(target, "", "cannot write: " + ec.message());
    h5::guard(target, "", [&] {
      H5::H5File f(tmp, H5F_ACC_RDWR);
      write(f, config, tokens);
      f.close();
    });
    const CaseReader check(tmp);
    std::filesystem::rename(tmp, target, ec);
    if (ec) throw InputError(target, "", "cannot write: " + ec.message());
    scratch.release();
  } catch (...) {
    std::error_code ec;
    std::filesystem::remove(tmp, ec);
    throw;
  }
}

// The group `parent` of f (created when absent) without its member `name` (unlinked when present).
H5::Group emptied(H5::H5File& f, const std::string& parent, const std::string& name) {
  H5::Group g = f.nameExists(parent) ? f.openGroup(parent) : h5::create_group(f, parent);
  if (g.nameExists(name)) g.unlink(name);
  return g;
}

}  // namespace

void add_output_to_case(const std::string& case_path, const std::string& name, const OutputData& out,
                        const std::string& out_path) {
  if (!is_valid_output_name(name))
    throw InputError(case_path, "/outputs/" + name, "output names are 1-128 characters of A-Z a-z 0-9 _ . : + -");
  update_case(case_path, out_path, [&](H5::H5File& f, const MoeConfig& c, int64_t T) {
    groups::write_output(emptied(f, "outputs", name), name, out, c, T);
  });
}

void add_reference_to_case(const std::string& case_path, const std::string& tier, const ReferenceData& ref,
                           const std::string& out_path) {
  if (!is_reference_tier(tier))
    throw InputError(case_path, "/reference/" + tier, "unknown reference tier (ideal | quantized)");
  update_case(case_path, out_path, [&](H5::H5File& f, const MoeConfig& c, int64_t T) {
    groups::write_reference(emptied(f, "reference", tier), tier, ref, c, T);
  });
}

}  // namespace moecheck
