// The conformance checks. Data is seeded per (check, device) so every device can rebuild any
// peer's input and compute the expected result on its own with plain loops.
#include "tests/comm_conformance.h"

#include <gtest/gtest.h>

#include <algorithm>

#include "meshflow/core/compare.h"
#include "meshflow/core/copy.h"
#include "meshflow/core/random.h"
#include "meshflow/mesh/device_mesh.h"

namespace meshflow::conformance {

namespace {

const DType kDtypes[] = {DType::kFloat32, DType::kFloat64, DType::kInt32, DType::kInt64};
const ReduceOp kOps[] = {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kMax, ReduceOp::kMin};

std::uint64_t seed_of(int check, int variant, DeviceId device) {
  return 1000003ull * check + 1009ull * variant + device;
}

// Returns op over `terms` element-wise, combining in the given order in T (the reference).
Tensor reference_reduce(ReduceOp op, const std::vector<Tensor>& terms) {
  Tensor out = terms[0].clone();
  visit_dtype(out.dtype(), [&](auto zero) {
    using T = decltype(zero);
    auto acc = out.data<T>();
    for (std::size_t k = 1; k < terms.size(); ++k) {
      auto x = terms[k].data<T>();
      for (std::size_t i = 0; i < acc.size(); ++i) {
        if (op == ReduceOp::kSum || op == ReduceOp::kAvg) acc[i] = static_cast<T>(acc[i] + x[i]);
        if (op == ReduceOp::kMax) acc[i] = std::max(acc[i], x[i]);
        if (op == ReduceOp::kMin) acc[i] = std::min(acc[i], x[i]);
      }
    }
    if (op == ReduceOp::kAvg) {
      for (auto& a : acc) a = static_cast<T>(a / static_cast<T>(terms.size()));
    }
  });
  return out;
}

void expect_result(const Tensor& got, const Tensor& want, ReduceOp op, const Env& env,
                   const std::string& what) {
  const bool exact = env.rank_order_reductions || !is_floating(got.dtype()) ||
                     op == ReduceOp::kMax || op == ReduceOp::kMin;
  auto diff = exact ? compare_exact(got, want) : compare_close(got, want, 1e-5, 1e-6);
  EXPECT_EQ(diff, std::nullopt) << what;
}

// Expects every rank of `comm` to hold the same bytes in `t`.
void expect_bitwise_agreement(Communicator& comm, const Tensor& t, const std::string& what) {
  const int n = comm.size();
  Tensor all(t.dtype(), {static_cast<std::int64_t>(n), t.numel()});
  all_gather(comm, {.send = t.bytes(),
                    .recv = all.bytes(),
                    .recv_counts = std::vector<std::int64_t>(n, t.numel()),
                    .dtype = t.dtype()});
  for (int k = 0; k < n; ++k) {
    EXPECT_EQ(std::memcmp(all.bytes() + k * t.nbytes(), t.bytes(), t.nbytes()), 0)
        << what << ": device " << comm.device() << " and rank " << k << " disagree";
  }
}

std::string label(std::string_view name, DType d, ReduceOp op, std::int64_t count) {
  return fmt::format("{} {} {} count {}", name, to_string(d), to_string(op), count);
}

void check_all_reduce(Communicator& comm, const Env& env, const std::vector<std::int64_t>& counts,
                      int id) {
  int variant = 0;
  for (DType d : kDtypes) {
    for (ReduceOp op : kOps) {
      for (std::int64_t count : counts) {
        for (bool in_place : {false, true}) {
          ++variant;
          std::vector<Tensor> inputs;
          for (DeviceId dev : comm.devices())
            inputs.push_back(random_tensor(d, {count}, seed_of(id, variant, dev)));
          Tensor send = inputs[comm.rank()].clone();
          Tensor recv(d, {count});
          Tensor& out = in_place ? send : recv;
          all_reduce(
              comm,
              {.send = send.bytes(), .recv = out.bytes(), .count = count, .dtype = d, .op = op});
          const std::string what =
              label(in_place ? "all_reduce in place" : "all_reduce", d, op, count);
          expect_result(out, reference_reduce(op, inputs), op, env, what);
          expect_bitwise_agreement(comm, out, what);
        }
      }
    }
  }
}

std::vector<std::int64_t> uneven_counts(int n, int salt) {
  std::vector<std::int64_t> c(n);
  for (int k = 0; k < n; ++k) c[k] = (k * 7 + salt) % 5;  // includes zeros
  return c;
}

void check_all_gather(Communicator& comm, const Env&, int id) {
  const int n = comm.size();
  int variant = 0;
  for (DType d : kDtypes) {
    for (int salt : {0, 3}) {
      for (bool in_place : {false, true}) {
        ++variant;
        auto counts = uneven_counts(n, salt);
        if (salt == 3) counts.assign(n, 1);
        const auto displ = displacements(counts);
        Tensor want(d, {displ[n]});
        for (int k = 0; k < n; ++k) {
          Tensor part = random_tensor(d, {counts[k]}, seed_of(id, variant, comm.devices()[k]));
          std::memcpy(want.bytes() + displ[k] * size_of(d), part.bytes(), part.nbytes());
        }
        Tensor recv(d, {displ[n]});
        Tensor mine = random_tensor(d, {counts[comm.rank()]}, seed_of(id, variant, comm.device()));
        const std::byte* send = mine.bytes();
        if (in_place) {
          std::memcpy(recv.bytes() + displ[comm.rank()] * size_of(d), mine.bytes(), mine.nbytes());
          send = recv.bytes() + displ[comm.rank()] * size_of(d);
        }
        all_gather(comm, {.send = send, .recv = recv.bytes(), .recv_counts = counts, .dtype = d});
        EXPECT_EQ(compare_exact(recv, want), std::nullopt)
            << "all_gather " << to_string(d) << " salt " << salt << (in_place ? " in place" : "");
      }
    }
  }
}

void check_reduce_scatter(Communicator& comm, const Env& env, int id) {
  const int n = comm.size();
  int variant = 0;
  for (DType d : kDtypes) {
    for (ReduceOp op : kOps) {
      ++variant;
      auto counts = uneven_counts(n, variant % 5);
      const auto displ = displacements(counts);
      std::vector<Tensor> inputs;
      for (DeviceId dev : comm.devices())
        inputs.push_back(random_tensor(d, {displ[n]}, seed_of(id, variant, dev)));
      Tensor recv(d, {counts[comm.rank()]});
      reduce_scatter(comm, {.send = inputs[comm.rank()].bytes(),
                            .recv = recv.bytes(),
                            .recv_counts = counts,
                            .dtype = d,
                            .op = op});
      std::vector<Tensor> blocks;
      for (const Tensor& in : inputs) {
        Tensor b(d, {counts[comm.rank()]});
        std::memcpy(b.bytes(), in.bytes() + displ[comm.rank()] * size_of(d), b.nbytes());
        blocks.push_back(std::move(b));
      }
      expect_result(recv, reference_reduce(op, blocks), op, env,
                    label("reduce_scatter", d, op, counts[comm.rank()]));
    }
  }
}

void check_all_to_all(Communicator& comm, const Env&, int id) {
  const int n = comm.size(), r = comm.rank();
  // Rank a sends (a + 2b) % 4 elements to rank b.
  auto count = [](int a, int b) -> std::int64_t { return (a + 2 * b) % 4; };
  for (DType d : kDtypes) {
    std::vector<std::int64_t> sc(n), rc(n);
    for (int k = 0; k < n; ++k) {
      sc[k] = count(r, k);
      rc[k] = count(k, r);
    }
    auto input_of = [&](int rank) {
      std::vector<std::int64_t> c(n);
      for (int k = 0; k < n; ++k) c[k] = count(rank, k);
      return random_tensor(d, {displacements(c)[n]},
                           seed_of(id, static_cast<int>(d), comm.devices()[rank]));
    };
    Tensor send = input_of(r);
    Tensor recv(d, {displacements(rc)[n]});
    all_to_all(comm, {.send = send.bytes(),
                      .send_counts = sc,
                      .recv = recv.bytes(),
                      .recv_counts = rc,
                      .dtype = d});
    Tensor want(d, {displacements(rc)[n]});
    const auto rdispl = displacements(rc);
    for (int k = 0; k < n; ++k) {
      Tensor peer = input_of(k);
      std::vector<std::int64_t> pc(n);
      for (int j = 0; j < n; ++j) pc[j] = count(k, j);
      std::memcpy(want.bytes() + rdispl[k] * size_of(d),
                  peer.bytes() + displacements(pc)[r] * size_of(d), rc[k] * size_of(d));
    }
    EXPECT_EQ(compare_exact(recv, want), std::nullopt) << "all_to_all " << to_string(d);
  }
}

void check_broadcast(Communicator& comm, const Env&, int id) {
  for (int root = 0; root < comm.size(); ++root) {
    for (std::int64_t count : {0, 1, 1001}) {
      Tensor want =
          random_tensor(DType::kFloat64, {count}, seed_of(id, root, comm.devices()[root]));
      Tensor buf = comm.rank() == root ? want.clone() : random_tensor(DType::kFloat64, {count}, 99);
      broadcast(
          comm,
          {.data = buf.bytes(), .count = count, .dtype = DType::kFloat64, .root = Rank{root}});
      EXPECT_EQ(compare_exact(buf, want), std::nullopt)
          << "broadcast root " << root << " count " << count;
    }
  }
}

void check_send_recv(Communicator& comm, const Env&, int id) {
  const int n = comm.size(), r = comm.rank();
  const int next = (r + 1) % n, prev = (r + n - 1) % n;
  // A ring, both directions in flight, and two tags received in the opposite order.
  Tensor a = random_tensor(DType::kInt64, {37}, seed_of(id, 1, comm.device()));
  Tensor b = random_tensor(DType::kInt64, {5}, seed_of(id, 2, comm.device()));
  Tensor got_a(DType::kInt64, {37}), got_b(DType::kInt64, {5});
  Event sa = send_async(
      comm, {.data = a.bytes(), .count = 37, .dtype = DType::kInt64, .peer = Rank{next}, .tag = 1});
  Event sb = send_async(
      comm, {.data = b.bytes(), .count = 5, .dtype = DType::kInt64, .peer = Rank{next}, .tag = 2});
  recv(comm,
       {.data = got_b.bytes(), .count = 5, .dtype = DType::kInt64, .peer = Rank{prev}, .tag = 2});
  recv(comm,
       {.data = got_a.bytes(), .count = 37, .dtype = DType::kInt64, .peer = Rank{prev}, .tag = 1});
  when_all({sa, sb}).wait(comm.default_timeout());
  EXPECT_EQ(compare_exact(got_a,
                          random_tensor(DType::kInt64, {37}, seed_of(id, 1, comm.devices()[prev]))),
            std::nullopt);
  EXPECT_EQ(
      compare_exact(got_b, random_tensor(DType::kInt64, {5}, seed_of(id, 2, comm.devices()[prev]))),
      std::nullopt);
}

void check_permute(Communicator& comm, const Env&, int id) {
  const int n = comm.size(), r = comm.rank();
  Tensor mine = random_tensor(DType::kFloat32, {r + 3}, seed_of(id, 0, comm.device()));
  for (int shift = -1; shift <= n; ++shift) {
    const int from = ((r + shift) % n + n) % n, to = ((r - shift) % n + n) % n;
    Tensor got(DType::kFloat32, {from + 3});
    collective_permute(comm, {.send = mine.bytes(),
                              .send_count = r + 3,
                              .recv = got.bytes(),
                              .recv_count = from + 3,
                              .dtype = DType::kFloat32,
                              .shift = shift});
    EXPECT_EQ(compare_exact(got, random_tensor(DType::kFloat32, {from + 3},
                                               seed_of(id, 0, comm.devices()[from]))),
              std::nullopt)
        << "permute shift " << shift << " (sends to " << to << ")";
  }
  // An all-gather is n - 1 permutes plus the local block.
  const std::int64_t block = 64;
  Tensor local = random_tensor(DType::kFloat32, {block}, seed_of(id, 1, comm.device()));
  Tensor gathered(DType::kFloat32, {n * block}), via_permutes(DType::kFloat32, {n * block});
  all_gather(comm, {.send = local.bytes(),
                    .recv = gathered.bytes(),
                    .recv_counts = std::vector<std::int64_t>(n, block)});
  std::memcpy(via_permutes.bytes() + r * block * 4, local.bytes(), block * 4);
  for (int k = 1; k < n; ++k) {
    collective_permute(comm, {.send = local.bytes(),
                              .send_count = block,
                              .recv = via_permutes.bytes() + ((r + k) % n) * block * 4,
                              .recv_count = block,
                              .shift = k});
  }
  EXPECT_EQ(compare_exact(via_permutes, gathered), std::nullopt);
}

// The group checks run on the mesh the world size allows: 2x2x2 (8), 2x2 (4), or (n).
DeviceMesh conformance_mesh(int n) {
  if (n == 8) return make_mesh({2, 2, 2});
  if (n == 4) return make_mesh({2, 2});
  return make_mesh({n});
}

std::vector<std::vector<MeshDim>> dim_sets(int ndims) {
  std::vector<std::vector<MeshDim>> out;
  for (int mask = 1; mask < (1 << ndims); ++mask) {
    std::vector<MeshDim> dims;
    for (int d = 0; d < ndims; ++d) {
      if (mask & (1 << d)) dims.push_back(d);
    }
    out.push_back(dims);
  }
  return out;
}

void check_groups(Communicator& comm, const Env& env, int id) {
  DeviceMesh mesh = conformance_mesh(comm.size());
  int variant = 0;
  for (const auto& dims : dim_sets(ndim(mesh))) {
    ++variant;
    const std::vector<DeviceId> members = group_along(mesh, comm.device(), dims);
    auto g = comm.group(members);
    EXPECT_EQ(g.get(), comm.group(members).get()) << "groups are cached";
    ASSERT_EQ(g->size(), static_cast<int>(members.size()));
    EXPECT_EQ(g->device(), comm.device());
    std::vector<Tensor> inputs;
    for (DeviceId dev : members)
      inputs.push_back(random_tensor(DType::kFloat32, {1027}, seed_of(id, variant, dev)));
    Tensor out(DType::kFloat32, {1027});
    all_reduce(*g, {.send = inputs[g->rank()].bytes(),
                    .recv = out.bytes(),
                    .count = 1027,
                    .op = ReduceOp::kSum});
    expect_result(out, reference_reduce(ReduceOp::kSum, inputs), ReduceOp::kSum, env,
                  "group all_reduce");
    expect_bitwise_agreement(*g, out, "group all_reduce");
  }
}

void check_async(Communicator& comm, const Env& env, int id) {
  const int n = comm.size();
  std::vector<Tensor> inputs;
  for (DeviceId dev : comm.devices())
    inputs.push_back(random_tensor(DType::kFloat64, {4099}, seed_of(id, 0, dev)));
  Tensor reduced(DType::kFloat64, {4099});
  Tensor piece = random_tensor(DType::kInt32, {10}, seed_of(id, 1, comm.device()));
  Tensor gathered(DType::kInt32, {10 * n});
  Event e1 = all_reduce_async(comm, {.send = inputs[comm.rank()].bytes(),
                                     .recv = reduced.bytes(),
                                     .count = 4099,
                                     .dtype = DType::kFloat64,
                                     .op = ReduceOp::kSum});
  Event e2 = all_gather_async(comm, {.send = piece.bytes(),
                                     .recv = gathered.bytes(),
                                     .recv_counts = std::vector<std::int64_t>(n, 10),
                                     .dtype = DType::kInt32});
  // Both are in flight; the second completes no earlier than issue order allows.
  when_all({e2, e1}).wait(comm.default_timeout());
  expect_result(reduced, reference_reduce(ReduceOp::kSum, inputs), ReduceOp::kSum, env,
                "async all_reduce");
  for (int k = 0; k < n; ++k) {
    Tensor want = random_tensor(DType::kInt32, {10}, seed_of(id, 1, comm.devices()[k]));
    EXPECT_EQ(std::memcmp(gathered.bytes() + k * 40, want.bytes(), 40), 0)
        << "async all_gather block " << k;
  }
  barrier(comm);
  barrier_async(comm).wait(comm.default_timeout());
}

void check_large(Communicator& comm, const Env& env, int id) {
  const int n = comm.size();
  const std::int64_t count = (16 << 20) / 4;  // 16 MiB of float32
  std::vector<Tensor> inputs;
  for (DeviceId dev : comm.devices())
    inputs.push_back(random_tensor(DType::kFloat32, {count}, seed_of(id, 0, dev)));
  Tensor out(DType::kFloat32, {count});
  all_reduce(comm, {.send = inputs[comm.rank()].bytes(),
                    .recv = out.bytes(),
                    .count = count,
                    .op = ReduceOp::kSum});
  expect_result(out, reference_reduce(ReduceOp::kSum, inputs), ReduceOp::kSum, env,
                "16 MiB all_reduce");
  expect_bitwise_agreement(comm, out, "16 MiB all_reduce");
  // all_gather of 16 MiB in total.
  std::vector<std::int64_t> counts(n, count / n);
  counts[n - 1] += count % n;
  Tensor gathered(DType::kFloat32, {count});
  const auto displ = displacements(counts);
  all_gather(
      comm, {.send = inputs[comm.rank()].bytes(), .recv = gathered.bytes(), .recv_counts = counts});
  for (int k = 0; k < n; ++k) {
    EXPECT_EQ(std::memcmp(gathered.bytes() + displ[k] * 4, inputs[k].bytes(), counts[k] * 4), 0)
        << "16 MiB all_gather block " << k;
  }
  // all_to_all of nearly 16 MiB from every rank, in blocks of uneven sizes so that they start off
  // cache-line boundaries: rank k sends block(k, j) elements to rank j.
  const int r = comm.rank();
  auto block = [&](int from, int to) { return count / n - 3 * n + 3 * to + from; };
  std::vector<std::int64_t> send_counts(n), recv_counts(n);
  for (int k = 0; k < n; ++k) {
    send_counts[k] = block(r, k);
    recv_counts[k] = block(k, r);
  }
  const auto rdispl = displacements(recv_counts);
  Tensor received(DType::kFloat32, {rdispl[n - 1] + recv_counts[n - 1]});
  all_to_all(comm, {.send = inputs[r].bytes(),
                    .send_counts = send_counts,
                    .recv = received.bytes(),
                    .recv_counts = recv_counts});
  for (int k = 0; k < n; ++k) {
    std::int64_t sdispl = 0;  // where k's block for r starts in k's input
    for (int j = 0; j < r; ++j) sdispl += block(k, j);
    EXPECT_EQ(std::memcmp(received.bytes() + rdispl[k] * 4, inputs[k].bytes() + sdispl * 4,
                          block(k, r) * 4),
              0)
        << "16 MiB all_to_all block from " << k;
  }
  // broadcast of 16 MiB from the last rank, and a permute of 16 MiB from every rank.
  Tensor broadcasted = inputs[r].clone();
  broadcast(comm, {.data = broadcasted.bytes(), .count = count, .root = Rank{n - 1}});
  EXPECT_EQ(compare_exact(broadcasted, inputs[n - 1]), std::nullopt) << "16 MiB broadcast";
  Tensor permuted(DType::kFloat32, {count});
  collective_permute(comm, {.send = inputs[r].bytes(),
                            .send_count = count,
                            .recv = permuted.bytes(),
                            .recv_count = count,
                            .shift = 1});
  EXPECT_EQ(compare_exact(permuted, inputs[(r + 1) % n]), std::nullopt) << "16 MiB permute";
}

void check_exchange_boxes(Communicator& comm, const Env&, int id) {
  const int n = comm.size(), r = comm.rank();
  for (DType d : kDtypes) {
    const Shape shape{2 * n, 5};
    Tensor src = random_tensor(d, shape, seed_of(id, static_cast<int>(d), comm.device()));
    Tensor dst(d, shape);
    ExchangeBoxesOptions o{
        .src = src.bytes(), .src_shape = shape, .dst = dst.bytes(), .dst_shape = shape, .dtype = d};
    o.send.resize(n);
    o.recv.resize(n);
    for (int k = 0; k < n; ++k) {
      // Two regions per pair, placed at different offsets than they came from; rank 1 sends an
      // empty region too.
      o.send[k] = {Box{{2 * k, 0}, {1, 3}}, Box{{2 * k + 1, 1}, {1, 4}}};
      o.recv[k] = {Box{{2 * k, 2}, {1, 3}}, Box{{2 * k + 1, 0}, {1, 4}}};
      if (k == 1) o.send[k].push_back(Box{{0, 0}, {0, 5}});
      if (r == 1) o.recv[k].push_back(Box{{3, 0}, {0, 5}});
    }
    exchange_boxes(comm, o);
    Tensor want(d, shape);
    for (int k = 0; k < n; ++k) {
      Tensor theirs = random_tensor(d, shape, seed_of(id, static_cast<int>(d), comm.devices()[k]));
      copy_box(theirs, Box{{2 * r, 0}, {1, 3}}, want, {2 * k, 2});
      copy_box(theirs, Box{{2 * r + 1, 1}, {1, 4}}, want, {2 * k + 1, 0});
    }
    EXPECT_EQ(compare_exact(dst, want), std::nullopt) << "exchange_boxes " << to_string(d);
  }
}

// A transposing exchange (every rank's rows, cut into every rank's columns) large enough that
// the threads backend writes it with streaming stores where this machine's cache size is known.
// Rows of 1027 float32 cut unevenly put every region's runs off cache-line boundaries, so the
// partly written lines at both ends of each run are covered too.
void check_exchange_boxes_streamed(Communicator& comm, const Env&, int id) {
  const int n = comm.size(), r = comm.rank();
  constexpr std::int64_t kCols = 1027;
  const std::int64_t bytes = std::clamp<std::int64_t>(
      last_level_cache_bytes() / 2 + (1 << 20), std::int64_t{4} << 20, std::int64_t{256} << 20);
  const std::int64_t rows = bytes / (kCols * 4);
  if (bytes == last_level_cache_bytes() / 2 + (1 << 20)) {
    ASSERT_EQ(store_for_copy_of(rows * kCols * 4), Store::kStreaming);
  }
  auto rows_of = [&](int k) {
    return Box{{rows * k / n, 0}, {rows * (k + 1) / n - rows * k / n, kCols}};
  };
  auto cols_of = [&](int k) {
    return Box{{0, kCols * k / n}, {rows, kCols * (k + 1) / n - kCols * k / n}};
  };
  auto input = [&](int k) {
    return random_tensor(DType::kFloat32, rows_of(k).extent, seed_of(id, 0, comm.devices()[k]));
  };
  const Tensor src = input(r);
  Tensor dst(DType::kFloat32, cols_of(r).extent);
  ExchangeBoxesOptions o{.src = src.bytes(),
                         .src_shape = src.shape(),
                         .dst = dst.bytes(),
                         .dst_shape = dst.shape(),
                         .dtype = DType::kFloat32};
  o.send.resize(n);
  o.recv.resize(n);
  for (int k = 0; k < n; ++k) {
    // To k: my rows, k's columns; from k: k's rows, my columns.
    o.send[k] = {Box{{0, cols_of(k).offset[1]}, {rows_of(r).extent[0], cols_of(k).extent[1]}}};
    o.recv[k] = {Box{{rows_of(k).offset[0], 0}, {rows_of(k).extent[0], cols_of(r).extent[1]}}};
  }
  exchange_boxes(comm, o);
  Tensor want(DType::kFloat32, dst.shape());
  for (int k = 0; k < n; ++k) {
    copy_box(input(k), Box{{0, cols_of(r).offset[1]}, {rows_of(k).extent[0], cols_of(r).extent[1]}},
             want, {rows_of(k).offset[0], 0});
  }
  EXPECT_EQ(compare_exact(dst, want), std::nullopt)
      << "exchange_boxes of " << rows << "x" << kCols << " float32";
}

}  // namespace

const std::vector<Check>& checks() {
  static const std::vector<Check> all = {
      {"AllReduceEveryDtypeOpAndSize",
       [](Communicator& c, const Env& e) {
         check_all_reduce(c, e, {0, 1, 13, 4099}, 1);
       }},
      {"AllGatherUnevenEveryDtype",
       [](Communicator& c, const Env& e) { check_all_gather(c, e, 2); }},
      {"ReduceScatterUnevenEveryDtypeAndOp",
       [](Communicator& c, const Env& e) { check_reduce_scatter(c, e, 3); }},
      {"AllToAllUnevenEveryDtype",
       [](Communicator& c, const Env& e) { check_all_to_all(c, e, 4); }},
      {"BroadcastFromEveryRoot", [](Communicator& c, const Env& e) { check_broadcast(c, e, 5); }},
      {"SendRecvMatchesByTag", [](Communicator& c, const Env& e) { check_send_recv(c, e, 6); }},
      {"CollectivePermuteEveryShift",
       [](Communicator& c, const Env& e) { check_permute(c, e, 7); }},
      {"GroupsAlongEveryMeshDimSet", [](Communicator& c, const Env& e) { check_groups(c, e, 8); }},
      {"TwoAsyncCollectivesInFlight", [](Communicator& c, const Env& e) { check_async(c, e, 9); }},
      {"ExchangeBoxesMovesRegionsBetweenRanks",
       [](Communicator& c, const Env& e) { check_exchange_boxes(c, e, 11); }},
      {"SixteenMiB", [](Communicator& c, const Env& e) { check_large(c, e, 10); }},
      {"ExchangeBoxesLargeEnoughToStream",
       [](Communicator& c, const Env& e) { check_exchange_boxes_streamed(c, e, 12); }},
  };
  return all;
}

}  // namespace meshflow::conformance
