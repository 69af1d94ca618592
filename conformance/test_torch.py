"""The torch bridge on the plugin under test (devkit.torch): PyTorch's OpInfo
samples against torch on the CPU, and three torch.nn models trained as torch
on the CPU trains them. Skipped, with the install command, without PyTorch."""

import gc

import pytest

torch = pytest.importorskip("torch", reason="PyTorch is not installed: pip install 'devkit[torch]'")
pytest.importorskip("expecttest", reason="OpInfo needs expecttest: pip install 'devkit[torch]'")

import devkit.torch as dt  # noqa: E402
from devkit.torch import models, opinfo  # noqa: E402

# The OpInfo target: at least this share of the float32 samples devkit runs match torch CPU.
OPINFO_PASS_RATE = 0.95
OPINFO_SAMPLES_PER_OP = 1  # and the in-place and out= forms: CI runs on 2 cores
LOSS_RTOL = 1e-4


@pytest.fixture
def devkit_torch(plugin):
    dt.register(plugin)
    yield plugin
    gc.collect()
    dt.collect()


def test_opinfo_samples_match_torch_cpu(devkit_torch, record_property):
    results = opinfo.sweep(OPINFO_SAMPLES_PER_OP)
    summary = opinfo.summary(results)
    for key in ("samples", "supported", "passed", "pass_rate", "ops_passing"):
        record_property(f"opinfo_{key}", summary[key])
    failures = "\n".join(f"{r.op} [{r.variant} {r.index}]: {r.detail}" for r in summary["failures"])
    assert summary["pass_rate"] >= OPINFO_PASS_RATE, (
        f"{summary['passed']} of {summary['supported']} OpInfo samples pass ({summary['pass_rate']:.1%}):\n"
        f"{failures}")
    assert summary["ops_passing"] >= 150


@pytest.mark.parametrize("task", models.TASKS, ids=[t.name for t in models.TASKS])
def test_model_trains_as_torch_cpu(devkit_torch, task):
    expected = models.train(task, "cpu")
    got = models.train(task, dt.DEVICE_TYPE)
    assert got == pytest.approx(expected, rel=LOSS_RTOL)


def test_compiled_gpt_block_matches_eager(devkit_torch):
    torch.manual_seed(0)
    block = models.gpt_block(32, 4)
    x = torch.randn(2, 8, 32)
    other = torch.randn(2, 8, 32)
    expected, expected_other = block(x), block(other)
    compiled = torch.compile(block.to(dt.DEVICE_TYPE), backend="devkit")
    for _ in range(2):  # the first run records the graph's plan, the second runs it
        torch.testing.assert_close(compiled(x.to(dt.DEVICE_TYPE)).cpu(), expected, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(compiled(other.to(dt.DEVICE_TYPE)).cpu(), expected_other, rtol=1e-5, atol=1e-5)
    torch._dynamo.reset()


def test_every_device_of_the_plugin(devkit_torch):
    count = torch.devkit.device_count()
    if count < 2:
        pytest.skip(f"plugin '{devkit_torch}' has one device")
    last = f"{dt.DEVICE_TYPE}:{count - 1}"
    a = torch.randn(4, 3)
    x = a.to(last)
    y = (x * 2 + 1).t()
    assert y.device == torch.device(last)
    torch.testing.assert_close(y.to(f"{dt.DEVICE_TYPE}:0").cpu(), (a * 2 + 1).t())
    with pytest.raises(RuntimeError, match="Expected all tensors to be on the same device"):
        y + torch.ones(3, 4, device=f"{dt.DEVICE_TYPE}:0")
