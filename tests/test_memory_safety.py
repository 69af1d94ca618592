"""The runtime's memory layer: nothing the public API does hands a plugin memory
that pending work still uses, sizes are checked before they reach C, views keep
to their bounds, and the caching allocator reuses blocks only where it is safe.

Each case that crashed the process before (issue #17) runs in its own
interpreter, so a segfault fails the case instead of killing pytest; those run
under both allocators ("caching" and "none", which frees through the plugin's
mem_free_async).
"""

from __future__ import annotations

import inspect
import textwrap
import threading

import numpy as np
import pytest

import devkit
from devkit import driver, runtime
from tests.conftest import run_python

class Gate:
    """Holds a stream until opened, so work queued behind it is pending for certain."""

    def __init__(self, stream):
        self.event = threading.Event()
        stream.add_callback(lambda: self.event.wait(30))

    def open(self):
        self.event.set()


def fill_and_read_behind_a_gate(stream, buffer, value):
    """Queue a fill and a read-back behind a closed gate: (gate, host copy once it opens)."""
    gate = Gate(stream)
    buffer.fill(value, stream=stream)
    return gate, buffer.copy_to_host(stream=stream)


# Shared by the subprocess cases: Gate (above); `scribble` allocates and overwrites
# memory on the default stream, which would land in a block released too early.
PRELUDE = """
import threading
import numpy as np
import devkit
from devkit import ops

dev = devkit.device("cpu:0")
""" + inspect.getsource(Gate) + inspect.getsource(fill_and_read_behind_a_gate) + """
def open_and_check(gate, stream, out, value):
    # scribble over memory released too early (if any), then let the work run and check it
    scribble(len(out))
    gate.open()
    stream.synchronize()
    assert np.all(out == value)

def scribble(nbytes, times=4):
    for _ in range(times):
        devkit.empty((nbytes,), "uint8", dev).buffer.fill(0xEE)

def freed(buffer):
    try:
        buffer.handle
    except ValueError as exc:
        return "freed" in str(exc)
    return False

def at_baseline():
    devkit.empty_cache()
    stats = devkit.memory_stats(dev)
    assert stats["allocated_bytes"] == 0 and stats["reserved_bytes"] == 0, stats
    assert dev.mem_get_info()[0] == dev.mem_get_info()[1], dev.mem_get_info()
"""

CRASH_CASES = {
    "free-with-pending-work": """
        stream = dev.create_stream()
        buffer = dev.alloc(1 << 20)
        gate, out = fill_and_read_behind_a_gate(stream, buffer, 7)
        buffer.free()
        assert freed(buffer)
        open_and_check(gate, stream, out, 7)
    """,
    "with-block-with-pending-work": """
        stream = dev.create_stream()
        with dev.alloc(1 << 20) as buffer:
            gate, out = fill_and_read_behind_a_gate(stream, buffer, 9)
        open_and_check(gate, stream, out, 9)
    """,
    "free-op-output-before-its-stream-ran": """
        stream = dev.create_stream()
        x = devkit.asarray(np.arange(-(1 << 17), 1 << 17, dtype=np.float32), dev)
        gate = Gate(stream)
        y = ops.Relu(x, stream=stream)
        out = y.buffer.copy_to_host(stream=stream)
        y.buffer.free()
        x.buffer.free()
        scribble(1 << 20)
        gate.open()
        stream.synchronize()
        expected = np.maximum(np.arange(-(1 << 17), 1 << 17, dtype=np.float32), 0)
        np.testing.assert_array_equal(out.view(np.float32), expected)
    """,
    "free-async-all-reduce-buffer": """
        from devkit import distributed
        comm = distributed.Communicator(dev, 0, 1, distributed.new_unique_id("cpu"))
        stream = dev.create_stream()
        x = devkit.asarray(np.arange(1 << 16, dtype=np.float32), dev)
        gate = Gate(stream)
        comm.all_reduce(x, stream=stream)
        out = x.buffer.copy_to_host(stream=stream)
        x.buffer.free()
        scribble(1 << 18)
        gate.open()
        stream.synchronize()
        np.testing.assert_array_equal(out.view(np.float32), np.arange(1 << 16, dtype=np.float32))
        comm.destroy()
    """,
    "free-inside-a-collective-group": """
        from devkit import distributed
        comm = distributed.Communicator(dev, 0, 1, distributed.new_unique_id("cpu"))
        x = devkit.asarray(np.full(1 << 16, 3, np.int32), dev)
        out = devkit.empty((1 << 16,), np.int32, dev)
        with comm.group():
            comm.all_reduce(x, out)
            x.buffer.free()  # the call is only issued at the group's end
            scribble(1 << 18)
        assert np.all(out.numpy() == 3)
        comm.destroy()
    """,
    "free-dlpack-export": """
        x = devkit.asarray(np.arange(1 << 16, dtype=np.float32), dev)
        host = np.from_dlpack(x)
        x.buffer.free()
        assert freed(x.buffer)
        scribble(1 << 18)
        np.testing.assert_array_equal(host, np.arange(1 << 16, dtype=np.float32))
        host[:] = 5  # writes the export's memory, still the consumer's
        scribble(1 << 18)
        assert np.all(host == 5)
        del host, x  # the consumer's deleter runs: now the memory goes back
        at_baseline()
    """,
    "free-on-another-stream-than-the-work": """
        producer, consumer = dev.create_stream(), dev.create_stream()
        buffer = dev.alloc(1 << 20)
        gate, out = fill_and_read_behind_a_gate(producer, buffer, 4)
        buffer.free(consumer)  # ordered after the producer's work as well
        consumer.synchronize()
        open_and_check(gate, producer, out, 4)
    """,
    "empty-cache-waits-for-pending-work": """
        stream = dev.create_stream()
        buffer = dev.alloc(1 << 20)
        gate, out = fill_and_read_behind_a_gate(stream, buffer, 6)
        buffer.free()
        threading.Timer(0.2, gate.open).start()
        devkit.empty_cache()  # frees the block only once the stream has run past it
        stream.synchronize()
        assert np.all(out == 6)
        del buffer
        at_baseline()
    """,
    "zero-stride-array-of-2**64-elements": """
        base = devkit.asarray(np.ones(1, np.float32), dev)
        for op, extra in (("Slice", [np.array([0]), np.array([4])]), ("Pad", [np.array([0, 1])])):
            try:
                huge = devkit.Array(base.buffer, (1 << 64,), np.float32, (0,))
                getattr(ops, op)(huge, *extra)
            except devkit.OutOfMemoryError as exc:
                assert str(1 << 64) in str(exc) and "max_alloc_size" in str(exc), exc
            else:
                raise AssertionError(f"{op} took an array of 2**64 elements")
    """,
}

BOTH_ALLOCATORS = {"free-with-pending-work", "free-op-output-before-its-stream-ran",
                   "free-async-all-reduce-buffer", "free-dlpack-export",
                   "free-on-another-stream-than-the-work"}
CRASH_RUNS = [(name, allocator) for name in CRASH_CASES
              for allocator in (("caching", "none") if name in BOTH_ALLOCATORS else ("caching",))]


@pytest.mark.parametrize("name,allocator", CRASH_RUNS, ids=[f"{n}-{a}" for n, a in CRASH_RUNS])
def test_crash_case_is_clean(name, allocator):
    code = PRELUDE + textwrap.dedent(CRASH_CASES[name]) + "\nprint('clean')\n"
    result = run_python(code, env={"DEVKIT_ALLOCATOR": allocator}, timeout=90)
    assert result.returncode == 0, f"exit {result.returncode}\n{result.stdout}\n{result.stderr}"
    assert result.stdout.splitlines()[-1] == "clean"


# -- sizes ------------------------------------------------------------------------------------


@pytest.fixture
def dev():
    return devkit.device("cpu:0")


def _max_alloc(dev) -> str:
    return str(dev.properties.max_alloc_size)


@pytest.mark.parametrize("nbytes", [1 << 64, (1 << 64) + 1, 1 << 100])
def test_alloc_past_the_device_raises_oom_naming_the_size(dev, nbytes):
    with pytest.raises(devkit.OutOfMemoryError) as info:
        dev.alloc(nbytes)
    assert str(nbytes) in str(info.value) and _max_alloc(dev) in str(info.value)
    assert "max_alloc_size" in str(info.value)


@pytest.mark.parametrize("nbytes", [3.7, 3.0, "8", None])
def test_alloc_of_a_non_integer_is_a_type_error(dev, nbytes):
    with pytest.raises(TypeError, match="nbytes must be an integer"):
        dev.alloc(nbytes)


def test_negative_sizes_and_dimensions_are_value_errors(dev):
    with pytest.raises(ValueError, match="nbytes must be non-negative, got -1"):
        dev.alloc(-1)
    with pytest.raises(ValueError, match=r"dimension of shape \(3, -2\) must be non-negative, got -2"):
        devkit.empty((3, -2))
    with pytest.raises(TypeError, match="dimension of shape"):
        devkit.empty((2.5,))


HUGE_OPS = {
    "Expand": lambda x: devkit.run_op("Expand", [x, np.array([1 << 40, 1 << 40], np.int64)]),
    "Tile": lambda x: devkit.run_op("Tile", [x, np.array([1 << 62], np.int64)]),
    "Range": lambda x: devkit.run_op("Range", [np.array(0, np.int64), np.array(1 << 62, np.int64),
                                               np.array(1, np.int64)]),
    "ConstantOfShape": lambda x: devkit.run_op("ConstantOfShape", [np.array([1 << 40, 1 << 40], np.int64)]),
    "Resize": lambda x: devkit.run_op("Resize", [devkit.asarray(np.ones((1, 1, 2, 2), np.float32)), None,
                                                 np.array([1, 1, 1e30, 1e30], np.float32)]),
    "Pad": lambda x: devkit.run_op("Pad", [x, np.array([0, 1 << 62], np.int64)]),
}


@pytest.mark.parametrize("op", sorted(HUGE_OPS))
def test_op_with_a_huge_output_raises_oom_naming_the_size(dev, op):
    before = devkit.memory_stats(dev)["allocated_bytes"]
    x = devkit.asarray(np.ones(1, np.float32), dev)
    with pytest.raises(devkit.OutOfMemoryError) as info:
        HUGE_OPS[op](x)
    message = str(info.value)
    assert "max_alloc_size" in message and _max_alloc(dev) in message
    assert any(int(word) > dev.properties.max_alloc_size for word in message.split() if word.isdigit())
    del x, info
    assert devkit.memory_stats(dev)["allocated_bytes"] == before


def test_array_past_int64_bytes_raises_oom(dev):
    base = devkit.asarray(np.ones(1, np.float32), dev)
    with pytest.raises(devkit.OutOfMemoryError, match=f"{1 << 62} elements, {1 << 64} bytes"):
        devkit.Array(base.buffer, (1 << 62,), np.float32, (0,))
    with pytest.raises(ValueError, match="does not fit int64"):
        devkit.Array(base.buffer, (1, 0), np.float32, (1 << 64, 1))
    with pytest.raises(IndexError, match="array offset -4 is outside the 4-byte buffer"):
        devkit.Array(base.buffer, (0,), np.float32, offset=-4)


# -- views keep to their bounds ---------------------------------------------------------------


def test_view_copies_stay_inside_the_view(dev):
    buffer = dev.alloc(64)
    buffer.fill(1)
    view = buffer.view(16, 16)
    with pytest.raises(ValueError, match="copy_from_host: offset must be non-negative, got -16"):
        view.copy_from_host(np.zeros(16, np.uint8), offset=-16)
    with pytest.raises(IndexError, match=r"bytes \[8, 24\).*the 16-byte buffer"):
        view.copy_from_host(np.zeros(16, np.uint8), offset=8)
    head = buffer.view(0, 16)
    with pytest.raises(IndexError, match=r"copy_to_host: bytes \[16, 48\).*the 16-byte buffer"):
        head.copy_to_host(offset=16, nbytes=32)
    with pytest.raises(IndexError, match="the 16-byte buffer"):
        head.copy_to_host(np.empty(17, np.uint8))
    with pytest.raises(ValueError, match="copy_to_host: offset must be non-negative, got -1"):
        head.copy_to_host(offset=-1)
    with pytest.raises(ValueError, match="nbytes=4 but the destination holds 8 bytes"):
        head.copy_to_host(np.empty(8, np.uint8), nbytes=4)
    with pytest.raises(IndexError, match=r"view: bytes \[8, 24\)"):
        view.view(8, 16)
    assert np.all(buffer.copy_to_host() == 1), "nothing outside the views was written"
    view.copy_from_host(np.full(16, 2, np.uint8))
    assert buffer.copy_to_host().tolist() == [1] * 16 + [2] * 16 + [1] * 32


# -- the caching allocator ---------------------------------------------------------------------


@pytest.fixture
def caching():
    """cpu:1 under the caching allocator, its cache empty; the previous allocator after."""
    previous = devkit.set_allocator("caching")
    dev = devkit.device("cpu:1")
    dev.synchronize()
    devkit.empty_cache(dev)
    yield dev
    dev.synchronize()
    devkit.empty_cache(dev)
    devkit.set_allocator(previous)

def test_size_classes():
    assert [driver._size_class(n) for n in (0, 1, 512, 513, 640, 641, 1024, 1025)] == \
        [512, 512, 512, 640, 640, 768, 1024, 1280]
    assert driver._size_class((16 << 20) + 1) == 18 << 20
    for n in range(513, 1 << 22, 997):
        assert n <= driver._size_class(n) <= 1.25 * n


def test_a_freed_block_is_reused_and_counted(caching):
    dev = caching
    start = devkit.memory_stats(dev)
    a = dev.alloc(1000)
    handle = a.handle
    stats = devkit.memory_stats(dev)
    assert stats["allocated_bytes"] - start["allocated_bytes"] == 1000
    assert stats["reserved_bytes"] - start["reserved_bytes"] == 1024
    assert stats["device_allocations"] - start["device_allocations"] == 1
    a.free()
    b = dev.alloc(900)  # the same size class
    assert b.handle == handle
    stats = devkit.memory_stats(dev)
    assert stats["cache_hits"] - start["cache_hits"] == 1
    assert stats["device_allocations"] - start["device_allocations"] == 1
    assert stats["peak_allocated_bytes"] >= start["allocated_bytes"] + 1000
    c = dev.alloc(2000)  # another class: a new block
    assert c.handle != handle
    del b, c
    stats = devkit.memory_stats(dev)
    assert stats["allocated_bytes"] == start["allocated_bytes"]
    assert stats["allocations"] == start["allocations"]
    assert stats["cached_bytes"] - start["cached_bytes"] == 1024 + 2048


def test_reuse_is_stream_aware(caching):
    dev = caching
    producer, other = dev.create_stream(), dev.create_stream()
    gate = Gate(producer)
    a = dev.alloc(4096, producer)
    handle = a.handle
    a.fill(1, stream=producer)
    a.free()
    same = dev.alloc(4096, producer)  # stream order puts new work after the old: at once
    assert same.handle == handle
    same.free()
    elsewhere = [dev.alloc(4096, other), dev.alloc(4096)]  # not while the producer's work is pending
    assert handle not in [b.handle for b in elsewhere]
    gate.open()
    producer.synchronize()
    after = dev.alloc(4096, other)  # the event recorded at free time has completed
    assert after.handle == handle


def test_empty_cache_returns_memory_to_the_plugin(caching):
    dev = caching
    free_before = dev.mem_get_info()[0]
    buffers = [dev.alloc(n) for n in (100, 5000, 1 << 20, 3 << 20)]
    assert dev.mem_get_info()[0] < free_before
    del buffers
    assert dev.mem_get_info()[0] < free_before, "the blocks are cached"
    assert devkit.memory_stats(dev)["cached_bytes"] > 0
    devkit.empty_cache(dev)
    assert dev.mem_get_info()[0] == free_before
    stats = devkit.memory_stats(dev)
    assert stats["cached_bytes"] == 0 and stats["reserved_bytes"] == stats["allocated_bytes"]


def test_memory_stats_of_every_device():
    every = devkit.memory_stats()
    assert "cpu:0" in every and set(every["cpu:0"]) == set(driver._STAT_NAMES)
    assert every["cpu:0"].keys() == devkit.memory_stats("cpu:0").keys()


def test_threads_allocating_and_freeing_leave_the_counts_balanced(caching):
    dev = caching
    start = devkit.memory_stats(dev)
    shared = dev.create_stream()
    errors = []

    def work(seed):
        try:
            stream = dev.create_stream() if seed % 2 else shared
            rng = np.random.default_rng(seed)
            for _ in range(200):
                data = rng.integers(0, 255, int(rng.integers(1, 5000)), dtype=np.uint8)
                buffer = dev.alloc(data.nbytes, stream)
                buffer.copy_from_host(data, stream=stream)
                back = buffer.copy_to_host(stream=stream)
                buffer.free()
                stream.synchronize()
                assert np.array_equal(back, data)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(seed,)) for seed in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors, errors[0]
    stats = devkit.memory_stats(dev)
    assert stats["allocated_bytes"] == start["allocated_bytes"]
    assert stats["allocation_count"] - start["allocation_count"] == 800
    assert stats["free_count"] - start["free_count"] == 800


def test_out_of_memory_releases_the_cache_and_retries():
    result = run_python(textwrap.dedent("""
        import devkit
        dev = devkit.device("cpu:0")
        dev.alloc(600 << 10).free()       # cached: 640 KiB of the 1 MiB device
        b = dev.alloc(700 << 10)          # needs the cached block's room
        stats = devkit.memory_stats(dev)
        print(stats["device_frees"], stats["reserved_bytes"], b.nbytes)
        try:
            dev.alloc(700 << 10)          # nothing cached to give back: the plugin's refusal
        except devkit.OutOfMemoryError as exc:
            print("OOM", exc)
    """), env={"DEVKIT_CPU_MEMORY": "1MiB", "DEVKIT_ALLOCATOR": "caching"})
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0] == f"1 {768 << 10} {700 << 10}"
    assert lines[1].startswith("OOM [RESOURCE_EXHAUSTED] cpu.mem_alloc:")


def test_allocator_none_calls_the_plugin_for_every_buffer():
    result = run_python(textwrap.dedent("""
        import devkit
        dev = devkit.device("cpu:0")
        free = dev.mem_get_info()[0]
        for _ in range(3):
            buffer = dev.alloc(4096)
            assert dev.mem_get_info()[0] == free - 4096
            buffer.free()
            assert dev.mem_get_info()[0] == free
        stats = devkit.memory_stats(dev)
        print(stats["device_allocations"], stats["device_frees"], stats["cache_hits"])
    """), env={"DEVKIT_ALLOCATOR": "none"})
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["3", "3", "0"]


def test_unknown_allocator_is_refused():
    result = run_python("import devkit", env={"DEVKIT_ALLOCATOR": "buddy"})
    assert result.returncode != 0
    assert "DEVKIT_ALLOCATOR='buddy' is not an allocator (choose from caching, none)" in result.stderr
    with pytest.raises(ValueError, match="allocator 'buddy' is not one of caching, none"):
        devkit.set_allocator("buddy")


def test_without_mem_free_async_free_waits_for_the_pending_work(monkeypatch):
    """The direct path's fallback (the header's): synchronize the streams using it, then mem_free."""
    previous = devkit.set_allocator("none")
    try:
        dev = devkit.device("cpu:1")
        plugin_has = dev.plugin.has
        monkeypatch.setattr(dev.plugin, "has", lambda name: name != "mem_free_async" and plugin_has(name))
        stream = dev.create_stream()
        buffer = dev.alloc(1 << 16)
        gate, out = fill_and_read_behind_a_gate(stream, buffer, 5)
        threading.Timer(0.2, gate.open).start()
        buffer.free()
        assert stream.query(), "free() returned before the work using the buffer had run"
        assert np.all(out == 5)
    finally:
        devkit.set_allocator(previous)
