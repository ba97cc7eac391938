// The cost model's overlap timelines (decomposed collectives) against hand-computed times, and
// gemm_gflops in machine files.
#include "meshflow/plan/cost_model.h"

#include <gtest/gtest.h>

#include "meshflow/core/error.h"
#include "meshflow/plan/plan.h"

namespace meshflow {
namespace {

// One link of 1 GB/s with no latency or overhead, and 1 GFLOP/s products: 1 byte = 1 ns,
// 1 flop = 1 ns.
MachineModel unit_machine() {
  return MachineModel{.links = {{"l", LinkClass{.bandwidth_gbps = 1, .latency_us = 0}}},
                      .default_link = "l",
                      .memcpy_gbps = 1e6,  // adds cost nothing to speak of
                      .collective_overhead_us = 0,
                      .local_step_us = 0,
                      .gemm_gflops = 1,
                      .elementwise_gbps = 1e6};
}

TEST(OverlapTimeline, PermuteHidesEveryTransferButTheLastProductsOwn) {
  const MachineModel m = unit_machine();
  // Three equal blocks: transfers of 100 ns, products of 300 ns.
  const OverlapCostInput in{.block_bytes = {100, 100, 100}, .block_flops = {300, 300, 300}};
  const OverlapEstimate e = gather_overlap(m, in, GatherForm::kPermute);
  EXPECT_NEAR(e.product_s, 900e-9, 1e-15);
  EXPECT_NEAR(e.comm_s, 200e-9, 1e-15);  // all-gather: the two blocks this device lacks
  EXPECT_NEAR(e.sequential_s, 1100e-9, 1e-15);
  EXPECT_NEAR(e.overlapped_s, 900e-9, 1e-15);  // max(100, 300) twice, then 300
  // The broadcast form waits for block 0 before its first product.
  EXPECT_NEAR(gather_overlap(m, in, GatherForm::kBroadcast).overlapped_s, 1000e-9, 1e-15);
}

TEST(OverlapTimeline, InPlaceIsEveryProductAndTwoRoundsOfLatency) {
  MachineModel m = unit_machine();
  m.links["l"].latency_us = 0.05;  // 50 ns a round
  m.collective_overhead_us = 0.01;
  const OverlapCostInput in{.block_bytes = {100, 100, 100, 100},
                            .block_flops = {300, 300, 300, 200}};
  // Nothing travels: the addresses' round and the closing barrier, each an overhead and
  // log2(4) = 2 latencies, then all four products.
  EXPECT_NEAR(gather_overlap(m, in, GatherForm::kInPlace).overlapped_s,
              2 * (10e-9 + 2 * 50e-9) + 1100e-9, 1e-15);
}

TEST(OverlapTimeline, TransferBoundLoopsAreAsLongAsTheirTransfers) {
  const MachineModel m = unit_machine();
  const OverlapCostInput in{.block_bytes = {500, 400}, .block_flops = {10, 10}};
  // Device 0 receives block 1 (400) while multiplying block 0, device 1 block 0 (500).
  EXPECT_NEAR(gather_overlap(m, in, GatherForm::kPermute).overlapped_s, 510e-9, 1e-15);
  // The ring: device 1 computes block 0 (10), sends it (500) while computing block 1 (10).
  EXPECT_NEAR(reduce_scatter_overlap(m, in, GatherForm::kPermute).overlapped_s, 510e-9, 1e-12);
}

TEST(OverlapTimeline, EveryProductCallPacksItsOtherOperandAgain) {
  MachineModel m = unit_machine();
  m.memcpy_gbps = 1;  // a packed byte costs 1 ns
  const OverlapCostInput in{
      .block_bytes = {100, 100, 100}, .block_flops = {300, 300, 300}, .call_bytes = 50};
  const OverlapEstimate e = gather_overlap(m, in, GatherForm::kPermute);
  EXPECT_NEAR(e.sequential_s, (200 + 900 + 50) * 1e-9, 1e-15);  // one call
  EXPECT_NEAR(e.overlapped_s, 3 * 350e-9, 1e-15);               // three calls of 350
  // Each of the two later steps also adds two terms of 100 bytes.
  EXPECT_NEAR(reduce_scatter_overlap(m, in, GatherForm::kPermute).overlapped_s,
              (350 + 2 * (350 + 200)) * 1e-9, 1e-15);
}

TEST(OverlapTimeline, CopiesOnTheComputingCoresAddToTheProductsInsteadOfHiding) {
  MachineModel m = unit_machine();
  m.links["l"].copies_on_cores = true;
  const OverlapCostInput in{.block_bytes = {100, 100, 100}, .block_flops = {300, 300, 300}};
  // Each of the two steps is its transfer and its product, then the last product.
  EXPECT_NEAR(gather_overlap(m, in, GatherForm::kPermute).overlapped_s, 1100e-9, 1e-15);
  EXPECT_NEAR(gather_overlap(m, in, GatherForm::kBroadcast).overlapped_s, 1200e-9, 1e-15);
  EXPECT_NEAR(reduce_scatter_overlap(m, in, GatherForm::kPermute).overlapped_s, 1100e-9, 1e-12);
  // In place nothing travels, so nothing changes.
  EXPECT_NEAR(gather_overlap(m, in, GatherForm::kInPlace).overlapped_s, 900e-9, 1e-15);
}

TEST(OverlapTimeline, AnInPlaceReduceScatterAddsEveryTermWhereItsSumLies) {
  MachineModel m = unit_machine();
  m.memcpy_gbps = 1;  // a byte read costs 1 ns
  m.links["l"].latency_us = 0.05;
  m.collective_overhead_us = 0.01;
  const OverlapCostInput in{.block_bytes = {100, 100, 100}, .block_flops = {300, 300, 300}};
  // Three rendezvous of an overhead and ceil(log2 3) = 2 latencies, three products, and the
  // two later ones reading the sum they add to.
  EXPECT_NEAR(reduce_scatter_overlap(m, in, GatherForm::kInPlace).overlapped_s,
              3 * (10e-9 + 2 * 50e-9) + 900e-9 + 200e-9, 1e-15);
}

TEST(OverlapTimeline, TheChosenLoopIsTheShortestFormAndPaysOnlyWhenShorter) {
  MachineModel m = unit_machine();
  m.memcpy_gbps = 1;
  m.links["l"].copies_on_cores = true;
  const OverlapCostInput in{
      .block_bytes = {100, 100, 100}, .block_flops = {300, 300, 300}, .call_bytes = 10};
  // Copies on the cores: the ring only adds calls to the same copies; in place copies nothing.
  EXPECT_FALSE(choose_loop(m, in, /*gather=*/false, /*shared_memory=*/false).pays);
  const LoopChoice scatter = choose_loop(m, in, false, true);
  EXPECT_EQ(scatter.form, GatherForm::kInPlace);
  EXPECT_TRUE(scatter.pays);
  // Links beside compute: the permute gather hides its transfers; a named form is taken as is.
  m.links["l"].copies_on_cores = false;
  EXPECT_EQ(choose_loop(m, in, true, false).form, GatherForm::kPermute);
  EXPECT_EQ(choose_loop(m, in, true, false, GatherForm::kBroadcast).form, GatherForm::kBroadcast);
}

// A machine file with only its required fields.
nlohmann::json required_fields_json() {
  return {{"links", {{"l", {{"bandwidth_gbps", 1}, {"latency_us", 0}}}}},
          {"default_link", "l"},
          {"memcpy_gbps", 1},
          {"collective_overhead_us", 0}};
}

TEST(OverlapTimeline, MachineFilesMayStateTheGemmRateAndCoreCopies) {
  nlohmann::json j = required_fields_json();
  EXPECT_FALSE(machine_from_json(j, "m.json").links.at("l").copies_on_cores);
  j["links"]["l"]["copies_on_cores"] = true;
  EXPECT_TRUE(machine_from_json(j, "m.json").links.at("l").copies_on_cores);
  j["links"]["l"]["copies_on_cores"] = 1;
  try {
    machine_from_json(j, "m.json");
    ADD_FAILURE() << "a number was accepted as copies_on_cores";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("links.l.copies_on_cores"), std::string::npos) << e.what();
  }
  j["links"]["l"].erase("copies_on_cores");
  EXPECT_EQ(machine_from_json(j, "m.json").gemm_gflops, default_machine().gemm_gflops);
  j["gemm_gflops"] = 250;
  EXPECT_EQ(machine_from_json(j, "m.json").gemm_gflops, 250);
  j["gemm_gflops"] = 0;
  try {
    machine_from_json(j, "m.json");
    ADD_FAILURE() << "a zero GEMM rate was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("gemm_gflops"), std::string::npos) << e.what();
  }
}

// A kernel costs its multiply-adds at the GEMM rate plus its memory traffic at the elementwise
// rate (not memcpy's): a product packs its operands before it computes; the elementwise rate,
// the cores and the device handoff are optional in machine files and named when malformed.
TEST(KernelCost, TheSlowerOfComputeAndMemoryAndTheHandoffIsReadFromFiles) {
  MachineModel m = unit_machine();  // 1 GFLOP/s
  m.memcpy_gbps = 100;
  m.elementwise_gbps = 1;
  EXPECT_NEAR(kernel_seconds(m, 1000, 10), 2000e-9 + 5e-9, 1e-15);
  EXPECT_NEAR(kernel_seconds(m, 10, 2000), 20e-9 + 1000e-9, 1e-15);  // a pass over 1000 bytes
  nlohmann::json j = required_fields_json();
  EXPECT_EQ(machine_from_json(j, "m.json").elementwise_gbps, default_machine().elementwise_gbps);
  j["elementwise_gbps"] = 3.5;
  EXPECT_EQ(machine_from_json(j, "m.json").elementwise_gbps, 3.5);
  j["elementwise_gbps"] = -1;
  try {
    machine_from_json(j, "m.json");
    ADD_FAILURE() << "a negative elementwise rate was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("elementwise_gbps"), std::string::npos) << e.what();
  }
  j.erase("elementwise_gbps");
  EXPECT_EQ(machine_from_json(j, "m.json").cores, default_machine().cores);
  j["cores"] = 2;
  m = machine_from_json(j, "m.json");
  EXPECT_EQ(core_sharing(m, 1), 0.5);  // one device computes with both cores
  EXPECT_EQ(core_sharing(m, 2), 1);
  EXPECT_EQ(core_sharing(m, 8), 4);       // 8 devices take turns on 2 cores
  EXPECT_EQ(core_sharing(m, 1, 1), 1);    // one device told to use one thread
  EXPECT_EQ(core_sharing(m, 2, 2), 1);    // 4 threads on 2 cores gain nothing
  EXPECT_EQ(core_sharing(m, 1, 4), 0.5);  // nor do 4 threads on 2 cores
  m.cores = 0;
  EXPECT_EQ(core_sharing(m, 8), 1);  // every device has its own
  j.erase("cores");
  EXPECT_EQ(machine_from_json(j, "m.json").device_handoff_us, default_machine().device_handoff_us);
  j["device_handoff_us"] = 7.5;
  EXPECT_EQ(machine_from_json(j, "m.json").device_handoff_us, 7.5);
  j["device_handoff_us"] = "slow";
  try {
    machine_from_json(j, "m.json");
    ADD_FAILURE() << "a text handoff cost was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("device_handoff_us"), std::string::npos) << e.what();
  }
  j["device_handoff_us"] = 7.5;
  // A file written before calibrate measured it has none: 0, the built-in description's.
  EXPECT_EQ(machine_from_json(j, "m.json").collective_sync_us, 0);
  j["collective_sync_us"] = 1250;
  EXPECT_EQ(machine_from_json(j, "m.json").collective_sync_us, 1250);
  j["collective_sync_us"] = -1;
  try {
    machine_from_json(j, "m.json");
    ADD_FAILURE() << "a negative collective_sync_us was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("collective_sync_us"), std::string::npos) << e.what();
  }
}

// Each collective's terms: the bytes it receives over the link, and beside them the bytes it
// copies on the device at memcpy speed (local_copy_bytes): its own block into an all-gather's
// result, its own term read and its block written in a reduce-scatter. An all-reduce is a
// reduce-scatter and then an all-gather that finds its own block in place, so it costs the two
// less one collective's overhead and that block's copy.
TEST(StepCost, CollectivesPayForTheirOwnBlockBesideWhatTheyReceive) {
  MachineModel m = unit_machine();  // 1 byte over the link = 1 ns
  m.memcpy_gbps = 2;                // 1 byte copied = 0.5 ns
  m.collective_overhead_us = 1;
  m.links.at("l").latency_us = 0.25;
  const std::int64_t n = 4, b = 1000;  // a device's block
  auto cost = [&](StepKind kind, std::int64_t received, std::int64_t in, std::int64_t out) {
    const StepCostInput step{.kind = kind,
                             .mesh_dims = {0},
                             .group_size = n,
                             .bytes_received = received,
                             .in_bytes = in,
                             .out_bytes = out};
    return step_seconds(m, step);
  };
  const double gather = cost(StepKind::kAllGather, (n - 1) * b, b, n * b);
  const double scatter = cost(StepKind::kReduceScatter, (n - 1) * b, n * b, b);
  const double reduce = cost(StepKind::kAllReduce, 2 * (n - 1) * b, n * b, n * b);
  const double permute = cost(StepKind::kPermute, b, b, b);
  const double ns = 1e-9;
  EXPECT_NEAR(gather, 1000 * ns + 2 * 250 * ns + 3000 * ns + 500 * ns, 1e-15);
  EXPECT_NEAR(scatter, 1000 * ns + 2 * 250 * ns + 3000 * ns + 500 * ns, 1e-15);
  EXPECT_NEAR(reduce, 1000 * ns + 4 * 250 * ns + 6000 * ns + 500 * ns, 1e-15);
  EXPECT_NEAR(permute, 1000 * ns + 250 * ns + 1000 * ns, 1e-15);
  EXPECT_NEAR(scatter + gather, reduce + 1000 * ns + 500 * ns, 1e-15);
  EXPECT_NEAR(cost(StepKind::kAllToAll, (n - 1) * b, n * b, n * b),
              1000 * ns + 3 * 250 * ns + 3000 * ns + 500 * ns, 1e-15);
  // A local slice copies its piece; a local step that keeps its bytes copies nothing.
  EXPECT_NEAR(cost(StepKind::kLocal, 0, n * b, b), 500 * ns, 1e-15);
  EXPECT_EQ(cost(StepKind::kLocal, 0, b, b), 0);
  // An optimizer's update streams at the memcpy rate, not the elementwise one.
  EXPECT_NEAR(streaming_seconds(m, 3000), 750 * ns, 1e-15);
}

// What calibrate writes: every field, read back equal; the built-in description too.
TEST(MachineJson, WrittenDescriptionsReadBackEqual) {
  MachineModel m = unit_machine();
  m.links["net"] = LinkClass{.bandwidth_gbps = 12.5, .latency_us = 3.25, .copies_on_cores = true};
  m.dim_links = {"net", "l"};
  m.cores = 3;
  m.device_handoff_us = 17;
  m.collective_sync_us = 1250;
  EXPECT_EQ(machine_from_json(machine_to_json(m), "m.json"), m);
  EXPECT_EQ(machine_from_json(machine_to_json(default_machine()), "m.json"), default_machine());
}

}  // namespace
}  // namespace meshflow
