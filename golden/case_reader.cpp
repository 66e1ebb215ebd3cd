// CaseReader: opening a case and checking its structure (FORMAT.md "Validation rules"):
// root attributes, /config, and every dataset's name, type, rank, shape and storage. No bulk
// data is read here; the only data read is /weights/expert_ids (at most 65536 integers).
#include <algorithm>
#include <cctype>
#include <filesystem>

#include <fmt/format.h>

#include "golden/case_reader_impl.hpp"
#include "reference/moe_sharding.hpp"

namespace moecheck {

namespace {

// Root members of format version 1; /extra is free for anything and never looked into.
const std::vector<std::string> kRootGroups = {"config", "inputs", "weights", "outputs", "reference", "extra"};
const std::string kIdsPath = "/weights/expert_ids";

std::string link_rule(h5::LinkKind k) {
  return h5::to_string(k) + "s are not allowed in a case file (only hard links: a link could point to another file)";
}

}  // namespace

void CaseReader::Impl::problem(const std::string& where, const std::string& rule) {
  if (mode == CaseOpen::strict) throw InputError(path, where, rule);
  problems.push_back({where, rule});
}

CaseReader::CaseReader(const std::string& path, CaseOpen mode) : impl_(std::make_unique<Impl>()) {
  h5::silence();
  Impl& m = *impl_;
  m.path = path;
  m.mode = mode;
  m.open_file();
  if (!m.file || !m.check_root()) return;
  m.check_config();
  m.check_inputs();
  m.check_weights();
  m.check_outputs();
  m.check_references();
}

CaseReader::~CaseReader() = default;
CaseReader::CaseReader(CaseReader&&) noexcept = default;
CaseReader& CaseReader::operator=(CaseReader&&) noexcept = default;

void CaseReader::Impl::open_file() {
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) return problem("", "no such file");
  if (!std::filesystem::is_regular_file(path, ec)) return problem("", "not a regular file");
  // A file shorter than the HDF5 signature, or without it, is not HDF5 at all; a file that has
  // it but fails to open is truncated or corrupt (HDF5 checks the stored end-of-file address).
  if (H5Fis_hdf5(path.c_str()) <= 0)
    return problem("", "not a readable HDF5 file (no HDF5 signature: truncated or corrupt?)");
  try {
    H5::FileAccPropList fapl;
    // Reading needs no lock; refusing to open on file systems without locking would help nobody.
    H5Pset_file_locking(fapl.getId(), false, true);
    file = std::make_unique<H5::H5File>(path, H5F_ACC_RDONLY, H5::FileCreatPropList::DEFAULT, fapl);
  } catch (const H5::Exception& e) {
    file.reset();
    problem("", "not a readable HDF5 file (truncated or corrupt?): " + h5::describe(e));
  }
}

bool CaseReader::Impl::check_root() {
  // format and format_version decide whether anything else can be interpreted: stop on failure.
  bool ok = attempt("/@format", [&] {
    if (!h5::guard(path, "/", [&] { return file->attrExists("format"); }))
      throw InputError(path, "/@format", "required attribute missing: this is not a moecheck case file");
    const std::string f = h5::read_string_attr(file->openAttribute("format"), path, "/@format");
    if (f != kCaseFormat)
      throw InputError(path, "/@format", fmt::format("must be \"{}\", got \"{}\"", kCaseFormat, f));
  });
  ok = ok && attempt("/@format_version", [&] {
    if (!h5::guard(path, "/", [&] { return file->attrExists("format_version"); }))
      throw InputError(path, "/@format_version", "required attribute missing");
    format_version = h5::read_int_attr(file->openAttribute("format_version"), path, "/@format_version");
    if (format_version != kCaseFormatVersion)
      throw InputError(path, "/@format_version",
                       fmt::format("unsupported format version {} (this moecheck reads version {})", format_version,
                                   kCaseFormatVersion));
  });
  if (!ok) return false;
  for (const char* name : {"description", "source"}) {
    const std::string where = std::string("/@") + name;
    attempt(where, [&] {
      if (!file->attrExists(name)) return;
      (name[0] == 'd' ? description : source) = h5::read_string_attr(file->openAttribute(name), path, where);
    });
  }
  std::vector<h5::Member> root;
  if (!attempt("/", [&] { root = h5::members(*file, path, "/"); })) return false;
  for (const h5::Member& mem : root) {
    const std::string where = "/" + mem.name;
    if (std::find(kRootGroups.begin(), kRootGroups.end(), mem.name) == kRootGroups.end())
      problem(where, fmt::format("unknown member: format version 1 has only {}", fmt::join(kRootGroups, ", ")));
    else if (mem.kind == h5::LinkKind::soft_link || mem.kind == h5::LinkKind::external_link ||
             mem.kind == h5::LinkKind::other_link)
      problem(where, link_rule(mem.kind));
    else if (mem.kind != h5::LinkKind::group)
      problem(where, "must be a group, got a " + h5::to_string(mem.kind));
    else
      root_groups.insert(mem.name);
  }
  for (const char* req : {"config", "inputs", "weights"})
    if (std::none_of(root.begin(), root.end(), [&](const h5::Member& m) { return m.name == req; }))
      problem(std::string("/") + req, "required group missing");
  return true;
}

void CaseReader::Impl::check_config() {
  if (!root_groups.count("config")) return;
  const size_t before = problems.size();
  bool ok = attempt("/config", [&] {
    const H5::Group g = h5::guard(path, "/config", [&] { return file->openGroup("config"); });
    if (h5::guard(path, "/config", [&] { return g.getNumObjs(); }) != 0)
      problem("/config", "must hold attributes only (no datasets or groups)");
    const std::vector<std::string> names = h5::attribute_names(g, path, "/config");
    for (const std::string& n : names) {
      const bool known = std::any_of(layout::config_attrs().begin(), layout::config_attrs().end(),
                                     [&](const layout::ConfigAttr& a) { return a.name == n; });
      if (!known)
        problem("/config@" + n,
                "unknown attribute (not part of format version 1; a misspelled name would otherwise silently "
                "mean the default)");
    }
    for (const layout::ConfigAttr& a : layout::config_attrs()) {
      const std::string name(a.name), where = "/config@" + name;
      if (std::find(names.begin(), names.end(), name) == names.end()) {
        if (a.required) problem(where, "required attribute missing");
        config_defaults.push_back(name);
        continue;
      }
      attempt(where, [&] {
        const H5::Attribute at = h5::guard(path, where, [&] { return g.openAttribute(name); });
        std::string rule;
        if (a.kind == layout::AttrKind::integer) rule = layout::set_config_int(config, name, h5::read_int_attr(at, path, where));
        if (a.kind == layout::AttrKind::real) rule = layout::set_config_real(config, name, h5::read_real_attr(at, path, where));
        if (a.kind == layout::AttrKind::text) rule = layout::set_config_text(config, name, h5::read_string_attr(at, path, where));
        if (!rule.empty()) throw InputError(path, where, rule);
      });
    }
  });
  if (config.local_num_experts < 0) config.local_num_experts = config.num_experts;
  if (ok && problems.size() == before) {
    // config_problems() says "<attribute>: <rule>"; the attribute goes into `where`.
    for (const std::string& p : config_problems(config)) {
      const size_t colon = p.find(": ");
      problem("/config@" + p.substr(0, colon), colon == std::string::npos ? p : p.substr(colon + 2));
    }
  }
  config_ok = problems.size() == before;
}

std::set<std::string> CaseReader::Impl::check_group(const H5::Group& g, const std::string& gp,
                                                    const std::vector<layout::Spec>& specs,
                                                    const std::set<std::string>& checked) {
  std::set<std::string> present;
  std::vector<h5::Member> mem;
  if (!attempt(gp, [&] { mem = h5::members(g, path, gp); })) return present;
  for (const h5::Member& m : mem) {
    const std::string where = gp + "/" + m.name;
    const layout::Spec* s = layout::find_spec(specs, m.name);
    if (!s)
      problem(where, fmt::format("unknown dataset (this group holds only {})", layout::spec_names(specs)));
    else if (m.kind == h5::LinkKind::soft_link || m.kind == h5::LinkKind::external_link ||
             m.kind == h5::LinkKind::other_link)
      problem(where, link_rule(m.kind));
    else if (s->enc == layout::Encoding::group && m.kind != h5::LinkKind::group)
      problem(where, "must be a group, got a " + h5::to_string(m.kind));
    else if (s->enc != layout::Encoding::group && m.kind != h5::LinkKind::dataset)
      problem(where, "must be a dataset, got a " + h5::to_string(m.kind));
    else if (s->presence == layout::Presence::forbidden)
      problem(where, s->forbidden_rule);
    else
      present.insert(m.name);
  }
  for (const layout::Spec& s : specs) {
    const bool listed = std::any_of(mem.begin(), mem.end(), [&](const h5::Member& m) { return m.name == s.name; });
    if (s.presence == layout::Presence::required && !listed) problem(gp + "/" + s.name, "required dataset missing");
  }
  for (const std::string& n : present)  // groups are their caller's to check
    if (!checked.count(n) && layout::find_spec(specs, n)->enc != layout::Encoding::group)
      check_dataset(g, gp, *layout::find_spec(specs, n));
  return present;
}

bool CaseReader::Impl::check_dataset(const H5::Group& g, const std::string& gp, const layout::Spec& spec) {
  const std::string p = gp + "/" + spec.name;
  return attempt(p, [&] {
    const H5::DataSet ds = h5::guard(path, p, [&] { return g.openDataSet(spec.name); });
    const std::vector<uint64_t> dims = h5::guard(path, p, [&] { return h5::extent(ds); });
    const h5::TypeInfo t = h5::guard(path, p, [&] { return h5::type_info(ds.getDataType()); });
    DatasetInfo info{p, {dims.begin(), dims.end()}, "?", t.name()};
    datasets.push_back(info);
    const std::string meaning = layout::check_encoding(ds, spec.enc, path, p);
    datasets.back().dtype = meaning;
    dtype[p] = meaning;
    if (dims.size() != spec.shape.size())
      throw InputError(path, p, fmt::format("must have rank {} (shape {}), got rank {} {}", spec.shape.size(),
                                            layout::shape_text(spec.shape), dims.size(), h5::shape_text(dims)));
    bool all_known = true;
    for (size_t i = 0; i < dims.size(); ++i) {
      const int64_t want = spec.shape[i].value;
      all_known = all_known && want >= 0;
      if (want >= 0 && dims[i] != uint64_t(want))
        throw InputError(path, p, fmt::format("shape must be {}, got {}", layout::shape_text(spec.shape),
                                              h5::shape_text(dims)));
    }
    const std::string storage = h5::guard(path, p, [&] { return h5::storage_problem(ds); });
    if (!storage.empty()) throw InputError(path, p, storage);
    if (all_known) good.insert(p);
  });
}

void CaseReader::Impl::check_string_attrs(const H5::H5Object& o, const std::string& p,
                                          const std::vector<std::string>& names, bool required) {
  for (const std::string& n : names) {
    const std::string where = p + "@" + n;
    attempt(where, [&] {
      if (!h5::guard(path, where, [&] { return o.attrExists(n); })) {
        if (required) throw InputError(path, where, "required attribute missing");
        return;
      }
      h5::read_string_attr(h5::guard(path, where, [&] { return o.openAttribute(n); }), path, where);
    });
  }
}

void CaseReader::Impl::check_inputs() {
  if (!root_groups.count("inputs")) return;
  attempt("/inputs", [&] {
    const H5::Group g = h5::guard(path, "/inputs", [&] { return file->openGroup("inputs"); });
    // T is the first dimension of hidden_states (router_logits when hidden_states is absent or
    // not 2-D). Only hard-linked datasets are probed: a link is never followed.
    const std::vector<h5::Member> mem = h5::members(g, path, "/inputs");
    for (const char* name : {"hidden_states", "router_logits"}) {
      const bool hard = std::any_of(mem.begin(), mem.end(), [&](const h5::Member& m) {
        return m.name == name && m.kind == h5::LinkKind::dataset;
      });
      if (tokens >= 0 || !hard) continue;
      try {
        const std::vector<uint64_t> d = h5::extent(g.openDataSet(name));
        if (d.size() != 2) continue;
        if (d[0] < 1 || d[0] > uint64_t(kMaxTokens)) {
          problem(std::string("/inputs/") + name, fmt::format("dimension 0 (tokens T) must be in [1, 2^24], got {}", d[0]));
          break;
        }
        tokens = int64_t(d[0]);
      } catch (const H5::Exception&) {
        // reported by check_group below
      }
    }
    const std::set<std::string> present = check_group(g, "/inputs", layout::input_specs(config, config_ok, tokens));
    if (present.count("hidden_states_fp8") != present.count("hidden_states_scale"))
      problem(present.count("hidden_states_fp8") ? "/inputs/hidden_states_scale" : "/inputs/hidden_states_fp8",
              "hidden_states_fp8 and hidden_states_scale come together (both or neither)");
  });
}

void CaseReader::Impl::check_weights() {
  if (!root_groups.count("weights")) return;
  attempt("/weights", [&] {
    const H5::Group g = h5::guard(path, "/weights", [&] { return file->openGroup("weights"); });
    const std::vector<h5::Member> mem = h5::members(g, path, "/weights");
    // expert_ids first: it decides E_stored, the first dimension of every weight dataset.
    int64_t stored = config_ok ? config.local_experts() : -1;
    const bool ids = std::any_of(mem.begin(), mem.end(), [](const h5::Member& m) {
      return m.name == "expert_ids" && m.kind == h5::LinkKind::dataset;
    });
    if (ids) {
      experts_subset = true;
      stored = -1;
      const auto specs = layout::weight_specs(config, config_ok, -1);
      if (check_dataset(g, "/weights", *layout::find_spec(specs, "expert_ids")) && config_ok)
        attempt(kIdsPath, [&] { stored = read_expert_ids(g.openDataSet("expert_ids")); });
    } else if (config_ok) {
      for (int64_t e = 0; e < stored; ++e) expert_ids.push_back(config.local_expert_offset + e);
    }
    check_group(g, "/weights", layout::weight_specs(config, config_ok, stored), {"expert_ids"});
  });
}

int64_t CaseReader::Impl::read_expert_ids(const H5::DataSet& ds) {
  const uint64_t n = h5::extent(ds)[0];
  const int64_t local = config.local_experts(), lo = config.local_expert_offset;
  if (n < 1 || n > uint64_t(local))
    throw InputError(path, kIdsPath, fmt::format("length must be in [1, local_num_experts = {}], got {}", local, n));
  const auto ids = h5::read_box_as<int64_t>(ds, H5::PredType::NATIVE_INT64, {0}, {n}, path, kIdsPath);
  for (size_t i = 0; i < ids.size(); ++i) {
    if (ids[i] < lo || ids[i] >= lo + local)
      throw InputError(path, kIdsPath,
                       fmt::format("id {} at index {} is outside the local experts [{}, {})", ids[i], i, lo, lo + local));
    if (i > 0 && ids[i] <= ids[i - 1])
      throw InputError(path, kIdsPath,
                       fmt::format("ids must be strictly increasing, got {} after {} at index {}", ids[i], ids[i - 1], i));
  }
  expert_ids = ids;
  return int64_t(n);
}

// /outputs/<name> and /reference/<tier>: every member of the root group `root` must be a group
// with an accepted name; each is recorded in `found` and checked against its specs.
void CaseReader::Impl::check_named_groups(const std::string& root, bool (*name_ok)(std::string_view),
                                          const std::string& name_rule, std::vector<std::string>& found,
                                          const std::vector<std::string>& attrs, bool attrs_required,
                                          const std::vector<layout::Spec>& specs, const GroupCheck& extra) {
  if (!root_groups.count(root)) return;
  const std::string rp = "/" + root;
  attempt(rp, [&] {
    const H5::Group g = h5::guard(path, rp, [&] { return file->openGroup(root); });
    for (const h5::Member& m : h5::members(g, path, rp)) {
      const std::string p = rp + "/" + m.name;
      if (!name_ok(m.name)) {
        problem(p, name_rule);
        continue;
      }
      if (m.kind != h5::LinkKind::group) {
        problem(p, m.kind == h5::LinkKind::dataset || m.kind == h5::LinkKind::other_object
                       ? "must be a group, got a " + h5::to_string(m.kind)
                       : link_rule(m.kind));
        continue;
      }
      found.push_back(m.name);
      attempt(p, [&] {
        const H5::Group sg = g.openGroup(m.name);
        check_string_attrs(sg, p, attrs, attrs_required);
        const std::set<std::string> present = check_group(sg, p, specs);
        if (extra) extra(sg, p, present);
      });
    }
  });
}

void CaseReader::Impl::check_outputs() {
  std::vector<layout::Spec> specs = layout::output_specs(config, config_ok, tokens);
  specs.push_back(layout::ranks_spec());
  check_named_groups("outputs", is_valid_output_name, "output names are 1-128 characters of A-Z a-z 0-9 _ . : + -",
                     outputs, {"backend", "device", "created"}, false, specs,
                     [&](const H5::Group& g, const std::string& p, const std::set<std::string>& present) {
                       if (present.count("ranks")) check_ranks(g, p);
                     });
}

void CaseReader::Impl::check_ranks(const H5::Group& output, const std::string& op) {
  const std::string rp = op + "/ranks", where = rp + "@shard";
  attempt(rp, [&] {
    const H5::Group g = h5::guard(path, rp, [&] { return output.openGroup("ranks"); });
    if (!h5::guard(path, where, [&] { return g.attrExists("shard"); }))
      throw InputError(path, where, "required attribute missing (\"tp N\" or \"ep N\": how the layer was split)");
    const std::string text = h5::read_string_attr(h5::guard(path, where, [&] { return g.openAttribute("shard"); }), path, where);
    const std::optional<ShardPlan> plan = parse_shard_plan(text);
    if (!plan)
      throw InputError(path, where, fmt::format("must be \"tp N\" or \"ep N\" with N in [1, {}], got \"{}\"", kMaxShardRanks, text));
    if (config_ok) try {
        require_shardable(config, *plan, path);
      } catch (const InputError& e) {
        throw InputError(path, where, e.rule());
      }
    // The count first, alone: a wrong count would otherwise list every missing rank as well.
    const std::vector<h5::Member> mem = h5::members(g, path, rp);
    if (int64_t(mem.size()) != plan->ranks)
      throw InputError(path, rp, fmt::format("holds {} member{}; shard = \"{}\" needs one dataset per rank, named 0 to {}",
                                             mem.size(), mem.size() == 1 ? "" : "s", text, plan->ranks - 1));
    const size_t before = problems.size();
    check_group(g, rp, layout::rank_specs(config, config_ok, tokens, plan->ranks));
    if (problems.size() == before) shards[op.substr(op.rfind('/') + 1)] = text;
  });
}

void CaseReader::Impl::check_references() {
  check_named_groups("reference", is_reference_tier, "unknown reference tier (ideal | quantized)", tiers,
                     {"tool_version", "input_hash"}, true, layout::reference_specs(config, config_ok, tokens));
}

bool is_reference_tier(std::string_view tier) { return tier == "ideal" || tier == "quantized"; }

bool is_valid_output_name(std::string_view name) {
  if (name.empty() || name.size() > 128) return false;
  for (char c : name)
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '.' || c == ':' || c == '+' || c == '-'))
      return false;
  return true;
}

}  // namespace moecheck
