"""The PaddlePaddle bridge (devkit.paddle, docs/paddle.md) on the plugin under test.

Paddle loads custom devices once, when it is imported, so every case runs in
one worker process per plugin (paddle_worker.py, DEVKIT_PADDLE_PLUGIN set to
the plugin): tensor creation and round trips, views and copies, fills, every
registered phi kernel forward and backward against Paddle's CPU place (the
16-bit ones in float16 and bfloat16 too), an SGD step, a small MLP trained 5
steps with losses matching Paddle CPU (rtol 1e-4), a Linear-BatchNorm1D model
trained 3 steps in float16 (AMP O2) and bfloat16 with SGD and Adam's float32
master weights (losses within 1e-2 and 5e-2 of Paddle CPU's float32),
and how an op without a devkit kernel behaves (Paddle's CPU fallback, or its
NotFound error naming the op) and how a kernel's error reaches Python.
Skipped, with the install command, without paddlepaddle.
"""

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import devkit

from . import paddle_worker as worker

pytestmark = pytest.mark.skipif(importlib.util.find_spec("paddle") is None,
                                reason="PaddlePaddle is not installed: pip install 'devkit[paddle]'")

WORKER_TIMEOUT_S = 300


@pytest.fixture(scope="module")
def paddle_results(plugin):
    """case -> {"ok", "detail"}, from one worker run on the plugin under test."""
    name = plugin.name if plugin.source == "built-in" else plugin.location
    devkit_root = str(Path(devkit.__file__).resolve().parent.parent)
    env = {**os.environ, "DEVKIT_PADDLE_PLUGIN": name,
           "PYTHONPATH": os.pathsep.join(filter(None, [devkit_root, os.environ.get("PYTHONPATH")]))}
    env.pop("CUSTOM_DEVICE_ROOT", None)  # the worker's devkit.paddle sets it to its own build
    done = subprocess.run([sys.executable, worker.__file__], env=env, capture_output=True, text=True,
                          timeout=WORKER_TIMEOUT_S)
    assert done.returncode == 0 and done.stdout.strip(), (
        f"the paddle worker on {name} exited with {done.returncode}:\n{done.stderr[-4000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("case", worker.CASES)
def test_paddle(paddle_results, case):
    result = paddle_results[case]
    assert result["ok"], result["detail"]
