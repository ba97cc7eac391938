// The cost model: the one description of the machine (bandwidth and latency per link class,
// local memory bandwidth, the fixed cost of a collective) and the estimated time of every step
// kind. Every cost number of meshflow lives here; planners (and later operators pricing their
// strategies) ask step_seconds. Defaults were measured on this project's reference machine
// (2 cores, shared memory); override them from a JSON file (`--machine FILE.json`).
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

namespace meshflow {

// One class of link between devices (threads in one process, processes on one node, nodes).
struct LinkClass {
  double bandwidth_gbps = 0;  // per device, each direction
  double latency_us = 0;      // per round of a collective (one message hop)
  // Transfers are copies made by the cores that also compute (shared memory, one socket): a
  // decomposed loop cannot hide them behind a product, only add its steps to them.
  bool copies_on_cores = false;
  bool operator==(const LinkClass&) const = default;
};

struct MachineModel {
  std::map<std::string, LinkClass> links;
  std::string default_link;            // the class of every mesh dim not in dim_links
  std::vector<std::string> dim_links;  // optional: the link class of mesh dim i
  double memcpy_gbps = 0;              // local copies, chunking and reductions
  double collective_overhead_us = 0;   // fixed cost of starting and finishing one collective
  // What a collective costs on top where its devices come to it from computing: they arrive
  // apart (each kernel at its own pace, devices taking turns on fewer cores), and the cores of
  // those that arrived idle until the last one does. At most the work since their last
  // collective (they cannot drift further apart). Measured by calibrate; 0 where not measured.
  double collective_sync_us = 0;
  double local_step_us = 0;  // fixed cost of a step done on each device alone (a tie-breaker)
  double gemm_gflops = 0;    // one device's matrix-product rate (kernels, decomposed collectives)
  // One device's rate through a kernel that is no matrix product (elementwise, normalisation,
  // loss, a view that copies), in memcpy's terms: n bytes read and n written in n / rate.
  double elementwise_gbps = 0;
  // The cores the devices compute on: a step with more devices than cores runs each device's
  // kernels devices / cores times slower (threads or processes taking turns), one with fewer
  // splits each kernel over cores / devices threads. 0: every device has one core of its own.
  int cores = 0;
  // threads: the cost of handing one job to the device threads and waiting for them all (a
  // global-view call, comm/session.h); work cheaper than this runs on the calling thread.
  double device_handoff_us = 0;
  bool operator==(const MachineModel&) const = default;
};

// Returns the built-in description (measured with `meshflow bench collectives` and
// `meshflow bench copy` on the reference machine; its cores are this machine's).
const MachineModel& default_machine();

// Returns the link class of `mesh_dim` (the default class when the model names none).
const LinkClass& link_of(const MachineModel& model, int mesh_dim);

// Returns the model described by `json`: {"links": {"name": {"bandwidth_gbps", "latency_us",
// "copies_on_cores" (optional)}},
// "default_link", "dim_links" (optional), "memcpy_gbps", "collective_overhead_us",
// "collective_sync_us", "local_step_us", "gemm_gflops", "elementwise_gbps", "cores" and
// "device_handoff_us" (optional)}; throws Error naming the file and the bad field.
MachineModel machine_from_json(const nlohmann::json& json, std::string_view source);
MachineModel load_machine(const std::filesystem::path& path);
// Returns the JSON machine_from_json reads back as `machine` (every field written).
nlohmann::json machine_to_json(const MachineModel& machine);

enum class StepKind;

// What the estimated time of one step depends on (bytes are per device: the device with the
// largest shard, which every step waits for).
struct StepCostInput {
  StepKind kind;
  std::vector<int> mesh_dims;   // the link classes the step crosses (collectives)
  std::int64_t group_size = 1;  // devices per group (collectives)
  std::int64_t bytes_received = 0;
  std::int64_t in_bytes = 0;   // the device's tensor before the step
  std::int64_t out_bytes = 0;  // and after it
  bool scales = false;         // local: values are divided
  std::int64_t peers = 0;      // point_to_point: the most peers a device receives from
  std::int64_t terms = 1;      // point_to_point: Partial terms reduced at the destination
};

// Returns the estimated seconds of the step: a fixed overhead per collective plus latency per
// message round (latency_rounds), received bytes over the slowest link crossed, and the bytes
// it copies on the device beside them (local_copy_bytes) at memcpy speed.
double step_seconds(const MachineModel& machine, const StepCostInput& step);

// Returns the message rounds a step pays latency for: ceil(log2 n) for tree and
// recursive-doubling collectives (twice for an all-reduce), n - 1 for an all-to-all, one for a
// permute, one per peer for point-to-point; 0 for a local step.
double latency_rounds(const StepCostInput& step);

// Returns the bytes a step copies on the device besides the bytes it receives, in memcpy's terms
// (n bytes read and n written count n): the device's own block into the result (all-gather,
// all-to-all); its own term read and its reduced block written (reduce-scatter, the chunk an
// all-reduce reduces, each received term of a point-to-point reduction); a local step's slice
// and its division. What every backend's collectives do (comm/threads/communicator.cc copies
// even the own block): the all-gather of 4 MiB a device took as long as the all-to-all and
// twice the permute of the same bytes, which received bytes alone priced alike.
double local_copy_bytes(const StepCostInput& step);

// The decomposed forms of an all-gather around a row product (runtime/overlap.h): n - 1
// collective permutes, n broadcasts, or (devices sharing one address space) every block read
// where it lies.
enum class GatherForm { kPermute, kBroadcast, kInPlace };

// Returns "permute", "broadcast", "in_place".
std::string_view to_string(GatherForm form);

// A collective decomposed around the product it feeds (all-gather) or that feeds it
// (reduce-scatter), as a timeline: a step waits for the longer of its transfer and its product
// where the link runs beside compute, for both where the link's copies take the cores
// (LinkClass::copies_on_cores). Blocks are in rank order: block_bytes[b] is what travels for
// block b (operand 0's rows for a gather, the result's partial rows for a reduce-scatter),
// block_flops[b] the floating-point operations of block b's product on one device.
// call_bytes is what every product call packs besides its block (the other operand, read and
// written once at memcpy speed): the loop pays it once per block, the sequential product once.
struct OverlapCostInput {
  int mesh_dim = 0;
  std::vector<std::int64_t> block_bytes;
  std::vector<double> block_flops;
  std::int64_t call_bytes = 0;
};

// Seconds of the slowest device: sequential (the collective, then the whole product) and
// overlapped (each step waits for the longer of its transfer and the product it hides), with
// the collective's and the product's parts of the sequential time.
struct OverlapEstimate {
  double sequential_s = 0, overlapped_s = 0, comm_s = 0, product_s = 0;
};

OverlapEstimate gather_overlap(const MachineModel& machine, const OverlapCostInput& input,
                               GatherForm form);
// A reduce-scatter's loop: `form` permute is the ring, in_place adds into peers' results.
OverlapEstimate reduce_scatter_overlap(const MachineModel& machine, const OverlapCostInput& input,
                                       GatherForm form);

// The cost model's loop for a collective decomposed around its product: the form whose
// timeline is shortest among a gather's permute, broadcast and (devices sharing memory)
// in_place, or a reduce-scatter's ring (permute) and in_place (a gather's candidates narrowed
// to `gather_form` when set), its timeline, and whether it is shorter than the collective then
// the product.
struct LoopChoice {
  GatherForm form = GatherForm::kPermute;
  OverlapEstimate estimate;
  bool pays = false;
};
LoopChoice choose_loop(const MachineModel& machine, const OverlapCostInput& input, bool gather,
                       bool shared_memory, std::optional<GatherForm> gather_form = std::nullopt);

// Returns how many times longer each device computes than on one core of its own when `devices`
// devices share the machine's cores, each computing with `threads_per_device` threads (train
// --threads-per-device, kernels/parallel.h; 0: its default, cores / devices, at least 1), taken
// to split every kernel evenly: the larger of devices / cores (more threads than cores take
// turns) and 1 / threads. 1 where the machine gives no cores.
double core_sharing(const MachineModel& machine, std::int64_t devices, int threads_per_device = 0);

// Returns the seconds of `flops` of matrix product on one device.
double product_seconds(const MachineModel& machine, double flops);

// Returns the estimated seconds of one kernel on one device: `points` multiply-adds (or
// elementwise steps) at the matrix-product rate plus the `bytes` it reads and writes at the
// elementwise rate of traffic (elementwise_gbps, in memcpy's terms: a pass over n bytes reads n
// and writes n). A sum, not the longer of the two: a product packs its operands (a pass over
// memory) before it computes, which is what a micro-batch of few rows pays per weight.
double kernel_seconds(const MachineModel& machine, double points, double bytes);

// Returns the estimated seconds of a pass that streams `bytes` (read and written, in all) with a
// few arithmetic operations an element: an optimizer's update, the gradient norm's sum of
// squares. At the memcpy rate (memcpy_gbps, measured with every device copying at once, so with
// the cores and memory they share already in it), not the elementwise kernels' rate, which GELU
// and the loss's exponentials set: SGD's update of a 16 MiB weight took 2.8 ms on two devices,
// 2.2 ms at memcpy's rate, 5.2 ms at the elementwise rate.
double streaming_seconds(const MachineModel& machine, double bytes);

}  // namespace meshflow
