"""Runtime conformance: devices, memory, copies, streams, events and error paths.

Every case drives the plugin through its DK_DeviceApi table (directly, or via
the thin devkit runtime objects) and asserts exact results. Asynchrony is
checked deterministically: a host callback that blocks on a gate holds a
stream, so work queued behind it must still be pending.
"""

import re
import threading
import time

import numpy as np
import pytest

import devkit
from devkit.abi import C, ffi, field_end
from devkit.engine.calls import KernelCall, launch
from devkit.ops import dispatch
from devkit.ops import spec as ops_spec

MiB = 1 << 20
# The 64 MiB copies are most of the suite's time: --profile quick leaves them out.
# 3 MiB + 1: past the size a plugin may split over threads, in no whole number of pieces.
COPY_SIZES = [0, 1, 3, 4096 + 7, 3 * MiB + 1, pytest.param(64 * MiB, marks=pytest.mark.full)]
COPY_OFFSETS = [0, 1, 3]
GUARD = 64  # bytes checked untouched on each side of a destination range


def random_bytes(n: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, n, dtype=np.uint8)


class Gate:
    """A host callback that holds a stream while the ``with`` block runs.

    Leaving the block opens it, also when an assertion inside fails, so a
    failing case does not wait out the callback's limit.
    """

    def __init__(self, stream: devkit.Stream):
        self._event = threading.Event()
        stream.add_callback(lambda: self._event.wait(30))

    def __enter__(self):
        return self

    def __exit__(self, *exc_info):
        self._event.set()


# -- devices ----------------------------------------------------------------------


def test_device_count_positive(plugin):
    assert plugin.device_count >= 1


def test_properties_sanity(plugin):
    for device in plugin.devices():
        props = device.properties
        assert props.name and props.vendor
        assert props.total_memory > 0
        assert 0 < props.max_alloc_size <= props.total_memory
        assert props.alloc_alignment >= 1
        assert props.alloc_alignment & (props.alloc_alignment - 1) == 0, "alignment is a power of 2"
        assert props.compute_units >= 1
        assert props.device_type in {
            C.DK_DEVICE_TYPE_CPU, C.DK_DEVICE_TYPE_CUDA, C.DK_DEVICE_TYPE_OPENCL,
            C.DK_DEVICE_TYPE_VULKAN, C.DK_DEVICE_TYPE_METAL, C.DK_DEVICE_TYPE_ROCM,
            C.DK_DEVICE_TYPE_EXT_DEV, C.DK_DEVICE_TYPE_ONEAPI, C.DK_DEVICE_TYPE_VPI}
        free, total = device.mem_get_info()
        assert 0 <= free <= total and total > 0


def test_properties_respect_caller_struct_size(plugin):
    """VERSIONING rule 4: an older host's smaller struct is never written past its end."""
    full = ffi.sizeof("DK_DeviceProperties")
    short = field_end("DK_DeviceProperties", "vendor")
    raw = ffi.new("char[]", full + 64)
    ffi.memmove(raw, b"\xab" * (full + 64), full + 64)
    props = ffi.cast("DK_DeviceProperties *", raw)
    props.struct_size = short
    plugin.call("get_device_properties", 0, props)
    assert props.struct_size <= short
    assert ffi.string(props.name)
    assert bytes(ffi.buffer(raw, full + 64)[short:]) == b"\xab" * (full + 64 - short)


def test_device_synchronize_waits_for_every_stream(dev):
    finished = []
    streams = [dev.create_stream() for _ in range(2)]
    for i, stream in enumerate(streams):
        stream.add_callback(lambda i=i: (time.sleep(0.05), finished.append(i)))
    dev.synchronize()
    assert sorted(finished) == [0, 1]
    assert all(stream.query() for stream in streams)


# -- memory -------------------------------------------------------------------------


@pytest.mark.parametrize("size", [0, 1, 3, 4096 + 7, MiB])
def test_alloc_free(dev, size):
    free_before, _ = dev.mem_get_info()
    buffer = dev.alloc(size)
    if dev.properties.host_pointer_handles:
        assert int(ffi.cast("uintptr_t", buffer.handle)) % dev.properties.alloc_alignment == 0
    if size >= MiB:
        assert dev.mem_get_info()[0] <= free_before - size
    buffer.free()
    assert dev.mem_get_info()[0] == free_before


def test_distinct_handles(dev):
    buffers = [dev.alloc(0) for _ in range(4)] + [dev.alloc(16) for _ in range(4)]
    handles = {int(ffi.cast("uintptr_t", b.handle)) for b in buffers}
    assert len(handles) == len(buffers)


def test_alloc_beyond_capacity_raises_oom_and_device_stays_usable(dev):
    out = ffi.new("DK_Mem *")
    for size in (dev.properties.max_alloc_size + 1, 2 * dev.properties.total_memory):
        with pytest.raises(devkit.OutOfMemoryError) as info:  # the plugin's own refusal
            dev.call("mem_alloc", dev.index, size, out)
        assert isinstance(info.value, MemoryError)
        assert info.value.message
        with pytest.raises(devkit.OutOfMemoryError, match=f"{size} bytes.*max_alloc_size"):
            dev.alloc(size)  # the runtime's, before asking the plugin
    data = random_bytes(MiB)
    buffer = dev.alloc(MiB)
    buffer.copy_from_host(data)
    assert np.array_equal(buffer.copy_to_host(), data)


def test_mem_free_async_in_stream_order(dev):
    free_before, _ = dev.mem_get_info()
    with dev.create_stream() as stream:
        with Gate(stream):
            buffer = dev.alloc(MiB, stream)
            buffer.fill(7, stream=stream)
            out = buffer.copy_to_host(stream=stream)
            buffer.free(stream)
        stream.synchronize()
    assert np.all(out == 7)
    assert dev.mem_get_info()[0] == free_before


def test_host_alloc_roundtrip(plugin):
    if not plugin.has("host_alloc"):
        pytest.skip(reason=f"plugin '{plugin.name}' has no host_alloc (optional)")
    pointer = ffi.new("void **")
    plugin.call("host_alloc", 0, 4096, pointer)
    assert pointer[0] != ffi.NULL
    ffi.memmove(pointer[0], b"\x5a" * 4096, 4096)
    assert bytes(ffi.buffer(pointer[0], 4096)) == b"\x5a" * 4096
    plugin.call("host_free", 0, pointer[0])
    plugin.call("host_free", 0, ffi.NULL)


# -- host memory registration (ABI 1.3, optional) ------------------------------------

@pytest.fixture
def registers(plugin):
    if not plugin.has_host_registration:
        pytest.skip(reason=f"plugin '{plugin.name}' has no host memory registration (optional, ABI 1.3): "
                           f"plans copy NumPy inputs and outputs instead")
    return plugin


def _register(dev, host: np.ndarray):
    mem = ffi.new("DK_Mem *")
    dev.call("mem_register_host", dev.index, ffi.from_buffer(host), host.nbytes, mem)
    return mem[0]


def test_registered_host_memory_is_device_memory_without_a_copy(registers, dev):
    """Copies and kernels on a registered handle read and write the host array itself."""
    free_before = dev.mem_get_info()[0]
    x = np.arange(1024, dtype=np.float32)
    y = np.zeros(1024, np.float32)
    x_mem, y_mem = _register(dev, x), _register(dev, y)
    try:
        back = np.empty(16, np.float32)
        dev.call("copy_d2h", dev.index, ffi.from_buffer(back), x_mem, 64, back.nbytes, ffi.NULL)
        np.testing.assert_array_equal(back, x[16:32])
        x[16:32] = -1  # no copy was taken: the device reads what the host writes
        dev.call("copy_d2d", dev.index, y_mem, 0, x_mem, 0, x.nbytes, ffi.NULL)
        np.testing.assert_array_equal(y, x)
        # A kernel on registered memory: a call built on stand-ins, pointed at the handles.
        stand_in_x, stand_in_y = devkit.empty(x.shape, x.dtype, dev), devkit.empty(y.shape, y.dtype, dev)
        bound = dispatch.bind_call(ops_spec.get("Relu"), [stand_in_x], {}, dev)
        if bound.entry is not None:
            call = KernelCall(dev, bound.entry, "Relu", [stand_in_x], [stand_in_y], bound.attributes)
            call.inputs[0].data, call.inputs[0].byte_offset = x_mem, 0
            call.outputs[0].data, call.outputs[0].byte_offset = y_mem, 0
            launch(call)
            dev.synchronize()
            np.testing.assert_array_equal(y, np.maximum(x, 0))
            stand_in_x.buffer.free(), stand_in_y.buffer.free()
        assert dev.mem_get_info()[0] == free_before  # registrations count against no capacity
    finally:
        dev.call("mem_unregister_host", dev.index, x_mem)
        dev.call("mem_unregister_host", dev.index, y_mem)
    dev.call("mem_unregister_host", dev.index, ffi.NULL)


def test_host_registration_errors(registers, dev):
    host = np.zeros(256, np.uint8)
    mem = ffi.new("DK_Mem *")
    api, index = dev.plugin.api, dev.index
    assert api.mem_register_host(index, ffi.from_buffer(host), 0, mem) == C.DK_INVALID_ARGUMENT
    assert api.mem_register_host(index, ffi.NULL, 256, mem) == C.DK_INVALID_ARGUMENT
    assert api.mem_register_host(index, ffi.from_buffer(host), 256, ffi.NULL) == C.DK_INVALID_ARGUMENT
    assert api.mem_register_host(-1, ffi.from_buffer(host), 256, mem) == C.DK_INVALID_ARGUMENT
    handle = _register(dev, host)
    try:
        assert api.mem_register_host(index, ffi.from_buffer(host), 256, mem) == C.DK_ALREADY_EXISTS
        with pytest.raises(devkit.InvalidArgumentError, match="mem_free.*mem_unregister_host"):
            dev.call("mem_free", index, handle)
        with pytest.raises(devkit.OutOfRangeError):  # the registration's extent is checked like an allocation's
            dev.call("memset", index, handle, 200, 0, 57, ffi.NULL)
    finally:
        dev.call("mem_unregister_host", index, handle)
    with pytest.raises(devkit.InvalidArgumentError, match="mem_unregister_host"):
        dev.call("mem_unregister_host", index, handle)  # already ended
    buffer = dev.alloc(64)
    with pytest.raises(devkit.InvalidArgumentError, match="mem_unregister_host"):
        dev.call("mem_unregister_host", index, buffer.handle)  # an allocation, not a registration
    buffer.free()


# -- copies -------------------------------------------------------------------------


def _destination(dev, size, offset):
    """A buffer pre-filled with a pattern, larger than the copy by GUARD on each side."""
    pattern = random_bytes(offset + size + GUARD, seed=99)
    buffer = dev.alloc(len(pattern))
    buffer.copy_from_host(pattern)
    return buffer, pattern


def _assert_copied(buffer, pattern, offset, size, expected):
    result = buffer.copy_to_host()
    assert np.array_equal(result[offset:offset + size], expected), "copied bytes differ"
    assert np.array_equal(result[:offset], pattern[:offset]), "bytes before the range changed"
    assert np.array_equal(result[offset + size:], pattern[offset + size:]), \
        "bytes after the range changed"


@pytest.mark.parametrize("use_stream", [False, True], ids=["sync", "stream"])
@pytest.mark.parametrize("offset", COPY_OFFSETS)
@pytest.mark.parametrize("size", COPY_SIZES)
def test_copy_h2d_d2h(dev, size, offset, use_stream):
    data = random_bytes(size, seed=size + offset)
    dst, pattern = _destination(dev, size, offset)
    stream = dev.create_stream() if use_stream else None
    dst.copy_from_host(data, offset=offset, stream=stream)
    back = dst.copy_to_host(offset=offset, nbytes=size, stream=stream)
    if stream:
        stream.synchronize()
    assert np.array_equal(back, data)
    _assert_copied(dst, pattern, offset, size, data)


@pytest.mark.parametrize("use_stream", [False, True], ids=["sync", "stream"])
@pytest.mark.parametrize("offset", COPY_OFFSETS)
@pytest.mark.parametrize("size", COPY_SIZES)
def test_copy_d2d(dev, size, offset, use_stream):
    data = random_bytes(size + 5, seed=size)
    src = dev.alloc(len(data))
    src.copy_from_host(data)
    dst, pattern = _destination(dev, size, offset)
    stream = dev.create_stream() if use_stream else None
    dst.view(offset, size).copy_from(src.view(5, size), stream=stream)
    if stream:
        stream.synchronize()
    _assert_copied(dst, pattern, offset, size, data[5:])


@pytest.mark.parametrize("offset", COPY_OFFSETS)
@pytest.mark.parametrize("size", COPY_SIZES)
def test_copy_between_devices(dev_pair, size, offset):
    """copy_p2p when the plugin has it, else the host's staging fallback."""
    first, second = dev_pair
    data = random_bytes(size + 3, seed=size + 1)
    src = first.alloc(len(data))
    src.copy_from_host(data)
    dst, pattern = _destination(second, size, offset)
    with second.create_stream() as stream:
        dst.view(offset, size).copy_from(src.view(3, size), stream=stream)
        stream.synchronize()
    _assert_copied(dst, pattern, offset, size, data[3:])


@pytest.mark.parametrize("size", [4096, 3 * MiB + 1])
@pytest.mark.parametrize("shift", [1, -1])
def test_overlapping_d2d_behaves_like_memmove(dev, size, shift):
    data = random_bytes(size)
    buffer = dev.alloc(size)
    buffer.copy_from_host(data)
    n, to, at = size - 96, max(shift, 0), max(-shift, 0)
    buffer.view(to, n).copy_from(buffer.view(at, n))
    expected = data.copy()
    expected[to:to + n] = data[at:at + n]
    assert np.array_equal(buffer.copy_to_host(), expected)


@pytest.mark.parametrize("use_stream", [False, True], ids=["sync", "stream"])
@pytest.mark.parametrize("offset,size", [(0, 0), (1, 1), (3, 4096 + 7), (5, 3 * MiB + 1)])
def test_memset(dev, offset, size, use_stream):
    dst, pattern = _destination(dev, size, offset)
    stream = dev.create_stream() if use_stream else None
    dst.view(offset, size).fill(0xC3, stream=stream)
    if stream:
        stream.synchronize()
    _assert_copied(dst, pattern, offset, size, np.full(size, 0xC3, np.uint8))


# -- streams -------------------------------------------------------------------------


def test_stream_work_is_asynchronous(dev):
    """Work queued behind a held stream is pending until released."""
    buffer = dev.alloc(4096)
    buffer.fill(0)
    with dev.create_stream() as stream:
        with Gate(stream):
            buffer.fill(0x11, stream=stream)
            assert stream.query() is False
            assert np.all(buffer.copy_to_host() == 0), "stream work ran before the stream reached it"
        stream.synchronize()
        assert stream.query() is True
    assert np.all(buffer.copy_to_host() == 0x11)


def test_stream_runs_in_submission_order(dev):
    buffer = dev.alloc(MiB)
    snapshots = []
    with dev.create_stream() as stream:
        with Gate(stream):
            for value in range(1, 33):
                buffer.fill(value, stream=stream)
                snapshots.append(buffer.view(value * 7, 16).copy_to_host(stream=stream))
        stream.synchronize()
    assert [int(s[0]) for s in snapshots] == list(range(1, 33))
    assert all(np.all(s == s[0]) for s in snapshots)


def test_dependent_copy_chain_across_two_streams(dev):
    """a: h2d -> b1, b: b1 -> b2, a: b2 -> b3, b: b3 -> host, joined by stream_wait_event."""
    data = random_bytes(4 * MiB + 3, seed=7)
    b1, b2, b3 = (dev.alloc(len(data)) for _ in range(3))
    for b in (b1, b2, b3):
        b.fill(0)
    with dev.create_stream() as a, dev.create_stream() as b:
        with Gate(a):
            b1.copy_from_host(data, stream=a)
            e1 = a.record()
            b.wait_event(e1)
            b2.copy_from(b1, stream=b)
            e2 = b.record()
            a.wait_event(e2)
            b3.copy_from(b2, stream=a)
            e3 = a.record()
            b.wait_event(e3)
            out = b3.copy_to_host(stream=b)
            assert b.query() is False, "stream b ran past stream_wait_event before a released it"
        b.synchronize()
        a.synchronize()
    assert np.array_equal(out, data)


def test_callbacks_run_in_stream_order_after_earlier_work(dev):
    data = random_bytes(MiB, seed=3)
    buffer = dev.alloc(MiB)
    host = np.zeros(MiB, np.uint8)
    seen, order = [], []
    with dev.create_stream() as stream:
        with Gate(stream):
            buffer.copy_from_host(data, stream=stream)
            buffer.copy_to_host(host, stream=stream)
            stream.add_callback(lambda: seen.append(host.copy()))
            for i in range(100):
                stream.add_callback(lambda i=i: order.append(i))
        stream.synchronize()
    assert order == list(range(100))
    assert np.array_equal(seen[0], data), "callback ran before the earlier copy completed"


def test_callback_exception_is_raised_on_synchronize(dev):
    with dev.create_stream() as stream:
        stream.add_callback(lambda: 1 / 0)
        with pytest.raises(ZeroDivisionError):
            stream.synchronize()


def test_callback_waiting_for_its_own_stream_is_refused(dev):
    """A host callback must not wait for the stream that runs it (the ABI's
    rule): the plugin answers FAILED_PRECONDITION instead of hanging, and
    the next synchronize raises it. Work queued before and after runs."""
    buffer, host = dev.alloc(4096), np.zeros(4096, np.uint8)
    data = random_bytes(4096, seed=5)
    with dev.create_stream() as stream:
        buffer.copy_from_host(data, stream=stream)
        stream.add_callback(stream.synchronize)
        buffer.copy_to_host(host, stream=stream)
        with pytest.raises(devkit.DeviceError) as info:
            stream.synchronize()
        assert info.value.status == C.DK_FAILED_PRECONDITION
    assert np.array_equal(host, data)


def test_callbacks_run_off_the_synchronizing_thread(dev):
    """Callbacks run on a plugin thread (the ABI's rule), also when the
    thread that synchronizes could run the stream's work itself."""
    threads = []
    with dev.create_stream() as stream:
        for _ in range(20):
            stream.add_callback(lambda: threads.append(threading.get_ident()))
            stream.synchronize()
    assert len(threads) == 20 and threading.get_ident() not in threads


def test_stream_destroy_waits_for_pending_work(dev):
    finished = []
    stream = dev.create_stream()
    stream.add_callback(lambda: (time.sleep(0.05), finished.append(True)))
    stream.destroy()
    assert finished == [True]


def _copy_round_trips(dev, stream, seed: int, size: int, rounds: int, errors: list) -> None:
    """``rounds`` of host -> a -> b -> host copies on ``stream``, each checked;
    a failure is collected in ``errors`` (for a thread to report)."""
    try:
        a, b = dev.alloc(size + seed), dev.alloc(size + seed)
        for i in range(rounds):
            data = random_bytes(size + seed, seed=seed * 1000 + i)
            a.copy_from_host(data, stream=stream)
            b.copy_from(a, stream=stream)
            out = b.copy_to_host(stream=stream)
            stream.synchronize()
            assert np.array_equal(out, data), f"thread {seed} iteration {i} differs"
    except BaseException as exc:  # collected and re-raised in the main thread
        errors.append(exc)


def test_four_threads_each_driving_a_stream(dev):
    errors = []

    def worker(seed):
        with dev.create_stream() as stream:
            _copy_round_trips(dev, stream, seed, 256 * 1024, 25, errors)

    threads = [threading.Thread(target=worker, args=(seed,)) for seed in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert not any(thread.is_alive() for thread in threads), "a stream thread hung"
    assert not errors, errors


def test_threads_sharing_a_stream_while_others_synchronize_it(dev):
    """Three threads queue copies on one stream, each checking its own
    results, while two others synchronize it in a loop (a plugin may run
    the queued work on a thread that waits for it): every copy runs once,
    in each thread's order, and nothing hangs."""
    errors, stop = [], threading.Event()
    with dev.create_stream() as stream:

        def submitter(seed):
            _copy_round_trips(dev, stream, seed, 64 * 1024, 40, errors)

        def synchronizer():
            try:
                while not stop.is_set():
                    stream.synchronize()
            except BaseException as exc:
                errors.append(exc)

        submitters = [threading.Thread(target=submitter, args=(seed,)) for seed in range(3)]
        waiters = [threading.Thread(target=synchronizer) for _ in range(2)]
        for thread in submitters + waiters:
            thread.start()
        for thread in submitters:
            thread.join(120)
        stop.set()
        for thread in waiters:
            thread.join(30)
        assert not any(thread.is_alive() for thread in submitters + waiters), "a thread hung"
        stream.synchronize()
    assert not errors, errors


# -- events -------------------------------------------------------------------------


def test_event_never_recorded_is_complete(dev):
    with dev.create_event() as event:
        assert event.query() is True
        event.synchronize()


def test_event_query_before_and_after(dev):
    with dev.create_stream() as stream, dev.create_event() as event:
        with Gate(stream):
            event.record(stream)
            assert event.query() is False
        event.synchronize()
        assert event.query() is True


def test_event_rerecord_tracks_latest_position(dev):
    with dev.create_stream() as stream, dev.create_event() as event:
        event.record(stream)
        stream.synchronize()
        with Gate(stream):
            event.record(stream)
            assert event.query() is False
        stream.synchronize()
        assert event.query() is True


def test_event_elapsed_time_is_ordered_and_measures_completion(dev):
    with dev.create_stream() as stream:
        start = stream.record()
        stream.add_callback(lambda: time.sleep(0.02))
        middle = stream.record()
        stream.add_callback(lambda: time.sleep(0.01))
        end = stream.record()
        stream.synchronize()
        first, total = start.elapsed_ms(middle), start.elapsed_ms(end)
        assert first >= 10.0, "events must be timestamped when the stream reaches them"
        assert 0.0 <= first <= total
        assert start.elapsed_ms(start) == 0.0


def test_event_elapsed_errors(dev):
    with dev.create_stream() as stream:
        untimed = dev.create_event(timing=False).record(stream)
        timed = stream.record()
        never = dev.create_event()
        stream.synchronize()
        with pytest.raises(devkit.InvalidArgumentError):
            untimed.elapsed_ms(timed)
        with pytest.raises(devkit.InvalidArgumentError):
            never.elapsed_ms(timed)
        with Gate(stream):
            pending = stream.record()
            with pytest.raises(devkit.NotReadyError):
                timed.elapsed_ms(pending)
        stream.synchronize()


def test_event_destroyed_while_pending(dev):
    with dev.create_stream() as stream:
        with Gate(stream):
            event = stream.record()
            other = dev.create_stream()
            other.wait_event(event)
            event.destroy()
        stream.synchronize()
        other.synchronize()
        other.destroy()


def test_wait_on_event_recorded_without_stream(dev):
    buffer = dev.alloc(64)
    with dev.create_stream() as stream, dev.create_event() as event:
        event.record(None)
        stream.wait_event(event)
        buffer.fill(9, stream=stream)
        stream.synchronize()
    assert np.all(buffer.copy_to_host() == 9)


# -- invalid input ---------------------------------------------------------------------

# What a useful message mentions; plugins phrase it their own way.
DEVICE_MESSAGE = re.compile(r"device|index", re.I)
HANDLE_MESSAGE = re.compile(r"handle|alloc|unknown|free", re.I)
RANGE_MESSAGE = re.compile(r"range|bound|exceed|past|size", re.I)
NULL_OR_HANDLE_MESSAGE = re.compile(r"null|handle|unknown", re.I)


def test_bad_device_index(plugin):
    count = plugin.device_count
    out_mem, free, total = ffi.new("DK_Mem *"), ffi.new("size_t *"), ffi.new("size_t *")
    props = ffi.new("DK_DeviceProperties *", {"struct_size": ffi.sizeof("DK_DeviceProperties")})
    for index in (count, -1, 1 << 30):
        for function, args in [("mem_alloc", (16, out_mem)), ("mem_get_info", (free, total)),
                                ("get_device_properties", (props,)), ("device_synchronize", ()),
                                ("stream_create", (ffi.new("DK_Stream *"),))]:
            with pytest.raises(devkit.InvalidArgumentError, match=DEVICE_MESSAGE):
                plugin.call(function, index, *args)
    with pytest.raises(IndexError, match="out of range"):
        plugin.device(count)


def test_free_unknown_and_double_free(plugin, dev):
    with pytest.raises(devkit.InvalidArgumentError, match=HANDLE_MESSAGE):
        plugin.call("mem_free", 0, ffi.cast("DK_Mem", 0xDEAD0))
    out = ffi.new("DK_Mem *")
    plugin.call("mem_alloc", 0, 128, out)
    plugin.call("mem_free", 0, out[0])
    with pytest.raises(devkit.InvalidArgumentError, match=HANDLE_MESSAGE):
        plugin.call("mem_free", 0, out[0])
    plugin.call("mem_free", 0, ffi.NULL)  # NULL is accepted


def test_handle_used_on_another_device(plugin, dev_pair):
    buffer = dev_pair[0].alloc(64)
    with pytest.raises(devkit.InvalidArgumentError, match=HANDLE_MESSAGE):
        plugin.call("mem_free", 1, buffer.handle)
    host = np.zeros(64, np.uint8)
    with pytest.raises(devkit.InvalidArgumentError, match=HANDLE_MESSAGE):
        plugin.call("copy_d2h", 1, ffi.from_buffer(host), buffer.handle, 0, 64, ffi.NULL)


def test_copies_past_the_end(plugin, dev):
    buffer = dev.alloc(100)
    host = np.zeros(200, np.uint8)
    host_ptr = ffi.from_buffer(host)
    handle = buffer.handle
    huge = (1 << 64) - 8
    cases = [
        ("copy_h2d", (0, handle, 50, host_ptr, 51, ffi.NULL)),
        ("copy_h2d", (0, handle, 101, host_ptr, 0, ffi.NULL)),
        ("copy_h2d", (0, handle, huge, host_ptr, 16, ffi.NULL)),
        ("copy_d2h", (0, host_ptr, handle, 0, 101, ffi.NULL)),
        ("copy_d2h", (0, host_ptr, handle, 99, huge, ffi.NULL)),
        ("copy_d2d", (0, handle, 0, handle, 1, 100, ffi.NULL)),
        ("copy_d2d", (0, handle, 60, handle, 0, 41, ffi.NULL)),
        ("memset", (0, handle, 1, 0, 100, ffi.NULL)),
    ]
    with dev.create_stream() as stream:
        for function, args in cases:
            for stream_handle in (ffi.NULL, stream.handle):
                with pytest.raises(devkit.OutOfRangeError, match=RANGE_MESSAGE):
                    plugin.call(function, *args[:-1], stream_handle)
    with pytest.raises(IndexError):
        buffer.view(90, 11)
    buffer.copy_from_host(host[:100])  # still usable


def test_null_where_a_pointer_is_required(plugin, dev):
    buffer = dev.alloc(64)
    stream_out, event_out = ffi.new("DK_Stream *"), ffi.new("DK_Event *")
    plugin.call("stream_create", 0, stream_out)
    plugin.call("event_create", 0, 0, event_out)
    cases = [
        ("get_device_count", (ffi.NULL,)),
        ("get_device_properties", (0, ffi.NULL)),
        ("mem_alloc", (0, 16, ffi.NULL)),
        ("mem_get_info", (0, ffi.NULL, ffi.NULL)),
        ("copy_h2d", (0, buffer.handle, 0, ffi.NULL, 16, ffi.NULL)),
        ("copy_d2h", (0, ffi.NULL, buffer.handle, 0, 16, ffi.NULL)),
        ("copy_h2d", (0, ffi.NULL, 0, ffi.new("char[16]"), 16, ffi.NULL)),
        ("stream_create", (0, ffi.NULL)),
        ("event_create", (0, 0, ffi.NULL)),
        ("stream_add_callback", (0, stream_out[0], ffi.NULL, ffi.NULL)),
        ("event_elapsed_ms", (0, event_out[0], event_out[0], ffi.NULL)),
        ("event_record", (0, ffi.NULL, stream_out[0])),
        ("stream_wait_event", (0, stream_out[0], ffi.NULL)),
    ]
    try:
        for function, args in cases:
            with pytest.raises(devkit.InvalidArgumentError, match=NULL_OR_HANDLE_MESSAGE):
                plugin.call(function, *args)
    finally:
        plugin.call("event_destroy", 0, event_out[0])
        plugin.call("stream_destroy", 0, stream_out[0])


def test_unknown_and_destroyed_stream_and_event_handles(plugin, dev):
    bogus_stream = ffi.cast("DK_Stream", 0xBAD0)
    bogus_event = ffi.cast("DK_Event", 0xBAD8)
    for function, args in [("stream_synchronize", (bogus_stream,)), ("stream_query", (bogus_stream,)),
                           ("event_query", (bogus_event,)), ("event_synchronize", (bogus_event,)),
                           ("event_record", (bogus_event, ffi.NULL))]:
        with pytest.raises(devkit.InvalidArgumentError):
            plugin.call(function, 0, *args)
    out = ffi.new("DK_Stream *")
    plugin.call("stream_create", 0, out)
    plugin.call("stream_destroy", 0, out[0])
    with pytest.raises(devkit.InvalidArgumentError):
        plugin.call("stream_query", 0, out[0])
    plugin.call("stream_destroy", 0, ffi.NULL)
    plugin.call("event_destroy", 0, ffi.NULL)


def test_stream_or_event_of_another_device(plugin, dev_pair):
    first, second = dev_pair
    with first.create_stream() as stream, first.create_event() as event:
        with pytest.raises(devkit.InvalidArgumentError):
            plugin.call("stream_query", second.index, stream.handle)
        with second.create_stream() as other:
            with pytest.raises(devkit.InvalidArgumentError):
                plugin.call("stream_wait_event", second.index, other.handle, event.handle)


def test_invalid_event_flags(plugin):
    with pytest.raises(devkit.InvalidArgumentError):
        plugin.call("event_create", 0, 1 << 20, ffi.new("DK_Event *"))


def test_errors_carry_the_plugin_message(plugin, dev):
    with pytest.raises(devkit.DeviceError) as info:
        plugin.call("mem_free", 0, ffi.cast("DK_Mem", 0xDEAD0))
    error = info.value
    assert error.status == C.DK_INVALID_ARGUMENT
    assert error.message.startswith(f"{plugin.name}.mem_free: ")
    assert len(error.message) > len(f"{plugin.name}.mem_free: ") + 10
