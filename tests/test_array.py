"""Arrays on the cpu plugin: host round trips, views, cross-device copies and DLPack."""

import numpy as np
import pytest

import devkit
from devkit import dtypes
from devkit.abi import ffi


def _sample(dtype, shape, seed=0):
    rng = np.random.default_rng(seed)
    if dtype == np.bool_:
        return rng.integers(0, 2, shape).astype(bool)
    if np.dtype(dtype).kind in "iu":
        info = np.iinfo(dtype)
        return rng.integers(info.min, info.max, shape, dtype=dtype, endpoint=True)
    return rng.standard_normal(shape).astype(dtype)


@pytest.mark.parametrize("dtype", dtypes.SUPPORTED, ids=str)
@pytest.mark.parametrize("shape", [(), (0,), (7,), (3, 4, 5), (2, 0, 3)], ids=str)
def test_roundtrip_is_bit_exact(dtype, shape):
    host = _sample(dtype, shape)
    array = devkit.asarray(host, "cpu:1")
    assert (array.shape, array.dtype, array.device) == (host.shape, host.dtype, devkit.device("cpu:1"))
    back = array.numpy()
    assert back.dtype == host.dtype and back.tobytes() == host.tobytes()


VIEWS = {
    "rows": lambda a: a[1:],
    "step": lambda a: a[:, ::2],
    "reversed": lambda a: a[::-1, ::-3],
    "int-index": lambda a: a[2],
    "scalar": lambda a: a[1, 2, 3],
    "ellipsis": lambda a: a[..., 1],
    "newaxis": lambda a: a[None, 1:3, ..., None],
    "transpose": lambda a: a.transpose(2, 0, 1),
    "T-then-slice": lambda a: a.T[1:, :, ::2],
    "empty": lambda a: a[3:3],
}


@pytest.mark.parametrize("view", sorted(VIEWS))
def test_views_match_numpy(view):
    host = np.arange(4 * 5 * 6, dtype=np.float64).reshape(4, 5, 6)
    array = devkit.asarray(host)
    expected = VIEWS[view](host)
    got = VIEWS[view](array)
    assert got.shape == expected.shape
    assert np.array_equal(got.numpy(), expected)
    assert got.buffer.handle == array.buffer.handle, "views share the allocation"


def test_contiguity_and_reshape():
    array = devkit.asarray(np.arange(24, dtype=np.int32).reshape(2, 3, 4))
    assert array.is_contiguous and not array.T.is_contiguous
    assert np.array_equal(array.reshape(4, -1).numpy(), np.arange(24).reshape(4, 6))
    with pytest.raises(ValueError, match="contiguous"):
        array.T.reshape(24)
    with pytest.raises(ValueError):
        array.reshape(5, 5)


def test_basic_indexing_only():
    array = devkit.asarray(np.zeros((3, 3), np.float32))
    with pytest.raises(TypeError, match="basic indexing"):
        array[[0, 2]]


@pytest.mark.parametrize("dtype", ["complex64", "object", "U3"])
def test_unsupported_dtype_is_refused(dtype):
    with pytest.raises(TypeError, match="not supported by devkit arrays"):
        devkit.empty((2,), dtype)


def test_array_outside_its_buffer_is_refused():
    buffer = devkit.device("cpu:0").alloc(16)
    with pytest.raises(IndexError, match="outside the 16-byte buffer"):
        devkit.Array(buffer, (5,), "float32")
    with pytest.raises(IndexError):
        devkit.Array(buffer, (2,), "float64", offset=8)


def test_copy_to_another_device_and_back():
    host = _sample(np.float32, (64, 33))
    a0 = devkit.asarray(host, "cpu:0")
    a1 = a0.to("cpu:1")
    assert a1.device is devkit.device("cpu:1") and a1.buffer.handle != a0.buffer.handle
    assert np.array_equal(a1.numpy(), host)
    strided = a1[::2, 1::3].to("cpu:0")
    assert strided.is_contiguous and np.array_equal(strided.numpy(), host[::2, 1::3])
    assert devkit.asarray(a1, "cpu:1") is a1


def test_zeros_and_async_upload():
    dev = devkit.device("cpu:0")
    with dev.create_stream() as stream:
        array = devkit.zeros((1000,), "int64", dev, stream=stream)
        host = np.arange(1000)
        filled = devkit.asarray(host, dev, stream=stream)
        del host  # the stream keeps the source alive until the copy has run
        stream.synchronize()
        assert np.array_equal(array.numpy(), np.zeros(1000)) and np.array_equal(filled.numpy(), np.arange(1000))


def test_from_dlpack_is_zero_copy():
    array = devkit.asarray(np.arange(12, dtype=np.float32).reshape(3, 4))
    assert array.__dlpack_device__() == (1, 0)
    view = np.from_dlpack(array)
    assert view.ctypes.data == int(ffi.cast("uintptr_t", array.buffer.handle))
    view[1, 2] = -5.0  # writes through to device memory
    assert array.numpy()[1, 2] == -5.0
    strided = np.from_dlpack(array[::2, ::-1])
    assert np.array_equal(strided, array.numpy()[::2, ::-1])
    del array
    assert view[1, 2] == -5.0  # the export keeps the memory alive


def test_from_dlpack_sees_completed_stream_work():
    dev = devkit.device("cpu:0")
    array = devkit.zeros((256,), "uint8", dev)
    with dev.create_stream() as stream:
        array.buffer.fill(3, stream=stream)
        assert np.all(np.from_dlpack(array) == 3)
