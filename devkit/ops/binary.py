"""Binary and variadic elementwise ops, with multidirectional broadcasting."""

from __future__ import annotations

import numpy as np

from . import testing as t
from .spec import ALL_FLOAT, INT, Case, Input, OpSpec, broadcast_shapes, register, require_same_dtype


def _infer_broadcast(inputs, attrs):
    dtype = require_same_dtype(inputs, ["A", "B"])
    return [(broadcast_shapes(*(i.shape for i in inputs)), dtype)]


def _arith_cases(dtype, rng):
    r = lambda *shape: t.random(rng, shape, dtype)  # noqa: E731
    cases = [
        Case("same_shape", [r(3, 4), r(3, 4)]),
        Case("broadcast_row", [r(3, 4), r(4)]),
        Case("broadcast_size1", [r(3, 1, 5), r(1, 4, 1)]),
        Case("scalar", [r(), r(2, 3)]),
        Case("empty", [r(0, 3), r(1, 3)]),
        Case("large", [r(1031, 67), r(67)]),
    ]
    if t.is_float(dtype):
        special = t.special_values(dtype)
        cases.append(Case("special", [special[:, None], special[None, :]]))
    return cases


register(OpSpec(
    name="Add", category="binary", opset=14,
    inputs=(Input("A"), Input("B")), outputs=("C",),
    dtypes=ALL_FLOAT + INT,
    infer=_infer_broadcast,
    reference=lambda x, a: [np.add(x[0], x[1])],
    cases=_arith_cases,
    doc="C = A + B with broadcasting; integers wrap around.",
))
