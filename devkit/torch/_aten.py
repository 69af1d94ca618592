"""ATen ops on devkit: each lowering takes the aten op's arguments (devkit
torch tensors, Python scalars, CPU scalar tensors) and runs devkit ops
(ONNX semantics) on the tensors' devkit Arrays.

``LOWERINGS`` maps an OpOverload to its lowering. View ops share one lowering
that asks torch's meta kernel for the view's geometry. In-place (``add_``) and
``out=`` variants run the functional lowering and write the result into their
destination (see ``_dispatch.py``).
"""

from __future__ import annotations

import math

import numpy as np
import torch
from torch._prims_common import ELEMENTWISE_TYPE_PROMOTION_KIND as PROMOTION, elementwise_dtypes

from ..abi import C
from ..ops import dispatch as _dispatch
from ..ops import run_op as _run_op
from ..runtime import Array
from . import _memory, _replay
from ._devices import devkit_device
from ._memory import Unsupported, numpy_dtype, to_array, wrap

aten = torch.ops.aten
LOWERINGS: dict = {}


def lower(*ops):
    """Registers ``fn`` for each op: an OpOverload, or a packet meaning all its overloads."""
    def register(fn):
        for op in ops:
            for overload in ([getattr(op, name) for name in op.overloads()]
                             if isinstance(op, torch._ops.OpOverloadPacket) else [op]):
                LOWERINGS[overload] = fn
        return fn
    return register


# -- arguments ----------------------------------------------------------------------------

def is_devkit(value) -> bool:
    return isinstance(value, torch.Tensor) and value.device.type == _memory.DEVICE_TYPE


def run_op(name: str, inputs, attrs=None, *, device=None) -> list[Array]:
    """devkit.ops.run_op, recorded for replay while an op is being recorded (``_replay``)."""
    recording = _replay.recorder()
    if recording is None:
        return _run_op(name, inputs, attrs, device=device)
    return recording.run_op(name, inputs, attrs, device)


def run(name: str, inputs, **attrs) -> list[Array]:
    return run_op(name, inputs, attrs)


def run1(name: str, inputs, **attrs) -> Array:
    return run_op(name, inputs, attrs)[0]


def cast(array: Array, dtype) -> Array:
    dtype = np.dtype(dtype)
    return array if array.dtype == dtype else run1("Cast", [array], to=dtype)


def arr(value, dtype: torch.dtype | None = None):
    """A devkit Array (or a NumPy scalar run_op uploads) for an op argument, cast to ``dtype``."""
    if is_devkit(value):
        array = to_array(value)
        return array if dtype is None else cast(array, numpy_dtype(dtype))
    if isinstance(value, torch.Tensor):  # a CPU scalar tensor mixed in, as torch allows
        value = value.item() if value.dim() == 0 else value.numpy()
    target = numpy_dtype(dtype) if dtype is not None else None
    return np.asarray(value, dtype=target)


def result_dtype(*args, kind=PROMOTION.DEFAULT) -> torch.dtype:
    return elementwise_dtypes(*[a for a in args if a is not None], type_promotion_kind=kind)[1]


def axes_of(dim, ndim: int) -> list[int]:
    if dim is None:
        return list(range(ndim))
    dims = [dim] if isinstance(dim, int) else list(dim)
    return [d % max(ndim, 1) for d in dims] if dims else list(range(ndim))


def out(array: Array) -> torch.Tensor:
    return wrap(array)


# -- views ----------------------------------------------------------------------------------

VIEW_OPS = (
    aten.view, aten._unsafe_view, aten.as_strided, aten.expand, aten.permute, aten.transpose, aten.t,
    aten.squeeze, aten.unsqueeze, aten.slice, aten.select, aten.alias, aten.detach, aten.diagonal,
    aten.unfold, aten.split, aten.split_with_sizes, aten.unbind, aten.narrow, aten._reshape_alias,
    aten.lift_fresh, aten.view_as, aten.expand_as, aten.unsafe_split, aten.chunk,
    aten.movedim, aten.swapaxes, aten.swapdims,
)


def _meta_twin(tensor: torch.Tensor) -> torch.Tensor:
    storage_elements = tensor.untyped_storage().nbytes() // tensor.element_size()
    base = torch.empty(storage_elements, dtype=tensor.dtype, device="meta")
    return base.as_strided(tensor.shape, tensor.stride(), tensor.storage_offset())


def _view_lowering(op):
    def view_op(self, *args, **kwargs):
        result = op(_meta_twin(self), *args, **kwargs)
        recording = _replay.recorder()
        if recording is not None:
            views = [result] if isinstance(result, torch.Tensor) else result
            recording.view(self, [(r.shape, r.stride(), r.storage_offset()) for r in views])
        if isinstance(result, torch.Tensor):
            return _memory.view(self, result.shape, result.stride(), result.storage_offset())
        return type(result)(_memory.view(self, r.shape, r.stride(), r.storage_offset()) for r in result)
    return view_op


for _packet in VIEW_OPS:
    for _name in _packet.overloads():
        LOWERINGS[getattr(_packet, _name)] = _view_lowering(getattr(_packet, _name))


# -- copies and creation ----------------------------------------------------------------------

def _broadcast_view(array: Array, shape) -> Array:
    """``array`` seen with ``shape``: broadcast dims get stride 0."""
    shape = tuple(shape)
    lead = len(shape) - array.ndim
    strides = [0] * lead + [0 if n == 1 and m != 1 else s
                            for n, m, s in zip(array.shape, shape[lead:], array.strides)]
    return Array(array.buffer, shape, array.dtype, strides, array.offset)


def write(dst: torch.Tensor, src) -> torch.Tensor:
    """dst[...] = src on the device: src (an Array or a host value) broadcast and cast to dst."""
    recording = _replay.recorder()
    if recording is not None and recording.write(dst, src):
        return dst
    target = to_array(dst)
    if target.size == 0:
        return dst
    dev = target.device
    if not isinstance(src, Array):
        src = run_op("Identity", [np.asarray(src, dtype=target.dtype)], device=dev)[0]
    if src.device is not dev:  # another device of the plugin: a compact copy moves there
        src = src.to(dev)
    elif src.buffer._allocation is target.buffer._allocation:
        src = run1("Identity", [src])  # the source may overlap the destination
    source = _broadcast_view(src, target.shape)
    if source.dtype == target.dtype and source.is_contiguous and target.is_contiguous:
        target.buffer.view(target.offset, target.nbytes).copy_from(source.buffer.view(source.offset, source.nbytes))
        return dst
    entry = dev.plugin.kernel_entry("Cast", source.dtype)
    both = C.DK_KERNEL_STRIDED_INPUTS | C.DK_KERNEL_STRIDED_OUTPUTS
    if entry is not None and entry.flags & both == both:
        _dispatch._call_kernel(dev, entry, "Cast", [source], [target],
                               [("to", "dtype", target.dtype), ("saturate", "int", 1)], None)
        return dst
    compact = cast(run1("Expand", [source, list(target.shape)]), target.dtype)
    if target.is_contiguous:
        target.buffer.view(target.offset, target.nbytes).copy_from(compact.buffer)
    else:  # no strided writes on this plugin: patch the covered bytes on the host
        low, high = target._extent()
        span = target.buffer.copy_to_host(offset=low, nbytes=high - low)
        np.ndarray(target.shape, target.dtype, buffer=span, offset=target.offset - low,
                   strides=[s * target.itemsize for s in target.strides])[...] = compact.numpy()
        target.buffer.copy_from_host(span, offset=low)
    return dst


def to_host(tensor: torch.Tensor) -> torch.Tensor:
    _replay.refuse()  # what the op does next depends on the values
    host = to_array(tensor).numpy()
    if tensor.dtype == torch.bfloat16:
        return torch.from_numpy(host.view(np.int16)).view(torch.bfloat16)
    return torch.from_numpy(host)


def from_host(dst: torch.Tensor, host: torch.Tensor) -> torch.Tensor:
    _replay.refuse()  # host values, which a replay would not have
    host = host.to(dst.dtype).expand(dst.shape).contiguous()
    values = host.view(torch.int16).numpy().view(numpy_dtype(torch.bfloat16)) \
        if host.dtype == torch.bfloat16 else host.numpy()
    target = to_array(dst)
    if target.is_contiguous and target.size:
        target.buffer.copy_from_host(values.reshape(-1).view(np.uint8), offset=target.offset)
        return dst
    return write(dst, run_op("Identity", [values], device=target.device)[0])


@lower(aten._copy_from)
def _copy_from(src, dst, non_blocking=False):
    if is_devkit(dst):
        return write(dst, to_array(src)) if is_devkit(src) else from_host(dst, src)
    dst.copy_(to_host(src))
    return dst


@lower(aten._copy_from_and_resize)
def _copy_from_and_resize(src, dst):
    if tuple(dst.shape) != tuple(src.shape):
        dst.resize_(src.shape)
    return _copy_from(src, dst)


@lower(aten.copy_)
def copy_(dst, src, non_blocking=False):
    return _copy_from(src, dst)


@lower(aten.copy)
def copy(dst, src, non_blocking=False):
    result = _memory.empty_tensor(dst.shape, dst.dtype, to_array(dst).device)
    return _copy_from(src, result)


@lower(aten.empty.memory_format)
def empty(size, *, dtype=None, layout=None, device=None, pin_memory=None, memory_format=None):
    return _memory.empty_tensor(size, dtype or torch.get_default_dtype(), devkit_device(device))


@lower(aten.empty_strided)
def empty_strided(size, stride, *, dtype=None, layout=None, device=None, pin_memory=None):
    return _memory.empty_strided_tensor(size, stride, dtype or torch.get_default_dtype(),
                                        devkit_device(device))


@lower(aten.resize_)
def resize_(self, size, memory_format=None):
    size = tuple(size)
    if tuple(self.shape) == size:
        return self
    _replay.refuse()  # the tensor's geometry changes, which a replay would not redo
    needed = (self.storage_offset() + math.prod(size)) * self.element_size()
    if needed <= self.untyped_storage().nbytes():
        storage, offset = self.untyped_storage(), self.storage_offset()
    else:
        fresh = _memory.empty_tensor(size, self.dtype, to_array(self).device)
        storage, offset = fresh.untyped_storage(), 0
    strides = [math.prod(size[i + 1:]) for i in range(len(size))]
    _memory._set_storage._op_dk(torch._C.DispatchKey.CPU, self, storage, offset, list(size), strides)
    return self


@lower(aten.fill_.Scalar, aten.fill_.Tensor)
def fill_(self, value):
    if is_devkit(value):
        return write(self, to_array(value))
    value = value.item() if isinstance(value, torch.Tensor) else value
    target = to_array(self)
    if value == 0 and target.is_contiguous and target.size and not math.copysign(1, value) < 0:
        _replay.refuse()  # a memset, not a kernel call
        target.buffer.view(target.offset, target.nbytes).fill(0)
        return self
    return write(self, value)


@lower(aten.zero_)
def zero_(self):
    return fill_(self, 0)


@lower(aten.fill.Scalar, aten.fill.Tensor)
def fill(self, value):
    return fill_(_memory.empty_tensor(self.shape, self.dtype, to_array(self).device), value)


@lower(aten._local_scalar_dense)
def _local_scalar_dense(self):
    return to_host(self).item()


@lower(aten.scalar_tensor)
def scalar_tensor(value, *, dtype=None, layout=None, device=None, pin_memory=None):
    return fill_(empty([], dtype=dtype, device=device), value)


@lower(aten.arange.start_step)
def arange(start, end, step=1, *, dtype=None, layout=None, device=None, pin_memory=None):
    if dtype is None:
        dtype = torch.int64 if all(isinstance(v, int) for v in (start, end, step)) \
            else torch.get_default_dtype()
    length = max(0, math.ceil((end - start) / step))
    compute = np.float64 if dtype.is_floating_point else np.int64
    result = run_op("Range", [np.asarray(start, compute), np.asarray(start + length * step, compute),
                              np.asarray(step, compute)], device=devkit_device(device))[0]
    return out(cast(result, numpy_dtype(dtype)))


@lower(aten.clone)
def clone(self, *, memory_format=None):
    return out(run1("Identity", [to_array(self)]))


# -- random numbers come from torch's CPU generator, so that seeds give torch CPU's values --

def _random_inplace(op):
    def random_op(self, *args, **kwargs):
        host = torch.empty(self.shape, dtype=self.dtype)
        op(host, *args, **kwargs)
        return from_host(self, host)
    return random_op


for _packet in (aten.uniform_, aten.normal_, aten.bernoulli_, aten.random_, aten.exponential_,
                aten.geometric_, aten.log_normal_, aten.cauchy_):
    for _name in _packet.overloads():
        LOWERINGS[getattr(_packet, _name)] = _random_inplace(getattr(_packet, _name))


@lower(aten.bernoulli.default)
def bernoulli(self, *, generator=None):
    host = torch.bernoulli(to_host(self), generator=generator)
    return from_host(_memory.empty_tensor(self.shape, self.dtype, to_array(self).device), host)


@lower(aten.randperm.default, aten.randperm.generator)
def randperm(n, *args, dtype=torch.int64, layout=None, device=None, pin_memory=None, **kwargs):
    host = torch.randperm(n, *args, dtype=dtype)
    return from_host(empty([n], dtype=dtype, device=device), host)


# -- elementwise ----------------------------------------------------------------------------------

def _unary(onnx: str, kind=PROMOTION.INT_TO_FLOAT, **attrs):
    def unary(self, *ignored, **ignored_kw):
        return out(run1(onnx, [arr(self, result_dtype(self, kind=kind))], **attrs))
    return unary


# Ops that compute in a floating dtype (integers promote), and ops that keep their input's dtype.
_FLOAT_UNARY = {
    "exp": "Exp", "log": "Log", "sqrt": "Sqrt", "sin": "Sin", "cos": "Cos", "tan": "Tan", "asin": "Asin",
    "acos": "Acos", "atan": "Atan", "sinh": "Sinh", "cosh": "Cosh", "tanh": "Tanh", "asinh": "Asinh",
    "acosh": "Acosh", "atanh": "Atanh", "erf": "Erf", "sigmoid": "Sigmoid", "reciprocal": "Reciprocal",
}
_SAME_DTYPE_UNARY = {"abs": "Abs", "neg": "Neg", "relu": "Relu", "sign": "Sign", "sgn": "Sign", "mish": "Mish",
                     "hardsigmoid": "HardSigmoid", "hardswish": "HardSwish"}
for _table, _kind in ((_FLOAT_UNARY, PROMOTION.INT_TO_FLOAT), (_SAME_DTYPE_UNARY, PROMOTION.DEFAULT)):
    for _name, _onnx in _table.items():
        _attrs = {"alpha": 1 / 6} if _onnx == "HardSigmoid" else {}  # torch's relu6(x + 3) / 6
        lower(getattr(aten, _name).default)(_unary(_onnx, _kind, **_attrs))


def _integral_identity_or(onnx):
    def rounding(self):
        if not self.dtype.is_floating_point:
            return clone(self)
        return out(run1(onnx, [to_array(self)]))
    return rounding


lower(aten.ceil.default)(_integral_identity_or("Ceil"))
lower(aten.floor.default)(_integral_identity_or("Floor"))


@lower(aten.round.default)
def round_(self):
    return _integral_identity_or("Round")(self)


@lower(aten.round.decimals)
def round_decimals(self, *, decimals=0):
    scale = np.asarray(10.0 ** decimals, numpy_dtype(self.dtype))
    return out(run1("Div", [run1("Round", [run1("Mul", [to_array(self), scale])]), scale]))


def _trunc_array(x: Array) -> Array:
    return run1("Mul", [run1("Sign", [x]), run1("Floor", [run1("Abs", [x])])])


@lower(aten.trunc.default)
def trunc(self):
    return out(_trunc_array(to_array(self))) if self.dtype.is_floating_point else clone(self)


@lower(aten.rsqrt.default)
def rsqrt(self):
    x = arr(self, result_dtype(self, kind=PROMOTION.INT_TO_FLOAT))
    return out(run1("Reciprocal", [run1("Sqrt", [x])]))


def _log_base(base):
    def log_op(self):
        x = arr(self, result_dtype(self, kind=PROMOTION.INT_TO_FLOAT))
        return out(run1("Div", [run1("Log", [x]), np.asarray(math.log(base), x.dtype)]))
    return log_op


lower(aten.log2.default)(_log_base(2))
lower(aten.log10.default)(_log_base(10))


@lower(aten.log1p.default)
def log1p(self):
    x = arr(self, result_dtype(self, kind=PROMOTION.INT_TO_FLOAT))
    return out(run1("Log", [run1("Add", [x, np.asarray(1, x.dtype)])]))


@lower(aten.expm1.default)
def expm1(self):
    x = arr(self, result_dtype(self, kind=PROMOTION.INT_TO_FLOAT))
    return out(run1("Sub", [run1("Exp", [x]), np.asarray(1, x.dtype)]))


@lower(aten.exp2.default)
def exp2(self):
    x = arr(self, result_dtype(self, kind=PROMOTION.INT_TO_FLOAT))
    two = run_op("Identity", [np.asarray(2, x.dtype)], device=x.device)[0]
    return out(run1("Pow", [two, x]))


@lower(aten.isnan.default)
def isnan(self):
    if not self.dtype.is_floating_point:
        return fill(_memory.empty_tensor(self.shape, torch.bool, to_array(self).device), False)
    return out(run1("IsNaN", [to_array(self)]))


@lower(aten.isinf.default)
def isinf(self):
    if not self.dtype.is_floating_point:
        return fill(_memory.empty_tensor(self.shape, torch.bool, to_array(self).device), False)
    return out(run1("IsInf", [to_array(self)]))


@lower(aten.logical_not.default)
def logical_not(self):
    return out(run1("Not", [arr(self, torch.bool)]))


@lower(aten.bitwise_not.default)
def bitwise_not(self):
    return out(run1("Not" if self.dtype == torch.bool else "BitwiseNot", [to_array(self)]))


@lower(aten.gelu.default)
def gelu(self, *, approximate="none"):
    return out(run1("Gelu", [to_array(self)], approximate=approximate))


@lower(aten.gelu_backward.default)
def gelu_backward(grad, self, *, approximate="none"):
    return out(run1("GeluGrad", [to_array(grad), to_array(self)], approximate=approximate))


@lower(aten.elu.default)
def elu(self, alpha=1, scale=1, input_scale=1):
    x = to_array(self)
    if input_scale != 1:
        x = run1("Mul", [x, np.asarray(input_scale, x.dtype)])
    y = run1("Elu", [x], alpha=alpha)
    return out(y if scale == 1 else run1("Mul", [y, np.asarray(scale, x.dtype)]))


@lower(aten.leaky_relu.default)
def leaky_relu(self, negative_slope=0.01):
    return out(run1("LeakyRelu", [to_array(self)], alpha=negative_slope))


@lower(aten.softplus.default)
def softplus(self, beta=1, threshold=20):
    x = to_array(self)
    scaled = x if beta == 1 else run1("Mul", [x, np.asarray(beta, x.dtype)])
    y = run1("Softplus", [scaled])
    if beta != 1:
        y = run1("Div", [y, np.asarray(beta, x.dtype)])
    return out(run1("Where", [run1("Greater", [scaled, np.asarray(threshold, x.dtype)]), x, y]))


@lower(aten.silu.default)
def silu(self):
    x = to_array(self)
    return out(run1("Mul", [x, run1("Sigmoid", [x])]))


@lower(aten.hardtanh.default)
def hardtanh(self, min_val=-1, max_val=1):
    return clamp(self, min_val, max_val)


@lower(aten.clamp.default)
def clamp(self, min=None, max=None):
    dtype = result_dtype(self, min, max)
    x = arr(self, dtype)
    host = numpy_dtype(dtype)
    return out(run1("Clip", [x, None if min is None else np.asarray(min, host),
                             None if max is None else np.asarray(max, host)]))


@lower(aten.clamp.Tensor)
def clamp_tensor(self, min=None, max=None):
    dtype = result_dtype(self, min, max)
    x = arr(self, dtype)
    if min is not None:
        x = run1("Max", [x, arr(min, dtype)])
    if max is not None:
        x = run1("Min", [x, arr(max, dtype)])
    return out(x)


@lower(aten.clamp_min.default, aten.clamp_min.Tensor)
def clamp_min(self, min):
    return (clamp_tensor if isinstance(min, torch.Tensor) else clamp)(self, min, None)


@lower(aten.clamp_max.default, aten.clamp_max.Tensor)
def clamp_max(self, max):
    return (clamp_tensor if isinstance(max, torch.Tensor) else clamp)(self, None, max)


@lower(aten.threshold.default)
def threshold(self, threshold, value):
    x = to_array(self)
    return out(run1("Where", [run1("Greater", [x, np.asarray(threshold, x.dtype)]), x,
                              np.asarray(value, x.dtype)]))


@lower(aten.threshold_backward.default)
def threshold_backward(grad, self, threshold):
    g, x = to_array(grad), to_array(self)
    return out(run1("Where", [run1("Greater", [x, np.asarray(threshold, x.dtype)]), g,
                              np.asarray(0, g.dtype)]))


@lower(aten.sigmoid_backward.default)
def sigmoid_backward(grad, output):
    return out(run1("SigmoidGrad", [to_array(grad), to_array(output)]))


@lower(aten.tanh_backward.default)
def tanh_backward(grad, output):
    return out(run1("TanhGrad", [to_array(grad), to_array(output)]))


# binary

def _binary(onnx: str, kind=PROMOTION.DEFAULT, *, compare=False):
    def binary(self, other, **ignored):
        dtype = result_dtype(self, other, kind=PROMOTION.DEFAULT if compare else kind)
        return out(run1(onnx, [arr(self, dtype), arr(other, dtype)]))
    return binary


def _with_alpha(onnx: str):
    def add_sub(self, other, *, alpha=1):
        dtype = result_dtype(self, other)
        if dtype == torch.bool:
            return out(run1("Or" if onnx == "Add" else "Xor", [arr(self), arr(other, dtype)]))
        b = arr(other, dtype)
        if alpha != 1:
            b = run1("Mul", [b, np.asarray(alpha, numpy_dtype(dtype))])
        return out(run1(onnx, [arr(self, dtype), b]))
    return add_sub


lower(aten.add.Tensor, aten.add.Scalar)(_with_alpha("Add"))
lower(aten.sub.Tensor, aten.sub.Scalar)(_with_alpha("Sub"))


@lower(aten.rsub.Tensor, aten.rsub.Scalar)
def rsub(self, other, alpha=1):
    dtype = result_dtype(self, other)
    a = arr(self, dtype)
    if alpha != 1:
        a = run1("Mul", [a, np.asarray(alpha, numpy_dtype(dtype))])
    return out(run1("Sub", [arr(other, dtype), a]))


@lower(aten.mul.Tensor, aten.mul.Scalar)
def mul(self, other):
    dtype = result_dtype(self, other)
    if dtype == torch.bool:
        return out(run1("And", [arr(self, dtype), arr(other, dtype)]))
    return out(run1("Mul", [arr(self, dtype), arr(other, dtype)]))


@lower(aten.div.Tensor, aten.div.Scalar)
def div(self, other):
    dtype = result_dtype(self, other, kind=PROMOTION.INT_TO_FLOAT)
    return out(run1("Div", [arr(self, dtype), arr(other, dtype)]))


@lower(aten.div.Tensor_mode, aten.div.Scalar_mode)
def div_mode(self, other, *, rounding_mode=None):
    if rounding_mode is None:
        return div(self, other)
    dtype = result_dtype(self, other)
    a, b = arr(self, dtype), arr(other, dtype)
    if dtype.is_floating_point:
        quotient = run1("Div", [a, b])
        return out(_trunc_array(quotient) if rounding_mode == "trunc" else run1("Floor", [quotient]))
    if rounding_mode == "trunc":
        return out(run1("Div", [a, b]))
    return out(run1("Div", [run1("Sub", [a, run1("Mod", [a, b])]), b]))


@lower(aten.floor_divide.default, aten.floor_divide.Scalar)
def floor_divide(self, other):
    return div_mode(self, other, rounding_mode="floor")


@lower(aten.remainder.Tensor, aten.remainder.Scalar, aten.remainder.Scalar_Tensor)
def remainder(self, other):
    dtype = result_dtype(self, other)
    a, b = arr(self, dtype), arr(other, dtype)
    if not dtype.is_floating_point:
        return out(run1("Mod", [a, b]))
    r = run1("Mod", [a, b], fmod=1)
    zero = np.asarray(0, numpy_dtype(dtype))
    fix = run1("And", [run1("Not", [run1("Equal", [r, zero])]),
                       run1("Xor", [run1("Less", [r, zero]), run1("Less", [b, zero])])])
    return out(run1("Where", [fix, run1("Add", [r, b]), r]))


@lower(aten.fmod.Tensor, aten.fmod.Scalar)
def fmod(self, other):
    dtype = result_dtype(self, other)
    return out(run1("Mod", [arr(self, dtype), arr(other, dtype)], fmod=1))


@lower(aten.pow.Tensor_Tensor, aten.pow.Tensor_Scalar, aten.pow.Scalar)
def pow_(self, exponent):
    dtype = result_dtype(self, exponent)
    if isinstance(exponent, (int, float)) and exponent == 2 and dtype.is_floating_point:
        x = arr(self, dtype)
        return out(run1("Mul", [x, x]))
    base = arr(self, dtype)
    if not isinstance(base, Array):  # Scalar ** Tensor: the base goes to the exponent's device
        base = run_op("Identity", [base], device=to_array(exponent).device)[0]
    return out(run1("Pow", [base, arr(exponent, dtype)]))


lower(aten.maximum.default)(_binary("Max"))
lower(aten.minimum.default)(_binary("Min"))
for _op, _onnx in [(aten.eq, "Equal"), (aten.lt, "Less"), (aten.le, "LessOrEqual"), (aten.gt, "Greater"),
                   (aten.ge, "GreaterOrEqual")]:
    lower(_op.Tensor, _op.Scalar)(_binary(_onnx, compare=True))


@lower(aten.ne.Tensor, aten.ne.Scalar)
def ne(self, other):
    return out(run1("Not", [to_array(_binary("Equal", compare=True)(self, other))]))


def _logical(onnx):
    def logical(self, other):
        return out(run1(onnx, [arr(self, torch.bool), arr(other, torch.bool)]))
    return logical


lower(aten.logical_and.default)(_logical("And"))
lower(aten.logical_or.default)(_logical("Or"))
lower(aten.logical_xor.default)(_logical("Xor"))


def _bitwise(integer_op, bool_op):
    def bitwise(self, other):
        dtype = result_dtype(self, other)
        return out(run1(bool_op if dtype == torch.bool else integer_op, [arr(self, dtype), arr(other, dtype)]))
    return bitwise


lower(aten.bitwise_and.Tensor, aten.bitwise_and.Scalar)(_bitwise("BitwiseAnd", "And"))
lower(aten.bitwise_or.Tensor, aten.bitwise_or.Scalar)(_bitwise("BitwiseOr", "Or"))
lower(aten.bitwise_xor.Tensor, aten.bitwise_xor.Scalar)(_bitwise("BitwiseXor", "Xor"))


@lower(aten.where.self, aten.where.ScalarSelf, aten.where.ScalarOther, aten.where.Scalar)
def where(condition, self, other):
    dtype = result_dtype(self, other)
    x, y = arr(self, dtype), arr(other, dtype)
    if not isinstance(x, Array) and not isinstance(y, Array):
        x = run_op("Identity", [x], device=to_array(condition).device)[0]
    return out(run1("Where", [arr(condition, torch.bool), x, y]))


@lower(aten.masked_fill.Scalar, aten.masked_fill.Tensor)
def masked_fill(self, mask, value):
    value = value.item() if isinstance(value, torch.Tensor) and not is_devkit(value) else value
    x = to_array(self)
    fill_value = cast(to_array(value), x.dtype) if is_devkit(value) else np.asarray(value, x.dtype)
    return out(run1("Where", [arr(mask, torch.bool), fill_value, x]))


@lower(aten.lerp.Scalar, aten.lerp.Tensor)
def lerp(self, end, weight):
    dtype = result_dtype(self, end)
    a, b = arr(self, dtype), arr(end, dtype)
    return out(run1("Add", [a, run1("Mul", [arr(weight, dtype), run1("Sub", [b, a])])]))


def _add_scaled(op: str, self, tensor1, tensor2, value):
    """self + value * op(tensor1, tensor2): addcmul (Mul) and addcdiv (Div)."""
    dtype = result_dtype(self, tensor1, tensor2)
    combined = run1(op, [arr(tensor1, dtype), arr(tensor2, dtype)])
    if value != 1:
        combined = run1("Mul", [combined, np.asarray(value, numpy_dtype(dtype))])
    return out(run1("Add", [arr(self, dtype), combined]))


@lower(aten.addcmul.default)
def addcmul(self, tensor1, tensor2, *, value=1):
    return _add_scaled("Mul", self, tensor1, tensor2, value)


@lower(aten.addcdiv.default)
def addcdiv(self, tensor1, tensor2, *, value=1):
    return _add_scaled("Div", self, tensor1, tensor2, value)


# -- reductions -------------------------------------------------------------------------------

def _sum_dtype(self, dtype):
    if dtype is not None:
        return dtype
    return torch.int64 if not self.dtype.is_floating_point else self.dtype


def _reduce(onnx, x: Array, dims, keepdim, ndim) -> Array:
    if x.ndim == 0:
        return run1("Identity", [x])
    return run1(onnx, [x, np.asarray(axes_of(dims, ndim), np.int64)], keepdims=int(keepdim))


@lower(aten.sum.dim_IntList, aten.sum.default)
def sum_(self, dim=None, keepdim=False, *, dtype=None):
    dtype = _sum_dtype(self, dtype)
    return out(_reduce("ReduceSum", arr(self, dtype), dim, keepdim, self.dim()))


@lower(aten.mean.dim, aten.mean.default)
def mean(self, dim=None, keepdim=False, *, dtype=None):
    return out(_reduce("ReduceMean", arr(self, dtype or self.dtype), dim, keepdim, self.dim()))


@lower(aten.prod.dim_int, aten.prod.default)
def prod(self, dim=None, keepdim=False, *, dtype=None):
    return out(_reduce("ReduceProd", arr(self, _sum_dtype(self, dtype)), dim, keepdim, self.dim()))


def _minmax_reduce(onnx):
    def reduce(self, dim=None, keepdim=False):
        if self.dtype == torch.bool:
            return out(cast(_reduce(onnx, arr(self, torch.uint8), dim, keepdim, self.dim()), np.bool_))
        return out(_reduce(onnx, to_array(self), dim, keepdim, self.dim()))
    return reduce


lower(aten.amax.default)(_minmax_reduce("ReduceMax"))
lower(aten.amin.default)(_minmax_reduce("ReduceMin"))
lower(aten.max.default)(_minmax_reduce("ReduceMax"))
lower(aten.min.default)(_minmax_reduce("ReduceMin"))


def _any_all(onnx):
    def reduce(self, dim=None, keepdim=False):
        flags = run1("Cast", [run1("Cast", [to_array(self)], to=np.bool_)], to=np.uint8)
        return out(cast(_reduce(onnx, flags, dim, keepdim, self.dim()), np.bool_))
    return reduce


lower(aten.any.default, aten.any.dim, aten.any.dims)(_any_all("ReduceMax"))
lower(aten.all.default, aten.all.dim, aten.all.dims)(_any_all("ReduceMin"))


def _arg(onnx):
    def arg_reduce(self, dim=None, keepdim=False):
        x = to_array(self)
        if dim is None:
            result = run1(onnx, [run1("Reshape", [x, [-1]])], axis=0, keepdims=0)
            if keepdim:
                result = run1("Reshape", [result, [1] * self.dim()])
            return out(result)
        if x.ndim == 0:
            return out(run_op("Identity", [np.asarray(0, np.int64)], device=x.device)[0])
        return out(run1(onnx, [x], axis=dim, keepdims=int(keepdim)))
    return arg_reduce


lower(aten.argmax.default)(_arg("ArgMax"))
lower(aten.argmin.default)(_arg("ArgMin"))


def _value_and_index(reduce_op, arg_op):
    def reduce(self, dim, keepdim=False):
        x = to_array(self)
        if x.ndim == 0:
            return clone(self), out(run_op("Identity", [np.asarray(0, np.int64)], device=x.device)[0])
        return (out(_reduce(reduce_op, x, dim, keepdim, self.dim())),
                out(run1(arg_op, [x], axis=dim, keepdims=int(keepdim))))
    return reduce


lower(aten.max.dim)(_value_and_index("ReduceMax", "ArgMax"))
lower(aten.min.dim)(_value_and_index("ReduceMin", "ArgMin"))


def _variance(x: Array, dims, correction, keepdim, ndim) -> Array:
    axes = axes_of(dims, ndim)
    count = math.prod(x.shape[a] for a in axes) if x.ndim else 1
    if x.ndim == 0:
        return run1("Div", [run1("Sub", [x, x]), np.asarray(max(count - correction, 0), x.dtype)])
    centred = run1("Sub", [x, run1("ReduceMean", [x, np.asarray(axes, np.int64)], keepdims=1)])
    squares = run1("ReduceSumSquare", [centred, np.asarray(axes, np.int64)], keepdims=int(keepdim))
    return run1("Div", [squares, np.asarray(max(count - correction, 0), x.dtype)])


def _correction(correction, unbiased=None):
    if correction is None:
        return 1 if unbiased is None or unbiased else 0
    return correction


@lower(aten.var.correction)
def var(self, dim=None, *, correction=None, keepdim=False):
    return out(_variance(to_array(self), dim, _correction(correction), keepdim, self.dim()))


@lower(aten.std.correction)
def std(self, dim=None, *, correction=None, keepdim=False):
    return out(run1("Sqrt", [_variance(to_array(self), dim, _correction(correction), keepdim, self.dim())]))


@lower(aten.var_mean.correction)
def var_mean(self, dim=None, *, correction=None, keepdim=False):
    x = to_array(self)
    return (out(_variance(x, dim, _correction(correction), keepdim, self.dim())),
            out(_reduce("ReduceMean", x, dim, keepdim, self.dim())))


@lower(aten.logsumexp.default)
def logsumexp(self, dim, keepdim=False):
    x = arr(self, result_dtype(self, kind=PROMOTION.INT_TO_FLOAT))
    return out(_reduce("ReduceLogSumExp", x, dim, keepdim, self.dim()))


@lower(aten.cumsum.default)
def cumsum(self, dim, *, dtype=None):
    x = arr(self, _sum_dtype(self, dtype))
    if x.ndim == 0:
        return out(run1("Identity", [x]))
    return out(run1("CumSum", [x, np.asarray(dim, np.int64)]))


def _softmax_like(onnx):
    def softmax(self, dim, half_to_float=False):
        x = to_array(self)
        if x.ndim == 0:
            return out(run1(onnx, [run1("Reshape", [x, [1]])], axis=0).reshape(()))
        return out(run1(onnx, [x], axis=dim))
    return softmax


lower(aten._softmax.default)(_softmax_like("Softmax"))
lower(aten._log_softmax.default)(_softmax_like("LogSoftmax"))


def _softmax_grad(onnx):
    def softmax_backward(grad_output, output, dim, input_dtype):
        g, y = to_array(grad_output), to_array(output)
        if y.ndim == 0:
            g, y, dim = g.reshape(1), y.reshape(1), 0
        return out(run1(onnx, [g, y], axis=dim).reshape(tuple(output.shape)))
    return softmax_backward


lower(aten._softmax_backward_data.default)(_softmax_grad("SoftmaxGrad"))
lower(aten._log_softmax_backward_data.default)(_softmax_grad("LogSoftmaxGrad"))


@lower(aten.topk.default)
def topk(self, k, dim=-1, largest=True, sorted=True):
    x = to_array(self)
    if x.ndim == 0:
        return clone(self), out(run_op("Identity", [np.asarray(0, np.int64)], device=x.device)[0])
    values, indices = run("TopK", [x, np.asarray([k], np.int64)], axis=dim, largest=int(largest), sorted=1)
    return out(values), out(indices)


@lower(aten.sort.default, aten.sort.stable)
def sort(self, *args, dim=-1, descending=False, stable=None):
    if args and isinstance(args[0], bool) or (args and args[0] is None):  # sort.stable's positional order
        stable, *args = args
    if args:
        dim = args[0]
    if len(args) > 1:
        descending = args[1]
    size = self.shape[dim] if self.dim() else 1
    return topk(self, size, dim, descending, True)


# -- linear algebra and nn ----------------------------------------------------------------------

@lower(aten.mm.default, aten.bmm.default)
def mm(self, other):
    return out(run1("MatMul", [to_array(self), to_array(other)]))


@lower(aten.addmm.default)
def addmm(self, mat1, mat2, *, beta=1, alpha=1):
    return out(run1("Gemm", [to_array(mat1), to_array(mat2), arr(self, mat1.dtype)], alpha=alpha, beta=beta))


def _conv_attrs(weight, stride, padding, dilation, groups):
    spatial = weight.dim() - 2
    as_list = lambda v: list(v) * (spatial if len(v) == 1 else 1)  # noqa: E731
    return {"strides": as_list(stride), "pads": as_list(padding) * 2, "dilations": as_list(dilation),
            "group": groups, "kernel_shape": list(weight.shape[2:])}


@lower(aten.convolution.default)
def convolution(input, weight, bias, stride, padding, dilation, transposed, output_padding, groups):
    attrs = _conv_attrs(weight, stride, padding, dilation, groups)
    inputs = [to_array(input), to_array(weight)] + ([to_array(bias)] if bias is not None else [])
    if transposed:
        return out(run1("ConvTranspose", inputs, output_padding=list(output_padding), **attrs))
    return out(run1("Conv", inputs, **attrs))


@lower(aten.convolution_overrideable.default)
def convolution_overrideable(input, weight, bias, stride, padding, dilation, transposed, output_padding, groups):
    return convolution(input, weight, bias, stride, padding, dilation, transposed, output_padding, groups)


@lower(aten.convolution_backward_overrideable.default)
def convolution_backward_overrideable(grad_output, input, weight, stride, padding, dilation, transposed,
                                      output_padding, groups, output_mask):
    return convolution_backward(grad_output, input, weight, None, stride, padding, dilation, transposed,
                                output_padding, groups, output_mask)


@lower(aten.convolution_backward.default)
def convolution_backward(grad_output, input, weight, bias_sizes, stride, padding, dilation, transposed,
                         output_padding, groups, output_mask):
    if transposed:
        raise Unsupported("aten::convolution_backward: transposed convolutions have no devkit gradient")
    dx, dw, db = run("ConvGrad", [to_array(grad_output), to_array(input), to_array(weight)],
                     **_conv_attrs(weight, stride, padding, dilation, groups))
    return tuple(out(a) if wanted else None for a, wanted in zip((dx, dw, db), output_mask))


@lower(aten.native_layer_norm.default)
def native_layer_norm(input, normalized_shape, weight, bias, eps):
    x = to_array(input)
    scale = to_array(weight) if weight is not None else np.ones(tuple(normalized_shape), x.dtype)
    inputs = [x, scale] + ([to_array(bias)] if bias is not None else [])
    y, mean_, rstd = run("LayerNormalization", inputs, axis=-len(normalized_shape), epsilon=eps)
    return out(y), out(mean_), out(rstd)


@lower(aten.native_layer_norm_backward.default)
def native_layer_norm_backward(grad_out, input, normalized_shape, mean_, rstd, weight, bias, output_mask):
    x = to_array(input)
    scale = to_array(weight) if weight is not None else np.ones(tuple(normalized_shape), x.dtype)
    dx, dscale, db = run("LayerNormalizationGrad", [to_array(grad_out), x, scale, to_array(mean_), to_array(rstd)],
                         axis=-len(normalized_shape))
    return (out(dx) if output_mask[0] else None,
            out(dscale) if output_mask[1] and weight is not None else None,
            out(db) if output_mask[2] and bias is not None else None)


def _pool_attrs(x_ndim, kernel_size, stride, padding, dilation=None, ceil_mode=False):
    spatial = x_ndim - 2
    fill = lambda v, default: (list(v) * spatial if len(v) == 1 else list(v)) if v else default  # noqa: E731
    kernel = fill(kernel_size, None)
    attrs = {"kernel_shape": kernel, "strides": fill(stride, kernel), "pads": fill(padding, [0] * spatial) * 2,
             "ceil_mode": int(ceil_mode)}
    if dilation is not None:
        attrs["dilations"] = fill(dilation, [1] * spatial)
    return attrs


def _plane_offsets(x: Array, spatial: int) -> Array:
    """(N, C, 1, ...) offsets of each plane in MaxPool's flattened indices."""
    planes = math.prod(x.shape[:2])
    plane_size = math.prod(x.shape[2:])
    offsets = run_op("Range", [np.asarray(0, np.int64), np.asarray(planes * plane_size, np.int64),
                               np.asarray(plane_size, np.int64)], device=x.device)[0]
    return run1("Reshape", [offsets, list(x.shape[:2]) + [1] * spatial])


@lower(aten.max_pool2d_with_indices.default, aten.max_pool3d_with_indices.default)
def max_pool_with_indices(self, kernel_size, stride=(), padding=0, dilation=1, ceil_mode=False):
    x = to_array(self)
    padding = [padding] if isinstance(padding, int) else padding
    dilation = [dilation] if isinstance(dilation, int) else dilation
    y, indices = run("MaxPool", [x], **_pool_attrs(x.ndim, kernel_size, stride, padding, dilation, ceil_mode))
    return out(y), out(run1("Sub", [indices, _plane_offsets(x, x.ndim - 2)]))


@lower(aten.max_pool2d_with_indices_backward.default, aten.max_pool3d_with_indices_backward.default)
def max_pool_with_indices_backward(grad_output, self, kernel_size, stride, padding, dilation, ceil_mode, indices):
    x = to_array(self)
    flat = run1("Add", [to_array(indices), _plane_offsets(x, x.ndim - 2)])
    return out(run1("MaxPoolGrad", [to_array(grad_output), flat, np.asarray(x.shape, np.int64)]))


@lower(aten.avg_pool2d.default, aten.avg_pool3d.default)
def avg_pool(self, kernel_size, stride=(), padding=0, ceil_mode=False, count_include_pad=True,
             divisor_override=None):
    x = to_array(self)
    padding = [padding] if isinstance(padding, int) else padding
    attrs = _pool_attrs(x.ndim, kernel_size, stride, padding, None, ceil_mode)
    if divisor_override is None:
        return out(run1("AveragePool", [x], count_include_pad=int(count_include_pad), **attrs))
    if ceil_mode:
        raise Unsupported("aten::avg_pool2d: devkit runs divisor_override without ceil_mode")
    mean_ = run1("AveragePool", [x], count_include_pad=1, **attrs)  # the window sum over its full size
    return out(run1("Mul", [mean_, np.asarray(math.prod(attrs["kernel_shape"]) / divisor_override, x.dtype)]))


@lower(aten.avg_pool2d_backward.default, aten.avg_pool3d_backward.default)
def avg_pool_backward(grad_output, self, kernel_size, stride, padding, ceil_mode, count_include_pad,
                      divisor_override):
    if divisor_override is not None:
        raise Unsupported("aten::avg_pool2d_backward: devkit's AveragePoolGrad has no divisor_override")
    x = to_array(self)
    return out(run1("AveragePoolGrad", [to_array(grad_output), np.asarray(x.shape, np.int64)],
                    count_include_pad=int(count_include_pad),
                    **_pool_attrs(x.ndim, kernel_size, stride, padding, None, ceil_mode)))


@lower(aten._adaptive_avg_pool2d.default)
def adaptive_avg_pool2d(self, output_size):
    x = to_array(self)
    in_h, in_w = x.shape[-2:]
    out_h, out_w = output_size
    if in_h % out_h or in_w % out_w:
        raise Unsupported("aten::_adaptive_avg_pool2d: devkit runs only output sizes that divide the input")
    kernel = [in_h // out_h, in_w // out_w]
    return out(run1("AveragePool", [x], kernel_shape=kernel, strides=kernel))


# -- indexing and data movement --------------------------------------------------------------------

@lower(aten.cat.default)
def cat(tensors, dim=0):
    tensors = [t for t in tensors if not (t.dim() == 1 and t.shape[0] == 0)] or list(tensors[:1])
    dtype = result_dtype(*tensors)
    return out(run1("Concat", [arr(t, dtype) for t in tensors], axis=dim % max(tensors[0].dim(), 1)))


@lower(aten.constant_pad_nd.default)
def constant_pad_nd(self, pad, value=0):
    x = to_array(self)
    begins, ends = [0] * x.ndim, [0] * x.ndim
    for i in range(len(pad) // 2):
        begins[x.ndim - 1 - i], ends[x.ndim - 1 - i] = pad[2 * i], pad[2 * i + 1]
    return out(run1("Pad", [x, np.asarray(begins + ends, np.int64), np.asarray(value, x.dtype)]))


@lower(aten.flip.default)
def flip(self, dims):
    x = to_array(self)
    axes = axes_of(dims, x.ndim)
    if not axes or x.ndim == 0:
        return clone(self)
    big = np.iinfo(np.int64).max
    return out(run1("Slice", [x, np.asarray([-1] * len(axes)), np.asarray([-big] * len(axes)),
                              np.asarray(axes), np.asarray([-1] * len(axes))]))


@lower(aten.index_select.default)
def index_select(self, dim, index):
    x = to_array(self)
    if x.ndim == 0:
        return clone(self)
    return out(run1("Gather", [x, arr(index, torch.int64)], axis=dim))


@lower(aten.gather.default)
def gather(self, dim, index, *, sparse_grad=False):
    x = to_array(self)
    if x.ndim == 0:
        return clone(self)
    return out(run1("GatherElements", [x, arr(index, torch.int64)], axis=dim))


_SCATTER_REDUCTIONS = {"sum": "add", "add": "add", "prod": "mul", "multiply": "mul", "amax": "max",
                       "amin": "min"}


def _scatter(self, dim, index, src, reduction="none"):
    x = to_array(self)
    idx = arr(index, torch.int64)
    if is_devkit(src):
        updates = to_array(src)
        if tuple(updates.shape) != tuple(idx.shape):
            updates = run1("Slice", [updates, np.zeros(updates.ndim, np.int64), np.asarray(idx.shape, np.int64)])
        updates = cast(updates, x.dtype)
    else:
        updates = run1("Expand", [run_op("Identity", [np.asarray(src, x.dtype)], device=x.device)[0],
                                  np.asarray(idx.shape, np.int64)])
    if x.ndim == 0:
        return out(run1("Identity", [updates.reshape(())])) if idx.size else clone(self)
    return out(run1("ScatterElements", [x, idx, updates], axis=dim, reduction=reduction))


@lower(aten.scatter.src, aten.scatter.value)
def scatter(self, dim, index, src):
    return _scatter(self, dim, index, src)


@lower(aten.scatter.reduce, aten.scatter.value_reduce)
def scatter_reduce_legacy(self, dim, index, src, *, reduce):
    return _scatter(self, dim, index, src, _SCATTER_REDUCTIONS[reduce])


@lower(aten.scatter_add.default)
def scatter_add(self, dim, index, src):
    return _scatter(self, dim, index, src, "add")


@lower(aten.scatter_reduce.two)
def scatter_reduce(self, dim, index, src, reduce, *, include_self=True):
    if not include_self or reduce == "mean":
        raise Unsupported(f"aten::scatter_reduce: devkit runs include_self=True with sum, prod, amax, amin "
                                  f"(got reduce={reduce!r}, include_self={include_self})")
    return _scatter(self, dim, index, src, _SCATTER_REDUCTIONS[reduce])


def _leading_indices(self, indices, what):
    """The integer index tensors of ``indices`` (the leading dims), broadcast and stacked for GatherND."""
    if any(i is None for i in indices) or any(i.dtype in (torch.bool, torch.uint8) for i in indices):
        raise Unsupported(f"aten::{what}: devkit runs integer indices on the leading dims only")
    arrays = [arr(i, torch.int64) for i in indices]
    shape = np.broadcast_shapes(*[a.shape for a in arrays])
    sizes = np.asarray(self.shape[:len(arrays)], np.int64).reshape([1] * len(shape) + [len(arrays)])
    stacked = run1("Concat", [run1("Unsqueeze", [run1("Expand", [a, np.asarray(shape, np.int64)]), [-1]])
                              for a in arrays], axis=-1)
    return run1("Mod", [stacked, sizes])  # negative indices count from the end


@lower(aten.index.Tensor)
def index(self, indices):
    indices = list(indices)
    while indices and indices[-1] is None:
        indices.pop()
    single = [k for k, i in enumerate(indices) if i is not None]
    if len(single) == 1 and indices[single[0]].dtype not in (torch.bool, torch.uint8):
        axis = single[0]
        idx = arr(indices[axis], torch.int64)
        return out(run1("Gather", [to_array(self), idx], axis=axis))
    if len(indices) == 1 and indices[0].dtype == torch.bool and indices[0].shape == self.shape:
        x = to_array(self)
        where_true = run1("Transpose", [run1("NonZero", [to_array(indices[0])])])
        return out(run1("GatherND", [x, where_true]))
    return out(run1("GatherND", [to_array(self), _leading_indices(self, indices, "index.Tensor")]))


@lower(aten.index_put.default)
def index_put(self, indices, values, accumulate=False):
    indices = list(indices)
    while indices and indices[-1] is None:
        indices.pop()
    x = to_array(self)
    if len(indices) == 1 and indices[0].dtype == torch.bool:
        positions = run1("Transpose", [run1("NonZero", [to_array(indices[0])])])
    else:
        positions = _leading_indices(self, indices, "index_put")
    update_shape = tuple(positions.shape[:-1]) + tuple(x.shape[positions.shape[-1]:])
    source = to_array(values) if is_devkit(values) else \
        run_op("Identity", [np.asarray(values.item() if isinstance(values, torch.Tensor) else values, x.dtype)],
               device=x.device)[0]
    updates = run1("Expand", [cast(source, x.dtype), np.asarray(update_shape, np.int64)])
    return out(run1("ScatterND", [x, positions, updates], reduction="add" if accumulate else "none"))


@lower(aten.repeat.default)
def repeat(self, repeats):
    x = to_array(self)
    lead = len(repeats) - x.ndim
    if lead:
        x = run1("Reshape", [x, [1] * lead + list(x.shape)])
    return out(run1("Tile", [x, np.asarray(repeats, np.int64)]))


@lower(aten.tril.default)
def tril(self, diagonal=0):
    return out(run1("Trilu", [to_array(self), np.asarray(diagonal, np.int64)], upper=0))


@lower(aten.triu.default)
def triu(self, diagonal=0):
    return out(run1("Trilu", [to_array(self), np.asarray(diagonal, np.int64)], upper=1))


@lower(aten.nonzero.default)
def nonzero(self):
    x = to_array(self)
    if x.ndim == 0:
        x = x.reshape(1) if x.is_contiguous else run1("Identity", [x]).reshape(1)
        found = run1("NonZero", [x])
        return out(run1("Reshape", [found, [found.shape[1], 0]]) if found.shape[1] else
                   run_op("Identity", [np.zeros((0, 0), np.int64)], device=x.device)[0])
    return out(run1("Transpose", [run1("NonZero", [x])]))


@lower(aten.embedding.default)
def embedding(weight, indices, padding_idx=-1, scale_grad_by_freq=False, sparse=False):
    return out(run1("Gather", [to_array(weight), arr(indices, torch.int64)], axis=0))


@lower(aten.native_dropout.default)
def native_dropout(input, p, train):
    if not train or p == 0:
        x = to_array(input)
        return clone(input), fill(_memory.empty_tensor(x.shape, torch.bool, x.device), True)
    keep = torch.rand(input.shape) >= p  # torch's CPU generator, as torch CPU draws it
    mask = from_host(_memory.empty_tensor(input.shape, torch.bool, to_array(input).device), keep)
    x = to_array(input)
    scaled = run1("Mul", [x, np.asarray(1 / (1 - p), x.dtype)])
    return out(run1("Where", [to_array(mask), scaled, np.asarray(0, x.dtype)])), mask


@lower(aten.native_dropout_backward.default)
def native_dropout_backward(grad_output, mask, scale):
    g = to_array(grad_output)
    return out(run1("Where", [to_array(mask), run1("Mul", [g, np.asarray(scale, g.dtype)]), np.asarray(0, g.dtype)]))


@lower(aten.masked_select.default)
def masked_select(self, mask):
    shape = list(np.broadcast_shapes(tuple(self.shape), tuple(mask.shape)))
    x = run1("Expand", [to_array(self), np.asarray(shape, np.int64)])
    flags = run1("Expand", [arr(mask, torch.bool), np.asarray(shape, np.int64)])
    if not shape:
        x, flags = x.reshape(1), flags.reshape(1)
    return out(run1("GatherND", [x, run1("Transpose", [run1("NonZero", [flags])])]))


@lower(aten.arange.start_out)
def arange_out(start, end, step=1, *, out):
    result = arange(start, end, step, dtype=out.dtype)
    if tuple(out.shape) != tuple(result.shape):
        out.resize_(result.shape)
    return write(out, to_array(result))


@lower(aten._index_put_impl_.default)
def _index_put_impl_(self, indices, values, accumulate=False, unsafe=False):
    return write(self, to_array(index_put(self, indices, values, accumulate)))


@lower(aten.atan2.default)
def atan2(self, other):
    dtype = result_dtype(self, other, kind=PROMOTION.INT_TO_FLOAT)
    host = numpy_dtype(dtype)
    y, x = arr(self, dtype), arr(other, dtype)
    zero, pi = np.asarray(0, host), np.asarray(math.pi, host)
    base = run1("Atan", [run1("Div", [y, x])])  # x == 0 gives +-inf, so +-pi/2
    left = run1("Where", [run1("Less", [y, zero]), run1("Sub", [base, pi]), run1("Add", [base, pi])])
    result = run1("Where", [run1("Less", [x, zero]), left, base])
    origin = run1("And", [run1("Equal", [x, zero]), run1("Equal", [y, zero])])
    return out(run1("Where", [origin, zero, result]))


@lower(aten.hypot.default)
def hypot(self, other):
    dtype = result_dtype(self, other, kind=PROMOTION.INT_TO_FLOAT)
    a, b = arr(self, dtype), arr(other, dtype)
    return out(run1("Sqrt", [run1("Add", [run1("Mul", [a, a]), run1("Mul", [b, b])])]))


@lower(aten.erfc.default)
def erfc(self):
    x = arr(self, result_dtype(self, kind=PROMOTION.INT_TO_FLOAT))
    return out(run1("Neg", [run1("Sub", [run1("Erf", [x]), np.asarray(1, x.dtype)])]))


def _nan_ignoring(onnx):
    def fmax_fmin(self, other):
        dtype = result_dtype(self, other)
        a, b = arr(self, dtype), arr(other, dtype)
        both = run1(onnx, [a, b])
        if not dtype.is_floating_point:
            return out(both)
        return out(run1("Where", [run1("IsNaN", [a]), b, run1("Where", [run1("IsNaN", [b]), a, both])]))
    return fmax_fmin


lower(aten.fmax.default)(_nan_ignoring("Max"))
lower(aten.fmin.default)(_nan_ignoring("Min"))


@lower(aten.signbit.default)
def signbit(self):
    x = to_array(self)
    if not self.dtype.is_floating_point:
        return out(run1("Less", [x, np.asarray(0, x.dtype)]))
    one = np.asarray(1, x.dtype)
    # -0.0 and negative NaN: the sign of 1/x and of copysign are what signbit reads
    negative = run1("Less", [x, np.asarray(0, x.dtype)])
    negative_zero = run1("And", [run1("Equal", [x, np.asarray(0, x.dtype)]),
                                 run1("Less", [run1("Div", [one, x]), np.asarray(0, x.dtype)])])
    return out(run1("Or", [negative, negative_zero]))


@lower(aten.equal.default)
def equal(self, other):
    if tuple(self.shape) != tuple(other.shape):
        return False
    same = run1("Equal", [to_array(self), arr(other, self.dtype)])
    return bool(run1("ReduceMin", [cast(same, np.uint8)], keepdims=0).numpy()) if same.size else True


@lower(aten.addmv.default)
def addmv(self, mat, vec, *, beta=1, alpha=1):
    product = run1("MatMul", [to_array(mat), to_array(vec)])
    if alpha != 1:
        product = run1("Mul", [product, np.asarray(alpha, product.dtype)])
    if beta == 0:
        return out(product)
    bias = arr(self, mat.dtype)
    if beta != 1:
        bias = run1("Mul", [bias, np.asarray(beta, product.dtype)])
    return out(run1("Add", [product, bias]))
