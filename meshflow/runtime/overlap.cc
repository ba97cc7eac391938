// The decomposed all-gather + product and product + reduce-scatter loops.
#include "meshflow/runtime/overlap.h"

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "meshflow/core/clock.h"
#include "meshflow/core/error.h"
#include "meshflow/mesh/layout.h"
#include "meshflow/ops/matmul.h"

namespace meshflow {

namespace {

// Operand 0 as row blocks: dim 0 split by the chunk rule over n ranks, the dims between dim 0
// and the last folded into rows (`inner` rows per index of dim 0), `width` elements a row.
struct Blocks {
  int n = 1;
  std::int64_t dim0 = 0, inner = 1, width = 0;
  Blocks(int ranks, std::int64_t global_dim0, const Shape& shape)
      : n(ranks), dim0(global_dim0), width(shape.back()) {
    for (std::size_t i = 1; i + 1 < shape.size(); ++i) inner *= shape[i];
  }
  std::int64_t rows(int block) const { return chunk(dim0, n, block).extent * inner; }
  std::int64_t first_row(int block) const { return chunk(dim0, n, block).offset * inner; }
};

// Times products and transfers into OverlapOptions::events when asked.
class Recorder {
 public:
  explicit Recorder(std::vector<OverlapEvent>* events) : events_(events) {}
  double start() const { return events_ ? steady_seconds() : 0; }
  void add(OverlapEvent::Kind kind, int block, double start_s) {
    if (events_)
      events_->push_back(
          {.kind = kind, .block = block, .start_s = start_s, .end_s = steady_seconds()});
  }

 private:
  std::vector<OverlapEvent>* events_;
};

template <typename T>
T* rows_at(Tensor& t, std::int64_t row, std::int64_t width) {
  return t.data<T>().data() + row * width;
}

// Returns every rank's `mine`, by rank (one all-gather; meaningful only where the group shares
// one address space).
template <typename T>
std::vector<T*> addresses(Communicator& g, T* mine) {
  const auto address = static_cast<std::int64_t>(reinterpret_cast<std::uintptr_t>(mine));
  std::vector<std::int64_t> all(static_cast<std::size_t>(g.size()));
  all_gather(g, {.send = reinterpret_cast<const std::byte*>(&address),
                 .recv = reinterpret_cast<std::byte*>(all.data()),
                 .recv_counts = std::vector<std::int64_t>(all.size(), 1),
                 .dtype = DType::kInt64});
  std::vector<T*> out;
  for (std::int64_t a : all) out.push_back(reinterpret_cast<T*>(static_cast<std::uintptr_t>(a)));
  return out;
}

template <typename T>
Tensor allgather_typed(Communicator& g, const Op& op, const Tensor& a, std::int64_t dim0,
                       const Tensor& b, const Tensor* bias, const OverlapOptions& o) {
  const int n = g.size(), r = g.rank();
  const Blocks blocks(n, dim0, a.shape());
  MESHFLOW_CHECK(a.shape()[0] == chunk(dim0, n, r).extent);
  const std::int64_t width = row_product_width(op, b.shape());
  Shape out_shape = a.shape(), gathered_shape = a.shape();
  out_shape[0] = gathered_shape[0] = dim0;
  out_shape.back() = width;
  Tensor y = Tensor::uninitialized(a.dtype(), out_shape);
  Recorder rec(o.events);
  auto multiply = [&](int block, const T* data) {
    const double start = rec.start();
    row_product<T>(op, data, blocks.rows(block), blocks.width, b, bias,
                   rows_at<T>(y, blocks.first_row(block), width));
    rec.add(OverlapEvent::Kind::kProduct, block, start);
  };
  // Blocks arrive in their place in the gathered operand when it is asked for, otherwise in
  // two scratch buffers taken uninitialised (a loop that repeats reuses cached memory instead of
  // zeroing fresh pages each call; the largest block is block 0). The in-place form needs none.
  Tensor scratch[2];
  if (o.gathered != nullptr) {
    *o.gathered = Tensor::uninitialized(a.dtype(), gathered_shape);
    std::memcpy(rows_at<T>(*o.gathered, blocks.first_row(r), blocks.width), a.bytes(),
                static_cast<std::size_t>(a.numel()) * sizeof(T));
  } else if (o.form != GatherForm::kInPlace) {
    for (Tensor& s : scratch) s = Tensor::uninitialized(a.dtype(), {blocks.rows(0), blocks.width});
  }
  auto slot = [&](int block, int parity) -> T* {
    return o.gathered ? rows_at<T>(*o.gathered, blocks.first_row(block), blocks.width)
                      : scratch[parity].data<T>().data();
  };
  const T* own = a.data<T>().data();
  if (o.form == GatherForm::kInPlace) {
    // Every rank learns where each block lies and multiplies it there, its own first; the
    // closing barrier keeps every block alive and unchanged until all ranks have read it.
    const std::vector<const T*> where = addresses(g, own);
    for (int step = 0; step < n; ++step) {
      const int block = (r + step) % n;
      const T* data = where[static_cast<std::size_t>(block)];
      multiply(block, data);
      if (o.gathered && block != r) {
        std::memcpy(slot(block, 0), data,
                    static_cast<std::size_t>(blocks.rows(block) * blocks.width) * sizeof(T));
      }
    }
    barrier(g);
    return y;
  }
  if (o.form == GatherForm::kPermute) {
    // Step k receives block (r + k) mod n while the block of step k - 1 is multiplied.
    const T* previous = own;
    for (int step = 1; step < n; ++step) {
      const int from = (r + step) % n;
      T* incoming = slot(from, step % 2);
      const double start = rec.start();
      Event e = collective_permute_async(g, {.send = reinterpret_cast<const std::byte*>(own),
                                             .send_count = a.numel(),
                                             .recv = reinterpret_cast<std::byte*>(incoming),
                                             .recv_count = blocks.rows(from) * blocks.width,
                                             .dtype = a.dtype(),
                                             .shift = step});
      multiply((r + step - 1) % n, previous);
      e.wait(g.default_timeout());
      rec.add(OverlapEvent::Kind::kTransfer, from, start);
      previous = incoming;
    }
    multiply((r + n - 1) % n, previous);
    return y;
  }
  // Broadcast form: block b arrives while block b - 1 is multiplied. The root only reads its
  // block, so its own tensor serves as the root's buffer.
  auto data_of = [&](int block) -> T* {
    return block == r && !o.gathered ? const_cast<T*>(own) : slot(block, block % 2);
  };
  double started = 0;
  auto start = [&](int block) {
    started = rec.start();
    return broadcast_async(g, {.data = reinterpret_cast<std::byte*>(data_of(block)),
                               .count = blocks.rows(block) * blocks.width,
                               .dtype = a.dtype(),
                               .root = Rank{block}});
  };
  Event e = start(0);
  for (int block = 0; block < n; ++block) {
    e.wait(g.default_timeout());
    rec.add(OverlapEvent::Kind::kTransfer, block, started);
    if (block + 1 < n) e = start(block + 1);
    multiply(block, data_of(block));
  }
  return y;
}

// Every rank learns where each rank's result lies. At step k rank r adds its term of block
// b = (r + k + 1) mod n straight into rank b's result (the first step writes it): one writer per
// block per step, a barrier between steps, and the last step is r's own block, after which no
// peer touches it. Nothing is copied and no partial result is held.
template <typename T>
Tensor reduce_scatter_in_place(Communicator& g, const Op& op, const Tensor& a, const Tensor& b,
                               const Tensor* bias, Tensor y, const Blocks& blocks, Recorder& rec) {
  const int n = g.size(), r = g.rank();
  const std::vector<T*> where = addresses(g, y.data<T>().data());
  for (int step = 0; step < n; ++step) {
    const int block = (r + step + 1) % n;
    if (step > 0) barrier(g);
    T* out = where[static_cast<std::size_t>(block)];
    const double start = rec.start();
    row_product<T>(op, a.data<T>().data() + blocks.first_row(block) * blocks.width,
                   blocks.rows(block), blocks.width, b, bias, out, /*accumulate=*/step > 0);
    rec.add(OverlapEvent::Kind::kProduct, block, start);
  }
  return y;
}

template <typename T>
Tensor reduce_scatter_typed(Communicator& g, const Op& op, const Tensor& a, const Tensor& b,
                            const Tensor* bias, const OverlapOptions& o) {
  const int n = g.size(), r = g.rank();
  const Blocks blocks(n, a.shape()[0], a.shape());
  const std::int64_t width = row_product_width(op, b.shape());
  Shape out_shape = a.shape();
  out_shape[0] = chunk(a.shape()[0], n, r).extent;
  out_shape.back() = width;
  Tensor y = Tensor::uninitialized(a.dtype(), out_shape);
  Recorder rec(o.events);
  if (o.form == GatherForm::kInPlace)
    return reduce_scatter_in_place<T>(g, op, a, b, bias, std::move(y), blocks, rec);
  // The ring. The last step (block r) accumulates straight into the result.
  Tensor part[2] = {Tensor::uninitialized(a.dtype(), {blocks.rows(0), width}),
                    Tensor::uninitialized(a.dtype(), {blocks.rows(0), width})};
  Tensor received = Tensor::uninitialized(a.dtype(), {blocks.rows(0), width});
  Event in_flight;
  double sent = 0;
  for (int step = 0; step < n; ++step) {
    const int block = (r + step + 1) % n;
    const std::int64_t count = blocks.rows(block) * width;
    T* p = step == n - 1 ? y.data<T>().data() : part[step % 2].data<T>().data();
    const double start = rec.start();
    row_product<T>(op, a.data<T>().data() + blocks.first_row(block) * blocks.width,
                   blocks.rows(block), blocks.width, b, bias, p);
    rec.add(OverlapEvent::Kind::kProduct, block, start);
    if (step > 0) {
      in_flight.wait(g.default_timeout());
      rec.add(OverlapEvent::Kind::kTransfer, block, sent);
      const T* in = received.data<T>().data();
      for (std::int64_t i = 0; i < count; ++i) p[i] += in[i];
    }
    if (step + 1 < n) {
      // Pass this block's partial sum to r - 1; receive from r + 1 its partial sum of the block
      // this rank computes next.
      sent = rec.start();
      in_flight =
          collective_permute_async(g, {.send = reinterpret_cast<const std::byte*>(p),
                                       .send_count = count,
                                       .recv = received.bytes(),
                                       .recv_count = blocks.rows((r + step + 2) % n) * width,
                                       .dtype = a.dtype(),
                                       .shift = 1});
    }
  }
  return y;
}

// Throws naming loop `name` when it is asked for the in-place form, which `does` where peers'
// data lie, on a group that does not share memory.
void check_in_place(const Communicator& group, GatherForm form, std::string_view name,
                    std::string_view does) {
  if (form == GatherForm::kInPlace && !group.shares_memory()) {
    fail(ErrorKind::kInvalidArgument,
         "the in_place form {} where they lie, but {} on the {} backend does not share memory",
         does, describe(name, group.devices()), group.backend());
  }
}

// Checks the operands of a decomposed row product; returns {b, bias}.
std::pair<const Tensor*, const Tensor*> operands(const Op& op, const Tensor& a,
                                                 std::span<const Tensor* const> rest) {
  MESHFLOW_CHECK(is_row_product(op.type) && !rest.empty() && rest.size() <= 2 &&
                     a.shape().size() >= 2 && rest[0]->shape().size() == 2,
                 "{} is not a row product the decomposed collectives take", to_string(op.type));
  for (const Tensor* t : rest) MESHFLOW_CHECK(t->dtype() == a.dtype());
  MESHFLOW_CHECK(a.dtype() == DType::kFloat32 || a.dtype() == DType::kFloat64,
                 "decomposed {} on {}", to_string(op.type), to_string(a.dtype()));
  return {rest[0], rest.size() == 2 ? rest[1] : nullptr};
}

}  // namespace

Tensor allgather_product(Communicator& group, const Op& op, const Tensor& a_local,
                         std::int64_t rows, std::span<const Tensor* const> rest,
                         const OverlapOptions& options) {
  const auto [b, bias] = operands(op, a_local, rest);
  check_in_place(group, options.form, "allgather_product", "reads peers' blocks");
  if (a_local.dtype() == DType::kFloat64)
    return allgather_typed<double>(group, op, a_local, rows, *b, bias, options);
  return allgather_typed<float>(group, op, a_local, rows, *b, bias, options);
}

Tensor product_reduce_scatter(Communicator& group, const Op& op, const Tensor& a_local,
                              std::span<const Tensor* const> rest, const OverlapOptions& options) {
  const auto [b, bias] = operands(op, a_local, rest);
  check_in_place(group, options.form, "product_reduce_scatter", "adds into peers' results");
  if (a_local.dtype() == DType::kFloat64)
    return reduce_scatter_typed<double>(group, op, a_local, *b, bias, options);
  return reduce_scatter_typed<float>(group, op, a_local, *b, bias, options);
}

}  // namespace meshflow
