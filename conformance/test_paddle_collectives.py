"""paddle.distributed across 2 ranks through the bridge's xccl hooks (docs/paddle.md, "Collectives").

Two processes, one per rank, run paddle_collective_worker.py with Paddle's
launch variables set here (backend xccl: ProcessGroupCustom on the devkit
device; Paddle's TCP store carries the plugin's unique id). On a plugin with
collectives: all_reduce (sum and max at four sizes, min, prod, int64),
broadcast, all_gather, reduce, reduce_scatter, send/recv, alltoall and
barrier, every output compared bit for bit with NumPy's result on every
rank; then what the plugin refuses (an int16 and a complex64 all_reduce) must
be Paddle's error with the reason on stderr, AVG Paddle's own refusal, after
which the communicator still works. On a plugin without collectives the first
all_reduce must be Paddle's error naming what the plugin lacks. Both ranks
must exit 0 within WORKER_TIMEOUT_S (a hang fails, killed). Once more with
the ranks started by Paddle's launcher (python -m paddle.distributed.launch).
Skipped, with the install command, without paddlepaddle.
"""

from __future__ import annotations

import functools
import importlib.util
import json
import os
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import pytest

import devkit

from . import paddle_collective_worker as worker
from .conftest import PLUGINS, has_collectives

pytestmark = [pytest.mark.skipif(importlib.util.find_spec("paddle") is None,
                                 reason="PaddlePaddle is not installed: pip install 'devkit[paddle]'"),
              pytest.mark.xdist_group("paddle-collectives")]  # the runs are cached per process

WORKER_TIMEOUT_S = 300
CCL_TIMEOUT_S = 60  # a rank whose peer fell out of step fails in this long, not hangs
PADDLE_ERROR = "CustomDevice error, the error code is : 3"  # C_ERROR, as Paddle raises it


def _plugin_variable(name: str) -> str:
    """DEVKIT_PADDLE_PLUGIN for plugin ``name`` (a built-in by name, any other by its library)."""
    plugin = devkit.load_plugin(name)
    return plugin.name if plugin.source == "built-in" else plugin.location


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait(processes: list) -> list:
    """Each process's exit code, or what stopped it: past WORKER_TIMEOUT_S all are killed (a hang fails)."""
    codes = []
    for process in processes:
        try:
            codes.append(process.wait(timeout=WORKER_TIMEOUT_S))
        except subprocess.TimeoutExpired:
            for other in processes:
                other.kill()
                other.wait()
            codes.append(f"killed after {WORKER_TIMEOUT_S} s")
    return codes


def _environment(name: str) -> dict:
    devkit_root = str(Path(devkit.__file__).resolve().parent.parent)
    env = {**os.environ, "DEVKIT_PADDLE_PLUGIN": _plugin_variable(name),
           "PYTHONPATH": os.pathsep.join(filter(None, [devkit_root, os.environ.get("PYTHONPATH")])),
           "DEVKIT_CCL_TIMEOUT": str(CCL_TIMEOUT_S)}
    env.pop("CUSTOM_DEVICE_ROOT", None)  # the worker's devkit.paddle sets it to its own build
    return env


def _read(out: Path, log: Path, code) -> tuple:
    return code, json.loads(out.read_text()) if out.exists() else None, log.read_text() if log.exists() else ""


@functools.lru_cache(maxsize=None)
def run_ranks(name: str, mode: str) -> tuple:
    """Both ranks' (exit code, results or None, output) for one worker run on plugin ``name``,
    each rank a process started here with Paddle's launch variables."""
    devices = devkit.load_plugin(name).device_count
    ports = [_free_port() for _ in range(worker.NRANKS)]
    endpoints = [f"127.0.0.1:{port}" for port in ports]
    base = {**_environment(name), "PADDLE_DISTRI_BACKEND": "xccl", "PADDLE_TRAINERS_NUM": str(worker.NRANKS),
            "PADDLE_TRAINER_ENDPOINTS": ",".join(endpoints), "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(ports[0])}
    with tempfile.TemporaryDirectory() as tmp:
        outs = [Path(tmp, f"rank{rank}.json") for rank in range(worker.NRANKS)]
        logs = [Path(tmp, f"rank{rank}.log") for rank in range(worker.NRANKS)]
        processes = []
        for rank in range(worker.NRANKS):
            with open(logs[rank], "w") as log:
                processes.append(subprocess.Popen(
                    [sys.executable, worker.__file__, mode, "--out", str(outs[rank])],
                    env={**base, "PADDLE_TRAINER_ID": str(rank), "PADDLE_CURRENT_ENDPOINT": endpoints[rank],
                         "FLAGS_selected_devkits": str(rank % devices)},
                    stdout=log, stderr=subprocess.STDOUT))
        codes = _wait(processes)
        return tuple(_read(outs[rank], logs[rank], codes[rank]) for rank in range(worker.NRANKS))


@functools.lru_cache(maxsize=None)
def run_launched(name: str) -> tuple:
    """The same, the ranks started by ``python -m paddle.distributed.launch --devices ...``; its
    exit code is both ranks'. The launcher imports paddle without devkit.paddle, so
    CUSTOM_DEVICE_ROOT is set for it (python -m devkit.paddle --root)."""
    devices = devkit.load_plugin(name).device_count
    env = _environment(name)
    env["CUSTOM_DEVICE_ROOT"] = subprocess.run([sys.executable, "-m", "devkit.paddle", "--root"], env=env,
                                               capture_output=True, text=True, check=True).stdout.strip()
    with tempfile.TemporaryDirectory() as tmp:
        command = [sys.executable, "-m", "paddle.distributed.launch",
                   "--devices", ",".join(str(rank % devices) for rank in range(worker.NRANKS)),
                   "--log_dir", str(Path(tmp, "log")), worker.__file__, "collectives",
                   "--out", str(Path(tmp, "rank{rank}.json"))]
        with open(Path(tmp, "launcher.log"), "w") as log:
            code, = _wait([subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT)])
        return tuple(_read(Path(tmp, f"rank{rank}.json"), Path(tmp, "log", f"workerlog.{rank}"), code)
                     for rank in range(worker.NRANKS))


def _ranks_ok(ranks: tuple, name: str) -> tuple:
    for rank, (code, results, log) in enumerate(ranks):
        assert code == 0 and results is not None, f"rank {rank} on {name} exited with {code}:\n{log[-4000:]}"
    return ranks


def _plugins(with_collectives: bool) -> list[str]:
    """The plugins under test that have (or lack) collectives, and those that do not load (they fail)."""
    return [name for name in PLUGINS if has_collectives(name) in (None, with_collectives)]


def _params(with_collectives: bool, cases) -> list:
    return [pytest.param(name, case, id=f"{os.path.basename(name)}-{case}")
            for name in _plugins(with_collectives) for case in cases]


def expected(case: str, spec: tuple, rank: int):
    """NumPy's output of ``case`` on ``rank``, or None where the collective leaves it unspecified."""
    collective, dtype, size, extra = spec
    x = [worker.inputs(case, r, dtype, size) for r in range(worker.NRANKS)]
    if collective == "all_reduce":
        return {"sum": np.add, "max": np.maximum, "min": np.minimum, "prod": np.multiply}[extra](x[0], x[1])
    if collective == "broadcast":
        return x[extra]
    if collective == "all_gather":
        return x
    if collective == "reduce":
        return x[0] + x[1] if rank == extra else None  # the root's only
    if collective == "reduce_scatter":
        return np.split(x[0] + x[1], worker.NRANKS)[rank]
    if collective == "send_recv":
        return x[0]
    if collective == "alltoall":
        return [worker.inputs(f"{case}/{rank}", r, dtype, size) for r in range(worker.NRANKS)]
    if collective == "barrier":
        return []
    raise ValueError(collective)


def _check(ranks: tuple, name: str, case: str, spec: tuple) -> None:
    dtype = spec[1]
    for rank, (_, results, _) in enumerate(_ranks_ok(ranks, name)):
        result = results[case]
        assert result["error"] is None, f"rank {rank}: {result['error']}\n{result['stderr']}"
        want = expected(case, spec, rank)
        if want is None:
            continue
        got = np.asarray(result["value"], dtype)
        want = np.asarray(want, dtype)
        assert got.shape == want.shape, f"rank {rank}: shape {got.shape}, expected {want.shape}"
        assert got.tobytes() == want.tobytes(), (
            f"rank {rank}: {int(np.sum(got != want))} of {want.size} elements differ")


@pytest.mark.parametrize("name, case", _params(True, worker.CASES))
def test_collective(name, case):
    _check(run_ranks(name, "collectives"), name, case, worker.CASES[case])


# case -> (Paddle's error, what the bridge reports on stderr after "[devkit.paddle] ", or None: nothing).
ERRORS = {
    "all_reduce_int16": (f"OSError: (External)  {PADDLE_ERROR}", "all_reduce failed (status 3): all_reduce: dtype key"),
    "all_reduce_complex64": (f"OSError: (External)  {PADDLE_ERROR}",
                             "xccl_all_reduce: Paddle dtype complex64 has no devkit dtype"),
    "all_reduce_avg": ("ValueError: (InvalidArgument) Invalid CustomCCL reduction. Must be Min | Max | Prod | Sum",
                       None),
}


@pytest.mark.parametrize("name, case", _params(True, worker.ERROR_CASES))
def test_refused_collective(name, case):
    """A dtype the plugin lacks is Paddle's CustomDevice error, with the reason on stderr, on every
    rank; AVG is refused by Paddle itself before it reaches the bridge."""
    error, report = ERRORS[case]
    for rank, (_, results, _) in enumerate(_ranks_ok(run_ranks(name, "collectives"), name)):
        result = results[case]
        assert result["value"] is None, f"rank {rank}: the {case} collective ran: {result['value']}"
        assert result["error"].startswith(error), result["error"]
        if report is None:
            assert "[devkit.paddle]" not in result["stderr"], result["stderr"]
        else:
            assert f"[devkit.paddle] {report}" in result["stderr"], result["stderr"]


@pytest.mark.parametrize("name, case", _params(True, worker.AFTER_ERRORS))
def test_collective_after_errors(name, case):
    _check(run_ranks(name, "collectives"), name, case, worker.AFTER_ERRORS[case])


@pytest.mark.parametrize("name", _plugins(True), ids=os.path.basename)
def test_launched_by_paddle(name):
    """Paddle's own launcher starts the ranks (it sets FLAGS_selected_devkits and the backend)."""
    ranks = run_launched(name)
    for each, spec in worker.CASES.items():
        _check(ranks, name, each, spec)


@pytest.mark.parametrize("name, case", _params(False, ["all_reduce_sum_7"]))
def test_plugin_without_collectives(name, case):
    """Rank 0 makes the unique id: Paddle's error, the bridge naming what the plugin lacks. Rank 1,
    waiting for that id in Paddle's TCP store (served by rank 0), fails when rank 0 exits."""
    ranks = _ranks_ok(run_ranks(name, "missing"), name)
    label = _plugin_variable(name)
    first = ranks[0][1][case]
    assert first["value"] is None and PADDLE_ERROR in first["error"], first
    assert (f"[devkit.paddle] xccl_get_unique_id_size: devkit plugin '{label}' has no ccl_unique_id_size"
            in first["stderr"]), first["stderr"]
    second = ranks[1][1][case]
    assert second["value"] is None and second["error"], second
