"""devkit-bench collectives: collective bandwidth, nccl-tests style, against torch's gloo.

    devkit-bench collectives [-n 2] [--plugin cpu] [--dtype float32]
                             [--min-bytes 1K] [--max-bytes 64M] [--peer gloo|none] [--json PATH]

``collectives`` launches N ranks with devkit-run and measures every collective
from --min-bytes to --max-bytes in x4 steps, out of place and in place, in the
manner of nccl-tests: time per call (the median over iterations of the slowest
rank's), algbw = bytes / time
and busbw = algbw x the collective's factor, in decimal GB/s, and the number
of wrong elements in a checked call after the timed ones. Then it runs
torch.distributed's gloo backend on the same machine, ranks and sizes, and
prints devkit's busbw over gloo's for every row.

Sizes are nccl-tests': the reduced / broadcast buffer for AllReduce, Reduce
and Broadcast; the whole gathered / scattered buffer (count x ranks) for
AllGather, ReduceScatter and AllToAll.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import re
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

import devkit

from .. import distributed
from ..distributed import launch as _launch

RANK_COMMAND = "_rank"
MIN_ITERATIONS = 3  # one timed call is too noisy to report
COLLECTIVES = ("all_reduce", "reduce_scatter", "all_gather", "all_to_all", "broadcast", "reduce")
TORCH_INSTALL = ("pip install torch==2.13.0  (the CPU build; a bare 'pip install torch' pulls a "
                 "multi-GB CUDA build)")
_UNITS = {"": 1, "K": 1 << 10, "KI": 1 << 10, "M": 1 << 20, "MI": 1 << 20, "G": 1 << 30, "GI": 1 << 30}


def parse_bytes(text: str) -> int:
    match = re.fullmatch(r"\s*(\d+)\s*([KMG]I?)?B?\s*", text.upper())
    if not match:
        raise argparse.ArgumentTypeError(f"{text!r} is not a size like 1K, 64MiB or 4096")
    return int(match.group(1)) * _UNITS[match.group(2) or ""]


def format_bytes(n: int) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale and n % scale == 0:
            return f"{n // scale} {unit}"
    return f"{n} B"


def bus_factor(collective: str, nranks: int) -> float:
    """nccl-tests' busbw / algbw: what each rank's link carries relative to the buffer."""
    if collective == "all_reduce":
        return 2 * (nranks - 1) / nranks
    if collective in ("reduce_scatter", "all_gather", "all_to_all"):
        return (nranks - 1) / nranks
    return 1.0


def counts_for(collective: str, size: int, itemsize: int, nranks: int) -> tuple[int, int]:
    """(the count argument, the bytes nccl-tests reports) for a target size."""
    if collective in ("all_gather", "reduce_scatter", "all_to_all"):
        count = size // (itemsize * nranks)
        return count, count * itemsize * nranks
    count = size // itemsize
    return count, count * itemsize


def sizes_between(low: int, high: int, step: int = 4) -> list[int]:
    sizes, size = [], low
    while size <= high:
        sizes.append(size)
        size *= step
    return sizes


# -- what every rank sends and must receive (small integers: exact in any order) -------------------


def send_data(collective: str, rank: int, nranks: int, count: int, dtype) -> np.ndarray:
    length = count * nranks if collective in ("reduce_scatter", "all_to_all") else count
    base = np.arange(length) % 7
    if collective == "all_to_all":  # block j goes to rank j: mark it with the sender and the block
        base = base + rank * nranks + np.arange(length) // max(count, 1)
    else:
        base = base + rank
    return base.astype(dtype)


def expected_data(collective: str, rank: int, nranks: int, count: int, dtype) -> np.ndarray | None:
    """What ``rank`` holds after the collective; None where nothing is defined (reduce off root)."""
    sends = [send_data(collective, r, nranks, count, dtype) for r in range(nranks)]
    block = slice(rank * count, (rank + 1) * count)
    if collective == "all_reduce":
        return sum(s.astype(np.float64) for s in sends).astype(dtype)
    if collective == "reduce":
        return sum(s.astype(np.float64) for s in sends).astype(dtype) if rank == 0 else None
    if collective == "broadcast":
        return sends[0]
    if collective == "all_gather":
        return np.concatenate(sends)
    if collective == "reduce_scatter":
        return sum(s[block].astype(np.float64) for s in sends).astype(dtype)
    return np.concatenate([s[block] for s in sends])  # all_to_all


def count_wrong(got: np.ndarray | None, expected: np.ndarray | None) -> int:
    if expected is None:
        return 0
    return int(np.count_nonzero(got.reshape(-1) != expected.reshape(-1)))


# -- the rank side: devkit ---------------------------------------------------------------------------


class DevkitRank:
    """Runs the measurements through devkit.distributed."""

    def __init__(self, config: dict):
        self.comm = distributed.init(config["plugin"])
        self.rank, self.size = self.comm.rank, self.comm.size
        self.dtype = np.dtype(config["dtype"])

    def operands(self, collective: str, count: int, inplace: bool):
        """(call, output array) with the send data in place."""
        comm, n = self.comm, self.size
        data = send_data(collective, self.rank, n, count, self.dtype)
        send = devkit.asarray(data, comm.device)
        block = slice(self.rank * count, (self.rank + 1) * count)
        if collective == "all_gather":
            if inplace:  # this rank's data already sits in its block of the output
                initial = np.zeros(n * count, self.dtype)
                initial[block] = data
                out = devkit.asarray(initial, comm.device)
                send = out[block]
            else:
                out = devkit.empty(n * count, self.dtype, comm.device)
            return (lambda: comm.all_gather(send, out)), out
        if collective == "reduce_scatter":
            out = send[block] if inplace else devkit.empty(count, self.dtype, comm.device)
            return (lambda: comm.reduce_scatter(send, out)), out
        out = send if inplace else devkit.empty(send.shape, self.dtype, comm.device)
        call = {
            "all_reduce": lambda: comm.all_reduce(send, out),
            "broadcast": lambda: comm.broadcast(send, root=0, out=out),
            "reduce": lambda: comm.reduce(send, out, root=0),
            "all_to_all": lambda: comm.all_to_all(send, out),
        }[collective]
        return call, out

    def host(self, array) -> np.ndarray:
        return array.numpy()

    def combine(self, values: np.ndarray, op: str) -> np.ndarray:
        """``values`` (float64) reduced elementwise over the ranks with op "max" or "sum"."""
        array = devkit.asarray(np.asarray(values, np.float64), self.comm.device)
        return self.comm.all_reduce(array, op=op).numpy()

    def barrier(self) -> None:
        self.comm.barrier()

    def close(self) -> None:
        self.comm.destroy()


# -- the rank side: torch.distributed with gloo ------------------------------------------------------


class GlooRank:
    """The same measurements through torch.distributed's gloo backend."""

    def __init__(self, config: dict):
        import torch
        import torch.distributed as dist

        env = distributed.launch_environment()
        self.torch, self.dist = torch, dist
        self.rank, self.size = env.rank, env.world_size
        dist.init_process_group("gloo", init_method=f"file://{config['gloo_store']}",
                                rank=self.rank, world_size=self.size)
        self.dtype = np.dtype(config["dtype"])

    def operands(self, collective: str, count: int, inplace: bool):
        torch, dist, n = self.torch, self.dist, self.size
        send = torch.from_numpy(send_data(collective, self.rank, n, count, self.dtype))
        block = slice(self.rank * count, (self.rank + 1) * count)
        # torch has in-place all_reduce / broadcast / reduce only, and out-of-place all_to_all only:
        # those rows measure the one form torch has.
        if collective == "all_reduce":
            return (lambda: dist.all_reduce(send)), send
        if collective == "broadcast":
            return (lambda: dist.broadcast(send, src=0)), send
        if collective == "reduce":
            return (lambda: dist.reduce(send, dst=0)), send
        if collective == "all_to_all":
            out = torch.empty_like(send)
            return (lambda: dist.all_to_all_single(out, send)), out
        # torch 2.13 renamed the *_tensor forms *_single; older releases have only the former.
        if collective == "all_gather":
            all_gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
            out = torch.empty(n * count, dtype=send.dtype)
            if inplace:
                out[block].copy_(send)
                send = out[block]
            return (lambda: all_gather(out, send)), out
        reduce_scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
        out = send[block] if inplace else torch.empty(count, dtype=send.dtype)
        return (lambda: reduce_scatter(out, send)), out

    def host(self, tensor) -> np.ndarray:
        return tensor.numpy()

    def combine(self, values: np.ndarray, op: str) -> np.ndarray:
        tensor = self.torch.from_numpy(np.array(values, np.float64))
        self.dist.all_reduce(tensor, op={"max": self.dist.ReduceOp.MAX, "sum": self.dist.ReduceOp.SUM}[op])
        return tensor.numpy()

    def barrier(self) -> None:
        self.dist.barrier()

    def close(self) -> None:
        self.dist.destroy_process_group()


def measure(backend, collective: str, count: int, inplace: bool, seconds: float,
            max_iters: int) -> dict:
    """The median over iterations of the slowest rank's time per call, then one checked call
    whose wrong elements are summed over the ranks.

    Every timed call starts right after a barrier, and the median keeps a
    2-core machine's scheduling hiccups out of the figure.
    """
    call, _ = backend.operands(collective, count, inplace)
    call()  # warm-up
    backend.barrier()
    started = time.perf_counter()
    call()
    estimate = float(backend.combine([time.perf_counter() - started], "max")[0])
    iterations = int(min(max_iters, max(MIN_ITERATIONS, seconds / max(estimate, 1e-9))))
    samples = np.empty(iterations)
    for i in range(iterations):
        backend.barrier()
        started = time.perf_counter()
        call()
        samples[i] = time.perf_counter() - started
    per_call = float(np.median(backend.combine(samples, "max")))
    check, out = backend.operands(collective, count, inplace)  # fresh data: in place overwrote it
    check()
    expected = expected_data(collective, backend.rank, backend.size, count, backend.dtype)
    wrong = count_wrong(backend.host(out) if expected is not None else None, expected)
    return {"time_s": per_call, "iterations": iterations,
            "wrong": int(backend.combine([wrong], "sum")[0])}


def rank_main(args) -> int:
    config = json.loads(Path(args.config).read_text())
    backend = (DevkitRank if args.backend == "devkit" else GlooRank)(config)
    itemsize = np.dtype(config["dtype"]).itemsize
    results = []
    for collective in config["collectives"]:
        for size in config["sizes"]:
            count, nbytes = counts_for(collective, size, itemsize, backend.size)
            row = {"collective": collective, "size": size, "bytes": nbytes, "count": count}
            for inplace in (False, True):
                measured = measure(backend, collective, count, inplace, config["seconds"],
                                   config["max_iters"])
                row["in_place" if inplace else "out_of_place"] = measured
            results.append(row)
    backend.close()
    if backend.rank == 0:
        Path(args.out).write_text(json.dumps(results))
    return 0


# -- the driver ------------------------------------------------------------------------------------


def run_ranks(backend: str, config_path: Path, out_path: Path, nranks: int, timeout: float) -> list:
    command = [sys.executable, "-m", "devkit.bench", RANK_COMMAND, "--backend", backend,
               "--config", str(config_path), "--out", str(out_path)]
    code = _launch.run(command, nranks, timeout=timeout)
    if code != 0:
        raise SystemExit(f"devkit-bench: the {backend} ranks failed (devkit-run exit code {code})")
    return json.loads(out_path.read_text())


def merge_rows(devkit_rows: list, gloo_rows: list | None, nranks: int) -> list[dict]:
    rows = []
    gloo_by_key = {(r["collective"], r["size"]): r for r in gloo_rows or []}
    for row in devkit_rows:
        factor = bus_factor(row["collective"], nranks)
        combined = {key: row[key] for key in ("collective", "size", "bytes", "count")}
        for place in ("out_of_place", "in_place"):
            combined[place] = _bandwidths(row[place], row["bytes"], factor)
        peer = gloo_by_key.get((row["collective"], row["size"]))
        if peer is not None:
            combined["gloo"] = {place: _bandwidths(peer[place], peer["bytes"], factor)
                                for place in ("out_of_place", "in_place")}
            combined["ratio"] = {place: _ratio(combined[place]["busbw_GBps"],
                                               combined["gloo"][place]["busbw_GBps"])
                                 for place in ("out_of_place", "in_place")}
        rows.append(combined)
    return rows


def _bandwidths(measured: dict, nbytes: int, factor: float) -> dict:
    seconds = measured["time_s"]
    algbw = nbytes / seconds / 1e9 if seconds > 0 else 0.0
    return {"time_us": seconds * 1e6, "algbw_GBps": algbw, "busbw_GBps": algbw * factor,
            "wrong": measured["wrong"], "iterations": measured["iterations"]}


def _ratio(mine: float, peer: float) -> float | None:
    return mine / peer if peer > 0 else None


def print_table(rows: list[dict], header: str) -> None:
    print(header)
    print(f"{'':>33}{'out-of-place':^38}{'in-place':^38}{'gloo busbw':^16}{'devkit/gloo':^14}")
    print(f"{'collective':<15}{'size':>10}{'count':>10}"
          + f"{'time(us)':>11}{'algbw':>9}{'busbw':>9}{'#wrong':>9}" * 2
          + f"{'oop':>8}{'ip':>8}{'oop':>7}{'ip':>7}")
    for row in rows:
        line = f"{row['collective']:<15}{format_bytes(row['size']):>10}{row['count']:>10}"
        for place in ("out_of_place", "in_place"):
            m = row[place]
            line += f"{m['time_us']:>11.1f}{m['algbw_GBps']:>9.2f}{m['busbw_GBps']:>9.2f}{m['wrong']:>9}"
        if "gloo" in row:
            line += "".join(f"{row['gloo'][p]['busbw_GBps']:>8.2f}" for p in ("out_of_place", "in_place"))
            line += "".join(f"{_format_ratio(row['ratio'][p]):>7}" for p in ("out_of_place", "in_place"))
        print(line)


def _format_ratio(ratio: float | None) -> str:
    return "n/a" if ratio is None else f"{ratio:.2f}x"


def collectives_main(args) -> int:
    collectives = [c.strip() for c in args.collectives.split(",") if c.strip()]
    unknown = sorted(set(collectives) - set(COLLECTIVES))
    if unknown:
        raise SystemExit(f"devkit-bench: unknown collectives {unknown} (choose from {', '.join(COLLECTIVES)})")
    peer = args.peer
    if peer == "gloo" and importlib.util.find_spec("torch") is None:
        print(f"devkit-bench: torch is not installed, so there is no gloo peer to compare with; "
              f"install it with: {TORCH_INSTALL}", file=sys.stderr)
        peer = "none"
    with tempfile.TemporaryDirectory(prefix="devkit-bench-") as scratch:
        scratch = Path(scratch)
        config = {"plugin": args.plugin, "dtype": args.dtype, "collectives": collectives,
                  "sizes": sizes_between(args.min_bytes, args.max_bytes),
                  "seconds": args.seconds, "max_iters": args.max_iters,
                  "gloo_store": str(scratch / "gloo-store")}
        config_path = scratch / "config.json"
        config_path.write_text(json.dumps(config))
        devkit_rows = run_ranks("devkit", config_path, scratch / "devkit.json", args.nranks,
                                args.timeout)
        gloo_rows = (run_ranks("gloo", config_path, scratch / "gloo.json", args.nranks, args.timeout)
                     if peer == "gloo" else None)
    rows = merge_rows(devkit_rows, gloo_rows, args.nranks)
    peer_text = "none"
    if gloo_rows is not None:
        import torch

        peer_text = f"torch {torch.__version__} gloo"
    header = (f"devkit-bench collectives: plugin {args.plugin}, {args.nranks} ranks, {args.dtype}, "
              f"op sum, root 0; times in us, bandwidths in GB/s (1e9 B/s); peer: {peer_text}")
    print_table(rows, header)
    if args.json:
        Path(args.json).write_text(json.dumps({"config": {**config, "nranks": args.nranks,
                                                          "peer": peer_text}, "rows": rows}, indent=1))
    wrong = sum(row[p]["wrong"] for row in rows for p in ("out_of_place", "in_place"))
    return 1 if wrong else 0
