// The embedding and its gradient against plain loops (ops/embedding.cc): the gather, the
// gradient's sums in token order on a team, empty shapes, and the error for an id out of range.
#include <gtest/gtest.h>

#include <algorithm>
#include <vector>

#include "meshflow/kernels/parallel.h"
#include "meshflow/ops/kernels_testing.h"
#include "meshflow/ops/op.h"
#include "tests/error_of.h"

namespace meshflow {
namespace {

using testing::at;
using testing::error_of;
using testing::expect_near;
using testing::ids;
using testing::rnd;
using testing::run;

TEST(Kernels, EmbeddingGathersTableRowsAndItsGradientAddsThemBack) {
  for (DType id_type : {DType::kInt32, DType::kInt64}) {
    const Tensor i = ids({2, 5}, 6, id_type), table = rnd({6, 3}, 1);
    const Tensor y = run({.type = OpType::kEmbedding}, {&i, &table});
    ASSERT_EQ(y.shape(), (Shape{2, 5, 3}));
    const Tensor g = rnd({2, 5, 3}, 2);
    const Tensor gt = run({.type = OpType::kEmbeddingGrad, .shape = {6, 3}}, {&i, &g});
    std::vector<double> want_y, want_g(18, 0.0);
    for (std::int64_t k = 0; k < 10; ++k) {
      const std::int64_t row = id_type == DType::kInt64
                                   ? i.data<std::int64_t>()[static_cast<std::size_t>(k)]
                                   : i.data<std::int32_t>()[static_cast<std::size_t>(k)];
      for (std::int64_t j = 0; j < 3; ++j) {
        want_y.push_back(at(table, row * 3 + j));
        want_g[static_cast<std::size_t>(row * 3 + j)] += at(g, k * 3 + j);
      }
    }
    expect_near(y, want_y, 0, "embedding");
    expect_near(gt, want_g, 1e-15, "embedding_grad");
  }
}

// The table's gradient at a size whose rows split over a team: rows no id names are zero, the
// others the sum of their tokens' rows in token order, bit for bit as a plain loop adds them;
// with ids spread evenly, and with most tokens naming a few rows at the table's start (as a
// text's frequent tokens do, whose additions split the columns: rows 100 wide split in two).
TEST(Kernels, EmbeddingGradientOnATeamAddsEachIdsRowsInTokenOrder) {
  ThreadTeam team(3);
  const std::int64_t vocab = 7001, width = 100, tokens = 1500;
  const Tensor g = rnd({tokens, width}, 7, DType::kFloat32);
  for (const bool skewed : {false, true}) {
    Tensor i = ids({tokens}, vocab);
    if (skewed) {
      for (std::int64_t k = 0; k < tokens; ++k) {
        std::int64_t& id = i.data<std::int64_t>()[static_cast<std::size_t>(k)];
        if (k % 10 < 7) id = id % 40 * 175;  // 40 frequent ids, spread over every part
      }
    }
    std::vector<float> want(static_cast<std::size_t>(vocab * width), 0.0f);
    for (std::int64_t k = 0; k < tokens; ++k) {
      const std::int64_t row = i.data<std::int64_t>()[static_cast<std::size_t>(k)];
      for (std::int64_t j = 0; j < width; ++j)
        want[static_cast<std::size_t>(row * width + j)] +=
            g.data<float>()[static_cast<std::size_t>(k * width + j)];
    }
    for (const bool on_team : {false, true}) {
      {
        // Freed buffers are handed out again: leave one of the table's size dirty, so that a
        // row the kernel did not write shows, and one of its links' (a first token per row,
        // then a next token per token for each of the team's 3 parts) ending every chain, so
        // that a part reading links another part wrote leaves out later tokens.
        Tensor dirty = Tensor::uninitialized(DType::kFloat32, {vocab, width});
        std::fill(dirty.data<float>().begin(), dirty.data<float>().end(), 7.0f);
        const std::vector<std::int64_t> dirty_links(vocab + 3 * tokens, -1);
      }
      const UseTeam use(on_team ? &team : nullptr);
      const Tensor got = run({.type = OpType::kEmbeddingGrad, .shape = {vocab, width}}, {&i, &g});
      ASSERT_EQ(got.shape(), (Shape{vocab, width}));
      std::int64_t zero_rows = 0;
      for (std::int64_t r = 0; r < vocab; ++r) {
        bool zero = true;
        for (std::int64_t j = 0; j < width; ++j) {
          const auto e = static_cast<std::size_t>(r * width + j);
          ASSERT_EQ(got.data<float>()[e], want[e])
              << "row " << r << " column " << j << (skewed ? " (skewed)" : "");
          zero = zero && want[e] == 0.0f;
        }
        zero_rows += zero;
      }
      EXPECT_GT(zero_rows, vocab / 2);  // most rows no token names
    }
  }
}

// Rows of width 0 (a shard of no columns) give a table of width 0, and no tokens a zero table.
TEST(Kernels, EmbeddingGradientOfEmptyRowsOrTables) {
  ThreadTeam team(2);
  const UseTeam use(&team);
  const Tensor i = ids({6}, 5);
  const Tensor g = rnd({6, 0}, 3, DType::kFloat32);
  EXPECT_EQ(run({.type = OpType::kEmbeddingGrad, .shape = {5, 0}}, {&i, &g}).shape(),
            (Shape{5, 0}));
  const Tensor none = ids({0}, 5);
  const Tensor g0 = rnd({0, 4}, 3, DType::kFloat32);
  const Tensor zeros = run({.type = OpType::kEmbeddingGrad, .shape = {5, 4}}, {&none, &g0});
  ASSERT_EQ(zeros.shape(), (Shape{5, 4}));
  for (float v : zeros.data<float>()) EXPECT_EQ(v, 0.0f);
}

// The gradient's ids are linked by each thread of a team, for its own rows: the error still names
// the first id out of range, alone or on a team.
TEST(Kernels, EmbeddingGradientNamesTheFirstIdOutOfRange) {
  Tensor grad_ids(DType::kInt64, {4});
  std::copy_n(std::vector<std::int64_t>{3, 900, 1000, -1}.begin(), 4,
              grad_ids.data<std::int64_t>().begin());
  const Tensor g_rows = rnd({4, 512}, 6);
  ThreadTeam team(2);
  for (ThreadTeam* t : {static_cast<ThreadTeam*>(nullptr), &team}) {
    const UseTeam use(t);
    EXPECT_EQ(error_of([&] {
                run({.type = OpType::kEmbeddingGrad, .shape = {1000, 512}}, {&grad_ids, &g_rows});
              }),
              "embedding_grad: id 1000 is out of range for a table of 1000 rows");
  }
}

}  // namespace
}  // namespace meshflow
