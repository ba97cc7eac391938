"""The PyTorch front end's first half: a module traced by ``torch.jit.trace`` read call by call
into meshflow operators (DESIGN's "Models"), as a plain graph the second half
(``torch_import``) places and writes.

The traced graph is run again here, call by call, on the example inputs: every value keeps its
concrete torch value (so shapes, sizes and constants are known), and every value that depends on
an input or a weight also gets the meshflow value that computes it. Calls on constants alone (the
causal mask's slicing, ``arange``) are evaluated and stay constants. The causal attention pattern
(``softmax(q @ kᵀ · s, masked above the diagonal) @ v``) is followed through the tags it leaves on
its intermediate values and becomes one fused ``attention``; any other use of those values is an
error naming the call.
"""
import math
import warnings
from dataclasses import dataclass, field
from typing import Any, Optional

import torch

from ._meshflow import InvalidArgumentError


# Calls that read only a tensor's shape: evaluated on the traced values, whatever computes them.
_SHAPE_CALLS = {"aten::size", "aten::dim", "aten::numel", "aten::len"}


@dataclass
class Val:
    """One traced value: its concrete torch value, and the meshflow value computing it (None for
    a constant or a module)."""
    value: Any
    name: Optional[str] = None
    tag: Any = None  # ("module", path) | ("attention", ...) | ("transposed", Val)


@dataclass
class Graph:
    """What a module became: meshflow tensors and nodes (model-file objects without placements),
    and what the writer needs to know of the module."""
    tensors: dict = field(default_factory=dict)  # name -> {"shape", "dtype", "kind", ...}
    nodes: list = field(default_factory=list)  # model-file node objects plus "module", "kind"
    outputs: list = field(default_factory=list)  # meshflow names of the module's outputs
    loss: Optional[str] = None
    weight_names: dict = field(default_factory=dict)  # meshflow weight -> [torch names]
    arrays: dict = field(default_factory=dict)  # tensor name -> np.ndarray (weights, constants)
    inputs: list = field(default_factory=list)  # forward argument names, in order


def _fail(message):
    raise InvalidArgumentError(message)


def _module_path(node):
    scope = node.scopeName()
    if not scope:
        return ""
    last = scope.split("/")[-1]
    return last[len("__module."):] if last.startswith("__module.") else last


def _np_dtype(t):
    return {torch.float32: "float32", torch.float64: "float64", torch.int64: "int64",
            torch.int32: "int32"}.get(t.dtype)


def _call_aten(node, args):
    """Runs one aten call of the traced graph on concrete values."""
    schema = torch._C.parse_schema(node.schema())
    name, _, overload = schema.name.partition("::")[2].partition(".")
    packet = getattr(torch.ops.aten, name)
    op = getattr(packet, schema.overload_name or "default")
    positional, keywords = [], {}
    for a, v in zip(schema.arguments, args):
        if a.kwarg_only:
            keywords[a.name] = v
        else:
            positional.append(v)
    return op(*positional, **keywords)


def _on(device, v):
    if isinstance(v, torch.Tensor):
        if device == "meta":
            return v.detach().to("meta")
        return torch.zeros(v.shape, dtype=v.dtype) if v.is_meta else v
    if isinstance(v, (list, tuple)):
        return type(v)(_on(device, x) for x in v)
    return v


def _shape_of_call(node, args):
    """A mapped call's result with its shapes and dtypes, not its values (a meshflow value's
    numbers are never read here): run on the meta device, which allocates and computes nothing,
    or, for a call without a meta kernel, on zeros."""
    with torch.no_grad():
        try:
            return _call_aten(node, [_on("meta", a) for a in args])
        except (NotImplementedError, RuntimeError):
            return _call_aten(node, [_on("cpu", a) for a in args])


def _is_causal_mask(mask, rows, cols):
    """True when `mask` (bool, broadcast to [..., rows, cols]) is True exactly above the
    diagonal: masked_fill's form of the causal mask."""
    if mask.dtype != torch.bool or mask.dim() < 2:
        return False
    m = mask.reshape(-1, mask.shape[-2], mask.shape[-1])
    if m.shape[-2:] != (rows, cols):
        return False
    above = torch.triu(torch.ones(rows, cols, dtype=torch.bool), diagonal=1)
    return bool((m == above).all())


class Tracer:
    """Reads one traced graph into a Graph (see the module's comment)."""

    def __init__(self, module, loss_names):
        self.module = module
        self.g = Graph()
        self.counts = {}
        self.weights = {}  # id(parameter) -> meshflow name
        self.params = {}  # id(parameter) -> [torch names]
        for mod_name, mod in module.named_modules(remove_duplicate=False):
            for pname, p in mod._parameters.items():
                if p is not None:
                    full = f"{mod_name}.{pname}" if mod_name else pname
                    names = self.params.setdefault(id(p), [])
                    if full not in names:
                        names.append(full)
        self.modules = dict(module.named_modules())
        self.loss_names = loss_names

    # -- naming ---------------------------------------------------------------------------
    def fresh(self, base):
        base = base or "v"
        k = self.counts.get(base, 0)
        self.counts[base] = k + 1
        return base if k == 0 else f"{base}_{k}"

    def emit(self, node, op, inputs, value, base=None, **attrs):
        path = _module_path(node)
        name = self.fresh(base or path or op)
        self.g.nodes.append({"name": name, "op": op, "inputs": list(inputs), **attrs,
                             "module": path, "kind": node.kind(), "_shape": list(value.shape)})
        return Val(value, name)

    def constant_input(self, node, value):
        """A constant tensor a mapped call reads: a non-trainable input of the model file."""
        t = value.detach().clone()
        if t.dim() == 0:
            t = t.reshape(1)
        name = self.fresh("const")
        self.g.tensors[name] = {"shape": list(t.shape), "dtype": _np_dtype(t), "kind": "const",
                                "module": _module_path(node)}
        self.g.arrays[name] = t.numpy()
        return name

    def weight(self, p):
        key = id(p)
        if key not in self.weights:
            names = self.params.get(key)
            if not names:
                _fail(f"a parameter of shape {list(p.shape)} is not one of the module's")
            name = names[0]
            self.weights[key] = name
            self.g.weight_names[name] = names
            self.g.tensors[name] = {"shape": list(p.shape), "dtype": _np_dtype(p),
                                    "kind": "weight"}
            self.g.arrays[name] = p.detach().cpu().numpy().copy()
        return self.weights[key]

    # -- the walk -------------------------------------------------------------------------
    def run(self, graph, args, arg_names):
        env = {}
        graph_inputs = list(graph.inputs())
        env[graph_inputs[0]] = Val(self.module, tag=("module", ""))
        for v, a, n in zip(graph_inputs[1:], args, arg_names):
            self.g.tensors[n] = {"shape": list(a.shape), "dtype": _np_dtype(a), "kind": "input"}
            if _np_dtype(a) is None:
                _fail(f"input {n}: dtype {a.dtype} (meshflow takes float32, float64, int32, int64)")
            self.g.arrays[n] = a.detach().cpu().numpy()
            self.g.inputs.append(n)
            env[v] = Val(a, n)
        for node in graph.nodes():
            ins = [env[i] for i in node.inputs()]
            outs = self.step(node, ins)
            for o, val in zip(node.outputs(), outs):
                env[o] = val
        (ret,) = list(graph.return_node().inputs())
        return env[ret]

    def step(self, node, ins):
        kind = node.kind()
        if kind == "prim::Constant":
            return [Val(node.output().toIValue())]
        if kind == "prim::GetAttr":
            return [self.get_attr(node, ins[0])]
        if kind in ("prim::ListConstruct", "prim::TupleConstruct"):
            return [Val([i.value for i in ins], tag=("list", ins))]
        if kind in ("prim::ListUnpack", "prim::TupleUnpack"):
            return list(ins[0].tag[1]) if ins[0].tag and ins[0].tag[0] == "list" else [
                Val(v) for v in ins[0].value]
        if kind == "prim::NumToTensor":
            return [Val(torch.tensor(ins[0].value))]
        if kind == "prim::TupleIndex" or kind == "aten::__getitem__":
            return [ins[0].tag[1][ins[1].value]]
        if not kind.startswith("aten::"):
            self.refuse(node, "is not a call meshflow maps")
        named = any(self.has_name(i) for i in ins)
        if not named or kind in _SHAPE_CALLS:
            with torch.no_grad():
                out = _call_aten(node, [i.value for i in ins])
            return list(out) if node.outputsSize() > 1 else [Val(out)]
        handler = getattr(self, "aten_" + kind[6:].rstrip("_"), None)
        if handler is None:
            self.refuse(node, "has no meshflow operator")
        value = _shape_of_call(node, [i.value for i in ins])
        out = handler(node, ins, value)
        return out if isinstance(out, list) else [out]

    def has_name(self, v):
        if v.name is not None or (v.tag and v.tag[0] in ("attention", "transposed")):
            return True
        if v.tag and v.tag[0] == "list":
            return any(self.has_name(i) for i in v.tag[1])
        return False

    def refuse(self, node, why):
        path = _module_path(node) or "(the module itself)"
        _fail(f"{path}: {node.kind()} {why}")

    def get_attr(self, node, owner):
        attr = node.s("name")
        obj = getattr(owner.value, attr)
        if isinstance(obj, torch.nn.Module):
            path = owner.tag[1]
            return Val(obj, tag=("module", f"{path}.{attr}" if path else attr))
        if isinstance(obj, torch.nn.Parameter):
            return Val(obj, self.weight(obj))
        return Val(obj)  # a buffer or other constant

    def operand(self, node, v):
        """The meshflow name of a tensor operand (a constant becomes an input)."""
        if v.tag and v.tag[0] == "attention":
            self.refuse(node, "reads attention scores outside softmax(q @ kᵀ · s, masked) @ v "
                              "(meshflow maps that pattern to its fused attention)")
        if v.name is not None:
            return v.name
        if isinstance(v.value, torch.Tensor):
            return self.constant_input(node, v.value)
        if isinstance(v.value, (int, float)):
            return self.constant_input(node, torch.tensor([float(v.value)]))
        self.refuse(node, f"reads {type(v.value).__name__} as a tensor")

    # -- calls ----------------------------------------------------------------------------
    def aten_linear(self, node, ins, value):
        x, w, b = ins
        if w.name is None or w.name not in self.g.weight_names:
            self.refuse(node, "multiplies by a weight that is not a parameter")
        inputs = [self.operand(node, x), w.name] + ([b.name] if b.value is not None else [])
        return self.emit(node, "linear", inputs, value, weight="out_in")

    def aten_embedding(self, node, ins, value):
        w, ids = ins[0], ins[1]
        if ids.name is None:
            t = ids.value
            if t.dim() == 1 and torch.equal(t, torch.arange(t.shape[0], dtype=t.dtype)):
                if t.shape[0] == w.value.shape[0]:
                    return Val(value, w.name)
                return self.emit(node, "slice", [w.name], value, dim=0, start=0,
                                 end=int(t.shape[0]))
            self.refuse(node, "looks up constant ids other than arange(n)")
        return self.emit(node, "embedding", [ids.name, w.name], value)

    def aten_layer_norm(self, node, ins, value):
        x, shape, w, b, eps = ins[:5]
        if len(shape.value) != 1:
            self.refuse(node, f"normalises over {len(shape.value)} dims (meshflow: the last)")
        if w.value is None or b.value is None:
            self.refuse(node, "has no weight or no bias (elementwise_affine=False or bias=False)")
        return self.emit(node, "layer_norm", [self.operand(node, x), w.name, b.name], value,
                         eps=float(eps.value))

    def binary(self, node, ins, value, op):
        a, b = ins[0], ins[1]
        if a.tag and a.tag[0] == "attention" and op in ("mul", "div") and b.name is None:
            s = float(b.value)
            q, k, scale, causal, probs = a.tag[1:]
            if probs or causal:
                self.refuse(node, "scales attention probabilities")
            return Val(value, tag=("attention", q, k, scale * s if op == "mul" else scale / s,
                                   causal, False))
        if len(ins) > 2 and ins[2].value != 1:
            self.refuse(node, f"has alpha {ins[2].value} (meshflow: 1)")
        return self.emit(node, op, [self.operand(node, a), self.operand(node, b)], value)

    def _binary_call(op):  # noqa: N805  (builds a method; deleted below)
        return lambda self, node, ins, value: self.binary(node, ins, value, op)

    aten_add, aten_sub, aten_mul = _binary_call("add"), _binary_call("sub"), _binary_call("mul")
    del _binary_call

    def aten_div(self, node, ins, value):
        if len(ins) > 2:
            self.refuse(node, "rounds (rounding_mode)")
        return self.binary(node, ins, value, "div")

    def unary(self, node, ins, value, op, **attrs):
        return self.emit(node, op, [self.operand(node, ins[0])], value, **attrs)

    def _unary_call(op):  # noqa: N805  (builds a method; deleted below)
        return lambda self, node, ins, value: self.unary(node, ins, value, op)

    aten_neg, aten_relu, aten_tanh = _unary_call("neg"), _unary_call("relu"), _unary_call("tanh")
    aten_sigmoid, aten_exp = _unary_call("sigmoid"), _unary_call("exp")
    del _unary_call

    def aten_gelu(self, node, ins, value):
        form = ins[1].value if len(ins) > 1 else "none"
        return self.unary(node, ins, value, "gelu", approximate=form)

    def aten_dropout(self, node, ins, value):
        x, p, train = ins
        if p.value != 0 and train.value:
            self.refuse(node, f"drops with p = {p.value} (meshflow maps dropout with p = 0)")
        return Val(value, x.name, x.tag)

    def aten_contiguous(self, node, ins, value):  # clone too: the same value, another copy
        return Val(value, ins[0].name, ins[0].tag)

    aten_clone = aten_contiguous

    def aten_softmax(self, node, ins, value):
        x, dim = ins[0], ins[1].value
        if len(ins) > 2 and ins[2].value is not None:
            self.refuse(node, "casts (dtype=)")
        if x.tag and x.tag[0] == "attention":
            q, k, scale, causal, probs = x.tag[1:]
            if probs or dim not in (-1, x.value.dim() - 1):
                self.refuse(node, "normalises attention scores along another dim than the keys")
            return Val(value, tag=("attention", q, k, scale, causal, True))
        return self.emit(node, "softmax", [self.operand(node, x)], value, dim=int(dim))

    def aten_masked_fill(self, node, ins, value):
        x, mask, fill = ins
        if not (x.tag and x.tag[0] == "attention") or mask.name is not None:
            self.refuse(node, "masks a value other than attention scores with a constant mask")
        q, k, scale, causal, probs = x.tag[1:]
        rows, cols = x.value.shape[-2:]
        if probs or causal or not (math.isinf(float(fill.value)) and float(fill.value) < 0) or \
                not _is_causal_mask(mask.value.expand(x.value.shape), rows, cols):
            self.refuse(node, "masks attention scores other than with -inf above the diagonal "
                              "(the causal mask)")
        return Val(value, tag=("attention", q, k, scale, True, False))

    def aten_transpose(self, node, ins, value):
        x, d0, d1 = ins[0], ins[1].value, ins[2].value
        rank = x.value.dim()
        perm = list(range(rank))
        perm[d0 % rank], perm[d1 % rank] = perm[d1 % rank], perm[d0 % rank]
        out = self.emit(node, "transpose", [self.operand(node, x)], value, dims=perm)
        if sorted((d0 % rank, d1 % rank)) == [rank - 2, rank - 1] and rank >= 3:
            out.tag = ("transposed", x)
        return out

    def aten_t(self, node, ins, value):
        return self.emit(node, "transpose", [self.operand(node, ins[0])], value, dims=[1, 0])

    def aten_permute(self, node, ins, value):
        rank = ins[0].value.dim()
        dims = [d % rank for d in ins[1].value]
        return self.emit(node, "transpose", [self.operand(node, ins[0])], value, dims=dims)

    def reshape(self, node, x, value):
        shape = list(value.shape)
        if shape:  # dim 0 is the rows micro-batching and generation re-size
            shape[0] = -1
        if list(x.value.shape) == list(value.shape):
            return x
        return self.emit(node, "reshape", [self.operand(node, x)], value, shape=shape)

    def aten_view(self, node, ins, value):  # and every other call that only re-shapes
        return self.reshape(node, ins[0], value)

    aten_reshape = aten_flatten = aten_unsqueeze = aten_squeeze = aten_view

    def slices(self, node, x, pieces, dim):
        rank = x.value.dim()
        dim %= rank
        src = self.operand(node, x)
        outs, start = [], 0
        for k, piece in enumerate(pieces):
            size = piece.shape[dim]
            out = self.emit(node, "slice", [src], piece, dim=dim, start=start, end=start + size,
                            split={"of": src, "index": k, "parts": len(pieces)})
            outs.append(out)
            start += size
        return Val(list(pieces), tag=("list", outs))

    def aten_split(self, node, ins, value):  # split_with_sizes and chunk too: (x, _, dim)
        return self.slices(node, ins[0], value, ins[2].value)

    aten_split_with_sizes = aten_chunk = aten_split

    def aten_slice(self, node, ins, value):
        x, dim, start, end, step = ins
        if step.value != 1:
            self.refuse(node, f"slices with step {step.value} (meshflow: 1)")
        n = x.value.shape[dim.value]
        s = 0 if start.value is None else start.value
        e = n if end.value is None else min(end.value, n)
        if s == 0 and e >= n:
            return x
        return self.emit(node, "slice", [self.operand(node, x)], value, dim=dim.value, start=s,
                         end=e)

    def aten_matmul(self, node, ins, value):
        a, b = ins
        if a.tag and a.tag[0] == "attention":
            q, k, scale, causal, probs = a.tag[1:]
            if not probs:
                self.refuse(node, "multiplies attention scores before their softmax")
            dh = q.value.shape[-1]
            if abs(scale * math.sqrt(dh) - 1) > 1e-6:
                self.refuse(node, f"scales attention scores by {scale:.6g}, not 1/√{dh} "
                                  "(meshflow's attention scales by 1/√Dh)")
            return self.emit(node, "attention", [self.operand(node, q), self.operand(node, k),
                                                 self.operand(node, b)], value, causal=causal)
        if b.tag and b.tag[0] == "transposed" and a.value.dim() >= 3:
            return Val(value, tag=("attention", a, b.tag[1], 1.0, False, False))
        if b.value.dim() != 2:
            self.refuse(node, f"multiplies by a {b.value.dim()}-d operand outside attention "
                              "(meshflow's matmul takes b[k, n])")
        return self.emit(node, "matmul", [self.operand(node, a), self.operand(node, b)], value)

    def aten_scaled_dot_product_attention(self, node, ins, value):
        q, k, v, mask, p, causal = ins[:6]
        if mask.value is not None or p.value != 0:
            self.refuse(node, "has an attention mask or dropout")
        return self.emit(node, "attention", [self.operand(node, q), self.operand(node, k),
                                             self.operand(node, v)], value,
                         causal=bool(causal.value))

    def reduce(self, node, ins, value, op):
        x, dims = ins[0], ins[1].value
        keep = ins[2].value if len(ins) > 2 else False
        if len(ins) > 3 and ins[3].value is not None:
            self.refuse(node, "casts (dtype=)")
        if keep:
            self.refuse(node, "keeps the reduced dims (keepdim=True)")
        rank = x.value.dim()
        dims = list(range(rank)) if dims is None else [d % rank for d in dims]
        return self.emit(node, op, [self.operand(node, x)], value, dims=dims)

    def aten_mean(self, node, ins, value):
        if len(ins) == 2:  # mean(x, dtype)
            return self.emit(node, "mean", [self.operand(node, ins[0])], value,
                             dims=list(range(ins[0].value.dim())))
        return self.reduce(node, ins, value, "mean")

    def aten_sum(self, node, ins, value):
        if len(ins) == 2:
            return self.emit(node, "sum", [self.operand(node, ins[0])], value,
                             dims=list(range(ins[0].value.dim())))
        return self.reduce(node, ins, value, "sum")

    def aten_cross_entropy_loss(self, node, ins, value):
        logits, labels, weight, reduction, ignore, smoothing = ins
        if weight.value is not None or reduction.value != 1 or smoothing.value != 0:
            self.refuse(node, "has class weights, label smoothing or a reduction other than mean")
        classes = logits.value.shape[-1]
        if 0 <= ignore.value < classes:
            self.refuse(node, f"ignores class {ignore.value}, a class of the logits (an "
                              "ignore_index outside [0, classes) is accepted: a label equal to "
                              "it is then an error)")
        if logits.value.dim() != 2 or labels.value.dim() != 1:
            self.refuse(node, "takes logits other than [N, C] (view them as [-1, C] first)")
        return self.emit(node, "softmax_cross_entropy",
                         [self.operand(node, logits), self.operand(node, labels)], value,
                         base="loss")

    def aten_broadcast_tensors(self, node, ins, value):
        parts = ins[0].tag[1] if ins[0].tag and ins[0].tag[0] == "list" else []
        if any(list(p.value.shape) != list(v.shape) for p, v in zip(parts, value)):
            self.refuse(node, "broadcasts operands of different shapes outside an operator")
        return Val(list(value), tag=("list", [Val(v, p.name, p.tag) for p, v in zip(parts, value)]))

    def aten_mse_loss(self, node, ins, value):
        if ins[2].value != 1:
            self.refuse(node, "has a reduction other than mean")
        return self.emit(node, "mse", [self.operand(node, ins[0]), self.operand(node, ins[1])],
                         value, base="loss")


def trace(module, args, arg_names, wrapper_prefix=""):
    """Traces `module(*args)` and reads it; returns (Graph, the output Val)."""
    with torch.no_grad(), warnings.catch_warnings():
        # The trace fixes sizes and asserts at the example's values: what a model file does too.
        warnings.simplefilter("ignore", torch.jit.TracerWarning)
        traced = torch.jit.trace(module, tuple(args), check_trace=False, strict=False)
    tracer = Tracer(module, arg_names)
    out = tracer.run(traced.inlined_graph, args, arg_names)
    return tracer, out


def flatten_outputs(out):
    """The output Vals of a module's return value (tuples and lists flattened)."""
    if out.tag and out.tag[0] == "list":
        vals = []
        for v in out.tag[1]:
            vals.extend(flatten_outputs(v))
        return vals
    return [out]


def eliminate_dead(g):
    """Drops nodes nothing that is kept reads (transposes folded into attention, unused
    parts of a split)."""
    needed = set(g.outputs) | ({g.loss} if g.loss else set())
    kept = []
    for n in reversed(g.nodes):
        if n["name"] in needed:
            kept.append(n)
            needed.update(n["inputs"])
    g.nodes = list(reversed(kept))
    used = set()
    for n in g.nodes:
        used.update(n["inputs"])
    used |= set(g.outputs)
    for name in [t for t, spec in g.tensors.items() if spec["kind"] == "const" and t not in used]:
        del g.tensors[name]
        g.arrays.pop(name, None)
