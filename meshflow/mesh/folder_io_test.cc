// Box reads of sharded folders against slices of the whole tensor, with every replica's file
// present or only one per replica group; gather of such a folder.
#include "meshflow/mesh/folder_io.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include "meshflow/core/compare.h"
#include "meshflow/core/copy.h"
#include "meshflow/core/npy.h"
#include "meshflow/core/random.h"
#include "meshflow/mesh/sharded_folder.h"
#include "meshflow/mesh/sharding.h"

namespace meshflow {
namespace {

namespace fs = std::filesystem;

struct Dir {
  fs::path path = fs::temp_directory_path() / ("meshflow_folder_io_" + std::to_string(::getpid()));
  Dir() { fs::create_directories(path); }
  ~Dir() { fs::remove_all(path); }
};

TEST(ReadFolderBox, EqualsTheSliceOfTheWholeTensorOnEveryLayout) {
  const Dir dir;
  struct Case {
    const char* mesh;
    const char* placements;
    Shape shape;
  };
  for (const Case& c : std::vector<Case>{{"2x2", "S(1),R", {6, 10}},
                                         {"2x2", "R,S(0)", {7, 5}},
                                         {"2x2", "S(0),S(0)", {13}},
                                         {"4", "S(0)", {13, 3, 5}},
                                         {"2x2", "S(2),S(1)", {3, 9, 7}},
                                         {"4", "R", {}}}) {
    const Layout layout = make_layout(parse_mesh(c.mesh), parse_placements(c.placements), c.shape);
    const Tensor global = random_tensor(DType::kFloat32, c.shape, 7);
    const fs::path folder = dir.path / fmt::format("t{}", std::string(c.placements));
    write_sharded(folder, layout, shard_tensor(global, layout));
    for (bool one_copy : {false, true}) {
      if (one_copy) {  // as a checkpoint writes: one file per replica group
        for (int i = 0; i < size(layout.mesh); ++i)
          if (!is_representative(layout, layout.mesh.devices[i]))
            fs::remove(folder / shard_file_name(i));
      }
      // Every device's box of a few other layouts, and the whole tensor.
      std::vector<Box> boxes = {full_box(c.shape)};
      for (const char* other : {"S(0)", "R"}) {
        if (c.shape.empty() && std::string(other) != "R") continue;
        const Layout l = make_layout(parse_mesh("3"), parse_placements(other), c.shape);
        for (DeviceId d : l.mesh.devices) boxes.push_back(shard_box(l, d));
      }
      for (const Box& b : boxes) {
        const Tensor got = read_folder_box(folder, layout, b);
        EXPECT_EQ(max_abs_difference(got, slice(global, b)), 0.0)
            << c.placements << " " << to_string(b) << (one_copy ? " one copy" : "");
      }
      const fs::path npy = dir.path / "g.npy";
      gather_file(folder, npy);
      EXPECT_EQ(max_abs_difference(read_npy(npy), global), 0.0) << c.placements;
    }
  }
}

TEST(ReadFolderBox, NamesAMissingRepresentativeFile) {
  const Dir dir;
  const Layout layout = make_layout(parse_mesh("4"), parse_placements("S(0)"), {8, 2});
  write_sharded(dir.path / "t", layout,
                shard_tensor(random_tensor(DType::kFloat32, {8, 2}, 3), layout));
  fs::remove(dir.path / "t" / shard_file_name(2));
  try {
    read_folder_box(dir.path / "t", layout, full_box({8, 2}));
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("rank2.npy"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace meshflow
