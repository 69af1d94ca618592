"""The rank side of the collective conformance suite; devkit-run starts one per rank.

    devkit-run -n N -- python collective_worker.py matrix --plugin P --results DIR
    devkit-run -n N -- python collective_worker.py peer-death --plugin P --results DIR --absent-rank K
    devkit-run -n N -- python collective_worker.py never-joins --plugin P --results DIR --absent-rank K

Each rank appends one JSON line per case to DIR/rank<R>.jsonl, as it goes:
``{"case": id, "elements": n, "wrong": n, "problems": [...], "error": str | null}``.
test_collectives.py turns every line into a test.

Data is built so that every result is exact in any reduction order: small
integers for sums (|partial sum| <= 64 stays exact even in bfloat16), values
in {1, 2} for products, and raw random bytes for the collectives that only
move data. AVG divides by a power of two here, so it is exact too, but is
checked within 2 ulp as the header allows. Outputs are compared bit for bit.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import threading
import time
import traceback
from pathlib import Path

import ml_dtypes
import numpy as np

import devkit
from devkit import distributed

MiB = 1 << 20
LARGE_BYTES = 64 * MiB
COUNTS = (0, 1, 7, 1000003)
DTYPES = {name: np.dtype(name) for name in ("int8", "uint8", "int32", "int64", "float16", "float32",
                                            "float64")}
DTYPES["bfloat16"] = np.dtype(ml_dtypes.bfloat16)
FLOAT_DTYPES = ("float16", "bfloat16", "float32", "float64")
REDUCING = ("all_reduce", "reduce", "reduce_scatter")
MOVING = ("broadcast", "all_gather", "all_to_all")
OPS = ("sum", "prod", "max", "min", "avg")
GUARD = 64  # bytes on each side of every device operand, checked untouched
GUARD_BYTE = 0x5A


# -- the cases ------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Case:
    nranks: int
    collective: str
    dtype: str
    count: int              # the header's count argument (per rank block where it says so)
    inplace: bool
    op: str | None = None   # None for the collectives that only move data
    root: int | None = None
    size_label: str = ""    # "64MiB" for the large cases, else the count shows

    @property
    def id(self) -> str:
        parts = [f"n{self.nranks}", self.collective]
        if self.op:
            parts.append(self.op)
        if self.root is not None:
            parts.append(f"root{self.root}")
        parts += [self.dtype, self.size_label or f"count{self.count}",
                  "inplace" if self.inplace else "outofplace"]
        return "-".join(parts)

    @property
    def send_length(self) -> int:
        """Elements each rank sends."""
        return self.count * self.nranks if self.collective in ("reduce_scatter", "all_to_all") \
            else self.count


def matrix_cases(nranks: int) -> list[Case]:
    """Every collective x op x dtype x count x in/out of place, plus 64 MiB per collective x dtype."""
    cases = []
    for collective in REDUCING + MOVING:
        root = nranks - 1 if collective in ("broadcast", "reduce") else None
        for op in (OPS if collective in REDUCING else (None,)):
            for dtype in DTYPES:
                if op == "avg" and dtype not in FLOAT_DTYPES:
                    continue
                for count in COUNTS:
                    for inplace in (False, True):
                        cases.append(Case(nranks, collective, dtype, count, inplace, op, root))
    for collective in REDUCING + MOVING:
        for dtype, np_dtype in DTYPES.items():
            elements = LARGE_BYTES // np_dtype.itemsize
            per_rank = collective in ("all_gather", "reduce_scatter", "all_to_all")
            cases.append(Case(nranks, collective, dtype, elements // nranks if per_rank else elements,
                              False, "sum" if collective in REDUCING else None,
                              0 if collective in ("broadcast", "reduce") else None, "64MiB"))
    return cases


EXTRA_CASES = ("two-communicators-two-threads", "sendrecv-ring-group", "all_reduce-on-stream",
               "barrier")


# -- data -------------------------------------------------------------------------------


class Data:
    """Every rank's input for a case, derived from one random byte pool shared by all ranks."""

    def __init__(self, nranks: int, largest_bytes: int):
        self.nranks = nranks
        self._pool = np.frombuffer(np.random.default_rng(20240611).bytes(largest_bytes + nranks * 7919),
                                   np.uint8)
        self._cache: dict = {}

    def inputs(self, kind: str, dtype: np.dtype, length: int) -> list[np.ndarray]:
        """Each rank's ``length`` elements for ``kind``: an op, or "bits" for moved data."""
        key = (kind, dtype, length)
        if key not in self._cache:
            if sum(a.nbytes for arrays in self._cache.values() for a in arrays) > 256 * MiB:
                self._cache.clear()
            self._cache[key] = [self._values(kind, dtype, length, rank) for rank in range(self.nranks)]
        return self._cache[key]

    def _values(self, kind: str, dtype: np.dtype, length: int, rank: int) -> np.ndarray:
        start = rank * 7919  # a different stretch of the pool per rank
        if kind == "bits":
            return self._pool[start:start + length * dtype.itemsize].copy().view(dtype)
        raw = self._pool[start:start + length]
        signed = dtype.kind != "u"
        if kind in ("sum", "avg"):    # [-16, 15] or [0, 31]: sums of 4 ranks stay exact
            values, bias = raw & 31, 16 if signed else 0
        elif kind == "prod":          # {1, 2}: products of 4 ranks <= 16
            values, bias = (raw & 1) + 1, 0
        else:                         # max / min: [-64, 63] or [0, 127]
            values, bias = raw & 127, 64 if signed else 0
        result = values.astype(dtype)
        if bias:
            result -= np.asarray(bias).astype(dtype)
        return result


def reduce_host(arrays: list[np.ndarray], op: str, dtype: np.dtype) -> np.ndarray:
    """The exact reduction; the data keeps every partial result representable in ``dtype``."""
    if op == "avg":
        total = np.zeros(arrays[0].shape, np.float64)
        for a in arrays:
            total += a.astype(np.float64)
        return (total / len(arrays)).astype(dtype)
    ufunc = {"sum": np.add, "prod": np.multiply, "max": np.maximum, "min": np.minimum}[op]
    result = arrays[0].copy()
    for a in arrays[1:]:
        ufunc(result, a, out=result)
    return result


def bits(array: np.ndarray) -> np.ndarray:
    return array.view(f"u{array.dtype.itemsize}")


def count_wrong(got: np.ndarray, expected: np.ndarray, op: str | None) -> int:
    """Elements whose bits differ; for AVG, elements more than 2 ulp apart."""
    got, expected = got.reshape(-1), expected.reshape(-1)
    if op != "avg":
        return int(np.count_nonzero(bits(got) != bits(expected)))
    return int(np.count_nonzero(ulp_distance(got, expected) > 2))


def ulp_distance(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Representable values between a and b, from their sign-magnitude bits (+0 and -0 are 0 apart)."""
    a_bits, b_bits = bits(a), bits(b)
    sign_shift = a.dtype.itemsize * 8 - 1
    magnitude = np.array((1 << sign_shift) - 1, a_bits.dtype)
    a_mag, b_mag = a_bits & magnitude, b_bits & magnitude
    same_sign = (a_bits >> sign_shift) == (b_bits >> sign_shift)
    # Unsigned throughout: a magnitude sum stays below 2**width, no difference goes negative.
    return np.where(same_sign, np.maximum(a_mag, b_mag) - np.minimum(a_mag, b_mag), a_mag + b_mag)


# -- device operands --------------------------------------------------------------------------


class Operands:
    """Device arrays with guard bytes around them, and the checks of what they hold afterwards."""

    def __init__(self, dev: devkit.Device):
        self.dev = dev
        self.made: list[tuple[devkit.Array, str]] = []
        self.problems: list[str] = []

    def array(self, name: str, host: np.ndarray | None, length: int, dtype: np.dtype) -> devkit.Array:
        """``length`` elements after GUARD bytes of GUARD_BYTE, holding ``host`` (or GUARD_BYTE)."""
        nbytes = length * dtype.itemsize
        buffer = self.dev.alloc(GUARD + nbytes + GUARD)
        buffer.fill(GUARD_BYTE)
        if host is not None and nbytes:
            buffer.copy_from_host(host.view(np.uint8), offset=GUARD)
        array = devkit.Array(buffer, (length,), dtype, offset=GUARD)
        self.made.append((array, name))
        return array

    def check_guards(self) -> None:
        for array, name in self.made:
            raw = array.buffer.copy_to_host()
            for where, guard in (("before", raw[:GUARD]), ("after", raw[GUARD + array.nbytes:])):
                changed = int(np.count_nonzero(guard != GUARD_BYTE))
                if changed:
                    self.problems.append(f"{changed} guard bytes {where} {name} were overwritten")

    def check_unchanged(self, array: devkit.Array, original: np.ndarray, name: str) -> None:
        changed = count_wrong(array.numpy(), original, None)
        if changed:
            self.problems.append(f"{name} changed in {changed} elements; it must be left as it was")


def untouched(length: int, dtype: np.dtype) -> np.ndarray:
    """What an output the collective must not write still holds: the guard fill."""
    return np.full(length * dtype.itemsize, GUARD_BYTE, np.uint8).view(dtype)


def run_case(comm: distributed.Communicator, case: Case, data: Data) -> dict:
    n, rank, count = comm.size, comm.rank, case.count
    dtype = DTYPES[case.dtype]
    inputs = data.inputs(case.op or "bits", dtype, case.send_length)
    mine = inputs[rank]
    block = slice(rank * count, (rank + 1) * count)
    ops = Operands(comm.device)

    if case.collective == "all_gather":
        out = ops.array("out", None, n * count, dtype)
        if case.inplace:  # x is this rank's block of out
            x = out[block]
            if count:
                x.buffer.copy_from_host(mine.view(np.uint8), offset=x.offset)
        else:
            x = ops.array("x", mine, count, dtype)
        comm.all_gather(x, out)
        expected = np.concatenate(inputs)
    elif case.collective == "reduce_scatter":
        x = ops.array("x", mine, n * count, dtype)
        out = x[block] if case.inplace else ops.array("out", None, count, dtype)
        comm.reduce_scatter(x, out, op=case.op)
        expected = reduce_host([a[block] for a in inputs], case.op, dtype)
    else:
        x = ops.array("x", mine, case.send_length, dtype)
        out = x if case.inplace else ops.array("out", None, case.send_length, dtype)
        out_argument = None if case.inplace else out
        if case.collective == "all_reduce":
            comm.all_reduce(x, out_argument, op=case.op)
            expected = reduce_host(inputs, case.op, dtype)
        elif case.collective == "broadcast":
            comm.broadcast(x, root=case.root, out=out_argument)
            expected = inputs[case.root]
        elif case.collective == "reduce":
            comm.reduce(x, out_argument, op=case.op, root=case.root)
            expected = (reduce_host(inputs, case.op, dtype) if rank == case.root
                        else mine if case.inplace else untouched(count, dtype))
        else:  # all_to_all: block i of the result is rank i's block for this rank
            comm.all_to_all(x, out_argument)
            expected = np.concatenate([a[block] for a in inputs])

    wrong = count_wrong(out.numpy(), expected, case.op)
    ops.check_guards()
    if not case.inplace:
        ops.check_unchanged(x, mine, "the input (out of place)")
    return {"elements": int(expected.size), "wrong": wrong, "problems": ops.problems}


# -- the extra cases ------------------------------------------------------------------------------


def two_communicators_two_threads(comm: distributed.Communicator, plugin: str) -> dict:
    """A second communicator over the same ranks, each driven by its own thread at the same time."""
    second = distributed.init(plugin)
    n, rank = comm.size, comm.rank
    wrong, errors = [0, 0], []

    def sum_on_first():
        with comm.device.create_stream() as stream:
            for i in range(20):
                x = devkit.asarray(np.full(10007, rank + i, np.int32), comm.device)
                comm.all_reduce(x, stream=stream)
                stream.synchronize()
                expected = np.full(10007, sum(range(n)) + n * i, np.int32)
                wrong[0] += count_wrong(x.numpy(), expected, None)

    def gather_on_second():
        for i in range(20):
            x = devkit.asarray(np.full(5003, rank * 100 + i, np.float32), second.device)
            out = second.all_gather(x)
            expected = np.repeat(np.arange(n, dtype=np.float32) * 100 + i, 5003)
            wrong[1] += count_wrong(out.numpy(), expected, None)

    def collecting_errors(fn):
        try:
            fn()
        except BaseException as exc:  # re-raised below, in the rank's main thread
            errors.append(exc)

    threads = [threading.Thread(target=collecting_errors, args=(fn,)) for fn in (sum_on_first, gather_on_second)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    second.destroy()
    if any(thread.is_alive() for thread in threads):
        raise TimeoutError("a communicator thread did not finish within 120 s")
    if errors:
        raise errors[0]
    return {"elements": 20 * 10007 + 20 * 5003 * n, "wrong": sum(wrong), "problems": []}


def sendrecv_ring_group(comm: distributed.Communicator) -> dict:
    """Send to the next rank, receive from the previous, in one group (odd ranks post recv first)."""
    n, rank = comm.size, comm.rank
    payload = lambda r: np.arange(100003, dtype=np.float64) * (r + 1)  # noqa: E731
    x = devkit.asarray(payload(rank), comm.device)
    out = devkit.zeros(100003, np.float64, comm.device)
    with comm.group():
        if rank % 2:
            comm.recv(out, (rank - 1) % n)
            comm.send(x, (rank + 1) % n)
        else:
            comm.send(x, (rank + 1) % n)
            comm.recv(out, (rank - 1) % n)
    return {"elements": 100003, "wrong": count_wrong(out.numpy(), payload((rank - 1) % n), None),
            "problems": []}


def all_reduce_on_stream(comm: distributed.Communicator) -> dict:
    """Copy in, reduce and copy out on one stream; the stream keeps the temporaries alive."""
    n, rank = comm.size, comm.rank
    result = np.zeros(65537, np.float32)
    with comm.device.create_stream() as stream:
        x = devkit.empty(65537, np.float32, comm.device, stream=stream)
        x.buffer.copy_from_host(np.full(65537, rank + 1, np.float32), stream=stream)
        comm.all_reduce(x, out=devkit.empty(65537, np.float32, comm.device, stream=stream),
                        stream=stream).buffer.copy_to_host(result.view(np.uint8), stream=stream)
        del x
        stream.synchronize()
    return {"elements": result.size,
            "wrong": count_wrong(result, np.full(65537, n * (n + 1) / 2, np.float32), None),
            "problems": []}


def barrier(comm: distributed.Communicator) -> dict:
    """Ranks enter 0.2 s apart; the test checks that nobody left before the last one entered."""
    time.sleep(0.2 * comm.rank)
    entered = time.time()
    comm.barrier()
    return {"elements": 0, "wrong": 0, "problems": [], "entered": entered, "left": time.time()}


# -- scenarios --------------------------------------------------------------------------------------


class Results:
    def __init__(self, directory: Path, rank: int):
        directory.mkdir(parents=True, exist_ok=True)
        self._file = open(directory / f"rank{rank}.jsonl", "a")

    def record(self, case_id: str, fn) -> dict:
        started = time.perf_counter()
        try:
            record = fn()
            record["error"] = None
        except Exception as exc:
            record = {"elements": 0, "wrong": 0, "problems": [],
                      "error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc()}
        record.update(case=case_id, seconds=round(time.perf_counter() - started, 4))
        self._file.write(json.dumps(record) + "\n")
        self._file.flush()
        return record

    def close(self) -> None:
        self._file.close()


def run_matrix(args) -> int:
    comm = distributed.init(args.plugin)
    results = Results(args.results, comm.rank)
    data = Data(comm.size, LARGE_BYTES)
    # Run in an order that reuses inputs across collectives; the ids do not depend on it.
    cases = sorted(matrix_cases(comm.size),
                   key=lambda c: (c.size_label, c.dtype, c.op or "", c.send_length, c.collective))
    for case in cases:
        if args.only is None or args.only in case.id:
            results.record(case.id, lambda case=case: run_case(comm, case, data))
    extras = {"two-communicators-two-threads": lambda: two_communicators_two_threads(comm, args.plugin),
              "sendrecv-ring-group": lambda: sendrecv_ring_group(comm),
              "all_reduce-on-stream": lambda: all_reduce_on_stream(comm),
              "barrier": lambda: barrier(comm)}
    for name in EXTRA_CASES:
        case_id = f"n{comm.size}-{name}"
        if args.only is None or args.only in case_id:
            results.record(case_id, extras[name])
    results.close()
    comm.destroy()
    return 0


def run_absent_peer(args, scenario: str) -> int:
    """One rank is absent: it dies after joining (peer-death) or never joins (never-joins).

    The others must fail with DeadlineExceededError. Each records what it got;
    the lowest present rank waits for the others' records, then exits 3 so
    that the launcher reports a failed rank.
    """
    env = distributed.launch_environment()
    absent = args.absent_rank
    if env.rank == absent:
        if scenario == "never-joins":
            time.sleep(600)  # until the launcher terminates it
        comm = distributed.init(args.plugin)
        comm.barrier()
        time.sleep(0.5)  # let the others finish the barrier before this rank's memory goes
        os._exit(0)  # dies without a word to the others, mid-job
    results = Results(args.results, env.rank)

    def present_rank():
        started = time.monotonic()
        try:
            comm = distributed.init(args.plugin)
            if scenario == "peer-death":
                comm.barrier()
                x = devkit.asarray(np.ones(1024, np.float32), comm.device)
                comm.all_reduce(x)
        except devkit.DeadlineExceededError as exc:
            return {"elements": 0, "wrong": 0, "problems": [], "raised": type(exc).__name__,
                    "message": str(exc), "waited": time.monotonic() - started}
        return {"elements": 0, "wrong": 0, "problems": ["no error was raised"], "raised": None}

    results.record(f"{scenario}-rank{env.rank}", present_rank)
    results.close()
    reporter = min(r for r in range(env.world_size) if r != absent)
    if env.rank != reporter:
        return 0
    others = [r for r in range(env.world_size) if r not in (absent, reporter)]
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and not all(
            _has_record(args.results / f"rank{r}.jsonl") for r in others):
        time.sleep(0.05)
    print(f"rank {env.rank}: the absent rank {absent} made the collective fail as expected",
          flush=True)
    return 3


def _has_record(path: Path) -> bool:
    return path.exists() and path.stat().st_size > 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("scenario", choices=("matrix", "peer-death", "never-joins"))
    parser.add_argument("--plugin", default="cpu")
    parser.add_argument("--results", type=Path, required=True)
    parser.add_argument("--absent-rank", type=int, default=None)
    parser.add_argument("--only", default=None, help="run only the cases whose id contains this")
    args = parser.parse_args(argv)
    if args.scenario == "matrix":
        return run_matrix(args)
    return run_absent_peer(args, args.scenario)


if __name__ == "__main__":
    sys.exit(main())
