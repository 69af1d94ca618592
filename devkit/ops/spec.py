"""The operator specification: one declarative OpSpec per op.

An OpSpec says what a kernel for the op must do, in terms the host can check
before any kernel runs: inputs and outputs, attributes with defaults and
validation, the dtypes of the key input, shape inference, and a NumPy
reference with the tolerance each dtype is held to.

Conventions every spec follows:

- ``infer(inputs, attrs)`` gets one :class:`TensorInfo` per input (``None``
  for an omitted optional input) and the attributes after defaults; it
  returns ``[(shape, dtype), ...]`` for the outputs, or raises ``ValueError``
  (shapes, attribute values) or ``TypeError`` (dtypes) with a message that
  names the problem; the dispatcher prefixes the op name.
- A ``host=True`` input carries values that shape inference needs (Reshape's
  shape, Slice's starts, TopK's K, ...). The host reads it and passes it to
  ``infer``, ``reference`` and the kernel as an attribute named after the
  input (an ``ints`` or ``floats`` attribute); kernels never see it as a
  tensor. ``TensorInfo.value`` holds it for ``infer`` as well.
- ``reference(inputs, attrs)`` gets NumPy arrays -- floating inputs upcast to
  float64, integers and bools as they are -- and returns the outputs, in the
  output dtypes (the comparison casts its result to float64 anyway).
- ``cases(dtype, rng)`` returns the op's conformance cases for one dtype;
  devkit.ops.testing has the generators for edge values.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from .. import dtypes as _dtypes
from ..dtypes import dtype_name

# -- dtype groups ---------------------------------------------------------------

bfloat16 = _dtypes.bfloat16
F32, F64, F16, BF16 = np.dtype("float32"), np.dtype("float64"), np.dtype("float16"), bfloat16
I8, U8, I32, I64 = np.dtype("int8"), np.dtype("uint8"), np.dtype("int32"), np.dtype("int64")
BOOL = np.dtype("bool")

FLOAT = (F32, F64)                 # every float op
LOW_FLOAT = (F16, BF16)            # storage types, computed in float32
ALL_FLOAT = FLOAT + LOW_FLOAT
INT = (I8, U8, I32, I64)
NUMERIC = ALL_FLOAT + INT
ALL = NUMERIC + (BOOL,)


# -- building blocks ---------------------------------------------------------------

class _Required:
    def __repr__(self) -> str:
        return "REQUIRED"


REQUIRED = _Required()
ATTR_KINDS = ("int", "float", "ints", "floats", "string", "dtype")


@dataclasses.dataclass(frozen=True)
class Attr:
    """An attribute. ``default`` is REQUIRED, None (optional, no default: the
    kernel sees it absent) or a value. ``choices`` limits the values; ``check``
    returns an error message for a bad value, or None."""

    name: str
    kind: str
    default: Any = None
    choices: tuple | None = None
    check: Callable[[Any], str | None] | None = None
    doc: str = ""

    def __post_init__(self):
        if self.kind not in ATTR_KINDS:
            raise ValueError(f"attribute {self.name}: kind {self.kind!r} is not one of {ATTR_KINDS}")


@dataclasses.dataclass(frozen=True)
class Input:
    """An input. ``variadic`` (last input only): one or more tensors.
    ``host``: read on the host and passed on as an attribute (see module doc).
    ``read_by_infer``: a device input whose values shape inference needs (an
    output shape that depends on data, as NonZero's): the dispatcher copies it
    to the host for ``infer`` (TensorInfo.value) -- a synchronisation -- and
    still passes it to the kernel as a tensor."""

    name: str
    optional: bool = False
    variadic: bool = False
    host: bool = False
    read_by_infer: bool = False
    doc: str = ""


@dataclasses.dataclass(frozen=True)
class TensorInfo:
    """What shape inference sees of an input."""

    shape: tuple[int, ...]
    dtype: np.dtype
    value: np.ndarray | None = None  # host and read_by_infer inputs only

    @property
    def ndim(self) -> int:
        return len(self.shape)


@dataclasses.dataclass(frozen=True)
class Tolerance:
    """How far a result may be from the float64 reference.

    An element passes when ``|got - ref| <= ulp * spacing(ref)`` in the
    output dtype, or ``<= atol + rtol * |ref|``. NaN must meet NaN and an
    infinity the same infinity. All zero: exact."""

    ulp: float = 0.0
    rtol: float = 0.0
    atol: float = 0.0

    @property
    def exact(self) -> bool:
        return not (self.ulp or self.rtol or self.atol)

    def __str__(self) -> str:
        if self.exact:
            return "exact"
        parts = [f"{self.ulp:g} ulp"] if self.ulp else []
        parts += [f"rtol {self.rtol:g}"] if self.rtol else []
        parts += [f"atol {self.atol:g}"] if self.atol else []
        return " or ".join(parts)


EXACT = Tolerance()


@dataclasses.dataclass
class Case:
    """One conformance case: inputs in their test dtypes (None for an omitted
    optional input; plain lists or arrays for host inputs) and attributes.
    ``tolerance`` overrides the spec's; ``compare`` limits which outputs are
    compared (e.g. TopK's indices are ambiguous when values tie)."""

    name: str
    inputs: list
    attrs: dict = dataclasses.field(default_factory=dict)
    tolerance: Tolerance | None = None
    compare: Sequence[int] | None = None


@dataclasses.dataclass(frozen=True)
class Decomposition:
    """How to run an op from other ops when a plugin has no kernel for it.

    ``rule(b, inputs, attrs)`` gets a :class:`devkit.ops.dispatch.Builder`
    (``b("Add", x, y)`` runs an op on the same device and stream;
    ``b.const(value)`` puts a small constant there), the device inputs as
    Arrays (None where omitted), and the attributes after defaults with the
    host inputs' values under their names; it returns the outputs. ``uses``
    names the ops the rule calls, as ``"Op"`` (at the op's key dtype) or
    ``"Op[dtype]"``; a callable takes the key dtype. Tests check that a rule
    calls nothing else and that the graph of uses has no cycle.

    ``float32`` dtypes (float16 and bfloat16 unless the rule says otherwise)
    run as the op at float32 between Casts, as the native kernels compute;
    ``float64`` dtypes (float32 for the sums that kernels accumulate in
    double) likewise at float64.
    ``tolerance`` (per dtype name, or one) replaces the spec's where the
    rule's arithmetic differs from a kernel's (another summation order, an
    identity that rounds differently); ``reason`` says why."""

    rule: Callable[..., Sequence]
    uses: tuple[str, ...] | Callable[[np.dtype], tuple[str, ...]] = ()
    tolerance: dict | Tolerance | None = None
    reason: str = ""
    float32: tuple[np.dtype, ...] = LOW_FLOAT
    float64: tuple[np.dtype, ...] = ()

    def wider(self, dtype) -> np.dtype | None:
        """The dtype the op runs at instead of ``dtype`` (between Casts), or None."""
        return F32 if dtype in self.float32 else F64 if dtype in self.float64 else None

    def uses_for(self, op: str, dtype) -> list[tuple[str, np.dtype]]:
        """The (op, key dtype) pairs the rule for ``op`` calls at ``dtype``."""
        if (wide := self.wider(np.dtype(dtype))) is not None:
            return [("Cast", np.dtype(dtype)), (op, wide), ("Cast", wide)]
        names = self.uses(dtype) if callable(self.uses) else self.uses
        result = []
        for name in names:
            op, _, rest = name.partition("[")
            result.append((op, _dtypes.normalize(rest.rstrip("]")) if rest else np.dtype(dtype)))
        return result


@dataclasses.dataclass(frozen=True)
class OpSpec:
    name: str
    inputs: tuple[Input, ...]
    outputs: tuple[str, ...]
    dtypes: tuple[np.dtype, ...]         # of the key input
    infer: Callable[[list[TensorInfo | None], dict], list[tuple[tuple[int, ...], np.dtype]]]
    reference: Callable[[list, dict], list[np.ndarray]]
    cases: Callable[[np.dtype, np.random.Generator], list[Case]]
    attrs: tuple[Attr, ...] = ()
    key: int | str = 0                   # index of the key input, or a dtype attribute's name
    tolerance: dict | Tolerance = EXACT  # per dtype name ("float32", ...), or one for all
    opset: int = 17                      # the opset (of `domain`) whose semantics this follows
    domain: str = ""                     # "" is ONNX's default domain; also ai.onnx.preview.training, devkit
    doc: str = ""
    category: str = ""
    decompose: Decomposition | None = None  # None: a primitive, or an op every plugin must implement
    # The trailing outputs ONNX's schema marks optional (MaxPool's Indices, LayerNormalization's Mean and
    # InvStdDev): a caller may leave them out -- devkit.ops.X returns them only when asked (return_<name>=True
    # or outputs=n), run_op(outputs=n) and an ONNX node that leaves them unnamed do not get them.
    optional_outputs: int = 0
    # Of those, the trailing ones a kernel call may leave out: every plugin's kernel for the op takes the
    # shorter call and skips computing them (MaxPool's Indices). The other optional outputs a caller does
    # not want are still allocated and passed to the kernel, and the dispatcher drops them.
    skippable_outputs: int = 0

    def tolerance_for(self, dtype, decomposed: bool = False) -> Tolerance:
        """The tolerance for ``dtype``; ``decomposed``: when the op ran through its decomposition."""
        table = self.tolerance
        if decomposed and self.decompose is not None and self.decompose.tolerance is not None:
            table = self.decompose.tolerance
        if isinstance(table, Tolerance):
            return table
        return table.get(dtype_name(dtype), table.get("default", EXACT))

    @property
    def required_outputs(self) -> int:
        """How many leading outputs every call gets (variadic outputs: 1, the first)."""
        return len(self.outputs) - self.optional_outputs

    @property
    def host_inputs(self) -> tuple[str, ...]:
        return tuple(i.name for i in self.inputs if i.host)

    def attr(self, name: str) -> Attr | None:
        return next((a for a in self.attrs if a.name == name), None)


# -- the registry ----------------------------------------------------------------------

_REGISTRY: dict[str, OpSpec] = {}


def register(*specs: OpSpec) -> None:
    for spec in specs:
        if spec.name in _REGISTRY:
            raise ValueError(f"op {spec.name} is specified twice")
        if isinstance(spec.key, int) and spec.key >= len(spec.inputs):
            raise ValueError(f"op {spec.name}: key input {spec.key} does not exist")
        if isinstance(spec.key, str) and (spec.attr(spec.key) is None or spec.attr(spec.key).kind != "dtype"):
            raise ValueError(f"op {spec.name}: key {spec.key!r} is not a dtype attribute")
        variadic = any(name.endswith("...") for name in spec.outputs)
        if not 0 <= spec.optional_outputs <= (0 if variadic else len(spec.outputs) - 1):
            raise ValueError(f"op {spec.name}: optional_outputs {spec.optional_outputs} does not fit its outputs "
                             f"{', '.join(spec.outputs)} (at least the first is required)")
        if not 0 <= spec.skippable_outputs <= spec.optional_outputs:
            raise ValueError(f"op {spec.name}: skippable_outputs {spec.skippable_outputs} must be between 0 and "
                             f"optional_outputs ({spec.optional_outputs})")
        _REGISTRY[spec.name] = spec


def set_decompositions(rules: dict[str, Decomposition]) -> None:
    """Attaches decomposition rules to registered specs (a family's rules
    live in a module of their own, next to the family)."""
    for name, rule in rules.items():
        spec = get(name)
        if spec.decompose is not None:
            raise ValueError(f"op {name} has two decompositions")
        _REGISTRY[name] = dataclasses.replace(spec, decompose=rule)


def get(name: str) -> OpSpec:
    try:
        return _REGISTRY[name]
    except KeyError:
        raise ValueError(f"op '{name}' is not in the devkit operator set") from None


def all_specs() -> list[OpSpec]:
    return [_REGISTRY[name] for name in sorted(_REGISTRY)]


# -- helpers for infer -----------------------------------------------------------------

def broadcast_shapes(*shapes: Sequence[int]) -> tuple[int, ...]:
    """ONNX multidirectional (NumPy) broadcasting, with a message naming both shapes."""
    ndim = max((len(s) for s in shapes), default=0)
    result = []
    for d in range(ndim):
        sizes = {s[len(s) - ndim + d] for s in shapes if len(s) - ndim + d >= 0}
        sizes.discard(1)
        if len(sizes) > 1:
            raise ValueError("shapes " + ", ".join(str(tuple(s)) for s in shapes)
                             + " cannot be broadcast together")
        result.append(sizes.pop() if sizes else 1)
    return tuple(result)


def require_same_dtype(inputs: Sequence[TensorInfo | None], names: Sequence[str] | None = None) -> np.dtype:
    """The common dtype of the present inputs, or TypeError naming the mismatch."""
    present = [(i, t) for i, t in enumerate(inputs) if t is not None]
    first = present[0][1].dtype
    for i, t in present[1:]:
        if t.dtype != first:
            a = names[present[0][0]] if names else f"input {present[0][0]}"
            b = names[i] if names else f"input {i}"
            raise TypeError(f"{b} has dtype {dtype_name(t.dtype)} but {a} has {dtype_name(first)}")
    return first


def normalize_axis(axis: int, ndim: int, what: str = "axis") -> int:
    if not -ndim <= axis < ndim:
        raise ValueError(f"{what} {axis} is out of range for rank {ndim}")
    return axis + ndim if axis < 0 else axis
