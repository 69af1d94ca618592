import pickle

import pytest

import devkit
from devkit.abi import C
from devkit.errors import error_for_status

CASES = [
    (C.DK_INVALID_ARGUMENT, devkit.InvalidArgumentError, ValueError),
    (C.DK_OUT_OF_RANGE, devkit.OutOfRangeError, IndexError),
    (C.DK_RESOURCE_EXHAUSTED, devkit.OutOfMemoryError, MemoryError),
    (C.DK_UNIMPLEMENTED, devkit.UnimplementedError, NotImplementedError),
    (C.DK_NOT_FOUND, devkit.NotFoundError, LookupError),
    (C.DK_DEADLINE_EXCEEDED, devkit.DeadlineExceededError, TimeoutError),
    (C.DK_DEVICE_LOST, devkit.DeviceLostError, devkit.DeviceError),
    (C.DK_ABORTED, devkit.AbortedError, devkit.DeviceError),
    (C.DK_INTERNAL, devkit.InternalError, devkit.DeviceError),
    (C.DK_UNAVAILABLE, devkit.UnavailableError, devkit.DeviceError),
    (C.DK_FAILED_PRECONDITION, devkit.FailedPreconditionError, devkit.DeviceError),
    (C.DK_DATA_LOSS, devkit.DeviceError, devkit.DevkitError),
]


@pytest.mark.parametrize("status,cls,builtin", CASES, ids=[c[1].__name__ + str(c[0]) for c in CASES])
def test_status_maps_to_exception(status, cls, builtin):
    error = error_for_status(status, "cpu.mem_alloc: something concrete")
    assert type(error) is cls and isinstance(error, builtin) and isinstance(error, devkit.DeviceError)
    assert error.status == status
    assert error.message == "cpu.mem_alloc: something concrete"
    assert "something concrete" in str(error)


@pytest.mark.parametrize("status,cls,builtin", CASES, ids=[c[1].__name__ + str(c[0]) for c in CASES])
def test_exceptions_pickle(status, cls, builtin):
    error = error_for_status(status, "a message")
    clone = pickle.loads(pickle.dumps(error))
    assert type(clone) is cls and clone.status == status and clone.message == "a message"
    assert str(clone) == str(error)


def test_plugin_load_error_pickles():
    clone = pickle.loads(pickle.dumps(devkit.PluginLoadError("no plugin named 'x'")))
    assert isinstance(clone, devkit.PluginLoadError) and str(clone) == "no plugin named 'x'"
