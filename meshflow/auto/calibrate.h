// `meshflow calibrate`: this machine's description for the cost model (plan/cost_model.h),
// measured with the devices running at once, so that what they share (cores, memory, the
// links between them) is in every rate:
//   - memcpy_gbps: one device's memcpy while every device copies;
//   - gemm_gflops and elementwise_gbps: the operators' own kernels at model sizes (products,
//     attention, GELU, layer norm, the loss, adds, transposes) on each device's threads, fitted
//     to the cost model's kernel_seconds (2 points / gemm rate + bytes / (2 elementwise rate)),
//     each time first divided by the model's core_sharing for this many devices on these cores;
//   - the devices' link: collectives of a few bytes and of megabytes (all-gather, all-reduce,
//     reduce-scatter, all-to-all, permute), fitted to step_seconds' overhead + rounds x latency
//     + received / bandwidth (+ local_copy_bytes at the measured memcpy rate);
//   - device_handoff_us (threads): handing an empty job to the device threads and waiting;
//   - collective_sync_us: rounds of a product then a collective of a few bytes, less the
//     products alone and the collectives alone, a round (the devices' arrivals apart).
// Every fit weighs each measurement by its own time (relative error), and keeps rates positive.
// The threads backend's link is "shared_memory" (copies by the computing cores), mpi's "mpi"; the
// built-in "network" class stays for meshes that name it.
#pragma once

#include <array>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "meshflow/comm/backend.h"
#include "meshflow/plan/cost_model.h"

namespace meshflow {

struct CalibrateOptions {
  Backend backend = Backend::kThreads;
  int devices = 4;  // threads: device threads; mpi: 0 = the world
  // Threads each device computes with (0: the cores this process may run on divided by the
  // devices, at least 1, as train's default).
  int threads_per_device = 0;
  int reps = 5;  // timed repetitions per measurement; the median counts
  // Called on device 0 with one line per finished measurement (may be empty: quiet).
  std::function<void(const std::string& line)> progress;
};

// A kernel's measurement: t seconds on one core of its own (the measured time over the model's
// core sharing), x = 2 points (flops at the GEMM rate), y = bytes / 2 (at the elementwise rate).
struct KernelTime {
  double t = 0, x = 0, y = 0;
  bool product = false;  // a product or attention: fits the GEMM rate
};

// Returns (flop/s, byte/s): the GEMM and elementwise rates fitted to t = x / flops + y / bytes,
// the elementwise rate from the other kernels and the GEMM rate from the products with their
// bytes' share taken out, in turns; every sum weighted by time, as a step's kernels are. Both
// rates positive. Needs at least one product and one other kernel.
std::pair<double, double> fit_kernel_rates(const std::vector<KernelTime>& kernels);

// A collective's measurement against step_seconds' terms: t = overhead + rounds x latency +
// received / bandwidth + memory (local_copy_bytes at the measured memcpy rate, known).
struct CollectiveTime {
  double t = 0, rounds = 0, received = 0, memory = 0;
};

// Returns (overhead s, latency s per round, s per received byte), each >= 0, minimising every
// measurement's relative error: least squares, an unknown that comes out negative fixed at 0
// and the rest solved again.
std::array<double, 3> fit_link(const std::vector<CollectiveTime>& collectives);

// Returns `machines[0]` with every measured rate (memcpy, GEMM, elementwise, each link's
// bandwidth and latency, the collective overhead, the hand-off) the median of `machines`' (the
// upper one of an even count): several calibrations taken in turns, so that a slow spell of the
// machine during one of them moves no rate. Every description must name the same links.
MachineModel median_machine(const std::vector<MachineModel>& machines);

// Measures and returns the description. Under mpi every rank takes part and every rank returns
// the same description (device 0's times, shared).
MachineModel calibrate(const CalibrateOptions& options);

}  // namespace meshflow
