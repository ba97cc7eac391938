// Running and training a model file's PCG on every device of its meshes, on either backend:
// compile (graph/compile.h), expand into tasks, launch one device per thread or process, load
// each device's source shards, run the task graph once (run) or once per step (train), and
// write `--save` folders and `--trace` files. Under mpi only world rank 0 (device 0) reports.
#pragma once

#include <filesystem>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "meshflow/comm/launch.h"
#include "meshflow/comm/recording.h"
#include "meshflow/graph/model_file.h"
#include "meshflow/plan/cost_model.h"
#include "meshflow/plan/planner.h"
#include "meshflow/runtime/task_runtime.h"

namespace meshflow {

struct ModelRunOptions {
  Backend backend = Backend::kThreads;
  Timeout timeout = kDefaultTimeout;
  PlanOptions plan;
  // Runs all-gathers into and reduce-scatters out of matrix products as overlapped loops
  // (graph/compile.h's CompileOptions::overlap).
  bool overlap = false;
  // With `overlap`: every decomposed all-gather takes this form instead of the cost model's
  // choice (which includes in_place on threads, where devices share memory).
  std::optional<GatherForm> gather_form;
  // With `overlap`: decompose every collective the patterns allow, even where the cost model
  // estimates the loop no shorter (DecomposeOptions::always).
  bool overlap_always = false;
  // Each value of "outputs" (run) or each weight after the last step (train) as a sharded
  // folder <save>/<name>/ in its layout; the folder appears complete or not at all.
  std::optional<std::filesystem::path> save;
  std::optional<std::filesystem::path> trace;  // Chrome / Perfetto trace JSON
};

struct RunReport {
  std::vector<std::pair<std::string, Layout>> outputs;
  std::vector<std::pair<std::string, double>> scalars;  // the scalar outputs' values
  bool reporter = false;  // true on the process that prints (always under threads)
};

// Runs the forward pass once.
RunReport run_model(const Model& model, const ModelRunOptions& options);

struct StepReport {
  int step = 0;
  double loss = 0;     // the loss of the forward pass before this step's update
  double seconds = 0;  // the step's wall time on the reporting device (all devices done)
  TaskTimes times;     // the reporting device's kernels and moves in this step
};

struct CheckReport {
  double max_loss_diff = 0, max_weight_diff = 0, max_grad_diff = 0;
};

struct TrainOptions {
  ModelRunOptions run;
  int steps = 1;
  double lr = 0.1;
  // Also trains the model on one device with whole tensors (graph/reference.h) and reports the
  // largest differences of losses, weights and gradients over all steps and elements.
  bool check = false;
  // Called on the reporting device after each step.
  std::function<void(const StepReport&)> progress;
};

struct TrainReport {
  std::vector<StepReport> steps;
  std::optional<CheckReport> check;
  bool reporter = false;
};

TrainReport train_model(const Model& model, const TrainOptions& options);

// Returns {"steps": [{"step", "loss", "seconds"}...], "check": {max_*_diff} or null}: what
// `meshflow train --json` prints and the Python module's Model.train returns.
nlohmann::json to_json(const TrainReport& report);

// Runs one pass of compiled graph `pcg` (graph/compile.h: a forward pass, or a training step)
// on the threads backend, each device's communicator wrapped in a RecordingCommunicator, and
// returns every device's calls: how tests and benchmarks count a model's communication.
std::map<DeviceId, CallLog> record_calls(const Pcg& pcg);

}  // namespace meshflow
