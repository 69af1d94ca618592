"""Graph conformance: capture, launch, rebind and destroy (devkit.h, "graphs").

Every case runs twice per plugin: "native" drives the plugin's own graph
section (ABI 1.1; skipped, with the reason, where the plugin has none), and
"host" hides the section so that the host records the prebuilt calls and
replays them, which is what a plugin without the section gets. Results are
exact: the ops used (Add and Relu on float32, which every plugin with
kernels has, and Gather where the plugin has it) round the same way in
NumPy.
"""

import threading

import numpy as np
import pytest

import devkit
from devkit.abi import C, ffi

N = 257  # not a multiple of any vector width


@pytest.fixture(params=["native", "host"])
def mode(request, plugin):
    if request.param == "native" and not plugin.has_graphs:
        pytest.skip(reason=f"plugin '{plugin.name}' has no graph section: its graphs are the "
                           f"host's replays, which the 'host' cases check")
    return request.param


@pytest.fixture
def native(plugin):
    """For cases that drive the graph section through the table."""
    if not plugin.has_graphs:
        pytest.skip(reason=f"plugin '{plugin.name}' has no graph section")
    return "native"


@pytest.fixture
def stream(dev):
    with dev.create_stream() as s:
        yield s


def values(seed: int, n: int = N) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(n).astype(np.float32)


def op(name: str, *inputs, stream=None):
    return devkit.run_op(name, list(inputs), stream=stream)[0]


def capture_affine(stream, mode, x, w, b):
    """y = relu(x + w + b), captured; returns (graph, y)."""
    with stream.capture(mode) as graph:
        y = op("Relu", op("Add", op("Add", x, w, stream=stream), b, stream=stream), stream=stream)
    return graph, y


def require_kernels(dev, *ops):
    """Skips a case whose ops the plugin has no float32 kernel for (the ABI 1.0 test plugin has two)."""
    lacking = [name for name in ops if dev.plugin.kernel_entry(name, np.float32) is None]
    if lacking:
        pytest.skip(reason=f"plugin '{dev.plugin.name}' has no float32 {', '.join(lacking)}")


def capture_gather(dev, stream, mode, fuse=False):
    """A captured Gather of data[[0, 3, 7]]: (graph, data, indices, picked). Bad
    indices written into ``indices`` make its launches fail. ``fuse``: a fused
    capture, picked = gathered * 1 + 0 (exact) in a generated kernel."""
    if dev.plugin.kernel_entry("Gather", np.float32) is None:
        pytest.skip(reason=f"plugin '{dev.plugin.name}' has no float32 Gather, whose bad indices "
                           f"make the launched graph fail")
    data = devkit.asarray(values(0, 8), dev)
    indices = devkit.asarray(np.array([0, 3, 7], np.int64), dev)
    one, zero = devkit.asarray(np.ones(3, np.float32), dev), devkit.zeros(3, "float32", dev)
    with stream.capture(mode, fuse=fuse) as graph:
        picked = devkit.run_op("Gather", [data, indices], stream=stream)[0]
        if fuse:
            picked = op("Add", op("Mul", picked, one, stream=stream), zero, stream=stream)
    return graph, data, indices, picked


def affine(x, w, b):
    return np.maximum(x + w + b, np.float32(0))


def test_capture_records_without_running_and_launch_runs(dev, stream, mode):
    x, w, b = (devkit.asarray(values(i), dev) for i in range(3))
    marker = devkit.zeros(16, "uint8", dev)
    with stream.capture(mode) as graph:
        marker.buffer.fill(7, stream=stream)
        y = op("Relu", op("Add", op("Add", x, w, stream=stream), b, stream=stream), stream=stream)
    stream.synchronize()
    assert (marker.numpy() == 0).all(), "captured work ran during the capture"
    graph.launch(stream)
    stream.synchronize()
    assert (marker.numpy() == 7).all()
    np.testing.assert_array_equal(y.numpy(), affine(x.numpy(), w.numpy(), b.numpy()))
    assert graph.num_slots == 3 + 3 + 2  # Add, Add, Relu: inputs then outputs
    graph.destroy()


def test_launch_is_stream_ordered_and_asynchronous(dev, stream, mode):
    """A launch queued behind held work is still pending; it runs once released."""
    x, w, b = (devkit.asarray(values(i), dev) for i in range(3))
    graph, y = capture_affine(stream, mode, x, w, b)
    y.buffer.fill(0)
    gate = threading.Event()
    stream.add_callback(lambda: gate.wait(30))
    try:
        graph.launch(stream)
        assert not stream.query()
    finally:
        gate.set()
    stream.synchronize()
    np.testing.assert_array_equal(y.numpy(), affine(x.numpy(), w.numpy(), b.numpy()))
    graph.destroy()


def test_many_launches_in_order(dev, stream, mode):
    """Each launch reads what the previous one wrote: acc += 1, fifty times."""
    acc = devkit.zeros(N, "float32", dev)
    one = devkit.asarray(np.ones(N, np.float32), dev)
    with stream.capture(mode) as graph:
        total = op("Add", acc, one, stream=stream)
        acc.buffer.copy_from(total.buffer, stream=stream)
    for _ in range(50):
        graph.launch(stream)
    stream.synchronize()
    np.testing.assert_array_equal(acc.numpy(), np.full(N, 50, np.float32))
    graph.destroy()


def test_launches_on_two_streams_joined_by_events(dev, stream, mode):
    """Graph A launched on one stream feeds graph B on another; A also runs on a
    stream it was not captured on."""
    x = devkit.asarray(values(0), dev)
    one = devkit.asarray(np.ones(N, np.float32), dev)
    with dev.create_stream() as other, dev.create_event() as done:
        with stream.capture(mode) as graph_a:
            y = op("Add", x, one, stream=stream)
        with other.capture(mode) as graph_b:
            z = op("Add", y, y, stream=other)
        for launch_stream in (stream, other):
            z.buffer.fill(0)
            graph_a.launch(launch_stream)
            done.record(launch_stream)
            other.wait_event(done)
            graph_b.launch(other)
            other.synchronize()
            expected = x.numpy() + 1
            np.testing.assert_array_equal(z.numpy(), expected + expected)
        stream.synchronize()
        graph_a.destroy()
        graph_b.destroy()


def test_captured_event_record_is_redone_by_every_launch(dev, stream, mode):
    x, w, b = (devkit.asarray(values(i), dev) for i in range(3))
    with dev.create_stream() as other, dev.create_event() as done:
        with stream.capture(mode) as graph:
            y = op("Relu", op("Add", op("Add", x, w, stream=stream), b, stream=stream),
                   stream=stream)
            done.record(stream)
        copy = devkit.empty(N, "float32", dev)
        for seed in (5, 6):
            x.buffer.copy_from_host(values(seed))
            graph.launch(stream)
            other.wait_event(done)
            copy.buffer.copy_from(y.buffer, stream=other)
            other.synchronize()
            np.testing.assert_array_equal(copy.numpy(), affine(values(seed), w.numpy(), b.numpy()))
        stream.synchronize()
        graph.destroy()


@pytest.mark.parametrize("fuse", [False, True], ids=["capture", "fused"])
def test_captured_host_copies_read_and_write_host_memory_at_every_launch(dev, stream, mode, fuse):
    source = values(1)
    landing = np.zeros(N, np.float32)
    device = devkit.empty(N, "float32", dev)
    one = devkit.asarray(np.ones(N, np.float32), dev)
    with stream.capture(mode, fuse=fuse) as graph:
        device.buffer.copy_from_host(source, stream=stream)
        result = op("Relu", op("Add", device, one, stream=stream), stream=stream)
        result.buffer.copy_to_host(landing.view(np.uint8), stream=stream)
        del result  # read by the copy: written by a fused capture too
    for seed in (2, 3):
        source[:] = values(seed)
        graph.launch(stream)
        stream.synchronize()
        np.testing.assert_allclose(landing, np.maximum(values(seed) + 1, 0), rtol=1e-6 if fuse else 0)
    graph.destroy()


def test_a_launch_on_the_default_stream_is_complete_when_it_returns(dev, stream, mode):
    """A plan's run: host copies in, kernels, host copies out, one launch on the default stream."""
    source = values(1)
    landing = np.zeros(N, np.float32)
    device = devkit.empty(N, "float32", dev)
    half = devkit.asarray(np.full(N, -0.5, np.float32), dev)
    with stream.capture(mode) as graph:
        device.buffer.copy_from_host(source, stream=stream)
        result = op("Relu", op("Add", device, half, stream=stream), stream=stream)
        result.buffer.copy_to_host(landing.view(np.uint8), stream=stream)
    for seed in (2, 3, 4):
        source[:] = values(seed)
        graph.launch()
        np.testing.assert_array_equal(landing, np.maximum(values(seed) - 0.5, np.float32(0)))
    graph.destroy()


def test_an_error_inside_a_graph_launched_on_the_default_stream_raises_from_the_launch(dev, stream, mode):
    graph, data, indices, picked = capture_gather(dev, stream, mode)
    graph.launch()
    np.testing.assert_array_equal(picked.numpy(), data.numpy()[[0, 3, 7]])
    indices.buffer.copy_from_host(np.array([0, 99, 1], np.int64))
    for _ in range(2):  # each launch reports it: the default stream keeps no error of its own
        with pytest.raises(devkit.OutOfRangeError, match="99"):
            graph.launch()
    indices.buffer.copy_from_host(np.array([7, 0, 3], np.int64))
    graph.launch()  # good indices again: the failed launches leave nothing behind
    np.testing.assert_array_equal(picked.numpy(), data.numpy()[[7, 0, 3]])
    graph.destroy()


def test_rebind_inputs_and_outputs(dev, stream, mode):
    x, w, b = (devkit.asarray(values(i), dev) for i in range(3))
    graph, y = capture_affine(stream, mode, x, w, b)
    x2 = devkit.asarray(values(10), dev)
    y2 = devkit.zeros(N, "float32", dev)
    y.buffer.fill(0)
    assert graph.rebind(x, x2) == 1
    assert graph.rebind(y, y2) == 1
    graph.launch(stream)
    stream.synchronize()
    np.testing.assert_array_equal(y2.numpy(), affine(values(10), w.numpy(), b.numpy()))
    assert (y.numpy() == 0).all(), "the launch wrote the output it was rebound away from"
    # Rebinding again (after launches) and by slot, into a buffer at an offset.
    big = devkit.zeros(3 * N, "float32", dev)
    big.buffer.copy_from_host(np.concatenate([values(20)] * 3))
    assert graph.rebind(0, big.buffer, offset=N * 4) == 1  # slot 0: the first Add's first input
    graph.launch(stream)
    stream.synchronize()
    np.testing.assert_array_equal(y2.numpy(), affine(values(20), w.numpy(), b.numpy()))
    graph.destroy()


def test_rebind_of_a_captured_view_moves_with_its_array(dev, stream, mode):
    """A kernel that read a view of x reads the same view of the new array."""
    base = devkit.asarray(np.arange(2 * N, dtype=np.float32), dev)
    one = devkit.asarray(np.ones(N, np.float32), dev)
    with stream.capture(mode) as graph:
        y = op("Add", base[N:], one, stream=stream)
    replacement = devkit.asarray(-np.arange(2 * N, dtype=np.float32), dev)
    assert graph.rebind(base, replacement) == 1
    graph.launch(stream)
    stream.synchronize()
    np.testing.assert_array_equal(y.numpy(), -np.arange(N, 2 * N, dtype=np.float32) + 1)
    graph.destroy()


def test_rebind_errors(dev, stream, mode):
    x, w, b = (devkit.asarray(values(i), dev) for i in range(3))
    graph, y = capture_affine(stream, mode, x, w, b)
    with pytest.raises(devkit.OutOfRangeError, match="slot 99 does not exist: the graph has 8"):
        graph.rebind(99, x)
    small = devkit.empty(N - 1, "float32", dev)
    with pytest.raises(devkit.OutOfRangeError, match=r"slot 0 reaches bytes \[0, 1028\) of the 1024-byte"):
        graph.rebind(0, small.buffer)
    with pytest.raises(ValueError, match=r"slot 0 has shape \(257,\).*the new array has \(256,\)"):
        graph.rebind(0, small)
    with pytest.raises(ValueError, match="no captured tensor of this graph lies in"):
        graph.rebind(small, small)
    graph.destroy()
    with pytest.raises(ValueError, match="destroyed"):
        graph.rebind(0, x)


def test_raw_rebind_checks_the_memory(plugin, dev, stream, native):
    x, w, b = (devkit.asarray(values(i), dev) for i in range(3))
    graph, y = capture_affine(stream, native, x, w, b)
    small = devkit.empty(4, "float32", dev)
    status = plugin.api.graph_rebind(dev.index, graph._handle, 0, small.buffer.handle, 0)
    assert status == C.DK_OUT_OF_RANGE
    assert plugin.api.graph_rebind(dev.index, graph._handle, 8, x.buffer.handle, 0) == C.DK_OUT_OF_RANGE
    assert plugin.api.graph_rebind(dev.index, ffi.NULL, 0, x.buffer.handle, 0) == C.DK_INVALID_ARGUMENT
    graph.destroy()
    assert plugin.api.graph_destroy(dev.index, ffi.NULL) == C.DK_OK


def test_calls_refused_while_capturing(dev, stream, mode):
    other_graph, _ = capture_affine(stream, mode, *(devkit.asarray(values(i), dev) for i in range(3)))
    refused = devkit.FailedPreconditionError
    with stream.capture(mode) as graph:
        with pytest.raises(refused, match="capturing"):
            stream.synchronize()
        with pytest.raises(refused, match="capturing"):
            stream.query()
        with pytest.raises(refused, match="capturing"):
            stream.add_callback(lambda: None)
        with pytest.raises(refused, match="capturing"):
            dev.synchronize()
        with pytest.raises(refused, match="capturing"):
            other_graph.launch(stream)
        with pytest.raises(refused, match="already capturing"):
            with stream.capture(mode):
                pass
        with pytest.raises(refused, match="still being captured"):
            graph.launch()
    # Nothing was recorded by the refused calls, and the stream works again.
    graph.launch(stream)
    stream.synchronize()
    graph.destroy()
    other_graph.destroy()


def test_raw_calls_refused_while_capturing(plugin, dev, stream, native):
    """Through the table: each refused call answers DK_FAILED_PRECONDITION."""
    api, index, handle = plugin.api, dev.index, stream.handle
    memory = devkit.empty(16, "uint8", dev)
    with stream.capture(native):
        assert api.stream_synchronize(index, handle) == C.DK_FAILED_PRECONDITION
        assert api.stream_query(index, handle) == C.DK_FAILED_PRECONDITION
        assert api.stream_destroy(index, handle) == C.DK_FAILED_PRECONDITION
        assert api.device_synchronize(index) == C.DK_FAILED_PRECONDITION
        assert api.mem_free(index, memory.buffer.handle) == C.DK_FAILED_PRECONDITION
        assert api.graph_begin_capture(index, handle) == C.DK_FAILED_PRECONDITION
        if plugin.has("mem_alloc_async"):
            out = ffi.new("DK_Mem *")
            assert api.mem_alloc_async(index, 16, handle, out) == C.DK_FAILED_PRECONDITION
        assert api.graph_begin_capture(index, ffi.NULL) == C.DK_INVALID_ARGUMENT
    graph_out, slots = ffi.new("DK_Graph *"), ffi.new("size_t *")
    assert api.graph_end_capture(index, handle, graph_out, slots) == C.DK_FAILED_PRECONDITION
    memory.buffer.free()  # allowed again


@pytest.mark.parametrize("fuse", [False, True], ids=["capture", "fused"])
def test_error_inside_a_launched_graph_is_sticky_on_its_stream(dev, stream, mode, fuse):
    graph, data, indices, picked = capture_gather(dev, stream, mode, fuse)
    assert not fuse or graph.fusion.groups == ([["Mul", "Add"]] if fuses(dev) else [])
    graph.launch(stream)
    stream.synchronize()
    np.testing.assert_array_equal(picked.numpy(), data.numpy()[[0, 3, 7]])
    indices.buffer.copy_from_host(np.array([0, 99, 1], np.int64))
    graph.launch(stream)
    for _ in range(2):  # sticky: reported again
        with pytest.raises(devkit.OutOfRangeError, match="99"):
            stream.synchronize()
    graph.destroy()


@pytest.mark.parametrize("fuse", [False, True], ids=["capture", "fused"])
def test_destroy_with_a_launch_pending_and_memory_back_to_baseline(dev, mode, fuse):
    free_before = dev.mem_get_info()[0]
    x, w, b = (devkit.asarray(values(i), dev) for i in range(3))
    with dev.create_stream() as s:
        with s.capture(mode, fuse=fuse) as graph:
            y = op("Relu", op("Add", op("Add", x, w, stream=s), b, stream=s), stream=s)
            scratch = devkit.empty(4096, "uint8", dev, stream=s)
            del scratch  # freed during the capture: released when it ends
        gate = threading.Event()
        s.add_callback(lambda: gate.wait(30))
        graph.launch(s)
        graph.destroy()  # the pending launch still completes
        graph.destroy()  # twice is harmless
        gate.set()
        s.synchronize()
        np.testing.assert_allclose(y.numpy(), affine(x.numpy(), w.numpy(), b.numpy()), rtol=1e-6 if fuse else 0)
        with pytest.raises(ValueError, match="destroyed"):
            graph.launch(s)
    del x, w, b, y, graph
    dev.synchronize()
    assert dev.mem_get_info()[0] == free_before


def test_a_failed_capture_block_leaves_nothing_behind(dev, stream, mode):
    x = devkit.asarray(values(0), dev)
    with pytest.raises(RuntimeError, match="in the block"):
        with stream.capture(mode):
            op("Relu", x, stream=stream)
            raise RuntimeError("in the block")
    assert stream.capturing is None
    stream.synchronize()  # no longer capturing


# -- fused captures (stream.capture(fuse=True), docs/fusion.md) ----------------------
# The host records the block and fuses it when the block ends: the Arrays still
# referenced then are outputs, the others may be fused away. A plugin without
# the codegen section gets the same graph unfused. A fused kernel may reorder
# float work (contract a multiply-add): values agree to float32 rounding.

def fuses(dev) -> bool:
    return dev.plugin.has_codegen


def test_a_fused_capture_keeps_the_referenced_arrays_and_fuses_the_rest(dev, stream, mode):
    require_kernels(dev, "Add", "Mul", "Relu", "Exp")
    x, w, b = (devkit.asarray(values(i), dev) for i in range(3))
    allocated = devkit.memory_stats(dev)["allocated_bytes"]
    with stream.capture(mode, fuse=True) as graph:
        kept = op("Add", x, w, stream=stream)
        dropped = op("Add", kept, b, stream=stream)
        y = op("Relu", op("Mul", dropped, dropped, stream=stream), stream=stream)
        op("Exp", y, stream=stream)  # nothing can read it
        del dropped
    assert graph.fuse and graph.fusion.groups == ([["Add", "Add", "Mul", "Relu", "Exp"]] if fuses(dev) else [])
    # Fused: one kernel, slots x, w, b, kept, y. Unfused: every call's tensors, in capture order.
    assert graph.num_slots == (5 if fuses(dev) else 3 + 3 + 3 + 2 + 2)
    # The fused-away values' memory went back when the capture ended: only kept and y stay.
    left = devkit.memory_stats(dev)["allocated_bytes"] - allocated
    assert left == (2 if fuses(dev) else 5) * N * 4
    stream.synchronize()
    for seed in (5, 6):  # every launch writes every output
        x.buffer.copy_from_host(values(seed))
        graph.launch(stream)
        stream.synchronize()
        h = values(seed) + w.numpy()
        np.testing.assert_allclose(kept.numpy(), h, rtol=1e-6)
        np.testing.assert_allclose(y.numpy(), np.maximum((h + b.numpy()) ** 2, 0), rtol=1e-5)
    graph.destroy()


def test_a_fused_capture_reads_views_of_its_values_from_memory(dev, stream, mode):
    """A view of an intermediate (here its halves) keeps it in memory, after its kernel."""
    require_kernels(dev, "Add", "Exp", "Mul", "Sub")
    x = devkit.asarray(values(0, 2 * N), dev)
    one = devkit.asarray(np.ones(2 * N, np.float32), dev)
    with stream.capture(mode, fuse=True) as graph:
        t = op("Exp", op("Add", x, one, stream=stream), stream=stream)
        y = op("Sub", op("Mul", t[:N], t[N:], stream=stream), t[N:], stream=stream)
        del t
    graph.launch(stream)
    stream.synchronize()
    e = np.exp(x.numpy() + 1)
    np.testing.assert_allclose(y.numpy(), e[:N] * e[N:] - e[N:], rtol=1e-5)
    graph.destroy()


def test_rebind_maps_through_the_fused_calls(dev, stream, mode):
    x, w, b = (devkit.asarray(values(i), dev) for i in range(3))
    with stream.capture(mode, fuse=True) as graph:
        y = op("Relu", op("Add", op("Add", x, w, stream=stream), b, stream=stream), stream=stream)
    x2, y2 = devkit.asarray(values(10), dev), devkit.zeros(N, "float32", dev)
    y.buffer.fill(0)
    assert graph.rebind(x, x2) == 1 and graph.rebind(y, y2) == 1
    graph.launch(stream)
    stream.synchronize()
    np.testing.assert_allclose(y2.numpy(), affine(values(10), w.numpy(), b.numpy()), rtol=1e-6)
    assert (y.numpy() == 0).all(), "the launch wrote the output it was rebound away from"
    big = devkit.zeros(3 * N, "float32", dev)
    big.buffer.copy_from_host(np.concatenate([values(20)] * 3))
    assert graph.rebind(0, big.buffer, offset=N * 4) == 1  # slot 0: x, the first call's first input
    graph.launch(stream)
    stream.synchronize()
    np.testing.assert_allclose(y2.numpy(), affine(values(20), w.numpy(), b.numpy()), rtol=1e-6)
    with pytest.raises(devkit.OutOfRangeError, match=f"slot 99 does not exist: the graph has "
                                                     f"{4 if fuses(dev) else 8}"):
        graph.rebind(99, x)
    graph.destroy()


def test_a_failed_fused_capture_block_leaves_nothing_behind(dev, stream, mode):
    require_kernels(dev, "Exp", "Relu")
    x = devkit.asarray(values(0), dev)
    allocated = devkit.memory_stats(dev)["allocated_bytes"]
    with pytest.raises(RuntimeError, match="in the block"):
        with stream.capture(mode, fuse=True):
            op("Relu", op("Exp", x, stream=stream), stream=stream)
            raise RuntimeError("in the block")
    assert stream.capturing is None
    stream.synchronize()  # no longer capturing
    assert devkit.memory_stats(dev)["allocated_bytes"] == allocated
