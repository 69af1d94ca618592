"""Collective conformance, in the style of nccl-tests.

Every collective x op x dtype x count x in/out of place, and a 64 MiB case
per collective x dtype, run by collective_worker.py under devkit-run at 2 and
4 ranks; results are compared bit for bit on every rank (AVG within 2 ulp).
The worker runs once per (plugin, ranks), lazily, and writes one JSON line
per case and rank; each case here asserts on those lines. Then: two
communicators driven from two threads, a send/recv ring in a group, a
stream-ordered all_reduce, barrier, a peer that dies and a peer that never
joins (both must end in DeadlineExceededError, not a hang), no devkit-ccl*
segment left in /dev/shm, and the Python API's argument checks in-process.
"""

from __future__ import annotations

import dataclasses
import glob
import json
import os
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

import devkit
from devkit import distributed
from devkit.abi import ffi
from devkit.conformance_cli.progress import report_progress

from . import collective_worker as worker
from .conftest import PLUGINS, has_collectives

NRANKS = (2, 4)
WORKER = Path(worker.__file__)
COLLECTIVE_FUNCTIONS = ("ccl_unique_id_size", "ccl_get_unique_id", "ccl_comm_init", "ccl_comm_destroy",
                        "all_reduce", "broadcast", "reduce", "all_gather", "reduce_scatter",
                        "all_to_all", "send", "recv", "group_start", "group_end")
# Under pytest-xdist --dist loadgroup the module stays on one worker, so the
# matrix runs (a session fixture) run once, not once per worker.
pytestmark = pytest.mark.xdist_group("collectives")

MATRIX_TIMEOUT = 600      # seconds for one worker run of the whole matrix
CCL_TIMEOUT_SECONDS = 20  # a rank that fell out of step fails the rest in this long, not hangs


def _label(plugin: str) -> str:
    return os.path.basename(plugin)


def _no_collectives(name: str) -> str:
    return f"plugin '{name}' has no collectives (the optional section of its table is NULL)"


def per_plugin(argnames: str, make):
    """parametrize(argnames) with ``make(plugin)``'s params for each plugin with collectives.

    A plugin without collectives gets one case, skipped saying so; one that does not load gets one case, which fails loading it.
    """
    params = []
    for plugin in PLUGINS:
        has = has_collectives(plugin)
        if has:
            params += make(plugin)
        else:
            placeholder = (plugin,) + (None,) * (argnames.count(","))
            marks = pytest.mark.skip(reason=_no_collectives(_label(plugin))) if has is False else ()
            params.append(pytest.param(*placeholder, id=_label(plugin), marks=marks))
    return pytest.mark.parametrize(argnames, params)


def each_run(plugin: str):
    return [pytest.param(plugin, nranks, id=f"{_label(plugin)}-n{nranks}") for nranks in NRANKS]


def each_case(plugin: str):
    return [pytest.param(plugin, nranks, case.id, id=f"{_label(plugin)}-{case.id}")
            for nranks in NRANKS for case in worker.matrix_cases(nranks)]


def ccl_segments() -> set[str]:
    return set(glob.glob("/dev/shm/devkit-ccl*"))


def segments_left_since(before: set[str], settle_seconds: float = 3.0) -> set[str]:
    """Segments that appeared since ``before`` and stay. Another job on the machine may be
    joining a communicator right now: its segment goes once its ranks have joined."""
    deadline = time.monotonic() + settle_seconds
    while (left := ccl_segments() - before) and time.monotonic() < deadline:
        time.sleep(0.1)
    return left


# -- running the worker ------------------------------------------------------------------


@dataclasses.dataclass
class WorkerRun:
    returncode: int
    stdout: str
    stderr: str
    records: dict[str, dict[int, dict]]  # case id -> rank -> record
    leftover_segments: set[str]

    def describe(self) -> str:
        return (f"launcher exit code {self.returncode}\n--- stderr (tail) ---\n{self.stderr[-4000:]}"
                f"\n--- stdout (tail) ---\n{self.stdout[-2000:]}")


def run_worker(plugin: str, nranks: int, scenario: str, results: Path, *extra: str,
               env: dict | None = None, timeout: float = 120, progress_total: int | None = None) -> WorkerRun:
    """Launch the scenario on ``nranks`` ranks. With ``progress_total`` (its number of cases),
    report how far rank 0 got while it runs (devkit-conformance shows it)."""
    devkit.load_plugin(plugin)  # a plugin that does not load fails here, with its reason
    before = ccl_segments()
    command = [sys.executable, "-m", "devkit.distributed.launch", "-n", str(nranks), "--timeout", str(timeout),
               "--grace", "2", "--", sys.executable, str(WORKER), scenario, "--plugin", plugin,
               "--results", str(results), *extra]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               env={**os.environ, "DEVKIT_CCL_TIMEOUT": str(CCL_TIMEOUT_SECONDS),
                                    **(env or {})})
    stdout, stderr = _wait_reporting_progress(process, timeout + 60, results / "rank0.jsonl", progress_total)
    records: dict[str, dict[int, dict]] = {}
    for path in sorted(results.glob("rank*.jsonl")):
        rank = int(path.stem[len("rank"):])
        for line in path.read_text().splitlines():
            record = json.loads(line)
            records.setdefault(record["case"], {})[rank] = record
    return WorkerRun(process.returncode, stdout, stderr, records, segments_left_since(before))


PROGRESS_INTERVAL = 1.0  # seconds between two looks at rank 0's results during a launch


def _wait_reporting_progress(process: subprocess.Popen, timeout: float, records: Path,
                             total: int | None) -> tuple[str, str]:
    """``process.communicate()`` within ``timeout`` (killed and TimeoutExpired past it, as
    subprocess.run does); meanwhile, with a ``total``, the cases ``records`` holds so far."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return process.communicate(timeout=PROGRESS_INTERVAL)
        except subprocess.TimeoutExpired:
            if time.monotonic() > deadline:
                process.kill()
                process.communicate()
                raise subprocess.TimeoutExpired(process.args, timeout) from None
        if total is not None and records.exists():
            finished = [line for line in records.read_text().split("\n")[:-1] if line]  # whole lines only
            if finished:
                report_progress(len(finished), total, json.loads(finished[-1])["case"])


class MatrixRuns:
    """One worker run per (plugin, ranks), made when a case first needs it."""

    def __init__(self, tmp_path_factory):
        self._tmp_path_factory = tmp_path_factory
        self._runs: dict[tuple[str, int], WorkerRun] = {}

    def get(self, plugin: str, nranks: int) -> WorkerRun:
        key = (plugin, nranks)
        if key not in self._runs:
            results = self._tmp_path_factory.mktemp(f"collectives-{_label(plugin)}-n{nranks}")
            self._runs[key] = run_worker(plugin, nranks, "matrix", results, timeout=MATRIX_TIMEOUT,
                                         progress_total=len(worker.matrix_cases(nranks)) + len(worker.EXTRA_CASES))
        return self._runs[key]


@pytest.fixture(scope="session")
def matrix_runs(tmp_path_factory) -> MatrixRuns:
    return MatrixRuns(tmp_path_factory)


def rank_records(run: WorkerRun, case_id: str, nranks: int) -> dict[int, dict]:
    records = run.records.get(case_id, {})
    missing = [rank for rank in range(nranks) if rank not in records]
    assert not missing, f"ranks {missing} recorded no result for {case_id}\n{run.describe()}"
    return records


def assert_exact_on_every_rank(run: WorkerRun, case_id: str, nranks: int) -> dict[int, dict]:
    records = rank_records(run, case_id, nranks)
    failures = []
    for rank, record in sorted(records.items()):
        if record["error"]:
            failures.append(f"rank {rank}: {record['error']}\n{record.get('traceback', '')}")
        if record["wrong"]:
            failures.append(f"rank {rank}: {record['wrong']} of {record['elements']} elements wrong")
        failures += [f"rank {rank}: {problem}" for problem in record["problems"]]
    assert not failures, "\n".join(failures)
    return records


# -- the plugin's table --------------------------------------------------------------------


def test_plugin_has_collectives(plugin):
    if not plugin.has_collectives:
        pytest.skip(reason=_no_collectives(plugin.name))
    missing = [name for name in COLLECTIVE_FUNCTIONS if not plugin.has(name)]
    assert not missing, f"the collectives section is all or nothing; NULL: {', '.join(missing)}"


# -- the matrix ------------------------------------------------------------------------------


# The first case of a rank count waits for the whole matrix run.
@pytest.mark.timeout(MATRIX_TIMEOUT + 60)
@per_plugin("plugin_name,nranks,case_id", each_case)
def test_collective(matrix_runs, plugin_name, nranks, case_id):
    assert_exact_on_every_rank(matrix_runs.get(plugin_name, nranks), case_id, nranks)


@per_plugin("plugin_name,nranks", each_run)
def test_matrix_run_is_clean(matrix_runs, plugin_name, nranks):
    run = matrix_runs.get(plugin_name, nranks)
    assert run.returncode == 0, run.describe()
    assert not run.leftover_segments, f"shared memory left behind: {sorted(run.leftover_segments)}"


@per_plugin("plugin_name,nranks", each_run)
def test_two_communicators_from_two_threads(matrix_runs, plugin_name, nranks):
    assert_exact_on_every_rank(matrix_runs.get(plugin_name, nranks),
                               f"n{nranks}-two-communicators-two-threads", nranks)


@per_plugin("plugin_name,nranks", each_run)
def test_send_recv_ring_in_a_group(matrix_runs, plugin_name, nranks):
    assert_exact_on_every_rank(matrix_runs.get(plugin_name, nranks),
                               f"n{nranks}-sendrecv-ring-group", nranks)


@per_plugin("plugin_name,nranks", each_run)
def test_all_reduce_on_a_stream(matrix_runs, plugin_name, nranks):
    assert_exact_on_every_rank(matrix_runs.get(plugin_name, nranks),
                               f"n{nranks}-all_reduce-on-stream", nranks)


@per_plugin("plugin_name,nranks", each_run)
def test_barrier_waits_for_the_last_rank(matrix_runs, plugin_name, nranks):
    records = assert_exact_on_every_rank(matrix_runs.get(plugin_name, nranks), f"n{nranks}-barrier",
                                         nranks)
    last_entry = max(record["entered"] for record in records.values())
    first_exit = min(record["left"] for record in records.values())
    assert first_exit >= last_entry, \
        f"a rank left the barrier {last_entry - first_exit:.3f} s before the last rank entered it"


# -- absent peers -------------------------------------------------------------------------------


def _assert_absent_peer_reported(run: WorkerRun, scenario: str, nranks: int, absent: int,
                                 expected_message: str):
    present = [rank for rank in range(nranks) if rank != absent]
    reporter = present[0]
    assert run.returncode == 3, run.describe()
    assert f"devkit-run: rank {reporter} failed with exit code 3" in run.stderr, run.describe()
    for rank in present:
        record = run.records.get(f"{scenario}-rank{rank}", {}).get(rank)
        assert record is not None, f"rank {rank} recorded nothing\n{run.describe()}"
        assert record["error"] is None and not record["problems"], record
        assert record["raised"] == "DeadlineExceededError", record
        assert expected_message in record["message"], record["message"]
        assert record["waited"] < 30, f"rank {rank} waited {record['waited']:.1f} s"
    assert not run.leftover_segments, f"shared memory left behind: {sorted(run.leftover_segments)}"


@per_plugin("plugin_name,nranks", each_run)
def test_peer_death_ends_in_deadline_exceeded(tmp_path, plugin_name, nranks):
    """The last rank exits abruptly after joining; the others' next collective times out."""
    absent = nranks - 1
    run = run_worker(plugin_name, nranks, "peer-death", tmp_path, "--absent-rank", str(absent),
                     env={"DEVKIT_CCL_TIMEOUT": "2"})
    _assert_absent_peer_reported(run, "peer-death", nranks, absent, "DEADLINE_EXCEEDED")


@per_plugin("plugin_name,nranks,absent", lambda plugin: [
    pytest.param(plugin, nranks, absent, id=f"{_label(plugin)}-n{nranks}-absent{absent}")
    for nranks, absent in ((2, 1), (4, 2), (2, 0))])
def test_peer_that_never_joins(tmp_path, plugin_name, nranks, absent):
    """A rank other than 0 never joins: ccl_comm_init times out. Rank 0 never joins: the
    others time out waiting for its unique id at the rendezvous."""
    run = run_worker(plugin_name, nranks, "never-joins", tmp_path, "--absent-rank", str(absent),
                     env={"DEVKIT_CCL_TIMEOUT": "2", "DEVKIT_RENDEZVOUS_TIMEOUT": "2"})
    expected = "rank 0's unique id" if absent == 0 else "DEADLINE_EXCEEDED"
    _assert_absent_peer_reported(run, "never-joins", nranks, absent, expected)


# -- in-process: a world of one, ranks as threads, argument checks ---------------------------------


def _collective_plugin(plugin) -> devkit.Plugin:
    if not plugin.has_collectives:
        pytest.skip(reason=_no_collectives(plugin.name))
    return plugin


@pytest.fixture
def solo(plugin):
    """A communicator of one rank on device 0."""
    plugin = _collective_plugin(plugin)
    comm = distributed.Communicator(plugin.device(0), 0, 1, distributed.new_unique_id(plugin))
    yield comm
    comm.destroy()


def test_world_of_one(solo):
    data = np.arange(12, dtype=np.float32).reshape(3, 4)
    x = devkit.asarray(data, solo.device)
    assert np.array_equal(solo.all_reduce(x, devkit.empty((3, 4), np.float32, solo.device)).numpy(), data)
    assert np.array_equal(solo.all_reduce(x, op="max").numpy(), data)
    assert np.array_equal(solo.broadcast(x).numpy(), data)
    assert np.array_equal(solo.reduce(x, op="min").numpy(), data)
    gathered = solo.all_gather(x)
    assert gathered.shape == (3, 4) and np.array_equal(gathered.numpy(), data)
    scattered = solo.reduce_scatter(x)
    assert scattered.shape == (3, 4) and np.array_equal(scattered.numpy(), data)
    assert np.array_equal(solo.all_to_all(x).numpy(), data)
    solo.barrier()


def test_ranks_as_threads_of_one_process(plugin):
    """Ranks may be threads: two communicators joined from two threads on two devices."""
    plugin = _collective_plugin(plugin)
    devices = [plugin.device(i % plugin.device_count) for i in range(2)]
    unique_id = distributed.new_unique_id(plugin)
    results, errors = [None, None], []

    def rank_main(rank):
        try:
            with distributed.Communicator(devices[rank], rank, 2, unique_id) as comm:
                x = devkit.asarray(np.full(1000, rank + 1, np.int64), comm.device)
                results[rank] = comm.all_reduce(x).numpy()
        except BaseException as exc:  # re-raised in the test's thread
            errors.append(exc)

    threads = [threading.Thread(target=rank_main, args=(rank,)) for rank in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert not errors, errors
    for result in results:
        assert np.array_equal(result, np.full(1000, 3, np.int64))


def test_destroyed_communicator_refuses_work(solo):
    x = devkit.zeros(4, np.float32, solo.device)
    solo.destroy()
    solo.destroy()  # twice is fine
    with pytest.raises(ValueError, match="communicator has been destroyed"):
        solo.all_reduce(x)


def _argument_errors(comm: distributed.Communicator):
    dev, other = comm.device, comm.plugin.device(1 % comm.plugin.device_count)
    f32 = lambda n: devkit.zeros(n, np.float32, dev)  # noqa: E731
    cases = [
        ("not an array", lambda: comm.all_reduce(np.zeros(4, np.float32)), TypeError,
         "x must be a devkit.Array, got ndarray"),
        ("unsupported dtype", lambda: comm.all_reduce(devkit.zeros(4, np.uint16, dev)), TypeError,
         "x has dtype uint16, which collectives do not carry"),
        ("non-contiguous", lambda: comm.all_reduce(devkit.zeros((4, 4), np.float32, dev)[:, ::2]),
         ValueError, "x is not contiguous"),
        ("out of another dtype", lambda: comm.all_reduce(f32(4), devkit.zeros(4, np.int32, dev)),
         TypeError, "out has dtype int32 but x has float32"),
        ("out of another size", lambda: comm.all_reduce(f32(4), f32(5)), ValueError,
         "all_reduce: out has 5 elements"),
        ("unknown op", lambda: comm.all_reduce(f32(4), op="mean"), ValueError,
         "unknown reduction op 'mean'"),
        ("avg of integers", lambda: comm.all_reduce(devkit.zeros(4, np.int32, dev), op="avg"),
         TypeError, "op 'avg' needs a floating dtype, got int32"),
        ("root out of range", lambda: comm.broadcast(f32(4), root=comm.size), ValueError,
         f"root {comm.size} is not a rank of this communicator"),
        ("negative peer", lambda: comm.send(f32(4), peer=-1), ValueError,
         "peer -1 is not a rank of this communicator"),
        ("root not an int", lambda: comm.reduce(f32(4), root=0.0), TypeError,
         "root must be an int rank, got float"),
        ("all_gather out too small", lambda: comm.all_gather(f32(4), f32(4 * comm.size - 1)),
         ValueError, "all_gather: out has"),
        ("partial overlap", lambda: _partial_overlap(comm, f32(8)), ValueError,
         "x overlaps out without being out itself"),
    ]
    if other is not dev:
        cases += [
            ("array on another device", lambda: comm.all_reduce(devkit.zeros(4, np.float32, other)),
             ValueError, f"x is on {other}, but this communicator's device is {dev}"),
            ("stream of another device",
             lambda: comm.all_reduce(f32(4), stream=other.create_stream()), ValueError,
             f"stream belongs to {other}, but this communicator's device is {dev}"),
        ]
    return cases


def _partial_overlap(comm, array):
    return comm.all_reduce(array[0:4], array[2:6])


ARGUMENT_CHECKS = ["not an array", "unsupported dtype", "non-contiguous", "out of another dtype",
                   "out of another size", "unknown op", "avg of integers", "root out of range",
                   "negative peer", "root not an int", "all_gather out too small", "partial overlap",
                   "stream of another device", "array on another device"]


@pytest.mark.parametrize("check", ARGUMENT_CHECKS)
def test_argument_checks_come_before_the_plugin(solo, check, monkeypatch):
    cases = {name: (call, error, message) for name, call, error, message in _argument_errors(solo)}
    if check not in cases:
        pytest.skip(reason=f"plugin '{solo.plugin.name}' has one device; this check needs two")
    call, error, message = cases[check]
    # Every collective goes through Plugin.call: record, and do not make, any collective call.
    reached, real_call = [], solo.plugin.call

    def call_without_collectives(function, *args):
        if function in COLLECTIVE_FUNCTIONS:
            reached.append(function)
            return 0
        return real_call(function, *args)

    monkeypatch.setattr(solo.plugin, "call", call_without_collectives)
    with pytest.raises(error, match=re.escape(message)):
        call()
    assert not reached, f"the plugin was called ({reached}) before the argument check"


def test_unique_id(solo):
    unique_id = distributed.new_unique_id(solo.plugin)
    size = ffi.new("size_t *")
    solo.plugin.call("ccl_unique_id_size", size)
    assert isinstance(unique_id, bytes) and len(unique_id) == size[0] <= 4096
    assert distributed.new_unique_id(solo.plugin) != unique_id, "two ids made in a row are equal"
