// A model's data bound to a run (DESIGN.md "Data, evaluation and tokenizers"): the model
// file's "data" object and data inputs checked against each other, and the feed that puts each
// step's batch in place on every device: each device reads only its own shard boxes of each
// data input (per micro-batch where the step has several) through memory maps, the next step's
// on a background thread while the current one computes.
#pragma once

#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>

#include "meshflow/data/batch.h"
#include "meshflow/data/prefetch.h"
#include "meshflow/graph/explain.h"
#include "meshflow/graph/model_file.h"
#include "meshflow/runtime/model_runner.h"

namespace meshflow {

// What a model with a "data" object reads.
struct ModelData {
  DataSpec spec;
  std::vector<DataInput> inputs;
  RowOrder train;
  std::optional<RowOrder> eval;  // when there is a val split
  std::int64_t batch = 0;        // B, the global batch's rows
  // Returns true for a window input (tokens per row S), false for sample arrays.
  bool windows() const { return spec.train.is_stream(); }
};

// Returns the model's data, or nullopt when it has no "data" object. Throws Error (one line
// naming the file, tensor or field) for every error of DESIGN's list that the files and the
// model show.
std::optional<ModelData> read_model_data(const Model& model);

// Where a run's rows start: global row j of step t's row r is rows + (t − step − 1)·B + r
// (a fresh run: 0 and 0; a resumed one: its checkpoint's rows and step).
struct DataPosition {
  std::int64_t rows = 0;
  int step = 0;
  // Returns the global row of step t's first row for batch size `batch`.
  std::int64_t first_row(int t, std::int64_t batch) const {
    return rows + static_cast<std::int64_t>(t - step - 1) * batch;
  }
};

// Returns checkpoint.json's "data" after step t: {"rows", "order", "seed", "units"}.
nlohmann::json data_position_json(const ModelData& data, const DataPosition& start, int step);

// Returns the position a run resumed from a checkpoint of `step` with `saved` ("data" of its
// checkpoint.json) starts at; throws Error naming the field when the checkpoint has no data
// position or its order, seed or train split's units differ from `data`'s.
DataPosition resumed_position(const ModelData& data, const nlohmann::json& saved, int step,
                              const std::string& checkpoint);

// The whole batches of a run, read from maps opened once, the shuffled order's permutation made
// once per epoch: what `data batches` writes and the one-device check feeds.
class GlobalBatches {
 public:
  // `data` must outlive this object.
  GlobalBatches(const ModelData& data, DataPosition start);
  // Returns the whole batch of step t (`val`: eval batch t − 1) by input tensor name.
  std::map<std::string, Tensor> at(int t, bool val);

 private:
  const ModelData* data_;
  DataPosition start_;
  SplitReader train_;
  std::optional<SplitReader> val_;
  ShuffleCache cache_;
};

// Feeds a launch's devices (one per process under mpi, all of them under threads): the maps and
// the shuffled order's permutation are shared by the devices of a process.
class DataFeeder {
 public:
  // `prepared` is the compiled run; steps run first_step … last_step.
  DataFeeder(const ModelData& data, const PreparedModel& prepared, DataPosition start,
             int last_step);
  ~DataFeeder();

  // Returns the loop's feed (step t's batch, t + 1's read started behind it) and its eval feed
  // (val batch b, read when asked).
  StepLoop::Feed feed();
  StepLoop::Feed eval_feed();

  // Returns the bytes the shuffled order's permutation holds.
  std::int64_t order_bytes() const { return cache_.bytes(); }

 private:
  struct Target {
    ValueId value = 0;
    std::size_t input = 0;  // index in data_->inputs
    Layout layout;
    int micro_batches = 1;
  };
  struct Batch {
    std::vector<Tensor> whole;               // per target (one micro-batch)
    std::vector<std::vector<Tensor>> micro;  // per target, per micro-batch
    std::vector<bool> held;                  // per target: this device holds a shard
  };
  struct Device;
  Device& device(DeviceId id);
  Batch read(DeviceId id, const RowOrder& order, const SplitReader& reader,
             std::int64_t first_row) const;
  static void place(Batch batch, std::vector<Tensor>& values,
                    std::vector<std::vector<Tensor>>& micro_inputs,
                    const std::vector<Target>& targets);

  const ModelData* data_;
  DataPosition start_;
  int last_step_;
  std::vector<Target> targets_;
  SplitReader train_;
  std::optional<SplitReader> val_;
  mutable ShuffleCache cache_;
  std::mutex mu_;
  std::map<DeviceId, std::unique_ptr<Device>> devices_;
};

// Writes the global batches of steps first … last (`val`: eval batches first − 1 … last − 1) as
// `out`/step-<t>/<input>.npy, the folder appearing whole or not at all: `meshflow data batches`.
void write_batches(const ModelData& data, bool val, int first, int last,
                   const std::filesystem::path& out);

// Returns the bytes the data loader holds on `device` beside the runtime's tensors: the next
// step's shards of the data inputs (read ahead while a step computes) and the shuffled order's
// permutation (4·W bytes, one per process: counted on every device).
std::int64_t loader_bytes(const ModelData& data, const Pcg& built, DeviceId device);

// Adds loader_bytes of `model`'s data (when it has data) to the memory estimate of `e` (as
// activations, at the estimate's peak device): what `explain` reports for a model with data.
void add_loader_memory(const Model& model, Explanation& e);

// Runs `model`'s forward pass once (runtime/model_runner.h's run_model), its data inputs
// holding step 1's batch of `data` (read_model_data's, read by the caller) when it has data.
RunReport run_model_on_data(const Model& model, const std::optional<ModelData>& data,
                            const ModelRunOptions& options);

}  // namespace meshflow
