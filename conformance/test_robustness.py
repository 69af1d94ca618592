"""ABI robustness: malformed calls get an error status, and the process lives on.

Every case drives the plugin's raw function table and kernel entries (through
cffi) with a call a host must never make -- NULL pointers, foreign and freed
handles, devices out of range, tensors whose shapes, strides and offsets lie
or overflow, and, for every op the plugin publishes, attributes that are
missing, ill-typed or out of range and tensors of the wrong count, rank or
dtype (robustness_worker.py derives those from the op specs). A case passes
when every malformed call returned a status other than DK_OK (a kernel may
also report it at the stream's synchronisation) and the plugin still works.

The calls run in a worker process (robustness_worker.py), crash-isolated under
plain pytest too: a case that kills it fails naming the signal, and the next
case gets a new worker. --profile quick checks each op's kernel for one dtype
(the first of float32, int32, ... it has); --profile full every dtype.
"""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from devkit import ops
from devkit.abi import C
from devkit.ops.spec import dtype_name

from . import robustness_expectations as expectations
from . import robustness_worker as worker

WORKER = Path(worker.__file__)
REPLY_TIMEOUT_S = 60


class Worker:
    """One robustness_worker.py process for a plugin, restarted after it dies."""

    def __init__(self, plugin: str):
        self.plugin = plugin
        self.process: subprocess.Popen | None = None
        self.replies: queue.Queue = queue.Queue()

    def _start(self):
        self.process = subprocess.Popen([sys.executable, str(WORKER), self.plugin], stdin=subprocess.PIPE,
                                        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                        env=dict(os.environ, PYTHONFAULTHANDLER="1"))
        self.replies = queue.Queue()
        threading.Thread(target=self._pump, args=(self.process, self.replies), daemon=True).start()
        ready = self._read()
        if ready is None:
            raise RuntimeError(f"the robustness worker for {self.plugin} did not start: "
                               f"{self._death()}")

    @staticmethod
    def _pump(process: subprocess.Popen, replies: queue.Queue):
        for line in process.stdout:
            if line.startswith(worker.MARK):
                replies.put(json.loads(line[len(worker.MARK):]))
        replies.put(None)

    def _read(self) -> dict | None:
        """The next answer; None when the worker died or hung (then it is killed)."""
        try:
            return self.replies.get(timeout=REPLY_TIMEOUT_S)
        except queue.Empty:
            self.process.kill()
            self.hung = True
            return None

    def _death(self) -> str:
        self.process.wait(10)
        code = self.process.returncode
        if getattr(self, "hung", False):
            self.hung = False
            how = f"hung for {REPLY_TIMEOUT_S} s and was killed"
        elif code < 0:
            how = f"was killed by {signal.Signals(-code).name}"
        else:
            how = f"exited with status {code}"
        log = self.process.stderr.read()[-3000:]
        self.process = None
        return f"the plugin's process {how}\n{log}"

    def ask(self, case_id: str) -> dict:
        if self.process is None:
            self._start()
        self.process.stdin.write(case_id + "\n")
        self.process.stdin.flush()
        reply = self._read()
        if reply is None:
            return {"case": case_id, "died": self._death()}
        return reply

    def close(self):
        if self.process is not None:
            self.process.stdin.close()
            self.process.wait(30)


@pytest.fixture(scope="session")
def workers():
    pool: dict[str, Worker] = {}
    yield pool
    for w in pool.values():
        w.close()


def _plugin_spec(request) -> str:
    return request.node.callspec.params["plugin"]


def _run(request, workers, case_id: str):
    spec = _plugin_spec(request)
    w = workers.setdefault(spec, Worker(spec))
    reply = w.ask(case_id)
    if "died" in reply:
        pytest.fail(f"{case_id}: {reply['died']}", pytrace=False)
    if reply["skip"]:
        pytest.skip(reason=reply["skip"])
    assert reply["problem"] is None, f"the case itself failed:\n{reply['problem']}"
    accepted = [call for call in reply["calls"] if all(status == C.DK_OK for status in call)]
    assert reply["calls"] and not accepted, (
        f"{case_id}: the plugin accepted {len(accepted)} of {len(reply['calls'])} malformed call(s) "
        f"(statuses {reply['calls']}); last message: {reply['messages']}")
    assert reply["alive"] is None, f"{case_id}: the plugin is broken after the case: {reply['alive']}"


@pytest.mark.parametrize("case_id", sorted(worker.CASES))
def test_abi_call(plugin, request, workers, case_id):
    _run(request, workers, case_id)


def _kernel_params():
    params = []
    for spec in ops.all_specs():
        op = spec.name
        names = [dtype_name(d) for d in spec.dtypes]
        first = next((n for n in worker.PREFERRED_DTYPES if n in names), names[0])
        for dtype in names:
            marks = () if dtype == first else (pytest.mark.full,)
            for case_id in worker.kernel_case_ids(op, dtype) if dtype == first else ():
                params.append(pytest.param(case_id, id=case_id, marks=marks))
            if dtype != first:
                params.append(pytest.param(f"{op}/{dtype}/*", id=f"{op}/{dtype}", marks=marks))
    return params


@pytest.mark.parametrize("case_id", _kernel_params())
def test_kernel_call(plugin, request, workers, case_id):
    reason = expectations.reason_for(plugin.name, case_id)
    try:
        _check_kernel_call(request, workers, case_id)
    except (AssertionError, pytest.fail.Exception):
        if reason:
            pytest.xfail(reason=reason)
        raise


def _check_kernel_call(request, workers, case_id):
    if case_id.endswith("/*"):  # --profile full: every mutation of another dtype's kernel, in one test
        op, dtype, _ = case_id.split("/")
        ids = worker.kernel_case_ids(op, dtype)
        if not ids:
            pytest.skip(reason=f"{op} has no {dtype} case this suite can mutate")
        failures = []
        for one in ids:
            try:
                _run(request, workers, one)
            except pytest.skip.Exception:
                return pytest.skip(reason=f"the plugin publishes no kernel for {op} {dtype}")
            except AssertionError as exc:
                failures.append(str(exc).splitlines()[0])
        assert not failures, "\n".join(failures)
        return
    _run(request, workers, case_id)
