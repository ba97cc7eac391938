// The fits against data made from known rates, and one short calibration on device threads:
// a description every field of which is measured, that reads back from its JSON and prices
// kernels and collectives differently from the built-in one.
#include "meshflow/auto/calibrate.h"

#include <gtest/gtest.h>

#include <cmath>

#include "meshflow/plan/plan.h"

namespace meshflow {
namespace {

TEST(CalibrateFits, KernelRatesFromTimesMadeWithThem) {
  const double flops = 80e9, bytes = 6e9;  // per second
  std::vector<KernelTime> k;
  for (double x : {2e9, 5e8, 1e9}) {  // products: mostly flops, some bytes
    const double y = x / 200;
    k.push_back({.t = x / flops + y / bytes, .x = x, .y = y, .product = true});
  }
  for (double y : {4e6, 1.6e7, 3e5}) {  // elementwise: a flop per element
    const double x = y / 2;
    k.push_back({.t = x / flops + y / bytes, .x = x, .y = y, .product = false});
  }
  const auto [f, b] = fit_kernel_rates(k);
  EXPECT_NEAR(f, flops, 1e-6 * flops);
  EXPECT_NEAR(b, bytes, 1e-6 * bytes);
}

TEST(CalibrateFits, LinkFromCollectivesMadeWithIt) {
  const double overhead = 30e-6, latency = 4e-6, per_byte = 1 / 5e9;
  std::vector<CollectiveTime> c;
  for (double received : {192.0, 3e6}) {
    for (double rounds : {1.0, 2.0, 3.0, 4.0}) {
      const double memory = received / 2e10;
      c.push_back({.t = overhead + rounds * latency + received * per_byte + memory,
                   .rounds = rounds,
                   .received = received,
                   .memory = memory});
    }
  }
  const auto [o, l, b] = fit_link(c);
  EXPECT_NEAR(o, overhead, 1e-9);
  EXPECT_NEAR(l, latency, 1e-9);
  EXPECT_NEAR(b, per_byte, 1e-6 * per_byte);
  // Times that would need a negative latency: it is 0 and the rest still fits.
  for (CollectiveTime& t : c) t.t -= t.rounds * latency;
  const auto [o2, l2, b2] = fit_link(c);
  EXPECT_EQ(l2, 0);
  EXPECT_NEAR(o2, overhead, 1e-9);
  EXPECT_NEAR(b2, per_byte, 1e-6 * per_byte);
}

// Each rate the median of three descriptions, one of them far off (a slow spell): the off one
// moves nothing.
TEST(CalibrateFits, MedianMachineTakesEachRatesMedian) {
  std::vector<MachineModel> runs(3, default_machine());
  const double gemm[] = {120, 60, 130}, memcpy[] = {11, 12, 4}, bandwidth[] = {9, 3, 10};
  for (std::size_t i = 0; i < runs.size(); ++i) {
    runs[i].gemm_gflops = gemm[i];
    runs[i].memcpy_gbps = memcpy[i];
    runs[i].links.at("shared_memory").bandwidth_gbps = bandwidth[i];
    runs[i].collective_overhead_us = 10.0 * static_cast<double>(i + 1);
    runs[i].collective_sync_us = 900.0 - 400.0 * static_cast<double>(i);
  }
  const MachineModel m = median_machine(runs);
  EXPECT_EQ(m.gemm_gflops, 120);
  EXPECT_EQ(m.memcpy_gbps, 11);
  EXPECT_EQ(m.links.at("shared_memory").bandwidth_gbps, 9);
  EXPECT_EQ(m.collective_overhead_us, 20);
  EXPECT_EQ(m.collective_sync_us, 500);
  EXPECT_EQ(m.links.at("network"), default_machine().links.at("network"));
  EXPECT_EQ(m.cores, default_machine().cores);
}

TEST(Calibrate, TwoDeviceThreadsGiveADescriptionOfTheirOwn) {
  std::vector<std::string> lines;
  const MachineModel m = calibrate(
      {.devices = 2, .reps = 1, .progress = [&](const std::string& l) { lines.push_back(l); }});
  // A line per measurement: the hand-off, memcpy, 18 kernels and their fit, 5 collectives at 2
  // sizes and their fit, a collective after a product.
  EXPECT_EQ(lines.size(), 1u + 1u + 18u + 1u + 10u + 1u + 1u);
  EXPECT_TRUE(std::isfinite(m.collective_sync_us) && m.collective_sync_us >= 0)
      << m.collective_sync_us;
  EXPECT_EQ(m.default_link, "shared_memory");
  const LinkClass& link = m.links.at("shared_memory");
  EXPECT_TRUE(link.copies_on_cores);
  EXPECT_GT(link.bandwidth_gbps, 0);
  EXPECT_TRUE(m.links.contains("network"));  // the built-in class meshes may name
  for (double rate : {m.memcpy_gbps, m.gemm_gflops, m.elementwise_gbps, m.device_handoff_us})
    EXPECT_TRUE(std::isfinite(rate) && rate > 0) << rate;
  EXPECT_GE(m.cores, 1);
  EXPECT_EQ(machine_from_json(machine_to_json(m), "machine.json"), m);
  // Its own numbers, not the built-in ones (measured rates never land on them exactly).
  EXPECT_NE(kernel_seconds(m, 1e9, 1e7), kernel_seconds(default_machine(), 1e9, 1e7));
  const StepCostInput gather{
      .kind = StepKind::kAllGather, .group_size = 2, .bytes_received = 1 << 20};
  EXPECT_NE(step_seconds(m, gather), step_seconds(default_machine(), gather));
}

}  // namespace
}  // namespace meshflow
