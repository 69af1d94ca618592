"""The PrivateUse1 kernel: every aten op that reaches a devkit tensor comes here.

An op runs, in this order of preference: its lowering (``_aten.LOWERINGS``);
its in-place or ``out=`` form through the functional lowering; torch's
decomposition of it (``torch._decomp``), whose ops come back here; torch's CPU
kernel when the user allows CPU fallback (``devkit.ops.set_fallback``),
counted in ``devkit.fallback_report()``. Otherwise it raises NotImplementedError
naming the op.
"""

from __future__ import annotations

import threading

import torch
from torch._decomp import core_aten_decompositions, decomposition_table
from torch.utils import _pytree

from ..ops import resolution as _resolution
from . import _aten, _memory, _replay
from ._devices import registered_device
from ._memory import Unsupported

_DECOMPOSITIONS = {**decomposition_table, **core_aten_decompositions()}
_resolved: dict = {}
_decomposing = threading.local()


def _mutated_arguments(op) -> list[str]:
    return [a.name for a in op._schema.arguments if a.alias_info is not None and a.alias_info.is_write]


def _functional_overload(op):
    """The functional overload whose result an in-place or out= overload writes, or None."""
    schema = op._schema
    mutated = _mutated_arguments(op)
    if not mutated:
        return None
    packet_name = op._schema.name.split("::")[1]
    if packet_name.endswith("_") and mutated == [schema.arguments[0].name]:
        packet = getattr(torch.ops.aten, packet_name[:-1], None)
        overload = op._overloadname
        if packet is not None and overload in packet.overloads():
            return getattr(packet, overload)
        return None
    inputs = [(a.name, str(a.type)) for a in schema.arguments if a.name not in mutated]
    packet = op.overloadpacket
    for name in packet.overloads():
        candidate = getattr(packet, name)
        if not _mutated_arguments(candidate) and \
                [(a.name, str(a.type)) for a in candidate._schema.arguments] == inputs:
            return candidate
    return None


def _inplace_or_out(op, functional, functional_impl):
    mutated = _mutated_arguments(op)
    names = [a.name for a in op._schema.arguments]

    def run_and_write(*args, **kwargs):
        bound = dict(zip(names, args), **kwargs)
        destinations = [bound.pop(name) for name in mutated]
        if op._schema.name.endswith("_"):  # in place: self is both an input and the destination
            bound[mutated[0]] = destinations[0]
        positional = [bound.pop(a.name) for a in functional._schema.arguments
                      if not a.kwarg_only and a.name in bound]
        result = functional_impl(*positional, **bound)
        results = result if isinstance(result, (tuple, list)) else (result,)
        for destination, value in zip(destinations, results):
            if tuple(destination.shape) != tuple(value.shape):
                destination.resize_(value.shape)
            _aten.write(destination, _memory.to_array(value))
        return destinations[0] if len(destinations) == 1 else tuple(destinations)
    return run_and_write


def _decomposed(op, decomposition):
    def run_decomposition(*args, **kwargs):
        active = getattr(_decomposing, "ops", None)
        if active is None:
            active = _decomposing.ops = set()
        if op in active:  # the decomposition calls its own op: devkit has no kernel for it
            raise Unsupported(_no_lowering(op))
        active.add(op)
        try:
            result = decomposition(*args, **kwargs)
        finally:
            active.discard(op)
        if result is NotImplemented:  # torch's decomposition declines these arguments
            raise Unsupported(_no_lowering(op))
        return result
    return run_decomposition


def _lowering_then_decomposition(op, lowering, decomposition):
    """A lowering that refuses some arguments (Unsupported) hands them to torch's decomposition."""
    def run(*args, **kwargs):
        try:
            return lowering(*args, **kwargs)
        except Unsupported:
            return decomposition(*args, **kwargs)
    return run


def implementation(op):
    """How devkit runs ``op``, or None where only the CPU fallback can."""
    if op in _resolved:
        return _resolved[op]
    impl = _aten.LOWERINGS.get(op)
    if impl is None and (functional := _functional_overload(op)) is not None:
        inner = implementation(functional)
        if inner is not None:
            impl = _inplace_or_out(op, functional, inner)
    if op in _DECOMPOSITIONS:
        decomposition = _decomposed(op, _DECOMPOSITIONS[op])
        impl = decomposition if impl is None else _lowering_then_decomposition(op, impl, decomposition)
    _resolved[op] = impl
    return impl


def _plugin_name() -> str:
    return registered_device().plugin.name


def _op_name(op) -> str:
    return f"aten::{op._schema.name.split('::')[1]}.{op._overloadname}"


def _no_lowering(op) -> str:
    return f"{_op_name(op)} has no devkit lowering"


def _cpu_or_raise(op, args, kwargs, reason: str):
    if not _resolution.fallback_enabled():
        raise Unsupported(f"{reason} (plugin '{_plugin_name()}'); devkit.ops.set_fallback(True) "
                          f"runs it on torch's CPU")
    return _run_on_cpu(op, args, kwargs)


def _run_on_cpu(op, args, kwargs):
    dtype = next((a.dtype for a in _pytree.tree_leaves((args, kwargs)) if _aten.is_devkit(a)), None)
    _resolution.count_fallback(_plugin_name(), f"aten::{op.name().split('::')[1]}",
                                 _memory.numpy_dtype(dtype) if dtype is not None else None)
    originals = {}

    def to_cpu(value):
        if _aten.is_devkit(value):
            host = _aten.to_host(value)
            originals[id(host)] = value
            return host
        return value

    def to_device_type(value):
        if isinstance(value, torch.Tensor) and value.device.type == "cpu":
            return value.to(_memory.DEVICE_TYPE)
        return value

    cpu_args, cpu_kwargs = _pytree.tree_map(to_cpu, (args, kwargs))
    if "device" in cpu_kwargs:
        cpu_kwargs["device"] = torch.device("cpu")
    result = op(*cpu_args, **cpu_kwargs)
    mutated = _mutated_arguments(op)
    names = [a.name for a in op._schema.arguments]
    bound = dict(zip(names, cpu_args), **cpu_kwargs)
    for name in mutated:
        host = bound[name]
        if id(host) in originals:
            target = originals[id(host)]
            if tuple(target.shape) != tuple(host.shape):
                target.resize_(host.shape)
            _aten.from_host(target, host)
    if mutated:
        return (originals.get(id(result), result) if isinstance(result, torch.Tensor) else
                type(result)(originals.get(id(r), r) for r in result))
    return _pytree.tree_map(to_device_type, result)


def kernel(op, *args, **kwargs):
    """The PrivateUse1 backend fallback torch calls for every aten op on a devkit tensor."""
    return _run(op, _resolved.get(op) or implementation(op), args, kwargs)


def _run(op, impl, args, kwargs):
    if impl is None:
        return _cpu_or_raise(op, args, kwargs, _no_lowering(op))
    try:
        return _replay.run(op, impl, args, kwargs)
    except Unsupported as exc:
        if getattr(_decomposing, "ops", None):  # inside a decomposition: the outermost op decides
            raise
        reason = str(exc) if str(exc).startswith("aten::") else f"{_op_name(op)}: {exc}"
        return _cpu_or_raise(op, args, kwargs, reason.split(" (plugin")[0])


def kernel_for(op):
    """The PrivateUse1 kernel of one op devkit runs (``implementation(op)`` is not None)."""
    impl = implementation(op)

    def op_kernel(*args, **kwargs):
        return _run(op, impl, args, kwargs)
    return op_kernel


# Ops whose composite kernel raises for a backend of its own: they need a devkit kernel.
_OVERRIDEABLE = {torch.ops.aten.convolution_overrideable.default,
                 torch.ops.aten.convolution_backward_overrideable.default}


def direct_kernel_ops() -> list:
    """The lowered ops and their in-place and out= forms that get a devkit kernel of their own:
    those without a composite kernel (a structured op's default, CompositeExplicitAutograd-
    NonFunctional, allocates and calls the out= form). Composite ones keep torch's kernel:
    CompositeImplicitAutograd decomposes above autograd, CompositeExplicitAutograd (detach,
    alias, clone) builds on ops that come here."""
    packets = {op.overloadpacket for op in _aten.LOWERINGS}
    inplace = {getattr(torch.ops.aten, p.__name__ + "_", None) for p in packets} - {None} - packets
    ops = []
    for packet in [*packets, *inplace]:
        for name in packet.overloads():
            op = getattr(packet, name)
            try:
                composite = any(torch._C._dispatch_has_kernel_for_dispatch_key(op.name(), key) for key in
                                ("CompositeImplicitAutograd", "CompositeExplicitAutograd"))
            except RuntimeError:  # a TorchScript-only overload: no dispatcher entry
                continue
            if composite and op not in _OVERRIDEABLE:
                continue
            if implementation(op) is not None:
                ops.append(op)
    return ops


def supported_ops() -> list:
    """Every aten OpOverload with a devkit lowering, with or without a devkit in-place/out form."""
    return sorted(_aten.LOWERINGS, key=str)
