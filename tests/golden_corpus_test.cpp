// The committed golden corpus (golden/cases/, golden/README.md): every recorded output of every
// case is judged by `moecheck compare` against the float64 reference on every CI run, so a change
// to the reference or the budgets that would flag real GPU outputs (recorded on an H200) fails
// here. The GPU recordings themselves must be present: a corpus that lost them proves nothing.
#include <gtest/gtest.h>

#include <filesystem>

#include "golden/case_file.hpp"
#include "tests/golden_test_support.hpp"

namespace moecheck {
namespace {

std::vector<std::string> corpus() {
  std::vector<std::string> v;
  for (const auto& e : std::filesystem::directory_iterator(test::source_path("golden/cases")))
    if (e.path().extension() == ".h5") v.push_back(e.path().string());
  std::sort(v.begin(), v.end());
  return v;
}

TEST(GoldenCorpus, EveryRecordedOutputIsWithinBudget) {
  int judged = 0, gpu_cases = 0;
  for (const std::string& path : corpus()) {
    const CaseReader r(path);
    const auto outputs = r.outputs();
    bool cuda = false, cublaslt = false;
    for (const auto& o : outputs) {
      cuda |= o.name == "cuda";
      cublaslt |= o.name == "cublaslt";
      const test::RunResult res = test::run_process({test::binary("moecheck"), "compare", path, "--output", o.name, "-q"});
      EXPECT_EQ(res.signal, 0) << path << " " << o.name << ": crashed";
      EXPECT_EQ(res.exit_code, 0) << path << " /outputs/" << o.name << " exceeds its budget:\n" << res.out << res.err;
      ++judged;
    }
    gpu_cases += cuda && cublaslt;
  }
  EXPECT_GE(judged, 3) << "the corpus holds too few recorded outputs";
  EXPECT_GE(gpu_cases, 2) << "the corpus must hold cases with /outputs/cuda and /outputs/cublaslt recorded on the GPU";
}

// The recordings must fail when they are wrong: a corpus output judged against the reference of
// a changed case (routed_scaling_factor off) must exceed its budget. Outputs recorded with input
// hashes are refused first (exit 2, naming the hash); without them (older recordings) the
// budgets must catch the change.
void strip_input_hashes(H5::H5File& f) {
  H5::Group outputs = f.openGroup("/outputs");
  for (hsize_t i = 0; i < outputs.getNumObjs(); ++i) {
    H5::Group o = outputs.openGroup(outputs.getObjnameByIdx(i));
    std::vector<std::string> hashes;
    for (int a = 0; a < o.getNumAttrs(); ++a) {
      const std::string name = o.openAttribute(static_cast<unsigned>(a)).getName();
      if (name.rfind("input_hash", 0) == 0) hashes.push_back(name);
    }
    for (const std::string& name : hashes) o.removeAttr(name);
  }
}

TEST(GoldenCorpus, AChangedReferenceIsNoticed) {
  for (const std::string& path : corpus()) {
    const CaseReader r(path);
    if (r.outputs().empty() || r.config().routed_scaling_factor == 1.0) continue;
    test::TempDir dir("corpus-changed");
    const std::string copy = dir.file("changed.h5");
    std::filesystem::copy_file(path, copy);
    test::mutate(copy, [](H5::H5File& f) {
      H5::Group g = f.openGroup("/config");
      g.removeAttr("routed_scaling_factor");
      test::set_attr(g, "routed_scaling_factor", 1.0);
    });
    test::RunResult res = test::run_process({test::binary("moecheck"), "compare", copy, "-q"});
    if (res.exit_code == 2) {
      EXPECT_NE(res.err.find("@input_hash: /config changed"), std::string::npos) << res.err;
      test::mutate(copy, strip_input_hashes);
      res = test::run_process({test::binary("moecheck"), "compare", copy, "-q"});
    }
    EXPECT_EQ(res.exit_code, 1) << path << ": a wrong reference went unnoticed\n" << res.out << res.err;
    return;
  }
  FAIL() << "no corpus case with recorded outputs and a routed_scaling_factor != 1";
}

}  // namespace
}  // namespace moecheck
