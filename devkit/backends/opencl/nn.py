"""OpenCL kernels of devkit/ops/nn.py (work in progress)."""

UNCLAIMED: dict[tuple[str, str], str] = {}


def register(table) -> None:
    pass
