// The `meshflow` Python module's native part (_meshflow): bindings only. Arrays cross as NumPy
// arrays: read in place going in, and coming out either handed over (a result meshflow made) or
// viewed read-only (a DTensor's shard); every kernel, collective and wait runs with the GIL
// released; meshflow::Error becomes the meshflow.Error subclass of its kind.
#include <fmt/format.h>
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>
#include <unistd.h>

#include <filesystem>
#include <nlohmann/json.hpp>

#include "meshflow/auto/autoshard.h"
#include "meshflow/auto/machine_cache.h"
#include "meshflow/comm/session.h"
#include "meshflow/core/error.h"
#include "meshflow/core/file.h"
#include "meshflow/data/prepare.h"
#include "meshflow/dtensor/global_view.h"
#include "meshflow/graph/compile.h"
#include "meshflow/graph/explain.h"
#include "meshflow/graph/model_file.h"
#include "meshflow/infer/generate.h"
#include "meshflow/infer/text_stream.h"
#include "meshflow/mesh/device_mesh.h"
#include "meshflow/mesh/placement.h"
#include "meshflow/mesh/sharded_folder.h"
#include "meshflow/mesh/sharding.h"
#include "meshflow/plan/planner.h"
#include "meshflow/train/checkpoint.h"
#include "meshflow/train/trainer.h"

namespace py = pybind11;

namespace meshflow {
namespace {

// The process's one session, started on first use (threads: device threads; mpi: MPI).
Session& session() {
  static Session* s = new Session();  // never destroyed: device threads outlive interpreter exit
  return *s;
}

// A DTensor as Python holds it: shared and immutable, so copies are free.
struct Handle {
  std::shared_ptr<const GlobalTensor> g;
  const GlobalTensor& operator*() const { return *g; }
};
Handle hold(GlobalTensor t) { return {std::make_shared<const GlobalTensor>(std::move(t))}; }

// NumPy dtype <-> meshflow dtype.
DType dtype_of(const py::dtype& d) {
  if (d.is(py::dtype::of<float>())) return DType::kFloat32;
  if (d.is(py::dtype::of<double>())) return DType::kFloat64;
  if (d.is(py::dtype::of<std::int32_t>())) return DType::kInt32;
  if (d.is(py::dtype::of<std::int64_t>())) return DType::kInt64;
  fail(ErrorKind::kInvalidArgument,
       "NumPy dtype {} is not one meshflow holds (float32, float64, int32, int64)",
       std::string(py::str(static_cast<const py::handle&>(d))));
}

py::dtype numpy_dtype(DType d) {
  switch (d) {
    case DType::kFloat32:
      return py::dtype::of<float>();
    case DType::kFloat64:
      return py::dtype::of<double>();
    case DType::kInt32:
      return py::dtype::of<std::int32_t>();
    case DType::kInt64:
      return py::dtype::of<std::int64_t>();
  }
  return py::dtype::of<float>();
}

// Returns a NumPy array that owns `t`'s storage (no copy).
py::array to_numpy(Tensor t) {
  auto* owner = new Tensor(std::move(t));
  py::capsule free(owner, [](void* p) { delete static_cast<Tensor*>(p); });
  std::vector<py::ssize_t> shape(owner->shape().begin(), owner->shape().end());
  return py::array(numpy_dtype(owner->dtype()), shape, owner->bytes(), free);
}

// Returns a read-only NumPy view of `shard`, one of h's shards, that keeps h's tensor alive (no
// copy: a DTensor never changes, so its shards must not be written through a view).
py::array read_only_view(const Handle& h, const Tensor& shard) {
  auto* owner = new Handle(h);
  py::capsule keep(owner, [](void* p) { delete static_cast<Handle*>(p); });
  std::vector<py::ssize_t> shape(shard.shape().begin(), shard.shape().end());
  // The constructor wants a mutable pointer; the flag below makes the array read-only.
  py::array a(numpy_dtype(shard.dtype()), shape, const_cast<std::byte*>(shard.bytes()), keep);
  a.attr("setflags")(py::arg("write") = false);
  return a;
}

std::vector<Placement> placements_of(const std::string& text) { return parse_placements(text); }

py::object json_to_python(const nlohmann::json& j) {
  return py::module_::import("json").attr("loads")(j.dump());
}

Handle binary(OpType type, const GlobalTensor& a, const py::object& b, bool reflected) {
  auto apply = [&](const GlobalTensor& other) {
    py::gil_scoped_release release;
    const Op op{.type = type};
    return hold(reflected ? apply_op(session(), op, {&other, &a})
                          : apply_op(session(), op, {&a, &other}));
  };
  if (py::isinstance<Handle>(b)) return apply(*b.cast<const Handle&>());
  if (!py::isinstance<py::float_>(b) && !py::isinstance<py::int_>(b)) {
    fail(ErrorKind::kInvalidArgument,
         "{}: operand of Python type {} is neither a DTensor nor a number", to_string(type),
         std::string(py::str(py::type::of(b).attr("__name__"))));
  }
  return apply(scalar(session(), b.cast<double>(), a.layout.dtype, a.layout.mesh));
}

// Attributes of `meshflow.ops.<name>(..., **attrs)`.
Op make_op(const std::string& name, const py::dict& attrs) {
  Op op{.type = parse_op_type(name)};
  for (auto [key, value] : attrs) {
    const std::string k = py::str(key);
    if (k == "dims") {
      op.dims = value.cast<std::vector<int>>();
    } else if (k == "dim") {
      op.dim = value.cast<int>();
    } else if (k == "shape") {
      op.shape = value.cast<std::vector<std::int64_t>>();
    } else if (k == "scale") {
      op.scale = value.cast<double>();
    } else if (k == "eps") {
      op.eps = value.cast<double>();
    } else if (k == "causal") {
      op.causal = value.cast<bool>();
    } else {
      fail(ErrorKind::kInvalidArgument,
           "{}: unknown attribute \"{}\" (operators take dims, dim, shape, scale, eps or causal)",
           name, k);
    }
  }
  return op;
}

// A model file with what running it needs.
struct LoadedModel {
  Model model;
};

// Returns the optimizer options Model.train's keywords give (None: not given).
OptimizerOptions optimizer_options(const py::dict& kw) {
  auto given = [&](const char* key) { return kw.contains(key) && !kw[key].is_none(); };
  OptimizerOptions o;
  if (given("optimizer")) {
    const auto text = kw["optimizer"].cast<std::string>();
    o.kind = parse_optimizer_kind(text);
    if (!o.kind)
      fail(ErrorKind::kInvalidArgument, "optimizer=\"{}\": must be \"sgd\" or \"adamw\"", text);
  }
  if (given("decay")) {
    const auto text = kw["decay"].cast<std::string>();
    o.decay = parse_lr_decay(text);
    if (!o.decay) {
      fail(ErrorKind::kInvalidArgument, "decay=\"{}\": must be \"none\", \"cosine\" or \"linear\"",
           text);
    }
  }
  auto number = [&](const char* key, std::optional<double>& out) {
    if (given(key)) out = kw[key].cast<double>();
  };
  number("lr", o.lr);
  number("momentum", o.momentum);
  number("eps", o.eps);
  number("weight_decay", o.weight_decay);
  number("clip_grad_norm", o.clip_grad_norm);
  if (given("betas")) o.betas = kw["betas"].cast<std::pair<double, double>>();
  if (given("warmup_steps")) o.warmup_steps = kw["warmup_steps"].cast<int>();
  if (given("decay_steps")) o.decay_steps = kw["decay_steps"].cast<int>();
  return o;
}

// Returns threads_per_device= checked (0 when not given: the default).
int threads_option(std::optional<int> threads_per_device) {
  if (threads_per_device && *threads_per_device < 1) {
    fail(ErrorKind::kInvalidArgument, "threads_per_device= {}: must be >= 1", *threads_per_device);
  }
  return threads_per_device.value_or(0);
}

// Returns the description machine= names for `devices` devices (None: this machine's, from the
// cache, measured first where `measure` says and the cache holds none, else the built-in one;
// "default": the built-in one; else a description file), its lines on standard error.
ChosenMachine machine_option(const std::optional<std::string>& machine, int devices,
                             std::optional<int> threads_per_device, bool measure) {
  const MachineCacheOptions options{.measure = measure, .note = note_on_stderr};
  return choose_machine(
      parse_machine_choice(machine.value_or("")),
      machine_key(session().backend(), devices, threads_option(threads_per_device)), options);
}

// Returns the options of a run of `model`, its plans chosen with `machine`, which must outlive
// them.
ModelRunOptions model_options(bool overlap, std::optional<int> threads_per_device,
                              const ChosenMachine& machine) {
  ModelRunOptions o;
  o.backend = session().backend();
  o.overlap = overlap;
  o.threads_per_device = threads_option(threads_per_device);
  o.plan.machine = &machine.machine;
  return o;
}

// A folder every process of the job names alike: under mpi, rank 0's process id settles it.
std::filesystem::path shared_scratch() {
  std::int64_t id = ::getpid();
  if (session().backend() == Backend::kMpi) {
    std::vector<DeviceId> all = first_devices(session().size());
    session().run(all, [&](Communicator& comm) {
      broadcast(comm, {.data = reinterpret_cast<std::byte*>(&id),
                       .count = 1,
                       .dtype = DType::kInt64,
                       .root = Rank{0}});
    });
  }
  return std::filesystem::temp_directory_path() / fmt::format("meshflow-run-{}", id);
}

// Returns `text` as the reporting process has it, on every process (mpi: only the process that
// reports holds a run's or training's report).
std::string shared_report(std::string text, bool reporter) {
  if (session().backend() != Backend::kMpi) return text;
  const std::vector<DeviceId> all = first_devices(session().size());
  session().run(all, [&](Communicator& comm) {
    std::vector<std::int64_t> mine{reporter ? comm.rank() : -1,
                                   static_cast<std::int64_t>(text.size())};
    std::vector<std::int64_t> every(2 * all.size());
    all_gather(comm, {.send = reinterpret_cast<const std::byte*>(mine.data()),
                      .recv = reinterpret_cast<std::byte*>(every.data()),
                      .recv_counts = std::vector<std::int64_t>(all.size(), 2),
                      .dtype = DType::kInt64});
    std::int64_t root = 0, size = 0;
    for (std::size_t r = 0; r < all.size(); ++r) {
      if (every[2 * r] >= 0) {
        root = every[2 * r];
        size = every[2 * r + 1];
      }
    }
    // Sent as 4-byte words (no dtype is one byte wide).
    text.resize(static_cast<std::size_t>((size + 3) / 4 * 4));
    broadcast(comm, {.data = reinterpret_cast<std::byte*>(text.data()),
                     .count = (size + 3) / 4,
                     .dtype = DType::kInt32,
                     .root = Rank{static_cast<int>(root)}});
    text.resize(static_cast<std::size_t>(size));
  });
  return text;
}

py::dict run_outputs(const LoadedModel& m, bool overlap, std::optional<int> threads_per_device) {
  const ChosenMachine machine =
      machine_option(std::nullopt, model_device_count(m.model), threads_per_device, false);
  ModelRunOptions o = model_options(overlap, threads_per_device, machine);
  const std::filesystem::path dir = shared_scratch();
  o.save = dir;
  std::vector<std::pair<std::string, Tensor>> values;
  {
    py::gil_scoped_release release;
    const RunReport r = run_model_on_data(m.model, read_model_data(m.model), o);
    auto all_processes_here = [] {
      if (session().backend() != Backend::kMpi) return;
      session().run(first_devices(session().size()), [](Communicator& comm) { barrier(comm, {}); });
    };
    // Every process has written its shards before any reads (a process that finishes its part
    // of the run early would otherwise find another's output folder still incomplete).
    all_processes_here();
    for (const auto& [name, layout] : r.outputs) {
      ShardedTensor s = read_sharded(dir / name);
      values.emplace_back(name, assemble(s.layout, s.shards));
    }
    all_processes_here();  // every process has read before any removes
    if (session().rank() == 0) std::filesystem::remove_all(dir);
  }
  py::dict out;
  for (auto& [name, t] : values) out[py::str(name)] = to_numpy(std::move(t));
  return out;
}

}  // namespace
}  // namespace meshflow

PYBIND11_MODULE(_meshflow, module) {
  using namespace meshflow;
  module.doc() = "meshflow's native module; import meshflow instead";

  // Errors: meshflow.Error, and one subclass per kind (indexed by ErrorKind) that also derives
  // from the built-in exception a Python user catches for it.
  struct ErrorClass {
    ErrorKind kind;
    const char* name;
    PyObject* builtin;
  };
  const ErrorClass classes[] = {
      {ErrorKind::kInvalidArgument, "InvalidArgumentError", PyExc_ValueError},
      {ErrorKind::kShapeMismatch, "ShapeMismatchError", PyExc_ValueError},
      {ErrorKind::kIo, "IoError", PyExc_OSError},
      {ErrorKind::kCommunication, "CommunicationError", PyExc_RuntimeError},
      {ErrorKind::kTimeout, "TimeoutError", PyExc_TimeoutError},
      {ErrorKind::kInternal, "InternalError", PyExc_RuntimeError},
  };
  static PyObject* base = PyErr_NewException("meshflow.Error", PyExc_Exception, nullptr);
  static PyObject* by_kind[std::size(classes)] = {};
  module.attr("Error") = py::handle(base);
  for (const ErrorClass& c : classes) {
    py::tuple bases = py::make_tuple(py::handle(base), py::handle(c.builtin));
    PyObject* type =
        PyErr_NewException(fmt::format("meshflow.{}", c.name).c_str(), bases.ptr(), nullptr);
    by_kind[static_cast<std::size_t>(c.kind)] = type;
    module.attr(c.name) = py::handle(type);
  }
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const Error& e) {
      PyObject* type = by_kind[static_cast<std::size_t>(e.kind())];
      PyErr_SetString(type, e.what());
    }
  });

  module.def("backend", [] { return std::string(to_string(session().backend())); });
  module.def("rank", [] { return session().rank(); });

  py::class_<DeviceMesh>(module, "_Mesh")
      .def(py::init([](const std::string& text, std::vector<std::string> names) {
        DeviceMesh mesh = parse_mesh(text);
        return make_mesh(mesh.shape, mesh.devices, std::move(names));
      }))
      .def(py::init([](Shape shape, std::vector<DeviceId> devices, std::vector<std::string> names) {
        if (devices.empty()) devices = make_mesh(shape).devices;
        return make_mesh(std::move(shape), std::move(devices), std::move(names));
      }))
      .def_property_readonly("shape",
                             [](const DeviceMesh& m) { return py::tuple(py::cast(m.shape)); })
      .def_property_readonly("devices", [](const DeviceMesh& m) { return m.devices; })
      .def_property_readonly("names", [](const DeviceMesh& m) { return m.names; })
      .def("__eq__", [](const DeviceMesh& a, const DeviceMesh& b) { return a == b; })
      .def("__str__", [](const DeviceMesh& m) { return to_string(m); });

  py::class_<Handle>(module, "_Tensor")
      .def_property_readonly("placements",
                             [](const Handle& h) { return to_string((*h).layout.placements); })
      .def_property_readonly("mesh", [](const Handle& h) { return (*h).layout.mesh; })
      .def_property_readonly("shape",
                             [](const Handle& h) { return py::tuple(py::cast((*h).layout.shape)); })
      .def_property_readonly("dtype",
                             [](const Handle& h) { return numpy_dtype((*h).layout.dtype); })
      .def_property_readonly("layout", [](const Handle& h) { return to_string((*h).layout); })
      .def("shard",
           [](const Handle& h, DeviceId d) {
             auto it = (*h).shards.find(d);
             if (it == (*h).shards.end()) {
               fail(ErrorKind::kInvalidArgument,
                    "device {} holds no shard here (this process holds {})", d, [&] {
                      std::string s;
                      for (const auto& [k, v] : (*h).shards)
                        s += (s.empty() ? "" : ", ") + std::to_string(k);
                      return s.empty() ? std::string("none") : s;
                    }());
             }
             return read_only_view(h, it->second);
           })
      .def("devices",
           [](const Handle& h) {
             std::vector<DeviceId> out;
             for (const auto& [d, s] : (*h).shards) out.push_back(d);
             return out;
           })
      .def("full",
           [](const Handle& h) {
             Tensor out;
             {
               py::gil_scoped_release release;
               out = full_tensor(session(), *h);
             }
             return to_numpy(std::move(out));
           })
      .def("redistribute",
           [](const Handle& h, const DeviceMesh& mesh, const std::string& placements) {
             std::vector<Placement> ps = placements_of(placements);
             py::gil_scoped_release release;
             return hold(redistribute(session(), *h, mesh, std::move(ps)));
           })
      .def("binary", [](const Handle& h, const std::string& name, const py::object& b,
                        bool reflected) { return binary(parse_op_type(name), *h, b, reflected); });

  module.def("distribute",
             [](const py::array& a, const DeviceMesh& mesh, const std::string& placements) {
               // Read in place; `c` keeps the memory alive (a C-contiguous copy when `a` is not).
               const py::array c = py::array::ensure(a, py::array::c_style);
               if (!c)
                 fail(ErrorKind::kInvalidArgument, "the array cannot be read as a C-order array");
               const TensorView global{dtype_of(c.dtype()), Shape(c.shape(), c.shape() + c.ndim()),
                                       static_cast<const std::byte*>(c.data())};
               std::vector<Placement> ps = placements_of(placements);
               py::gil_scoped_release release;
               return hold(distribute(session(), global, mesh, std::move(ps)));
             });
  module.def("apply", [](const std::string& name, const std::vector<Handle>& operands,
                         const py::dict& attrs) {
    const Op op = make_op(name, attrs);
    std::vector<const GlobalTensor*> ptrs;
    for (const Handle& h : operands) ptrs.push_back(h.g.get());
    py::gil_scoped_release release;
    return hold(apply_op(session(), op, ptrs));
  });
  py::class_<LoadedModel>(module, "_Model");
  module.def("load_model", [](const std::string& path) { return LoadedModel{load_model(path)}; });
  module.def("run_model", &run_outputs);
  module.def(
      "train_model",
      [](const LoadedModel& m, int steps, const py::dict& optimizer, bool check, bool overlap,
         bool allow_nonfinite, std::optional<int> micro_batches, std::optional<int> zero,
         std::optional<std::string> checkpoint, std::optional<int> checkpoint_every,
         std::optional<int> keep_last, std::optional<std::string> resume,
         std::optional<int> threads_per_device, std::optional<std::string> schedule,
         std::optional<int> eval_every, int eval_batches, std::optional<std::string> log_dir,
         double timeout, std::optional<std::string> recompute) {
        if (!(timeout > 0))
          fail(ErrorKind::kInvalidArgument, "timeout= {}: must be > 0 seconds", timeout);
        if (micro_batches && *micro_batches < 1)
          fail(ErrorKind::kInvalidArgument, "micro_batches= {}: must be >= 1", *micro_batches);
        if (eval_batches < 1)
          fail(ErrorKind::kInvalidArgument, "eval_batches= {}: must be >= 1", eval_batches);
        for (const auto& [name, v] :
             {std::pair{"checkpoint_every", checkpoint_every}, std::pair{"keep_last", keep_last},
              std::pair{"eval_every", eval_every}}) {
          if (name == std::string_view("eval_every")) {
            if (v && *v < 1) fail(ErrorKind::kInvalidArgument, "{}= {}: must be >= 1", name, *v);
            continue;
          }
          if (v && *v < 1) fail(ErrorKind::kInvalidArgument, "{}= {}: must be >= 1", name, *v);
          if (v && !checkpoint) fail(ErrorKind::kInvalidArgument, "{}= needs checkpoint=", name);
        }
        const TrainDefaults defaults = train_defaults_from_json(m.model.train, m.model.source);
        std::optional<Checkpoint> resumed;
        if (resume == "auto") {
          // checkpoint's newest complete checkpoint if there is one; steps is the last step.
          if (!checkpoint) fail(ErrorKind::kInvalidArgument, "resume=\"auto\" needs checkpoint=");
          const auto complete = complete_checkpoints(output_target(*checkpoint));
          if (!complete.empty()) {
            resumed = read_checkpoint(complete.back());
            steps -= resumed->step;
          }
          if (steps <= 0) return py::module_::import("json").attr("loads")("{\"steps\": []}");
        } else if (resume) {
          resumed = read_checkpoint(resume_path(*resume));
        }
        const OptimizerOptions given = optimizer_options(optimizer);
        const ChosenMachine machine =
            machine_option(std::nullopt, model_device_count(m.model), threads_per_device, false);
        ModelRunOptions run = model_options(overlap, threads_per_device, machine);
        run.timeout = timeout_of_seconds(timeout);
        TrainOptions o{.run = run,
                       .steps = steps,
                       .optimizer = resolve_optimizer(
                           given,
                           resumed ? resumed_defaults(*resumed, given, defaults.optimizer,
                                                      OptionStyle::kKeyword)
                                   : defaults.optimizer,
                           OptionStyle::kKeyword),
                       .micro_batches = micro_batches.value_or(defaults.micro_batches.value_or(1)),
                       .schedule = resolve_schedule(schedule, defaults),
                       .zero = resolve_zero(zero, defaults, OptionStyle::kKeyword),
                       .recompute = resolve_recompute(recompute, defaults),
                       .allow_nonfinite = allow_nonfinite,
                       .check = check,
                       .eval_every = eval_every.value_or(0),
                       .eval_batches = eval_batches};
        if (log_dir) o.log_dir = *log_dir;
        if (checkpoint) {
          o.checkpoint = CheckpointOptions{.dir = output_target(*checkpoint),
                                           .every = checkpoint_every.value_or(0),
                                           .keep_last = keep_last.value_or(0)};
        }
        if (resumed) o.resume = resumed->path;
        std::string report;
        {
          py::gil_scoped_release release;
          const TrainReport r = train_model(m.model, o);
          report = shared_report(to_json(r).dump(), r.reporter);
        }
        return py::module_::import("json").attr("loads")(report);
      });
  module.def(
      "generate_model",
      [](const LoadedModel& m, const std::string& weights, const py::object& prompt,
         int max_new_tokens, int num_samples, double temperature, std::optional<int> top_k,
         std::optional<double> top_p, std::uint64_t seed, const std::vector<std::string>& stop,
         std::optional<std::string> tokenizer_dir, bool cache) {
        GenerateOptions o{
            .weights = weights,
            .max_new_tokens = max_new_tokens,
            .num_samples = num_samples,
            .sampling = {.temperature = temperature, .top_k = top_k, .top_p = top_p, .seed = seed},
            .cache = cache};
        o.run.backend = detect_backend();
        for (const std::string& s : stop)
          if (s.empty()) fail(ErrorKind::kInvalidArgument, "stop= holds an empty string");
        std::optional<Tokenizer> tok;
        if (tokenizer_dir) tok = Tokenizer::load(*tokenizer_dir);
        if (py::isinstance<py::str>(prompt)) {
          if (!tok)
            fail(ErrorKind::kInvalidArgument,
                 "prompt= is text but no tokenizer= is given (or give a list of ids)");
          o.prompt = tok->encode(prompt.cast<std::string>());
        } else {
          o.prompt = prompt.cast<std::vector<std::int64_t>>();
        }
        if (tok) o.tokenizer_vocabulary = tok->vocab_size();
        std::vector<TextStream> texts(static_cast<std::size_t>(std::max(1, num_samples)),
                                      TextStream{.tokenizer = tok ? &*tok : nullptr});
        std::string report;
        {
          py::gil_scoped_release release;
          const GenerateReport r = generate(m.model, o, [&](int sample, std::int64_t id) {
            TextStream& t = texts[static_cast<std::size_t>(sample)];
            push_token(t, id);
            return ends_with_any(t, stop);
          });
          report = shared_report(generation_json(r, o.prompt, texts).dump(), r.reporter);
        }
        return py::module_::import("json").attr("loads")(report);
      });
  module.def("data_prepare", [](const std::vector<std::string>& text, const std::string& out,
                                const std::string& tokenizer, std::int64_t vocab_size,
                                double val_fraction, std::optional<std::string> separator) {
    if (tokenizer != "bytes" && tokenizer != "bpe")
      fail(ErrorKind::kInvalidArgument, "tokenizer= \"{}\": must be \"bytes\" or \"bpe\"",
           tokenizer);
    PrepareOptions o{.out = out,
                     .tokenizer = tokenizer == "bpe" ? TokenizerKind::kBpe : TokenizerKind::kBytes,
                     .vocab_size = vocab_size,
                     .val_fraction = val_fraction,
                     .separator = std::move(separator)};
    for (const std::string& t : text) o.text.emplace_back(t);
    PrepareReport r;
    {
      py::gil_scoped_release release;
      r = prepare_data(o);
    }
    py::dict d;
    d["train_tokens"] = r.train_tokens;
    d["val_tokens"] = r.val_tokens;
    d["bytes_per_token"] = r.bytes_per_token();
    return d;
  });
  module.def("data_encode", [](const std::string& dir, const py::bytes& text) {
    return Tokenizer::load(dir).encode(std::string(text));
  });
  module.def("data_decode", [](const std::string& dir, const std::vector<std::int64_t>& ids) {
    return py::bytes(Tokenizer::load(dir).decode(ids));
  });
  module.def(
      "data_batches", [](const LoadedModel& m, int first, int last, const std::string& split) {
        if (split != "train" && split != "val")
          fail(ErrorKind::kInvalidArgument, "split= \"{}\": must be \"train\" or \"val\"", split);
        if (first < 1 || last < first)
          fail(ErrorKind::kInvalidArgument, "steps= ({}, {}): must be (a, b) with 1 <= a <= b",
               first, last);
        const std::optional<ModelData> data = read_model_data(m.model);
        if (!data) {
          fail(ErrorKind::kInvalidArgument,
               "{}: the model has no \"data\" object to read batches of", m.model.source);
        }
        if (split == "val" && !data->spec.val)
          fail(ErrorKind::kInvalidArgument, "split= \"val\": the model's data has no val split");
        GlobalBatches batches(*data, {});
        py::list out;
        for (int t = first; t <= last; ++t) {
          py::dict batch;
          for (auto& [name, tensor] : batches.at(t, split == "val"))
            batch[py::str(name)] = to_numpy(std::move(tensor));
          out.append(batch);
        }
        return out;
      });
  module.def("explain_model", [](const LoadedModel& m, bool overlap, const py::dict& optimizer,
                                 std::optional<int> micro_batches, std::optional<int> zero,
                                 std::optional<int> threads_per_device,
                                 std::optional<std::string> schedule,
                                 std::optional<std::string> recompute,
                                 std::optional<std::string> machine) {
    if (micro_batches && *micro_batches < 1)
      fail(ErrorKind::kInvalidArgument, "micro_batches= {}: must be >= 1", *micro_batches);
    const TrainDefaults defaults = train_defaults_from_json(m.model.train, m.model.source);
    const Optimizer o =
        resolve_optimizer(optimizer_options(optimizer), defaults.optimizer, OptionStyle::kKeyword);
    const int m_batches = micro_batches.value_or(defaults.micro_batches.value_or(1));
    const int zero_level = resolve_zero(zero, defaults, OptionStyle::kKeyword);
    const Recompute policy = resolve_recompute(recompute, defaults);
    const ChosenMachine chosen =
        machine_option(machine, model_device_count(m.model), threads_per_device, true);
    Explanation e = explain_compiled(
        m.model.pcg, {.plan = {.machine = &chosen.machine},
                      .overlap = overlap,
                      .decompose = {.shared_memory = session().backend() == Backend::kThreads},
                      .update = o.rule,
                      .micro_batches = m_batches,
                      .zero = zero_level,
                      .recompute = policy,
                      .threads_per_device = threads_option(threads_per_device)});
    const std::optional<ScheduleExplanation> stages = explain_model_schedule(
        m.model, model_options(overlap, threads_per_device, chosen),
        {.update = o.rule, .micro_batches = m_batches, .zero = zero_level, .recompute = policy},
        resolve_schedule(schedule, defaults));
    if (stages && stages->memory) e.memory = stages->memory;
    add_loader_memory(m.model, e);
    nlohmann::json j = to_json(e);
    j.update(to_json(stages));
    return json_to_python(j);
  });
  module.def(
      "autoshard", [](const std::string& path, std::optional<std::string> mesh,
                      std::optional<std::int64_t> memory_limit, std::optional<std::string> out,
                      const py::dict& optimizer, std::optional<int> zero,
                      std::optional<int> micro_batches, std::optional<std::string> machine,
                      std::optional<int> threads_per_device, std::optional<std::string> recompute) {
        if (memory_limit && *memory_limit < 1)
          fail(ErrorKind::kInvalidArgument, "memory_limit= {}: must be >= 1", *memory_limit);
        if (micro_batches && *micro_batches < 1)
          fail(ErrorKind::kInvalidArgument, "micro_batches= {}: must be >= 1", *micro_batches);
        const Model model = load_model(path);
        const TrainDefaults defaults = train_defaults_from_json(model.train, model.source);
        const ChosenMachine described =
            machine_option(machine, mesh ? size(parse_mesh(*mesh)) : model_device_count(model),
                           threads_per_device, true);
        AutoshardOptions o{.mesh = mesh,
                           .memory_limit = memory_limit,
                           .update = resolve_optimizer(optimizer_options(optimizer),
                                                       defaults.optimizer, OptionStyle::kKeyword)
                                         .rule,
                           .micro_batches = micro_batches,
                           .plan = {.machine = &described.machine},
                           .threads_per_device = threads_option(threads_per_device)};
        if (zero) o.zero = resolve_zero(zero, defaults, OptionStyle::kKeyword);
        if (recompute) o.recompute = parse_recompute(*recompute);
        const std::filesystem::path folder = std::filesystem::path(out ? *out : path).parent_path();
        AutoshardResult r;
        {
          py::gil_scoped_release release;
          r = autoshard(path, o, folder.empty() ? "." : folder);
          if (out) write_file_atomic(*out, r.model.dump(2) + "\n");
        }
        return json_to_python(to_json(r));
      });
  module.def("list_checkpoints", [](const std::string& dir, bool verify) {
    return json_to_python(list_checkpoints(dir, verify));
  });
  module.def("op_arity", [](const std::string& name) { return arity(parse_op_type(name)); });
  module.def("normalize_placements",
             [](const std::string& text) { return to_string(parse_placements(text)); });
  module.def("plan", [](std::vector<std::int64_t> shape, const DeviceMesh& mesh,
                        const std::string& from, const std::string& to,
                        std::optional<DeviceMesh> to_mesh, const std::string& dtype) {
    const DType dt = parse_dtype(dtype);
    const Layout a = make_layout(mesh, parse_placements(from), shape, dt);
    const Layout b = make_layout(to_mesh ? *to_mesh : mesh, parse_placements(to), shape, dt);
    return json_to_python(to_json(plan_redistribute(a, b)));
  });
}
