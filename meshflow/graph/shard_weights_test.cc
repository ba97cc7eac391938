// ZeRO's passes: DESIGN's ZeRO layouts, add_update's sharded update at ZeRO-1 and
// shard_weights' gathers at ZeRO-3 (one per use, issued one use ahead, dropped after it).
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <set>

#include "meshflow/graph/passes.h"
#include "meshflow/graph/task_graph.h"
#include "meshflow/graph/testing.h"

namespace meshflow {
namespace {

Layout layout_of(const char* mesh, const char* placements, Shape shape) {
  return make_layout(parse_mesh(mesh), parse_placements(placements), std::move(shape));
}

TEST(ZeroLayout, ShardsTheOutermostFreeDimTheMeshDimDivides) {
  // The dp_tp examples of docs/training.md: a row-parallel weight, a replicated one and a
  // replicated bias.
  EXPECT_EQ(to_string(zero_layout(layout_of("2x2", "R,S(0)", {1024, 4096})).placements),
            "S(1),S(0)");
  EXPECT_EQ(to_string(zero_layout(layout_of("2x2", "R,R", {1024, 4096})).placements), "S(0),S(1)");
  EXPECT_EQ(to_string(zero_layout(layout_of("2x2", "R,R", {10})).placements), "S(0),S(0)");
  // Dim 0 when it divides, whatever its size (the GPT's LM head); a column-parallel weight;
  // nothing to shard.
  EXPECT_EQ(to_string(zero_layout(layout_of("4", "R", {64, 64})).placements), "S(0)");
  EXPECT_EQ(to_string(zero_layout(layout_of("4", "R", {512, 8192})).placements), "S(0)");
  EXPECT_EQ(to_string(zero_layout(layout_of("4", "R", {32, 64, 16})).placements), "S(0)");
  EXPECT_EQ(to_string(zero_layout(layout_of("2x2", "R,S(1)", {64, 128})).placements), "S(0),S(1)");
  EXPECT_EQ(to_string(zero_layout(layout_of("4", "S(0)", {64, 64})).placements), "S(0)");
  EXPECT_EQ(to_string(zero_layout(layout_of("4", "R", {})).placements), "R");
  // The first divisible dim, not the largest; when none divides, the largest (lower on a tie).
  EXPECT_EQ(to_string(zero_layout(layout_of("4", "R", {6, 8, 64})).placements), "S(1)");
  EXPECT_EQ(to_string(zero_layout(layout_of("4", "R", {6, 10, 10})).placements), "S(1)");
  EXPECT_EQ(to_string(zero_layout(layout_of("4", "R", {6, 10, 3})).placements), "S(1)");
}

// The model of these tests laid out for training with the update at `zero`.
Pcg with_update(const Pcg& built, int zero) {
  const Pcg g = infer_layouts(expand_backward(infer_layouts(built)));
  return add_update(g, {.kind = OptimizerKind::kAdamW}, zero);
}

// Returns the node named `name` (updates and moves have no user name).
const Node& named(const Pcg& g, const std::string& name) {
  for (const Node& n : g.nodes)
    if (n.name == name) return n;
  ADD_FAILURE() << "no node " << name;
  return g.nodes.front();
}

// The layout the model gives weight `w`.
Layout pinned(const Pcg& built, const std::string& w) {
  const Node& n = named(built, w);
  return make_layout(*n.mesh, *n.placements, n.spec.shape, n.spec.dtype);
}

TEST(ZeroOne, UpdatesEachChunkAndGathersItBackIntoTheWeight) {
  const Pcg built = testing::sp_mlp(2, 2, 8);
  const Pcg g = with_update(built, 1);
  for (const std::string w : {"w0", "w1", "b1", "w2"}) {
    const Layout& model = *named(g, w).layout;
    EXPECT_EQ(model, pinned(built, w)) << w << " keeps its layout";
    const Layout zero = zero_layout(model);
    EXPECT_EQ(*named(g, w + ".exp_avg").layout, zero) << w;
    EXPECT_EQ(*named(g, w + ".exp_avg_sq").layout, zero) << w;
    const Node& update = named(g, "adamw:" + w);
    EXPECT_EQ(*update.layout, zero) << w;
    EXPECT_EQ(g.nodes[static_cast<std::size_t>(update.inputs[0])].name, "zero:" + w);
    EXPECT_EQ(*g.nodes[static_cast<std::size_t>(update.inputs[1])].layout, zero)
        << w << ": the gradient reduce-scattered into the chunk";
    const Node& back = named(g, "zero:" + w + ":gather");
    EXPECT_EQ(back.replaces, find_value(g, w));
    EXPECT_EQ(*back.layout, model);
  }
  // In the task graph each device's gather replaces its shard of the weight, once per step.
  const TaskGraph tasks = expand_shards(insert_copies(g), {});
  for (const DeviceTasks& dt : tasks.devices) {
    int replacing = 0;
    for (const Task& t : dt.tasks) {
      const auto* m = std::get_if<MoveTask>(&t.work);
      if (!m || !m->replaces) continue;
      ++replacing;
      EXPECT_TRUE(t.once_per_step);
      EXPECT_FALSE(makes_value(t));
      EXPECT_EQ(writes_in_place(t), std::vector<ValueId>{*m->replaces});
    }
    EXPECT_EQ(replacing, 4) << "device " << dt.device;
  }
}

TEST(ZeroThree, EachUseReadsItsOwnGatherIssuedOneUseAhead) {
  const Pcg built = testing::sp_mlp(2, 2, 8);
  const Pcg g = shard_weights(with_update(built, 3));
  std::set<ValueId> weights;
  for (const std::string w : {"w0", "w1", "b1", "w2"}) {
    EXPECT_EQ(*named(g, w).layout, zero_layout(pinned(built, w))) << w;
    weights.insert(find_value(g, w));
  }
  std::map<ValueId, std::vector<ValueId>> readers;  // value -> the nodes that read it
  for (ValueId id = 0; id < static_cast<ValueId>(g.nodes.size()); ++id)
    for (ValueId v : g.nodes[static_cast<std::size_t>(id)].inputs) readers[v].push_back(id);
  // Only the updates and the gathers read the sharded weights; every other reader reads a
  // gather of its own.
  for (ValueId w : weights) {
    for (ValueId r : readers[w]) {
      const Node& n = g.nodes[static_cast<std::size_t>(r)];
      EXPECT_TRUE(n.kind == NodeKind::kUpdate || n.zero_gather) << n.name;
    }
  }
  std::vector<ValueId> users;               // nodes reading gathers, in order
  std::map<ValueId, ValueId> first_gather;  // user -> its first gather's position
  int gathers = 0;
  for (ValueId id = 0; id < static_cast<ValueId>(g.nodes.size()); ++id) {
    const Node& n = g.nodes[static_cast<std::size_t>(id)];
    if (!n.zero_gather) continue;
    ++gathers;
    EXPECT_TRUE(weights.count(n.inputs[0])) << n.name;
    ASSERT_EQ(readers[id].size(), 1u) << n.name << " is read once";
    const ValueId user = readers[id][0];
    EXPECT_EQ(n.consumer, g.nodes[static_cast<std::size_t>(user)].name);
    EXPECT_EQ(n.phase, g.nodes[static_cast<std::size_t>(user)].phase);
    if (!first_gather.count(user)) first_gather[user] = id;
  }
  for (const auto& [user, at] : first_gather) users.push_back(user);
  // e, h, o forward; o's and h's input gradients backward.
  EXPECT_EQ(gathers, 4 + 2);
  ASSERT_EQ(users.size(), 5u);
  for (std::size_t k = 1; k < users.size(); ++k)
    EXPECT_LT(first_gather[users[k]], users[k - 1])
        << g.nodes[static_cast<std::size_t>(users[k])].name << "'s gathers precede "
        << g.nodes[static_cast<std::size_t>(users[k - 1])].name;
  // After expansion each gathered copy is dropped by the task that uses it.
  const Pcg copied = insert_copies(g);
  const TaskGraph tasks = expand_shards(copied, {});
  for (const DeviceTasks& dt : tasks.devices) {
    for (const Task& t : dt.tasks) {
      for (ValueId v : task_reads(t)) {
        if (!copied.nodes[static_cast<std::size_t>(v)].zero_gather) continue;
        EXPECT_NE(std::find(t.release.begin(), t.release.end(), v), t.release.end())
            << tasks.names[static_cast<std::size_t>(v)] << " on device " << dt.device;
      }
    }
  }
}

}  // namespace
}  // namespace meshflow
