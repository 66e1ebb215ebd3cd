// CaseReader's state, shared by case_reader.cpp (open + structure checks), case_access.cpp
// (reads) and case_validate.cpp (data checks). Internal to golden/.
#pragma once

#include <H5Cpp.h>

#include <functional>
#include <map>
#include <memory>
#include <set>

#include "golden/case_file.hpp"
#include "golden/case_layout.hpp"
#include "golden/hdf5_io.hpp"

namespace moecheck {

struct CaseReader::Impl {
  std::string path;
  CaseOpen mode = CaseOpen::strict;
  std::unique_ptr<H5::H5File> file;
  std::vector<Problem> problems;

  int64_t format_version = -1;
  std::optional<std::string> description, source;
  MoeConfig config;
  bool config_ok = false;
  std::vector<std::string> config_defaults;
  int64_t tokens = -1;
  std::vector<DatasetInfo> datasets;
  // Datasets that passed every structural check with every dimension checked: only these are
  // read (their shapes are the config's, so every size below is bounded and overflow-free).
  std::set<std::string> good;
  std::map<std::string, std::string> dtype;  // path -> meaning ("bfloat16", ...)
  std::vector<int64_t> expert_ids;
  bool experts_subset = false;
  std::vector<std::string> outputs, tiers;
  std::map<std::string, std::string> shards;  // output name -> its valid ranks@shard ("tp 4")
  std::set<std::string> root_groups;  // root members that are groups of the format

  // Records a problem (lenient) or throws it (strict).
  void problem(const std::string& where, const std::string& rule);
  // Runs f; an InputError (or a stray H5::Exception) becomes a problem. Returns whether f succeeded.
  template <class F>
  bool attempt(const std::string& where, F&& f) {
    try {
      f();
      return true;
    } catch (const InputError& e) {
      problem(e.where(), e.rule());
    } catch (const H5::Exception& e) {
      problem(where, "HDF5 error: " + h5::describe(e));
    }
    return false;
  }

  // Structure checks, in file order (case_reader.cpp).
  void open_file();
  bool check_root();
  void check_config();
  void check_inputs();
  void check_weights();
  void check_outputs();
  void check_references();
  // `extra` (optional) checks more of each group: (group, its path, the members check_group found).
  using GroupCheck = std::function<void(const H5::Group&, const std::string&, const std::set<std::string>&)>;
  void check_named_groups(const std::string& root, bool (*name_ok)(std::string_view), const std::string& name_rule,
                          std::vector<std::string>& found, const std::vector<std::string>& attrs, bool attrs_required,
                          const std::vector<layout::Spec>& specs, const GroupCheck& extra = {});
  // /outputs/<name>/ranks (layout::ranks_spec): the shard attribute, the split, one dataset per rank.
  void check_ranks(const H5::Group& output, const std::string& output_path);
  // Checks members of `group_path` against specs: unknown names, links, presence, then each
  // dataset. Returns the names present.
  // Datasets in `checked` were checked already (expert_ids).
  std::set<std::string> check_group(const H5::Group& g, const std::string& group_path,
                                    const std::vector<layout::Spec>& specs, const std::set<std::string>& checked = {});
  int64_t read_expert_ids(const H5::DataSet& ds);  // checks the id rules, returns E_stored
  bool check_dataset(const H5::Group& g, const std::string& group_path, const layout::Spec& spec);
  void check_string_attrs(const H5::H5Object& o, const std::string& path, const std::vector<std::string>& names,
                          bool required);

  // Access helpers (case_access.cpp).
  void require_usable() const;  // throws the first structural problem
  // The reads below touch only datasets that passed the structure checks (InputError otherwise)
  // and do not call require_usable(), so validate() can use them on a lenient reader.
  H5::DataSet open_good(const std::string& path) const;
  std::pair<int64_t, int64_t> token_range(const std::string& path, int64_t t0, int64_t count) const;
  // Rows [t0, t0+n) of a [T, ...] float_tensor dataset, decoded to float (bf16 exactly).
  std::vector<float> read_float_rows(const std::string& path, int64_t t0, int64_t n) const;
  HiddenFp8 read_hidden_fp8(int64_t t0, int64_t n) const;
  ExpertWeights read_expert_slot(int64_t slot) const;
  // Every attribute of a group as text (what can be read; problems are reported on open).
  std::map<std::string, std::string> group_attributes(const std::string& path) const;
};

}  // namespace moecheck
