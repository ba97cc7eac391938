// Starting the `threads` backend: one thread per device in this process.
#pragma once

#include <functional>

#include "meshflow/comm/backend.h"

namespace meshflow::threads {

// Runs fn(comm) on options.devices threads; see meshflow::launch.
void launch(const LaunchOptions& options, const std::function<void(Communicator&)>& fn);

}  // namespace meshflow::threads
