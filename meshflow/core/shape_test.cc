#include "meshflow/core/shape.h"

#include <gtest/gtest.h>

#include "meshflow/core/dtype.h"
#include "meshflow/core/error.h"
#include "meshflow/core/limits.h"
#include "meshflow/core/reduce_op.h"

namespace meshflow {
namespace {

TEST(Shape, ParsesBothSeparatorsAndScalars) {
  EXPECT_EQ(parse_shape("16x8"), (Shape{16, 8}));
  EXPECT_EQ(parse_shape("3,0,2"), (Shape{3, 0, 2}));
  EXPECT_EQ(parse_shape("()"), Shape{});
  EXPECT_EQ(to_string(Shape{4, 5}), "4x5");
  EXPECT_EQ(numel(Shape{}), 1);
  EXPECT_EQ(numel(Shape{3, 0}), 0);
}

TEST(Shape, MalformedTextNamesTheText) {
  for (const char* bad : {"4x", "x4", "4x-1", "4xa", "4 x 4"}) {
    try {
      parse_shape(bad);
      FAIL() << bad;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(bad), std::string::npos) << e.what();
    }
  }
}

TEST(Shape, RowMajorStrides) {
  EXPECT_EQ(row_major_strides(Shape{2, 3, 4}), (std::vector<std::int64_t>{12, 4, 1}));
}

TEST(Shape, RowStartIndexCountsRowsOverEveryDimButTheLast) {
  // Shape [2, 3, 4] has 6 rows of 4; row 4 starts at [1, 1, 0].
  EXPECT_EQ(row_start_index(Shape{2, 3, 4}, 0), (std::vector<std::int64_t>{0, 0, 0}));
  EXPECT_EQ(row_start_index(Shape{2, 3, 4}, 4), (std::vector<std::int64_t>{1, 1, 0}));
  EXPECT_EQ(row_start_index(Shape{5}, 0), (std::vector<std::int64_t>{0}));
  EXPECT_TRUE(row_start_index(Shape{}, 0).empty());
}

TEST(DType, NamesRoundTripAndUnknownIsRejected) {
  for (DType d : {DType::kFloat32, DType::kFloat64, DType::kInt32, DType::kInt64}) {
    EXPECT_EQ(parse_dtype(to_string(d)), d);
  }
  EXPECT_THROW(parse_dtype("float16"), Error);
  EXPECT_EQ(parse_reduce_op("avg"), ReduceOp::kAvg);
  EXPECT_THROW(parse_reduce_op("prod"), Error);
}

}  // namespace
}  // namespace meshflow

namespace meshflow {
namespace {

TEST(CheckedNumel, AnEmptyShapeStillBoundsItsOtherExtents) {
  // Regression (found by the text-forms fuzzer): a 0 extent made the size check pass while the
  // product of the other extents overflowed in numel and in strides.
  EXPECT_EQ(numel(Shape{1 << 30, 1 << 30, 1 << 30, 0}), 0);
  EXPECT_THROW(
      checked_numel({0, std::int64_t{1} << 30, std::int64_t{1} << 30}, DType::kFloat32, "shape"),
      Error);
  EXPECT_EQ(checked_numel({0, 1 << 20, 1 << 20}, DType::kFloat32, "shape"), 0);
}

}  // namespace
}  // namespace meshflow
