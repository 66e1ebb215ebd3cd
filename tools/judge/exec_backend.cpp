// Backend "exec:CMD": an external command as a backend (exec_backend.hpp).
#include "tools/judge/exec_backend.hpp"

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fmt/format.h>
#include <fstream>
#include <optional>
#include <thread>

#include "golden/case_layout.hpp"
#include "golden/hdf5_io.hpp"
#include "golden/interrupt.hpp"
#include "reference/budget_model.hpp"
#include "reference/fp8_formats.hpp"
#include "tools/judge/backend_run.hpp"

extern char** environ;

namespace moecheck::judge {

namespace fs = std::filesystem;

namespace {

double g_exec_timeout = 600;
constexpr size_t kTailBytes = 4096;          // what a failure shows of the command's output
constexpr double kTermGraceSeconds = 2;      // SIGTERM, then SIGKILL after this long

// ---- the scratch directory ---------------------------------------------------------------
// A private directory (mode 0700 by mkdtemp), removed with its contents when the run ends and,
// through the ScratchPath, when moecheck is interrupted.
class ScratchDir {
 public:
  ScratchDir() {
    std::string tmpl = (fs::temp_directory_path() / "moecheck-exec-XXXXXX").string();
    if (!mkdtemp(tmpl.data())) throw ExecFailure("exec: cannot create a scratch directory " + tmpl);
    path_ = tmpl;
    scratch_.emplace(path_);
  }
  ~ScratchDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  std::string file(const char* name) const { return (fs::path(path_) / name).string(); }

 private:
  std::string path_;
  std::optional<interrupt::ScratchPath> scratch_;
};

// ---- step 2: the case's inputs -----------------------------------------------------------
// /config, /inputs and /weights of the case, copied object by object (attributes, dtypes, chunking
// and data bit for bit), and the root attributes of a version-1 case.
void write_case_inputs(const CaseReader& rd, const std::string& dst) {
  h5::silence();
  h5::guard(dst, "", [&] {
    H5::FileAccPropList fapl;
    H5Pset_file_locking(fapl.getId(), false, true);
    const H5::H5File src(rd.path(), H5F_ACC_RDONLY, H5::FileCreatPropList::DEFAULT, fapl);
    H5::H5File out(dst, H5F_ACC_EXCL);
    h5::write_attr(out, "format", std::string(kCaseFormat));
    h5::write_attr(out, "format_version", int64_t(kCaseFormatVersion));
    h5::write_attr(out, "description", "inputs of " + rd.path() + " for an exec backend (moecheck " MOECHECK_VERSION ")");
    for (const char* g : {"config", "inputs", "weights"})
      if (H5Ocopy(src.getId(), g, out.getId(), g, H5P_DEFAULT, H5P_DEFAULT) < 0)
        throw InputError(rd.path(), std::string("/") + g, "cannot copy into the exec backend's case file");
    out.close();
  });
}

// ---- step 3: the command line --------------------------------------------------------------
std::string replace_all(std::string s, std::string_view what, std::string_view with) {
  for (size_t i = s.find(what); i != std::string::npos; i = s.find(what, i + with.size())) s.replace(i, what.size(), with);
  return s;
}

std::string substituted(const std::string& tmpl, const std::string& case_path, const std::string& out_path) {
  // {fault} first: a scratch path never holds the text "{fault}", but a fault name is no path.
  std::string s = replace_all(tmpl, "{fault}", "none");
  s = replace_all(s, "{case}", shell_quote(case_path));
  return replace_all(s, "{out}", shell_quote(out_path));
}

// ---- step 4: spawn and wait ---------------------------------------------------------------
struct ChildEnd {
  bool timed_out = false;
  int status = 0;  // waitpid's status
  double seconds = 0;
  std::string describe() const {
    if (timed_out) return fmt::format("timed out (--exec-timeout {} s): its process group was killed", g_exec_timeout);
    if (WIFEXITED(status)) return fmt::format("exit status {}", WEXITSTATUS(status));
    if (WIFSIGNALED(status)) {
      const char* name = sigabbrev_np(WTERMSIG(status));
      return fmt::format("killed by signal {} (SIG{})", WTERMSIG(status), name ? name : "?");
    }
    return fmt::format("ended with wait status {}", status);
  }
  bool ok() const { return !timed_out && WIFEXITED(status) && WEXITSTATUS(status) == 0; }
  bool declined() const { return !timed_out && WIFEXITED(status) && WEXITSTATUS(status) == kExecUnsupported; }
};

// Starts /bin/sh -c cmd as the leader of a new process group, with SIGINT/SIGTERM (and the other
// signals moecheck might hold) unblocked and at their default action, stdin /dev/null, stdout and
// stderr into `log`. Returns the pid, -1 with errno set when posix_spawn failed.
pid_t spawn_shell(const std::string& cmd, const std::string& log) {
  posix_spawn_file_actions_t fa;
  posix_spawnattr_t at;
  posix_spawn_file_actions_init(&fa);
  posix_spawnattr_init(&at);
  posix_spawn_file_actions_addopen(&fa, STDIN_FILENO, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_addopen(&fa, STDOUT_FILENO, log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
  posix_spawn_file_actions_adddup2(&fa, STDOUT_FILENO, STDERR_FILENO);
  sigset_t none, dflt;
  sigemptyset(&none);
  sigemptyset(&dflt);
  for (int s : {SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGPIPE, SIGCHLD}) sigaddset(&dflt, s);
  posix_spawnattr_setsigmask(&at, &none);
  posix_spawnattr_setsigdefault(&at, &dflt);
  posix_spawnattr_setpgroup(&at, 0);
  posix_spawnattr_setflags(&at, POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF | POSIX_SPAWN_SETPGROUP);
  const char* argv[] = {"/bin/sh", "-c", cmd.c_str(), nullptr};
  pid_t pid = -1;
  const int rc = posix_spawn(&pid, "/bin/sh", &fa, &at, const_cast<char* const*>(argv), environ);
  posix_spawn_file_actions_destroy(&fa);
  posix_spawnattr_destroy(&at);
  if (rc != 0) {
    errno = rc;
    return -1;
  }
  return pid;
}

// Waits for pid until `deadline`; true when it ended (status filled in).
bool wait_until(pid_t pid, std::chrono::steady_clock::time_point deadline, int& status) {
  auto nap = std::chrono::milliseconds(1);
  for (;;) {
    const pid_t r = waitpid(pid, &status, WNOHANG);
    if (r == pid || (r < 0 && errno != EINTR)) return true;
    if (std::chrono::steady_clock::now() >= deadline) return false;
    std::this_thread::sleep_for(nap);
    nap = std::min(nap * 2, std::chrono::milliseconds(20));
  }
}

ChildEnd run_command(const std::string& cmd, const std::string& log) {
  using clock = std::chrono::steady_clock;
  const auto t0 = clock::now();
  int spawn_errno = 0;
  interrupt::ChildGroup child([&] {
    const pid_t p = spawn_shell(cmd, log);
    spawn_errno = errno;
    return p;
  });
  if (child.pid() < 0) throw ExecFailure(fmt::format("exec: cannot start /bin/sh: {}", std::strerror(spawn_errno)));
  const pid_t pid = child.pid();
  ChildEnd end;
  const auto deadline = t0 + std::chrono::duration_cast<clock::duration>(std::chrono::duration<double>(g_exec_timeout));
  if (!wait_until(pid, deadline, end.status)) {
    end.timed_out = true;
    kill(-pid, SIGTERM);
    if (!wait_until(pid, clock::now() + std::chrono::duration_cast<clock::duration>(std::chrono::duration<double>(kTermGraceSeconds)), end.status)) {
      kill(-pid, SIGKILL);
      waitpid(pid, &end.status, 0);
    }
  }
  kill(-pid, SIGKILL);  // whatever the command left running in its group
  child.release();
  end.seconds = std::chrono::duration<double>(clock::now() - t0).count();
  return end;
}

std::string tail_of(const std::string& log) {
  std::ifstream f(log, std::ios::binary | std::ios::ate);
  if (!f) return "";
  const std::streamoff size = f.tellg();
  const std::streamoff from = std::max<std::streamoff>(0, size - std::streamoff(kTailBytes));
  f.seekg(from);
  std::string s(size_t(size - from), '\0');
  f.read(s.data(), std::streamsize(s.size()));
  if (from > 0) s = fmt::format("[... {} bytes before]\n", from) + s;
  while (!s.empty() && s.back() == '\n') s.pop_back();
  return s;
}

// ---- step 5: the output file ----------------------------------------------------------------
void require_hdf5_file(const std::string& out) {
  std::error_code ec;
  if (!fs::exists(out, ec)) throw InputError(out, "", "the command wrote no output file");
  if (!fs::is_regular_file(out, ec)) throw InputError(out, "", "not a regular file");
  if (H5Fis_hdf5(out.c_str()) <= 0) throw InputError(out, "", "not an HDF5 file (no HDF5 signature)");
}

// The one group under /outputs, and its path.
struct OutputGroup {
  std::string path;  // "/outputs/<name>"
  H5::Group group;
};
OutputGroup only_output_group(const H5::H5File& f, const std::string& out) {
  if (!f.nameExists("outputs")) throw InputError(out, "/outputs", "required group missing");
  const H5::Group outputs = h5::guard(out, "/outputs", [&] { return f.openGroup("outputs"); });
  const std::vector<h5::Member> groups = h5::members(outputs, out, "/outputs");
  if (groups.size() != 1)
    throw InputError(out, "/outputs", fmt::format("must hold exactly one output group, got {}", groups.size()));
  const std::string name = groups.front().name, gp = "/outputs/" + name;
  if (!is_valid_output_name(name)) throw InputError(out, gp, "output names are 1-128 characters of A-Z a-z 0-9 _ . : + -");
  if (groups.front().kind != h5::LinkKind::group)
    throw InputError(out, gp, "must be a group, got a " + h5::to_string(groups.front().kind));
  return {gp, outputs.openGroup(name)};
}

// The group's budget_model and device attributes (others are ignored).
void read_output_attributes(const H5::Group& g, const std::string& out, const std::string& gp, BackendOutput& r) {
  for (const std::string& a : h5::attribute_names(g, out, gp)) {
    const std::string where = gp + "@" + a;
    if (a == "budget_model") {
      r.budget_model = h5::read_string_attr(g.openAttribute(a), out, where);
      if (!try_parse_budget_model(r.budget_model))
        throw InputError(out, where, fmt::format("must be {}, got '{}'", budget_model_names(), r.budget_model));
    } else if (a == "device") {
      r.device = h5::read_string_attr(g.openAttribute(a), out, where);
    }
  }
}

// Member m of the group, checked against its spec (a dataset, its encoding, shape and storage),
// into r; expert_outputs only when asked for.
void read_output_dataset(const H5::Group& g, const h5::Member& m, const std::vector<layout::Spec>& specs,
                         const std::string& out, const std::string& gp, bool expert_outputs, BackendOutput& r) {
  const std::string p = gp + "/" + m.name;
  const layout::Spec* s = layout::find_spec(specs, m.name);
  if (!s) throw InputError(out, p, fmt::format("unknown dataset (this group holds only {})", layout::spec_names(specs)));
  if (m.kind != h5::LinkKind::dataset) throw InputError(out, p, "must be a dataset, got a " + h5::to_string(m.kind));
  const H5::DataSet ds = g.openDataSet(m.name);
  const std::string dtype = layout::check_encoding(ds, s->enc, out, p);
  const std::vector<uint64_t> dims = h5::extent(ds);
  bool shape_ok = dims.size() == s->shape.size();
  for (size_t i = 0; shape_ok && i < dims.size(); ++i) shape_ok = int64_t(dims[i]) == s->shape[i].value;
  if (!shape_ok)
    throw InputError(out, p, fmt::format("shape must be {}, got {}", layout::shape_text(s->shape), h5::shape_text(dims)));
  if (const std::string sp = h5::storage_problem(ds); !sp.empty()) throw InputError(out, p, sp);
  const std::vector<uint64_t> zero(dims.size(), 0);
  const bool bf16 = dtype == "bfloat16";
  auto floats = [&] {
    if (!bf16) return h5::read_box_as<float>(ds, H5::PredType::NATIVE_FLOAT, zero, dims, out, p);
    const auto bits = h5::read_box_as<uint16_t>(ds, H5::PredType::NATIVE_UINT16, zero, dims, out, p);
    std::vector<float> v(bits.size());
    for (size_t i = 0; i < v.size(); ++i) v[i] = bf16_decode(bits[i]);
    return v;
  };
  if (m.name == "output") {
    if (bf16) r.output_bf16 = h5::read_box_as<uint16_t>(ds, H5::PredType::NATIVE_UINT16, zero, dims, out, p);
    else r.output_f32 = floats();
  } else if (m.name == "topk_ids") {
    r.topk_ids = h5::read_box_as<int32_t>(ds, H5::PredType::NATIVE_INT32, zero, dims, out, p);
  } else if (m.name == "topk_weights") {
    r.topk_weights = floats();
  } else if (m.name == "expert_outputs" && expert_outputs) {
    r.expert_outputs = floats();
    r.expert_outputs_bf16 = bf16;
  }
}

// Reads <out>: exactly one group under /outputs, checked against FORMAT.md's /outputs/<name>
// specs with the case's T, k and H. Throws InputError(out, where, rule) for a malformed file.
BackendOutput read_output_file(const std::string& out, const CaseProblem& cp, bool expert_outputs) {
  require_hdf5_file(out);
  h5::silence();
  return h5::guard(out, "", [&] {
    H5::FileAccPropList fapl;
    H5Pset_file_locking(fapl.getId(), false, true);
    const H5::H5File f(out, H5F_ACC_RDONLY, H5::FileCreatPropList::DEFAULT, fapl);
    const auto [gp, g] = only_output_group(f, out);
    BackendOutput r;
    const MoeConfig& c = cp.config();
    r.tokens = cp.tokens(), r.hidden = c.hidden_size, r.top_k = c.top_k;
    r.device = "external command";
    read_output_attributes(g, out, gp, r);
    const std::vector<layout::Spec> specs = layout::output_specs(c, true, cp.tokens());
    for (const h5::Member& m : h5::members(g, out, gp)) read_output_dataset(g, m, specs, out, gp, expert_outputs, r);
    if (r.output_bf16.empty() && r.output_f32.empty()) throw InputError(out, gp + "/output", "required dataset missing");
    return r;
  });
}

// The last non-empty line the command printed (its reason for declining a case), at most 300 bytes.
std::string last_line_of(const std::string& log) {
  std::string t = tail_of(log);
  while (!t.empty() && (t.back() == '\n' || t.back() == '\r' || t.back() == ' ')) t.pop_back();
  const size_t nl = t.find_last_of('\n');
  std::string line = nl == std::string::npos ? t : t.substr(nl + 1);
  return line.size() > 300 ? line.substr(0, 300) + "..." : line;
}

std::string failure_text(const std::string& what, const std::string& cmd, const ChildEnd& end, const std::string& log) {
  const std::string tail = tail_of(log);
  return fmt::format("{}\n    command: /bin/sh -c {}\n    {} after {:.2f} s\n    output of the command (stdout and stderr, last {} bytes):{}",
                     what, shell_quote(cmd), end.describe(), end.seconds, kTailBytes,
                     tail.empty() ? " (nothing)" : "\n      " + replace_all(tail, "\n", "\n      "));
}

}  // namespace

std::string shell_quote(std::string_view s) {
  const bool plain = !s.empty() && s.find_first_not_of("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
                                                       "0123456789_./:=@%+,-") == std::string_view::npos;
  if (plain) return std::string(s);
  std::string q = "'";  // appended, not "'" + std::string&&: GCC 12 warns -Wrestrict on that (a false positive)
  q += replace_all(std::string(s), "'", "'\\''");
  q += "'";
  return q;
}

std::string exec_command_template(const std::string& backend) {
  if (!is_exec_backend(backend)) throw InputError("", "--backend", "not an exec:CMD backend: '" + backend + "'");
  const std::string cmd = backend.substr(kExecPrefix.size());
  if (cmd.find_first_not_of(" \t\n") == std::string::npos)
    throw InputError("", "--backend", "exec:CMD needs a command, got an empty one (e.g. exec:'python3 my_kernel.py {case} {out}')");
  if (cmd.find("{out}") == std::string::npos)
    throw InputError("", "--backend",
                     "exec:CMD must name the output file with {out} (and the case with {case}), got '" + cmd + "'");
  return cmd;
}

std::string exec_with_fault(const std::string& backend, std::string_view fault) {
  return replace_all(backend, "{fault}", fault);
}

std::string default_output_name(const std::string& backend) {
  if (is_exec_backend(backend)) return "exec";
  std::string name = backend;
  std::replace(name.begin(), name.end(), '@', '+');
  return name;
}

std::vector<std::string> exec_fault_names(const std::string& backend, const std::string& faults_csv) {
  if (!is_exec_backend(backend))
    throw InputError("", "--backend", "faults takes exec:CMD only (the built-in faults run without --backend), got '" + backend + "'");
  const std::string cmd = exec_command_template(backend);
  if (cmd.find("{fault}") == std::string::npos)
    throw InputError("", "--backend",
                     "faults needs {fault} in CMD (replaced by each mutant's name, 'none' for the correct run), got '" + cmd + "'");
  std::vector<std::string> names = {"none"};
  for (size_t i = 0; i <= faults_csv.size();) {
    const size_t j = std::min(faults_csv.find(',', i), faults_csv.size());
    const std::string f = faults_csv.substr(i, j - i);
    i = j + 1;
    if (f.empty()) continue;
    if (f == "none" || f.find_first_not_of("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_") != std::string::npos)
      throw InputError("", "--faults", "fault names are [A-Za-z0-9_]+ and not 'none', got '" + f + "'");
    names.push_back(f);
  }
  if (names.size() == 1) throw InputError("", "--faults", "name the mutants CMD implements (e.g. --faults gate_up_swap,output_scale_2pct)");
  return names;
}

double exec_timeout_seconds() { return g_exec_timeout; }

void set_exec_timeout_seconds(double seconds) { g_exec_timeout = seconds; }

BackendOutput run_exec_backend(const CaseProblem& cp, const std::string& backend, bool expert_outputs) {
  const std::string tmpl = exec_command_template(backend);
  const ScratchDir dir;
  const std::string case_file = dir.file("case.h5"), out_file = dir.file("out.h5"), log = dir.file("log");
  try {
    write_case_inputs(cp.reader(), case_file);
  } catch (const InputError& e) {  // the scratch file system, not the command: still no verdict to give
    throw ExecFailure(fmt::format("exec: cannot write the case's inputs for the command: {}", e.what()));
  }
  const std::string cmd = substituted(tmpl, case_file, out_file);
  const ChildEnd end = run_command(cmd, log);
  if (end.declined()) {
    const std::string why = last_line_of(log);
    throw BackendUnsupported(cp.problem().source, "", fmt::format("the command declines this case (exit status {}){}",
                                                                  kExecUnsupported, why.empty() ? "" : ": " + why));
  }
  if (!end.ok()) throw ExecFailure(failure_text("the exec backend's command failed", cmd, end, log));
  try {
    BackendOutput r = read_output_file(out_file, cp, expert_outputs);
    r.backend = backend;
    return r;
  } catch (const InputError& e) {
    throw ExecFailure(failure_text(fmt::format("the exec backend's output file is not usable: {}", e.what()), cmd, end, log));
  }
}

}  // namespace moecheck::judge
