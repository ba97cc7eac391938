// The executor: one function per call of a DeviceProgram.
#include "meshflow/runtime/executor.h"

#include <cstring>

#include "meshflow/core/error.h"

namespace meshflow {

namespace {

struct Context {
  Communicator& world;
  Tensor* recycled;  // the final step's output storage, when it fits
};

// Returns storage for a step's result: the recycled tensor if it fits, else a fresh one. Every
// element is written by the step.
Tensor output(const Context& c, DType dtype, const Shape& shape) {
  if (c.recycled && c.recycled->dtype() == dtype && c.recycled->shape() == shape)
    return std::move(*c.recycled);
  return Tensor::uninitialized(dtype, shape);
}

void apply(const Scaling& s, Tensor& t) {
  if (s.kind == Scale::kDivide) divide_by(t.dtype(), t.bytes(), t.numel(), s.divisor);
  if (s.kind == Scale::kZero) std::memset(t.bytes(), 0, t.nbytes());
}

void exchange(Communicator& g, const ExchangeCall& x, const std::byte* src, std::byte* dst,
              DType dtype) {
  exchange_boxes(g, {.src = src,
                     .src_shape = x.src_shape,
                     .dst = dst,
                     .dst_shape = x.dst_shape,
                     .dtype = dtype,
                     .send = x.send,
                     .recv = x.recv});
}

struct Run {
  const Context& c;
  const Tensor& in;
  const Shape& out_shape;

  Tensor operator()(const GatherCall& call) const {
    Tensor out = output(c, in.dtype(), out_shape);
    all_gather(
        *c.world.group(call.group),
        {.send = in.bytes(), .recv = out.bytes(), .recv_counts = call.counts, .dtype = in.dtype()});
    return out;
  }
  Tensor operator()(const ExchangeCall& call) const {
    Tensor out = output(c, in.dtype(), out_shape);
    exchange(*c.world.group(call.group), call, in.bytes(), out.bytes(), in.dtype());
    return out;
  }
  Tensor operator()(const ReduceScatterCall& call) const {
    Tensor out = output(c, in.dtype(), out_shape);
    const std::byte* send = in.bytes();
    Tensor packed;
    if (!call.pack.empty()) {
      std::int64_t total = 0;
      for (const Box& b : call.pack) total += numel(b);
      packed = Tensor::uninitialized(in.dtype(), {total});
      const std::size_t es = size_of(in.dtype());
      std::int64_t at = 0;
      for (const Box& b : call.pack) {
        Shape ext = b.extent;
        copy_box(ConstBuffer{in.bytes(), &in.shape(), es}, b.offset,
                 MutableBuffer{packed.bytes() + at * static_cast<std::int64_t>(es), &ext, es},
                 std::vector<std::int64_t>(ext.size(), 0), b.extent);
        at += numel(b);
      }
      send = packed.bytes();
    }
    reduce_scatter(*c.world.group(call.group), {.send = send,
                                                .recv = out.bytes(),
                                                .recv_counts = call.counts,
                                                .dtype = in.dtype(),
                                                .op = call.op});
    divide_by(out.dtype(), out.bytes(), out.numel(), call.divisor);
    return out;
  }
  Tensor operator()(const AllReduceCall& call) const {
    Tensor out = output(c, in.dtype(), out_shape);
    all_reduce(*c.world.group(call.group), {.send = in.bytes(),
                                            .recv = out.bytes(),
                                            .count = in.numel(),
                                            .dtype = in.dtype(),
                                            .op = call.op});
    divide_by(out.dtype(), out.bytes(), out.numel(), call.divisor);
    return out;
  }
  Tensor operator()(const LocalCall& call) const {
    Tensor out = output(c, in.dtype(), out_shape);
    copy_box(in, call.keep, out, std::vector<std::int64_t>(call.keep.extent.size(), 0));
    apply(call.scaling, out);
    return out;
  }
  Tensor operator()(const PointToPointCall& call) const {
    Tensor out = output(c, in.dtype(), out_shape);
    Tensor staging;
    std::byte* dst = out.bytes();
    if (call.terms > 1) {
      staging = Tensor::uninitialized(in.dtype(), call.exchange.dst_shape);
      dst = staging.bytes();
    }
    exchange(*c.world.group(call.exchange.group), call.exchange, in.bytes(), dst, in.dtype());
    if (call.terms > 1) {
      std::vector<const std::byte*> terms;
      for (std::int64_t t = 0; t < call.terms; ++t)
        terms.push_back(staging.bytes() + t * static_cast<std::int64_t>(out.nbytes()));
      reduce_partial_terms(call.term_ops, call.term_sizes, out.dtype(), terms, out.bytes(),
                           out.numel());
    }
    apply(call.scaling, out);
    return out;
  }
};

}  // namespace

Tensor execute(const DeviceProgram& program, Communicator& world, const Tensor& local,
               Tensor recycled) {
  if (program.in_from && (local.shape() != program.in_shape || local.dtype() != program.dtype)) {
    fail(ErrorKind::kShapeMismatch, "device {} holds a shard of {} {} but the plan expects {} {}",
         program.device, to_string(local.shape()), to_string(local.dtype()),
         to_string(program.in_shape), to_string(program.dtype));
  }
  if (!program.in_from && !program.in_to) return Tensor(program.dtype, {0});
  if (program.steps.empty()) return local.clone();
  const Tensor* current = &local;
  Tensor result;
  for (std::size_t i = 0; i < program.steps.size(); ++i) {
    const DeviceStep& s = program.steps[i];
    const bool last = i + 1 == program.steps.size();
    const Context c{world, last ? &recycled : nullptr};
    Tensor next = std::visit(Run{c, *current, s.out_shape}, s.call);
    result = std::move(next);
    current = &result;
  }
  return result;
}

StartedMove start(const DeviceProgram& program, Communicator& world, const Tensor& local) {
  const bool one_gather = program.in_from && program.in_to && program.steps.size() == 1 &&
                          (std::holds_alternative<GatherCall>(program.steps[0].call) ||
                           std::holds_alternative<ExchangeCall>(program.steps[0].call));
  if (!one_gather) return {.out = execute(program, world, local), .done = Event()};
  if (local.shape() != program.in_shape || local.dtype() != program.dtype) {
    fail(ErrorKind::kShapeMismatch, "device {} holds a shard of {} {} but the plan expects {} {}",
         program.device, to_string(local.shape()), to_string(local.dtype()),
         to_string(program.in_shape), to_string(program.dtype));
  }
  const DeviceStep& s = program.steps[0];
  Tensor out = Tensor::uninitialized(local.dtype(), s.out_shape);
  Event done;
  if (const auto* g = std::get_if<GatherCall>(&s.call)) {
    done = all_gather_async(*world.group(g->group), {.send = local.bytes(),
                                                     .recv = out.bytes(),
                                                     .recv_counts = g->counts,
                                                     .dtype = local.dtype()});
  } else {
    const auto& x = std::get<ExchangeCall>(s.call);
    done = exchange_boxes_async(*world.group(x.group), {.src = local.bytes(),
                                                        .src_shape = x.src_shape,
                                                        .dst = out.bytes(),
                                                        .dst_shape = x.dst_shape,
                                                        .dtype = local.dtype(),
                                                        .send = x.send,
                                                        .recv = x.recv});
  }
  return {.out = std::move(out), .done = std::move(done)};
}

namespace {

const PointToPointCall& only_point_to_point(const DeviceProgram& program) {
  MESHFLOW_CHECK(
      program.steps.size() == 1 && std::holds_alternative<PointToPointCall>(program.steps[0].call),
      "device {}: a tagged move needs one point-to-point step", program.device);
  return std::get<PointToPointCall>(program.steps[0].call);
}

// Copies `boxes` of the row-major `shape` at `base` back to back into `packed`; unpack_boxes
// copies them back.
void pack_boxes(DType dtype, const Shape& shape, const std::byte* base,
                const std::vector<Box>& boxes, std::byte* packed) {
  const std::size_t es = size_of(dtype);
  std::int64_t at = 0;
  for (const Box& b : boxes) {
    Shape ext = b.extent;
    copy_box(ConstBuffer{base, &shape, es}, b.offset,
             MutableBuffer{packed + at * static_cast<std::int64_t>(es), &ext, es},
             std::vector<std::int64_t>(ext.size(), 0), b.extent);
    at += numel(b);
  }
}

void unpack_boxes(DType dtype, const Shape& shape, std::byte* base, const std::vector<Box>& boxes,
                  const std::byte* packed) {
  const std::size_t es = size_of(dtype);
  std::int64_t at = 0;
  for (const Box& b : boxes) {
    Shape ext = b.extent;
    copy_box(ConstBuffer{packed + at * static_cast<std::int64_t>(es), &ext, es},
             std::vector<std::int64_t>(ext.size(), 0), MutableBuffer{base, &shape, es}, b.offset,
             b.extent);
    at += numel(b);
  }
}

std::int64_t total_numel(const std::vector<Box>& boxes) {
  std::int64_t n = 0;
  for (const Box& b : boxes) n += numel(b);
  return n;
}

}  // namespace

std::vector<std::pair<Tensor, Event>> send_tagged(const DeviceProgram& program, Communicator& world,
                                                  const Tensor& local, int tag) {
  std::vector<std::pair<Tensor, Event>> posted;
  if (!program.in_from) return posted;
  const PointToPointCall& call = only_point_to_point(program);
  const ExchangeCall& x = call.exchange;
  for (std::size_t k = 0; k < x.group.size(); ++k) {
    if (x.send[k].empty() || x.group[k] == program.device) continue;
    Tensor packed = Tensor::uninitialized(local.dtype(), {total_numel(x.send[k])});
    pack_boxes(local.dtype(), x.src_shape, local.bytes(), x.send[k], packed.bytes());
    Event done = send_async(world, {.data = packed.bytes(),
                                    .count = packed.numel(),
                                    .dtype = local.dtype(),
                                    .peer = rank_of(world, x.group[k]),
                                    .tag = tag});
    posted.emplace_back(std::move(packed), std::move(done));
  }
  return posted;
}

Tensor receive_tagged(const DeviceProgram& program, Communicator& world, int tag) {
  const PointToPointCall& call = only_point_to_point(program);
  if (!program.in_to) return Tensor(program.dtype, {0});
  MESHFLOW_CHECK(!program.in_from, "device {}: a tagged move between disjoint meshes only",
                 program.device);
  const ExchangeCall& x = call.exchange;
  const DType dtype = program.dtype;
  std::vector<Tensor> packed(x.group.size());
  std::vector<Event> arriving;
  for (std::size_t k = 0; k < x.group.size(); ++k) {
    if (x.recv[k].empty()) continue;
    packed[k] = Tensor::uninitialized(dtype, {total_numel(x.recv[k])});
    arriving.push_back(recv_async(world, {.data = packed[k].bytes(),
                                          .count = packed[k].numel(),
                                          .dtype = dtype,
                                          .peer = rank_of(world, x.group[k]),
                                          .tag = tag}));
  }
  when_all(arriving).wait(world.default_timeout());
  const Shape& out_shape = program.steps[0].out_shape;
  Tensor out = Tensor::uninitialized(dtype, out_shape);
  Tensor staging;
  std::byte* dst = out.bytes();
  if (call.terms > 1) {
    staging = Tensor::uninitialized(dtype, x.dst_shape);
    dst = staging.bytes();
  }
  for (std::size_t k = 0; k < x.group.size(); ++k)
    if (!x.recv[k].empty()) unpack_boxes(dtype, x.dst_shape, dst, x.recv[k], packed[k].bytes());
  if (call.terms > 1) {
    std::vector<const std::byte*> terms;
    for (std::int64_t t = 0; t < call.terms; ++t)
      terms.push_back(staging.bytes() + t * static_cast<std::int64_t>(out.nbytes()));
    reduce_partial_terms(call.term_ops, call.term_sizes, dtype, terms, out.bytes(), out.numel());
  }
  apply(call.scaling, out);
  return out;
}

}  // namespace meshflow
