"""OpenCL kernels of devkit/ops/shape.py (work in progress)."""

UNCLAIMED: dict[tuple[str, str], str] = {}


def register(table) -> None:
    pass
