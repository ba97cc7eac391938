"""Models from PyTorch (docs/torch.md): ``from_torch`` turns an ``nn.Module`` into a model file,
placed by a DTensor-style plan or by autoshard; ``to_torch_state_dict`` gives the trained weights
back under the module's own names.

Nothing in meshflow's C++ library depends on torch; this module imports it when called.
"""
import fnmatch
import inspect
import json
import os
import pathlib
import re
import tempfile

import numpy as np

from ._meshflow import InvalidArgumentError

STYLES = ("colwise", "rowwise", "vocab", "sequence", "replicate")


def _fail(message):
    raise InvalidArgumentError(message)


def _write_atomic(path, data):
    path = pathlib.Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    os.replace(tmp, path)


def _save_npy(path, array):
    import io
    buf = io.BytesIO()
    np.save(buf, np.ascontiguousarray(array))
    _write_atomic(path, buf.getvalue())


def _mesh_shape(mesh):
    try:
        shape = [int(x) for x in str(mesh).split("x")]
    except ValueError:
        shape = []
    if not shape or any(s < 1 for s in shape) or len(shape) > 2:
        _fail(f"mesh {mesh!r}: give a 1-d or 2-d mesh shape such as \"4\" or \"2x2\"")
    return shape


class _Wrapped:
    """A module with its loss callable: traced as one, its paths under the module's own."""

    def __init__(self, module, loss, n_forward):
        import torch

        class WithLoss(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.m = module

            def forward(self, *args):
                out = module(*args[:n_forward])
                return loss(out, *args), out

        self.module = WithLoss()


def _strip(name, prefix):
    """`name` under the traced wrapper ("m", "m.x.y") as the module names it ("", "x.y")."""
    if not prefix:
        return name
    if name == prefix.rstrip("."):
        return ""
    return name[len(prefix):] if name.startswith(prefix) else name


def _read_module(module, example_inputs, loss):
    """Traces the module (with its loss callable) into a Graph; returns (graph, names of the
    forward's inputs, the module path prefix of the trace)."""
    from . import _torch_trace

    args = list(example_inputs)
    params = [p for p in inspect.signature(module.forward).parameters.values()
              if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    n_forward = min(len(args), len(params))
    names = [p.name for p in params[:n_forward]]
    prefix = ""
    traced = module
    if callable(loss):
        lp = list(inspect.signature(loss).parameters)[1:]
        names += [lp[i] if i < len(lp) else f"input{i}" for i in range(n_forward, len(args))]
        traced = _Wrapped(module, loss, n_forward).module
        prefix = "m."
    elif len(args) > n_forward:
        _fail(f"example_inputs has {len(args)} tensors; forward takes {n_forward} (give a loss "
              "callable to read the others)")
    tracer, out = _torch_trace.trace(traced, args, names)
    g = tracer.g
    g.weight_names = {_strip(k, prefix): [_strip(n, prefix) for n in v]
                      for k, v in g.weight_names.items()}
    renamed = {k: _strip(k, prefix) for k in g.tensors}
    g.tensors = {renamed[k]: v for k, v in g.tensors.items()}
    g.arrays = {renamed.get(k, k): v for k, v in g.arrays.items()}
    for n in g.nodes:
        n["inputs"] = [renamed.get(i, i) for i in n["inputs"]]
        n["module"] = _strip(n["module"], prefix)
        if "split" in n:
            n["split"]["of"] = renamed.get(n["split"]["of"], n["split"]["of"])
    outs = _torch_trace.flatten_outputs(out)
    named = [v for v in outs if v.name is not None]
    scalars = [v for v in named if v.value.dim() == 0 and v.value.is_floating_point()]
    if not scalars:
        _fail("the module returns no scalar loss (give loss= a callable of its outputs)")
    g.loss = renamed.get(scalars[0].name, scalars[0].name)
    g.outputs = [renamed.get(v.name, v.name) for v in named if v.name != scalars[0].name]
    g.outputs = [o for o in g.outputs if o not in g.tensors or g.tensors[o]["kind"] != "input"]
    _torch_trace.eliminate_dead(g)
    return g, names, tracer


def _module_kinds(module):
    import torch
    kinds = {}
    for path, m in module.named_modules():
        kinds[path] = ("linear" if isinstance(m, torch.nn.Linear) else
                       "embedding" if isinstance(m, torch.nn.Embedding) else
                       "layer_norm" if isinstance(m, torch.nn.LayerNorm) else "other")
    return kinds


def _styles(plan, module):
    """Each module path's style: the first plan pattern that matches it."""
    kinds = _module_kinds(module)
    paths = [p for p in kinds if p]
    styles = {}
    for pattern, style in plan.items():
        if style not in STYLES:
            _fail(f"plan {pattern!r}: style {style!r} is not one of {', '.join(STYLES)}")
        matched = [p for p in paths if fnmatch.fnmatchcase(p, pattern)]
        if not matched:
            _fail(f"plan {pattern!r}: names no module of the model (its modules: "
                  f"{', '.join(paths[:8])}{', ...' if len(paths) > 8 else ''})")
        for p in matched:
            if p in styles:
                continue
            kind = kinds[p]
            ok = (style == "replicate" or (style in ("colwise", "rowwise") and kind == "linear")
                  or (style in ("colwise", "vocab") and kind == "embedding")
                  or (style == "sequence" and kind == "layer_norm"))
            if not ok and kind != "other":
                _fail(f"plan {pattern!r}: {style} does not apply to {p} "
                      f"({type(dict(module.named_modules())[p]).__name__})")
            if ok:
                styles[p] = style
    return styles


def _part_order(width, parts, degree):
    """The rows of a fused product of `parts` even parts split over `degree` devices, in the
    order that gives each device its block of every part: device d's q block, k block, ..."""
    part = width // parts
    local = part // degree
    return np.concatenate([np.arange(p * part + d * local, p * part + (d + 1) * local)
                           for d in range(degree) for p in range(parts)])


class _Placer:
    """Places a Graph on a mesh: the data split over the data-parallel dims, each planned
    module's weights and result split over the tensor-parallel dim (DTensor's styles)."""

    def __init__(self, g, mesh_shape, plan_styles):
        self.g = g
        self.shape = mesh_shape
        self.tp = len(mesh_shape) - 1 if plan_styles else None
        self.dp = [d for d in range(len(mesh_shape)) if d != self.tp]
        self.n = mesh_shape[self.tp] if self.tp is not None else 1
        self.styles = plan_styles or {}
        self.sequence = "sequence" in self.styles.values()
        self.placements = {}  # tensor -> placements
        self.pins = {}  # node -> placements
        self.permutations = []

    def layout(self, rank, tp=None, batch=True):
        p = ["R"] * len(self.shape)
        for d in self.dp:
            if batch and rank > 0:
                p[d] = "S(0)"
        if self.tp is not None and tp is not None:
            p[self.tp] = tp
        return p

    def place_weight(self, name, tp, who):
        p = self.layout(0, tp, batch=False)
        old = self.placements.get(name)
        if old is not None and old != p:
            _fail(f"tied weight {name}: {who} places it {p}, another use {old}")
        self.placements[name] = p

    def check(self, who, style, what, size):
        if size % self.n:
            _fail(f"plan: {who} is {style}, which splits its {what} {size} over {self.n} "
                  f"devices (not a multiple)")

    def run(self):
        g = self.g
        for name, t in g.tensors.items():
            if t["kind"] == "input":
                for d in self.dp:
                    if t["shape"][0] % self.shape[d]:
                        _fail(f"input {name}: batch {t['shape'][0]} does not split over "
                              f"{self.shape[d]} data-parallel devices")
                self.placements[name] = self.layout(len(t["shape"]))
            elif t["kind"] == "const":
                self.placements[name] = self.layout(0, batch=False)
        for n in g.nodes:
            style = self.styles.get(n["module"])
            if style is not None and style != "replicate":
                self.place(n, style)
        for name, t in g.tensors.items():
            if t["kind"] == "weight" and name not in self.placements:
                self.placements[name] = self.layout(0, batch=False)
        self.permute_splits()

    def place(self, n, style):
        who = n["module"]
        rank = len(n["_shape"])
        rows = "S(1)" if self.sequence else "R"
        if n["op"] == "linear":
            w = self.g.tensors[n["inputs"][1]]["shape"]
            if style == "colwise":
                self.check(who, style, "out_features", w[0])
                self.place_weight(n["inputs"][1], "S(0)", who)
                if len(n["inputs"]) > 2:
                    self.place_weight(n["inputs"][2], "S(0)", who)
                self.pins[n["name"]] = self.layout(rank, f"S({rank - 1})")
            else:
                self.check(who, style, "in_features", w[1])
                self.place_weight(n["inputs"][1], "S(1)", who)
                if len(n["inputs"]) > 2:
                    self.place_weight(n["inputs"][2], "R", who)
                self.pins[n["name"]] = self.layout(rank, rows if rank >= 3 else "R")
        elif n["op"] == "embedding":
            table = self.g.tensors[n["inputs"][1]]["shape"]
            if style == "vocab":
                self.check(who, style, "num_embeddings", table[0])
                self.place_weight(n["inputs"][1], "S(0)", who)
                self.pins[n["name"]] = self.layout(rank, rows if rank >= 3 else "R")
            else:
                self.check(who, style, "embedding_dim", table[1])
                self.place_weight(n["inputs"][1], "S(1)", who)
                self.pins[n["name"]] = self.layout(rank, f"S({rank - 1})")
        elif n["op"] == "layer_norm" and style == "sequence":
            if rank < 3:
                _fail(f"plan: {who} is sequence, but its input has no sequence dim")
            self.check(who, style, "sequence length", n["_shape"][1])
            self.pins[n["name"]] = self.layout(rank, "S(1)")

    def permute_splits(self):
        """A colwise product read only by an even split on its last dim: its rows permuted so
        each device holds whole parts (q, k and v heads), the split read through a reshape."""
        g = self.g
        readers = {}
        for n in g.nodes:
            for i in n["inputs"]:
                readers.setdefault(i, []).append(n)
        for n in list(g.nodes):
            if n["op"] != "linear" or self.n == 1 or self.styles.get(n["module"]) != "colwise":
                continue
            rs = readers.get(n["name"], [])
            rank = len(n["_shape"])
            if not rs or any("split" not in r or r["dim"] != rank - 1 for r in rs):
                continue
            parts = rs[0]["split"]["parts"]
            width = n["_shape"][-1]
            if width % parts or any(r["end"] - r["start"] != width // parts for r in rs) or \
                    (width // parts) % self.n:
                continue
            part = width // parts
            local = part // self.n
            perm = _part_order(width, parts, self.n)
            for t in n["inputs"][1:]:
                g.arrays[t] = g.arrays[t][perm]
            self.permutations.append({"tensors": n["inputs"][1:], "parts": parts,
                                      "degree": self.n})
            mid = n["_shape"][1:-1]
            grouped = f"{n['name']}_parts"
            at = g.nodes.index(n) + 1
            g.nodes.insert(at, {"name": grouped, "op": "reshape", "inputs": [n["name"]],
                                "shape": [-1, *mid, self.n, parts, local],
                                "module": n["module"], "_shape": [*n["_shape"][:-1], self.n,
                                                                  parts, local]})
            for r in rs:
                k = r["start"] // part
                idx = g.nodes.index(r)
                piece = f"{r['name']}_piece"
                g.nodes[idx:idx + 1] = [
                    {"name": piece, "op": "slice", "inputs": [grouped], "dim": rank,
                     "start": k, "end": k + 1, "module": r["module"]},
                    {"name": r["name"], "op": "reshape", "inputs": [piece],
                     "shape": [-1, *mid, part], "module": r["module"]}]


def from_torch(module, example_inputs, loss=None, mesh="1", plan=None, data=None, out=None):
    """Converts ``module`` into a meshflow model file at ``out`` (docs/torch.md); returns the
    loaded ``meshflow.Model``.

    ``example_inputs``: the tensors of one call (``module(*example_inputs)``), whose shapes the
    model file keeps. ``loss``: None takes the first scalar the module returns; a callable
    ``loss(outputs, *example_inputs)`` computes it (inputs beyond the forward's take the
    callable's parameter names). ``mesh``: "4", "2x2". ``plan``: None is data parallel on every
    mesh dim; a dict of module-path glob patterns to "colwise", "rowwise", "vocab",
    "sequence" or "replicate" (the first matching pattern wins) is tensor parallel on the
    mesh's last dim, data parallel on the other; "auto" lets autoshard choose. ``data``: forward
    argument names to data inputs ({"idx": {"data": "window"}, ...}) plus "data": the model
    file's "data" object (paths relative to the current folder)."""
    if out is None:
        _fail("from_torch: out= names the model file to write")
    out = pathlib.Path(out)
    shape = _mesh_shape(mesh)
    if plan is not None and plan != "auto" and not isinstance(plan, dict):
        _fail(f"plan {plan!r}: give None, \"auto\" or a dict of module patterns to styles")
    was_training = module.training
    module.train()
    try:
        g, names, _ = _read_module(module, example_inputs, loss)
    finally:
        module.train(was_training)
    _annotate_shapes(g)
    styles = _styles(plan, module) if isinstance(plan, dict) else None
    if styles is not None and len(shape) == 1 and shape[0] == 1:
        styles = None
    placer = _Placer(g, shape, styles)
    placer.run()
    model = _model_object(g, placer, shape, names, data, out)
    weights_dir = out.parent / f"{out.stem}.weights"
    for name, spec in model["tensors"].items():
        if isinstance(spec.get("input"), str) or "weight" in spec:
            src = spec.get("weight", spec.get("input"))
            _save_npy(out.parent / src, g.arrays[name])
    state = module.state_dict()
    buffers = {}
    params = {n for names_ in g.weight_names.values() for n in names_}
    for key, value in state.items():
        if key not in params:
            buffers[key] = f"{weights_dir.name}/buffer.{key}.npy"
            _save_npy(out.parent / buffers[key], value.detach().cpu().numpy())
    sidecar = {"format": 1, "order": list(state.keys()), "weights": g.weight_names,
               "buffers": buffers, "permutations": placer.permutations,
               "dtypes": {k: str(v.dtype).replace("torch.", "") for k, v in state.items()}}
    _write_atomic(out.parent / f"{out.stem}.torch.json",
                  (json.dumps(sidecar, indent=1) + "\n").encode())
    _write_atomic(out, _model_text(model).encode())
    if plan == "auto":
        from .model import autoshard
        autoshard(out, mesh=mesh, out=out)
    from .model import Model
    return Model.load(out)


def _annotate_shapes(g):
    """g.shapes: every tensor's and node's shape (the tracer records each node's "_shape")."""
    g.shapes = {k: list(v["shape"]) for k, v in g.tensors.items()}
    g.shapes.update({n["name"]: n["_shape"] for n in g.nodes})


def _model_object(g, placer, shape, names, data, out):
    mesh_text = "x".join(str(s) for s in shape)
    weights_dir = f"{out.stem}.weights"
    tensors = {}
    data_object = None
    data_inputs = {}
    if data is not None:
        data = dict(data)
        data_object = data.pop("data", None)
        if data_object is None:
            _fail("data= needs a \"data\" key: the model file's \"data\" object")
        for k in data:
            if k not in names:
                _fail(f"data= maps {k!r}, which is not an input (inputs: {', '.join(names)})")
        data_inputs = data
        data_object = dict(data_object)
        for split in ("train", "val"):
            if isinstance(data_object.get(split), str):
                data_object[split] = os.path.relpath(os.path.abspath(data_object[split]),
                                                     os.path.abspath(out.parent))
    for name, t in g.tensors.items():
        spec = {"shape": t["shape"], "dtype": t["dtype"]}
        if t["kind"] == "weight":
            spec["weight"] = f"{weights_dir}/{name}.npy"
        elif name in data_inputs:
            spec["input"] = data_inputs[name]
        else:
            spec["input"] = f"{weights_dir}/{name}.npy"
        spec["mesh"] = "m"
        spec["placements"] = placer.placements[name]
        if t["kind"] == "const":
            spec["batch"] = False
        tensors[name] = spec
    nodes = []
    for n in g.nodes:
        node = {k: v for k, v in n.items()
                if k not in ("module", "kind", "split", "_shape")}
        if n["name"] in placer.pins:
            node["placements"] = placer.pins[n["name"]]
        nodes.append(node)
    model = {"meshes": {"m": mesh_text}, "tensors": tensors, "nodes": nodes, "loss": g.loss,
             "outputs": [g.loss] + [o for o in g.outputs if o != g.loss]}
    if data_object is not None:
        model = {"data": data_object, **model}
    gen = _generate_object(g, names)
    if gen is not None:
        model["generate"] = gen
    return model


def _generate_object(g, names):
    """{"tokens", "logits"} where the module is a language model: an integer [B, S] input read
    by an embedding, and an output of logits [B, S, V]."""
    shapes = g.shapes
    tokens = [n for n in names if n in g.tensors and g.tensors[n]["dtype"] in ("int64", "int32")
              and len(g.tensors[n]["shape"]) == 2
              and any(x["op"] == "embedding" and x["inputs"][0] == n for x in g.nodes)]
    if not tokens:
        return None
    b, s = g.tensors[tokens[0]]["shape"]
    for o in g.outputs:
        shape = shapes.get(o, [])
        if len(shape) == 3 and shape[:2] == [b, s]:
            return {"tokens": tokens[0], "logits": o}
    return None


def _model_text(m):
    """One tensor or node per line, as examples/models/gpt/make_gpt.py writes them."""
    lines = ["{"]
    if "data" in m:
        lines.append(f'  "data": {json.dumps(m["data"])},')
    lines += [f'  "meshes": {json.dumps(m["meshes"])},', '  "tensors": {']
    lines += [",\n".join(f"    {json.dumps(k)}: {json.dumps(v)}" for k, v in m["tensors"].items()),
              "  },", '  "nodes": [']
    lines += [",\n".join(f"    {json.dumps(n)}" for n in m["nodes"]), "  ],"]
    lines += [f'  "loss": {json.dumps(m["loss"])},', f'  "outputs": {json.dumps(m["outputs"])}']
    if "generate" in m:
        lines[-1] += ","
        lines.append(f'  "generate": {json.dumps(m["generate"])}')
    lines.append("}")
    return "\n".join(lines) + "\n"


# -- back to PyTorch ------------------------------------------------------------------------

def _find_sidecar(path, model):
    if model is not None:
        m = pathlib.Path(getattr(model, "path", model))
        return m.parent / f"{m.stem}.torch.json"
    p = pathlib.Path(path)
    if p.suffix == ".json" and p.is_file():
        return p.parent / f"{p.stem}.torch.json"
    for folder in [p, *p.parents]:
        found = sorted(folder.glob("*.torch.json")) if folder.is_dir() else []
        if len(found) == 1:
            return found[0]
        if len(found) > 1:
            _fail(f"{path}: {folder} holds several converted models; pass model= the model file")
    _fail(f"{path}: no *.torch.json beside it or above it; pass model= the model file "
          "from_torch wrote")


def _weights_folder(path):
    p = pathlib.Path(path)
    if (p / "checkpoint.json").is_file():
        return p
    steps = sorted((int(m.group(1)), d) for d in p.glob("step-*")
                   if (m := re.fullmatch(r"step-(\d+)", d.name)) and
                   (d / "checkpoint.json").is_file())
    if steps:
        return steps[-1][1]
    return p


def _chunk(lo, hi, parts, index):
    size = hi - lo
    step = -(-size // parts)
    a = min(lo + step * index, hi)
    return a, min(a + step, hi)


def read_sharded(folder):
    """The global array of a sharded folder (layout.json and rank<i>.npy; a rank whose shard
    equals a lower one's may be absent, as checkpoints write them)."""
    folder = pathlib.Path(folder)
    layout = json.loads((folder / "layout.json").read_text())
    mesh = layout["mesh"]["shape"]
    shape = layout["shape"]
    placements = layout["placements"]
    out = np.zeros(shape, dtype=layout["dtype"])
    for i in range(int(np.prod(mesh))):
        coords = np.unravel_index(i, mesh)
        box = [[0, s] for s in shape]
        for m, p in enumerate(placements):
            if p.startswith("S("):
                d = int(p[2:-1])
                box[d] = list(_chunk(box[d][0], box[d][1], mesh[m], int(coords[m])))
            elif p.startswith("P"):
                _fail(f"{folder}: a Partial layout is not a weight's")
        f = folder / f"rank{i}.npy"
        if f.is_file():
            out[tuple(slice(a, b) for a, b in box)] = np.load(f)
    return out


def to_torch_state_dict(path, model=None):
    """The weights at ``path`` under the module's own names, as torch tensors in its
    ``state_dict`` order: ``module.load_state_dict(..., strict=True)`` takes it.

    ``path``: a model file ``from_torch`` wrote (its weights as converted), a ``--save`` folder,
    a checkpoint folder (its newest complete checkpoint) or one ``step-<k>`` in it. ``model``:
    the converted model file, where ``path`` is not beside or below it. A tied weight appears
    under both names; the module's buffers are included; the q/k/v permutation is undone."""
    import torch

    sidecar_path = _find_sidecar(path, model)
    side = json.loads(sidecar_path.read_text())
    base = sidecar_path.parent
    p = pathlib.Path(path)
    arrays = {}
    if p.suffix == ".json" and p.is_file():
        m = json.loads(p.read_text())
        for name in side["weights"]:
            arrays[name] = np.load(p.parent / m["tensors"][name]["weight"])
    else:
        folder = _weights_folder(p)
        for name in side["weights"]:
            if not (folder / name / "layout.json").is_file():
                _fail(f"{path}: no weight {name} in {folder}")
            arrays[name] = read_sharded(folder / name)
    for perm in side["permutations"]:
        for t in perm["tensors"]:
            a = arrays[t]
            undone = np.empty_like(a)
            undone[_part_order(a.shape[0], perm["parts"], perm["degree"])] = a
            arrays[t] = undone
    state = {}
    for name, names in side["weights"].items():
        for n in names:
            state[n] = torch.from_numpy(arrays[name].copy())
    for key, rel in side["buffers"].items():
        state[key] = torch.from_numpy(np.load(base / rel))
    ordered = {}
    for key in side["order"]:
        if key in state:
            ordered[key] = state[key]
    return ordered
