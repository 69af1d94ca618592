"""The cpu plugin's op_schema.c is what devkit.backends.cpu.op_schema writes from the op specs."""

from devkit.backends.cpu import op_schema


def test_op_schema_c_is_current():
    assert op_schema.PATH.read_text() == op_schema.render(), (
        "devkit/backends/cpu/op_schema.c is stale: run python3 -m devkit.backends.cpu.op_schema")
