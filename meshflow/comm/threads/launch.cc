// The threads launcher: starts the device threads, turns a device's exception into a world
// failure its peers observe, and rethrows the first failure once every thread is done.
#include "meshflow/comm/threads/launch.h"

#include <thread>

#include "meshflow/comm/threads/communicator.h"
#include "meshflow/core/error.h"

namespace meshflow::threads {

void launch(const LaunchOptions& options, const std::function<void(Communicator&)>& fn) {
  if (options.devices < 1)
    fail(ErrorKind::kInvalidArgument, "threads backend needs at least 1 device, got {}",
         options.devices);
  World world(options.devices, options.timeout);
  std::vector<std::exception_ptr> errors(options.devices);
  std::vector<std::thread> threads;
  threads.reserve(options.devices);
  for (DeviceId d = 0; d < options.devices; ++d) {
    threads.emplace_back([&, d] {
      auto context = std::make_unique<DeviceContext>(world, d);
      try {
        fn(*world_communicator(*context));
      } catch (const std::exception& e) {
        errors[d] = std::current_exception();
        world.mark_failed(d, e.what());
      } catch (...) {
        errors[d] = std::current_exception();
        world.mark_failed(d, "unknown exception");
      }
      // Finish (or fail) async work still queued before the device counts as gone.
      context->worker.drain();
      world.mark_exited(d);
    });
  }
  for (auto& t : threads) t.join();
  if (auto first = world.first_failed()) std::rethrow_exception(errors[*first]);
}

}  // namespace meshflow::threads
