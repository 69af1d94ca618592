"""devkit-bench collectives: nccl-tests' size and bandwidth formulas, and a short run."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys

import pytest

import devkit
from devkit.bench import collectives as bench


@pytest.mark.parametrize("collective,factor", [
    ("all_reduce", 2 * 3 / 4), ("reduce_scatter", 3 / 4), ("all_gather", 3 / 4),
    ("all_to_all", 3 / 4), ("broadcast", 1.0), ("reduce", 1.0)])
def test_bus_factor_is_nccl_tests(collective, factor):
    assert bench.bus_factor(collective, 4) == pytest.approx(factor)


def test_sizes_follow_nccl_tests():
    # The reduced buffer for AllReduce; count x ranks for the gathered / scattered collectives.
    assert bench.counts_for("all_reduce", 1 << 20, 4, 4) == (1 << 18, 1 << 20)
    assert bench.counts_for("all_gather", 1 << 20, 4, 4) == (1 << 16, 1 << 20)
    assert bench.counts_for("reduce_scatter", 1000, 4, 3) == (83, 996)
    assert bench.sizes_between(1 << 10, 64 << 20) == [1 << s for s in range(10, 27, 2)]
    assert [bench.parse_bytes(t) for t in ("1K", "64MiB", "4096", "2g")] == [1024, 64 << 20, 4096, 2 << 30]


def test_bandwidths_are_bytes_over_time_in_decimal_gigabytes():
    row = bench._bandwidths({"time_s": 0.002, "wrong": 0, "iterations": 5}, 4_000_000, 1.5)
    assert row["algbw_GBps"] == pytest.approx(2.0) and row["busbw_GBps"] == pytest.approx(3.0)
    assert row["time_us"] == pytest.approx(2000)


def _run_bench(tmp_path, *extra):
    out = tmp_path / "bench.json"
    result = subprocess.run(
        [sys.executable, "-m", "devkit.bench", "collectives", "-n", "2", "--min-bytes", "4K",
         "--max-bytes", "16K", "--seconds", "0.01", "--json", str(out), *extra],
        capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout, json.loads(out.read_text())


def _needs_cpu_collectives():
    assert devkit.load_plugin("cpu").has_collectives, "the cpu plugin lost its collectives"


def test_a_short_run_reports_every_collective_with_no_wrong_element(tmp_path):
    _needs_cpu_collectives()
    stdout, results = _run_bench(tmp_path, "--peer", "none")
    rows = results["rows"]
    assert [(r["collective"], r["size"]) for r in rows] == [
        (c, s) for c in bench.COLLECTIVES for s in (4096, 16384)]
    for row in rows:
        factor = bench.bus_factor(row["collective"], 2)
        for place in ("out_of_place", "in_place"):
            measured = row[place]
            assert measured["wrong"] == 0, row
            assert measured["busbw_GBps"] == pytest.approx(measured["algbw_GBps"] * factor)
            assert measured["algbw_GBps"] == pytest.approx(
                row["bytes"] / measured["time_us"] / 1e3)
        assert "gloo" not in row
    assert "peer: none" in stdout and stdout.count("\nall_reduce ") == 2


@pytest.mark.skipif(importlib.util.find_spec("torch") is None,
                    reason="torch is not installed: pip install torch==2.13.0 (the CPU build)")
def test_gloo_is_measured_as_the_peer(tmp_path):
    _needs_cpu_collectives()
    stdout, results = _run_bench(tmp_path, "--collectives", "all_reduce,all_to_all")
    assert "gloo" in results["config"]["peer"]
    for row in results["rows"]:
        for place in ("out_of_place", "in_place"):
            assert row["gloo"][place]["wrong"] == 0, row
            assert row["ratio"][place] == pytest.approx(
                row[place]["busbw_GBps"] / row["gloo"][place]["busbw_GBps"])
    assert "devkit/gloo" in stdout


def test_without_torch_it_says_how_to_install_it(tmp_path):
    _needs_cpu_collectives()
    hide_torch = ("import sys; sys.modules['torch'] = None; from devkit.bench import main; "
                  "main(['collectives', '--collectives', 'broadcast', '--min-bytes', '1K', "
                  "'--max-bytes', '1K', '--seconds', '0.01'])")
    result = subprocess.run([sys.executable, "-c", hide_torch], capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 0, result.stderr
    assert "torch is not installed" in result.stderr and "pip install torch==2.13.0" in result.stderr
    assert "peer: none" in result.stdout and "\nbroadcast " in result.stdout


def test_opencl_bench_without_pyopencl_says_what_to_install():
    hide_pyopencl = "import sys; sys.modules['pyopencl'] = None; from devkit.bench import main; main(['opencl'])"
    result = subprocess.run([sys.executable, "-c", hide_pyopencl], capture_output=True, text=True, timeout=120)
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr == ("devkit-bench opencl: pyopencl is not installed: pip install 'devkit[opencl]', and an "
                             "OpenCL driver (scripts/install-opencl.sh installs PoCL and pyopencl)\n")


def test_cuda_bench_without_a_gpu_skips_with_the_plugins_reason(tmp_path):
    (cuda,) = [d for d in devkit.list_plugins() if d.name == "cuda"]
    if cuda.loads:
        pytest.skip("this machine has a usable CUDA device: the bench runs (ci/gpu-check.sh)")
    out = tmp_path / "cuda.json"
    result = subprocess.run([sys.executable, "-m", "devkit.bench", "cuda", "--json", str(out)],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0 and result.stdout == ""
    assert result.stderr == f"devkit-bench cuda: skipped: {cuda.error}\n"
    assert json.loads(out.read_text()) == {"skipped": cuda.error}


def test_opencl_bench_names_the_missing_piece_of_a_peer():
    pytest.importorskip("pyopencl", reason="pyopencl is not installed (scripts/install-opencl.sh)")
    probe = ("import sys; sys.modules['mako'] = None; sys.modules['pyclblast'] = None\n"
             "from devkit.bench import opencl\n"
             "print(opencl._pyopencl_sum(None, None), opencl._clblast_gemm(None, None, None))")
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout == "(None, 'Mako') (None, 'pyclblast')\n"


def test_a_piped_table_keeps_every_header_whole():
    row = {"benchmark": "a rather long benchmark name " * 3, "devkit_ms": 1.0, "numpy_ms": 2.0,
           "numpy_over_devkit": 2.0, "onnxruntime_ms": None, "onnxruntime_over_devkit": None,
           "devkit_cores": 2, "numpy_cores": 1, "onnxruntime_cores": None, "max_abs_diff_vs_numpy": 0.0}
    memory_bound = {**row, "benchmark": "Add", "devkit_GBps": 6.0, "numpy_GBps": 3.0, "copy_GBps": 8.0}
    code = f"from devkit.bench.ops import print_rows; print_rows([{row!r}, {memory_bound!r}])"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                            env={k: v for k, v in os.environ.items() if k != "COLUMNS"})
    assert result.returncode == 0, result.stderr
    for header in ("devkit ms", "NumPy ms", "NumPy/devkit", "onnxruntime ms", "ORT/devkit", "max |diff|",
                   "cores devkit/NumPy/ORT", "devkit GB/s (of copy)", "NumPy copy: 8.0 GB/s", "2/1/-",
                   "6.0 (75%)", row["benchmark"].strip(),
                   "ratio = peer time / devkit time, >1 means devkit is faster"):
        assert header in result.stdout
    assert "…" not in result.stdout


def test_the_ops_bench_stops_numpys_blas_threads_spinning(tmp_path):
    out = tmp_path / "ops.json"
    env = {key: value for key, value in os.environ.items() if key != "OPENBLAS_THREAD_TIMEOUT"}
    result = subprocess.run([sys.executable, "-m", "devkit.bench", "ops", "--only", "Relu", "--repeat", "1",
                             "--json", str(out)], capture_output=True, text=True, timeout=300, env=env)
    assert result.returncode == 0, result.stdout + result.stderr
    (row,) = json.loads(out.read_text())
    assert row["benchmark"] == "Relu 16Mi f32" and row["numpy_openblas_thread_timeout"] == "4"
