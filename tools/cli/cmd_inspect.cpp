// `moecheck inspect CASE [--json]`: describe a case file and validate it.
//
// Builds one JSON document (schema in tools/README.md) and prints it either as JSON or as text;
// both carry the same facts. Exit 0 when the case is valid, 2 when it is not (an invalid case
// is an input error), with the first problem also on stderr naming the file and dataset.
#include <fmt/format.h>

#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>

#include "golden/case_file.hpp"
#include "golden/case_layout.hpp"
#include "tools/cli/cli_common.hpp"

namespace moecheck::cli {

namespace {

using Json = nlohmann::ordered_json;

struct InspectOptions {
  std::string path;
  bool json = false;
};

Json opt_string(const std::optional<std::string>& s) { return s ? Json(*s) : Json(nullptr); }

Json config_json(const CaseReader& r) {
  Json c = Json::object();
  for (const layout::ConfigAttr& a : layout::config_attrs()) {
    const std::string v = layout::config_value_text(r.config(), a.name);
    if (a.kind == layout::AttrKind::integer) c[std::string(a.name)] = std::stoll(v);
    if (a.kind == layout::AttrKind::real) c[std::string(a.name)] = std::stod(v);
    if (a.kind == layout::AttrKind::text) c[std::string(a.name)] = v;
  }
  return c;
}

// Names of the datasets stored under `group` ("/outputs/x" -> ["output", "topk_ids"]).
Json datasets_under(const CaseReader& r, const std::string& group) {
  Json names = Json::array();
  for (const DatasetInfo& d : r.datasets())
    if (d.path.rfind(group + "/", 0) == 0) names.push_back(d.path.substr(group.size() + 1));
  return names;
}

Json attr_or_null(const std::map<std::string, std::string>& attrs, const char* key) {
  const auto it = attrs.find(key);
  return it == attrs.end() ? Json(nullptr) : Json(it->second);
}

Json build_document(const CaseReader& r, const std::vector<Problem>& problems) {
  Json doc;
  doc["file"] = r.path();
  doc["format_version"] = r.format_version() >= 0 ? Json(r.format_version()) : Json(nullptr);
  doc["description"] = opt_string(r.description());
  doc["source"] = opt_string(r.source());
  doc["config"] = r.has_config() ? config_json(r) : Json(nullptr);
  doc["config_defaults"] = r.has_config() ? Json(r.config_defaults()) : Json::array();
  doc["tokens"] = r.tokens() >= 0 ? Json(r.tokens()) : Json(nullptr);
  Json ds = Json::array();
  for (const DatasetInfo& d : r.datasets())
    ds.push_back({{"path", d.path}, {"shape", d.shape}, {"dtype", d.dtype}, {"storage", d.storage}});
  doc["datasets"] = ds;
  doc["experts"] = r.config_ok() ? Json{{"stored", r.stored_experts()},
                                        {"local", r.config().local_experts()},
                                        {"subset", r.experts_subset()},
                                        {"ids", r.expert_ids()}}
                                 : Json(nullptr);
  Json outs = Json::array();
  for (const OutputInfo& o : r.outputs())
    outs.push_back({{"name", o.name},
                    {"backend", attr_or_null(o.attributes, "backend")},
                    {"device", attr_or_null(o.attributes, "device")},
                    {"created", attr_or_null(o.attributes, "created")},
                    {"shard", o.shard.empty() ? Json(nullptr) : Json(o.shard)},
                    {"attributes", o.attributes},
                    {"datasets", datasets_under(r, "/outputs/" + o.name)}});
  doc["outputs"] = outs;
  Json refs = Json::array();
  for (const ReferenceInfo& ref : r.references())
    refs.push_back({{"tier", ref.tier},
                    {"tool_version", attr_or_null(ref.attributes, "tool_version")},
                    {"input_hash", attr_or_null(ref.attributes, "input_hash")},
                    {"attributes", ref.attributes},
                    {"datasets", datasets_under(r, "/reference/" + ref.tier)}});
  doc["references"] = refs;
  doc["valid"] = problems.empty();
  Json probs = Json::array();
  for (const Problem& p : problems)
    probs.push_back({{"where", p.where}, {"rule", p.rule}, {"message", InputError(r.path(), p.where, p.rule).what()}});
  doc["problems"] = probs;
  return doc;
}

std::string text_of(const Json& v) {
  if (v.is_null()) return "-";
  if (v.is_string()) return v.get<std::string>();
  return v.dump();
}

void print_text(const Json& doc, std::ostream& out) {
  out << fmt::format("file:            {}\n", text_of(doc["file"]));
  out << fmt::format("format:          moecheck.case version {}\n", text_of(doc["format_version"]));
  if (!doc["description"].is_null()) out << fmt::format("description:     {}\n", text_of(doc["description"]));
  if (!doc["source"].is_null()) out << fmt::format("source:          {}\n", text_of(doc["source"]));
  if (!doc["config"].is_null()) {
    out << "config:\n";
    for (const auto& [k, v] : doc["config"].items()) {
      const auto& d = doc["config_defaults"];
      const bool dflt = std::find(d.begin(), d.end(), k) != d.end();
      out << fmt::format("  {:<22} {}{}\n", k, text_of(v), dflt ? "   (default)" : "");
    }
  }
  out << fmt::format("tokens (T):      {}\n", text_of(doc["tokens"]));
  out << "datasets:\n";
  for (const Json& d : doc["datasets"]) {
    const std::string dt = d["dtype"] == d["storage"] ? text_of(d["dtype"])
                                                      : fmt::format("{} ({})", text_of(d["dtype"]), text_of(d["storage"]));
    out << fmt::format("  {:<34} {:<18} {}\n", text_of(d["path"]), d["shape"].dump(), dt);
  }
  if (const Json& e = doc["experts"]; !e.is_null()) {
    out << fmt::format("experts stored:  {} of {} local", text_of(e["stored"]), text_of(e["local"]));
    if (e["subset"].get<bool>()) out << fmt::format(" (subset: ids {})", e["ids"].dump());
    out << "\n";
  }
  out << "outputs:" << (doc["outputs"].empty() ? "         none\n" : "\n");
  for (const Json& o : doc["outputs"])
    out << fmt::format("  {:<20} backend={} device={} created={}{} datasets={}\n", text_of(o["name"]),
                       text_of(o["backend"]), text_of(o["device"]), text_of(o["created"]),
                       o["shard"].is_null() ? "" : " shard=\"" + text_of(o["shard"]) + "\"", o["datasets"].dump());
  out << "references:" << (doc["references"].empty() ? "      none\n" : "\n");
  for (const Json& r : doc["references"])
    out << fmt::format("  {:<20} tool_version={} input_hash={} datasets={}\n", text_of(r["tier"]),
                       text_of(r["tool_version"]), text_of(r["input_hash"]), r["datasets"].dump());
  if (doc["valid"].get<bool>()) {
    out << "validation:      valid\n";
    return;
  }
  out << fmt::format("validation:      INVALID ({} problem{})\n", doc["problems"].size(),
                     doc["problems"].size() == 1 ? "" : "s");
  for (const Json& p : doc["problems"]) {
    const std::string where = text_of(p["where"]);
    out << fmt::format("  {}{}\n", where.empty() ? "" : where + ": ", text_of(p["rule"]));
  }
}

int run_inspect(const InspectOptions& o) {
  const CaseReader reader(o.path, CaseOpen::lenient);
  const std::vector<Problem> problems = reader.validate();
  const Json doc = build_document(reader, problems);
  if (o.json)
    std::cout << doc.dump(2) << "\n";
  else
    print_text(doc, std::cout);
  std::cout.flush();
  if (problems.empty()) return kExitOk;
  const Problem& first = problems.front();
  print_error(fmt::format("{}{}", InputError(o.path, first.where, first.rule).what(),
                          problems.size() > 1 ? fmt::format(" (and {} more problem{})", problems.size() - 1,
                                                              problems.size() > 2 ? "s" : "")
                                          : ""));
  return kExitInputError;
}

}  // namespace

void register_inspect(CLI::App& app) {
  auto o = std::make_shared<InspectOptions>();
  CLI::App* sub = app.add_subcommand("inspect", "Describe a case file and validate it (exit 2 when it is invalid)");
  sub->add_option("case", o->path, "case file (HDF5, golden/FORMAT.md)")->required();
  sub->add_flag("--json", o->json, "print one JSON document (schema: tools/README.md)");
  set_runner(sub, [o] { return run_inspect(*o); });
}

}  // namespace moecheck::cli
