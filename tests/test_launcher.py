"""devkit-run: rank environment, output forwarding, failure handling, timeouts,
signals, the rendezvous store, and the same collective script under mpirun."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

import devkit
from devkit.distributed.rendezvous import RendezvousClient, RendezvousServer

LAUNCHER = [sys.executable, "-m", "devkit.distributed.launch"]
MPIRUN = shutil.which("mpirun")


def launch(tmp_path: Path, script: str, *launcher_args: str, timeout: float = 60,
           env: dict | None = None) -> subprocess.CompletedProcess:
    path = tmp_path / "rank_script.py"
    path.write_text(textwrap.dedent(script))
    started = time.monotonic()
    result = subprocess.run([*LAUNCHER, *launcher_args, "--", sys.executable, str(path)],
                            capture_output=True, text=True, timeout=timeout,
                            env={**os.environ, **(env or {})})
    result.seconds = time.monotonic() - started
    return result


def lines_of(output: str, rank: int) -> list[str]:
    prefix = f"[rank {rank}] "
    return [line[len(prefix):] for line in output.splitlines() if line.startswith(prefix)]


def process_gone(pid: int) -> bool:
    """Not running any more (a killed grandchild may wait as a zombie for init to reap it)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return True
    return state in ("Z", "X")


# -- the ranks' environment and output ------------------------------------------------------


def test_each_rank_gets_its_environment(tmp_path):
    result = launch(tmp_path, """
        import json, os
        print(json.dumps({k: v for k, v in os.environ.items() if k.startswith("DEVKIT_")}))
    """, "-n", "3")
    assert result.returncode == 0, result.stderr
    seen = [json.loads(lines_of(result.stdout, rank)[0]) for rank in range(3)]
    addresses = {env["DEVKIT_RENDEZVOUS"] for env in seen}
    assert len(addresses) == 1 and re.fullmatch(r"127\.0\.0\.1:\d+", addresses.pop())
    job_ids = {env["DEVKIT_JOB_ID"] for env in seen}
    assert len(job_ids) == 1 and re.fullmatch(r"[0-9a-f]{16}", job_ids.pop())
    for rank, env in enumerate(seen):
        assert env["DEVKIT_RANK"] == str(rank)
        assert env["DEVKIT_LOCAL_RANK"] == str(rank)
        assert env["DEVKIT_WORLD_SIZE"] == env["DEVKIT_LOCAL_WORLD_SIZE"] == "3"


def test_output_is_forwarded_line_by_line_with_the_rank(tmp_path):
    result = launch(tmp_path, """
        import os, sys
        rank = os.environ["DEVKIT_RANK"]
        for i in range(200):
            print(f"out {rank} {i} " + "x" * 300)
        print(f"err {rank}", file=sys.stderr)
        sys.stdout.write(f"no newline {rank}")
    """, "-n", "2")
    assert result.returncode == 0, result.stderr
    for rank in range(2):
        out = lines_of(result.stdout, rank)
        assert out == [f"out {rank} {i} " + "x" * 300 for i in range(200)] + [f"no newline {rank}"]
        assert lines_of(result.stderr, rank) == [f"err {rank}"]
    assert all(line.startswith("[rank ") for line in result.stdout.splitlines()), \
        "a line reached stdout without its rank prefix (interleaved mid-line?)"


# -- failures, timeouts and signals ----------------------------------------------------------------

# Ranks write their pid (and their child's) to a file, so the test can check they are gone.
PID_RECORDING = """
    import os, subprocess, sys, time
    from pathlib import Path
    rank = int(os.environ["DEVKIT_RANK"])
    child = subprocess.Popen(["sleep", "120"])
    Path(sys.argv[0]).with_name(f"pids{rank}").write_text(f"{os.getpid()} {child.pid}")
    print("ready", flush=True)
"""


def recorded_pids(tmp_path: Path, nranks: int) -> list[int]:
    return [int(pid) for rank in range(nranks)
            for pid in (tmp_path / f"pids{rank}").read_text().split()]


def test_a_failing_rank_stops_the_others_and_its_code_is_returned(tmp_path):
    result = launch(tmp_path, PID_RECORDING + """
    if rank == 1:
        time.sleep(0.5)
        sys.exit(7)
    time.sleep(120)
    """, "-n", "3")
    assert result.returncode == 7
    assert "devkit-run: rank 1 failed with exit code 7; terminating ranks 0, 2" in result.stderr
    assert result.seconds < 30
    for pid in recorded_pids(tmp_path, 3):
        assert process_gone(pid), f"process {pid} outlived the launcher"


def test_a_rank_killed_by_a_signal_is_reported_by_name(tmp_path):
    result = launch(tmp_path, """
        import os, signal, time
        if os.environ["DEVKIT_RANK"] == "0":
            os.kill(os.getpid(), signal.SIGKILL)
        time.sleep(120)
    """, "-n", "2")
    assert result.returncode == 128 + signal.SIGKILL
    assert "devkit-run: rank 0 was killed by SIGKILL (signal 9); terminating ranks 1" in result.stderr


def test_a_rank_ignoring_sigterm_is_killed_after_the_grace_period(tmp_path):
    result = launch(tmp_path, PID_RECORDING + """
    import signal
    if rank == 0:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        time.sleep(120)
    time.sleep(1)
    sys.exit(5)
    """, "-n", "2", "--grace", "0.5")
    assert result.returncode == 5
    assert "rank 0 did not exit 0.5 s after SIGTERM; sending SIGKILL" in result.stderr
    assert result.seconds < 30
    for pid in recorded_pids(tmp_path, 2):
        assert process_gone(pid)


def test_timeout_terminates_every_rank(tmp_path):
    result = launch(tmp_path, PID_RECORDING + """
    time.sleep(120)
    """, "-n", "2", "--timeout", "2")
    assert result.returncode == 124
    assert "devkit-run: --timeout of 2 s reached; terminating ranks 0, 1" in result.stderr
    assert result.seconds < 30
    for pid in recorded_pids(tmp_path, 2):
        assert process_gone(pid)


def test_ctrl_c_terminates_every_rank(tmp_path):
    script = tmp_path / "rank_script.py"
    script.write_text(textwrap.dedent(PID_RECORDING + """
    time.sleep(120)
    """))
    launcher = subprocess.Popen([*LAUNCHER, "-n", "2", "--", sys.executable, str(script)],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    ready = 0
    while ready < 2:
        line = launcher.stdout.readline()
        assert line, "the launcher's output ended before both ranks were ready"
        ready += line.endswith("ready\n")
    launcher.send_signal(signal.SIGINT)
    stdout, stderr = launcher.communicate(timeout=30)
    assert launcher.returncode == 128 + signal.SIGINT
    assert "devkit-run: received SIGINT; terminating all ranks" in stderr
    for pid in recorded_pids(tmp_path, 2):
        assert process_gone(pid)


def test_the_launcher_reaps_every_rank_and_closes_its_sockets(tmp_path):
    """After run() returns, the launcher has no child left (not even a zombie) and no socket open."""
    script = tmp_path / "rank_script.py"
    script.write_text(textwrap.dedent("""
        import os, sys, time
        if os.environ["DEVKIT_RANK"] == "1":
            sys.exit(3)
        time.sleep(120)
    """))
    check = textwrap.dedent(f"""
        import os, sys
        from devkit.distributed.launch import run
        code = run([sys.executable, {str(script)!r}], 3, grace=2)
        try:
            os.waitpid(-1, os.WNOHANG)
            children = "some"
        except ChildProcessError:
            children = "none"
        sockets = 0
        for fd in os.listdir("/proc/self/fd"):
            try:
                sockets += os.readlink(f"/proc/self/fd/{{fd}}").startswith("socket:")
            except FileNotFoundError:  # the fd listdir itself used
                pass
        print(code, children, sockets)
    """)
    result = subprocess.run([sys.executable, "-c", check], capture_output=True, text=True, timeout=60)
    assert result.stdout.split() == ["3", "none", "0"], result.stderr


def test_a_command_that_cannot_start(tmp_path):
    result = subprocess.run([*LAUNCHER, "-n", "2", "--", str(tmp_path / "no-such-program")],
                            capture_output=True, text=True, timeout=30)
    assert result.returncode == 127
    assert "devkit-run: cannot start rank 0" in result.stderr and "no-such-program" in result.stderr


@pytest.mark.parametrize("arguments,message", [
    (["-n", "2"], "no command given"),
    (["-n", "0", "--", "true"], "-n must be at least 1"),
    (["-n", "2", "--timeout", "0", "--", "true"], "--timeout must be positive"),
])
def test_usage_errors(arguments, message):
    result = subprocess.run([*LAUNCHER, *arguments], capture_output=True, text=True, timeout=30)
    assert result.returncode == 2 and message in result.stderr


# -- the rendezvous store ----------------------------------------------------------------------------


def test_rendezvous_round_trip_between_ranks(tmp_path):
    result = launch(tmp_path, """
        import os
        from devkit.distributed.rendezvous import RendezvousClient
        rank, size = int(os.environ["DEVKIT_RANK"]), int(os.environ["DEVKIT_WORLD_SIZE"])
        store = RendezvousClient(os.environ["DEVKIT_RENDEZVOUS"])
        store.put(f"from.{rank}", f"hello from {rank}".encode())
        print(os.environ["DEVKIT_RENDEZVOUS"])
        print(",".join(store.get(f"from.{peer}", timeout=30).decode() for peer in range(size)))
    """, "-n", "3")
    assert result.returncode == 0, result.stderr
    everyone = "hello from 0,hello from 1,hello from 2"
    for rank in range(3):
        address, greetings = lines_of(result.stdout, rank)
        assert greetings == everyone
    with pytest.raises(ConnectionError, match="cannot reach the rendezvous store"):
        RendezvousClient(address).put("late", b"")  # the launcher closed its port on exit


def test_rendezvous_get_waits_then_times_out():
    with RendezvousServer() as server:
        client = RendezvousClient(server.address)
        started = time.monotonic()
        with pytest.raises(devkit.DeadlineExceededError, match="nobody put 'missing' within 0.3 s"):
            client.get("missing", timeout=0.3)
        assert 0.25 <= time.monotonic() - started < 5
        client.put("binary", bytes(range(256)))
        assert client.get("binary", timeout=1) == bytes(range(256))


def test_rendezvous_address_must_be_host_and_port():
    with pytest.raises(ValueError, match="is not host:port"):
        RendezvousClient("localhost")


# -- the same collective script under devkit-run and mpirun ----------------------------------------

COLLECTIVE_SCRIPT = """
    import sys
    import numpy as np
    import devkit
    from devkit import distributed
    env = distributed.launch_environment()
    with distributed.init("cpu") as comm:
        x = devkit.asarray(np.full(1000, comm.rank + 1, np.float32), comm.device)
        total = comm.all_reduce(x).numpy()
        assert (total == comm.size * (comm.size + 1) / 2).all(), total[:4]
        # One write per line: mpirun forwards whatever each write gives it, unjoined.
        sys.stdout.write(f"launcher={env.launcher} rank={comm.rank} size={comm.size} "
                         f"device={comm.device} sum={total[0]:g}\\n")
        sys.stdout.flush()
"""


def _needs_cpu_collectives():
    assert devkit.load_plugin("cpu").has_collectives, "the cpu plugin lost its collectives"


def test_collective_script_under_devkit_run(tmp_path):
    _needs_cpu_collectives()
    result = launch(tmp_path, COLLECTIVE_SCRIPT, "-n", "2")
    assert result.returncode == 0, result.stderr
    for rank in range(2):
        assert lines_of(result.stdout, rank) == [
            f"launcher=devkit-run rank={rank} size=2 device=cpu:{rank} sum=3"]


def test_a_rank_dying_while_its_peer_waits_in_communicator_init_leaves_no_segment(tmp_path):
    _needs_cpu_collectives()
    result = launch(tmp_path, """
        import glob, os, time
        from devkit import distributed
        if os.environ["DEVKIT_RANK"] == "0":
            distributed.init("cpu")  # waits for rank 1, which never joins
        pattern = f"/dev/shm/devkit-ccl-{os.environ['DEVKIT_JOB_ID']}-*"
        deadline = time.monotonic() + 30
        while not glob.glob(pattern) and time.monotonic() < deadline:
            time.sleep(0.02)
        print(*glob.glob(pattern))
        os._exit(3)
    """, "-n", "2", "--grace", "1", env={"DEVKIT_CCL_TIMEOUT": "60"})
    assert result.returncode == 3, result.stderr
    (segment,) = lines_of(result.stdout, 1)  # rank 0 created it, and was killed waiting
    assert re.fullmatch(r"/dev/shm/devkit-ccl-[0-9a-f]{16}-[0-9a-f]{32}", segment), segment
    assert f"devkit-run: removed the shared memory the ranks left: {segment}" in result.stderr
    assert not os.path.exists(segment)


@pytest.mark.skipif(MPIRUN is None, reason="mpirun not found: apt-get install openmpi-bin libopenmpi-dev "
                                           "(scripts/install-system-deps.sh does)")
def test_collective_script_under_mpirun(tmp_path):
    pytest.importorskip("mpi4py", reason="mpi4py is not installed: pip install 'devkit[mpi]'")
    _needs_cpu_collectives()
    script = tmp_path / "rank_script.py"
    script.write_text(textwrap.dedent(COLLECTIVE_SCRIPT))
    environment = {key: value for key, value in os.environ.items()
                   if not key.startswith("DEVKIT_RENDEZVOUS")}
    result = subprocess.run([MPIRUN, "--allow-run-as-root", "--oversubscribe", "-n", "2",
                             sys.executable, str(script)],
                            capture_output=True, text=True, timeout=120, env=environment)
    assert result.returncode == 0, result.stdout + result.stderr
    lines = sorted(re.findall(r"launcher=.*?sum=\d+", result.stdout))
    assert lines == [f"launcher=Open MPI rank={rank} size=2 device=cpu:{rank} sum=3"
                     for rank in range(2)]
