// Reading model files into the builder, field by field, every error naming its field.
#include "meshflow/graph/model_file.h"

#include <fmt/format.h>

#include <algorithm>
#include <set>

#include "meshflow/core/error.h"
#include "meshflow/core/file.h"
#include "meshflow/core/json_field.h"
#include "meshflow/core/limits.h"
#include "meshflow/graph/source.h"

namespace meshflow {

namespace {

constexpr std::int64_t kMaxDim = std::int64_t{1} << 40;

void only_keys(const JsonField& f, std::initializer_list<std::string_view> allowed,
               std::string_view what) {
  for (const auto& [key, value] : f.value().items()) {
    bool ok = false;
    for (std::string_view a : allowed) ok = ok || a == key;
    if (!ok) {
      f.reject(fmt::format("({}) has unknown field \"{}\" (allowed: {})", what, key,
                           fmt::join(allowed, ", ")));
    }
  }
}

std::vector<int> int_list(const JsonField& f) {
  std::vector<int> out;
  for (std::size_t i = 0; i < f.size(); ++i)
    out.push_back(static_cast<int>(f.at(i).as_int(-64, 64)));
  return out;
}

std::vector<Placement> placements_of(const JsonField& f) {
  std::vector<Placement> out;
  for (std::size_t i = 0; i < f.size(); ++i) {
    const JsonField p = f.at(i);
    try {
      out.push_back(parse_placement(p.as_string()));
    } catch (const Error& e) {
      p.reject(fmt::format("is not a placement: {}", e.what()));
    }
  }
  return out;
}

struct Reader {
  std::filesystem::path base;
  std::string source;
  Model model;

  const DeviceMesh& mesh(const JsonField& f) const {
    const std::string name = f.as_string();
    auto it = model.meshes.find(name);
    if (it == model.meshes.end()) {
      std::vector<std::string> known;
      for (const auto& [k, v] : model.meshes) known.push_back(k);
      f.reject(fmt::format("names mesh \"{}\", which \"meshes\" does not define (it has: {})", name,
                           fmt::join(known, ", ")));
    }
    return it->second;
  }

  Source source_of(const JsonField& f) const {
    if (f.value().is_string()) {
      Source s;
      s.path = base / f.as_string();
      s.kind = std::filesystem::is_directory(s.path) ? Source::Kind::kFolder : Source::Kind::kNpy;
      return s;
    }
    if (!f.value().is_object()) f.reject("must be a file or folder path or an initialiser object");
    Source s;
    if (auto d = f.find("data")) {
      only_keys(f, {"data", "shift"}, "a data input");
      s.kind = Source::Kind::kData;
      s.data = d->as_string();
      if (s.data.empty()) d->reject("must name \"window\" or a sample array");
      if (auto k = f.find("shift")) s.shift = k->as_int(0, std::int64_t{1} << 40);
      return s;
    }
    if (auto n = f.find("normal")) {
      only_keys(f, {"normal", "seed"}, "an initialiser");
      s.kind = Source::Kind::kNormal;
      s.a = n->as_number(0, 1e30);
    } else if (auto u = f.find("uniform")) {
      only_keys(f, {"uniform", "seed"}, "an initialiser");
      s.kind = Source::Kind::kUniform;
      if (u->size() != 2) u->reject("must be [lo, hi]");
      s.a = u->at(0).as_number(-1e30, 1e30);
      s.b = u->at(1).as_number(s.a, 1e30);
    } else if (auto z = f.find("zeros")) {
      only_keys(f, {"zeros"}, "an initialiser");
      if (z->value() != true) z->reject("must be true");
      s.kind = Source::Kind::kZeros;
      return s;
    } else {
      f.reject(
          "must be {\"normal\": std, \"seed\": s}, {\"uniform\": [lo, hi], \"seed\": s} or "
          "{\"zeros\": true}");
    }
    s.seed = static_cast<std::uint64_t>(f.member("seed").as_int(0, std::int64_t{1} << 62));
    return s;
  }

  void tensor(const std::string& name, const JsonField& t) {
    only_keys(t, {"shape", "dtype", "input", "weight", "mesh", "placements", "batch"}, "a tensor");
    TensorSpec spec;
    const JsonField shape = t.member("shape");
    for (std::size_t i = 0; i < shape.size(); ++i)
      spec.shape.push_back(shape.at(i).as_int(0, kMaxDim));
    if (auto d = t.find("dtype")) {
      try {
        spec.dtype = parse_dtype(d->as_string());
      } catch (const Error& e) {
        d->reject(fmt::format("is not a dtype: {}", e.what()));
      }
    }
    const auto input = t.find("input");
    const auto weight = t.find("weight");
    if (input.has_value() == weight.has_value())
      t.reject("must have exactly one of \"input\" and \"weight\"");
    Source src = source_of(input ? *input : *weight);
    if (src.kind == Source::Kind::kData) {
      if (!input) weight->reject("is a data input: a weight is initialised, not read from data");
      if (data_ == nullptr) input->reject("reads data, but the model has no \"data\" object");
      if (auto b = t.find("batch"))
        b->reject("cannot be set on a data input (its rows are the batch)");
    }
    const DeviceMesh& m = mesh(t.member("mesh"));
    std::vector<Placement> ps = placements_of(t.member("placements"));
    const ValueId id = input ? add_input(model.pcg, name, spec, m, ps, std::move(src))
                             : add_weight(model.pcg, name, spec, m, ps, std::move(src));
    if (auto b = t.find("batch")) {
      if (!input) b->reject("applies to inputs only (a weight is never split into micro-batches)");
      model.pcg.nodes[static_cast<std::size_t>(id)].batch = b->as_bool();
    }
    const Node& n = model.pcg.nodes[static_cast<std::size_t>(id)];
    check_source(n, make_layout(*n.mesh, *n.placements, n.spec.shape, n.spec.dtype));
  }

  ValueId value(const JsonField& f, const std::string& node) const {
    const std::string name = f.as_string();
    auto it = model.pcg.names.find(name);
    if (it == model.pcg.names.end()) {
      fail(ErrorKind::kInvalidArgument,
           "{}: node \"{}\" reads \"{}\", which is no tensor and no earlier node", source, node,
           name);
    }
    return it->second;
  }

  void node(const JsonField& f) {
    only_keys(f,
              {"name", "op", "inputs", "dims", "dim", "shape", "eps", "causal", "degree", "mesh",
               "placements", "checkpoint", "approximate", "start", "end", "weight"},
              "a node");
    const std::string name = f.member("name").as_string();
    const std::string op_name = f.member("op").as_string();
    const JsonField inputs_field = f.member("inputs");
    std::vector<ValueId> inputs;
    for (std::size_t i = 0; i < inputs_field.size(); ++i)
      inputs.push_back(value(inputs_field.at(i), name));
    std::optional<DeviceMesh> m;
    if (auto mf = f.find("mesh")) m = mesh(*mf);
    std::optional<std::vector<Placement>> ps;
    if (auto pf = f.find("placements")) ps = placements_of(*pf);
    const bool checkpoint = f.find("checkpoint") ? f.member("checkpoint").as_bool() : false;
    if (auto type = parse_parallel_type(op_name)) {
      ParallelOp p{.type = *type,
                   .degree = static_cast<int>(f.member("degree").as_int(1, 1 << 20))};
      const bool has_dim = *type == ParallelType::kRepartition || *type == ParallelType::kCombine;
      if (has_dim) p.dim = static_cast<int>(f.member("dim").as_int(-64, 64));
      if (inputs.size() != 1) inputs_field.reject(fmt::format("must name one value ({})", op_name));
      if (!ps)
        fail(ErrorKind::kInvalidArgument, "{}: node \"{}\" ({}) needs \"placements\"", source, name,
             op_name);
      model.pcg.nodes[static_cast<std::size_t>(add_parallel(model.pcg, name, p, inputs[0], m, *ps))]
          .checkpoint = checkpoint;
      return;
    }
    Op op;
    try {
      op.type = parse_op_type(op_name);
    } catch (const Error&) {
      fail(ErrorKind::kInvalidArgument, "{}: node \"{}\" has unknown op \"{}\"", source, name,
           op_name);
    }
    if (op.type >= OpType::kMatmulGradA) {
      fail(ErrorKind::kInvalidArgument,
           "{}: node \"{}\": \"{}\" is a gradient operator, which backward adds by itself", source,
           name, op_name);
    }
    if (auto d = f.find("dims")) op.dims = int_list(*d);
    if (auto d = f.find("dim")) op.dim = static_cast<int>(d->as_int(-64, 64));
    if (auto e = f.find("eps")) op.eps = e->as_number(1e-30, 1.0);
    if (auto c = f.find("causal")) op.causal = c->as_bool();
    if (auto a = f.find("approximate")) {
      const std::string form = a->as_string();
      if (op.type != OpType::kGelu) a->reject("is gelu's (\"none\" or \"tanh\")");
      if (form != "none" && form != "tanh") a->reject("must be \"none\" or \"tanh\"");
      op.approximate_tanh = form == "tanh";
    }
    if (auto w = f.find("weight")) {
      const std::string form = w->as_string();
      if (op.type != OpType::kLinear) w->reject("is linear's (\"in_out\" or \"out_in\")");
      if (form != "in_out" && form != "out_in") w->reject("must be \"in_out\" or \"out_in\"");
      op.weight_out_in = form == "out_in";
    }
    if (op.type == OpType::kSlice) {
      op.dim = static_cast<int>(f.member("dim").as_int(-64, 64));
      op.start = f.member("start").as_int(-kMaxDim, kMaxDim);
      op.end = f.member("end").as_int(-kMaxDim, kMaxDim);
    } else {
      for (const char* key : {"start", "end"})
        if (auto k = f.find(key)) k->reject("is slice's");
    }
    if (auto d = f.find("shape")) {
      for (std::size_t i = 0; i < d->size(); ++i)
        op.shape.push_back(d->at(i).as_int(-1, kMaxTensorBytes));
    }
    const ValueId id =
        add_compute(model.pcg, name, op, std::move(inputs), std::move(m), std::move(ps));
    model.pcg.nodes[static_cast<std::size_t>(id)].checkpoint = checkpoint;
  }

  const nlohmann::json* data_ = nullptr;

  void read(const JsonField& top) {
    only_keys(top, {"meshes", "tensors", "nodes", "loss", "outputs", "train", "data", "generate"},
              "a model");
    if (auto d = top.find("data")) {
      if (!d->value().is_object())
        d->reject("must be an object with \"train\" (and \"val\", \"order\", \"seed\")");
      model.data = d->value();
      data_ = &model.data;
    }
    if (auto g = top.find("generate")) {
      if (!g->value().is_object())
        g->reject("must be an object {\"tokens\": ..., \"logits\": ...}");
      model.generate = g->value();
    }
    if (auto t = top.find("train")) {
      if (!t->value().is_object()) t->reject("must be an object of training options");
      model.train = t->value();
    }
    const JsonField meshes = top.member("meshes");
    if (!meshes.value().is_object()) meshes.reject("must be an object of name: mesh");
    for (const auto& [name, text] : meshes.value().items()) {
      const JsonField mf = meshes.member(name);
      try {
        model.meshes[name] = parse_mesh(mf.as_string());
      } catch (const Error& e) {
        mf.reject(fmt::format("is not a mesh: {}", e.what()));
      }
    }
    const JsonField tensors = top.member("tensors");
    if (!tensors.value().is_object()) tensors.reject("must be an object of name: tensor");
    for (const auto& [name, t] : tensors.value().items()) tensor(name, tensors.member(name));
    const JsonField nodes = top.member("nodes");
    for (std::size_t i = 0; i < nodes.size(); ++i) node(nodes.at(i));
    if (auto l = top.find("loss")) set_loss(model.pcg, value(*l, "loss"));
    if (auto o = top.find("outputs")) {
      for (std::size_t i = 0; i < o->size(); ++i) add_output(model.pcg, value(o->at(i), "outputs"));
    }
  }
};

}  // namespace

Model parse_model(std::string_view text, const std::filesystem::path& base,
                  std::string_view source) {
  const nlohmann::json json = parse_json(text, source);
  Reader r{.base = base, .source = std::string(source)};
  try {
    r.read(JsonField(json, std::string(source), ErrorKind::kInvalidArgument));
  } catch (const Error& e) {
    if (std::string_view(e.what()).starts_with(source)) throw;
    fail(e.kind(), "{}: {}", source, e.what());
  }
  verify(r.model.pcg, Stage::kBuilt);
  r.model.source = std::string(source);
  r.model.base = base;
  return std::move(r.model);
}

int model_device_count(const Model& model) {
  std::set<DeviceId> devices;
  auto add = [&](const DeviceMesh& mesh) {
    devices.insert(mesh.devices.begin(), mesh.devices.end());
  };
  for (const auto& [name, mesh] : model.meshes) add(mesh);
  // A model built in code names no meshes: its nodes' pins do.
  for (const Node& n : model.pcg.nodes) {
    if (n.layout) add(n.layout->mesh);
    if (n.mesh) add(*n.mesh);
  }
  return std::max(1, static_cast<int>(devices.size()));
}

Model load_model(const std::filesystem::path& path) {
  const std::string text = read_file(path);
  return parse_model(text, path.parent_path(), path.string());
}

}  // namespace meshflow
