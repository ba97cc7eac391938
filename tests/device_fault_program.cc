// A device that fails or falls silent in the middle of a training step, for
// cli_failures_test.py: the run must end on every device promptly (a failure: at once; a silent
// device: within --timeout), exit 3 with one line naming the device and the step, and leave no
// thread behind. The fault is injected here, in a test program, never by a knob users see.
// Usage: device_fault_program MODEL.json DEVICE STEP fail|stall [mpi] [TIMEOUT_S]
#include <fmt/format.h>

#include <chrono>
#include <cstdlib>
#include <string>
#include <thread>

#include "meshflow/comm/launch.h"
#include "meshflow/core/error.h"
#include "meshflow/graph/model_file.h"
#include "meshflow/runtime/model_runner.h"
#include "meshflow/train/optimizer.h"

int main(int argc, char** argv) {
  using namespace meshflow;
  if (argc < 5) {
    fmt::print(stderr, "usage: device_fault_program MODEL.json DEVICE STEP fail|stall [mpi] [S]\n");
    return 2;
  }
  const DeviceId device = std::atoi(argv[2]);
  const int step = std::atoi(argv[3]);
  const std::string mode = argv[4];
  ModelRunOptions options;
  if (argc > 5 && std::string(argv[5]) == "mpi") options.backend = Backend::kMpi;
  if (argc > 6) options.timeout = std::chrono::milliseconds(std::atoi(argv[6]) * 1000);
  try {
    const Model model = load_model(argv[1]);
    std::string error;
    std::optional<PreparedModel> p =
        try_prepare(model, Mode::kTrain, options, error, {.update = resolve_optimizer({}).rule});
    StepLoop loop{.steps = step + 5};
    loop.feed = [&](int k, Communicator& world, std::vector<Tensor>&,
                    std::vector<std::vector<Tensor>>&) {
      if (k != step || world.device() != device) return;
      if (mode == "fail") throw Error(ErrorKind::kCommunication, "the injected failure");
      std::this_thread::sleep_for(std::chrono::hours(1));
    };
    run_loop(p ? &*p : nullptr, error, options, loop);
  } catch (const Error& e) {
    if (e.scope() == ErrorScope::kThisDevice || prints_shared_errors())
      fmt::print(stderr, "meshflow: error: {}\n", e.what());
    return exit_status(e.kind());
  }
  return 0;
}
