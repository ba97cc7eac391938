// The default machine description, its JSON form, and the cost of each step kind.
#include "meshflow/plan/cost_model.h"

#include <algorithm>
#include <cmath>
#include <thread>

#include "meshflow/core/error.h"
#include "meshflow/core/json_field.h"
#include "meshflow/core/npy.h"
#include "meshflow/plan/plan.h"

namespace meshflow {

const MachineModel& default_machine() {
  // Measured on the reference machine (`meshflow bench copy`, `meshflow bench collectives`):
  // memcpy ~18 GB/s on one thread; a 4-device threads collective costs ~40 us to rendezvous
  // whatever its size and sustains ~4 GB/s of bus bandwidth per device. The network class is
  // a typical 100 Gb/s fabric, for meshes spanning nodes under mpi. One device's float32 GEMM
  // (OpenBLAS, one thread) computes at ~160 GFLOP/s beside packing its operands at the
  // elementwise rate (the products of `meshflow train --trace` on the bench GPT: [2048, 512] x
  // [512, 2048] in ~29 ms; on the bench MLP, [128, 1024] x [1024, 4096] in ~11 ms). Its other
  // kernels (elementwise, layer norm, losses, views that copy) stream ~4.5 GB/s in memcpy's terms:
  // the bench GPT's non-product tasks' bytes over their traced time. Waking 4 device threads for a
  // global-view call and waiting for them costs ~50 us (`meshflow bench python`'s dispatch
  // cases). Shared-memory transfers are copies by the same two cores that run the products.
  static const MachineModel model{
      .links = {{"shared_memory",
                 LinkClass{.bandwidth_gbps = 4.0, .latency_us = 2.0, .copies_on_cores = true}},
                {"network", LinkClass{.bandwidth_gbps = 10.0, .latency_us = 20.0}}},
      .default_link = "shared_memory",
      .dim_links = {},
      .memcpy_gbps = 18.0,
      .collective_overhead_us = 40.0,
      .local_step_us = 0.001,
      .gemm_gflops = 160.0,
      .elementwise_gbps = 4.5,
      .cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency())),
      .device_handoff_us = 50.0,
  };
  return model;
}

const LinkClass& link_of(const MachineModel& model, int mesh_dim) {
  const std::string& name = mesh_dim >= 0 && mesh_dim < static_cast<int>(model.dim_links.size())
                                ? model.dim_links[mesh_dim]
                                : model.default_link;
  return model.links.at(name);
}

MachineModel machine_from_json(const nlohmann::json& json, std::string_view source) {
  const JsonField root(json, std::string(source), ErrorKind::kInvalidArgument);
  constexpr double kMax = 1e12;  // any larger rate or latency is a typo, not a machine
  MachineModel m;
  const JsonField links = root.member("links");
  if (!links.value().is_object() || links.value().empty())
    links.reject("must be an object naming at least one link class");
  for (auto it = links.value().begin(); it != links.value().end(); ++it) {
    const JsonField link = links.member(it.key());
    LinkClass l{.bandwidth_gbps = link.member("bandwidth_gbps").as_number(0, kMax),
                .latency_us = link.member("latency_us").as_number(0, kMax)};
    if (auto cores = link.find("copies_on_cores")) l.copies_on_cores = cores->as_bool();
    if (!(l.bandwidth_gbps > 0)) link.member("bandwidth_gbps").reject("must be > 0");
    m.links[it.key()] = l;
  }
  const JsonField default_link = root.member("default_link");
  m.default_link = default_link.as_string();
  if (!m.links.contains(m.default_link))
    default_link.reject(fmt::format("names \"{}\", which is not among the links", m.default_link));
  if (auto dims = root.find("dim_links")) {
    for (std::size_t i = 0; i < dims->size(); ++i) {
      m.dim_links.push_back(dims->at(i).as_string());
      if (!m.links.contains(m.dim_links.back()))
        dims->at(i).reject(fmt::format("names unknown link \"{}\"", m.dim_links.back()));
    }
  }
  const JsonField memcpy_gbps = root.member("memcpy_gbps");
  m.memcpy_gbps = memcpy_gbps.as_number(0, kMax);
  if (!(m.memcpy_gbps > 0)) memcpy_gbps.reject("must be > 0");
  m.collective_overhead_us = root.member("collective_overhead_us").as_number(0, kMax);
  if (auto sync = root.find("collective_sync_us")) m.collective_sync_us = sync->as_number(0, kMax);
  m.local_step_us = default_machine().local_step_us;
  if (auto local = root.find("local_step_us")) m.local_step_us = local->as_number(0, kMax);
  m.gemm_gflops = default_machine().gemm_gflops;
  if (auto gemm = root.find("gemm_gflops")) {
    m.gemm_gflops = gemm->as_number(0, kMax);
    if (!(m.gemm_gflops > 0)) gemm->reject("must be > 0");
  }
  m.elementwise_gbps = default_machine().elementwise_gbps;
  if (auto rate = root.find("elementwise_gbps")) {
    m.elementwise_gbps = rate->as_number(0, kMax);
    if (!(m.elementwise_gbps > 0)) rate->reject("must be > 0");
  }
  m.cores = default_machine().cores;
  if (auto cores = root.find("cores")) m.cores = static_cast<int>(cores->as_int(0, 1 << 24));
  m.device_handoff_us = default_machine().device_handoff_us;
  if (auto handoff = root.find("device_handoff_us"))
    m.device_handoff_us = handoff->as_number(0, kMax);
  return m;
}

MachineModel load_machine(const std::filesystem::path& path) {
  return machine_from_json(parse_json(read_file(path), path.string()), path.string());
}

nlohmann::json machine_to_json(const MachineModel& machine) {
  nlohmann::json links = nlohmann::json::object();
  for (const auto& [name, l] : machine.links) {
    links[name] = {{"bandwidth_gbps", l.bandwidth_gbps},
                   {"latency_us", l.latency_us},
                   {"copies_on_cores", l.copies_on_cores}};
  }
  nlohmann::json out = {{"links", links},
                        {"default_link", machine.default_link},
                        {"memcpy_gbps", machine.memcpy_gbps},
                        {"collective_overhead_us", machine.collective_overhead_us},
                        {"collective_sync_us", machine.collective_sync_us},
                        {"local_step_us", machine.local_step_us},
                        {"gemm_gflops", machine.gemm_gflops},
                        {"elementwise_gbps", machine.elementwise_gbps},
                        {"cores", machine.cores},
                        {"device_handoff_us", machine.device_handoff_us}};
  if (!machine.dim_links.empty()) out["dim_links"] = machine.dim_links;
  return out;
}

namespace {

double seconds_from_us(double us) { return us * 1e-6; }
double bytes_per_second(double gbps) { return gbps * 1e9; }

LinkClass slowest_link(const MachineModel& machine, const std::vector<int>& dims) {
  LinkClass out = link_of(machine, dims.empty() ? 0 : dims[0]);
  for (int m : dims) {
    const LinkClass& l = link_of(machine, m);
    out.bandwidth_gbps = std::min(out.bandwidth_gbps, l.bandwidth_gbps);
    out.latency_us = std::max(out.latency_us, l.latency_us);
  }
  return out;
}

}  // namespace

double latency_rounds(const StepCostInput& step) {
  const double n = static_cast<double>(step.group_size);
  const double tree = std::ceil(std::log2(std::max(n, 1.0)));
  switch (step.kind) {
    case StepKind::kAllGather:
    case StepKind::kReduceScatter:
    case StepKind::kBroadcast:  // a tree from the root, pipelined
    case StepKind::kInPlace:    // the addresses' round (its closing barrier: step_seconds)
      return tree;
    case StepKind::kAllReduce:
      return 2 * tree;
    case StepKind::kAllToAll:
      return n - 1;
    case StepKind::kPermute:  // one message to one peer, every device at once
      return 1;
    case StepKind::kPointToPoint:
      return static_cast<double>(step.peers);
    case StepKind::kLocal:
      return 0;
  }
  return 0;
}

double local_copy_bytes(const StepCostInput& step) {
  const double n = std::max(static_cast<double>(step.group_size), 1.0);
  const auto in = static_cast<double>(step.in_bytes), out = static_cast<double>(step.out_bytes);
  switch (step.kind) {
    case StepKind::kAllGather:
      return out / n;
    case StepKind::kAllToAll:
    case StepKind::kAllReduce:
      return in / n;
    case StepKind::kReduceScatter:
      return out;
    case StepKind::kPointToPoint:
      return static_cast<double>(step.terms) * out;
    case StepKind::kLocal:
      return (out != in ? out : 0) + (step.scales ? out : 0);
    case StepKind::kPermute:
    case StepKind::kBroadcast:
    case StepKind::kInPlace:
      return 0;
  }
  return 0;
}

double step_seconds(const MachineModel& machine, const StepCostInput& step) {
  const LinkClass link = slowest_link(machine, step.mesh_dims);
  const double alpha = seconds_from_us(link.latency_us);
  const double beta = bytes_per_second(link.bandwidth_gbps);
  const double copies = local_copy_bytes(step) / bytes_per_second(machine.memcpy_gbps);
  if (step.kind == StepKind::kLocal) return copies + seconds_from_us(machine.local_step_us);
  const double overhead = seconds_from_us(machine.collective_overhead_us);
  const double rounds = latency_rounds(step);
  if (step.kind == StepKind::kInPlace)  // nothing travels: the addresses' round and the barrier
    return 2 * (overhead + rounds * alpha);
  return overhead + rounds * alpha + static_cast<double>(step.bytes_received) / beta + copies;
}

std::string_view to_string(GatherForm form) {
  switch (form) {
    case GatherForm::kPermute:
      return "permute";
    case GatherForm::kBroadcast:
      return "broadcast";
    case GatherForm::kInPlace:
      return "in_place";
  }
  return "?";
}

double core_sharing(const MachineModel& machine, std::int64_t devices, int threads_per_device) {
  if (machine.cores <= 0 || devices <= 0) return 1;
  const std::int64_t threads = threads_per_device > 0
                                   ? threads_per_device
                                   : std::max<std::int64_t>(1, machine.cores / devices);
  // Devices taking turns on the cores, or each splitting its kernels over its threads.
  return std::max(static_cast<double>(devices) / machine.cores, 1.0 / static_cast<double>(threads));
}

double product_seconds(const MachineModel& machine, double flops) {
  return flops / (machine.gemm_gflops * 1e9);
}

double kernel_seconds(const MachineModel& machine, double points, double bytes) {
  return product_seconds(machine, 2 * points) +
         bytes / (2 * bytes_per_second(machine.elementwise_gbps));
}

double streaming_seconds(const MachineModel& machine, double bytes) {
  return bytes / (2 * bytes_per_second(machine.memcpy_gbps));
}

namespace {

// The step of one block's transfer in a decomposed collective over `input`'s mesh dim.
double transfer_seconds(const MachineModel& machine, const OverlapCostInput& input, StepKind kind,
                        std::int64_t bytes) {
  return step_seconds(machine, {.kind = kind,
                                .mesh_dims = {input.mesh_dim},
                                .group_size = static_cast<std::int64_t>(input.block_bytes.size()),
                                .bytes_received = bytes});
}

std::int64_t total(const std::vector<std::int64_t>& v) {
  std::int64_t s = 0;
  for (std::int64_t x : v) s += x;
  return s;
}

// Seconds of one product call of block b: its multiply-adds and the packing of the other
// operand, which every call repeats.
double call_seconds(const MachineModel& machine, const OverlapCostInput& input, int b) {
  return product_seconds(machine, input.block_flops[static_cast<std::size_t>(b)]) +
         static_cast<double>(input.call_bytes) / bytes_per_second(machine.memcpy_gbps);
}

// Seconds of a loop step whose transfer runs beside its product: the longer of the two, or
// both where the link's copies take the cores that compute.
double step_of(const MachineModel& machine, const OverlapCostInput& input, double transfer,
               double product) {
  return link_of(machine, input.mesh_dim).copies_on_cores ? transfer + product
                                                          : std::max(transfer, product);
}

// Takes rank r's sequential time into `e`: `collective` (all-gather or reduce-scatter of the
// blocks, r's own staying put), then the whole product in one call.
void add_sequential(const MachineModel& machine, const OverlapCostInput& input, StepKind collective,
                    int r, OverlapEstimate& e) {
  double products = static_cast<double>(input.call_bytes) / bytes_per_second(machine.memcpy_gbps);
  for (double flops : input.block_flops) products += product_seconds(machine, flops);
  const std::int64_t own = input.block_bytes[static_cast<std::size_t>(r)];
  const double comm =
      step_seconds(machine, {.kind = collective,
                             .mesh_dims = {input.mesh_dim},
                             .group_size = static_cast<std::int64_t>(input.block_bytes.size()),
                             .bytes_received = total(input.block_bytes) - own,
                             .out_bytes = collective == StepKind::kReduceScatter ? own : 0});
  e.product_s = std::max(e.product_s, products);
  e.comm_s = std::max(e.comm_s, comm);
  e.sequential_s = std::max(e.sequential_s, comm + products);
}

}  // namespace

OverlapEstimate gather_overlap(const MachineModel& machine, const OverlapCostInput& input,
                               GatherForm form) {
  const int n = static_cast<int>(input.block_bytes.size());
  MESHFLOW_CHECK(n > 0 && input.block_flops.size() == input.block_bytes.size());
  auto product = [&](int b) { return call_seconds(machine, input, b); };
  auto send = [&](StepKind kind, int b) {
    return transfer_seconds(machine, input, kind, input.block_bytes[b]);
  };
  auto step = [&](double transfer, double p) { return step_of(machine, input, transfer, p); };
  OverlapEstimate e;
  for (int r = 0; r < n; ++r) {
    add_sequential(machine, input, StepKind::kAllGather, r, e);
    double t = 0;
    if (form == GatherForm::kInPlace) {  // every block read where it lies
      t = transfer_seconds(machine, input, StepKind::kInPlace, 0);
      for (int b = 0; b < n; ++b) t += product(b);
    } else if (form == GatherForm::kPermute) {
      // Step k brings block (r + k) mod n and hides the product of (r + k - 1) mod n.
      for (int k = 1; k < n; ++k)
        t += step(send(StepKind::kPermute, (r + k) % n), product((r + k - 1) % n));
      t += product((r + n - 1) % n);
    } else {  // block b + 1 travels while block b is multiplied
      t = send(StepKind::kBroadcast, 0);
      for (int b = 0; b < n; ++b)
        t += step(b + 1 < n ? send(StepKind::kBroadcast, b + 1) : 0.0, product(b));
    }
    e.overlapped_s = std::max(e.overlapped_s, t);
  }
  return e;
}

OverlapEstimate reduce_scatter_overlap(const MachineModel& machine, const OverlapCostInput& input,
                                       GatherForm form) {
  const int n = static_cast<int>(input.block_bytes.size());
  MESHFLOW_CHECK(n > 0 && input.block_flops.size() == input.block_bytes.size());
  MESHFLOW_CHECK(form != GatherForm::kBroadcast, "a reduce-scatter has no broadcast form");
  const double mem = bytes_per_second(machine.memcpy_gbps);
  auto product = [&](int b) { return call_seconds(machine, input, b); };
  OverlapEstimate e;
  for (int r = 0; r < n; ++r) {
    add_sequential(machine, input, StepKind::kReduceScatter, r, e);
    if (form == GatherForm::kInPlace) {
      // n rendezvous (the addresses' round, then a barrier before each later step; an in-place
      // step is two), every block's product, each later one reading the sum it adds to.
      double t =
          static_cast<double>(n) * transfer_seconds(machine, input, StepKind::kInPlace, 0) / 2;
      for (int k = 0; k < n; ++k) {
        const int block = (r + k + 1) % n;
        t += product(block) + (k > 0 ? static_cast<double>(input.block_bytes[block]) / mem : 0);
      }
      e.overlapped_s = std::max(e.overlapped_s, t);
      continue;
    }
    // Step k computes block (r + k + 1) mod n while the partial sum of step k - 1 travels,
    // then adds the partial sum received for it: two terms read, as the reduce-scatter step
    // counts every term it reads.
    double t = product((r + 1) % n);
    for (int k = 1; k < n; ++k) {
      const int block = (r + k + 1) % n, sent = (r + k) % n;
      t += step_of(machine, input,
                   transfer_seconds(machine, input, StepKind::kPermute, input.block_bytes[sent]),
                   product(block)) +
           2 * static_cast<double>(input.block_bytes[block]) / mem;
    }
    e.overlapped_s = std::max(e.overlapped_s, t);
  }
  return e;
}

LoopChoice choose_loop(const MachineModel& machine, const OverlapCostInput& input, bool gather,
                       bool shared_memory, std::optional<GatherForm> gather_form) {
  std::vector<GatherForm> candidates = {GatherForm::kPermute};
  if (gather) candidates.push_back(GatherForm::kBroadcast);
  if (shared_memory) candidates.push_back(GatherForm::kInPlace);
  if (gather && gather_form) candidates = {*gather_form};
  LoopChoice out;
  for (GatherForm form : candidates) {  // the first of equally short forms
    const OverlapEstimate e = gather ? gather_overlap(machine, input, form)
                                     : reduce_scatter_overlap(machine, input, form);
    if (form == candidates.front() || e.overlapped_s < out.estimate.overlapped_s) {
      out.form = form;
      out.estimate = e;
    }
  }
  out.pays = out.estimate.overlapped_s < out.estimate.sequential_s;
  return out;
}

}  // namespace meshflow
