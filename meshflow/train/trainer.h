// The training loop (`meshflow train`, Model.train in Python): compile the model with the
// optimizer's update pass, run one step per iteration on every device with that step's
// learning rate (and, for a model with data, that step's batch: train/data_feed.h), evaluate
// on the val split every K steps, log metrics (train/metrics.h), stop at a step whose loss or
// global gradient norm is not finite (unless allowed), and with --check train the same model
// on one device with whole tensors and the float64 reference optimizer and report the largest
// differences.
#pragma once

#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "meshflow/graph/model_file.h"
#include "meshflow/runtime/model_runner.h"
#include "meshflow/train/checkpoint.h"
#include "meshflow/train/data_feed.h"
#include "meshflow/train/optimizer.h"
#include "meshflow/train/schedule.h"

namespace meshflow {

struct StepReport {
  int step = 0;
  double loss = 0;     // the loss of the forward pass before this step's update (may be nan)
  double seconds = 0;  // the step's wall time on the reporting device (all devices done)
  TaskTimes times;     // the reporting device's kernels and moves in this step
  double lr = 0;       // the step's learning rate
  // The global gradient norm before clipping; nullopt where the step computes none.
  std::optional<double> grad_norm;
  double samples_per_s = 0;             // B over the step's time
  std::optional<double> tokens_per_s;   // B·S over it, for window inputs
  std::optional<double> last_val_loss;  // the newest evaluation's, when one ran
  // With checkpoints: the time this step's end was held by its checkpoint's snapshot, or by the
  // wait for an earlier checkpoint's write (the leader's; 0 at most steps).
  std::optional<double> checkpoint_pause_s;
};

// One evaluation: the mean loss over the val batches after step `step`.
struct EvalReport {
  int step = 0;
  double val_loss = 0;
};

struct CheckReport {
  double max_loss_diff = 0, max_weight_diff = 0, max_grad_diff = 0;
  std::optional<double> max_val_loss_diff;  // when evaluations ran
  // What the run fetched to compare: per step, each weight's gradient and its value after the
  // update, whole (two runs compared with each other, bit for bit).
  std::vector<std::map<std::string, Tensor>> grads, weights;
};

struct TrainOptions {
  ModelRunOptions run;
  int steps = 1;
  Optimizer optimizer;  // resolve_optimizer's; the default is SGD at lr 0.1
  // Each step's inputs split along dim 0 into this many micro-batches (graph/passes.h's
  // split_micro_batches), the gradients averaged over them, one update per step.
  int micro_batches = 1;
  // Where consecutive nodes run on different meshes (stages): the pipeline schedule the stages
  // run their micro-batches in, at once (train/schedule.h).
  Schedule schedule = Schedule::k1f1b;
  // The ZeRO level (DESIGN's "ZeRO"): 0, 1 (optimizer state sharded over the weight's ZeRO
  // dims) or 3 (FSDP: weights and gradients too, gathered for each use).
  int zero = 0;
  // Activation recomputation (DESIGN's "Activation recomputation"): which forward values
  // backward makes again instead of keeping them.
  Recompute recompute = Recompute::kNone;
  // Train on through a step whose loss or gradient norm is not finite (its update applied, as
  // PyTorch would); by default such a step stops training before its update, writing nothing.
  bool allow_nonfinite = false;
  // Also trains the model on one device with whole tensors (graph/reference.h and
  // train/reference_optimizer.h) and reports the largest differences of losses, weights and
  // gradients over all steps and elements.
  bool check = false;
  // Checkpoints (train/checkpoint.h): after every `every`-th step and after the last, into dir.
  std::optional<CheckpointOptions> checkpoint;
  // Resume from this checkpoint (a DIR/step-<k>) or the newest complete one in this DIR: every
  // weight and state tensor loaded from it, steps numbered on from k + 1. `optimizer` must be
  // the one it was saved with (train/checkpoint.h's saved_optimizer_options gives its options
  // as defaults).
  std::optional<std::filesystem::path> resume;
  // Evaluation (a model with a val split): after every step whose number is a multiple of
  // eval_every (0: never) and after the last step, the mean loss over eval_batches val batches.
  int eval_every = 0;
  int eval_batches = 20;
  // Where metrics.jsonl and loss.svg go (train/metrics.h); unset: nowhere.
  std::optional<std::filesystem::path> log_dir;
  // Called on the reporting device after each step.
  std::function<void(const StepReport&)> progress;
  // Called on the reporting device after each evaluation.
  std::function<void(const EvalReport&)> on_eval;
};

struct TrainReport {
  std::vector<StepReport> steps;
  std::vector<EvalReport> evals;
  // The runtime's count of the tensors it held: the highest device's peak over the steps and
  // what they were then (graph/memory.h; communication scratch and BLAS workspace excluded).
  DeviceMemory measured;
  std::optional<CheckReport> check;
  bool reporter = false;
  // Pipelined: every stage device's most activation sets held at once and their peak bytes.
  std::vector<LoopEnd::StageDevice> pipeline;
};

// Returns schedule `s` as the runtime takes it (TrainingCompile::schedule).
std::function<std::vector<std::vector<ScheduledGroup>>(int, int)> schedule_of(Schedule s);

// Returns the report of training `model`. Throws Error (exit 1, printed once) naming the step
// whose loss or global gradient norm is not finite, after every device stopped before that
// step's update, with nothing saved or traced.
TrainReport train_model(const Model& model, const TrainOptions& options);

// Returns {"steps": [{"step", "loss" (null when not finite), "seconds", "bubble", "lr",
// "grad_norm", "data_wait_s", "samples_per_s", "tokens_per_s"}...], "evals": [{"step",
// "val_loss"}], "check": {max_*_diff} or null, "measured_peak_bytes", "measured_memory":
// {"weights", "gradients", "optimizer_state", "activations", "gathered", "snapshot"}}: what
// `meshflow train --json` prints and the Python module's Model.train returns.
nlohmann::json to_json(const TrainReport& report);

// Returns one step's object of train --json's "steps" (and of metrics.jsonl).
nlohmann::json to_json(const StepReport& step);

// Returns one evaluation's object of train --json's "evals" (and of metrics.jsonl): {"step",
// "val_loss" (null when not finite)}.
nlohmann::json to_json(const EvalReport& eval);

}  // namespace meshflow
