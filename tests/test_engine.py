"""devkit.engine: plans for ONNX models (prebuilt calls over a planned arena)
and the eager call cache, on the cpu plugin."""

from __future__ import annotations

import collections
import itertools

import ml_dtypes
import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import devkit
from devkit import onnx as donnx
from devkit.abi import C, ffi
from devkit.engine import Lifetime, plan_memory
from devkit.engine.plan import Plan
from devkit.onnx import zoo
from devkit.ops import dispatch

from .test_onnx_model import init, make_model, relu_chain_model, shape_subgraph_model, value


def only_plan(prepared) -> Plan:
    (plan,) = prepared.plans.values()
    assert isinstance(plan, Plan), plan
    return plan


@pytest.fixture
def plugin_calls(monkeypatch):
    """Counts the calls into the cpu plugin's table, by function name."""
    plugin = devkit.load_plugin("cpu")
    counts = collections.Counter()
    call = plugin.call

    def counting(function, *args):
        counts[function] += 1
        return call(function, *args)

    monkeypatch.setattr(plugin, "call", counting)
    return counts


def synchronising(counts) -> int:
    return sum(count for function, count in counts.items() if "synchronize" in function)


# -- the memory plan -------------------------------------------------------------------------

def test_tensors_live_at_different_times_share_bytes():
    lifetimes = [Lifetime(1000, 0, 1), Lifetime(1000, 1, 2), Lifetime(1000, 2, 3), Lifetime(10, 0, 3)]
    memory = plan_memory(lifetimes, alignment=64)
    assert memory.total_bytes == 3 * 1024 + 64
    assert memory.offsets[0] == memory.offsets[2]  # 0 is dead when 2 is written... at step 2 they touch
    assert memory.arena_bytes == 2 * 1024 + 64


def test_no_two_live_tensors_overlap_and_offsets_are_aligned():
    rng = np.random.default_rng(0)
    for _ in range(20):
        lifetimes = []
        for _ in range(30):
            first = int(rng.integers(-1, 20))
            lifetimes.append(Lifetime(int(rng.integers(0, 5000)), first, first + int(rng.integers(0, 6))))
        memory = plan_memory(lifetimes, alignment=128)
        assert all(offset % 128 == 0 for offset in memory.offsets)
        assert memory.arena_bytes <= memory.total_bytes
        for (i, a), (j, b) in itertools.combinations(enumerate(lifetimes), 2):
            if a.first <= b.last and b.first <= a.last and a.nbytes and b.nbytes:
                assert (memory.offsets[i] + a.nbytes <= memory.offsets[j]
                        or memory.offsets[j] + b.nbytes <= memory.offsets[i]), (a, b, memory)
            end = max(memory.offsets[i] + a.nbytes, memory.offsets[j] + b.nbytes)
            assert end <= memory.arena_bytes


def test_a_chain_plan_holds_two_activations():
    """8 Relus on 1 MiB: the input, 7 intermediates and the output are 9 tensors;
    at any step two are live."""
    prepared = donnx.prepare(relu_chain_model(8, 1 << 18), fuse=False)  # fused, it is one kernel
    x = np.random.default_rng(4).standard_normal(1 << 18).astype(np.float32)
    np.testing.assert_array_equal(prepared.run([x])[0], np.maximum(x, 0))
    plan = only_plan(prepared)
    assert plan.memory.total_bytes == 9 * x.nbytes
    assert plan.arena_bytes == 2 * x.nbytes
    assert [call.op for call in plan.calls] == ["Relu"] * 8


# -- plans ------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", sorted(zoo.MODELS))
def test_plan_outputs_are_the_interpreters_bit_for_bit(name):
    model, inputs = zoo.MODELS[name]()
    # Unfused and unprepared: a fused plan, and a kernel on a prepared weight, may sum in
    # another order (tests/test_fusion.py; the models suite's prepared-weight cases).
    planned = donnx.prepare(model, fuse=False, prepare_weights=False)
    interpreted = donnx.prepare(model, plan=False)
    want = interpreted.run(inputs)
    for _ in range(2):  # the build's run and a replay
        got = planned.run(inputs)
        assert len(got) == len(want)
        for a, b in zip(got, want):
            assert a.dtype == b.dtype and a.shape == b.shape
            np.testing.assert_array_equal(a, b)
    plan = only_plan(planned)
    assert plan.arena_bytes < plan.memory.total_bytes  # lifetimes share the arena


def test_shape_subgraph_and_constants_are_folded_at_build(monkeypatch):
    """transformer_encoder's head reshapes come from Shape(x): no Shape, Slice or
    Concat is left in the plan, and nothing goes through run_op after the build."""
    model, inputs = zoo.transformer_encoder()
    prepared = donnx.prepare(model)
    prepared.run(inputs)
    ops = {call.op for call in only_plan(prepared).calls}
    assert not ops & {"Shape", "Slice", "Concat"} and {"Reshape", "MatMul", "Softmax"} <= ops

    def refuse(*args, **kwargs):
        raise AssertionError("a planned run reached run_op")

    monkeypatch.setattr(dispatch, "run_op", refuse)
    prepared.run(inputs)


def test_values_of_initializers_alone_are_computed_once_per_fed_set(device_ops):
    """Transpose(w) depends on no input: computed at the first build, shared by
    the plans of other shapes, and recomputed only when a feed overrides w."""
    w = np.arange(80 * 60, dtype=np.float32).reshape(80, 60) / 1000
    nodes = [helper.make_node("Transpose", ["w"], ["wt"]), helper.make_node("MatMul", ["x", "wt"], ["y"])]
    model = make_model(nodes, [value("x", ["batch", 60]), value("w", [80, 60])], [value("y", ["batch", 80])],
                       [init("w", w)], ir_version=8)
    prepared = donnx.prepare(model)
    rng = np.random.default_rng(3)
    for batch in (2, 2, 5):
        x = rng.standard_normal((batch, 60)).astype(np.float32)
        np.testing.assert_allclose(prepared.run([x])[0], x.astype(np.float64) @ w.T, rtol=1e-5, atol=1e-5)
    assert device_ops == {"Transpose": 1}
    fed = w[::-1].copy()
    np.testing.assert_allclose(prepared.run({"x": x, "w": fed})[0], x.astype(np.float64) @ fed.T,
                               rtol=1e-5, atol=1e-5)
    assert device_ops == {"Transpose": 1}  # with w fed, Transpose is a kernel call of the plan
    fed_plan = prepared.plans[(("w", (80, 60)), ("x", (5, 60)))]
    assert [call.op for call in fed_plan.calls] == ["Transpose", "MatMul"]


def test_a_new_shape_builds_and_caches_its_own_plan():
    prepared = donnx.prepare(shape_subgraph_model())
    rng = np.random.default_rng(0)
    seen = []
    for batch in (4, 1, 4, 1, 7):
        x = rng.standard_normal((batch, 6)).astype(np.float32)
        np.testing.assert_array_equal(prepared.run([x])[0], np.maximum(x.reshape(batch, 2, 3), 0))
        seen.append(prepared.plans[(("x", (batch, 6)),)])
    assert list(prepared.plans) == [(("x", (b, 6)),) for b in (4, 1, 7)]
    assert seen[0] is seen[2] and seen[1] is seen[3] and seen[0] is not seen[1]


def test_a_run_is_one_graph_launch(plugin_calls):
    """Inputs in, the kernels, outputs out: one graph launched on the default
    stream (complete when it returns), and no other call into the plugin."""
    model, inputs = zoo.resnet()
    planned, interpreted = donnx.prepare(model), donnx.prepare(model, plan=False)
    (want,) = interpreted.run(inputs)
    planned.run(inputs)  # the build and the capture
    plugin_calls.clear()
    for _ in range(3):
        (got,) = planned.run(inputs)
        np.testing.assert_array_equal(got, want)
    assert plugin_calls == {"graph_launch": 3}
    plugin_calls.clear()
    interpreted.run(inputs)
    assert synchronising(plugin_calls) == 0  # every node on the default stream: each complete when it returns


def test_profile_times_each_call_on_the_values_a_run_gives_it():
    """RotaryEmbedding reads its position ids: launched on stale arena bytes it would refuse them."""
    model, inputs = zoo.llama_decoder()
    prepared = donnx.prepare(model)
    (want,) = prepared.run(inputs)
    (plan,) = prepared.plans.values()
    profile = plan.profile(inputs, repeat=2)
    assert [op for op, _ in profile] == [call.op for call in plan.calls] and "RotaryEmbedding" in dict(profile)
    assert all(seconds > 0 for _, seconds in profile)
    np.testing.assert_array_equal(prepared.run(inputs)[0], want)  # the calls' streams are restored
    dev = devkit.device("cpu:0")
    with dev.create_stream() as stream:
        (got,) = prepared.run(inputs, stream)
        stream.synchronize()
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("staged", [True, False], ids=["staged graph", "host replay"])
def test_device_work_alone_computes_its_feed_with_no_host_work_of_a_run(plugin_calls, monkeypatch, staged):
    """Plan.launch_device_work, which devkit-bench engine times against runs:
    the feed's result in the arena, on the default stream (complete at
    return, nothing synchronised), and no other plugin call than a run's
    device work: one graph launch where the plan stages, else the input copy
    (the calls launch through their own function pointers), the calls back on
    the plan's stream after."""
    if not staged:
        monkeypatch.setattr(type(devkit.load_plugin("cpu")), "has_graphs", property(lambda plugin: False))
    model, inputs = zoo.mlp()
    prepared, interpreted = donnx.prepare(model, prepare_weights=False), donnx.prepare(model, plan=False)
    rng = np.random.default_rng(3)
    first, second = ({name: rng.standard_normal(value.shape).astype(np.float32)} for name, value in
                     [*inputs.items()] * 2)
    prepared.run(first)
    plan = only_plan(prepared)
    (want,) = interpreted.run(second)
    plugin_calls.clear()
    plan.launch_device_work(second)
    assert plugin_calls == ({"graph_launch": 1} if staged else {"copy_h2d": 1})
    np.testing.assert_array_equal(plan._outputs[0].numpy(), want)
    np.testing.assert_array_equal(prepared.run(first)[0], interpreted.run(first)[0])
    with devkit.device("cpu:0").create_stream() as stream:
        (got,) = prepared.run(second, stream)
        stream.synchronize()
    np.testing.assert_array_equal(got, want)


def test_a_run_of_a_new_input_value_reads_it():
    """The staged graph reads its host input arrays at every launch: each run sees its own feed."""
    model, inputs = zoo.mlp()
    planned, interpreted = donnx.prepare(model, prepare_weights=False), donnx.prepare(model, plan=False)
    rng = np.random.default_rng(5)
    (name, example), = inputs.items()
    shape = example.shape  # not the declared one, whose batch dimension is symbolic
    for _ in range(3):
        feed = {name: rng.standard_normal(shape).astype(np.float32)}
        (got,), (want,) = planned.run(feed), interpreted.run(feed)
        np.testing.assert_array_equal(got, want)
    outputs = [planned.run(feed)[0] for _ in range(2)]
    assert not np.shares_memory(outputs[0], outputs[1])  # fresh arrays, not the plan's staging


def test_a_run_on_the_callers_stream_waits_for_nothing(plugin_calls):
    model, inputs = zoo.mlp()
    prepared = donnx.prepare(model, prepare_weights=False)  # bit for bit with the interpreter
    (want,) = donnx.prepare(model, plan=False).run(inputs)
    prepared.run(inputs)
    dev = devkit.device("cpu:0")
    first, second = dev.create_stream(), dev.create_stream()
    for stream in (first, second, first):  # the calls follow the stream they are given
        plugin_calls.clear()
        (got,) = prepared.run(inputs, stream)
        assert synchronising(plugin_calls) == 0
        stream.synchronize()
        np.testing.assert_array_equal(got, want)
    first.destroy()
    second.destroy()


def test_a_run_after_a_bound_run_launches_on_its_own_stream(monkeypatch):
    """A bound run points the calls at its stream and leaves them there; host
    replay (a plugin without graphs) points them back at the next run's stream."""
    monkeypatch.setattr(type(devkit.load_plugin("cpu")), "has_graphs", property(lambda plugin: False))
    model, inputs = zoo.mlp()
    prepared = donnx.prepare(model, prepare_weights=False)
    (want,) = donnx.prepare(model, plan=False).run(inputs)
    dev = devkit.device("cpu:0")
    with dev.create_stream() as stream:
        prepared.run(inputs, stream)
        stream.synchronize()
        plan = only_plan(prepared)
        (bound,) = prepared.run({name: devkit.asarray(value) for name, value in inputs.items()})  # bound
        np.testing.assert_array_equal(bound.numpy(), want)
        assert all(call.cdata.stream != stream.handle for call in plan.calls)
        (got,) = prepared.run(inputs, stream)
        assert all(call.cdata.stream == stream.handle for call in plan.calls)
        stream.synchronize()
    np.testing.assert_array_equal(got, want)


def test_a_graph_launch_refuses_a_slot_whose_memory_was_freed():
    """The cpu plugin checks at every launch that each captured tensor still
    lies in a live allocation (one lock and one look-up per run of slots in
    the same allocation): a slot rebound to memory that is then freed fails
    the launch with its message, and rebound back the graph launches again."""
    dev = devkit.device("cpu:0")
    api = dev.plugin.api
    x, w = (devkit.asarray(np.arange(8, dtype=np.float32) + i, dev) for i in range(2))
    with dev.create_stream() as stream:
        with stream.capture(mode="native") as graph:
            total = devkit.run_op("Add", [x, w], stream=stream)[0]
            y = devkit.run_op("Add", [total, w], stream=stream)[0]
    w_of_second_add = 4  # slots in capture order: x, w, total; total, w, y
    mem = ffi.new("DK_Mem *")
    assert api.mem_alloc(dev.index, 32, mem) == C.DK_OK
    assert api.graph_rebind(dev.index, graph._handle, w_of_second_add, mem[0], 0) == C.DK_OK
    assert api.mem_free(dev.index, mem[0]) == C.DK_OK
    with pytest.raises(devkit.errors.InvalidArgumentError,
                       match="graph_launch: a slot's handle 0x[0-9a-f]+ is not a live allocation"):
        graph.launch()
    assert api.graph_rebind(dev.index, graph._handle, w_of_second_add, w.buffer.handle, 0) == C.DK_OK
    graph.launch()
    np.testing.assert_array_equal(y.numpy(), np.arange(8, dtype=np.float32) + 2 * (np.arange(8) + 1))
    graph.destroy()


def test_a_graph_launch_checks_no_memory_for_an_empty_tensor():
    """An empty tensor reaches no memory, so a kernel call may leave its data
    NULL (the launch accepts it): a graph that captured such a call launches
    wherever the call sits, not only when no earlier slot has memory."""
    from devkit.engine import calls

    dev = devkit.device("cpu:0")
    api = dev.plugin.api
    entry = next(e for e in dev.plugin.kernel_entries("Add") if calls.key_dtype_of(e) == np.float32)
    x = devkit.asarray(np.arange(4, dtype=np.float32), dev)
    empty = devkit.asarray(np.zeros(0, np.float32), dev)
    with dev.create_stream() as stream:
        handle = stream._handle
        y = devkit.empty((4,), np.float32, dev)
        add = calls.KernelCall(dev, entry, "Add", [x, x], [y], [], handle)
        add_empty = calls.KernelCall(dev, entry, "Add", [empty, empty], [devkit.empty((0,), np.float32, dev)], [],
                                     handle)
        for tensor in (*add_empty.inputs, add_empty.outputs[0]):
            tensor.data = ffi.NULL
        assert add_empty.fn(add_empty.cdata) == C.DK_OK
        for captured in ([add_empty], [add, add_empty]):
            graph, num_slots = ffi.new("DK_Graph *"), ffi.new("size_t *")
            assert api.graph_begin_capture(dev.index, handle) == C.DK_OK
            for call in captured:
                assert call.fn(call.cdata) == C.DK_OK
            assert api.graph_end_capture(dev.index, handle, graph, num_slots) == C.DK_OK
            assert num_slots[0] == 3 * len(captured)
            status = api.graph_launch(dev.index, graph[0], handle)
            assert status == C.DK_OK, dev.plugin.last_error_message()
            assert api.stream_synchronize(dev.index, handle) == C.DK_OK
            assert api.graph_destroy(dev.index, graph[0]) == C.DK_OK
    np.testing.assert_array_equal(y.numpy(), 2 * np.arange(4, dtype=np.float32))


def test_what_cannot_be_planned_runs_in_the_interpreter():
    """Reshape's target fed as an input is only known on the device; NonZero's
    output size depends on its input values: both say so and still run."""
    reshape = make_model([helper.make_node("Reshape", ["x", "shape"], ["y"])],
                         [value("x", [6]), value("shape", [2], TensorProto.INT64)], [value("y", None)])
    prepared = donnx.prepare(reshape)
    (y,) = prepared.run([np.arange(6, dtype=np.float32), np.array([3, 2])])
    np.testing.assert_array_equal(y, np.arange(6, dtype=np.float32).reshape(3, 2))
    (reason,) = prepared.plans.values()
    assert "input 'shape' is computed on the device" in reason and "(Reshape)" in reason
    nonzero = make_model([helper.make_node("NonZero", ["x"], ["y"])], [value("x", [5])],
                         [value("y", None, TensorProto.INT64)])
    prepared = donnx.prepare(nonzero)
    x = np.array([0, 1, 0, 2, 3], np.float32)
    np.testing.assert_array_equal(prepared.run([x])[0], np.array(np.nonzero(x)))
    (reason,) = prepared.plans.values()
    assert "output shape depends on its input values" in reason


def test_bad_inputs_still_fail_with_their_name_once_planned():
    model, inputs = zoo.mlp()
    prepared = donnx.prepare(model)
    prepared.run(inputs)
    with pytest.raises(TypeError, match="input 'x' has dtype float64, the model declares float32"):
        prepared.run({"x": inputs["x"].astype(np.float64)})
    with pytest.raises(ValueError, match=r"input 'x' has shape \(16, 5\), the model declares \(\?, 128\)"):
        prepared.run({"x": inputs["x"][:, :5]})
    with pytest.raises(ValueError, match="unknown input 'y'"):
        prepared.run({"x": inputs["x"], "y": inputs["x"]})
    # A run's fast path takes an ndarray of a shape accepted before, whatever its layout; a list takes the checks.
    (want,) = prepared.run(inputs)
    for feed in ({"x": np.asfortranarray(inputs["x"])}, [inputs["x"]]):
        np.testing.assert_array_equal(prepared.run(feed)[0], want)
    with pytest.raises(TypeError, match="input 'x' has dtype float64, the model declares float32"):
        prepared.run([inputs["x"].tolist()])


def test_a_shape_error_found_at_build_names_the_op():
    model = make_model([helper.make_node("Add", ["a", "b"], ["y"])], [value("a", ["n"]), value("b", ["m"])],
                       [value("y", None)])
    with pytest.raises(ValueError, match=r"Add: shapes \(3,\), \(4,\) cannot be broadcast together"):
        donnx.prepare(model).run([np.ones(3, np.float32), np.ones(4, np.float32)])


# -- the eager call cache ----------------------------------------------------------------------

@pytest.fixture
def cache():
    devkit.ops.clear_call_cache()
    yield devkit.ops.call_cache_info
    devkit.ops.clear_call_cache()


def test_repeated_calls_hit_the_cache(cache):
    a = devkit.asarray(np.arange(6, dtype=np.float32).reshape(2, 3))
    b = devkit.asarray(np.full(3, 0.5, np.float32))
    outputs = [devkit.ops.Add(a, b).numpy() for _ in range(4)]
    for out in outputs:
        np.testing.assert_array_equal(out, np.arange(6, dtype=np.float32).reshape(2, 3) + 0.5)
    assert cache() == {"hits": 3, "misses": 1, "entries": 1}
    devkit.ops.Add(b, a)  # other shapes in the other order: its own entry
    devkit.ops.Softmax(a, axis=0)
    devkit.ops.Softmax(a, axis=1)
    assert cache() == {"hits": 3, "misses": 4, "entries": 4}


def test_results_are_keyed_as_arrays_of_their_layout(cache):
    """A cached call's result keys the next call as any Array of its device,
    dtype, shape and strides does; another dtype or strides is another entry."""
    host = np.arange(6, dtype=np.float32).reshape(2, 3)
    a = devkit.asarray(host)
    c = devkit.ops.Add(a, a)
    d = devkit.ops.Add(c, a)  # c: a result of the cached call, keyed as a is
    np.testing.assert_array_equal(d.numpy(), host * 3)
    assert cache() == {"hits": 1, "misses": 1, "entries": 1}
    devkit.ops.Add(a.T, devkit.asarray(np.ones((3, 2), np.float32)))  # strided: its own entry
    devkit.ops.Add(devkit.asarray(host.astype(np.float64)), devkit.asarray(host.astype(np.float64)))
    assert cache() == {"hits": 1, "misses": 3, "entries": 3}


def test_eager_steady_state_counts_every_allocation_and_free(cache):
    """The allocator's steady-state reuse (the block the last result gave back)
    counts an allocation, a free and a cache hit for each result, as any reuse does."""
    dev = devkit.device("cpu:0")
    a = devkit.asarray(np.ones(5, np.float32))
    devkit.ops.Add(a, a)
    start = devkit.memory_stats(dev)
    for _ in range(50):
        devkit.ops.Add(a, a)
    stats = devkit.memory_stats(dev)
    assert stats["allocated_bytes"] == start["allocated_bytes"]
    assert stats["allocation_count"] - start["allocation_count"] == 50
    assert stats["free_count"] - start["free_count"] == 50
    assert stats["cache_hits"] - start["cache_hits"] == 50
    assert stats["device_allocations"] == start["device_allocations"]


def test_host_inputs_are_keyed_by_value(cache):
    x = devkit.asarray(np.arange(6, dtype=np.float32))
    assert devkit.ops.Reshape(x, [2, 3]).shape == (2, 3)
    assert devkit.ops.Reshape(x, [3, 2]).shape == (3, 2)
    assert devkit.ops.Reshape(x, np.array([3, 2])).shape == (3, 2)
    assert devkit.ops.Reshape(x, [3, 2]).shape == (3, 2)
    assert cache()["hits"] == 2  # [3, 2] and np.array([3, 2]): the same int64 values


def test_host_inputs_given_as_device_arrays_are_never_cached(cache):
    """ConstantOfShape's shape read from a device Array: the same Array shape, other values."""
    for shape in ([2, 3], [3, 2], [2, 3]):
        out = devkit.ops.ConstantOfShape(devkit.asarray(np.array(shape)), value=1.5, dtype="float32")
        np.testing.assert_array_equal(out.numpy(), np.full(shape, 1.5, np.float32))
    assert cache()["hits"] == 0


def test_bad_input_after_caching_still_fails_clearly(cache):
    a = devkit.asarray(np.ones(3, np.float32))
    devkit.ops.Add(a, a)
    with pytest.raises(ValueError, match=r"Add: shapes \(3,\), \(4,\) cannot be broadcast together"):
        devkit.ops.Add(a, devkit.asarray(np.ones(4, np.float32)))
    with pytest.raises(TypeError, match="Add: B has dtype int32 but A has float32"):
        devkit.ops.Add(a, devkit.asarray(np.ones(3, np.int32)))
    devkit.ops.Softmax(a, axis=0)
    with pytest.raises(ValueError, match="axis 5 is out of range"):
        devkit.ops.Softmax(a, axis=5)
    with pytest.raises(TypeError, match="Softmax: unknown attribute 'axes'"):
        devkit.ops.Softmax(a, axes=0)
    b = devkit.asarray(np.ones(3, np.float32))
    devkit.ops.Add(a, b)
    b.buffer.free()
    with pytest.raises(ValueError, match="buffer has been freed"):
        devkit.ops.Add(a, b)


def test_a_cached_call_on_a_stream(cache):
    dev = devkit.device("cpu:0")
    stream = dev.create_stream()
    a = devkit.asarray(np.arange(4, dtype=np.float32))
    for _ in range(3):
        out = devkit.ops.Mul(a, a, stream=stream)
        stream.synchronize()
        np.testing.assert_array_equal(out.numpy(), np.arange(4, dtype=np.float32) ** 2)
    assert cache()["hits"] == 2
    stream.destroy()


def test_strided_and_numpy_inputs(cache):
    host = np.arange(12, dtype=np.float32).reshape(3, 4)
    x = devkit.asarray(host)
    for _ in range(2):
        np.testing.assert_array_equal(devkit.ops.Relu(x.T).numpy(), np.maximum(host.T, 0))
        np.testing.assert_array_equal(devkit.ops.Add(x, np.ones(4, np.float32)).numpy(), host + 1)


def test_a_numpy_input_lives_until_its_cached_call_has_run(cache):
    """Its device copy is held by nothing but the call: with every buffer given back to
    the plugin at once, a call that dropped it before launching would read freed memory."""
    previous = devkit.set_allocator("none")
    try:
        x = devkit.asarray(np.arange(4, dtype=np.float32))
        for _ in range(3):
            out = devkit.ops.Add(np.full(4, 2, np.float32), x)
            np.testing.assert_array_equal(out.numpy(), np.arange(4, dtype=np.float32) + 2)
        assert cache()["hits"] == 2
    finally:
        devkit.set_allocator(previous)


def test_kernels_are_found_by_op_and_dtype():
    plugin = devkit.load_plugin("cpu")
    entry = plugin.kernel_entry("Add", np.float32)
    assert entry in plugin.kernel_entries("Add") and entry.dtype.bits == 32
    assert plugin.kernel_entry("Add", np.dtype("bool")) is None
    assert plugin.kernel_entry("NoSuchOp", np.float32) is None


# -- prepared weights (ABI 1.4): the cpu plugin's MatMul, Gemm and Winograd Conv -----------------

def _conv_model(channels: int, size: int, dtype=np.float32):
    onnx_dtype = helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    weights = (np.random.default_rng(0).standard_normal((channels, channels, 3, 3)) * 0.1).astype(dtype)
    graph = helper.make_graph([helper.make_node("Conv", ["x", "w"], ["y"], pads=[1, 1, 1, 1])], "conv",
                              [helper.make_tensor_value_info("x", onnx_dtype, [1, channels, size, size])],
                              [helper.make_tensor_value_info("y", onnx_dtype, None)],
                              [numpy_helper.from_array(weights, "w")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])


def _matmul_model(dtype):
    onnx_dtype = helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    weights = np.random.default_rng(0).standard_normal((64, 48)).astype(dtype)
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"])], "matmul",
                              [helper.make_tensor_value_info("x", onnx_dtype, [2, 5, 64])],
                              [helper.make_tensor_value_info("y", onnx_dtype, None)],
                              [numpy_helper.from_array(weights, "w")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])


def test_the_mlp_plan_runs_its_products_on_prepared_weights():
    model, inputs = zoo.mlp()
    prepared, given = donnx.prepare(model, fuse=False), donnx.prepare(model, fuse=False, prepare_weights=False)
    got, want = prepared.run(inputs), given.run(inputs)
    assert [(p.call, p.input) for p in only_plan(prepared).prepared] == [
        ("kernel Gemm[float32]", 1), ("kernel Gemm[float32]", 1), ("kernel MatMul[float32]", 1)]
    assert only_plan(given).prepared == []
    np.testing.assert_allclose(got[0], want[0], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("dtype", [np.float32, np.float16, ml_dtypes.bfloat16])
def test_a_batched_matmul_on_a_prepared_weight(dtype):
    """A (2, 5, 64) @ (64, 48): the batches fold into the rows of one product on the packed B;
    float16 and bfloat16 weights are widened once, at the preparation."""
    x = np.random.default_rng(1).standard_normal((2, 5, 64)).astype(dtype)
    prepared = donnx.prepare(_matmul_model(dtype))
    (got,) = prepared.run({"x": x})
    (want,) = donnx.prepare(_matmul_model(dtype), prepare_weights=False).run({"x": x})
    assert [p.input for p in only_plan(prepared).prepared] == [1]
    tolerance = {"rtol": 1e-5, "atol": 1e-5} if dtype == np.float32 else {"rtol": 2e-2, "atol": 5e-2}
    np.testing.assert_allclose(got.astype(np.float32), want.astype(np.float32), **tolerance)


def _gemm_model(m: int, k: int, n: int, bias: bool):
    """Gemm (alpha 0.5, beta 2, C broadcast over rows when ``bias``) or MatMul of x (m, k) by a constant
    (k, n)."""
    rng = np.random.default_rng(m + k + n)
    inits = [numpy_helper.from_array(rng.standard_normal((k, n)).astype(np.float32), "w")]
    if bias:
        inits.append(numpy_helper.from_array(rng.standard_normal(n).astype(np.float32), "c"))
        node = helper.make_node("Gemm", ["x", "w", "c"], ["y"], alpha=0.5, beta=2.0)
    else:
        node = helper.make_node("MatMul", ["x", "w"], ["y"])
    graph = helper.make_graph([node], "product", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [m, k])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)]), inits


# Prepared products split over the pool by tiles of 8 rows x 32 columns:
# llama_decoder's 64 x 128 x 344 (11 column blocks, an odd count), rows
# that are not a multiple of 8 and columns not of 16 (tail tiles), one
# column block split by rows, two row blocks by columns, and a product
# below the split threshold. Reference: float64, a dot-product bound.
@pytest.mark.parametrize("m,k,n", [(64, 128, 344), (203, 96, 17), (9, 300, 1000), (37, 50, 20)])
@pytest.mark.parametrize("bias", [False, True])
def test_prepared_products_split_into_tiles_match_float64(m, k, n, bias):
    model, inits = _gemm_model(m, k, n, bias)
    x = np.random.default_rng(3).standard_normal((m, k)).astype(np.float32)
    prepared = donnx.prepare(model, fuse=False)
    (got,) = prepared.run({"x": x})
    assert [p.input for p in only_plan(prepared).prepared] == [1]
    w = numpy_helper.to_array(inits[0]).astype(np.float64)
    want, bound = x.astype(np.float64) @ w, 8 * k * np.finfo(np.float32).eps * (np.abs(x) @ np.abs(w))
    if bias:
        c = numpy_helper.to_array(inits[1]).astype(np.float64)
        want, bound = 0.5 * want + 2.0 * c, 0.5 * bound + 8 * np.finfo(np.float32).eps * np.abs(c)
    assert got.shape == (m, n)
    assert np.all(np.abs(got - want) <= bound)


@pytest.mark.parametrize(("channels", "size", "prepares"), [(64, 32, True), (16, 32, True), (48, 6, False)])
def test_a_winograd_or_direct_conv_prepares_its_filters(channels, size, prepares):
    """Where the cpu Conv goes by Winograd (64 channels on 32x32) or the direct way (16 channels)
    its W is prepared (the transforms or the filter blocks made once, the same sums: bit for
    bit); on the other paths (48 channels on 6x6: im2col) it is taken as given. (64 filters on
    6x6 go by the indirect path when prepared: tests/test_cpu_conv_kernels.py.)"""
    model = _conv_model(channels, size)
    x = np.random.default_rng(2).standard_normal((1, channels, size, size)).astype(np.float32)
    prepared = donnx.prepare(model)
    (got,) = prepared.run({"x": x})
    (want,) = donnx.prepare(model, prepare_weights=False).run({"x": x})
    assert [p.call for p in only_plan(prepared).prepared] == (["kernel Conv[float32]"] if prepares else [])
    np.testing.assert_array_equal(got, want)


def _tensor_pointers(plan: Plan) -> list:
    """Every call's tensors' (data, byte_offset), as ints."""
    return [(int(ffi.cast("uintptr_t", tensor.data)), tensor.byte_offset)
            for call in plan.calls for tensors in (call.inputs, call.outputs) for tensor in tensors]


def test_a_bound_run_points_the_calls_back_at_the_arena_and_unregisters_even_when_it_fails():
    """NumPy inputs and outputs bound in place (cpu registers host memory): after
    a run, and after one refused part way (output 0 bound, output 1 of the
    wrong shape), every call's tensors point where they did, nothing stays
    registered (x registers again), and unbound runs give the bound results
    bit for bit."""
    nodes = [helper.make_node("Mul", ["x", "two"], ["y"]), helper.make_node("Add", ["x", "x"], ["z"])]
    graph = helper.make_graph(nodes, "io", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [128, 256])],
                              [helper.make_tensor_value_info(name, TensorProto.FLOAT, [128, 256]) for name in "yz"],
                              [numpy_helper.from_array(np.float32(2), "two")])
    prepared = donnx.prepare(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)]), fuse=False)
    x = np.random.default_rng(11).standard_normal((128, 256)).astype(np.float32)
    on_device = prepared.run({"x": devkit.asarray(x)})  # devkit Arrays in and out: builds the plan
    plan = only_plan(prepared)
    arena = _tensor_pointers(plan)
    y, z = prepared.run({"x": x})  # 128 KiB each: bound in place
    assert _tensor_pointers(plan) == arena
    np.testing.assert_array_equal(y, x * 2)
    np.testing.assert_array_equal(z, x + x)
    for got, want in zip(on_device, (y, z)):
        np.testing.assert_array_equal(got.numpy(), want)
    given = np.empty_like(x)
    with pytest.raises(ValueError, match=r"output 1 has shape \(128, 255\)"):
        prepared.run({"x": x}, outputs=[given, np.empty((128, 255), np.float32)])
    assert _tensor_pointers(plan) == arena
    dev = devkit.device("cpu:0")
    mem = ffi.new("DK_Mem *")
    assert dev.plugin.api.mem_register_host(dev.index, ffi.from_buffer(x), x.nbytes, mem) == C.DK_OK
    assert dev.plugin.api.mem_unregister_host(dev.index, mem[0]) == C.DK_OK
    assert dev.plugin.api.mem_register_host(dev.index, ffi.from_buffer(given), given.nbytes, mem) == C.DK_OK
    assert dev.plugin.api.mem_unregister_host(dev.index, mem[0]) == C.DK_OK
    again = prepared.run({"x": x}, outputs=[given, None])
    assert again[0] is given
    np.testing.assert_array_equal(given, y)
    np.testing.assert_array_equal(again[1], z)
