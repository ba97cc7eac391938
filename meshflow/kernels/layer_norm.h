// Layer norm's float32 row loops (the last dim of [rows, d] normalised, torch.nn.LayerNorm's
// biased variance): the forward pass, the gradient of x and the gradient of the scale w, each
// one pass over a row after its statistics (one vector reduction over the row, which brings it
// into cache; see layer_norm.cc for their precision).
// Float accumulation, vectorised (kernels/vector_math.h), as PyTorch's CPU kernel does.
#pragma once

#include <cstdint>

namespace meshflow {

// y = (x - mean) / sqrt(var + eps) * w + b per row.
void layer_norm_rows(const float* x, const float* w, const float* b, float* y, std::int64_t rows,
                     std::int64_t d, float eps);

// gx = rstd * (g w - mean(g w) - x̂ mean(g w x̂)) per row, x̂ = (x - mean) rstd.
void layer_norm_grad_x_rows(const float* g, const float* x, const float* w, float* gx,
                            std::int64_t rows, std::int64_t d, float eps);

// gw = Σ over rows of g x̂ (the scale's gradient; the bias's is Σ g), summed in sum_rows' blocks
// of rows where it has several (kernels/accumulate.h; the same bits on any team), else in one
// part per thread.
void layer_norm_grad_w_rows(const float* g, const float* x, float* gw, std::int64_t rows,
                            std::int64_t d, float eps);

// gw as layer_norm_grad_w_rows and gb = Σ over rows of g as sum_rows gives them, bit for bit: in
// one pass over g and x where sum_rows adds blocks of rows, else each alone.
void layer_norm_grad_wb_rows(const float* g, const float* x, float* gw, float* gb,
                             std::int64_t rows, std::int64_t d, float eps);

}  // namespace meshflow
