"""devkit-bench paddle: a short run reports every op row and the CNN step (no timing thresholds)."""

from __future__ import annotations

import importlib.util
import json
import os

import pytest

from .conftest import run_python

pytestmark = pytest.mark.skipif(importlib.util.find_spec("paddle") is None,
                                reason="PaddlePaddle is not installed: pip install 'devkit[paddle]'")


def test_a_short_run_reports_each_op_and_the_cnn_step(tmp_path):
    out = tmp_path / "paddle.json"
    os.environ.pop("CUSTOM_DEVICE_ROOT", None)
    done = run_python("from devkit.bench import main\n"
                      f"main(['paddle', '--repeat', '1', '--calls', '2', '--steps', '1', '--json', {str(out)!r}])",
                      env={"GLOG_minloglevel": "2"}, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    results = json.loads(out.read_text())
    assert results["plugin"] == "cpu"
    # Each op's devkit result matched Paddle CPU's before it was timed (the run would have failed).
    assert [row["op"] for row in results["ops"]] == ["add", "multiply", "relu", "exp", "sum", "mean", "matmul",
                                                     "softmax", "layer_norm", "conv2d", "cast"]
    for row in results["ops"] + [results["cnn"]]:
        devkit_time, cpu_time = ((row["devkit_us"], row["paddle_cpu_us"]) if "op" in row else
                                 (row["devkit_ms"], row["paddle_cpu_ms"]))
        assert devkit_time > 0 and cpu_time > 0
        assert row["ratio"] == pytest.approx(devkit_time / cpu_time)
    assert "median ratio per op" in done.stdout and "cnn: devkit.paddle.models.cnn" in done.stdout

