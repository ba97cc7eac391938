"""Every operator of meshflow's ops/ on DTensors: ``meshflow.ops.sum(x, dims=[0])``.

Attributes are keyword arguments (dims, dim, shape, scale, eps, causal), as the model file names them.
"""

from . import _meshflow

_NAMES = [
    "matmul", "linear", "add", "sub", "mul", "div", "neg", "relu", "gelu", "tanh", "sigmoid",
    "exp", "sum", "mean", "softmax", "softmax_cross_entropy", "mse", "reshape", "transpose",
    "layer_norm", "embedding", "attention",
    "matmul_grad_a", "matmul_grad_b", "relu_grad", "gelu_grad", "tanh_grad", "sigmoid_grad",
    "softmax_grad", "softmax_cross_entropy_grad", "mse_grad", "sum_to", "broadcast_to",
    "layer_norm_stats", "layer_norm_grad_x", "layer_norm_grad_w", "embedding_grad",
    "attention_grad_q", "attention_grad_k", "attention_grad_v",
]


def apply(name, *operands, **attrs):
    """Applies operator ``name`` to DTensor operands on one mesh."""
    from .tensor import DTensor, _wrap

    for i, t in enumerate(operands):
        if not isinstance(t, DTensor):
            raise TypeError(f"{name}: operand {i} is a {type(t).__name__}, not a DTensor")
    return _wrap(_meshflow.apply(name, [t._t for t in operands], attrs))


def _make(name):
    def op(*operands, **attrs):
        return apply(name, *operands, **attrs)

    op.__name__ = name
    op.__doc__ = f"The {name} operator (meshflow ops/) on DTensors."
    return op


for _name in _NAMES:
    globals()[_name] = _make(_name)

__all__ = ["apply"] + _NAMES
