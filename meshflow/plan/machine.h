// MachineModel: the one description of the machine the cost model reads: bandwidth and latency
// per link class, and local memory bandwidth. Defaults were measured on this project's
// reference machine (2 cores, shared memory); override them from a JSON file.
#pragma once

#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace meshflow {

// One class of link between devices (threads in one process, processes on one node, nodes).
struct LinkClass {
  double bandwidth_gbps = 0;  // per device, each direction
  double latency_us = 0;      // per round of a collective (one message hop)
  bool operator==(const LinkClass&) const = default;
};

struct MachineModel {
  std::map<std::string, LinkClass> links;
  std::string default_link;            // the class of every mesh dim not in dim_links
  std::vector<std::string> dim_links;  // optional: the link class of mesh dim i
  double memcpy_gbps = 0;              // local copies, chunking and reductions
  double collective_overhead_us = 0;   // fixed cost of starting and finishing one collective
  bool operator==(const MachineModel&) const = default;
};

// Returns the built-in description (measured with `meshflow bench collectives` and
// `meshflow bench copy` on the reference machine).
const MachineModel& default_machine();

// Returns the link class of `mesh_dim` (the default class when the model names none).
const LinkClass& link_of(const MachineModel& model, int mesh_dim);

// Returns the model described by `json`: {"links": {"name": {"bandwidth_gbps", "latency_us"}},
// "default_link", "dim_links" (optional), "memcpy_gbps", "collective_overhead_us"}; throws
// Error naming the bad field.
MachineModel machine_from_json(const nlohmann::json& json, std::string_view source);
MachineModel load_machine(const std::filesystem::path& path);

}  // namespace meshflow
