// _moecheck: the C++ half of the Python module (python/moecheck/__init__.py is the other half).
// It exposes the library the CLI is built on, in memory: a validated case (golden/CaseProblem),
// the float64 reference (reference/moe_forward), the judgement (reference/compare_output with
// the budgets of a named model) and its reports (tools/report: text, JSON, HTML). Array
// conversions (torch, ml_dtypes, bf16 bits, layouts) are the Python half's; here every array
// arrives as a C-contiguous numpy array of the stored type, and shapes are checked.
//
// Errors: an invalid case or argument raises moecheck.InputError (a ValueError) whose message
// is the CLI's "FILE: WHERE: RULE".
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>
#include <pybind11/stl/filesystem.h>

#include <filesystem>

#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "golden/case_file.hpp"
#include "golden/case_generator.hpp"
#include "golden/model_presets.hpp"
#include "golden/case_problem.hpp"
#include "reference/budget_model.hpp"
#include "reference/errors.hpp"
#include "reference/fp8_formats.hpp"
#include "reference/moe_compare.hpp"
#include "reference/moe_forward.hpp"
#include "tools/report/report.hpp"
#include "tools/sweep/gate_sweep.hpp"

namespace py = pybind11;
using namespace moecheck;

namespace {

template <class T>
using Array = py::array_t<T, py::array::c_style | py::array::forcecast>;

struct Case {
  std::shared_ptr<const CaseProblem> problem;
  std::string path;
};

// The caller's array as a vector, after checking its shape against `dims`.
template <class T>
std::vector<T> take(const Array<T>& a, const std::vector<int64_t>& dims, const std::string& where,
                    const std::string& path) {
  bool ok = a.ndim() == static_cast<py::ssize_t>(dims.size());
  for (size_t i = 0; ok && i < dims.size(); ++i) ok = a.shape(static_cast<py::ssize_t>(i)) == dims[i];
  if (!ok) {
    std::string want, got;
    for (int64_t d : dims) want += (want.empty() ? "" : ", ") + std::to_string(d);
    for (py::ssize_t i = 0; i < a.ndim(); ++i) got += (got.empty() ? "" : ", ") + std::to_string(a.shape(i));
    throw InputError(path, where, "shape must be [" + want + "], got [" + got + "]");
  }
  return std::vector<T>(a.data(), a.data() + a.size());
}

// One judged output: the facts of CompareResult with what the reports and save_case need.
struct Report {
  std::shared_ptr<const CaseProblem> problem;
  std::string case_path, model_name;
  CompareResult result;
  report::ReportContext context;
  std::vector<float> observed;
  OutputData data;  // what save_case writes as /outputs/<name>

  std::string text() const {
    std::ostringstream os;
    report::write_text(os, context_with_data(), {result});
    return os.str();
  }
  std::string json() const { return report::render_json(context_with_data(), {result}); }
  void html(const std::filesystem::path& path) const { report::write_html_file(path.string(), context_with_data(), {result}); }
  void save_case(const std::filesystem::path& path) const {
    add_output_to_case(case_path, result.name, data, path.string());
  }

 private:
  report::ReportContext context_with_data() const {
    report::ReportContext c = context;
    c.data = {{std::span<const float>(observed)}};
    return c;
  }
};

// The observation as compare_output takes it, and the same as a case's /outputs record.
struct Recorded {
  Observation obs;
  OutputData data;
};
Recorded recorded(const Case& c, const std::string& name, const Array<float>& output, bool output_bf16,
                  const std::optional<Array<int32_t>>& topk_ids, const std::optional<Array<float>>& topk_weights,
                  const std::optional<Array<float>>& expert_outputs, bool expert_outputs_bf16,
                  const std::string& model) {
  const MoeConfig& cfg = c.problem->config();
  const int64_t T = c.problem->tokens(), H = cfg.hidden_size, k = cfg.top_k;
  Recorded r;
  r.data.output = take(output, {T, H}, "output", c.path);
  r.data.output_dtype = output_bf16 ? Precision::bf16 : Precision::f32;
  if (topk_ids) r.data.topk_ids = take(*topk_ids, {T, k}, "topk_ids", c.path);
  if (topk_weights) r.data.topk_weights = take(*topk_weights, {T, k}, "topk_weights", c.path);
  if (expert_outputs) {
    r.data.expert_outputs = take(*expert_outputs, {T, k, H}, "expert_outputs", c.path);
    r.data.expert_outputs_dtype = expert_outputs_bf16 ? Precision::bf16 : Precision::f32;
  }
  r.data.attributes = {{"backend", name}, {"budget_model", model}, {"source", "moecheck Python module"}};
  r.obs.name = name;
  r.obs.output = r.data.output;
  r.obs.topk_ids = r.data.topk_ids;
  r.obs.expert_outputs = r.data.expert_outputs;
  r.obs.expert_outputs_bf16 = expert_outputs_bf16;
  return r;
}

Report judge(const Case& c, const std::string& name, const Array<float>& output, bool output_bf16,
             const std::optional<Array<int32_t>>& topk_ids, const std::optional<Array<float>>& topk_weights,
             const std::optional<Array<float>>& expert_outputs, bool expert_outputs_bf16,
             const std::string& budget_model, bool allow_vacuous, bool requant_test) {
  // The model: the one named, else the default for an output that names none (an engine's).
  const std::string model = budget_model.empty() ? budget_model_of_output({}) : budget_model;
  const BudgetModel m = parse_budget_model(model, c.path, "budget_model");
  Recorded rec = recorded(c, name, output, output_bf16, topk_ids, topk_weights, expert_outputs,
                          expert_outputs_bf16, model);
  Report rep;
  {
    py::gil_scoped_release unlocked;  // the reference runs on its own threads
    ForwardOptions fo;
    fo.tier = Tier::quantized, fo.budget = &m, fo.requant_terms = requant_test;
    const ForwardResult ref = moe_forward(c.problem->problem(), fo);
    CompareOptions opt;
    opt.model = m, opt.allow_vacuous = allow_vacuous, opt.requant_test = requant_test, opt.keep_ratios = true;
    rep.result = compare_output(c.problem->problem(), ref, rec.obs, opt);
  }
  rep.problem = c.problem, rep.case_path = c.path, rep.model_name = model;
  rep.context.case_path = c.path;
  rep.context.config = report::config_summary(c.problem->config(), c.problem->tokens());
  rep.context.budget_model = report::describe_budget_model(m);
  rep.observed = std::move(rec.obs.output);
  rep.data = std::move(rec.data);
  return rep;
}

py::array_t<double> reference(const Case& c, const std::string& tier) {
  ForwardOptions fo;
  if (tier == "ideal") fo.tier = Tier::ideal;
  else if (tier != "quantized") throw InputError(c.path, "tier", "must be 'quantized' or 'ideal', got '" + tier + "'");
  ForwardResult r;
  {
    py::gil_scoped_release unlocked;
    r = moe_forward(c.problem->problem(), fo);
  }
  const int64_t T = c.problem->tokens(), H = c.problem->config().hidden_size;
  py::array_t<double> out({T, H});
  std::copy(r.output.begin(), r.output.end(), out.mutable_data());
  return out;
}

// Case `index` of the gate's sweep of `seed` (tools/sweep/gate_sweep.hpp: the same case `moecheck gate
// --seed S --case i` runs), written to path; returns the make-case command that rebuilds it.
std::string sweep_case_file(uint64_t seed, int64_t index, const std::vector<std::string>& presets,
                            const std::vector<std::string>& recipes, const std::filesystem::path& path) {
  const std::vector<std::string> names = presets.empty() ? sweep::default_sweep_presets(false) : presets;
  for (const std::string& p : names)
    if (!find_model_preset(p)) throw InputError("", "presets", "unknown preset \"" + p + "\"; known presets: " + model_preset_names());
  GeneratorOptions g = sweep::sweep_case(seed, index, names);
  if (const std::string rule = sweep::apply_recipes(g, recipes); !rule.empty()) throw InputError("", "recipe", rule);
  py::gil_scoped_release unlocked;
  write_case(plan_case(g, path.string()), path.string());
  return make_case_command(g, path.string());
}

}  // namespace

PYBIND11_MODULE(_moecheck, m) {
  m.doc() = "moecheck's C++ library: cases, the float64 reference, judgement and reports";
  static py::exception<InputError> input_error(m, "InputError", PyExc_ValueError);
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const InputError& e) {
      input_error(e.what());
    }
  });

  py::class_<Case>(m, "Case")
      .def(py::init([](const std::filesystem::path& p) {
             const std::string path = p.string();
             return Case{std::make_shared<CaseProblem>(path), path};
           }),
           py::arg("path"), "Opens and validates a case file (every rule of `moecheck inspect`).")
      .def_readonly("path", &Case::path)
      .def_property_readonly("tokens", [](const Case& c) { return c.problem->tokens(); })
      .def_property_readonly("hidden_size", [](const Case& c) { return c.problem->config().hidden_size; })
      .def_property_readonly("top_k", [](const Case& c) { return c.problem->config().top_k; })
      .def_property_readonly("config", [](const Case& c) { return report::config_summary(c.problem->config(), c.problem->tokens()); })
      .def_property_readonly("input_hash", [](const Case& c) { return c.problem->input_hash(); });

  py::class_<Report>(m, "Report")
      .def_property_readonly("name", [](const Report& r) { return r.result.name; })
      .def_property_readonly("passed", [](const Report& r) { return r.result.pass; })
      .def_property_readonly("status", [](const Report& r) { return std::string(verdict_label(r.result)); })
      .def_property_readonly("budget_model", [](const Report& r) { return r.model_name; })
      .def("text", &Report::text)
      .def("to_json", &Report::json)
      .def("to_html", &Report::html, py::arg("path"))
      .def("save_case", &Report::save_case, py::arg("path"));

  m.def("judge", &judge, py::arg("case"), py::arg("name"), py::arg("output"), py::arg("output_bf16"),
        py::arg("topk_ids"), py::arg("topk_weights"), py::arg("expert_outputs"), py::arg("expert_outputs_bf16"),
        py::arg("budget_model"), py::arg("allow_vacuous"), py::arg("requant_test"));
  m.def("reference", &reference, py::arg("case"), py::arg("tier"));
  m.def("budget_model_names", &budget_model_names);
  m.def("sweep_case", &sweep_case_file, py::arg("seed"), py::arg("index"), py::arg("presets"), py::arg("recipes"), py::arg("path"));
  m.def("default_sweep_presets", [] { return sweep::default_sweep_presets(false); });
}
