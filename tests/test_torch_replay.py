"""devkit.torch's fast paths on the cpu plugin: eager ops replayed from their
recorded kernel calls, torch.compile graphs run as one plan, and tensors on
devkit:1 (the cpu plugin has two devices)."""

import copy
import gc

import pytest

torch = pytest.importorskip("torch", reason="PyTorch is not installed: pip install 'devkit[torch]'")

import devkit.torch as dt  # noqa: E402
from devkit.torch import _replay, models  # noqa: E402


@pytest.fixture(autouse=True)
def on_cpu_plugin():
    dt.register("cpu")
    yield
    gc.collect()
    dt.collect()


def _template(op, *args, **kwargs):
    return _replay._templates().get(_replay.key_of(op, args, kwargs)[0])


CASES = {
    "add": lambda a, b: torch.add(a, b, alpha=2), "mul_scalar": lambda a, b: a * 3.0, "exp": lambda a, b: a.exp(),
    "log1p": lambda a, b: a.abs().log1p(), "sum": lambda a, b: a.sum(1), "mm": lambda a, b: a @ b.t(),
    "where": lambda a, b: torch.where(a > b, a, b), "transpose": lambda a, b: a.t() + 1, "softmax": lambda a, b: a.softmax(-1),
    "slice": lambda a, b: a[:, 1:3] * b[:, :2], "cat": lambda a, b: torch.cat([a, b], 1),
}


@pytest.mark.parametrize("name", CASES)
def test_replayed_ops_match_torch_cpu_on_new_values(name):
    op = CASES[name]
    torch.manual_seed(0)
    for _ in range(3):  # the first call records, the next ones replay on other values
        a, b = torch.randn(4, 5), torch.randn(4, 5)
        got = op(a.to("devkit"), b.to("devkit"))
        torch.testing.assert_close(got.cpu(), op(a, b), rtol=1.3e-6, atol=1e-5)


def test_ops_are_recorded_once_and_replayed():
    a, b = torch.randn(6).to("devkit"), torch.randn(6).to("devkit")
    torch.add(a, b)
    template = _template(torch.ops.aten.add.Tensor, a, b)
    assert isinstance(template, _replay._Template)
    assert torch.equal(torch.add(a, b).cpu(), a.cpu() + b.cpu())
    assert _template(torch.ops.aten.add.Tensor, a, b) is template


def test_inplace_replay_writes_the_destination_and_keeps_views():
    x = torch.zeros(2, 3).to("devkit")
    row = x[1]
    for step in range(1, 4):
        x.add_(torch.ones(2, 3).to("devkit"))
        assert torch.equal(row.cpu(), torch.full((3,), float(step)))
    x.add_(x)  # the same tensor twice: the result is computed before it is written
    assert torch.equal(x.cpu(), torch.full((2, 3), 6.0))


def test_ops_with_host_effects_are_not_replayed():
    x = torch.empty(4).to("devkit")
    for value in (1.0, 0.0, 2.5):  # fill_ with 0 is a memset, the others a kernel
        x.fill_(value)
        assert torch.equal(x.cpu(), torch.full((4,), value))
    assert _template(torch.ops.aten.fill_.Scalar, x, 0.0) is _replay._NOT_REPLAYABLE
    torch.manual_seed(1)
    first = torch.randn(4, device="devkit").cpu()
    torch.manual_seed(2)
    assert not torch.equal(torch.randn(4, device="devkit").cpu(), first)


def test_autograd_through_replayed_ops():
    torch.manual_seed(0)
    w = torch.randn(3, 3)
    for _ in range(2):
        x = torch.randn(5, 3)
        wd = w.clone().to("devkit").requires_grad_()
        (x.to("devkit") @ wd).relu().sum().backward()
        wc = w.clone().requires_grad_()
        (x @ wc).relu().sum().backward()
        torch.testing.assert_close(wd.grad.cpu(), wc.grad)


def _compiled_block():
    runners = []
    torch.manual_seed(0)
    block = models.gpt_block(32, 4).eval()

    def backend(graph_module, example_inputs):
        from devkit.torch import _compile
        from torch._dynamo.backends.common import aot_autograd
        from torch._decomp import core_aten_decompositions

        def keep(gm, inputs):
            runner = _compile.compile_graph(gm, inputs)
            runners.append(runner)
            return runner
        return aot_autograd(fw_compiler=keep, decompositions=core_aten_decompositions())(graph_module, example_inputs)
    return block, torch.compile(copy.deepcopy(block).to("devkit"), backend=backend), runners


def test_compiled_graph_runs_as_one_plan_on_new_inputs():
    from devkit.torch import _graph

    block, compiled, runners = _compiled_block()
    with torch.no_grad():
        for _ in range(3):  # the first run records the plan; the next ones run it
            x = torch.randn(2, 8, 32)
            torch.testing.assert_close(compiled(x.to("devkit")).cpu(), block(x), rtol=1e-5, atol=1e-5)
    plans = [plan for runner in runners for plan in runner.plans.values()]
    assert plans and all(isinstance(plan, _graph.GraphPlan) for plan in plans)
    assert plans[0].memory.arena_bytes < plans[0].memory.total_bytes  # intermediates share the arena
    torch._dynamo.reset()


def test_tensors_on_the_second_device_and_between_devices():
    a = torch.randn(4, 3)
    x = a.to("devkit:1")
    assert x.device == torch.device("devkit", 1)
    y = (x * 2 + 1).t()
    assert y.device == torch.device("devkit", 1)
    torch.testing.assert_close(y.cpu(), (a * 2 + 1).t())
    z = y.to("devkit:0")  # a strided view moves as its values
    assert z.device == torch.device("devkit", 0)
    torch.testing.assert_close(z.cpu(), (a * 2 + 1).t())
    assert torch.randn(2, device="devkit:1").device == torch.device("devkit", 1)
    assert torch.devkit.device_count() == 2
    with torch.no_grad():
        model = torch.nn.Linear(3, 2).to("devkit:1")
        assert model(x).device == torch.device("devkit", 1)


def test_mixing_devices_and_missing_devices_raise_as_torch_does():
    x, y = torch.ones(2, device="devkit:0"), torch.ones(2, device="devkit:1")
    with pytest.raises(RuntimeError, match=r"Expected all tensors to be on the same device, but found at least "
                                           r"two devices, devkit:0 and devkit:1! \(aten::add.Tensor\)"):
        x + y
    with pytest.raises(RuntimeError, match=r"devkit:5 does not exist: plugin 'cpu' has 2 devices"):
        torch.ones(2, device="devkit:5")
