"""devkit-bench engine: one quick run, and the rows it reports."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from devkit import onnx as donnx
from devkit.bench import engine


def test_the_chain_model_is_the_ops_it_names():
    model, inputs = engine.chain_model(7, width=4)
    assert [node.op_type for node in model.graph.node] == [*engine.CHAIN_OPS, engine.CHAIN_OPS[0]]
    x = inputs["x"].astype(np.float64)
    want = np.abs(-(1 / (1 + np.exp(-np.maximum((x + 0.5) * 0.5, 0))))) + 0.5
    np.testing.assert_allclose(donnx.prepare(model).run(inputs)[0], want, rtol=1e-6)


def test_a_quick_run_reports_every_row(tmp_path):
    out = tmp_path / "engine.json"
    result = subprocess.run([sys.executable, "-m", "devkit.bench", "engine", "--quick", "--repeat", "2",
                             "--json", str(out)], capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout + result.stderr
    rows = json.loads(out.read_text())
    assert [row["benchmark"] for row in rows] == ["eager Add 1 element", "chain of 20 elementwise ops",
                                                   "model mlp", "model resnet"]
    eager, chain, *models = rows
    peers = ["numpy"] + (["torch"] if importlib.util.find_spec("torch") else [])
    for name in ["devkit", *peers]:
        assert eager[f"{name}_us"] > 0
    for name in peers:
        assert eager[f"devkit_over_{name}"] == pytest.approx(eager["devkit_us"] / eager[f"{name}_us"])
    assert chain["nodes"] == 20
    assert chain["plan_us_per_node"] == pytest.approx(chain["plan_ms"] * 1e3 / 20)
    for row in [chain, *models]:
        assert row["plugin"] == "cpu" and row["plan_equals_interpreter"] is True
        # The run split: its device work alone, timed in the same interleaving, and the rest.
        assert row["kernel_ms"] > 0 and row["host_ms"] == pytest.approx(row["plan_ms"] - row["kernel_ms"])
        assert row["plan_host_us_per_node"] > 0 and row["plan_host_cpu_us_per_node"] >= 0
        assert row["max_abs_diff_vs_onnxruntime"] < 1e-4
        best = min(row["onnxruntime_1t_ms"], row["onnxruntime_2t_ms"])
        assert row["plan_over_onnxruntime"] == pytest.approx(row["plan_ms"] / best)
    for row in models:
        assert row["kernel_calls"] > 0 and 0 < row["arena_bytes"] < row["intermediate_bytes"]
    assert "chain of 20 elementwise ops: nodes 20, plugin cpu" in result.stdout


def test_the_eager_row_says_torch_is_absent_without_it(tmp_path):
    blocker = tmp_path / "torch"  # shadows the real torch: importing it fails as if it were not installed
    blocker.mkdir()
    (blocker / "__init__.py").write_text("raise ImportError('torch blocked for this test')\n")
    out = tmp_path / "engine.json"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")])}
    result = subprocess.run([sys.executable, "-m", "devkit.bench", "engine", "--only", "eager", "--quick",
                             "--repeat", "2", "--json", str(out)], capture_output=True, text=True, timeout=300, env=env)
    assert result.returncode == 0, result.stdout + result.stderr
    (eager,) = json.loads(out.read_text())
    assert "torch_us" not in eager and eager["torch"].startswith("not installed")
    assert eager["devkit_over_numpy"] == pytest.approx(eager["devkit_us"] / eager["numpy_us"])


def test_the_host_cost_row_splits_a_staged_run_into_its_stages():
    from devkit.onnx import zoo

    model, inputs = zoo.mlp()
    row = engine.host_cost_row(model, inputs, "cpu", repeat=2, calls=3)
    assert row["plugin"] == "cpu" and row["kernel_calls"] == 7
    assert row["host_us"] == pytest.approx(row["run_us"] - row["kernels_us"])
    for stage in engine.HOST_COST_STAGES:
        assert isinstance(row[f"{stage}_us"], float)
    # Measured on their own: work done on the host, never nothing.
    for stage in ("input_copies", "kernels", "output_wrapping"):
        assert row[f"{stage}_us"] > 0


def test_the_host_cost_split_refuses_a_run_that_is_not_staged(monkeypatch):
    from devkit.onnx import zoo

    import devkit

    monkeypatch.setattr(type(devkit.load_plugin("cpu")), "has_graphs", property(lambda plugin: False))
    model, inputs = zoo.mlp()
    with pytest.raises(SystemExit, match="the host-cost split needs a staged run; cpu's plan of this model "
                                         "runs through HostReplay"):
        engine.host_cost_row(model, inputs, "cpu", repeat=1, calls=1)
