#include "meshflow/dtensor/dtensor.h"

#include <algorithm>
#include <memory>
#include <mutex>
#include <unordered_map>

#include "meshflow/core/clock.h"
#include "meshflow/core/error.h"
#include "meshflow/mesh/sharding.h"
#include "meshflow/ops/gradient.h"
#include "meshflow/ops/strategy.h"
#include "meshflow/ops/vocab_parallel.h"
#include "meshflow/plan/cost_model.h"
#include "meshflow/runtime/executor.h"

namespace meshflow {

namespace {

struct Dispatch;

// A step of a lowered operator (ops/vocab_parallel.h) on one device.
struct DispatchStep {
  std::shared_ptr<const Dispatch> dispatch;  // the step's operator on its arguments' layouts
  std::vector<int> args;                     // as LoweredStep::args
  std::shared_ptr<const DeviceProgram> pin;  // its result's move to its pin (null: none)
};

// What one device needs to run one (operator, operand layouts) call: the strategy, its own
// program for each operand that moves (null where none moves), the normalised operator and
// the global operand specs its kernel reads (or, lowered, the steps it runs instead).
struct Dispatch {
  Op op;
  std::shared_ptr<const Strategy> strategy;
  std::vector<std::shared_ptr<const DeviceProgram>> programs;
  std::vector<TensorSpec> globals;
  ShardOffsets offsets;  // where this device's operand shards start (as the strategy reads them)
  Shape local_out;
  std::vector<DispatchStep> steps;  // a lowered operator's steps, run instead of its kernel
};

struct DispatchKey {
  Op op;
  std::vector<Layout> inputs;
  DeviceId device;
};
// A key borrowed from the caller, so that a lookup copies no layout.
struct DispatchKeyView {
  const Op& op;
  const std::vector<Layout>& inputs;
  DeviceId device;
};
struct DispatchKeyHash {
  using is_transparent = void;
  template <typename Key>
  std::size_t operator()(const Key& k) const {
    std::size_t h = hash_value(k.op) ^ (static_cast<std::size_t>(k.device) << 1);
    for (const Layout& l : k.inputs) h = h * 31 + hash_value(l);
    return h;
  }
};
struct DispatchKeyEqual {
  using is_transparent = void;
  template <typename A, typename B>
  bool operator()(const A& a, const B& b) const {
    return a.device == b.device && a.op == b.op && a.inputs == b.inputs;
  }
};

// The process's caches: strategies and plans are shared by every device; dispatch entries are
// per device.
struct Caches {
  StrategyCache strategies;
  PlanCache plans;
  std::mutex mu;
  std::unordered_map<DispatchKey, std::shared_ptr<const Dispatch>, DispatchKeyHash,
                     DispatchKeyEqual>
      dispatch;
};

Caches& caches() {
  static Caches c;
  return c;
}

// Returns what `device` runs for `op` on operands in `inputs` under `strategy`.
std::shared_ptr<const Dispatch> make_dispatch(const Op& op, const std::vector<Layout>& inputs,
                                              std::shared_ptr<const Strategy> strategy,
                                              DeviceId device) {
  Caches& c = caches();
  auto d = std::make_shared<Dispatch>();
  for (const Layout& l : inputs) d->globals.push_back({l.shape, l.dtype});
  d->strategy = std::move(strategy);
  d->op = normalize(op, d->globals);
  for (std::size_t i = 0; i < inputs.size(); ++i) {
    const Layout& to = d->strategy->inputs[i];
    d->programs.push_back(inputs[i] == to ? nullptr : c.plans.program(inputs[i], to, device));
    d->offsets.push_back(shard_box(to, device).offset);
  }
  d->local_out = local_shape(d->strategy->output, device);
  if (!needs_lowering(d->op, d->strategy->inputs)) return d;
  // The steps read the operands as the strategy lays them out, then each earlier step's pin.
  std::vector<Layout> values = d->strategy->inputs;
  for (const LoweredStep& s : lower(d->op, d->strategy->inputs).steps) {
    std::vector<Layout> args;
    for (int a : s.args) args.push_back(values[static_cast<std::size_t>(a)]);
    DispatchStep step{
        make_dispatch(s.op, args, std::make_shared<const Strategy>(s.strategy), device), s.args,
        nullptr};
    if (s.strategy.output != s.layout)
      step.pin = c.plans.program(s.strategy.output, s.layout, device);
    d->steps.push_back(std::move(step));
    values.push_back(s.layout);
  }
  return d;
}

std::shared_ptr<const Dispatch> dispatch_for(const Op& op, const std::vector<Layout>& inputs,
                                             DeviceId device) {
  Caches& c = caches();
  {
    std::lock_guard lock(c.mu);
    auto it = c.dispatch.find(DispatchKeyView{op, inputs, device});
    if (it != c.dispatch.end()) return it->second;
  }
  std::shared_ptr<const Dispatch> d =
      make_dispatch(op, inputs, c.strategies.get(op, inputs), device);
  std::lock_guard lock(c.mu);
  return c.dispatch.try_emplace(DispatchKey{op, inputs, device}, std::move(d)).first->second;
}

void check_member(const DeviceMesh& mesh, Communicator& comm, std::string_view what) {
  if (!find_device(mesh, comm.device())) {
    fail(ErrorKind::kInvalidArgument, "{}: device {} is not in mesh {}", what, comm.device(),
         to_string(mesh));
  }
}

thread_local OpProfile* profile = nullptr;

}  // namespace

DTensor distribute_tensor(Communicator& comm, const Tensor& global, const DeviceMesh& mesh,
                          std::vector<Placement> placements) {
  check_member(mesh, comm, "distribute_tensor");
  Layout layout = make_layout(mesh, std::move(placements), global.shape(), global.dtype());
  check_shardable(layout);
  Tensor local = slice(global, shard_box(layout, comm.device()));
  return {std::move(local), std::move(layout), &comm};
}

DTensor distribute_tensor(Communicator& comm, const Tensor& global, const DeviceMesh& mesh,
                          std::vector<Placement> placements, DeviceId source) {
  Layout layout = make_layout(mesh, std::move(placements), global.shape(), global.dtype());
  check_shardable(layout);
  std::vector<DeviceId> group = mesh.devices;
  if (std::find(group.begin(), group.end(), source) == group.end()) group.push_back(source);
  std::sort(group.begin(), group.end());
  const DeviceId me = comm.device();
  const bool member = find_device(mesh, me).has_value();
  Tensor local = Tensor::uninitialized(global.dtype(), member ? local_shape(layout, me) : Shape{0});
  ExchangeBoxesOptions o{.src = global.bytes(),
                         .src_shape = global.shape(),
                         .dst = local.bytes(),
                         .dst_shape = local.shape(),
                         .dtype = global.dtype(),
                         .send = std::vector<std::vector<Box>>(group.size()),
                         .recv = std::vector<std::vector<Box>>(group.size())};
  for (std::size_t r = 0; r < group.size(); ++r) {
    const bool to_member = find_device(mesh, group[r]).has_value();
    if (me == source && to_member) o.send[r] = {shard_box(layout, group[r])};
    if (group[r] == source && member)
      o.recv[r] = {Box{std::vector<std::int64_t>(local.shape().size(), 0), local.shape()}};
  }
  exchange_boxes(*comm.group(group), o);
  return {std::move(local), std::move(layout), member ? &comm : nullptr};
}

DTensor from_local(Communicator& comm, Tensor local, const DeviceMesh& mesh,
                   std::vector<Placement> placements, std::optional<Shape> shape) {
  check_member(mesh, comm, "from_local");
  if (!shape) {
    shape = local.shape();
    for (std::size_t m = 0; m < placements.size() && m < mesh.shape.size(); ++m) {
      const Placement p = placements[m];
      if (!p.is_shard()) continue;
      const int rank = static_cast<int>(shape->size());
      const int d = p.dim < 0 ? p.dim + rank : p.dim;
      if (d >= 0 && d < rank) (*shape)[static_cast<std::size_t>(d)] *= mesh.shape[m];
    }
  }
  Layout layout = make_layout(mesh, std::move(placements), *shape, local.dtype());
  const Shape expected = local_shape(layout, comm.device());
  if (local.shape() != expected) {
    fail(ErrorKind::kShapeMismatch, "from_local: device {} holds {} but {} gives it {}",
         comm.device(), to_string(local.shape()), to_string(layout), to_string(expected));
  }
  return {std::move(local), std::move(layout), &comm};
}

Tensor full_tensor(const DTensor& t) {
  std::vector<Placement> all_r(t.layout.placements.size(), Placement::replicate());
  return redistribute(t, all_r).local;
}

DTensor redistribute(const DTensor& t, std::vector<Placement> placements) {
  return redistribute(t, t.layout.mesh, std::move(placements));
}

Tensor redistribute_shard(Communicator& comm, const Tensor& local, const Layout& from,
                          const Layout& to) {
  for (std::size_t m = 0; m < to.placements.size(); ++m) {
    const Placement p = to.placements[m];
    const bool same_mesh = to.mesh == from.mesh;
    if (p.is_partial() && !(same_mesh && from.placements[m] == p)) {
      fail(ErrorKind::kInvalidArgument,
           "redistribute: target {} on mesh dim {} is Partial but the source ({}) is not; a "
           "full value has no one way to be split into terms",
           to_string(p), m, to_string(from));
    }
  }
  if (to == from) return local.clone();
  auto program = caches().plans.program(from, to, comm.device());
  return execute(*program, comm, local);
}

DTensor redistribute(const DTensor& t, const DeviceMesh& mesh, std::vector<Placement> placements) {
  Layout to = make_layout(mesh, std::move(placements), t.layout.shape, t.layout.dtype);
  Tensor local = redistribute_shard(*t.comm, t.local, t.layout, to);
  return {std::move(local), std::move(to), t.comm};
}

DTensor apply_op(const Op& op, const std::vector<const DTensor*>& operands) {
  MESHFLOW_CHECK(!operands.empty());
  std::vector<Layout> layouts;
  std::vector<const Tensor*> locals;
  layouts.reserve(operands.size());
  for (const DTensor* t : operands) {
    layouts.push_back(t->layout);
    locals.push_back(&t->local);
  }
  return apply_op(*operands[0]->comm, op, layouts, locals);
}

namespace {

// Runs the dispatch's kernel on operands already laid out as its strategy reads them.
Tensor kernel(const Dispatch& d, const std::vector<const Tensor*>& locals) {
  const double k0 = profile ? steady_seconds() : 0;
  Tensor out = run_kernel(d.op, locals, d.globals, d.offsets);
  if (profile) profile->kernel_s += steady_seconds() - k0;
  MESHFLOW_CHECK(out.shape() == d.local_out, "{}: kernel gave {} where {} expects {}",
                 to_string(d.op), to_string(out.shape()), to_string(d.strategy->output),
                 to_string(d.local_out));
  return out;
}

// Moves `shards` to the layouts d's strategy reads, then runs its kernel, or a lowered
// operator's steps with their pins' moves.
Tensor run(const Dispatch& d, Communicator& comm, const std::vector<const Tensor*>& shards) {
  // Operands the strategy moves get new local tensors; the others are read where they are.
  std::vector<Tensor> moved;
  moved.reserve(shards.size());  // no reallocation: locals point into it
  std::vector<const Tensor*> locals(shards.size());
  auto timed_move = [&](const DeviceProgram& program, const Tensor& from) {
    const double t0 = profile ? steady_seconds() : 0;
    Tensor t = execute(program, comm, from);
    if (profile) profile->movement_s += steady_seconds() - t0;
    return t;
  };
  for (std::size_t i = 0; i < shards.size(); ++i) {
    if (d.programs[i]) {
      moved.push_back(timed_move(*d.programs[i], *shards[i]));
      locals[i] = &moved.back();
    } else {
      locals[i] = shards[i];
    }
  }
  if (d.steps.empty()) return kernel(d, locals);
  std::vector<Tensor> steps;
  steps.reserve(d.steps.size());
  for (const DispatchStep& s : d.steps) {
    std::vector<const Tensor*> args;
    for (int a : s.args) {
      const auto k = static_cast<std::size_t>(a);
      args.push_back(k < locals.size() ? locals[k] : &steps[k - locals.size()]);
    }
    Tensor out = run(*s.dispatch, comm, args);
    steps.push_back(s.pin ? timed_move(*s.pin, out) : std::move(out));
  }
  return std::move(steps.back());
}

}  // namespace

DTensor apply_op(Communicator& comm, const Op& op, const std::vector<Layout>& layouts,
                 const std::vector<const Tensor*>& shards) {
  MESHFLOW_CHECK(!shards.empty() && shards.size() == layouts.size());
  const double start = profile ? steady_seconds() : 0;
  const std::shared_ptr<const Dispatch> d = dispatch_for(op, layouts, comm.device());
  Tensor out = run(*d, comm, shards);
  if (profile) {
    profile->total_s += steady_seconds() - start;
    ++profile->calls;
  }
  return {std::move(out), d->strategy->output, &comm};
}

OpRoute route(const Op& op, const std::vector<Layout>& layouts) {
  MESHFLOW_CHECK(!layouts.empty());
  const std::shared_ptr<const Strategy> strategy = caches().strategies.get(op, layouts);
  // A device's program moves an operand exactly when the strategy reads it in another layout;
  // a lowered operator's steps move their statistics.
  if (strategy->inputs != layouts || needs_lowering(op, layouts))
    return {strategy->output, std::nullopt};
  OpRoute r{.output = strategy->output, .local_kernels_s = 0.0};
  for (DeviceId device : layouts[0].mesh.devices) {
    const std::shared_ptr<const Dispatch> d = dispatch_for(op, layouts, device);
    std::vector<Shape> local;
    double bytes = static_cast<double>(numel(d->local_out) * size_of(r.output.dtype));
    for (std::size_t i = 0; i < layouts.size(); ++i) {
      local.push_back(local_shape(layouts[i], device));
      bytes += static_cast<double>(numel(local.back()) * size_of(layouts[i].dtype));
    }
    *r.local_kernels_s += kernel_seconds(
        default_machine(), work_points(d->op, d->globals, local, d->local_out, d->offsets), bytes);
  }
  return r;
}

LocalResult apply_local(const Op& op, const std::vector<Layout>& layouts,
                        const std::vector<const Tensor*>& shards, DeviceId device) {
  MESHFLOW_CHECK(shards.size() == layouts.size());
  const std::shared_ptr<const Dispatch> d = dispatch_for(op, layouts, device);
  for (const auto& program : d->programs)
    MESHFLOW_CHECK(!program, "{}: apply_local on a strategy that moves data", to_string(d->op));
  MESHFLOW_CHECK(d->steps.empty(), "{}: apply_local on a lowered operator", to_string(d->op));
  return {kernel(*d, shards), d->strategy->output};
}

void attach_profile(OpProfile* p) { profile = p; }

namespace {
DTensor unary(OpType type, const DTensor& a) { return apply_op(Op{.type = type}, {&a}); }
DTensor binary(OpType type, const DTensor& a, const DTensor& b) {
  return apply_op(Op{.type = type}, {&a, &b});
}
}  // namespace

DTensor matmul(const DTensor& a, const DTensor& b) { return binary(OpType::kMatmul, a, b); }
DTensor linear(const DTensor& x, const DTensor& w) { return binary(OpType::kLinear, x, w); }
DTensor linear(const DTensor& x, const DTensor& w, const DTensor& bias) {
  return apply_op(Op{.type = OpType::kLinear}, {&x, &w, &bias});
}
DTensor add(const DTensor& a, const DTensor& b) { return binary(OpType::kAdd, a, b); }
DTensor sub(const DTensor& a, const DTensor& b) { return binary(OpType::kSub, a, b); }
DTensor mul(const DTensor& a, const DTensor& b) { return binary(OpType::kMul, a, b); }
DTensor div(const DTensor& a, const DTensor& b) { return binary(OpType::kDiv, a, b); }
DTensor neg(const DTensor& a) { return unary(OpType::kNeg, a); }
DTensor relu(const DTensor& a) { return unary(OpType::kRelu, a); }
DTensor gelu(const DTensor& a) { return unary(OpType::kGelu, a); }
DTensor tanh(const DTensor& a) { return unary(OpType::kTanh, a); }
DTensor sigmoid(const DTensor& a) { return unary(OpType::kSigmoid, a); }
DTensor exp(const DTensor& a) { return unary(OpType::kExp, a); }
DTensor sum(const DTensor& a, std::vector<int> dims) {
  return apply_op(Op{.type = OpType::kSum, .dims = std::move(dims)}, {&a});
}
DTensor mean(const DTensor& a, std::vector<int> dims) {
  return apply_op(Op{.type = OpType::kMean, .dims = std::move(dims)}, {&a});
}
DTensor softmax(const DTensor& a, int dim) {
  return apply_op(Op{.type = OpType::kSoftmax, .dim = dim}, {&a});
}
DTensor softmax_cross_entropy(const DTensor& logits, const DTensor& labels) {
  return binary(OpType::kSoftmaxCrossEntropy, logits, labels);
}
DTensor mse(const DTensor& a, const DTensor& b) { return binary(OpType::kMse, a, b); }
DTensor reshape(const DTensor& a, Shape shape) {
  return apply_op(Op{.type = OpType::kReshape, .shape = std::move(shape)}, {&a});
}
DTensor transpose(const DTensor& a, std::vector<int> dims) {
  return apply_op(Op{.type = OpType::kTranspose, .dims = std::move(dims)}, {&a});
}
DTensor layer_norm(const DTensor& x, const DTensor& w, const DTensor& b, double eps) {
  return apply_op(Op{.type = OpType::kLayerNorm, .eps = eps}, {&x, &w, &b});
}
DTensor embedding(const DTensor& ids, const DTensor& table) {
  return binary(OpType::kEmbedding, ids, table);
}
DTensor attention(const DTensor& q, const DTensor& k, const DTensor& v, bool causal) {
  return apply_op(Op{.type = OpType::kAttention, .causal = causal}, {&q, &k, &v});
}

std::vector<std::optional<DTensor>> backward(const Op& op,
                                             const std::vector<const DTensor*>& operands,
                                             const DTensor& output, const DTensor& grad) {
  std::vector<TensorSpec> specs;
  for (const DTensor* t : operands) specs.push_back({t->layout.shape, t->layout.dtype});
  return run_gradient_program(
      gradient_program(op, specs), operands, output, grad,
      [](const Op& step, const std::vector<const DTensor*>& args) { return apply_op(step, args); },
      [](const DTensor& t) {
        return DTensor{t.local.clone(), t.layout, t.comm};
      });
}

}  // namespace meshflow
