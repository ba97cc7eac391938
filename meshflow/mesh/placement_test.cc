#include "meshflow/mesh/placement.h"

#include <gtest/gtest.h>

#include "meshflow/core/error.h"

namespace meshflow {
namespace {

TEST(Placement, AcceptsEveryDocumentedForm) {
  EXPECT_EQ(parse_placement("S(0)"), Placement::shard(0));
  EXPECT_EQ(parse_placement("S1"), Placement::shard(1));
  EXPECT_EQ(parse_placement("Shard(2)"), Placement::shard(2));
  EXPECT_EQ(parse_placement("S(-1)"), Placement::shard(-1));
  EXPECT_EQ(parse_placement("Shard(dim=1)"), Placement::shard(1));
  EXPECT_EQ(parse_placement("R"), Placement::replicate());
  EXPECT_EQ(parse_placement("Replicate()"), Placement::replicate());
  EXPECT_EQ(parse_placement("P"), Placement::partial(ReduceOp::kSum));
  EXPECT_EQ(parse_placement("P(avg)"), Placement::partial(ReduceOp::kAvg));
  EXPECT_EQ(parse_placement("Partial(max)"), Placement::partial(ReduceOp::kMax));
  EXPECT_EQ(parse_placement("Partial()"), Placement::partial(ReduceOp::kSum));
  EXPECT_EQ(parse_placement(" P( min ) "), Placement::partial(ReduceOp::kMin));
}

TEST(Placement, PrintsCanonicalForms) {
  EXPECT_EQ(to_string(parse_placements("[Shard(0), Replicate(), Partial(avg)]")), "S(0),R,P(avg)");
  EXPECT_EQ(to_string(parse_placements("S0,P")), "S(0),P(sum)");
}

TEST(Placement, MalformedTextIsNamed) {
  for (const char* bad : {"X", "S", "S(a)", "P(prod)", "R(1)", "S(0", "Shard()"}) {
    try {
      parse_placement(bad);
      FAIL() << bad;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(std::string("\"") + bad + "\""), std::string::npos)
          << e.what();
    }
  }
  EXPECT_THROW(parse_placements("S(0),,R"), Error);
  EXPECT_THROW(parse_placements(""), Error);
}

}  // namespace
}  // namespace meshflow
