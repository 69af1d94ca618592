"""The op specification checks itself, without any plugin: every case of
every (op, dtype) infers, and its reference produces exactly the inferred
output shapes and dtypes."""

from __future__ import annotations

import numpy as np
import pytest

from devkit import ops
from devkit.ops import testing
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
