// `meshflow bench kernels`: every operator of the bench GPT's training step (batch 8, sequence
// 256, width 512, 8 heads, vocabulary 8192: 2,048 tokens) alone at the step's shapes, forward
// and backward, one case each, on one device with `threads` threads (kernels/parallel.h):
//   linear_qkv, linear_out  x[2048, 512] @ w[512, 512] (q, k, v and the attention's output)
//   linear_mlp_up           x[2048, 512] @ w[512, 2048]
//   linear_mlp_down         x[2048, 2048] @ w[2048, 512]
//   matmul_logits           x[2048, 512] @ head[512, 8192]
//     fwd: the product; bwd: its two gradient products (g wᵀ and xᵀ g). Baseline cblas_sgemm:
//     the same products through bare cblas_sgemm calls, split over the same threads.
//   gelu, add (the residual), layer_norm, softmax_ce (the loss over [2048, 8192] logits),
//   embedding, transpose_heads ([8, 256, 8, 64] -> [8, 8, 256, 64])
//     fwd and bwd (layer_norm_bwd: dx, dw and db; add_bwd: the position embedding's sum over
//     the batch). Floor: the bytes the kernel reads and writes moved between buffers of its
//     sizes (memcpy from its operands into a destination the size of its results, the operands'
//     bytes left over read once, the destination's left over zeroed), interleaved.
//   attention                causal, [8, 8, 256, 64] q, k, v; bwd: dq, dk and dv.
//     Baseline PyTorch's eager attention.
// Every case also reports pytorch_s (PyTorch's same operator on the same threads; null where
// python3-torch is missing) and vs_pytorch.
#pragma once

#include <string>
#include <vector>

#include "bench/report.h"

namespace meshflow::bench {

struct KernelsBenchOptions {
  bool progress = true;
  int threads = 0;  // 0: every core this process may run on
  int reps = 7;
  // Untimed repetitions first: at least `warmup`, and as many more as fit in warmup_s seconds
  // (the case with its floor; PyTorch's operator alone). A memory-bound case's first
  // milliseconds ran slower than its later reps (embedding_fwd: 70-150 us for 2-5 ms, then
  // 45-50).
  int warmup = 2;
  double warmup_s = 0.05;
  bool pytorch = true;             // time PyTorch's operators when torch imports
  std::vector<std::string> cases;  // only these (empty: every case)
};

BenchReport run_kernels_bench(const KernelsBenchOptions& options);

}  // namespace meshflow::bench
