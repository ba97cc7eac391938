// The default machine description and its JSON form.
#include "meshflow/plan/machine.h"

#include "meshflow/core/error.h"
#include "meshflow/core/npy.h"

namespace meshflow {

const MachineModel& default_machine() {
  // Measured on the reference machine (`meshflow bench copy`, `meshflow bench collectives`):
  // memcpy ~18 GB/s on one thread; a 4-device threads collective costs ~40 us to rendezvous
  // whatever its size and sustains ~4 GB/s of bus bandwidth per device. The network class is
  // a typical 100 Gb/s fabric, for meshes spanning nodes under mpi.
  static const MachineModel model{
      .links = {{"shared_memory", LinkClass{.bandwidth_gbps = 4.0, .latency_us = 2.0}},
                {"network", LinkClass{.bandwidth_gbps = 10.0, .latency_us = 20.0}}},
      .default_link = "shared_memory",
      .dim_links = {},
      .memcpy_gbps = 18.0,
      .collective_overhead_us = 40.0,
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
  MachineModel m;
  try {
    for (auto& [name, link] : json.at("links").items()) {
      LinkClass l{link.at("bandwidth_gbps").get<double>(), link.at("latency_us").get<double>()};
      if (!(l.bandwidth_gbps > 0) || l.latency_us < 0) {
        fail(ErrorKind::kInvalidArgument,
             "{}: link \"{}\" needs bandwidth_gbps > 0 and latency_us >= 0", source, name);
      }
      m.links[name] = l;
    }
    m.default_link = json.at("default_link").get<std::string>();
    if (json.contains("dim_links"))
      m.dim_links = json.at("dim_links").get<std::vector<std::string>>();
    m.memcpy_gbps = json.at("memcpy_gbps").get<double>();
    m.collective_overhead_us = json.at("collective_overhead_us").get<double>();
  } catch (const nlohmann::json::exception& e) {
    fail(ErrorKind::kInvalidArgument, "{}: {}", source, e.what());
  }
  if (!(m.memcpy_gbps > 0))
    fail(ErrorKind::kInvalidArgument, "{}: memcpy_gbps must be > 0", source);
  if (m.collective_overhead_us < 0)
    fail(ErrorKind::kInvalidArgument, "{}: collective_overhead_us must be >= 0", source);
  if (!m.links.contains(m.default_link)) {
    fail(ErrorKind::kInvalidArgument, "{}: default_link \"{}\" is not among the links", source,
         m.default_link);
  }
  for (const std::string& l : m.dim_links) {
    if (!m.links.contains(l))
      fail(ErrorKind::kInvalidArgument, "{}: dim_links names unknown link \"{}\"", source, l);
  }
  return m;
}

MachineModel load_machine(const std::filesystem::path& path) {
  nlohmann::json json;
  try {
    json = nlohmann::json::parse(read_file(path));
  } catch (const nlohmann::json::parse_error& e) {
    fail(ErrorKind::kIo, "{}: invalid JSON at byte {}", path.string(), e.byte);
  }
  return machine_from_json(json, path.string());
}

}  // namespace meshflow
