// The threads launcher: starts the device threads, turns a device's exception into a world
// failure its peers observe, and rethrows the first failure once every thread is done.
#include "meshflow/comm/threads/launch.h"

#include <algorithm>
#include <system_error>
#include <thread>

#include "meshflow/comm/threads/communicator.h"
#include "meshflow/core/error.h"

namespace meshflow::threads {

void launch(const LaunchOptions& options, const std::function<void(Communicator&)>& fn) {
  const std::vector<DeviceId>& devices = options.devices;
  const int n = static_cast<int>(devices.size());
  if (n < 1) fail(ErrorKind::kInvalidArgument, "the threads backend needs at least 1 device");
  if (n > kMaxThreadDevices) {
    fail(ErrorKind::kInvalidArgument,
         "{} devices are more than the threads backend runs ({} at most); run larger meshes "
         "under mpi",
         n, kMaxThreadDevices);
  }
  std::vector<DeviceId> sorted = devices;
  std::sort(sorted.begin(), sorted.end());
  if (std::adjacent_find(sorted.begin(), sorted.end()) != sorted.end())
    fail(ErrorKind::kInvalidArgument, "{}: a device is listed twice", describe("launch", devices));
  World world(devices, options.timeout);
  std::vector<std::exception_ptr> errors(n);
  std::vector<std::thread> threads;
  threads.reserve(n);
  auto body = [&](int i) {
    const DeviceId d = devices[i];
    try {
      auto context = std::make_unique<DeviceContext>(world, d);
      errors[i] = run_device(world, d, [&] { fn(*world_communicator(*context)); });
      // Finish (or fail) async work still queued before the device counts as gone.
      context->worker.drain();
    } catch (const std::system_error& e) {  // the device's worker thread did not start
      errors[i] = std::make_exception_ptr(
          Error(ErrorKind::kCommunication,
                fmt::format("device {} could not start its worker thread: {}", d, e.what())));
      world.mark_failed(d, "its worker thread did not start");
    }
    world.mark_exited(d);
  };
  for (int i = 0; i < n; ++i) {
    try {
      threads.emplace_back(body, i);
    } catch (const std::system_error& e) {
      // Devices that started see the missing ones fail and stop; then report.
      for (int j = i; j < n; ++j) {
        world.mark_failed(devices[j], "its thread did not start");
        world.mark_exited(devices[j]);
      }
      for (auto& t : threads) t.join();
      fail(ErrorKind::kCommunication, "could not start the thread of device {} ({} of {}): {}",
           devices[i], i + 1, n, e.what());
    }
  }
  for (auto& t : threads) t.join();
  if (auto first = world.first_failed()) std::rethrow_exception(errors[world.index_of(*first)]);
}

}  // namespace meshflow::threads
