// Running a model file's PCG on every device of its meshes, on either backend: compile
// (graph/compile.h), expand into tasks, launch one device per thread or process, load each
// device's source shards, run the task graph once (run) or once per step of a loop that
// train/ drives, and write `--save` folders and `--trace` files. Under mpi only world rank 0
// (device 0) reports.
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
#include "meshflow/graph/compile.h"
#include "meshflow/graph/model_file.h"
#include "meshflow/plan/cost_model.h"
#include "meshflow/plan/planner.h"
#include "meshflow/runtime/pipeline.h"
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
  // The threads each device computes with (kernels/parallel.h); 0: the cores this process may
  // run on divided by the devices sharing them (default_threads_per_device).
  int threads_per_device = 0;
};

// Returns the threads a device gets by default: the cores this process may run on divided by
// `devices` (the launch's devices under threads, the job's processes under mpi, all taken to
// share this machine), at least 1.
int default_threads_per_device(int devices);

struct RunReport {
  std::vector<std::pair<std::string, Layout>> outputs;
  std::vector<std::pair<std::string, double>> scalars;  // the scalar outputs' values
  bool reporter = false;  // true on the process that prints (always under threads)
};

// A compiled model ready to launch: its graph with the values the leader reports fetched to it
// (to a one-device mesh of the leader, Replicate), and its task graph.
struct PreparedModel {
  Pcg pcg;
  TaskGraph tasks;
  DeviceId leader = 0;          // device 0 under mpi, the lowest device of the meshes under threads
  std::optional<ValueId> loss;  // kTrain: the loss, fetched
  std::optional<ValueId> grad_norm;  // kTrain: the all-reduced squared gradient norm (kept)
  // kTrain with fetch_training_values: each weight's gradient and value, fetched.
  std::vector<std::pair<std::string, ValueId>> grads, weights;
  std::vector<std::pair<std::string, ValueId>> scalars;  // kRun: the scalar outputs, fetched
  std::vector<ValueId> saved;  // what --save writes: outputs (kRun) or weights (kTrain)
  // Per saved value, the layout --save writes it in: its own, or a weight's model-file layout
  // where ZeRO-3 holds it in its ZeRO layout (redistributed once, when saving).
  std::vector<Layout> saved_as;
  int micro_batches = 1;  // kTrain: each step's micro-batches
  // kTrain on stages (runtime/pipeline.h's find_stages) with a schedule: the stages, each
  // stage's groups in order, and every device's pipeline (the graph's devices' order; stage -1
  // for a device on no stage).
  std::optional<PipelineStages> stages;
  std::vector<std::vector<ScheduledGroup>> schedule;
  std::vector<DevicePipeline> pipelines;
  // Why a step on stages runs them one after another instead (pipeline_conflict's reason).
  std::optional<std::string> not_pipelined;
};

// What a training step compiles with (kTrain).
struct TrainingCompile {
  UpdateRule update;
  int micro_batches = 1;
  int zero = 0;                            // the ZeRO level (graph/compile.h)
  Recompute recompute = Recompute::kNone;  // activation recomputation (graph/passes.h)
  // Fetch each weight's gradient and value to the leader (train --check).
  bool fetch_training_values = false;
  // Where the step's work lies on two or more stages: each stage's groups for (stages,
  // micro-batches) (train/schedule.h), W groups apart with `split_weights`. Unset: the stages
  // run one micro-batch after another, in task order.
  std::function<std::vector<std::vector<ScheduledGroup>>(int stages, int micro_batches)> schedule;
  bool split_weights = false;
};

// Returns `model` compiled for `mode` (kTrain with `training`) and expanded into tasks.
PreparedModel prepare_model(const Model& model, Mode mode, const ModelRunOptions& options,
                            const TrainingCompile& training = {});

// What a launch does per step on every device. Step k runs the task graph with options(k)
// (the runtime sets trace and times), then every device computes stop_flag on its values, the
// flags are reduced by max over all devices (the step's end for every device), every device
// calls after_step where the flag is 0, and the leader calls on_step. A non-zero flag ends the
// loop after that step.
struct StepLoop {
  int steps = 1;
  int first_step = 1;  // the steps are first_step .. first_step + steps - 1 (a resumed run's)
  // Called on every device of the launch after it loaded its sources, before the first step,
  // with its values: fills the sources left to it (Source::Kind::kProvided: a resumed run's
  // checkpoint, verified there); may communicate over `world` and throw.
  std::function<void(Communicator& world, std::vector<Tensor>& values)> after_load;
  // Called on every device of the launch after each step that ran to its end (stop flag 0),
  // with that device's values (a checkpoint's snapshot), before on_step reports the step; may
  // communicate over `world`.
  std::function<void(int step, Communicator& world, const std::vector<Tensor>& values)> after_step;
  // Called on every device before each step: puts that step's data inputs in place (in
  // `values`, or per micro-batch in `micro_inputs`). The time it takes is the device's data
  // wait; the longest over the devices is the step's TaskTimes::data_wait_s.
  using Feed = std::function<void(int index, Communicator& world, std::vector<Tensor>& values,
                                  std::vector<std::vector<Tensor>>& micro_inputs)>;
  Feed feed;
  // Evaluation: after each step k (and its after_step) where eval_at(k), every device runs
  // `eval_batches` forward passes (runtime/task_runtime.h's run_forward), each after
  // eval_feed(b, ...) put val batch b's inputs in place, and the leader calls on_eval with the
  // mean of their losses.
  std::function<bool(int step)> eval_at;
  int eval_batches = 0;
  Feed eval_feed;
  std::function<void(int step, double loss)> on_eval;
  std::function<TaskRunOptions(int step)> options;
  // The bytes device `device` holds beside its values through a step (a checkpoint's snapshot),
  // counted in its measured memory as MemoryKind::kSnapshot.
  std::function<std::int64_t(DeviceId device)> held_beside;
  std::function<int(const std::vector<Tensor>& values, bool leader)> stop_flag;
  std::function<void(int step, double seconds, const TaskTimes& times,
                     const std::vector<Tensor>& values)>
      on_step;
};

// Runs the forward pass once. `feed_of` (when set) gives the feed that puts the data inputs
// of step 1 in place, for the prepared model.
RunReport run_model(const Model& model, const ModelRunOptions& options,
                    const std::function<StepLoop::Feed(const PreparedModel&)>& feed_of = nullptr);

// How a loop ended: the last step run and its reduced stop flag (0: every step ran), and the
// device whose tensors peaked highest over the steps, with what they were then (the runtime's
// count: every value it held and the micro-batches and sums beside them).
struct LoopEnd {
  int step = 0;
  int stop_flag = 0;
  DeviceMemory measured;
  // Pipelined: per device (ascending), its stage, the most activation sets it held at once and
  // their peak bytes, over the steps.
  struct StageDevice {
    DeviceId device = 0;
    int stage = 0, peak_sets = 0;
    std::int64_t peak_set_bytes = 0;
  };
  std::vector<StageDevice> pipeline;
};

// Launches `prepared` (null when preparing failed with `error`, which then reaches every
// device under mpi) on every device of its task graph and the leader and runs `loop` (under mpi
// every rank first agrees it runs the same graph). When every step ran, writes --save and
// --trace; when the loop stopped, writes nothing.
LoopEnd run_loop(const PreparedModel* prepared, const std::string& error,
                 const ModelRunOptions& options, const StepLoop& loop);

// Prepares `model` as prepare_model does; under mpi a failure is returned in `error` (every
// rank must still launch to learn of it), under threads it is thrown.
std::optional<PreparedModel> try_prepare(const Model& model, Mode mode,
                                         const ModelRunOptions& options, std::string& error,
                                         const TrainingCompile& training = {});

// Appends a move of `value` to a one-device mesh of `leader`, all Replicate (a fetch: how the
// process that reports reads a value); returns its id.
ValueId add_fetch(Pcg& pcg, ValueId value, DeviceId leader);

// Returns the value of a one-element tensor as a double.
double scalar_of(const Tensor& t);

// Returns true on the process that prints (always under threads; world rank 0 under mpi).
bool reports(const ModelRunOptions& options);

// Runs one pass of compiled graph `pcg` (graph/compile.h: a forward pass, or a training step
// of as many micro-batches as it was compiled for)
// on the threads backend, each device's communicator wrapped in a RecordingCommunicator, and
// returns every device's calls: how tests and benchmarks count a model's communication.
std::map<DeviceId, CallLog> record_calls(const Pcg& pcg);

}  // namespace meshflow
