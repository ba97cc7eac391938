#include "meshflow/dtensor/global_view.h"

#include <algorithm>
#include <atomic>
#include <mutex>
#include <optional>
#include <thread>
#include <unordered_map>

#include "meshflow/core/clock.h"
#include "meshflow/core/error.h"
#include "meshflow/dtensor/dtensor.h"
#include "meshflow/mesh/sharding.h"
#include "meshflow/plan/cost_model.h"

namespace meshflow {

namespace {

// The devices of `mesh` this process drives.
std::vector<DeviceId> driven(const Session& session, const DeviceMesh& mesh) {
  std::vector<DeviceId> out;
  for (DeviceId d : mesh.devices)
    if (session.drives(d)) out.push_back(d);
  return out;
}

// Returns the devices of a and b, each once, in a's order then b's.
std::vector<DeviceId> union_of(const std::vector<DeviceId>& a, const std::vector<DeviceId>& b) {
  std::vector<DeviceId> out = a;
  for (DeviceId d : b)
    if (std::find(out.begin(), out.end(), d) == out.end()) out.push_back(d);
  return out;
}

// Collects one result shard per device from concurrent device threads.
class Results {
 public:
  void put(DeviceId d, Tensor t) {
    std::lock_guard lock(mu_);
    shards_.emplace(d, std::move(t));
  }
  std::map<DeviceId, Tensor> take() { return std::move(shards_); }

 private:
  std::mutex mu_;
  std::map<DeviceId, Tensor> shards_;
};

// Where work that moves no data runs: on the calling thread, every device's part one after
// another, or handed to the device threads, which share min(devices, cores) cores.
struct Placing {
  double here_s;     // seconds on the calling thread
  double threads_s;  // seconds on the device threads, the handoff included
  bool here() const { return here_s <= threads_s; }
};

// Returns the cost model's estimate for work of `serial_s` (every device's part, one after
// another) on `devices` devices. Under mpi this process drives one device, on this thread.
Placing estimate(const Session& session, std::size_t devices, double serial_s) {
  static const unsigned machine_cores = std::max(1u, std::thread::hardware_concurrency());
  const double cores = static_cast<double>(std::min<std::size_t>(devices, machine_cores));
  const double handoff_s = default_machine().device_handoff_us * 1e-6;
  if (session.backend() == Backend::kMpi || cores <= 1) return {serial_s, serial_s + handoff_s};
  return {serial_s, handoff_s + serial_s / cores};
}

// Runs fn(device) for every device of `devices`, none of which communicates, where `here` says:
// on the calling thread one after another, or concurrently on the device threads (never under
// mpi, where `devices` holds at most this process's own device). Returns the seconds it took.
double for_each_device(Session& session, const std::vector<DeviceId>& devices, bool here,
                       const std::function<void(DeviceId)>& fn) {
  const double start = steady_seconds();
  if (here || session.backend() == Backend::kMpi) {
    for (DeviceId d : devices) fn(d);
  } else {
    session.run(devices, [&](Communicator& comm) { fn(comm.device()); });
  }
  return steady_seconds() - start;
}

// Returns the seconds of copying `bytes` on one thread (reading them and writing them).
double copy_seconds(std::int64_t bytes) {
  return static_cast<double>(bytes) / (default_machine().memcpy_gbps * 1e9);
}

// apply_op's routes, decided once per (operator, operand layouts); a lookup copies no layout.
struct Route {
  Route(OpRoute r, Placing p) : decided(std::move(r)), here_s(p.here_s), threads_s(p.threads_s) {}
  const OpRoute decided;
  // Where no data moves: the fastest call run each way (the cost model's estimate until one has
  // run that way). Calls run the faster way; every kExploreEvery-th call runs the other (unless
  // running here beats even the handoff), so that one slow first try (buffers faulted in,
  // threads woken) does not decide for good.
  static constexpr std::uint64_t kExploreEvery = 32;
  std::atomic<double> here_s, threads_s;
  std::atomic<bool> here_run{false}, threads_run{false};  // the estimate was replaced
  std::atomic<std::uint64_t> calls{0};

  bool run_here() {
    const double here = here_s.load();
    const bool faster = Placing{here, threads_s.load()}.here();
    // Work that takes less here than the handoff alone never goes to the threads.
    if (faster && here <= default_machine().device_handoff_us * 1e-6) return true;
    return calls.fetch_add(1) % kExploreEvery == kExploreEvery - 1 ? !faster : faster;
  }
  void took(bool here, double seconds) {
    std::atomic<double>& best = here ? here_s : threads_s;
    if (!(here ? here_run : threads_run).exchange(true)) {
      best.store(seconds);
      return;
    }
    double now = best.load();
    while (seconds < now && !best.compare_exchange_weak(now, seconds)) {
    }
  }
};

class Routes {
 public:
  // A route with the operand layouts it was found for (the key's: no copy per call).
  struct Found {
    const std::vector<Layout>& layouts;
    Route& route;
  };

  // Returns the route of `op` on `operands`; the references stay valid (routes are never
  // removed).
  Found get(const Session& session, const Op& op,
            const std::vector<const GlobalTensor*>& operands) {
    {
      std::lock_guard lock(mu_);
      auto it = routes_.find(KeyView{op, operands});
      if (it != routes_.end()) return {it->first.layouts, it->second};
    }
    Key key{op, {}};
    for (const GlobalTensor* g : operands) key.layouts.push_back(g->layout);
    OpRoute r = route(op, key.layouts);
    const Placing p =
        estimate(session, key.layouts[0].mesh.devices.size(), r.local_kernels_s.value_or(0));
    std::lock_guard lock(mu_);
    auto it = routes_.try_emplace(std::move(key), std::move(r), p).first;
    return {it->first.layouts, it->second};
  }

 private:
  struct Key {
    Op op;
    std::vector<Layout> layouts;
    std::size_t size() const { return layouts.size(); }
    const Layout& at(std::size_t i) const { return layouts[i]; }
  };
  struct KeyView {
    const Op& op;
    const std::vector<const GlobalTensor*>& operands;
    std::size_t size() const { return operands.size(); }
    const Layout& at(std::size_t i) const { return operands[i]->layout; }
  };
  struct Hash {
    using is_transparent = void;
    template <typename K>
    std::size_t operator()(const K& k) const {
      std::size_t h = hash_value(k.op);
      for (std::size_t i = 0; i < k.size(); ++i) h = h * 31 + hash_value(k.at(i));
      return h;
    }
  };
  struct Equal {
    using is_transparent = void;
    template <typename A, typename B>
    bool operator()(const A& a, const B& b) const {
      if (!(a.op == b.op) || a.size() != b.size()) return false;
      for (std::size_t i = 0; i < a.size(); ++i)
        if (!(a.at(i) == b.at(i))) return false;
      return true;
    }
  };
  std::mutex mu_;
  std::unordered_map<Key, Route, Hash, Equal> routes_;
};

Routes& routes() {
  static Routes r;
  return r;
}

}  // namespace

GlobalTensor distribute(Session& session, TensorView global, const DeviceMesh& mesh,
                        std::vector<Placement> placements) {
  Layout layout = make_layout(mesh, std::move(placements), global.shape, global.dtype);
  check_shardable(layout);
  const std::vector<DeviceId> devices = driven(session, mesh);
  std::int64_t bytes = 0;
  for (DeviceId d : devices)
    bytes += numel(local_shape(layout, d)) * static_cast<std::int64_t>(size_of(layout.dtype));
  Results results;
  const bool here = estimate(session, devices.size(), copy_seconds(bytes)).here();
  for_each_device(session, devices, here,
                  [&](DeviceId d) { results.put(d, slice(global, shard_box(layout, d))); });
  return {std::move(layout), results.take()};
}

Tensor full_tensor(Session& session, const GlobalTensor& t) {
  if (session.backend() == Backend::kThreads) {
    std::vector<const Tensor*> shards;
    shards.reserve(t.shards.size());
    for (DeviceId d : t.layout.mesh.devices) shards.push_back(&t.shards.at(d));
    Tensor out = Tensor::uninitialized(t.layout.dtype, t.layout.shape);
    std::vector<DeviceId> representatives;
    for (DeviceId d : t.layout.mesh.devices)
      if (is_representative(t.layout, d)) representatives.push_back(d);
    std::int64_t terms = 1;  // each element is read from every term of its Partial group
    for (std::int64_t n : partial_group(t.layout).sizes) terms *= n;
    const double serial_s = copy_seconds(static_cast<std::int64_t>(out.nbytes()) * terms);
    const bool here = estimate(session, representatives.size(), serial_s).here();
    for_each_device(session, representatives, here,
                    [&](DeviceId d) { assemble_part(t.layout, shards, d, out); });
    return out;
  }
  if (t.shards.empty()) {
    fail(ErrorKind::kInvalidArgument,
         "full_tensor: device {} (this process) is not in mesh {}, so it holds no shard",
         session.rank(), to_string(t.layout.mesh));
  }
  Tensor out;
  session.run(t.layout.mesh.devices, [&](Communicator& comm) {
    std::vector<Placement> all_r(t.layout.placements.size(), Placement::replicate());
    const Layout whole = make_layout(t.layout.mesh, all_r, t.layout.shape, t.layout.dtype);
    out = redistribute_shard(comm, t.shards.at(comm.device()), t.layout, whole);
  });
  return out;
}

GlobalTensor redistribute(Session& session, const GlobalTensor& t, const DeviceMesh& mesh,
                          std::vector<Placement> placements) {
  // Checked here, before any device starts, so that a bad target is one error, not n.
  const Layout to = make_layout(mesh, placements, t.layout.shape, t.layout.dtype);
  Results results;
  session.run(union_of(t.layout.mesh.devices, mesh.devices), [&](Communicator& comm) {
    const Tensor none;
    auto it = t.shards.find(comm.device());
    Tensor moved = redistribute_shard(comm, it == t.shards.end() ? none : it->second, t.layout, to);
    if (find_device(mesh, comm.device())) results.put(comm.device(), std::move(moved));
  });
  return {to, results.take()};
}

GlobalTensor apply_op(Session& session, const Op& op,
                      const std::vector<const GlobalTensor*>& operands) {
  MESHFLOW_CHECK(!operands.empty());
  const DeviceMesh& mesh = operands[0]->layout.mesh;
  for (std::size_t i = 1; i < operands.size(); ++i) {
    const Layout& l = operands[i]->layout;
    if (!(l.mesh == mesh)) {
      fail(ErrorKind::kInvalidArgument,
           "{}: operand {} is on mesh {} but operand 0 is on mesh {}; redistribute it first",
           to_string(op.type), i, to_string(l.mesh), to_string(mesh));
    }
  }
  // A wrong operand is one error here rather than one per device.
  const Routes::Found found = routes().get(session, op, operands);
  const std::vector<Layout>& layouts = found.layouts;
  Route& r = found.route;
  auto shards_of = [&](DeviceId d) {
    std::vector<const Tensor*> shards;
    for (const GlobalTensor* g : operands) shards.push_back(&g->shards.at(d));
    return shards;
  };
  Results results;
  if (r.decided.local_kernels_s) {
    const bool here = r.run_here();
    r.took(here, for_each_device(session, driven(session, mesh), here, [&](DeviceId d) {
             results.put(d, apply_local(op, layouts, shards_of(d), d).local);
           }));
  } else {
    session.run(mesh.devices, [&](Communicator& comm) {
      results.put(comm.device(),
                  meshflow::apply_op(comm, op, layouts, shards_of(comm.device())).local);
    });
  }
  return {r.decided.output, results.take()};
}

GlobalTensor scalar(Session& session, double value, DType dtype, const DeviceMesh& mesh) {
  Tensor t(dtype, Shape{});
  visit_dtype(dtype, [&](auto zero) {
    using T = decltype(zero);
    t.data<T>()[0] = static_cast<T>(value);
  });
  return distribute(session, view(t), mesh, std::vector<Placement>(mesh.shape.size()));
}

}  // namespace meshflow
