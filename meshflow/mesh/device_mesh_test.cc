#include "meshflow/mesh/device_mesh.h"

#include <gtest/gtest.h>

#include "meshflow/core/error.h"
#include "tests/error_of.h"

namespace meshflow {
namespace {

using testing::error_of;

TEST(DeviceMesh, ParsesBothFormsAndPrintsCanonically) {
  DeviceMesh m = parse_mesh("2x2");
  EXPECT_EQ(m.devices, (std::vector<DeviceId>{0, 1, 2, 3}));
  EXPECT_EQ(to_string(m), "2x2");
  DeviceMesh e = parse_mesh("2x2@4,5,6,7");
  EXPECT_EQ(e.devices, (std::vector<DeviceId>{4, 5, 6, 7}));
  EXPECT_EQ(to_string(e), "2x2@4,5,6,7");
  EXPECT_EQ(to_string(parse_mesh("4@3,2,1,0")), "4@3,2,1,0");
}

TEST(DeviceMesh, BadMeshesNameTheValue) {
  EXPECT_NE(error_of([] { parse_mesh("2x"); }).find("\"2x\""), std::string::npos);
  EXPECT_NE(error_of([] { parse_mesh("2x2@1,2,3"); }).find("needs 4 devices"), std::string::npos);
  EXPECT_NE(error_of([] { parse_mesh("2@1,1"); }).find("device 1 twice"), std::string::npos);
  EXPECT_NE(error_of([] { parse_mesh("2@1,a"); }).find("\"a\""), std::string::npos);
  EXPECT_NE(error_of([] { parse_mesh("0x2"); }).find("below 1"), std::string::npos);
  EXPECT_NE(error_of([] { parse_mesh("2@-1,0"); }).find("negative"), std::string::npos);
  EXPECT_NE(error_of([] {
              make_mesh({2, 2}, {0, 1, 2, 3}, {"dp"});
            }).find("2 dims but 1 names"),
            std::string::npos);
  EXPECT_NE(error_of([] {
              make_mesh({2, 2}, {0, 1, 2, 3}, {"dp", "dp"});
            }).find("repeated"),
            std::string::npos);
}

TEST(DeviceMesh, CoordinatesAndGroupsAlongDims) {
  DeviceMesh m = make_mesh({2, 3}, {10, 11, 12, 13, 14, 15}, {"dp", "tp"});
  EXPECT_EQ(coordinates(m, 14), (std::vector<std::int64_t>{1, 1}));
  EXPECT_EQ(device_at(m, {0, 2}), 12);
  EXPECT_EQ(group_along(m, 14, {1}), (std::vector<DeviceId>{13, 14, 15}));
  EXPECT_EQ(group_along(m, 14, {0}), (std::vector<DeviceId>{11, 14}));
  EXPECT_EQ(group_along(m, 14, {1, 0}), (std::vector<DeviceId>{10, 11, 12, 13, 14, 15}));
  EXPECT_EQ(group_along(m, 14, {}), (std::vector<DeviceId>{14}));
  EXPECT_THROW(coordinates(m, 3), Error);
  EXPECT_THROW(group_along(m, 14, {2}), Error);
  EXPECT_EQ(parse_mesh_dim(m, "tp"), 1);
  EXPECT_EQ(parse_mesh_dim(m, "0"), 0);
  EXPECT_THROW(parse_mesh_dim(m, "pp"), Error);
}

TEST(DeviceMesh, FlattenedGroupOfA3dMeshSpansTheChosenDims) {
  DeviceMesh m = make_mesh({2, 2, 2});
  EXPECT_EQ(group_along(m, 5, {0, 2}), (std::vector<DeviceId>{0, 1, 4, 5}));
  DeviceMesh sub = sub_mesh(m, 5, {0, 2});
  EXPECT_EQ(sub.shape, (Shape{2, 2}));
  EXPECT_EQ(sub.devices, (std::vector<DeviceId>{0, 1, 4, 5}));
}

}  // namespace
}  // namespace meshflow
