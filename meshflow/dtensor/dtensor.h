// The eager DTensor API: a distributed tensor is one device's local shard plus its Layout and
// the device's communicator. Every operator call propagates sharding (ops/strategy.h), moves
// operands through the runtime's plan executor only where the chosen strategy needs it, and runs
// the CPU kernel on the local shards; the result equals the single-device result. Strategies,
// plans and device programs are cached per (operator, operand layouts, device), so a repeated
// call costs one hash lookup before its kernel.
//
// Every device of the operands' mesh calls each function with its own shard, in the same order
// (they are collective, as DTensor's are). A DTensor borrows its communicator: it must not
// outlive the launch that gave it.
#pragma once

#include <optional>
#include <vector>

#include "meshflow/comm/communicator.h"
#include "meshflow/mesh/layout.h"
#include "meshflow/ops/op.h"

namespace meshflow {

struct DTensor {
  Tensor local;  // this device's shard: local_shape(layout, device)
  Layout layout;
  Communicator* comm = nullptr;  // the device's world communicator (not owned)

  DeviceId device() const { return comm->device(); }
};

// Returns this device's shard of `global`, which every device of `mesh` passes identically (no
// communication). Partial placements are refused, as DTensor's distribute_tensor refuses them.
DTensor distribute_tensor(Communicator& comm, const Tensor& global, const DeviceMesh& mesh,
                          std::vector<Placement> placements);

// As above, but only `source` (a device of comm) holds the values: it sends each device of
// `mesh` its shard; the others pass a tensor of the same shape and dtype whose values are
// ignored. `source` calls it too, whether or not it is in `mesh`.
DTensor distribute_tensor(Communicator& comm, const Tensor& global, const DeviceMesh& mesh,
                          std::vector<Placement> placements, DeviceId source);

// Wraps this device's shard. `shape` is the global shape; without it, every shard is assumed
// to have this one's shape (DTensor's default), which holds only for even shards. Throws Error
// naming the device when the shard is not the one the layout gives it.
DTensor from_local(Communicator& comm, Tensor local, const DeviceMesh& mesh,
                   std::vector<Placement> placements, std::optional<Shape> shape = std::nullopt);

// Returns the local shard.
inline const Tensor& to_local(const DTensor& t) { return t.local; }

// Returns the global tensor on every device of the mesh (a redistribution to all-Replicate).
Tensor full_tensor(const DTensor& t);

// Returns t in `placements` (on `mesh`, default t's). A Partial target is refused unless t
// already has that Partial on that mesh dim, as DTensor refuses it: a full value has no one
// way to be split into terms.
DTensor redistribute(const DTensor& t, std::vector<Placement> placements);
DTensor redistribute(const DTensor& t, const DeviceMesh& mesh, std::vector<Placement> placements);

// Applies `op` to the operands (named apply_op, not apply, so that std::apply never competes for
// a call): the generic entry point the functions below call.
DTensor apply_op(const Op& op, const std::vector<const DTensor*>& operands);

// The per-device forms the functions above wrap, on shards the caller keeps (the global view,
// global_view.h, holds every device's shard in one process): `shards[i]` is this device's shard
// of a tensor laid out as `layouts[i]`, `local` one of a tensor laid out as `from`.
DTensor apply_op(Communicator& comm, const Op& op, const std::vector<Layout>& layouts,
                 const std::vector<const Tensor*>& shards);
Tensor redistribute_shard(Communicator& comm, const Tensor& local, const Layout& from,
                          const Layout& to);

// What apply_op decides for operands laid out as `layouts`, the same on every device: the
// result's layout and, when the chosen strategy reads every operand where it lies (no device
// communicates, and each device's result is its kernel alone: apply_local), the estimated
// seconds of all the mesh's devices' kernels run one after another (the cost model's
// kernel_seconds); nullopt when the strategy moves data. Throws Error as apply_op does for
// operands that do not fit the operator.
struct OpRoute {
  Layout output;
  std::optional<double> local_kernels_s;
};
OpRoute route(const Op& op, const std::vector<Layout>& layouts);

// apply_op's per-device form for a call whose strategy moves no data (route gives
// local_kernels_s): `device`'s kernel on its shards, with no communicator. Returns the shard and
// the result's layout.
struct LocalResult {
  Tensor local;
  Layout layout;
};
LocalResult apply_local(const Op& op, const std::vector<Layout>& layouts,
                        const std::vector<const Tensor*>& shards, DeviceId device);

DTensor matmul(const DTensor& a, const DTensor& b);
DTensor linear(const DTensor& x, const DTensor& w);
DTensor linear(const DTensor& x, const DTensor& w, const DTensor& bias);
DTensor add(const DTensor& a, const DTensor& b);
DTensor sub(const DTensor& a, const DTensor& b);
DTensor mul(const DTensor& a, const DTensor& b);
DTensor div(const DTensor& a, const DTensor& b);
DTensor neg(const DTensor& a);
DTensor relu(const DTensor& a);
DTensor gelu(const DTensor& a);
DTensor tanh(const DTensor& a);
DTensor sigmoid(const DTensor& a);
DTensor exp(const DTensor& a);
DTensor sum(const DTensor& a, std::vector<int> dims);
DTensor mean(const DTensor& a, std::vector<int> dims);
DTensor softmax(const DTensor& a, int dim = -1);
DTensor softmax_cross_entropy(const DTensor& logits, const DTensor& labels);
DTensor mse(const DTensor& a, const DTensor& b);
// Transformer operators (DESIGN's meaning; op.h): a view keeps its shards where that is exact
// and otherwise moves the operand to the cheapest layout where it is (ops/view.h).
DTensor reshape(const DTensor& a, Shape shape);
DTensor transpose(const DTensor& a, std::vector<int> dims = {});
DTensor layer_norm(const DTensor& x, const DTensor& w, const DTensor& b, double eps = 1e-5);
DTensor embedding(const DTensor& ids, const DTensor& table);
DTensor attention(const DTensor& q, const DTensor& k, const DTensor& v, bool causal = false);

// Where this thread's operator calls spend their time, accumulated while attached (for
// benchmarks: `meshflow bench ops` splits a forward pass into kernels, data movement and
// overhead with it). Detached, a call reads no clock.
struct OpProfile {
  double total_s = 0;     // whole apply_op calls
  double movement_s = 0;  // redistributing operands (the plan executor)
  double kernel_s = 0;    // the CPU kernels
  std::int64_t calls = 0;
};
// Attaches `profile` to the calling thread's operator calls; nullptr detaches.
void attach_profile(OpProfile* profile);

// Returns the gradient of each operand of output = op(operands) given the output's gradient
// `grad` (nullopt for an operand without one: integer labels), by interpreting ops/'s
// gradient program with the functions above. Each gradient's layout is what propagation chose;
// redistribute it to the operand's layout if that is needed.
std::vector<std::optional<DTensor>> backward(const Op& op,
                                             const std::vector<const DTensor*>& operands,
                                             const DTensor& output, const DTensor& grad);

}  // namespace meshflow
