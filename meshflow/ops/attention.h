// Scaled dot-product attention: attention(q[..., Sq, Dk], k[..., Sk, Dk], v[..., Sk, Dv])
// {causal} = softmax(q @ kᵀ / √Dk, with -∞ where key position > query position when causal) @ v,
// the leading dims (batch, heads) paired, and its gradients attention_grad_q/k/v(q, k, v, g), which
// recompute the probabilities; run together (attention_kernels) they share them and dS. Kernels run
// a block of query rows at a time (batched GEMMs through OpenBLAS, a numerically stable softmax),
// so no buffer larger than a block of rows by Sk exists. Sharding: batch and heads shard freely; a
// query-sequence shard keeps k and v whole (the causal mask reads the shard's global offset); Dv
// shards through v; Dk and Sk are never sharded.
#pragma once

#include <span>
#include <vector>

#include "meshflow/ops/op.h"

namespace meshflow {

bool is_attention_family(OpType type);  // attention and its three gradients

TensorSpec infer_attention(const Op& op, const std::vector<TensorSpec>& inputs);
// offsets (op.h): q's and k's sequence shard starts place the causal diagonal.
Tensor attention_kernel(const Op& op, const std::vector<const Tensor*>& in,
                        const ShardOffsets& offsets);
// Runs attention's gradients `ops` (each of attention_grad_q, _k and _v at most once, the same
// causal flag; or the forward alone) on the same operands in one pass: the probabilities, and
// for q and k dS, computed once. Returns their results in `ops`' order, each bit for bit what
// attention_kernel gives it alone.
std::vector<Tensor> attention_kernels(std::span<const Op> ops, const std::vector<const Tensor*>& in,
                                      const ShardOffsets& offsets);
DimLabels attention_labels(const Op& op, const std::vector<TensorSpec>& inputs);
// Multiply-adds of attention_kernels(ops) on local operands whose shards start at `offsets` (the
// kernel's): products of Sq x Sk by Dk or Dv, over the keys each block of queries sees; two for
// the forward or grad_v alone, three for grad_q or grad_k alone, five for all three gradients.
double attention_work(std::span<const Op> ops, const std::vector<Shape>& local,
                      const ShardOffsets& offsets = {});

// The decoder's attention over a KV cache (infer/): cached_attention(q[..., L, Dk], k[..., L, Dk],
// v[..., L, Dv], cache_k[..., C, Dk], cache_v[..., C, Dv], positions[L] int64) writes k's and v's
// rows into the caches at rows positions (consecutive, p0 .. p0 + L - 1, p0 + L <= C) and returns
// the causal attention of q, whose rows sit at those positions, over cache rows [0, p0 + L): what
// attention(q, k, v){causal} gives for the last L queries of a context of p0 + L positions, with
// the same kernel. It is the one operator that writes operands (3 and 4): the cache is state the
// decoder owns, held in the layout the model gives k and v and never moved. Sharding: the leading
// dims (batch, heads) shard; L, C, Dk and Dv never do.
TensorSpec infer_cached_attention(const Op& op, const std::vector<TensorSpec>& inputs);
Tensor cached_attention_kernel(const Op& op, const std::vector<const Tensor*>& in);
DimLabels cached_attention_labels(const std::vector<TensorSpec>& inputs);
// Multiply-adds on local operands, the whole cache counted (the positions are known at run time
// only).
double cached_attention_work(const std::vector<Shape>& local);

}  // namespace meshflow
