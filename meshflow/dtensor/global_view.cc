#include "meshflow/dtensor/global_view.h"

#include <algorithm>
#include <mutex>

#include "meshflow/core/error.h"
#include "meshflow/dtensor/dtensor.h"
#include "meshflow/mesh/sharding.h"

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

}  // namespace

GlobalTensor distribute(const Session& session, const Tensor& global, const DeviceMesh& mesh,
                        std::vector<Placement> placements) {
  Layout layout = make_layout(mesh, std::move(placements), global.shape(), global.dtype());
  check_shardable(layout);
  GlobalTensor out{layout, {}};
  for (DeviceId d : driven(session, mesh))
    out.shards.emplace(d, slice(global, shard_box(layout, d)));
  return out;
}

Tensor full_tensor(Session& session, const GlobalTensor& t) {
  if (session.backend() == Backend::kThreads) {
    std::vector<const Tensor*> shards;
    shards.reserve(t.shards.size());
    for (DeviceId d : t.layout.mesh.devices) shards.push_back(&t.shards.at(d));
    return assemble(t.layout, shards);
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
  std::vector<TensorSpec> specs;
  for (std::size_t i = 0; i < operands.size(); ++i) {
    const Layout& l = operands[i]->layout;
    if (!(l.mesh == mesh)) {
      fail(ErrorKind::kInvalidArgument,
           "{}: operand {} is on mesh {} but operand 0 is on mesh {}; redistribute it first",
           to_string(op.type), i, to_string(l.mesh), to_string(mesh));
    }
    specs.push_back({l.shape, l.dtype});
  }
  infer(op, specs);  // a wrong operand is one error here rather than one per device
  Results results;
  std::vector<Layout> layout(1);
  std::once_flag layout_once;
  session.run(mesh.devices, [&](Communicator& comm) {
    std::vector<Layout> layouts;
    std::vector<const Tensor*> shards;
    for (const GlobalTensor* g : operands) {
      layouts.push_back(g->layout);
      shards.push_back(&g->shards.at(comm.device()));
    }
    DTensor out = meshflow::apply_op(comm, op, std::move(layouts), shards);
    std::call_once(layout_once, [&] { layout[0] = out.layout; });
    results.put(comm.device(), std::move(out.local));
  });
  return {layout[0], results.take()};
}

GlobalTensor scalar(const Session& session, double value, DType dtype, const DeviceMesh& mesh) {
  Tensor t(dtype, Shape{});
  visit_dtype(dtype, [&](auto zero) {
    using T = decltype(zero);
    t.data<T>()[0] = static_cast<T>(value);
  });
  return distribute(session, t, mesh, std::vector<Placement>(mesh.shape.size()));
}

}  // namespace meshflow
