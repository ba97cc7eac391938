// Lowering: one device's part of a Plan as the exact calls it makes, with every group, count,
// region, reduction and scaling spelled out. A DeviceProgram is plain data over core types; the
// executor (runtime/) runs it without reading a layout or deciding anything. lower() is the one
// place that turns a step's placements into groups and boxes.
//
// Regions in calls are relative to the tensor they index: a step's input is the device's
// current tensor, its output a fresh tensor of `out_shape`.
#pragma once

#include <string>
#include <variant>
#include <vector>

#include "meshflow/plan/plan.h"

namespace meshflow {

// How a step's values are scaled at the end (the Replicate -> Partial(sum) rule, lowered).
enum class Scale { kKeep, kDivide, kZero };
struct Scaling {
  Scale kind = Scale::kKeep;
  std::int64_t divisor = 1;  // kDivide only
  bool operator==(const Scaling&) const = default;
};

// all_gather of the whole input into the output, blocks back to back in rank order.
struct GatherCall {
  std::vector<DeviceId> group;
  std::vector<std::int64_t> counts;
  bool operator==(const GatherCall&) const = default;
};

// exchange_boxes between the input (viewed as `src_shape`) and the output (or a staging tensor,
// viewed as `dst_shape`).
struct ExchangeCall {
  std::vector<DeviceId> group;
  Shape src_shape, dst_shape;
  std::vector<std::vector<Box>> send, recv;
  bool operator==(const ExchangeCall&) const = default;
};

// reduce_scatter, then division by `divisor`. When `pack` is not empty the input's regions
// `pack` are first copied back to back (in rank order) into a send buffer.
struct ReduceScatterCall {
  std::vector<DeviceId> group;
  std::vector<std::int64_t> counts;
  ReduceOp op = ReduceOp::kSum;
  std::int64_t divisor = 1;
  std::vector<Box> pack;
  bool operator==(const ReduceScatterCall&) const = default;
};

// all_reduce of the whole input, then division by `divisor`.
struct AllReduceCall {
  std::vector<DeviceId> group;
  ReduceOp op = ReduceOp::kSum;
  std::int64_t divisor = 1;
  bool operator==(const AllReduceCall&) const = default;
};

// The input's region `keep` becomes the output, then `scaling` applies.
struct LocalCall {
  Box keep;
  Scaling scaling;
  bool operator==(const LocalCall&) const = default;
};

// One exchange into a staging tensor of `terms` blocks (the output itself when terms == 1),
// the reduction of the blocks by reduce_partial_terms(term_ops, term_sizes), then `scaling`.
// The input is viewed with a leading term dim of 1.
struct PointToPointCall {
  ExchangeCall exchange;
  std::int64_t terms = 1;
  std::vector<ReduceOp> term_ops;
  std::vector<std::int64_t> term_sizes;
  Scaling scaling;
  bool operator==(const PointToPointCall&) const = default;
};

using DeviceCall = std::variant<GatherCall, ExchangeCall, ReduceScatterCall, AllReduceCall,
                                LocalCall, PointToPointCall>;

struct DeviceStep {
  StepKind kind = StepKind::kLocal;
  Shape out_shape;
  DeviceCall call;
  bool operator==(const DeviceStep&) const = default;
};

// Invariants: in_shape is the shard the device holds before (or {0} when it is not in the
// source mesh); each step's output is the next step's input; the last step's out_shape (or
// in_shape when there are no steps) is out_shape, the device's shard after ({0} when it is not
// in the destination mesh). A device in neither mesh has no steps.
struct DeviceProgram {
  DeviceId device = 0;
  DType dtype = DType::kFloat32;
  bool in_from = false, in_to = false;
  Shape in_shape, out_shape;
  std::vector<DeviceStep> steps;
  bool operator==(const DeviceProgram&) const = default;
};

// Returns `device`'s program for `plan`. Pure.
DeviceProgram lower(const Plan& plan, DeviceId device);

// Returns a multi-line text form naming every call, group, count and region (for golden files
// and `meshflow plan --device`).
std::string to_text(const DeviceProgram& program);

}  // namespace meshflow
