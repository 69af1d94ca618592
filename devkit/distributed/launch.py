"""devkit-run: start N ranks of a program on this machine, for devkit collectives.

    devkit-run -n N [--timeout SECONDS] [--grace SECONDS] -- python script.py args...

Each rank gets DEVKIT_RANK, DEVKIT_WORLD_SIZE, DEVKIT_LOCAL_RANK,
DEVKIT_LOCAL_WORLD_SIZE, DEVKIT_RENDEZVOUS (the address of the launcher's
key-value store, see devkit.distributed.rendezvous) and DEVKIT_JOB_ID (16 hex digits,
the same for every rank of the job). Every line a rank prints is forwarded
prefixed with ``[rank K] `` (stdout to stdout, stderr to stderr).

When a rank fails (non-zero exit or a signal), the launcher terminates the
others (SIGTERM to each rank's process group, SIGKILL after --grace seconds),
says which rank failed and how, and exits with that rank's code (128 + signal
number for a signal). Ctrl-C or SIGTERM to the launcher terminates every rank
(exit 130 / 143); --timeout does the same after that long (exit 124).

When the job ends, the launcher removes the shared-memory segments of the job
that are left (/dev/shm/devkit-*-<DEVKIT_JOB_ID>-*): a plugin names its
per-job segments so (the cpu plugin's collectives do), and a rank killed
before its peers have all opened a segment cannot remove it itself.
"""

from __future__ import annotations

import argparse
import glob
import os
import secrets
import signal
import subprocess
import sys
import threading
import time

from .rendezvous import RENDEZVOUS_ENV, RendezvousServer

EXIT_TIMEOUT = 124  # as timeout(1)
JOB_ID_ENV = "DEVKIT_JOB_ID"
SHARED_MEMORY_DIR = "/dev/shm"
_POLL_SECONDS = 0.02


class _Interrupted(Exception):
    def __init__(self, signum: int):
        self.signum = signum


class _OutputForwarder:
    """Copies a rank's pipes to ours line by line, each line prefixed with its rank."""

    def __init__(self):
        self._lock = threading.Lock()
        self._threads: list[threading.Thread] = []

    def forward(self, rank: int, pipe, sink) -> None:
        thread = threading.Thread(target=self._copy, args=(f"[rank {rank}] ".encode(), pipe, sink),
                                  name=f"devkit-run rank {rank}", daemon=True)
        thread.start()
        self._threads.append(thread)

    def _copy(self, prefix: bytes, pipe, sink) -> None:
        with pipe:
            for line in iter(pipe.readline, b""):
                if not line.endswith(b"\n"):
                    line += b"\n"
                with self._lock:
                    sink.write(prefix + line)
                    sink.flush()

    def join(self, timeout: float) -> None:
        # A grandchild that outlived its rank may hold a pipe open: never wait forever.
        deadline = time.monotonic() + timeout
        for thread in self._threads:
            thread.join(max(0.0, deadline - time.monotonic()))


class _Rank:
    def __init__(self, rank: int, process: subprocess.Popen):
        self.rank = rank
        self.process = process

    @property
    def running(self) -> bool:
        return self.process.poll() is None

    def signal_group(self, signum: int) -> None:
        try:
            os.killpg(self.process.pid, signum)  # the rank and anything it started
        except ProcessLookupError:
            pass


def describe_exit(returncode: int) -> str:
    if returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = f"signal {-returncode}"
        return f"was killed by {name} (signal {-returncode})"
    return f"failed with exit code {returncode}"


def exit_code_for(returncode: int) -> int:
    return 128 - returncode if returncode < 0 else returncode


def rank_environment(rank: int, world_size: int, rendezvous: str, job_id: str) -> dict[str, str]:
    env = dict(os.environ)
    env.update({
        "DEVKIT_RANK": str(rank),
        "DEVKIT_WORLD_SIZE": str(world_size),
        "DEVKIT_LOCAL_RANK": str(rank),  # every rank runs on this machine
        "DEVKIT_LOCAL_WORLD_SIZE": str(world_size),
        RENDEZVOUS_ENV: rendezvous,
        JOB_ID_ENV: job_id,
    })
    env.setdefault("PYTHONUNBUFFERED", "1")  # so forwarded lines arrive as they are printed
    return env


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="devkit-run", description="Start N ranks of a program for devkit collectives.",
        usage="devkit-run -n N [--timeout SECONDS] [--grace SECONDS] -- command [args...]")
    parser.add_argument("-n", "--nranks", type=int, required=True, help="number of ranks to start")
    parser.add_argument("--timeout", type=float, default=None,
                        help="terminate every rank after this many seconds (exit 124)")
    parser.add_argument("--grace", type=float, default=5.0,
                        help="seconds between SIGTERM and SIGKILL when stopping ranks (default 5)")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="the program each rank runs")
    args = parser.parse_args(argv)
    if args.command[:1] == ["--"]:
        args.command = args.command[1:]
    if not args.command:
        parser.error("no command given: devkit-run -n N -- command [args...]")
    if args.nranks < 1:
        parser.error(f"-n must be at least 1, got {args.nranks}")
    if args.timeout is not None and args.timeout <= 0:
        parser.error(f"--timeout must be positive, got {args.timeout}")
    if args.grace < 0:
        parser.error(f"--grace must be non-negative, got {args.grace}")
    return args


def _say(message: str) -> None:
    sys.stderr.write(f"devkit-run: {message}\n")
    sys.stderr.flush()


def run(command: list[str], nranks: int, timeout: float | None = None, grace: float = 5.0) -> int:
    """Run ``command`` as ``nranks`` ranks; returns the launcher's exit code."""
    forwarder = _OutputForwarder()
    ranks: list[_Rank] = []

    interrupted: list[int] = []

    def on_signal(signum, _frame):
        # Only the first signal interrupts; later ones must not cut the clean-up short.
        if not interrupted:
            interrupted.append(signum)
            raise _Interrupted(signum)

    previous_handlers = {signum: signal.signal(signum, on_signal)
                         for signum in (signal.SIGINT, signal.SIGTERM)}
    server = RendezvousServer()
    job_id = secrets.token_hex(8)
    try:
        for rank in range(nranks):
            try:
                process = subprocess.Popen(
                    command, env=rank_environment(rank, nranks, server.address, job_id),
                    stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                    start_new_session=True)  # a group per rank: terminating it reaches its children
            except OSError as exc:
                _say(f"cannot start rank {rank}: {command[0]}: {exc.strerror or exc}")
                _stop(ranks, grace)
                return 127
            ranks.append(_Rank(rank, process))
            forwarder.forward(rank, process.stdout, sys.stdout.buffer)
            forwarder.forward(rank, process.stderr, sys.stderr.buffer)
        return _supervise(ranks, timeout, grace)
    except _Interrupted as interrupt:
        name = signal.Signals(interrupt.signum).name
        _say(f"received {name}; terminating all ranks")
        _stop(ranks, grace)
        return 128 + interrupt.signum
    finally:
        for rank in ranks:  # reap every child: no zombies, whatever happened above
            if rank.running:
                rank.signal_group(signal.SIGKILL)
            rank.process.wait()
        forwarder.join(timeout=2.0)
        server.close()
        _remove_segments(job_id)
        for signum, handler in previous_handlers.items():
            signal.signal(signum, handler)


def _supervise(ranks: list[_Rank], timeout: float | None, grace: float) -> int:
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
        failed = next((r for r in ranks if r.process.poll() not in (None, 0)), None)
        if failed is not None:
            returncode = failed.process.returncode
            others = [r.rank for r in ranks if r.running]
            _say(f"rank {failed.rank} {describe_exit(returncode)}"
                 + (f"; terminating ranks {_join(others)}" if others else ""))
            _stop(ranks, grace)
            return exit_code_for(returncode)
        if all(not r.running for r in ranks):
            return 0
        if deadline is not None and time.monotonic() >= deadline:
            running = [r.rank for r in ranks if r.running]
            _say(f"--timeout of {timeout:g} s reached; terminating ranks {_join(running)}")
            _stop(ranks, grace)
            return EXIT_TIMEOUT
        time.sleep(_POLL_SECONDS)


def _stop(ranks: list[_Rank], grace: float) -> None:
    """SIGTERM every rank's process group, SIGKILL them after ``grace`` seconds, reap the ranks.

    Groups of ranks that already exited are signalled too: what they started
    must not outlive the job.
    """
    for rank in ranks:
        rank.signal_group(signal.SIGTERM)
    deadline = time.monotonic() + grace
    while any(r.running for r in ranks) and time.monotonic() < deadline:
        time.sleep(_POLL_SECONDS)
    for rank in ranks:
        if rank.running:
            _say(f"rank {rank.rank} did not exit {grace:g} s after SIGTERM; sending SIGKILL")
        rank.signal_group(signal.SIGKILL)
        rank.process.wait()


def _remove_segments(job_id: str) -> None:
    """Unlink the job's shared-memory segments that are left: every rank is gone."""
    left = sorted(glob.glob(os.path.join(SHARED_MEMORY_DIR, f"devkit-*-{job_id}-*")))
    for path in left:
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass
    if left:
        _say(f"removed the shared memory the ranks left: {', '.join(left)}")


def _join(numbers: list[int]) -> str:
    return ", ".join(str(n) for n in numbers)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    sys.exit(run(args.command, args.nranks, args.timeout, args.grace))


if __name__ == "__main__":
    main()
