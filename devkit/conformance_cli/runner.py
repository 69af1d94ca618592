"""Collects and runs cases in worker processes that may crash or hang.

Each worker (worker.py) runs pytest on its cases and reports every case as
"started" and "finished" over a pipe. The cases are split into contiguous
shares, one per --workers, and a share is run by one worker at a time: a worker
that dies inside a case makes that case `crashed`; one that runs a case past
its timeout is killed and the case is `timeout`. Either way a new worker takes
the rest of the share.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import select
import selectors
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import devkit

from .results import Case, CaseResult

WORKER_MODULE = "devkit.conformance_cli.worker"
POLL_INTERVAL = 0.2
# A worker starting (importing and collecting the suite) or between two cases
# gets at least this long before it counts as stalled.
MIN_QUIET_ALLOWANCE = 60.0
# A hung worker is sent SIGABRT first, so that faulthandler prints where every
# thread is into its log, and SIGKILL after this long.
STACK_DUMP_GRACE = 2.0
# Processes a killed case started get this long between SIGTERM and SIGKILL.
TERMINATE_GRACE = 2.0
LOG_LINES = 60  # of a worker's output kept as a crashed, hung or abandoned case's details


class PluginLoadFailure(Exception):
    """The plugin under test does not load (or crashes its process while loading)."""


class CollectionFailure(Exception):
    """The worker could not collect the cases."""


class WorkerProcess:
    """One worker: its process (leader of its own process group), event pipe and log."""

    def __init__(self, arguments: list[str], plugin: str, workdir: Path, name: str):
        self.log_path = workdir / f"{name}.log"
        read_fd, write_fd = os.pipe()
        with open(self.log_path, "wb") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-m", WORKER_MODULE, "--event-fd", str(write_fd), *arguments],
                pass_fds=(write_fd,), stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                cwd=workdir, env=_worker_environment(plugin),
                # Its own process group, so that killing it takes the processes its case started too.
                start_new_session=True)
        os.close(write_fd)
        os.set_blocking(read_fd, False)
        self.events_fd = read_fd
        self.pipe_closed = False
        self._partial_line = b""

    def read_events(self) -> list[dict]:
        """The complete event lines that have arrived; never blocks."""
        data = b""
        while not self.pipe_closed:
            try:
                chunk = os.read(self.events_fd, 1 << 16)
            except BlockingIOError:
                break
            self.pipe_closed = not chunk
            data += chunk
        *lines, self._partial_line = (self._partial_line + data).split(b"\n")
        return [json.loads(line) for line in lines if line.strip()]

    def exit_code(self) -> int | None:
        return self.process.poll()

    def kill(self, dump_stacks: bool = False):
        """Kill the worker and every process its cases started, wherever their process group."""
        # Listed while the worker lives: once it dies they are reparented and out of reach.
        descendants = _descendants(self.process.pid) if self.process.poll() is None else []
        if dump_stacks and self.process.poll() is None:
            self.process.send_signal(signal.SIGABRT)
            try:
                self.process.wait(STACK_DUMP_GRACE)
            except subprocess.TimeoutExpired:
                pass
        _terminate(descendants)
        try:
            os.killpg(self.process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.process.wait()

    def close(self):
        self.kill()  # also reaps what its cases left running in its process group
        os.close(self.events_fd)

    def log_size(self) -> int:
        return self.log_path.stat().st_size

    def log_since(self, offset: int) -> str:
        """What it printed from ``offset`` on, from the top: faulthandler's report starts with
        the signal and the crashing thread's innermost frames."""
        with open(self.log_path, "rb") as log:
            log.seek(offset)
            lines = log.read().decode("utf-8", errors="replace").splitlines()
        return "\n".join(lines[:LOG_LINES] + ([f"[{len(lines) - LOG_LINES} more lines]"]
                                                 if len(lines) > LOG_LINES else []))

    def log_tail(self) -> str:
        lines = self.log_path.read_text(encoding="utf-8", errors="replace").splitlines()
        return "\n".join(lines[-LOG_LINES:])


def _descendants(pid: int) -> list[int]:
    """The processes below ``pid``, from /proc."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            parent = int(stat.read_text().rsplit(")", 1)[1].split()[1])  # after "pid (comm) state"
        except (OSError, IndexError, ValueError):
            continue  # it ended while we looked
        children.setdefault(parent, []).append(int(stat.parent.name))
    found, queue = [], [pid]
    while queue:
        below = children.get(queue.pop(), [])
        found += below
        queue += below
    return found


def _terminate(pids: list[int]):
    """SIGTERM, so that they can clean up (a collective rank unlinks its shared memory), then
    SIGKILL to those still there after TERMINATE_GRACE."""
    for signum in (signal.SIGTERM, signal.SIGKILL):
        alive = []
        for pid in pids:
            try:
                os.kill(pid, signum)
                alive.append(pid)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + TERMINATE_GRACE
        while alive and signum == signal.SIGTERM and time.monotonic() < deadline:
            time.sleep(0.05)
            alive = [pid for pid in alive if _alive(pid)]
        pids = alive


def _alive(pid: int) -> bool:
    """Running, not a zombie waiting for a parent that is itself hung or killed."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def _worker_environment(plugin: str) -> dict[str, str]:
    environment = dict(os.environ, DEVKIT_TEST_PLUGINS=plugin)
    # The worker imports the devkit this command runs from, whatever its working directory.
    devkit_root = str(Path(devkit.__file__).resolve().parent.parent)
    environment["PYTHONPATH"] = os.pathsep.join(filter(None, [devkit_root, os.environ.get("PYTHONPATH")]))
    return environment


def describe_exit(code: int) -> str:
    if code < 0:
        return f"was killed by {signal.Signals(-code).name}"
    return f"exited with status {code}"


# -- collecting --------------------------------------------------------------------------


@dataclasses.dataclass
class Collection:
    plugin: dict             # worker.describe_plugin()
    cases: list[Case]
    errors: list[CaseResult]  # one `error` result per module that failed to import


def collect(plugin: str, suite_dir: Path, files: list[Path], keyword: str | None,
            markers: str | None, workdir: Path, timeout: float) -> Collection:
    """Load the plugin and collect the selected cases, in a worker."""
    arguments = ["--suite-dir", str(suite_dir), "collect", *map(str, files)]
    arguments += ["-k", keyword] if keyword else []
    arguments += ["-m", markers] if markers else []
    worker = WorkerProcess(arguments, plugin, workdir, "collect")
    events: list[dict] = []
    deadline = time.monotonic() + max(timeout, MIN_QUIET_ALLOWANCE)
    try:
        while not worker.pipe_closed and time.monotonic() < deadline:
            select.select([worker.events_fd], [], [], POLL_INTERVAL)
            events += worker.read_events()
        try:
            worker.process.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            worker.kill(dump_stacks=True)
            raise CollectionFailure(f"collecting the cases took longer than {timeout:g} s\n"
                                    f"{worker.log_tail()}") from None
        exit_code = worker.process.returncode
    finally:
        worker.close()
    found = {event["event"]: event for event in events}
    if "load_error" in found:
        raise PluginLoadFailure(found["load_error"]["message"])
    if "plugin" not in found:
        raise PluginLoadFailure(f"the worker {describe_exit(exit_code)} while loading the plugin\n"
                                f"{worker.log_tail()}")
    if "collected" not in found:
        raise CollectionFailure(f"the worker {describe_exit(exit_code)} while collecting the cases\n"
                                f"{worker.log_tail()}")
    collected = found["collected"]
    return Collection(
        plugin=found["plugin"]["plugin"],
        cases=[Case(case["id"], case["timeout"]) for case in collected["cases"]],
        errors=[CaseResult(error["id"], "error", message="the module failed to import",
                           details=error["message"]) for error in collected["errors"]])


# -- running -----------------------------------------------------------------------------


@dataclasses.dataclass
class _Share:
    """Cases that one worker at a time runs, in order; a replacement takes the rest."""

    cases: list[Case]           # not finished yet
    worker: WorkerProcess | None = None
    current: Case | None = None  # started, not finished
    current_since: float = 0.0
    current_log_offset: int = 0  # where the current case's output starts in the worker's log
    quiet_since: float = 0.0     # the last event, or the worker's start
    worker_started_a_case: bool = False


class CaseRunner:
    def __init__(self, plugin: str, suite_dir: Path, workdir: Path, case_timeout: float,
                 on_started: Callable[[Case], None] = lambda case: None,
                 on_finished: Callable[[CaseResult], None] = lambda result: None,
                 on_progress: Callable[[Case, dict], None] = lambda case, event: None):
        self.plugin = plugin
        self.suite_dir = suite_dir
        self.workdir = workdir
        self.case_timeout = case_timeout
        self.on_started = on_started
        self.on_finished = on_finished
        self.on_progress = on_progress  # a "progress" event of the running case (progress.py)
        # What went wrong outside any case, e.g. a worker that crashed while exiting.
        self.incidents: list[str] = []
        self._results: list[CaseResult] = []
        self._workers_started = 0

    def run(self, cases: list[Case], workers: int = 1) -> list[CaseResult]:
        """Run the cases; results come back in the order of ``cases``."""
        self._run_start = time.monotonic()
        self._selector = selectors.DefaultSelector()
        share_size = math.ceil(len(cases) / workers) if cases else 1
        shares = [_Share(cases[i:i + share_size]) for i in range(0, len(cases), share_size)]
        try:
            for share in shares:
                self._start_worker(share)
            while any(share.worker for share in shares):
                for key, _ in self._selector.select(POLL_INTERVAL):
                    self._read_events(key.data)
                for share in shares:
                    if share.worker is None:
                        continue
                    if share.worker.exit_code() is not None:
                        self._worker_exited(share)
                    elif time.monotonic() > self._deadline(share):
                        self._worker_overran(share)
        finally:
            for share in shares:
                if share.worker is not None:
                    self._retire(share)
            self._selector.close()
        order = {case.id: index for index, case in enumerate(cases)}
        return sorted(self._results, key=lambda result: order[result.id])

    # -- workers ------------------------------------------------------------------------

    def _start_worker(self, share: _Share):
        self._workers_started += 1
        name = f"worker-{self._workers_started}"
        cases_file = self.workdir / f"{name}.cases.json"
        cases_file.write_text(json.dumps([case.id for case in share.cases]))
        share.worker = WorkerProcess(["--suite-dir", str(self.suite_dir), "run", str(cases_file)],
                                     self.plugin, self.workdir, name)
        share.current, share.quiet_since, share.worker_started_a_case = None, time.monotonic(), False
        self._selector.register(share.worker.events_fd, selectors.EVENT_READ, share)

    def _retire(self, share: _Share):
        if not share.worker.pipe_closed:
            self._selector.unregister(share.worker.events_fd)
        share.worker.close()
        share.worker = None

    def _read_events(self, share: _Share):
        worker = share.worker
        was_open = not worker.pipe_closed
        for event in worker.read_events():
            if event["event"] == "started":
                self._case_started(share, event["id"])
            elif event["event"] == "finished":
                self._case_finished(share, event)
            elif event["event"] == "progress" and share.current is not None:
                self.on_progress(share.current, event)
        if was_open and worker.pipe_closed:
            self._selector.unregister(worker.events_fd)

    def _deadline(self, share: _Share) -> float:
        if share.current is not None:
            return share.current_since + (share.current.timeout or self.case_timeout)
        return share.quiet_since + max(self.case_timeout, MIN_QUIET_ALLOWANCE)

    def _worker_exited(self, share: _Share):
        self._read_events(share)  # what it said before it ended
        code = share.worker.exit_code()
        if share.current is not None:
            self._record(share, share.current, "crashed",
                         f"the worker process {describe_exit(code)} during this case",
                         share.worker.log_since(share.current_log_offset))
        elif code in (0, 1):
            if share.cases:
                self._abandon(share, "the worker finished without running this case (it was not collected)")
        else:
            self._failed_between_cases(share, describe_exit(code))
        self._replace(share)

    def _worker_overran(self, share: _Share):
        share.worker.kill(dump_stacks=True)
        self._read_events(share)  # it may have finished the case just now
        if share.current is not None:
            limit = share.current.timeout or self.case_timeout
            self._record(share, share.current, "timeout",
                         f"still running after {limit:g} s; its worker was killed",
                         share.worker.log_since(share.current_log_offset))
        else:
            self._failed_between_cases(
                share, f"stalled for {max(self.case_timeout, MIN_QUIET_ALLOWANCE):g} s")
        self._replace(share)

    def _failed_between_cases(self, share: _Share, what: str):
        """The worker died or hung outside any case (say, in a thread the plugin left running)."""
        if share.cases and not share.worker_started_a_case:
            # Starting up or collecting: a new worker would fail the same way.
            self._abandon(share, f"the worker {what} before running this case")
        else:
            where = "between two cases" if share.cases else "after its last case"
            self.incidents.append(f"a worker {what} {where}\n{share.worker.log_tail()}")

    def _replace(self, share: _Share):
        """Retire the worker; a new one takes the share's cases that a crash or hang left."""
        self._retire(share)
        if share.cases:
            self._start_worker(share)

    # -- cases ---------------------------------------------------------------------------

    def _case_started(self, share: _Share, case_id: str):
        share.current = next(case for case in share.cases if case.id == case_id)
        share.current_since = share.quiet_since = time.monotonic()
        share.current_log_offset = share.worker.log_size()
        share.worker_started_a_case = True
        self.on_started(share.current)

    def _case_finished(self, share: _Share, event: dict):
        case = next(case for case in share.cases if case.id == event["id"])
        self._record(share, case, event["status"], event["message"], event["details"],
                     event["properties"])

    def _record(self, share: _Share, case: Case, status: str, message: str, details: str,
                properties: dict | None = None):
        now = time.monotonic()
        started = share.current_since if share.current is case else None
        result = CaseResult(case.id, status, duration=now - started if started is not None else 0.0,
                            message=message, details=details, properties=properties or {},
                            started_at=started - self._run_start if started is not None else None)
        share.cases.remove(case)
        share.current, share.quiet_since = None, now
        self._results.append(result)
        self.on_finished(result)

    def _abandon(self, share: _Share, reason: str):
        """Every case left in the share is an error: its worker cannot run it."""
        details = share.worker.log_tail()
        for case in list(share.cases):
            self._record(share, case, "error", reason, details)
