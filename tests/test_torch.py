"""devkit.torch on the cpu plugin: the device, views, in-place and out= forms,
dtype promotion, errors and the CPU fallback, DLPack, memory and torch.compile;
eager ops replayed from their recorded kernel calls, compiled graphs run as one
plan, and tensors on devkit:1 (the cpu plugin has two devices).
The same bridge on every plugin (OpInfo samples, training) is conformance/test_torch.py."""

import copy
import gc

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="PyTorch is not installed: pip install 'devkit[torch]'")

import devkit  # noqa: E402
import devkit.torch as dt  # noqa: E402
from devkit.torch import _replay, models  # noqa: E402


@pytest.fixture(autouse=True)
def on_cpu_plugin():
    dt.register("cpu")
    yield
    gc.collect()
    dt.collect()


def test_factories_transfers_and_printing():
    torch.manual_seed(0)
    x = torch.randn(3, 4, device="devkit:0")
    torch.manual_seed(0)
    expected = torch.randn(3, 4)  # random numbers come from torch's CPU generator
    assert x.device == torch.device("devkit", 0)
    assert torch.equal(x.cpu(), expected)
    assert torch.equal(expected.to("devkit").cpu(), expected)
    assert repr(x) == repr(expected)[:-1] + ", device='devkit:0')"
    assert torch.equal(torch.arange(5, device="devkit").cpu(), torch.arange(5))
    assert torch.equal(torch.full((2, 2), 7.0, device="devkit").cpu(), torch.full((2, 2), 7.0))


def test_module_to_devkit_moves_parameters():
    model = torch.nn.Linear(4, 3)
    moved = torch.nn.Linear(4, 3)
    moved.load_state_dict(model.state_dict())
    moved.to("devkit")
    assert moved.weight.device.type == "devkit"
    x = torch.randn(2, 4)
    torch.testing.assert_close(moved(x.to("devkit")).cpu(), model(x), rtol=1e-6, atol=1e-6)


def test_views_share_the_devkit_buffer_and_write_through():
    base = torch.arange(12, dtype=torch.float32).reshape(3, 4).to("devkit")
    view = base.t()[1:, ::2]
    array = dt.to_array(view)
    assert array.buffer._allocation is dt.to_array(base).buffer._allocation
    assert view.stride() == (1, 8) and array.strides == (1, 8)
    view.mul_(-1)  # in place through a strided view
    expected = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    expected.t()[1:, ::2].mul_(-1)
    assert torch.equal(base.cpu(), expected)


def test_inplace_and_out_variants():
    a = torch.tensor([1.0, 2.0, 3.0]).to("devkit")
    b = torch.tensor([0.5, 0.5, 0.5]).to("devkit")
    out = torch.empty(0, device="devkit")
    torch.add(a, b, alpha=2, out=out)
    assert out.shape == (3,) and torch.equal(out.cpu(), torch.tensor([2.0, 3.0, 4.0]))
    a.sub_(b).div_(2)
    assert torch.equal(a.cpu(), torch.tensor([0.25, 0.75, 1.25]))


@pytest.mark.parametrize("expression", [
    lambda x, i: x + i, lambda x, i: i / 2, lambda x, i: i * 2.5, lambda x, i: i > x, lambda x, i: i // 2,
    lambda x, i: x.to(torch.float64) + 1, lambda x, i: torch.where(i > 1, i, x),
])
def test_dtype_promotion_matches_torch(expression):
    x = torch.tensor([0.5, 1.5, -2.0])
    i = torch.tensor([1, 2, 3])
    expected = expression(x, i)
    got = expression(x.to("devkit"), i.to("devkit"))
    assert got.dtype == expected.dtype
    assert torch.equal(got.cpu(), expected)


def test_unsupported_op_raises_naming_it_and_falls_back_when_allowed():
    x = torch.tensor([0.5, 1.5, 2.5]).to("devkit")
    with pytest.raises(dt.Unsupported, match=r"aten::lgamma\.out has no devkit lowering \(plugin 'cpu'\)"):
        torch.lgamma(x)
    devkit.fallback_report(reset=True)
    with devkit.ops.cpu_fallback():
        got = torch.lgamma(x)
    assert got.device.type == "devkit"
    torch.testing.assert_close(got.cpu(), torch.lgamma(x.cpu()))
    assert devkit.fallback_report(reset=True) == [
        {"plugin": "cpu", "op": "aten::lgamma.out", "dtype": "float32", "count": 1}]


def test_unsupported_dtype_is_named():
    with pytest.raises(dt.Unsupported, match="no dtype torch.complex64"):
        torch.zeros(2, dtype=torch.complex64, device="devkit")


def test_count_fallback_adds_to_the_same_report():
    devkit.fallback_report(reset=True)
    devkit.ops.resolution.count_fallback("cpu", "aten::example", np.dtype("float32"))
    devkit.ops.resolution.count_fallback("cpu", "aten::example", np.dtype("float32"))
    assert devkit.fallback_report(reset=True) == [
        {"plugin": "cpu", "op": "aten::example", "dtype": "float32", "count": 2}]


def test_dlpack_and_arrays_share_memory():
    x = torch.arange(6, dtype=torch.float32).to("devkit")
    host = torch.from_dlpack(dt.to_array(x))  # the cpu plugin's memory is host-addressable
    assert torch.equal(host, torch.arange(6, dtype=torch.float32))
    x.add_(1)
    assert torch.equal(host, torch.arange(1, 7, dtype=torch.float32))
    array = devkit.asarray(np.array([[1, 2], [3, 4]], np.int32), "cpu:0")
    t = dt.from_array(array)
    assert t.dtype == torch.int32 and torch.equal(t.cpu(), torch.tensor([[1, 2], [3, 4]], dtype=torch.int32))


def test_memory_returns_to_baseline():
    dev = dt.registered_device()
    gc.collect()
    dt.collect()
    devkit.empty_cache(dev)  # the caching allocator keeps freed blocks: compare what the plugin holds
    before = dev.mem_get_info()[0], devkit.memory_stats(dev)["allocated_bytes"]
    x = torch.randn(256, 256, device="devkit", requires_grad=True)
    (x.t() @ x).relu().sum().backward()
    del x
    gc.collect()
    assert dt.collect() > 0
    assert devkit.memory_stats(dev)["allocated_bytes"] == before[1]
    devkit.empty_cache(dev)
    assert dev.mem_get_info()[0] == before[0]


def test_autograd_and_optimizer_step_on_the_device():
    torch.manual_seed(0)
    reference = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
    model.load_state_dict(reference.state_dict())
    model.to("devkit")
    x, y = torch.randn(4, 8), torch.randn(4, 1)
    for net, device in ((reference, "cpu"), (model, "devkit")):
        optimizer = torch.optim.AdamW(net.parameters(), lr=0.01)
        torch.nn.functional.mse_loss(net(x.to(device)), y.to(device)).backward()
        optimizer.step()
    assert model[0].weight.grad.device.type == "devkit"
    for got, expected in zip(model.parameters(), reference.parameters()):
        torch.testing.assert_close(got.cpu(), expected, rtol=1e-5, atol=1e-6)


def test_torch_compile_backend_matches_eager_forward_and_backward():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.LayerNorm(32))
    x = torch.randn(4, 16)
    expected = model(x)
    expected.square().sum().backward()
    expected_grad = model[0].weight.grad.clone()
    model.zero_grad()
    model.to("devkit")
    compiled = torch.compile(model, backend="devkit")
    got = compiled(x.to("devkit"))
    got.square().sum().backward()
    torch.testing.assert_close(got.cpu(), expected, rtol=1e-5, atol=1e-5)
    # the compiled backward is torch's decomposition of layer_norm's: its sums round differently
    torch.testing.assert_close(model[0].weight.grad.cpu(), expected_grad, rtol=1e-4, atol=1e-4)


def test_supported_ops_cover_the_target():
    packets = {op.overloadpacket for op in dt.supported_ops()}
    assert len(packets) >= 150
    assert torch.ops.aten.convolution_backward.default in dt.supported_ops()


def _template(op, *args, **kwargs):
    return _replay._templates().get(_replay.key_of(op, args, kwargs)[0])


CASES = {
    "add": lambda a, b: torch.add(a, b, alpha=2), "mul_scalar": lambda a, b: a * 3.0, "exp": lambda a, b: a.exp(),
    "log1p": lambda a, b: a.abs().log1p(), "sum": lambda a, b: a.sum(1), "mm": lambda a, b: a @ b.t(),
    "where": lambda a, b: torch.where(a > b, a, b), "transpose": lambda a, b: a.t() + 1,
    "softmax": lambda a, b: a.softmax(-1),
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


def test_native_tensors_are_built_and_check_their_arguments():
    from devkit.torch import _memory, _native

    if _native.module() is None:  # the Python path is tested on its own below
        pytest.skip(f"devkit.torch's native module was not built here: {_native.reason()}")
    x = torch.arange(12.0).to("devkit")
    storage = x.untyped_storage()
    view = _memory.view(x, (3, 2), (1, 3), 4)
    assert view.untyped_storage().data_ptr() == storage.data_ptr()  # the same storage: a view
    assert (view.shape, view.stride(), view.storage_offset(), view.device) == ((3, 2), (1, 3), 4, x.device)
    assert torch.equal(view.cpu(), torch.arange(12.0).as_strided((3, 2), (1, 3), 4))
    tensor = _native.module().tensor
    with pytest.raises(TypeError, match=r"tensor\(storage: torch.UntypedStorage, dtype: torch.dtype"):
        tensor(storage, "float32", (2,), (1,), 0)
    with pytest.raises(ValueError, match="shape has 2 dimensions, strides 1"):
        tensor(storage, torch.float32, (2, 1), (1,), 0)
    with pytest.raises(ValueError, match="storage is not on a devkit device"):
        tensor(torch.zeros(2).untyped_storage(), torch.float32, (2,), (1,), 0)
    with pytest.raises(ValueError, match="new_storage: bad device index 200"):
        _native.module().new_storage(_memory.buffer_of(x), 200)


def _native_replayer():
    from devkit.torch import _native

    if _native.module() is None:  # the Python path is tested on its own below
        pytest.skip(f"devkit.torch's native module was not built here: {_native.reason()}")
    return _replay._templates().native


def test_native_replayer_serves_recorded_ops_and_leaves_the_rest_to_python():
    native = _native_replayer()
    a, b = torch.randn(6).to("devkit"), torch.randn(6).to("devkit")
    op = torch.ops.aten.add.Tensor
    _replay.clear()
    key = native.replay(op, (a, b), {})
    assert type(key) is bytes and native.size() == 0  # not seen yet: the key add() takes
    torch.add(a, b)  # recorded: the native replayer has it now
    assert native.size() == 1 and native.replay(op, (a, b), {}) is not None
    assert torch.equal(native.replay(op, (a, b), {}).cpu(), a.cpu() + b.cpu())
    assert native.replay(op, (a, torch.randn(6)), {}) is None  # a CPU tensor: the Python key decides
    assert native.replay(op, (a, [b]), {}) is None  # a tensor in a list: the Python key's too
    x = torch.zeros(3).to("devkit")
    for _ in range(3):
        x.fill_(1.0)  # not replayable: the native replayer hands it to the Python template
    assert native.replay(torch.ops.aten.fill_.Scalar, (x, 1.0), {}) is None
    with pytest.raises(TypeError, match=r"add: spec is \('calls', ...\), \('views', ...\) or None"):
        native.add(key, ("other",))


def _neg_template_that_fails(owner):
    """(native replayer, op, a, spec, kept): neg's template for ``a`` with ``owner``, whose one launch
    returns DK_INVALID_ARGUMENT. ``kept`` must outlive the replays: the Python template, which owns
    the calls the spec points at (the owner does otherwise), and the failing kernel function."""
    from devkit.abi import ffi

    native = _native_replayer()
    a = torch.randn(4).to("devkit")
    op = torch.ops.aten.neg.default
    torch.neg(a)
    failing = ffi.callback("DK_Status(const DK_KernelCall *)", lambda call: devkit.abi.C.DK_INVALID_ARGUMENT)
    template = _template(op, a)
    spec = list(template.native_spec())
    spec[1] = owner
    spec[2] = [(_replay._address(failing), *spec[2][0][1:])]
    return native, op, a, spec, (template, failing)


def test_native_replay_raises_the_plugin_error_of_a_failed_launch():
    class Owner:
        def failed(self, index, status):
            raise RuntimeError(f"step {index} failed with status {status}")

    native, op, a, spec, _kept = _neg_template_that_fails(Owner())
    _replay.clear()
    native.add(native.replay(op, (a,), {}), tuple(spec))
    with pytest.raises(RuntimeError, match=f"step 0 failed with status {devkit.abi.C.DK_INVALID_ARGUMENT}"):
        native.replay(op, (a,), {})
    _replay.clear()
    assert torch.equal(torch.neg(a).cpu(), -a.cpu())


def test_native_replay_reads_the_plugin_error_before_it_releases_the_outputs():
    """The ABI's error model: the host reads a failed call's message before it
    makes any other call into the plugin on that thread. Dropping a step's
    output buffers may free memory through the plugin, so the owner raises
    the error (reading the message) while the replay still holds them."""
    from devkit.driver import Buffer
    from devkit.torch import _memory

    events = []

    class Owner:
        def failed(self, index, status):
            events.append("error read")
            raise RuntimeError(f"step {index} failed with status {status}")

    class Output(Buffer):
        def __del__(self):
            events.append("output released")

    native, op, a, spec, _kept = _neg_template_that_fails(Owner())
    device, nbytes = spec[2][0][3][0][1]  # the output's reuse pool: the replay takes its buffer from there
    whole = Buffer.allocate(device, nbytes)
    _memory._pools.setdefault((device, nbytes), []).append(Output(whole._allocation, 0, nbytes))
    del whole
    _replay.clear()
    native.add(native.replay(op, (a,), {}), tuple(spec))
    with pytest.raises(RuntimeError, match="step 0 failed"):
        native.replay(op, (a,), {})
    assert events == ["error read", "output released"]
    _replay.clear()
    assert torch.equal(torch.neg(a).cpu(), -a.cpu())


def test_each_thread_replays_its_own_templates():
    import threading

    _native_replayer()
    replayers, results = {}, {}

    def work(name: str, offset: float):
        x = torch.arange(6.0).to("devkit")
        for _ in range(3):
            y = (x * 2 + offset).relu()
        results[name], replayers[name] = y.cpu(), _replay._templates().native

    threads = [threading.Thread(target=work, args=(f"t{i}", float(i))) for i in range(2)]
    for thread in threads:
        thread.start()
    work("main", -3.0)
    for thread in threads:
        thread.join()
    assert len({id(r) for r in replayers.values()}) == 3 and all(r.size() >= 3 for r in replayers.values())
    for name, offset in (("t0", 0.0), ("t1", 1.0), ("main", -3.0)):
        assert torch.equal(results[name], (torch.arange(6.0) * 2 + offset).relu())


def test_a_freed_buffer_behind_a_tensor_is_named_not_used():
    a = torch.randn(4).to("devkit")
    torch.neg(a)
    torch.neg(a)  # replayed
    dt.to_array(a).buffer._allocation.free()
    with pytest.raises(ValueError, match="buffer has been freed"):
        torch.neg(a)


def test_dead_outputs_are_reused_unless_something_still_reaches_them():
    a, b = torch.randn(16), torch.randn(16)
    da, db = a.to("devkit"), b.to("devkit")
    kept = None
    for step in range(6):
        c = da + db * step  # each result dies at the next step: its allocation serves a later one
        if step == 1:
            kept = dt.to_array(c)  # an Array still reaches this one's memory: never reused
    torch.testing.assert_close(c.cpu(), a + b * 5)
    del c
    torch.testing.assert_close(torch.from_dlpack(kept), a + b)
    assert dt.collect() >= 0
    del kept


def test_python_tensor_path_without_the_native_module():
    import subprocess
    import sys

    script = (
        "import torch, devkit.torch as dt\n"
        "from devkit.torch import _native\n"
        "dt.register('cpu')\n"
        "assert _native.module() is None and _native.reason() == 'DEVKIT_TORCH_NATIVE=0'\n"
        "a = torch.arange(6.0)\n"
        "x = a.to('devkit')\n"
        "for _ in range(3):\n"
        "    y = (x + x).view(2, 3).t()\n"
        "    x.add_(1)\n"
        "assert torch.equal(y.cpu(), (2 * (a + 2)).view(2, 3).t()) and torch.equal(x.cpu(), a + 3)\n"
        "assert torch.ones(2, device='devkit:1').cpu().sum() == 2\n"
        "del x, y\n"
        "import gc; gc.collect()\n"
        "assert dt.collect() > 0\n")
    env = {**__import__("os").environ, "DEVKIT_TORCH_NATIVE": "0"}
    result = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=240)
    assert result.returncode == 0, result.stderr


def test_without_ninja_or_a_compiler_the_python_path_runs_and_a_warning_says_why(tmp_path):
    import subprocess
    import sys

    script = (
        "import warnings, torch, devkit.torch as dt\n"
        "from devkit.torch import _native\n"
        "with warnings.catch_warnings(record=True) as caught:\n"
        "    warnings.simplefilter('always')\n"
        "    dt.register('cpu')\n"
        "assert _native.module() is None, _native.reason()\n"
        "print([str(w.message) for w in caught])\n"
        "x = torch.arange(4.0).to('devkit')\n"
        "for _ in range(3):\n"
        "    y = x + x\n"
        "assert torch.equal(y.cpu(), 2 * torch.arange(4.0))\n")
    env = {**__import__("os").environ, "PATH": str(tmp_path), "TORCH_EXTENSIONS_DIR": str(tmp_path / "ext")}
    result = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=240)
    assert result.returncode == 0, result.stderr
    assert "devkit.torch makes tensors in Python" in result.stdout and "building its native module failed" in \
        result.stdout, result.stdout


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


def _compiled_block(fuse=None):
    runners = []
    torch.manual_seed(0)
    block = models.gpt_block(32, 4).eval()

    def backend(graph_module, example_inputs):
        from devkit.torch import _compile
        from torch._dynamo.backends.common import aot_autograd
        from torch._decomp import core_aten_decompositions

        def keep(gm, inputs):
            runner = _compile.compile_graph(gm, inputs, fuse)
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


def test_compiled_plan_reads_weights_in_place_and_copies_inputs_that_move():
    block, compiled, runners = _compiled_block()
    x = torch.randn(2, 8, 32)
    x_dev = x.to("devkit")
    with torch.no_grad():
        for _ in range(3):  # records, then runs with every input where it was: nothing is copied in
            torch.testing.assert_close(compiled(x_dev).cpu(), block(x), rtol=1e-5, atol=1e-5)
        (plan,) = [plan for runner in runners for plan in runner.plans.values()]
        assert all(home is not None for home, (_, _, size, _) in zip(plan.homes, plan.staging) if size)
        for parameters in (block.parameters(), compiled.parameters()):  # in place: the plan reads the new values
            for parameter in parameters:
                parameter.mul_(1.5)
        torch.testing.assert_close(compiled(x_dev).cpu(), block(x), rtol=1e-5, atol=1e-5)
        for _ in range(2):  # a new batch moves the input: it is copied into the arena from then on
            x = torch.randn(2, 8, 32)
            torch.testing.assert_close(compiled(x.to("devkit")).cpu(), block(x), rtol=1e-5, atol=1e-5)
    moved = [index for index, home in enumerate(plan.homes) if home is None and plan.staging[index][2]]
    assert len(moved) == 1
    torch._dynamo.reset()


def _plan_of(compiled, block, runners, x):
    with torch.no_grad():
        for _ in range(2):  # records, then runs the plan
            got = compiled(x.to("devkit")).cpu()
    (plan,) = [plan for runner in runners for plan in runner.plans.values()]
    return plan, got


def test_a_compiled_plan_is_fused_where_the_plugin_has_the_codegen_section():
    """The GPT-style block fused and unfused: outputs within float32 tolerances of
    torch's (a fused kernel reorders float work), the fused plan's calls fewer."""
    if not devkit.device("cpu:0").plugin.has_codegen:
        pytest.skip(reason="the cpu plugin found no C compiler: it has no codegen section")
    x = torch.randn(2, 8, 32)
    plans, outputs = {}, {}
    for fuse in (None, False):
        block, compiled, runners = _compiled_block(fuse)
        plans[fuse], outputs[fuse] = _plan_of(compiled, block, runners, x)
        with torch.no_grad():
            torch.testing.assert_close(outputs[fuse], block(x), rtol=1e-5, atol=1e-5)
        torch._dynamo.reset()
    fused, unfused = plans[None], plans[False]
    assert unfused.fusion is None and "Fused" not in [call.op for call in unfused.calls]
    groups = fused.fusion.groups
    assert fused.fusion.dialect == "c" and ["Mul", "Mul"] in groups  # the query's and key's scaling, views of one value
    assert len(fused.calls) == len(unfused.calls) - fused.fusion.kernels_saved
    assert [call.op for call in fused.calls].count("Fused") == len(groups)
    torch.testing.assert_close(outputs[None], outputs[False], rtol=1e-5, atol=1e-5)


def test_a_plugin_without_the_codegen_section_gets_the_unfused_plan(monkeypatch):
    monkeypatch.setattr(devkit.Plugin, "has_codegen", property(lambda plugin: False))
    x = torch.randn(2, 8, 32)
    for fuse, report in ((None, None), (True, {"dialect": None, "groups": 0})):
        block, compiled, runners = _compiled_block(fuse)
        plan, got = _plan_of(compiled, block, runners, x)
        with torch.no_grad():
            torch.testing.assert_close(got, block(x), rtol=1e-5, atol=1e-5)
        assert "Fused" not in [call.op for call in plan.calls]
        assert (plan.fusion and {k: plan.fusion.as_dict()[k] for k in ("dialect", "groups")}) == report
        torch._dynamo.reset()


def test_the_backend_takes_the_fuse_option_and_names_unknown_ones():
    from devkit.torch import _compile

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.GELU(), torch.nn.Linear(8, 8)).eval()
    x = torch.randn(3, 8)
    compiled = torch.compile(copy.deepcopy(model).to("devkit"), backend="devkit", options={"fuse": False})
    with torch.no_grad():
        torch.testing.assert_close(compiled(x.to("devkit")).cpu(), model(x), rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match=r"unknown option\(s\) 'fusion'; it takes 'fuse'"):
        _compile.devkit_backend(None, [], options={"fusion": False})
    with pytest.raises(TypeError, match="option 'fuse' must be a bool, got str"):
        _compile.devkit_backend(None, [], options={"fuse": "no"})
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
