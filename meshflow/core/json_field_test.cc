#include "meshflow/core/json_field.h"

#include <gtest/gtest.h>

#include "tests/error_of.h"

namespace meshflow {
namespace {

using testing::error_of;

TEST(JsonField, IntegersAreStrictAboutTypeAndRange) {
  const nlohmann::json j = nlohmann::json::parse(
      R"({"a": [1, 2.5, true, "3", 18446744073709551615, -1], "b": {"c": 7}})");
  const JsonField root(j, "f.json");
  const JsonField a = root.member("a");
  EXPECT_EQ(a.at(0).as_int(0, 10), 1);
  EXPECT_EQ(error_of([&] { a.at(1).as_int(0, 10); }),
            "f.json: \"a[1]\" must be an integer in [0, 10], got 2.5");
  EXPECT_EQ(error_of([&] { a.at(2).as_int(0, 10); }),
            "f.json: \"a[2]\" must be an integer in [0, 10], got true");
  EXPECT_EQ(error_of([&] { a.at(3).as_int(0, 10); }),
            "f.json: \"a[3]\" must be an integer in [0, 10], got \"3\"");
  EXPECT_EQ(error_of([&] { a.at(4).as_int(0, 10); }),
            "f.json: \"a[4]\" must be an integer in [0, 10], got 18446744073709551615");
  EXPECT_EQ(error_of([&] { a.at(5).as_int(0, 10); }),
            "f.json: \"a[5]\" must be an integer in [0, 10], got -1");
  EXPECT_EQ(root.member("b").member("c").as_int(0, 10), 7);
  EXPECT_EQ(error_of([&] { root.member("b").member("d"); }), "f.json: missing field \"b.d\"");
  EXPECT_EQ(error_of([&] { root.member("a").member("x"); }),
            "f.json: \"a\" must be an object, got [1,2.5,true,\"3\",18446744073709551615,-1]");
}

TEST(JsonField, LongValuesAreCutInMessages) {
  const nlohmann::json j = nlohmann::json::parse(R"({"s": ")" + std::string(500, 'x') + R"("})");
  const std::string e = error_of([&] { JsonField(j, "f.json").member("s").as_int(0, 1); });
  EXPECT_LT(e.size(), 120u) << e;
}

TEST(ParseJson, ANumberBeyondEveryTypeIsAnErrorNotACrash) {
  // Regression (found by the layout.json fuzzer): nlohmann throws out_of_range, not
  // parse_error, for such a number, and it escaped as an uncaught exception.
  EXPECT_EQ(error_of([] { parse_json(R"({"a": 4400000.0e0000727712452908213})", "f.json"); }),
            "f.json: invalid JSON: a number is out of range");
  EXPECT_EQ(error_of([] { parse_json(R"({"a": )", "f.json"); }), "f.json: invalid JSON at byte 7");
}

TEST(ParseJson, AKeyTwiceInOneObjectIsAnError) {
  EXPECT_EQ(error_of([] { parse_json(R"({"a": 1, "b": {"a": 2}, "a": 3})", "m.json"); }),
            "m.json: key \"a\" appears twice in one object");
  EXPECT_NO_THROW(parse_json(R"({"a": {"a": 1}, "b": [{"a": 1}, {"a": 2}]})", "m.json"));
}

}  // namespace
}  // namespace meshflow
