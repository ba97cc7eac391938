// Splitting a global tensor into per-device shards under a Layout, and assembling shards back
// (reducing Partial terms, checking that replicas agree).
#pragma once

#include <optional>
#include <vector>

#include "meshflow/core/tensor.h"
#include "meshflow/mesh/layout.h"

namespace meshflow {

// Returns one tensor per mesh device (row-major mesh order) holding its shard box of `global`.
// Preconditions (throws Error): global's shape and dtype match the layout; no Partial placement
// (a full value cannot be split into terms without choosing a convention; redistribute does it).
std::vector<Tensor> shard_tensor(const Tensor& global, const Layout& layout);

// Throws Error naming the placement when `layout` has a Partial placement, which a full value
// cannot be split into without choosing a convention (redistribute does that).
void check_shardable(const Layout& layout);

// The replica rule: devices whose mesh coordinates differ only on Replicate mesh dims hold the
// same bytes (the same shard, or the same Partial term). Returns the device every replica of
// `device` is compared with: the one with coordinate 0 on every Replicate dim (nullopt when that
// is `device` itself).
std::optional<DeviceId> replica_reference(const Layout& layout, DeviceId device);

// Throws Error(kShapeMismatch) saying that `device` and its replica_reference disagree. Every
// command that reads a sharded folder reports a broken replica with this message.
[[noreturn]] void fail_replicas_disagree(const Layout& layout, DeviceId device);

// Returns the Partial mesh dims of `layout` with their ops and sizes, in mesh order: what
// reduce_partial_terms takes for the terms of one Partial group.
struct PartialGroup {
  std::vector<MeshDim> dims;
  std::vector<ReduceOp> ops;
  std::vector<std::int64_t> sizes;
};
PartialGroup partial_group(const Layout& layout);

// Returns true when `device` holds the first term of its Partial group and the first replica
// (coordinate 0 on every Partial and Replicate mesh dim): the devices whose boxes tile the
// global tensor exactly once.
bool is_representative(const Layout& layout, DeviceId device);

// Returns the global tensor the shards represent. Partial mesh dims are reduced by
// reduce_partial_terms over each group's terms in row-major mesh order. Replicas must hold the
// same bytes (the replica rule). Throws Error naming the device and box for a wrong shard count,
// dtype or shape, or for disagreeing replicas.
Tensor assemble(const Layout& layout, const std::vector<Tensor>& shards);
// The same, reading shards the caller keeps elsewhere (shards[i] for the i-th mesh device).
Tensor assemble(const Layout& layout, const std::vector<const Tensor*>& shards);

// One device's part of assemble, unchecked: when `device` is a representative, writes its box of
// `global` (a tensor of the layout's shape), its Partial group's terms reduced; otherwise writes
// nothing. The representatives' calls together write every element of `global` once, so they
// may run concurrently. Shards as assemble takes them, already checked (or made by meshflow).
void assemble_part(const Layout& layout, const std::vector<const Tensor*>& shards, DeviceId device,
                   Tensor& global);

}  // namespace meshflow
