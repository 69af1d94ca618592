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
plain pytest too. One test drives one kernel: its mutations go to the worker
as a batch, answered one by one; a mutation that kills the worker fails
naming the signal, and a new worker takes the rest of the batch. A kernel
that accepted a malformed call may have corrupted the worker's memory, so the
next test gets a new worker.

The profile (DEVKIT_CONFORMANCE_PROFILE, which devkit-conformance --profile
sets; plain pytest runs quick): quick checks each op's kernel for one dtype
(the first of float32, int32, ... it has), full every dtype.
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
from devkit.conformance_cli.suites import PROFILE_VARIABLE
from devkit.ops.spec import dtype_name

from . import robustness_worker as worker

WORKER = Path(worker.__file__)
REPLY_TIMEOUT_S = 60
FULL_PROFILE = os.environ.get(PROFILE_VARIABLE, "quick") == "full"


class Worker:
    """One robustness_worker.py process for a plugin, restarted after it dies."""

    def __init__(self, plugin: str):
        self.plugin = plugin
        self.process: subprocess.Popen | None = None
        self.replies: queue.Queue = queue.Queue()
        self.hung = False

    def _start(self):
        self.process = subprocess.Popen([sys.executable, str(WORKER), self.plugin], stdin=subprocess.PIPE,
                                        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                        env=dict(os.environ, PYTHONFAULTHANDLER="1"))
        self.replies = queue.Queue()
        threading.Thread(target=self._pump, args=(self.process, self.replies), daemon=True).start()
        if self._read() is None:
            raise RuntimeError(f"the robustness worker for {self.plugin} did not start: {self._death()}")

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
        """How the worker ended, with the tail of its log; the next batch starts a new one."""
        self.process.kill()  # a no-op when it is dead already
        self.process.wait(10)
        code = self.process.returncode
        if self.hung:
            self.hung = False
            how = f"hung for {REPLY_TIMEOUT_S} s and was killed"
        elif code < 0:
            how = f"was killed by {signal.Signals(-code).name}"
        else:
            how = f"exited with status {code}"
        log = self.process.stderr.read()[-3000:]
        self.process = None
        return f"the plugin's process {how}\n{log}"

    def _send(self, case_ids: list[str]) -> bool:
        """Hands the cases to a live worker; False when it had died meanwhile (after its last answer)."""
        try:
            self.process.stdin.write("".join(case_id + "\n" for case_id in case_ids))
            self.process.stdin.flush()
            return True
        except (BrokenPipeError, OSError):
            return False

    def ask(self, case_ids: list[str]) -> list[dict]:
        """Every case's answer, in order. A case that kills the worker is answered {"died": how}
        and a new worker takes the cases after it."""
        answers: list[dict] = []
        while len(answers) < len(case_ids):
            rest = case_ids[len(answers):]
            if self.process is None:
                self._start()
            if not self._send(rest):  # the last batch's worker died after answering: not these cases
                self._death()
                continue
            for case_id in rest:
                reply = self._read()
                if reply is None:
                    answers.append({"case": case_id, "died": self._death()})
                    break
                answers.append(reply)
        return answers

    def restart(self):
        """The next batch runs in a new worker (this one's memory may be corrupt)."""
        if self.process is not None:
            self._death()

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


def _verdict(reply: dict) -> tuple[str | None, str | None]:
    """(why the case failed or None, why it skips or None)."""
    case_id = reply["case"]
    if "died" in reply:
        return f"{case_id}: {reply['died']}", None
    if reply["skip"]:
        return None, reply["skip"]
    if reply["problem"] is not None:
        return f"{case_id}: the case itself failed:\n{reply['problem']}", None
    accepted = [call for call in reply["calls"] if all(status == C.DK_OK for status in call)]
    if not reply["calls"] or accepted:
        return (f"{case_id}: the plugin accepted {len(accepted)} of {len(reply['calls'])} malformed call(s) "
                f"(statuses {reply['calls']}); last message: {reply['messages']}"), None
    if reply["alive"] is not None:
        return f"{case_id}: the plugin is broken after the case: {reply['alive']}", None
    return None, None


def _run(request, workers, case_ids: list[str]) -> None:
    """Runs the cases as one batch; fails listing every case that failed."""
    spec = _plugin_spec(request)
    w = workers.setdefault(spec, Worker(spec))
    failures, skips = [], []
    for reply in w.ask(case_ids):
        failure, skip = _verdict(reply)
        failures += [failure] if failure else []
        skips += [skip] if skip else []
    if failures:
        w.restart()
        pytest.fail("\n".join(failures), pytrace=False)
    if skips:
        pytest.skip(reason=skips[0])


@pytest.mark.parametrize("case_id", sorted(worker.CASES))
def test_abi_call(plugin, request, workers, case_id):
    _run(request, workers, [case_id])


def _kernel_params():
    """One test per op's kernel: the first dtype's always, the others' in the full profile."""
    params = []
    for spec in ops.all_specs():
        names = [dtype_name(d) for d in spec.dtypes]
        first = next((n for n in worker.PREFERRED_DTYPES if n in names), names[0])
        params.append(pytest.param(spec.name, first, id=f"{spec.name}/{first}"))
        if FULL_PROFILE:
            params += [pytest.param(spec.name, dtype, id=f"{spec.name}/{dtype}", marks=pytest.mark.full)
                       for dtype in names if dtype != first]
    return params


@pytest.mark.parametrize(("op", "dtype"), _kernel_params())
def test_kernel_call(plugin, request, workers, op, dtype):
    """Every mutation of the op's valid call (robustness_worker.mutations) must be refused."""
    case_ids = worker.kernel_case_ids(op, dtype)
    if not case_ids:
        pytest.skip(reason=f"{op} has no {dtype} case this suite can mutate")
    _run(request, workers, case_ids)
