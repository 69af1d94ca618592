"""The op specification checks itself, without any plugin: every case of
every (op, dtype) infers, and its reference produces exactly the inferred
output shapes and dtypes."""

from __future__ import annotations

import numpy as np
import pytest

from devkit import ops
from devkit.ops import dispatch, testing
from devkit.ops.dispatch import infer, reference_arguments
from devkit.ops.spec import ALL, dtype_name


def _params():
    return [pytest.param(spec.name, dtype_name(d), id=f"{spec.name}-{dtype_name(d)}")
            for spec in ops.all_specs() for d in spec.dtypes]


@pytest.mark.parametrize("op, dtype", _params())
def test_reference_matches_inferred_outputs(op, dtype):
    spec = ops.get(op)
    key = next(d for d in spec.dtypes if dtype_name(d) == dtype)
    cases = spec.cases(key, testing.rng_for(op, dtype))
    assert cases, f"{op}[{dtype}] has no conformance cases"
    assert len({c.name for c in cases}) == len(cases), "case names repeat"
    for case in cases:
        inferred = infer(op, case.inputs, case.attrs)
        ref_inputs, attrs = reference_arguments(spec, case.inputs, case.attrs)
        with np.errstate(all="ignore"):
            references = spec.reference(ref_inputs, attrs)
        assert len(references) == len(inferred), f"case {case.name}: output count"
        for i, ((shape, out_dtype), ref) in enumerate(zip(inferred, references)):
            ref = np.asarray(ref)
            assert ref.shape == shape, f"case {case.name} output {i}: reference {ref.shape}, infer {shape}"
            if out_dtype.kind in "biu":  # float outputs may come back as float64 from the reference
                assert ref.dtype == out_dtype, f"case {case.name} output {i}: {ref.dtype} vs {out_dtype}"


def test_every_spec_is_complete():
    for spec in ops.all_specs():
        assert spec.category in ops.FAMILIES, spec.name
        assert spec.domain in ("", "devkit", "ai.onnx.preview.training"), spec.name
        if spec.domain == "":
            assert 13 <= spec.opset <= 23, spec.name
        assert spec.doc, f"{spec.name} has no doc"
        assert set(spec.dtypes) <= set(ALL), spec.name
        for dtype in spec.dtypes:
            spec.tolerance_for(dtype)


# -- the primitive set and the decompositions ----------------------------------------------------------

from devkit.ops import resolution  # noqa: E402


def test_primitives_are_a_small_frozen_versioned_subset_of_the_op_set():
    assert isinstance(ops.PRIMITIVES, frozenset)
    assert len(ops.PRIMITIVES) <= 32
    assert ops.PRIMITIVES <= {s.name for s in ops.all_specs()}
    assert ops.PRIMITIVES_VERSION == 1
    from devkit.ops.primitives import REASONS
    assert set(REASONS) == set(ops.PRIMITIVES), "every primitive says why it is one"


def test_every_op_is_a_primitive_or_has_a_decomposition():
    for spec in ops.all_specs():
        if spec.name in ops.PRIMITIVES:
            assert spec.decompose is None, f"primitive {spec.name} has a decomposition"
        else:
            assert spec.decompose is not None, f"{spec.name} is neither a primitive nor decomposed"


def test_decompositions_use_ops_and_dtypes_of_the_op_set():
    for spec in ops.all_specs():
        for dtype in spec.dtypes:
            for op, used in resolution.decomposition_uses((spec.name, dtype_name(dtype))):
                assert used in {dtype_name(d) for d in ops.get(op).dtypes}, (
                    f"{spec.name}[{dtype_name(dtype)}] uses {op}[{used}], a dtype {op} does not take")


def test_the_decomposition_graph_has_no_cycle():
    assert resolution.find_cycle(resolution.decomposition_uses) is None


def test_a_cycle_is_found_and_named():
    graph = {("Sub", "float32"): [("Add", "float32")], ("Add", "float32"): [("Neg", "float32")],
             ("Neg", "float32"): [("Sub", "float32")]}
    cycle = resolution.find_cycle(lambda node: graph.get(node, []))
    assert cycle[0] == cycle[-1] and set(cycle) == set(graph)


class _PrimitivesOnly:
    """A kernel table with every dtype of the primitives, and nothing else."""

    name = "primitives-only"

    def kernel_entry(self, op, dtype):
        return object() if op in ops.PRIMITIVES else None


def test_every_pair_resolves_on_the_primitives_alone():
    plugin = _PrimitivesOnly()
    plans = [resolution.resolve(plugin, s.name, d) for s in ops.all_specs() for d in s.dtypes]
    unsupported = [p.label for p in plans if p.how == "unsupported"]
    assert not unsupported, f"{len(unsupported)} pairs do not decompose: {', '.join(unsupported[:20])}"
    for plan in plans:
        assert {op for op, _ in plan.ops()} <= ops.PRIMITIVES, plan.label


def _decomposition_params():
    params = []
    for spec in ops.all_specs():
        if spec.decompose is None:
            continue
        for dtype in spec.dtypes:
            params.append(pytest.param(spec.name, dtype_name(dtype), id=f"{spec.name}-{dtype_name(dtype)}"))
    return params


@pytest.mark.parametrize("op, dtype", _decomposition_params())
def test_decomposition_matches_the_reference(op, dtype):
    """The rule, run on the cpu plugin (the ops it uses natively), meets the
    op's reference at its decomposition tolerance and calls only the ops it
    declares. The first case and the special values of every (op, dtype);
    the conformance suite on DEVKIT_CPU_KERNELS=primitives runs them all."""
    import devkit

    spec = ops.get(op)
    key = next(d for d in spec.dtypes if dtype_name(d) == dtype)
    cases = spec.cases(key, testing.rng_for(op, dtype))
    chosen = [cases[0]] + [c for c in cases[1:] if "special" in c.name][:1]
    declared = set(spec.decompose.uses_for(op, key))
    for case in chosen:
        record = []
        inputs = [v if v is None or decl.host else devkit.asarray(np.asarray(v))
                  for decl, v in zip([spec.inputs[min(i, len(spec.inputs) - 1)] for i in range(len(case.inputs))],
                                     case.inputs)]
        outputs = dispatch.run_decomposed(op, inputs, case.attrs, record=record)
        undeclared = {(o, dtype_name(d)) for o, d in record} - {(o, dtype_name(d)) for o, d in declared}
        assert not undeclared, f"case {case.name}: the rule calls undeclared {sorted(undeclared)}"
        ref_inputs, attrs = reference_arguments(spec, case.inputs, case.attrs)
        with np.errstate(all="ignore"):
            references = spec.reference(ref_inputs, attrs)
        tolerance = case.tolerance or spec.tolerance_for(key, decomposed=True)
        compared = range(len(spec.outputs)) if case.compare is None else case.compare
        for i in compared:
            result = testing.compare(outputs[i].numpy(), np.asarray(references[i]), tolerance)
            assert result.ok, f"case {case.name} output {spec.outputs[i]}: {result.message}"


def test_decomposition_tolerances_say_why():
    for spec in ops.all_specs():
        if spec.decompose is not None and spec.decompose.tolerance is not None:
            assert spec.decompose.reason, f"{spec.name}'s decomposition tolerance has no reason"


def test_run_decomposed_refuses_a_primitive():
    with pytest.raises(ValueError, match="Add has no decomposition"):
        dispatch.run_decomposed("Add", [np.ones(2, np.float32), np.ones(2, np.float32)])
