"""The cpu plugin's thread pool (the support library's threads.c) and what runs on it.

The pool is driven alone by tests/native/pool_driver.c (built here with
threads.c): every index covered once, chunks of at least the grain, small
work and nested calls on the calling thread, each member's own share of
a job's chunks first (the same share in every job), concurrent callers, a
worker spinning on the caller's CPU moved off it for the job, a forked
child's own pool, workers joined at shutdown, idle workers asleep once their
spin (DEVKIT_CPU_SPIN_US) is over, with and without one. Through the plugin: the
thread budget is DEVKIT_CPU_THREADS, OpenBLAS stays on one thread and
starts no thread of its own when the plugin loads, and elementwise results
are the same bits on 1 and on 2 threads.
"""

import os
import subprocess
import textwrap
from pathlib import Path

import numpy as np
import pytest

from devkit.abi import include_dir, support_dir
from tests.conftest import run_python

DRIVER = Path(__file__).parent / "native" / "pool_driver.c"
CHECKS = ["every_index_once", "small_work_on_caller", "chunks_per_budget", "workers_started",
          "idle_workers_sleep", "home_shares", "nested_runs_serially", "concurrent_callers", "spinning_worker_moved_off_caller_cpu", "fork_child_pool", "shutdown_joins_workers",
          "restart_after_shutdown"]


@pytest.fixture(scope="module")
def pool_driver(tmp_path_factory):
    out = tmp_path_factory.mktemp("pool") / "pool_driver"
    subprocess.run([os.environ.get("CC", "cc"), "-std=c11", "-O2", "-Wall", "-Wextra", "-Werror", "-pthread",
                    f"-I{include_dir()}", f"-I{support_dir()}", str(DRIVER), str(Path(support_dir()) / "threads.c"),
                    "-o", str(out)],
                   check=True, capture_output=True, text=True)
    return out


@pytest.mark.parametrize("threads, spin_us", [(1, 50), (2, 50), (2, 0), (3, 50), (8, 50), (8, 0)])
def test_pool_contract(pool_driver, threads, spin_us):
    result = subprocess.run([str(pool_driver), str(threads), str(spin_us)], capture_output=True, text=True,
                            timeout=120)
    assert result.stdout.splitlines() == [f"{check} ok" for check in CHECKS], result.stdout + result.stderr
    assert result.returncode == 0


def run(code: str, **env) -> list[str]:
    result = run_python(textwrap.dedent(code), env={k: str(v) for k, v in env.items()})
    assert result.returncode == 0, result.stderr
    return result.stdout.splitlines()


THREAD_COUNT = """
    import ctypes, os, numpy as np, devkit, scipy_openblas32
    dev = devkit.device("cpu:0")
    one = devkit.asarray(np.ones(1, np.float32), dev)
    devkit.run_op("Add", [one, one])  # starts the stream's worker, splits nothing
    before = len(os.listdir("/proc/self/task"))
    x = devkit.asarray(np.ones(1 << 20, np.float32), dev)  # a 4 MiB copy: split over the pool too
    devkit.run_op("Add", [x, x])
    devkit.run_op("MatMul", [devkit.asarray(np.ones((512, 512), np.float32), dev)] * 2)
    blas = ctypes.CDLL(os.path.join(scipy_openblas32.get_lib_dir(), "libscipy_openblas.so"))
    print(len(os.listdir("/proc/self/task")) - before, blas.scipy_openblas_get_num_threads())
"""


def test_thread_budget_is_devkit_cpu_threads_and_blas_stays_on_one():
    # The pool adds THREADS - 1 workers (the stream worker is the last); OpenBLAS starts none.
    assert run(THREAD_COUNT, DEVKIT_CPU_THREADS=1) == ["0 1"]
    assert run(THREAD_COUNT, DEVKIT_CPU_THREADS=3) == ["2 1"]
    default = len(os.sched_getaffinity(0))
    assert run(THREAD_COUNT, DEVKIT_CPU_THREADS="") == [f"{min(default, 256) - 1} 1"]



LOAD_IDLE = """
    import os, time, devkit
    before = len(os.listdir("/proc/self/task"))
    devkit.device("cpu:0")
    started = len(os.listdir("/proc/self/task")) - before
    cpu = time.process_time()
    time.sleep(0.3)
    print(started, os.environ.get("OPENBLAS_NUM_THREADS"), time.process_time() - cpu < 0.03)
"""


def test_loading_the_plugin_starts_no_blas_thread_and_leaves_the_machine_idle():
    # OpenBLAS sizes its pool from OPENBLAS_NUM_THREADS when it loads, and
    # each of its threads busy-waits about 0.1 s: loaded with the plugin, it
    # must start none (here the user asked for 3), leave the variable as it
    # was, and nothing may spin once the plugin is loaded.
    assert run(LOAD_IDLE, OPENBLAS_NUM_THREADS=3) == ["0 3 True"]

ELEMENTWISE = """
    import numpy as np, devkit
    dev = devkit.device("cpu:0")
    rng = np.random.default_rng(0)
    a = (rng.standard_normal((301, 1000)) * 8).astype(np.float32)
    b = rng.standard_normal(1000).astype(np.float32)
    a[0, :8] = [np.inf, -np.inf, np.nan, -0.0, 0.0, 1e-40, 88.8, -104.0]
    da, db = devkit.asarray(a, dev), devkit.asarray(b, dev)
    strided = devkit.asarray(np.ascontiguousarray(a.T), dev).T  # a transposed view: the strided loops
    results = {}
    for op, inputs, attrs in [("Add", [da, db], {}), ("Mul", [da, da], {}), ("Div", [db, da], {}),
                              ("Max", [da, db], {}), ("Exp", [da], {}), ("Log", [da], {}),
                              ("Tanh", [da], {}), ("Sigmoid", [da], {}), ("Erf", [da], {}),
                              ("Gelu", [da], {}), ("Gelu", [da], {"approximate": "tanh"}),
                              ("Relu", [strided], {}), ("Exp", [strided], {}), ("Sub", [strided, db], {})]:
        results[f"{op}{attrs}{len(results)}"] = devkit.run_op(op, inputs, attrs)[0].numpy()
    np.savez(OUT, **results)
"""


def test_elementwise_results_are_the_same_bits_on_one_and_two_threads(tmp_path):
    outputs = {}
    for threads in (1, 2):
        path = tmp_path / f"t{threads}.npz"
        code = f"OUT = {str(path)!r}\n" + textwrap.dedent(ELEMENTWISE)
        run(code, DEVKIT_CPU_THREADS=threads)
        outputs[threads] = np.load(path)
    assert list(outputs[1]) == list(outputs[2]) and len(outputs[1]) == 14
    for name in outputs[1]:
        one, two = outputs[1][name], outputs[2][name]
        assert one.shape == two.shape == (301, 1000) or one.shape == two.shape == (1000, 301), name
        assert one.tobytes() == two.tobytes(), name
