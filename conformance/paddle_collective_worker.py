"""One rank of the paddle-collectives suite: paddle.distributed through the bridge's xccl hooks.

    python paddle_collective_worker.py collectives --out FILE   # every case in CASES, then ERROR_CASES
    python paddle_collective_worker.py missing --out FILE       # one all_reduce (a plugin without collectives)

test_paddle_collectives.py starts two of these, one per rank, with Paddle's
launch variables (PADDLE_TRAINER_ID, PADDLE_TRAINERS_NUM, PADDLE_TRAINER_ENDPOINTS,
PADDLE_CURRENT_ENDPOINT, MASTER_ADDR/MASTER_PORT, FLAGS_selected_devkits,
PADDLE_DISTRI_BACKEND=xccl) and DEVKIT_PADDLE_PLUGIN, or has
``python -m paddle.distributed.launch`` start them. "{rank}" in FILE becomes
the rank. Each rank runs
``paddle.distributed.init_parallel_env()`` (ProcessGroupCustom; Paddle's TCP
store carries the plugin's unique id) and writes FILE: case -> {"value": the
output as a list (or a list of lists), "error": "Type: message" or null,
"stderr": what the bridge reported on stderr during the case}.
The test computes every expectation from ``inputs`` with NumPy.

Inputs are random float32 values: a sum or max of two of them is exact in any
order, so outputs are compared bit for bit; AVG divides by two, exact too.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import traceback

import numpy as np

SIZES = (1, 7, 1000, 65536)
NRANKS = 2

# case -> (collective, dtype, size, extra): what every rank runs (see _run).
CASES = {
    **{f"all_reduce_{op}_{size}": ("all_reduce", "float32", size, op) for op in ("sum", "max") for size in SIZES},
    **{f"all_reduce_{op}_7": ("all_reduce", "float32", 7, op) for op in ("min", "prod")},
    "all_reduce_sum_int64_7": ("all_reduce", "int64", 7, "sum"),
    "broadcast_from_0_1000": ("broadcast", "float32", 1000, 0),
    "broadcast_from_1_7": ("broadcast", "float32", 7, 1),
    **{f"all_gather_{size}": ("all_gather", "float32", size, None) for size in (1, 7, 1000)},
    "reduce_sum_to_1_1000": ("reduce", "float32", 1000, 1),
    "reduce_scatter_sum_1000": ("reduce_scatter", "float32", 1000, None),  # each rank's block of 500
    "send_recv_0_to_1_1000": ("send_recv", "float32", 1000, None),
    "alltoall_7": ("alltoall", "float32", 7, None),  # Paddle lowers it to xccl send/recv
    "barrier": ("barrier", "float32", 0, None),
}

# What fails (run after CASES, on both ranks alike): case -> (collective, dtype, size, op).
ERROR_CASES = {
    "all_reduce_int16": ("all_reduce", "int16", 7, "sum"),          # a dtype the plugin refuses
    "all_reduce_complex64": ("all_reduce", "complex64", 7, "sum"),  # a dtype devkit has no key for
    # Paddle's ProcessGroupCustom refuses AVG itself (custom_ccl_tools.cc): it never reaches xccl_all_reduce.
    "all_reduce_avg": ("all_reduce", "float32", 7, "avg"),
}
# After the errors the communicator still works.
AFTER_ERRORS = {"all_reduce_sum_after_errors": ("all_reduce", "float32", 7, "sum")}


def inputs(case: str, rank: int, dtype: str, size: int) -> np.ndarray:
    """Rank ``rank``'s input for ``case`` (the test recomputes it for the expectation)."""
    rng = np.random.default_rng([rank, sum(map(ord, case)), len(case)])
    if np.dtype(dtype).kind == "f":
        return rng.standard_normal(size).astype(dtype)
    if np.dtype(dtype).kind == "c":
        return (rng.standard_normal(size) + 1j * rng.standard_normal(size)).astype(dtype)
    return rng.integers(-100, 100, size).astype(dtype)


def _run(paddle, dist, case: str, spec: tuple, rank: int):
    collective, dtype, size, extra = spec
    x = paddle.to_tensor(inputs(case, rank, dtype, size))
    if collective == "all_reduce":
        op = {"sum": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX, "min": dist.ReduceOp.MIN,
              "prod": dist.ReduceOp.PROD, "avg": dist.ReduceOp.AVG}[extra]
        if extra == "avg":
            # paddle.distributed.all_reduce asks core.nccl_version() for AVG, which the CPU
            # wheel lacks (AttributeError); the stream API goes straight to the process group.
            dist.stream.all_reduce(x, op=op)
        else:
            dist.all_reduce(x, op=op)
        return x.numpy()
    if collective == "broadcast":
        dist.broadcast(x, src=extra)
        return x.numpy()
    if collective == "all_gather":
        gathered = []
        dist.all_gather(gathered, x)
        return [t.numpy() for t in gathered]
    if collective == "reduce":
        dist.reduce(x, dst=extra)
        return x.numpy()
    if collective == "reduce_scatter":
        out = paddle.empty([size // NRANKS], dtype=dtype)
        dist.reduce_scatter(out, list(paddle.split(x, NRANKS)))
        return out.numpy()
    if collective == "send_recv":
        if rank == 0:
            dist.send(x, dst=1)
        else:
            dist.recv(x, src=0)
        return x.numpy()
    if collective == "alltoall":
        blocks = [paddle.to_tensor(inputs(f"{case}/{j}", rank, dtype, size)) for j in range(NRANKS)]
        received = []
        dist.alltoall(received, blocks)
        return [t.numpy() for t in received]
    if collective == "barrier":
        dist.barrier()
        return []
    raise ValueError(f"unknown collective {collective!r}")


class _CapturedStderr:
    """File descriptor 2 redirected to a temporary file: what the bridge's C code reports."""

    def __enter__(self):
        sys.stderr.flush()
        self.file = tempfile.TemporaryFile(mode="w+b")
        self.saved = os.dup(2)
        os.dup2(self.file.fileno(), 2)
        return self

    def __exit__(self, *exc):
        sys.stderr.flush()
        os.dup2(self.saved, 2)
        os.close(self.saved)
        self.file.seek(0)
        self.text = self.file.read().decode(errors="replace")
        self.file.close()
        sys.stderr.write(self.text)  # still in the rank's own stderr
        return False


def _plain(value):
    return [v.tolist() for v in value] if isinstance(value, list) else value.tolist()


def _case(paddle, dist, case: str, spec: tuple, rank: int) -> dict:
    with _CapturedStderr() as captured:
        try:
            value, error = _plain(_run(paddle, dist, case, spec, rank)), None
        except Exception as exc:  # recorded: the test decides whether the case should fail
            value, error = None, f"{type(exc).__name__}: {exc}"
    return {"value": value, "error": error, "stderr": captured.text}


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("mode", choices=("collectives", "missing"))
    parser.add_argument("--out", required=True)
    args = parser.parse_args()

    import devkit.paddle  # noqa: F401  (before paddle: Paddle finds the bridge at import)
    import paddle
    import paddle.distributed as dist

    dist.init_parallel_env()
    rank = dist.get_rank()
    if dist.get_world_size() != NRANKS:
        raise SystemExit(f"expected {NRANKS} ranks, Paddle sees {dist.get_world_size()}")
    if args.mode == "missing":
        cases = {"all_reduce_sum_7": CASES["all_reduce_sum_7"]}
    else:
        cases = {**CASES, **ERROR_CASES, **AFTER_ERRORS}
    results = {}
    for case, spec in cases.items():
        results[case] = _case(paddle, dist, case, spec, rank)
        if args.mode == "missing":
            break  # rank 0 then exits, and with it Paddle's TCP store: rank 1's wait for the id ends
    with open(args.out.format(rank=rank), "w") as out:
        json.dump(results, out)
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except SystemExit:
        raise
    except BaseException:
        traceback.print_exc()
        sys.exit(2)
