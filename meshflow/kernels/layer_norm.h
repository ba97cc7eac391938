// Layer norm's float32 row loops (the last dim of [rows, d] normalised, torch.nn.LayerNorm's
// biased variance): the forward pass, which can keep each row's statistics, the statistics
// alone, and the gradients of x and of the scale w from them. A row's statistics come from one
// vector reduction over the row, which brings it into cache (see kernels/norm_rows.h for their
// precision). Float accumulation, vectorised (kernels/vector_math.h), as PyTorch's CPU kernel
// does.
#pragma once

#include <cstdint>

#include "meshflow/kernels/norm_rows.h"

namespace meshflow {

// A row's statistics where the forward pass keeps them (kNormStatsFloats, kernels/norm_rows.h):
// NormRow's shift, scale and bias (kernels/vector_math.h), x̂ = (x - shift) scale + bias.
// scale = 1 / sqrt(var + eps), and the mean is shift - bias / scale: shift is near the mean, so
// x - shift is exact where x is near it and x̂ keeps float's precision relative to the row's
// spread whatever its mean (a mean rounded to float would not). The gradients read x̂ bit for
// bit as the forward pass made it. PyTorch's forward keeps the mean and rstd
// (native_layer_norm) for the same reason: its backward then reads each row once less.

// y = (x - mean) / sqrt(var + eps) * w + b per row; and, unless stats is null, each row's
// statistics ([rows, kNormStatsFloats]).
void layer_norm_rows(const float* x, const float* w, const float* b, float* y, float* stats,
                     std::int64_t rows, std::int64_t d, float eps);

// Each row's statistics alone, the bits layer_norm_rows keeps.
void layer_norm_stats_rows(const float* x, float* stats, std::int64_t rows, std::int64_t d,
                           float eps);

// gx = rstd * (g w - mean(g w) - x̂ mean(g w x̂)) per row, from the rows' statistics.
void layer_norm_grad_x_rows(const float* g, const float* x, const float* w, const float* stats,
                            float* gx, std::int64_t rows, std::int64_t d);

// gw = Σ over rows of g x̂ (the scale's gradient; the bias's is Σ g), summed in sum_rows' blocks
// of rows where it has several (kernels/accumulate.h; the same bits on any team), else in one
// part per thread.
void layer_norm_grad_w_rows(const float* g, const float* x, const float* stats, float* gw,
                            std::int64_t rows, std::int64_t d);

// gw as layer_norm_grad_w_rows and gb = Σ over rows of g as sum_rows gives them, bit for bit: in
// one pass over g and x where sum_rows adds blocks of rows, else each alone.
void layer_norm_grad_wb_rows(const float* g, const float* x, const float* stats, float* gw,
                             float* gb, std::int64_t rows, std::int64_t d);

}  // namespace meshflow
