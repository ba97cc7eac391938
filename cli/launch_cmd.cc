// `meshflow launch`: a training command run, and run again from its newest checkpoint while it
// ends by a device's failure (DESIGN.md "Surviving failures"), like torchrun's --max-restarts.
#include <fmt/format.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <sstream>

#include "cli/commands.h"
#include "meshflow/core/error.h"

namespace meshflow::cli {

namespace {

std::atomic<pid_t> g_child{0};
std::atomic<bool> g_interrupted{false};

// Ctrl-C or a TERM to launch ends the run without a restart.
void on_interrupt(int signal) {
  g_interrupted = true;
  const pid_t child = g_child;
  if (child > 0) ::kill(child, signal);
}

// Whether `args` holds `flag VALUE` or `flag=VALUE` (any value when `value` is empty).
bool has_option(const std::vector<std::string>& args, const std::string& flag,
                const std::string& value = "") {
  for (std::size_t i = 0; i < args.size(); ++i) {
    if (args[i] == flag && i + 1 < args.size() && (value.empty() || args[i + 1] == value))
      return true;
    if (args[i].starts_with(flag + "=") &&
        (value.empty() || args[i].substr(flag.size() + 1) == value))
      return true;
  }
  return false;
}

// The digits right after the first `marker` in `line` (empty when none).
std::string number_after(const std::string& line, const std::string& marker) {
  const std::size_t at = line.find(marker);
  if (at == std::string::npos) return "";
  std::size_t end = at + marker.size();
  while (end < line.size() && line[end] >= '0' && line[end] <= '9') ++end;
  return line.substr(at + marker.size(), end - at - marker.size());
}

struct Ended {
  int status = 0;  // the exit status, or 128 + the signal
  bool signaled = false;
  std::string why;  // the failure's line, or the rank and signal
};

// Runs `argv` with its standard error copied through; returns how it ended.
Ended run_once(const std::vector<std::string>& argv) {
  int pipe_fds[2];
  if (::pipe(pipe_fds) != 0)
    fail(ErrorKind::kIo, "meshflow launch: cannot make a pipe: {}", std::strerror(errno));
  const pid_t pid = ::fork();
  if (pid < 0) fail(ErrorKind::kIo, "meshflow launch: cannot fork: {}", std::strerror(errno));
  if (pid == 0) {
    ::dup2(pipe_fds[1], STDERR_FILENO);
    ::close(pipe_fds[0]);
    ::close(pipe_fds[1]);
    std::vector<char*> args;
    for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    ::execvp(args[0], args.data());
    std::fprintf(stderr, "meshflow: error: cannot run %s: %s\n", args[0], std::strerror(errno));
    ::_exit(127);
  }
  g_child = pid;
  ::close(pipe_fds[1]);
  std::string pending, error_line, mpi_line;
  char buffer[4096];
  for (;;) {
    const ssize_t n = ::read(pipe_fds[0], buffer, sizeof buffer);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    ::write(STDERR_FILENO, buffer, static_cast<std::size_t>(n));
    pending.append(buffer, static_cast<std::size_t>(n));
    std::size_t end;
    while ((end = pending.find('\n')) != std::string::npos) {
      const std::string line = pending.substr(0, end);
      pending.erase(0, end + 1);
      if (line.starts_with("meshflow: error: ")) error_line = line.substr(17);
      if (line.find("exited on signal") != std::string::npos && mpi_line.empty()) mpi_line = line;
    }
  }
  ::close(pipe_fds[0]);
  int raw = 0;
  while (::waitpid(pid, &raw, 0) < 0 && errno == EINTR) {
  }
  g_child = 0;
  Ended e;
  if (WIFSIGNALED(raw)) {
    e.signaled = true;
    e.status = 128 + WTERMSIG(raw);
  } else {
    e.status = WEXITSTATUS(raw);
  }
  if (!error_line.empty()) {
    e.why = error_line;
  } else if (!mpi_line.empty()) {
    // Open MPI: "... process rank 1 with PID 123 on node x exited on signal 9 (Killed)."
    const std::string rank = number_after(mpi_line, "rank ");
    const std::string sig = number_after(mpi_line, "exited on signal ");
    if (!rank.empty() && !sig.empty()) {
      const std::size_t open = mpi_line.find('(', mpi_line.find("exited on signal "));
      const std::size_t close = open == std::string::npos ? open : mpi_line.find(')', open);
      e.why =
          fmt::format("rank {} ended by signal {}{}", rank, sig,
                      close == std::string::npos ? std::string()
                                                 : " " + mpi_line.substr(open, close - open + 1));
    } else {
      e.why = mpi_line;
    }
  } else if (e.status > 128) {
    const int sig = e.status - 128;
    e.why = fmt::format("signal {} ({})", sig, ::strsignal(sig));
  } else {
    e.why = fmt::format("exit status {}", e.status);
  }
  return e;
}

}  // namespace

void add_launch(CLI::App& app) {
  struct Args {
    int devices = 0;
    std::string mpirun_args;
    int max_restarts = 3;
    std::vector<std::string> command;
  };
  auto a = std::make_shared<Args>();
  CLI::App* cmd = app.add_subcommand(
      "launch",
      "Run `train ... --checkpoint DIR --resume auto` and run it again from its newest checkpoint "
      "while it ends by a device's failure (exit 3 or a signal)");
  cmd->add_option("-n", a->devices,
                  "run under mpirun -n N with --backend mpi (default: one process, threads)")
      ->check(CLI::Range(1, 1 << 20));
  cmd->add_option("--mpirun-args", a->mpirun_args,
                  "more arguments for mpirun, e.g. \"--oversubscribe\"");
  cmd->add_option("--max-restarts", a->max_restarts, "restarts at most R times")
      ->check(CLI::Range(0, 1 << 20))
      ->capture_default_str();
  cmd->add_option("command", a->command,
                  "after --: the meshflow command, train MODEL.json ... --checkpoint DIR "
                  "--resume auto")
      ->required();
  cmd->callback([a] {
    const std::vector<std::string>& c = a->command;
    if (c.empty() || c.front() != "train" || !has_option(c, "--checkpoint") ||
        !has_option(c, "--resume", "auto")) {
      fail(ErrorKind::kInvalidArgument,
           "meshflow launch runs `train MODEL.json ... --checkpoint DIR --resume auto` (after "
           "--): each restart resumes from the newest checkpoint; got \"{}\"",
           fmt::join(c, " "));
    }
    std::vector<std::string> argv;
    if (a->devices > 0) {
      argv = {"mpirun"};
      std::istringstream words(a->mpirun_args);
      for (std::string w; words >> w;) argv.push_back(w);
      argv.insert(argv.end(), {"-n", std::to_string(a->devices)});
    }
    char self[4096];
    const ssize_t len = ::readlink("/proc/self/exe", self, sizeof self - 1);
    argv.push_back(len > 0 ? std::string(self, static_cast<std::size_t>(len)) : "meshflow");
    argv.insert(argv.end(), c.begin(), c.end());
    if (a->devices > 0 && !has_option(c, "--backend"))
      argv.insert(argv.end(), {"--backend", "mpi"});
    struct sigaction action {};
    action.sa_handler = on_interrupt;
    ::sigaction(SIGINT, &action, nullptr);
    ::sigaction(SIGTERM, &action, nullptr);
    for (int restart = 0;; ++restart) {
      const Ended e = run_once(argv);
      // A device's failure (3) or a killed process (a signal) is restarted; bad input (1), a
      // usage error (2) and success never are.
      const bool failed = e.status == 3 || e.signaled || e.status > 128;
      if (!failed || restart >= a->max_restarts || g_interrupted) std::exit(e.status);
      fmt::print(stderr, "meshflow launch: restart {} of {} after {}\n", restart + 1,
                 a->max_restarts, e.why);
      std::fflush(stderr);
    }
  });
}

}  // namespace meshflow::cli
