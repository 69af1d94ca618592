"""The cuda plugin's graph section (devkit/backends/cuda/graph.py) on the
stand-in CuPy of test_cuda_kernels: what is captured as a CUDA graph and
what runs directly at each launch, rebinding and its cache of captured
binding sets, the index check's error as the launch stream's sticky error,
and the calls a capturing stream refuses."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from devkit.abi import C, ffi
from devkit.backends.cuda import graph as cuda_graph
from devkit.backends.cuda.table import device_table as cuda_table
from devkit.backends.cuda.runtime import unavailable_reason
from devkit.backends.support.boundary import PluginError
from devkit.backends.support.graph_capture import lookup

from .test_cuda_kernels import _call, on_a_fake_cuda

REASON = unavailable_reason()
S, T = 0x5EED, 0x7EED
F32, I64 = C.DK_DTYPE_FLOAT32, C.DK_DTYPE_INT64


def _stream(value):
    return ffi.cast("DK_Stream", value)


def _mem(pointer):
    return ffi.cast("DK_Mem", pointer)


def _end(stream=S):
    graph, slots = ffi.new("DK_Graph *"), ffi.new("size_t *")
    cuda_table.graph_end_capture(0, _stream(stream), graph, slots)
    return graph[0], slots[0]


@pytest.fixture
def streams(monkeypatch, tmp_path):
    fake, device, table = on_a_fake_cuda(monkeypatch, tmp_path)
    device.streams.update({S, T})
    return fake, device, table


def _captured_add(fake, device, table):
    cuda_table.graph_begin_capture(0, _stream(S))
    status, (x, y), (out,) = _call(table, device, "Add", F32, [(3, 4), (4,)], [(3, 4)], S)
    assert status == C.DK_OK
    return (x, y, out), *_end()


def test_a_captured_add_is_one_cuda_graph_launched_on_any_stream(streams):
    fake, device, table = streams
    before = cuda_graph.stats.native_steps
    (x, y, out), graph, slots = _captured_add(fake, device, table)
    # Nothing ran during the capture; the call's shape table was made device-resident then.
    assert slots == 3 and fake.launches == [] and fake.uploads == [] and fake.instantiated == 0
    cuda_table.graph_launch(0, graph, _stream(S))
    cuda_table.graph_launch(0, graph, _stream(T))
    cuda_table.graph_launch(0, graph, ffi.NULL)
    assert fake.instantiated == 1  # captured once, at the first launch
    assert [launch.stream for _, launch in zip(range(3), fake.launches)] == [S, T, device.null_stream]
    assert [stream for _, stream in fake.graph_launches] == [S, T, device.null_stream]
    assert fake.synced == [device.null_stream]  # the NULL stream's launch completes before it returns
    launch = fake.launches[1]
    assert launch.name == "k_Add" and [int(a) for a in launch.args[:6]] == [x, 0, y, 0, out, 0]
    meta = int(launch.args[7])
    assert list(np.frombuffer(bytes(fake.memory[meta]), np.int64)) == [3, 4, 4, 1, 0, 1, 4, 1]
    assert fake.freed == []  # no stream-ordered temporaries: the graph owns its tables
    assert cuda_graph.stats.native_steps - before == 3
    cuda_table.graph_destroy(0, graph)
    assert meta not in fake.memory and not device.graphs


def test_a_rebind_captures_once_per_binding_set(streams):
    fake, device, table = streams
    (x, _, _), graph, _ = _captured_add(fake, device, table)
    other = int(ffi.cast("uintptr_t", device.alloc(12 * 4)))
    cuda_table.graph_launch(0, graph, _stream(S))
    for pointer in (other, x, other, x):
        cuda_table.graph_rebind(0, graph, 0, _mem(pointer), 0)
        cuda_table.graph_launch(0, graph, _stream(S))
        assert int(fake.launches[-1].args[0]) == pointer
    assert fake.instantiated == 2  # the second set's graph is kept: alternating re-captures nothing
    with pytest.raises(PluginError, match="exceeds the 8-byte allocation") as info:
        cuda_table.graph_rebind(0, graph, 0, device.alloc(8), 0)
    assert info.value.status == C.DK_OUT_OF_RANGE
    with pytest.raises(PluginError, match="slot 3 does not exist: the graph has 3 slot") as info:
        cuda_table.graph_rebind(0, graph, 3, _mem(x), 0)
    assert info.value.status == C.DK_OUT_OF_RANGE
    cuda_table.graph_launch(0, graph, _stream(S))  # the refused rebinds changed nothing
    assert int(fake.launches[-1].args[0]) == x and fake.instantiated == 2


def test_the_binding_cache_is_bounded_and_frees_what_it_evicts(streams):
    fake, device, table = streams
    (x, _, _), graph, _ = _captured_add(fake, device, table)
    cuda_table.graph_launch(0, graph, _stream(S))
    tables = len(fake.memory)
    for _ in range(3 * cuda_graph.CACHED_BINDINGS):
        cuda_table.graph_rebind(0, graph, 0, device.alloc(12 * 4), 0)
        cuda_table.graph_launch(0, graph, _stream(S))
    g = lookup(device, graph)
    assert len(g.instances) == cuda_graph.CACHED_BINDINGS
    assert len(g.nodes[0].variants) == cuda_graph.CACHED_BINDINGS
    executables = [value[0] for i in g.instances.values() for kind, value in i.pieces if kind == "graph"]
    assert len(executables) == cuda_graph.CACHED_BINDINGS and all(e in fake.graphs for e in executables)
    # The new inputs, and one shape table per kept set (the first set's was evicted with the others').
    assert len(fake.memory) == tables - 1 + 3 * cuda_graph.CACHED_BINDINGS + cuda_graph.CACHED_BINDINGS
    for _ in range(5):  # rebinds without launches keep the kept sets' tables and the current one's
        cuda_table.graph_rebind(0, graph, 0, device.alloc(12 * 4), 0)
    assert len(g.nodes[0].variants) == cuda_graph.CACHED_BINDINGS + 1
    cuda_table.graph_destroy(0, graph)
    assert not any(e in fake.graphs for e in executables)


def _captured_gather(device, table):
    cuda_table.graph_begin_capture(0, _stream(S))
    status, (data, indices), _ = _call(table, device, "Gather", F32, [(4, 3), (2,)], [(2, 3)], S,
                                       input_keys=[F32, I64], ints={"axis": 0})
    assert status == C.DK_OK
    return indices, *_end()


def _write(fake, pointer, values):
    fake.memory[pointer][:values.nbytes] = values.tobytes()


def test_an_index_check_runs_between_cuda_graphs_at_each_launch(streams):
    fake, device, table = streams
    before = cuda_graph.stats.checks
    indices, graph, slots = _captured_gather(device, table)
    assert slots == 3
    _write(fake, indices, np.array([3, -4], np.int64))
    cuda_table.graph_launch(0, graph, _stream(S))
    cuda_table.stream_synchronize(0, _stream(S))
    g = lookup(device, graph)
    kinds = [kind for kind, _ in g._instance().pieces]
    assert kinds == ["graph", cuda_graph.CHECK, "graph"]  # the check waits for the stream: not capturable
    assert S in fake.synced and cuda_graph.stats.checks - before == 1
    # Indices changed after the capture are checked at the launch that reads them.
    _write(fake, indices, np.array([1, 4], np.int64))
    with pytest.raises(PluginError, match=r"Gather: index 4 \(element 1 of indices\) is out of range") as info:
        cuda_table.graph_launch(0, graph, ffi.NULL)
    assert info.value.status == C.DK_OUT_OF_RANGE
    cuda_table.graph_launch(0, graph, _stream(S))  # on a stream: its sticky error, the rest still runs
    assert fake.launches[-1].stream == S and fake.launches[-1].name != "k_check_indices"
    for report in (cuda_table.stream_synchronize, cuda_table.stream_query, cuda_table.stream_synchronize):
        with pytest.raises(PluginError, match="index 4") as info:
            report(0, _stream(S))
        assert info.value.status == C.DK_OUT_OF_RANGE
    with pytest.raises(PluginError, match="index 4"):
        cuda_table.device_synchronize(0)
    events = ffi.new("DK_Event[2]")
    for i, stream in enumerate((S, T)):  # an event recorded after the failure reports it; elsewhere not
        cuda_table.event_create(0, 0, events + i)
        cuda_table.event_record(0, events[i], _stream(stream))
    for report in (cuda_table.event_query, cuda_table.event_synchronize):
        with pytest.raises(PluginError, match="index 4"):
            report(0, events[0])
        assert report(0, events[1]) in (None, C.DK_OK)
    cuda_table.stream_destroy(0, _stream(S))  # the sticky error goes with its stream
    assert S not in device.failures
    _write(fake, indices, np.array([0, 0], np.int64))  # the check re-arms: a good launch elsewhere passes
    cuda_table.graph_launch(0, graph, _stream(T))
    cuda_table.stream_synchronize(0, _stream(T))
    cuda_table.graph_destroy(0, graph)


def test_host_copies_and_events_run_at_each_launch_and_device_copies_are_captured(streams):
    fake, device, table = streams
    a, b = device.alloc(16), device.alloc(16)
    host = np.arange(4, dtype=np.int32)
    event = ffi.new("DK_Event *")
    cuda_table.event_create(0, 0, event)
    e = int(ffi.cast("uintptr_t", event[0]))
    cuda_table.graph_begin_capture(0, _stream(S))
    cuda_table.copy_h2d(0, a, 0, ffi.cast("void *", host.ctypes.data), 16, _stream(S))
    cuda_table.copy_d2d(0, b, 0, a, 0, 16, _stream(S))
    cuda_table.memset(0, a, 0, 0, 16, _stream(S))
    cuda_table.copy_d2d(0, b, 4, b, 0, 8, _stream(S))  # overlapping: through a staging buffer the graph owns
    cuda_table.event_record(0, event[0], _stream(S))
    graph, slots = _end()
    assert slots == 0 and fake.uploads == [] and e not in device.recorded
    before = cuda_graph.stats.direct_steps
    host[:] = [5, 6, 7, 8]  # read at the launch
    cuda_table.graph_launch(0, graph, _stream(T))
    g = lookup(device, graph)
    assert [kind for kind, _ in g._instance().pieces] == [cuda_graph.DIRECT, "graph", cuda_graph.DIRECT]
    assert cuda_graph.stats.direct_steps - before == 2 and e in device.recorded
    assert list(np.frombuffer(bytes(fake.memory[int(ffi.cast("uintptr_t", b))]), np.int32)) == [5, 5, 6, 8]
    assert not any(fake.memory[int(ffi.cast("uintptr_t", a))])
    assert fake.launches[-1].name == "eventRecord" and fake.launches[-1].stream == T
    cuda_table.graph_destroy(0, graph)


def test_a_capturing_stream_refuses_what_would_wait_for_or_free_its_work(streams):
    fake, device, table = streams
    mem = device.alloc(16)
    cuda_table.graph_begin_capture(0, _stream(S))
    out = ffi.new("DK_Mem *")
    refused = [
        lambda: cuda_table.graph_begin_capture(0, _stream(S)),
        lambda: cuda_table.stream_synchronize(0, _stream(S)),
        lambda: cuda_table.stream_query(0, _stream(S)),
        lambda: cuda_table.stream_destroy(0, _stream(S)),
        lambda: cuda_table.stream_add_callback(0, _stream(S), ffi.cast("DK_HostFn", 1), ffi.NULL),
        lambda: cuda_table.mem_alloc_async(0, 16, _stream(S), out),
        lambda: cuda_table.mem_free_async(0, mem, _stream(S)),
        lambda: cuda_table.device_synchronize(0),
        lambda: cuda_table.mem_free(0, mem),
    ]
    for call in refused:
        with pytest.raises(PluginError, match="is capturing a graph; this call is refused") as info:
            call()
        assert info.value.status == C.DK_FAILED_PRECONDITION
    cuda_table.mem_free_async(0, ffi.NULL, _stream(S))  # NULL is accepted and ignored, as the header has it
    cuda_table.stream_synchronize(0, _stream(T))  # other streams are not affected
    cuda_table.mem_alloc(0, 16, out)              # mem_alloc is allowed
    graph, _ = _end()
    with pytest.raises(PluginError, match="is not capturing") as info:
        _end()
    assert info.value.status == C.DK_FAILED_PRECONDITION
    with pytest.raises(PluginError, match="the default stream cannot capture") as info:
        cuda_table.graph_begin_capture(0, ffi.NULL)
    assert info.value.status == C.DK_INVALID_ARGUMENT
    cuda_table.graph_begin_capture(0, _stream(T))
    with pytest.raises(PluginError, match=f"stream {T:#x} is capturing") as info:
        cuda_table.graph_launch(0, graph, _stream(T))
    assert info.value.status == C.DK_FAILED_PRECONDITION
    _end(T)
    cuda_table.graph_destroy(0, graph)
    with pytest.raises(PluginError, match="is not a live graph") as info:
        cuda_table.graph_launch(0, graph, _stream(S))
    assert info.value.status == C.DK_INVALID_ARGUMENT
    cuda_table.graph_destroy(0, ffi.NULL)


def test_memory_freed_under_a_graph_fails_its_next_launch(streams):
    fake, device, table = streams
    (x, _, _), graph, _ = _captured_add(fake, device, table)
    cuda_table.mem_free(0, _mem(x))
    with pytest.raises(PluginError, match=f"uses memory {x:#x}, which has been freed") as info:
        cuda_table.graph_launch(0, graph, _stream(S))
    assert info.value.status == C.DK_INVALID_ARGUMENT and fake.launches == []
    cuda_table.graph_destroy(0, graph)


def test_a_run_cuda_refuses_to_capture_is_replayed_step_by_step(streams):
    fake, device, table = streams
    _, graph, _ = _captured_add(fake, device, table)
    fake.uncapturable = True
    failures = cuda_graph.stats.capture_failures
    cuda_table.graph_launch(0, graph, _stream(S))
    cuda_table.graph_launch(0, graph, _stream(S))  # the replay is kept for the binding set
    assert cuda_graph.stats.capture_failures - failures == 1 and fake.instantiated == 0
    assert not fake.capturing and not fake.graphs  # the broken capture was ended and its graph destroyed
    assert [(launch.name, launch.stream) for launch in fake.launches] == [("k_Add", S)] * 2
    cuda_table.graph_destroy(0, graph)



def test_a_capture_cuda_invalidates_at_its_end_is_replayed_too(streams, monkeypatch):
    fake, device, table = streams
    _, graph, _ = _captured_add(fake, device, table)
    runtime = fake.cuda.runtime
    original = runtime.streamEndCapture

    def invalidated(stream):
        original(stream)
        raise runtime.CUDARuntimeError(901, "cudaErrorStreamCaptureInvalidated")

    monkeypatch.setattr(runtime, "streamEndCapture", invalidated)
    failures = cuda_graph.stats.capture_failures
    cuda_table.graph_launch(0, graph, _stream(S))
    assert cuda_graph.stats.capture_failures - failures == 1 and fake.instantiated == 0
    assert not fake.capturing and [(launch.name, launch.stream) for launch in fake.launches] == [("k_Add", S)]
    cuda_table.graph_destroy(0, graph)

def test_a_captured_matmul_runs_cublas_between_the_cuda_graphs(streams):
    """CuPy's cuBLAS bindings refuse a capturing stream: the product is a
    direct step; the Add after it is still captured."""
    fake, device, table = streams
    direct, native = cuda_graph.stats.direct_steps, cuda_graph.stats.native_steps
    cuda_table.graph_begin_capture(0, _stream(S))
    status, _, (y,) = _call(table, device, "MatMul", F32, [(4, 6), (6, 5)], [(4, 5)], S)
    assert status == C.DK_OK
    status, _, _ = _call(table, device, "Add", F32, [(4, 5), (5,)], [(4, 5)], S)
    assert status == C.DK_OK
    graph, _ = _end()
    assert fake.gemms == []
    cuda_table.graph_launch(0, graph, _stream(T))
    (gemm,) = fake.gemms
    assert gemm[16] == y and fake.cublas_stream == T and fake.instantiated == 1
    assert [launch.name for launch in fake.launches] == ["k_Add"] and fake.launches[0].stream == T
    assert cuda_graph.stats.direct_steps - direct == 1 and cuda_graph.stats.native_steps - native == 1
    cuda_table.graph_destroy(0, graph)


def test_the_host_captures_natively_through_the_plugins_table(tmp_path):
    """devkit's Stream.capture on the cuda plugin loaded on the stand-in CuPy (a
    process of its own: a loaded plugin stays loaded): the plugin's graph section
    records, a launch runs one CUDA graph, refusals arrive as the host's errors."""
    code = textwrap.dedent("""
        import sys
        sys.path.insert(0, "tests")
        import numpy as np
        import test_cuda_kernels
        fake = sys.modules["cupy"] = test_cuda_kernels._FakeCuPy()
        from devkit.backends.cuda import runtime
        runtime._cupy = fake  # on a GPU machine test_cuda_kernels' REASON imported the real CuPy
        import devkit
        dev = devkit.device("cuda:0")
        x = devkit.asarray(np.arange(8, dtype=np.float32), dev)
        marker = devkit.zeros(16, "uint8", dev)
        with dev.create_stream() as stream:
            with stream.capture() as graph:
                marker.buffer.fill(7, stream=stream)
                y = devkit.run_op("Add", [x, x], stream=stream)[0]
                try:
                    stream.synchronize()
                except devkit.errors.FailedPreconditionError as exc:
                    print("refused:", "is capturing a graph" in str(exc))
            print("native:", graph.native, "slots:", graph.num_slots, "ran:", marker.numpy().max())
            graph.launch(stream)
            graph.launch(stream)
            stream.synchronize()
            print("marker:", marker.numpy().min(), "graphs:", fake.instantiated, len(fake.graph_launches),
                  "adds:", sum(launch.name == "k_Add_1d" for launch in fake.launches))
            other = devkit.asarray(np.ones(8, np.float32), dev)
            print("moved:", graph.rebind(x, other))
            graph.launch(stream)
            stream.synchronize()
            print("rebound:", int(fake.launches[-1].args[0]) == int(devkit.abi.ffi.cast("uintptr_t",
                  other.buffer._allocation.handle)), "graphs:", fake.instantiated)
            graph.destroy()
    """)
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                            env={**os.environ, "DEVKIT_CACHE_DIR": str(tmp_path)})
    assert result.returncode == 0, result.stderr
    assert result.stdout.split("\n")[:-1] == [
        "refused: True", "native: True slots: 3 ran: 0", "marker: 7 graphs: 1 2 adds: 2", "moved: 2",
        "rebound: True graphs: 2"]


# -- on a GPU (ci/gpu-check.sh); elsewhere skipped with the plugin's reason -----------------

@pytest.mark.skipif(REASON is not None, reason=f"cuda plugin unavailable: {REASON}")
def test_captured_kernels_run_as_cuda_graphs_on_the_gpu():
    import devkit

    dev = devkit.device("cuda:0")
    host = np.arange(6, dtype=np.float32)
    x, data = devkit.asarray(host, dev), devkit.asarray(np.arange(8, dtype=np.float32) * 2, dev)
    indices = devkit.asarray(np.array([0, 3, 7], np.int64), dev)
    before = dataclasses.replace(cuda_graph.stats)
    with dev.create_stream() as stream:
        with stream.capture("native") as graph:
            y = devkit.run_op("Add", [x, x], stream=stream)[0]
            picked = devkit.run_op("Gather", [data, indices], stream=stream)[0]
        graph.launch(stream)
        stream.synchronize()
        np.testing.assert_array_equal(y.numpy(), host + host)
        np.testing.assert_array_equal(picked.numpy(), [0, 6, 14])
        assert graph.rebind(x, devkit.asarray(np.full(6, 5, np.float32), dev)) == 2
        graph.launch(stream)
        stream.synchronize()
        np.testing.assert_array_equal(y.numpy(), np.full(6, 10, np.float32))
        graph.rebind(indices, devkit.asarray(np.array([0, 3, 8], np.int64), dev))
        graph.launch(stream)
        with pytest.raises(devkit.errors.OutOfRangeError, match="index 8"):
            stream.synchronize()
        graph.destroy()
    assert cuda_graph.stats.cuda_graphs_instantiated - before.cuda_graphs_instantiated >= 3
    assert cuda_graph.stats.checks - before.checks == 3 and cuda_graph.stats.capture_failures == before.capture_failures
