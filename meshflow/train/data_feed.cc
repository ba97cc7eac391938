// Binding data to a run, and the per-device feed with its prefetch thread.
#include "meshflow/train/data_feed.h"

#include <fmt/format.h>

#include "meshflow/core/error.h"
#include "meshflow/core/file.h"
#include "meshflow/core/npy.h"
#include "meshflow/mesh/sharded_folder.h"
#include "meshflow/mesh/sharding.h"

namespace meshflow {

std::optional<ModelData> read_model_data(const Model& model) {
  std::vector<DataInput> inputs;
  for (const Node& n : model.pcg.nodes) {
    if (n.kind != NodeKind::kInput || n.source.kind != Source::Kind::kData) continue;
    inputs.push_back({.tensor = n.name,
                      .name = n.source.data,
                      .shift = n.source.shift,
                      .dtype = n.spec.dtype,
                      .shape = n.spec.shape});
  }
  if (model.data.is_null()) return std::nullopt;
  // Wrapped so that messages name the field as "data.train".
  const nlohmann::json top = {{"data", model.data}};
  ModelData d;
  try {
    d.spec = parse_data_spec(
        JsonField(top, model.source, ErrorKind::kInvalidArgument).member("data"), model.base);
  } catch (const Error& e) {
    if (std::string_view(e.what()).starts_with(model.source)) throw;
    fail(e.kind(), "{}: {}", model.source, e.what());
  }
  check_data_inputs(d.spec, inputs, model.source);
  d.inputs = std::move(inputs);
  d.batch = d.inputs[0].shape[0];
  d.train = train_order(d.spec, d.inputs);
  if (d.spec.order == DataOrder::kShuffled && d.train.units > (std::int64_t{1} << 32)) {
    fail(ErrorKind::kInvalidArgument,
         "{}: \"data.order\": a shuffled order of {} units does not fit 32-bit unit ids (use "
         "\"sequential\" or \"random\")",
         model.source, d.train.units);
  }
  if (d.spec.val) d.eval = eval_order(*d.spec.val, d.inputs);
  return d;
}

nlohmann::json data_position_json(const ModelData& data, const DataPosition& start, int step) {
  return {{"rows", start.first_row(step + 1, data.batch)},
          {"order", to_string(data.spec.order)},
          {"seed", data.spec.seed},
          {"units", data.train.units}};
}

DataPosition resumed_position(const ModelData& data, const nlohmann::json& saved, int step,
                              const std::string& checkpoint) {
  if (!saved.is_object() || !saved.contains("rows")) {
    fail(ErrorKind::kInvalidArgument,
         "{}: the checkpoint has no data position (saved by a model without \"data\")", checkpoint);
  }
  auto differ = [&](std::string_view field, const std::string& was, const std::string& is) {
    fail(ErrorKind::kInvalidArgument,
         "{}: the checkpoint's data {} is {} but the model's is {} (resume with the data it was "
         "saved with)",
         checkpoint, field, was, is);
  };
  const std::string order = saved.value("order", "");
  if (order != to_string(data.spec.order))
    differ("order", order, std::string(to_string(data.spec.order)));
  if (saved.value("seed", std::int64_t{-1}) != data.spec.seed)
    differ("seed", saved.value("seed", nlohmann::json()).dump(), std::to_string(data.spec.seed));
  if (saved.value("units", std::int64_t{-1}) != data.train.units)
    differ("train split's units W", saved.value("units", nlohmann::json()).dump(),
           std::to_string(data.train.units));
  const nlohmann::json& rows = saved.at("rows");
  if (!rows.is_number_integer() || rows.get<std::int64_t>() < 0)
    fail(ErrorKind::kInvalidArgument, "{}: the checkpoint's data rows {} are not a row count",
         checkpoint, rows.dump());
  return {.rows = rows.get<std::int64_t>(), .step = step};
}

GlobalBatches::GlobalBatches(const ModelData& data, DataPosition start)
    : data_(&data), start_(start), train_(data.spec.train) {
  if (data.spec.val) val_.emplace(*data.spec.val);
}

std::map<std::string, Tensor> GlobalBatches::at(int t, bool val) {
  MESHFLOW_CHECK(!val || val_.has_value(), "no val split");
  const SplitReader& reader = val ? *val_ : train_;
  const RowOrder& order = val ? *data_->eval : data_->train;
  const std::int64_t first =
      val ? static_cast<std::int64_t>(t - 1) * data_->batch : start_.first_row(t, data_->batch);
  std::map<std::string, Tensor> out;
  for (const DataInput& in : data_->inputs)
    out[in.tensor] = read_box(reader, order, cache_, in, first, full_box(in.shape));
  return out;
}

struct DataFeeder::Device {
  BackgroundJob job;
  int next_step = 0;
  Batch next;
};

DataFeeder::DataFeeder(const ModelData& data, const PreparedModel& prepared, DataPosition start,
                       int last_step)
    : data_(&data),
      start_(start),
      last_step_(last_step),
      train_(data.spec.train, data.spec.order != DataOrder::kSequential) {
  if (data.spec.val) val_.emplace(*data.spec.val);
  for (std::size_t i = 0; i < data.inputs.size(); ++i) {
    const ValueId v = find_value(prepared.pcg, data.inputs[i].tensor);
    const Node& n = prepared.pcg.nodes[static_cast<std::size_t>(v)];
    MESHFLOW_CHECK(n.source.kind == Source::Kind::kData && n.layout.has_value());
    targets_.push_back(
        {.value = v, .input = i, .layout = *n.layout, .micro_batches = n.micro_batches});
  }
}

DataFeeder::~DataFeeder() = default;

DataFeeder::Device& DataFeeder::device(DeviceId id) {
  std::lock_guard lock(mu_);
  std::unique_ptr<Device>& d = devices_[id];
  if (!d) d = std::make_unique<Device>();
  return *d;
}

DataFeeder::Batch DataFeeder::read(DeviceId id, const RowOrder& order, const SplitReader& reader,
                                   std::int64_t first_row) const {
  Batch b;
  b.whole.resize(targets_.size());
  b.micro.resize(targets_.size());
  b.held.resize(targets_.size(), false);
  for (std::size_t i = 0; i < targets_.size(); ++i) {
    const Target& t = targets_[i];
    if (!find_device(t.layout.mesh, id)) continue;
    b.held[i] = true;
    const DataInput& in = data_->inputs[t.input];
    const Box box = shard_box(t.layout, id);
    if (t.micro_batches == 1) {
      b.whole[i] = read_box(reader, order, cache_, in, first_row, box);
      continue;
    }
    for (int m = 0; m < t.micro_batches; ++m) {
      Box part = box;
      part.offset[0] += static_cast<std::int64_t>(m) * t.layout.shape[0];
      b.micro[i].push_back(read_box(reader, order, cache_, in, first_row, part));
    }
  }
  return b;
}

void DataFeeder::place(Batch batch, std::vector<Tensor>& values,
                       std::vector<std::vector<Tensor>>& micro_inputs,
                       const std::vector<Target>& targets) {
  for (std::size_t i = 0; i < targets.size(); ++i) {
    const auto v = static_cast<std::size_t>(targets[i].value);
    if (targets[i].micro_batches == 1) {
      if (batch.held[i]) values[v] = std::move(batch.whole[i]);
      continue;
    }
    if (!batch.held[i] || v >= micro_inputs.size()) continue;
    micro_inputs[v] = std::move(batch.micro[i]);
  }
}

StepLoop::Feed DataFeeder::feed() {
  return [this](int t, Communicator& world, std::vector<Tensor>& values,
                std::vector<std::vector<Tensor>>& micro_inputs) {
    const DeviceId id = world.device();
    Device& d = device(id);
    Batch batch;
    if (d.job.pending()) {
      d.job.wait();
      MESHFLOW_CHECK(d.next_step == t, "device {} read step {} ahead of step {}", id, d.next_step,
                     t);
      batch = std::move(d.next);
    } else {
      batch = read(id, data_->train, train_, start_.first_row(t, data_->batch));
    }
    place(std::move(batch), values, micro_inputs, targets_);
    if (t < last_step_) {
      d.next_step = t + 1;
      d.job.start([this, &d, id, t] {
        d.next = read(id, data_->train, train_, start_.first_row(t + 1, data_->batch));
      });
    }
  };
}

StepLoop::Feed DataFeeder::eval_feed() {
  return [this](int b, Communicator& world, std::vector<Tensor>& values,
                std::vector<std::vector<Tensor>>& micro_inputs) {
    MESHFLOW_CHECK(val_.has_value() && data_->eval.has_value(), "no val split to evaluate on");
    place(read(world.device(), *data_->eval, *val_, static_cast<std::int64_t>(b) * data_->batch),
          values, micro_inputs, targets_);
  };
}

void write_batches(const ModelData& data, bool val, int first, int last,
                   const std::filesystem::path& out) {
  if (val && !data.spec.val)
    fail(ErrorKind::kInvalidArgument, "--split val: the model's data has no val split");
  const std::filesystem::path target = output_target(out);
  const std::filesystem::path staged = stage_folder(target);
  try {
    GlobalBatches batches(data, {});
    for (int t = first; t <= last; ++t) {
      const std::filesystem::path dir = staged / fmt::format("step-{}", t);
      std::filesystem::create_directories(dir);
      for (const auto& [name, batch] : batches.at(t, val)) write_npy(dir / (name + ".npy"), batch);
    }
    commit_folder(staged, target);
  } catch (...) {
    discard(staged);
    throw;
  }
}

std::int64_t loader_bytes(const ModelData& data, const Pcg& built, DeviceId device) {
  std::int64_t bytes = data.spec.order == DataOrder::kShuffled
                           ? data.train.units * static_cast<std::int64_t>(sizeof(std::uint32_t))
                           : 0;
  for (const DataInput& in : data.inputs) {
    const Node& n = built.nodes[static_cast<std::size_t>(find_value(built, in.tensor))];
    const Layout layout = make_layout(*n.mesh, *n.placements, n.spec.shape, n.spec.dtype);
    if (!find_device(layout.mesh, device)) continue;
    bytes += numel(shard_box(layout, device).extent) * static_cast<std::int64_t>(size_of(in.dtype));
  }
  return bytes;
}

void add_loader_memory(const Model& model, Explanation& e) {
  const std::optional<ModelData> data = read_model_data(model);
  if (!data || !e.memory) return;
  const std::int64_t extra = loader_bytes(*data, model.pcg, e.memory->device);
  e.memory->peak += extra;
  e.memory->at_peak[MemoryKind::kActivations] += extra;
}

RunReport run_model_on_data(const Model& model, const std::optional<ModelData>& data,
                            const ModelRunOptions& options) {
  if (!data) return run_model(model, options);
  std::optional<DataFeeder> feeder;
  return run_model(model, options, [&](const PreparedModel& p) {
    feeder.emplace(*data, p, DataPosition{}, /*last_step=*/1);
    return feeder->feed();
  });
}

}  // namespace meshflow
