"""The fusion pass: runs of a plan's elementwise and broadcast calls,
optionally with reductions over the last axis, become one generated kernel.

It works on a built plan's steps (plan.build_plan calls ``fuse_steps``
before the memory plan): consecutive steps whose ops have an expression
rule (devkit.codegen.rules) or are a last-axis reduction, over one domain
shape, form a group; a group of two or more is rendered for the plugin's
dialect (devkit.codegen.render), compiled once (devkit.codegen:
per process, and on disk by the plugin) and replaces its steps by one
FusedCall. The values only the group reads vanish from the arena.

A plugin without the codegen section keeps the unfused steps; so does a
group that fails to compile, counted in the report and in
devkit.ops.fallback_report (op "Fused(Mul+ReduceMean)"). See docs/fusion.md.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from .. import codegen
from ..abi import C, ffi
from ..errors import DeviceError
from ..ops import dispatch, resolution
from ..ops import spec as _spec
from .calls import key_dtype_of

# What a fused kernel computes in; other dtypes keep their kernels.
_FUSABLE_DTYPES = {np.dtype(np.float32), np.dtype(np.float64), np.dtype(bool), np.dtype(np.int32),
                   np.dtype(np.int64)}
_FLOAT_ONLY = {"Div", "Pow", "Exp", "Log", "Sqrt", "Sin", "Cos", "Atan", "Erf", "Floor", "Ceil", "Tanh",
               "Sigmoid", "Gelu", "Reciprocal", "Softplus", "LeakyRelu"}
# How many steps a run may move ahead of itself (fuse_steps): a few, so the
# values the run reads do not stay live for long.
_MAX_HOISTED = 4
# Ops whose native kernels a dialect keeps: in C, Softmax's exp of x - max(x)
# meets an attention mask's -1e9, for which glibc's vector exp (libmvec)
# takes its scalar path (below -708): the fused kernel runs 2-5x slower than
# the native Softmax, which it would replace.
_KEEP_NATIVE = {"c": {"Softmax", "LogSoftmax"}}
# Compiler flags per dialect: float sums may be reassociated (vectorised) and
# math functions set no errno; the ops' tolerances cover the reordering. In
# C, unrolling with variable expansion gives a row's reduction several
# accumulators, so it is not bound by one add's latency (about 20% off RMSNorm).
OPTIONS = {"c": "-fno-math-errno -fassociative-math -fno-signed-zeros -fno-trapping-math -funroll-loops "
                "-fvariable-expansion-in-unroller", "opencl-c": ""}


@dataclasses.dataclass
class FusionReport:
    """What a plan fused: the ops of each generated kernel, and the groups
    that kept their kernels (with why)."""

    dialect: str | None
    groups: list[list[str]] = dataclasses.field(default_factory=list)
    fallbacks: list[tuple[list[str], str]] = dataclasses.field(default_factory=list)

    @property
    def kernels_saved(self) -> int:
        return sum(len(group) - 1 for group in self.groups)

    def as_dict(self) -> dict:
        return {"dialect": self.dialect, "groups": len(self.groups), "ops_per_group": [len(g) for g in self.groups],
                "fused_ops": self.groups, "kernels_saved": self.kernels_saved,
                "fallbacks": [{"ops": ops, "reason": reason} for ops, reason in self.fallbacks]}


class _Stream:
    __slots__ = ("stream",)

    def __init__(self):
        self.stream = ffi.NULL


class FusedCall:
    """A generated kernel's launch, prebuilt: the plan's launchers run it as
    they run a KernelCall (``fn(cdata)`` with ``cdata.stream`` set), and
    ``inputs``/``outputs`` are its DK_Tensor arguments, which the plan binds."""

    __slots__ = ("plugin", "op", "ops", "fn", "cdata", "inputs", "outputs", "_keep")

    def __init__(self, device, dialect: str, function: codegen.Function, arguments, num_inputs: int,
                 kernel: codegen.Kernel, ops: list[str], keep: list):
        self.plugin = device.plugin
        self.op = "Fused"
        self.ops = ops
        self.cdata = _Stream()
        count = len(arguments)
        self.inputs = [arguments[k].tensor for k in range(num_inputs)]
        self.outputs = [arguments[k].tensor for k in range(num_inputs, count)]
        # In dialect "c" the local size is the smallest chunk worth a thread.
        shape = codegen.launch_shape((kernel.items,), (kernel.grain,) if dialect == "c" else ())
        launch, index, handle = device.plugin.api.codegen_launch, device.index, function.handle
        self.fn = lambda cdata: launch(index, handle, arguments, count, shape, cdata.stream)
        self._keep = [function, arguments, shape, keep]

    def label(self) -> str:
        return f"fused kernel {'+'.join(self.ops)}"


def _tensor_info(t) -> tuple[tuple, tuple, np.dtype]:
    shape = tuple(int(t.shape[k]) for k in range(t.ndim))
    strides = tuple(int(t.strides[k]) for k in range(t.ndim)) if t.strides != ffi.NULL else None
    if strides is None or t.ndim == 0:
        strides = tuple(int(np.prod(shape[k + 1:])) for k in range(t.ndim))
    return shape, strides, key_dtype_of(t)  # a DK_Tensor has the dtype field a DK_KernelEntry has


def _fusable(call, dialect: str) -> tuple[str, tuple] | None:
    """(how: "rule", "reduce", "decomposed" or "decomposed-rows" (a
    decomposition with reductions), the call's domain shape) for a call the
    pass can fuse in ``dialect``, else None."""
    op = call.op
    if call.cdata.num_outputs != 1:
        return None
    tensors = [call.inputs[k] for k in range(call.cdata.num_inputs)] + [call.outputs[0]]
    if any(t.ndim < 0 for t in tensors):
        return None
    infos = [_tensor_info(t) for t in tensors]
    if any(dtype not in _FUSABLE_DTYPES for _, _, dtype in infos):
        return None
    out_shape, _, out_dtype = infos[-1]
    if not np.prod(out_shape):
        return None
    attrs = {name: value for name, _, value in call.attributes}
    if op in codegen.RULES:
        if op in _FLOAT_ONLY and out_dtype.kind != "f" or op == "Cast" and np.dtype(attrs["to"]) not in _FUSABLE_DTYPES:
            return None
        return "rule", out_shape
    if op in _KEEP_NATIVE.get(dialect, ()):
        return None
    if op not in codegen.REDUCTIONS and (ops := _decomposed(call)) is not None:
        # reductions inside make a row group over the op's own shape
        rows = [o.attrs["row"] for o in ops if o.op in codegen.REDUCTIONS]
        if any(row != out_shape for row in rows):
            return None
        return ("decomposed-rows" if rows else "decomposed"), out_shape
    if op in codegen.REDUCTIONS and len(infos) == 2:
        in_shape, _, dtype = infos[0]
        axes = [a % len(in_shape) for a in attrs.get("axes", ())] if in_shape else []
        if (dtype.kind == "f" and axes == [len(in_shape) - 1] and attrs.get("keepdims", 1) == 1
                and in_shape[-1] > 1):
            return "reduce", in_shape
    return None


class _Symbol:
    """A value of a symbolic decomposition: what rules read of an Array."""

    def __init__(self, ref, shape, dtype):
        self.ref, self.shape, self.dtype = ref, tuple(shape), np.dtype(dtype)

    @property
    def ndim(self) -> int:
        return len(self.shape)


class _Unfusable(Exception):
    pass


class _SymbolicBuilder:
    """The Builder a decomposition rule gets (dispatch.Builder's
    interface), recording GroupOps instead of running ops: an op with an
    expression rule is recorded, one without is expanded through its own
    decomposition, anything else makes the op unfusable."""

    def __init__(self, ops: list, dtype):
        self.ops, self.dtype = ops, np.dtype(dtype)

    def __call__(self, op: str, *inputs, **attrs):
        if op in codegen.REDUCTIONS:
            return self._reduction(op, *inputs, **attrs)
        inputs = tuple(x if isinstance(x, _Symbol) or x is None or np.ndim(x) else
                       self.const(x, np.asarray(x).dtype if np.asarray(x).dtype == bool else self.dtype)
                       for x in inputs)
        if any(not isinstance(x, _Symbol) for x in inputs):
            raise _Unfusable(f"{op} gets a value that is not elementwise")
        stand_ins = [np.broadcast_to(np.zeros((), x.dtype), x.shape) for x in inputs]
        inferred = dispatch.infer(op, stand_ins, attrs)
        if len(inferred) != 1 or inferred[0][1] not in _FUSABLE_DTYPES:
            raise _Unfusable(f"{op} makes {len(inferred)} outputs or an unfusable dtype")
        shape, dtype = inferred[0]
        resolved = {**attrs}
        if op == "Cast":
            resolved["to"] = np.dtype(attrs["to"])
        if op in codegen.RULES:
            self.ops.append(codegen.GroupOp(op, tuple(x.ref for x in inputs), resolved,
                                            tuple(x.dtype for x in inputs), dtype, tuple(shape)))
            return _Symbol(("op", len(self.ops) - 1), shape, dtype)
        return expand(op, list(inputs), attrs, self.ops)

    def _reduction(self, op: str, x, axes=None, keepdims: int = 1, **attrs):
        """A reduction a row kernel holds: over the last axis of a row of more than one value, kept."""
        if not isinstance(x, _Symbol) or x.dtype.kind != "f" or not x.ndim or x.shape[-1] < 2:
            raise _Unfusable(f"{op} of a value that is not a float row")
        if [int(a) % x.ndim for a in np.ravel(axes if axes is not None else [])] != [x.ndim - 1] or keepdims != 1:
            raise _Unfusable(f"{op} over axes other than the last, or not kept")
        shape = x.shape[:-1] + (1,)
        self.ops.append(codegen.GroupOp(op, (x.ref,), {"axes": (-1,), "keepdims": 1, "row": x.shape}, (x.dtype,),
                                        x.dtype, shape))
        return _Symbol(("op", len(self.ops) - 1), shape, x.dtype)

    def infer(self, op: str, *inputs, **attrs):
        return dispatch.infer(op, [np.broadcast_to(np.zeros((), x.dtype), x.shape) for x in inputs], attrs)

    @staticmethod
    def spec_attr(op: str, name: str) -> bool:
        return _spec.get(op).attr(name) is not None

    def const(self, value, dtype=None):
        value = np.asarray(value)
        dtype = np.dtype(dtype) if dtype is not None else (np.dtype(bool) if value.dtype == bool else self.dtype)
        if value.size != 1 or dtype not in _FUSABLE_DTYPES:
            raise _Unfusable("a constant that is not a scalar")
        self.ops.append(codegen.GroupOp("Constant", (), {"value": value.reshape(()).astype(dtype).item()}, (),
                                        dtype, value.shape))
        return _Symbol(("op", len(self.ops) - 1), value.shape, dtype)


def expand(op: str, inputs: list, attrs: dict, ops: list):
    """The decomposition of ``op`` over symbols ``inputs``, recorded into ``ops``; its one output symbol."""
    spec = _spec.get(op)
    rule = spec.decompose
    if rule is None or len(spec.outputs) != 1 or any(d.host for d in spec.inputs[:len(inputs)]):
        raise _Unfusable(f"{op} has no elementwise decomposition")
    dtype = inputs[spec.key].dtype if not isinstance(spec.key, str) else np.dtype(attrs[spec.key])
    builder = _SymbolicBuilder(ops, dtype)
    if (wide := rule.wider(dtype)) is not None:  # between Casts, as dispatch._widened runs it
        if wide not in _FUSABLE_DTYPES:
            raise _Unfusable(f"{op} computes at {wide}")
        (wanted,) = [d for _, d in builder.infer(op, *inputs, **attrs)]
        widened = [builder("Cast", x, to=wide) if isinstance(x, _Symbol) and x.dtype == dtype else x for x in inputs]
        own = {**attrs, **({spec.key: wide} if isinstance(spec.key, str) else {})}
        out = expand(op, widened, own, ops)
        return builder("Cast", out, to=wanted) if out.dtype != wanted else out
    outputs = rule.rule(builder, inputs, dispatch.resolve_attrs(spec, attrs))
    outputs = list(outputs) if isinstance(outputs, (list, tuple)) else [outputs]
    if len(outputs) != 1 or not isinstance(outputs[0], _Symbol):
        raise _Unfusable(f"{op}'s decomposition does not make one value")
    return outputs[0]


def _decomposed(call) -> list | None:
    """The GroupOps of a call without an expression rule, from its op's
    decomposition (operands ("in", k) are the call's inputs), or None."""
    spec = _spec.get(call.op)
    if spec.decompose is None:
        return None
    symbols = []
    for k in range(call.cdata.num_inputs):
        shape, _, dtype = _tensor_info(call.inputs[k])
        symbols.append(_Symbol(("in", k), shape, dtype))
    ops: list = []
    try:
        out = expand(call.op, symbols, {name: value for name, _, value in call.attributes}, ops)
    except Exception:  # noqa: BLE001 - a rule that needs more than elementwise symbols: not fusable
        return None
    out_shape, _, out_dtype = _tensor_info(call.outputs[0])
    if out.shape != out_shape or out.dtype != out_dtype or out.ref[0] != "op":
        return None
    if out.ref[1] != len(ops) - 1:
        ops.append(codegen.GroupOp("Identity", (out.ref,), {}, (out.dtype,), out.dtype, out.shape))
    return ops


def _base(slot):
    """The value ``slot`` is a view of: a slot may carry a ``base`` (a call of
    a torch graph or a fused capture reading another's output through a
    view); else itself."""
    return getattr(slot, "base", slot)


def fuse_steps(device, steps: list, slots: list, graph_outputs: list) -> tuple[list, FusionReport]:
    """The plan's steps with its fusable runs replaced by FusedCalls (see the
    module doc); ``slots`` loses the values that only a group read. A read of
    a view of a value (a slot whose ``base`` is another) keeps that value in
    memory, and a step making the view's base ends the run before the reader."""
    dialect = codegen.dialect(device)
    report = FusionReport(dialect)
    if dialect is None or dialect not in OPTIONS:
        return steps, report
    readers: dict[int, int] = {}
    for _, inputs, _ in steps:
        for _, slot in inputs:
            readers[id(_base(slot))] = readers.get(id(_base(slot)), 0) + 1
    kept = {id(value) for value in graph_outputs}
    result, run, domain, rows = [], [], None, False
    # Steps that read nothing the open run makes, moved ahead of it so that
    # the run can go on past them (a gate's SiLU, the up projection's
    # MatMul, then their product); ``pending`` is the original order.
    hoisted, pending, made_by_run = [], [], set()

    def flush():
        fused = _fuse(device, dialect, run, domain, readers, kept, slots, report) if len(run) >= 2 else run
        if fused is run:
            result.extend(pending)
        else:
            first = min(slot.first for _, _, outs in run for _, slot in outs)
            for _, _, outs in hoisted:  # now written before the run's first step
                for _, slot in outs:
                    slot.first = min(slot.first, first)
            result.extend(hoisted + fused)
        for pieces in (run, hoisted, pending):
            pieces.clear()
        made_by_run.clear()

    for step in steps:
        kind = _fusable(step[0], dialect)
        if kind is None:
            if run and len(hoisted) < _MAX_HOISTED and not any(id(_base(slot)) in made_by_run for _, slot in step[1]):
                hoisted.append(step)
                pending.append(step)
                continue
            flush()
            result.append(step)
            continue
        how, shape = kind
        if any(slot is not _base(slot) and id(_base(slot)) in made_by_run for _, slot in step[1]):
            flush()  # it reads a view of what the run makes: from memory, after the run's kernel
        reduces = how in ("reduce", "decomposed-rows")
        if run and reduces and shape == domain:
            rows = True
        elif run and not reduces and (shape == domain or rows and shape == domain[:-1] + (1,)):
            pass
        else:
            flush()
            domain, rows = shape, reduces
        run.append(step)
        pending.append(step)
        made_by_run.update(id(slot) for _, slot in step[2])
    flush()
    return result, report


def _fuse(device, dialect: str, run: list, domain: tuple, readers: dict, kept: set, slots: list,
          report: FusionReport) -> list:
    ops_of_run = [call.op for call, _, _ in run]
    produced: dict[int, int] = {}  # id(slot) -> op index
    inputs: list[codegen.TensorArg] = []
    sources: list = []  # per input: its slot, or the DK_Tensor of a value outside the arena
    input_index: dict = {}
    group_ops = []
    ends: dict[int, int] = {}  # step -> the group op that makes its output
    reads_in_run: dict[int, int] = {}
    for m, (call, slot_inputs, slot_outputs) in enumerate(run):
        slot_at = dict(slot_inputs)
        args, in_dtypes = [], []
        for position in range(call.cdata.num_inputs):
            tensor = call.inputs[position]
            shape, strides, dtype = _tensor_info(tensor)
            slot = slot_at.get(position)
            if slot is not None:
                reads_in_run[id(slot)] = reads_in_run.get(id(slot), 0) + 1
            if slot is not None and id(slot) in produced:
                args.append(("op", produced[id(slot)]))
            else:
                key = id(slot) if slot is not None else (int(ffi.cast("uintptr_t", tensor.data)),
                                                          int(tensor.byte_offset), shape, strides, dtype.str)
                if key not in input_index:
                    input_index[key] = len(inputs)
                    inputs.append(codegen.TensorArg(shape, strides, dtype))
                    sources.append(slot if slot is not None else tensor)
                args.append(("in", input_index[key]))
            in_dtypes.append(dtype)
        out_shape, _, out_dtype = _tensor_info(call.outputs[0])
        if call.op in codegen.RULES or call.op in codegen.REDUCTIONS:
            group_ops.append(codegen.GroupOp(call.op, tuple(args), {n: v for n, _, v in call.attributes},
                                             tuple(in_dtypes), out_dtype, out_shape))
        else:  # its decomposition's ops, their operands renumbered into the group
            base = len(group_ops)
            for op in _decomposed(call):
                refs = tuple(args[k] if kind == "in" else ("op", base + k) for kind, k in op.args)
                group_ops.append(dataclasses.replace(op, args=refs))
        ends[m] = len(group_ops) - 1
        produced[id(slot_outputs[0][1])] = ends[m]
    outputs, output_slots, internal = [], [], []
    for m, (call, _, slot_outputs) in enumerate(run):
        slot = slot_outputs[0][1]
        if id(slot) in kept or readers.get(id(slot), 0) > reads_in_run.get(id(slot), 0):
            shape, strides, dtype = _tensor_info(call.outputs[0])
            outputs.append((ends[m], codegen.TensorArg(shape, strides, dtype)))
            output_slots.append(slot)
        else:
            internal.append(slot)
    if not outputs:
        return run
    group = codegen.Group(domain, inputs, group_ops, outputs)
    try:
        kernel = codegen.render(group, codegen.printer(dialect))
        module = codegen.compile_module(device, kernel.source, OPTIONS[dialect])
        function = module.function(kernel.name, ["tensor"] * kernel.num_tensors)
    except (DeviceError, NotImplementedError) as exc:
        reason = str(exc).splitlines()[0]
        report.fallbacks.append((ops_of_run, reason))
        resolution.count_fallback(device.plugin.name, f"Fused({'+'.join(ops_of_run)})", None)
        return run
    arguments = ffi.new("DK_LaunchArg[]", len(inputs) + len(outputs))
    tensor_size = ffi.sizeof("DK_Tensor")
    keep = [call for call, _, _ in run]  # the copied tensors' shape and strides live in the calls
    slot_inputs, slot_outputs = [], []
    for k, source in enumerate(sources):
        arguments[k].struct_size = codegen.ARG_STRUCT_SIZE
        arguments[k].kind = C.DK_ARG_TENSOR
        tensor = source if isinstance(source, ffi.CData) else _tensor_of(run, source)
        ffi.memmove(ffi.addressof(arguments[k], "tensor"), ffi.addressof(tensor), tensor_size)
        if not isinstance(source, ffi.CData):
            slot_inputs.append((k, source))
    for j, slot in enumerate(output_slots):
        k = len(inputs) + j
        arguments[k].struct_size = codegen.ARG_STRUCT_SIZE
        arguments[k].kind = C.DK_ARG_TENSOR
        maker = next(call for call, _, outs in run if outs[0][1] is slot)
        ffi.memmove(ffi.addressof(arguments[k], "tensor"), ffi.addressof(maker.outputs[0]), tensor_size)
        slot_outputs.append((j, slot))
    call = FusedCall(device, dialect, function, arguments, len(inputs), kernel, ops_of_run, keep)
    # The kernel reads its inputs and writes its outputs over the whole run:
    # no output may share bytes with an input (memory.Lifetime is inclusive).
    first = min(slot.first for _, _, outs in run for _, slot in outs)
    last = max(slot.first for _, _, outs in run for _, slot in outs)
    for _, slot in slot_inputs:
        slot.last = max(slot.last, last)
    for _, slot in slot_outputs:
        slot.first = min(slot.first, first)
    gone = {id(slot) for slot in internal}
    slots[:] = [slot for slot in slots if id(slot) not in gone]
    report.groups.append(ops_of_run)
    return [(call, slot_inputs, slot_outputs)]


def _tensor_of(run: list, slot):
    """A DK_Tensor of the run that reads ``slot`` (its shape and strides)."""
    for call, slot_inputs, _ in run:
        for position, s in slot_inputs:
            if s is slot:
                return call.inputs[position]
    raise AssertionError("an input slot no call of the run reads")

