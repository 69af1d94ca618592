"""Error paths of the data-movement ops: indices out of range fail the kernel
with OutOfRangeError naming the index, its position and the bound (and
nothing is read or written out of bounds); bad shapes, attributes and host
inputs fail shape inference with a message naming the op and the problem."""

from __future__ import annotations

import numpy as np
import pytest

import devkit
from devkit.backends.cpu import build as cpu_build


@pytest.fixture(scope="module", params=["cpu", "opencl"])
def dev(request, tmp_path_factory):
    """A cpu plugin holding the movement kernels (built from this checkout), and the
    opencl plugin, whose kernels find bad indices on the device."""
    if request.param == "opencl":
        pytest.importorskip("pyopencl", reason="pyopencl is not installed (scripts/install-opencl.sh)")
        try:
            return devkit.load_plugin("opencl").device(0)
        except devkit.PluginLoadError as exc:
            pytest.skip(reason=f"no usable OpenCL device: {exc}")
    kernels = sorted(p.stem for p in (cpu_build.HERE / "kernels").glob("movement*.c"))
    path = cpu_build.build(tmp_path_factory.mktemp("movement"), kernels=kernels, name="movement")
    return devkit.load_plugin(str(path)).device(0)


def f32(*shape):
    return np.arange(int(np.prod(shape)), dtype=np.float32).reshape(shape)


def run(dev, op, inputs, attrs=None):
    return devkit.run_op(op, inputs, attrs, device=dev)


# -- indices out of range ---------------------------------------------------------------

OUT_OF_RANGE = [
    pytest.param("Gather", [f32(5, 4), np.array([0, 5], np.int64)], {},
                 r"index 5 \(element 1 of indices\) is out of range for axis 0 of size 5: "
                 r"valid indices are in \[-5, 5\)", id="Gather-int64"),
    pytest.param("Gather", [f32(2, 3), np.array([[1], [-4]], np.int32)], {"axis": -1},
                 r"index -4 \(element 1 of indices\) is out of range for axis 1 of size 3",
                 id="Gather-int32-negative"),
    pytest.param("Gather", [f32(0, 4), np.array([0], np.int64)], {},
                 r"index 0 \(element 0 of indices\) is out of range for axis 0 of size 0",
                 id="Gather-empty-axis"),
    pytest.param("GatherElements", [f32(3, 4), np.array([[0, 1], [2, 4]], np.int64)], {"axis": 1},
                 r"index 4 \(element 3 of indices\) is out of range for axis 1 of size 4",
                 id="GatherElements"),
    pytest.param("GatherND", [f32(3, 4), np.array([[1, 2], [1, -5]], np.int64)], {},
                 r"index -5 \(element 3 of indices\) is out of range for axis 1 of size 4",
                 id="GatherND"),
    pytest.param("GatherND", [f32(2, 3, 4), np.array([[[0]], [[3]]], np.int32)], {"batch_dims": 1},
                 r"index 3 \(element 1 of indices\) is out of range for axis 1 of size 3",
                 id="GatherND-batch_dims"),
    pytest.param("ScatterElements", [f32(3, 4), np.array([[3]], np.int64), f32(1, 1)], {},
                 r"index 3 \(element 0 of indices\) is out of range for axis 0 of size 3",
                 id="ScatterElements"),
    pytest.param("ScatterElements", [f32(3, 4), np.array([[0, -5]], np.int32), f32(1, 2)],
                 {"axis": 1, "reduction": "add"},
                 r"index -5 \(element 1 of indices\) is out of range for axis 1 of size 4",
                 id="ScatterElements-add"),
    pytest.param("ScatterND", [f32(4), np.array([[1], [-5]], np.int64), f32(2)], {},
                 r"index -5 \(element 1 of indices\) is out of range for axis 0 of size 4",
                 id="ScatterND"),
    pytest.param("ScatterND", [f32(4, 2), np.array([[4, 0]], np.int64), f32(1)], {"reduction": "max"},
                 r"index 4 \(element 0 of indices\) is out of range for axis 0 of size 4",
                 id="ScatterND-max"),
]


@pytest.mark.parametrize("op, inputs, attrs, message", OUT_OF_RANGE)
def test_index_out_of_range_names_index_and_bound(dev, op, inputs, attrs, message):
    with pytest.raises(devkit.OutOfRangeError, match=f"{op}: {message}"):
        run(dev, op, inputs, attrs)


def test_device_works_after_an_index_error(dev):
    with pytest.raises(devkit.OutOfRangeError):
        run(dev, "Gather", [f32(3), np.array([7], np.int64)])
    (out,) = run(dev, "Gather", [f32(3), np.array([-1, 0], np.int64)])
    np.testing.assert_array_equal(out.numpy(), [2.0, 0.0])


def test_index_error_on_a_stream_is_reported_by_synchronize(dev):
    data = devkit.asarray(f32(3), dev)
    indices = devkit.asarray(np.array([3], np.int64), dev)
    with dev.create_stream() as stream:
        devkit.run_op("Gather", [data, indices], stream=stream)
        with pytest.raises(devkit.OutOfRangeError, match=r"Gather: index 3 \(element 0 of indices\)"):
            stream.synchronize()


# -- shape inference and attribute errors -------------------------------------------------

INVALID = [
    pytest.param("Transpose", [f32(2, 3)], {"perm": [0, 0]}, ValueError,
                 r"perm \[0, 0\] is not a permutation of the axes 0..1", id="Transpose-perm"),
    pytest.param("Concat", [f32(2, 3), f32(3, 3)], {"axis": 1}, ValueError,
                 r"inputs\[1\] has shape \(3, 3\), which does not match inputs\[0\]'s \(2, 3\) "
                 r"outside axis 1", id="Concat-shapes"),
    pytest.param("Concat", [f32(2, 3), np.zeros((2, 3), np.int32)], {"axis": 0}, TypeError,
                 r"inputs\[1\] has dtype int32 but inputs\[0\] has float32", id="Concat-dtypes"),
    pytest.param("Concat", [f32(2, 3)], {"axis": 2}, ValueError, "axis 2 is out of range for rank 2",
                 id="Concat-axis"),
    pytest.param("Split", [f32(6), [3, 3]], {"num_outputs": 2}, ValueError,
                 "give either the 'split' input or the 'num_outputs' attribute, not both",
                 id="Split-both"),
    pytest.param("Split", [f32(6)], {}, ValueError,
                 "give the 'split' input or the 'num_outputs' attribute", id="Split-neither"),
    pytest.param("Split", [f32(6), [2, 3]], {}, ValueError,
                 r"split \[2, 3\] sums to 5, but axis 0 has size 6", id="Split-sum"),
    pytest.param("Split", [f32(5)], {"num_outputs": 4}, ValueError,
                 "axis 0 of size 5 cannot be split into 4 parts of 2", id="Split-parts"),
    pytest.param("Split", [f32(5)], {"num_outputs": 0}, ValueError, "'num_outputs': must be >= 1",
                 id="Split-num_outputs"),
    pytest.param("Slice", [f32(4), [0], [2], [0], [0]], {}, ValueError, "steps for axis 0 is 0",
                 id="Slice-step0"),
    pytest.param("Slice", [f32(4, 4), [0, 0], [2, 2], [1, -1]], {}, ValueError,
                 r"axes \[1, -1\] name an axis twice", id="Slice-axes"),
    pytest.param("Slice", [f32(4), [0], [2, 3]], {}, ValueError,
                 "starts, ends, axes and steps have lengths 1, 2, 1, 1", id="Slice-lengths"),
    pytest.param("Slice", [f32(4), np.array([0.5]), [2]], {}, TypeError,
                 "input 'starts' must hold integers, got float64", id="Slice-float-starts"),
    pytest.param("Gather", [f32(4), np.array([0.0])], {}, TypeError,
                 "input 'indices' must be int32 or int64, got float64", id="Gather-float-indices"),
    pytest.param("Gather", [np.float32(1.0), np.array([0])], {}, ValueError,
                 "data must have rank >= 1", id="Gather-scalar-data"),
    pytest.param("GatherElements", [f32(3, 4), np.zeros((4, 2), np.int64)], {"axis": 1}, ValueError,
                 r"indices shape \(4, 2\) exceeds data shape \(3, 4\) in dim 0",
                 id="GatherElements-shape"),
    pytest.param("GatherND", [f32(2, 3), np.zeros((3, 1), np.int64)], {"batch_dims": 1}, ValueError,
                 r"the first 1 \(batch\) dims of data \(2, 3\) and indices \(3, 1\) differ",
                 id="GatherND-batch"),
    pytest.param("GatherND", [f32(2, 3), np.zeros((1, 3), np.int64)], {}, ValueError,
                 r"indices.shape\[-1\] is 3; it must be in 1..2", id="GatherND-depth"),
    pytest.param("ScatterElements", [f32(3, 4), np.zeros((1, 4), np.int64), f32(1, 3)], {},
                 ValueError, r"updates have shape \(1, 3\); expected \(1, 4\)",
                 id="ScatterElements-updates"),
    pytest.param("ScatterElements", [f32(3), np.zeros(1, np.int64), f32(1)], {"reduction": "sub"},
                 ValueError, "'reduction' is 'sub'; allowed: 'none', 'add', 'mul', 'max', 'min'",
                 id="ScatterElements-reduction"),
    pytest.param("ScatterND", [f32(3, 4), np.zeros((2, 1), np.int64), f32(2, 3)], {}, ValueError,
                 r"updates have shape \(2, 3\); expected \(2, 4\)", id="ScatterND-updates"),
    pytest.param("ScatterND", [f32(3), np.zeros((1, 1), np.int64), np.zeros(1, np.int32)], {},
                 TypeError, "updates have dtype int32 but data has float32", id="ScatterND-dtype"),
    pytest.param("Pad", [f32(0, 3), [1, 0, 1, 0]], {"mode": "reflect"}, ValueError,
                 "mode 'reflect' cannot pad axis 0: it has no elements to read", id="Pad-reflect-empty"),
    pytest.param("Pad", [f32(2, 3), [0, -2, 0, -2]], {}, ValueError,
                 r"pads \(-2, -2\) crop axis 1 of size 3 by more than its size", id="Pad-crop"),
    pytest.param("Pad", [f32(2, 3), [1, 1]], {}, ValueError,
                 r"pads has 2 entries; expected 4", id="Pad-length"),
    pytest.param("Pad", [np.zeros(3, np.uint8), [1, 1], np.array(300)], {}, ValueError,
                 "constant_value 300 is not representable in uint8", id="Pad-constant"),
    pytest.param("Pad", [f32(3), [1, 1]], {"mode": "symmetric"}, ValueError,
                 "'mode' is 'symmetric'", id="Pad-mode"),
    pytest.param("Expand", [f32(2, 3), [4, 3, 2]], {}, ValueError,
                 r"shapes \(2, 3\), \(4, 3, 2\) cannot be broadcast together", id="Expand-shape"),
    pytest.param("Expand", [f32(3), [-1]], {}, ValueError, r"shape \[-1\] has a negative dim",
                 id="Expand-negative"),
    pytest.param("Tile", [f32(2, 3), [2]], {}, ValueError, "repeats has 1 entries; input has rank 2",
                 id="Tile-length"),
    pytest.param("Tile", [f32(2), [-1]], {}, ValueError, r"repeats \[-1\] has a negative entry",
                 id="Tile-negative"),
]


@pytest.mark.parametrize("op, inputs, attrs, error, message", INVALID)
def test_invalid_call_is_refused_before_the_kernel(dev, op, inputs, attrs, error, message):
    with pytest.raises(error, match=f"{op}: .*{message}"):
        run(dev, op, inputs, attrs)
