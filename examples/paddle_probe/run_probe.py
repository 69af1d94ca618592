"""Probe: does the PyPI PaddlePaddle CPU wheel load the 'devkit' CustomDevice plugin?

Run via run.sh (it builds the plugin and sets CUSTOM_DEVICE_ROOT before paddle is imported).
Each check prints PASS/FAIL/INFO; exit code is the number of FAILs.
"""
import os
import subprocess
import sys
import traceback

import numpy as np

fails = 0


def check(name, cond, detail=""):
    global fails
    print(f"{'PASS' if cond else 'FAIL'}: {name} {detail}".rstrip(), flush=True)
    if not cond:
        fails += 1


print("CUSTOM_DEVICE_ROOT =", os.environ.get("CUSTOM_DEVICE_ROOT"), flush=True)
import paddle  # noqa: E402  (must come after env is set)

print("paddle", paddle.__version__, "commit", paddle.version.commit, flush=True)
types = paddle.device.get_all_custom_device_type()
print("get_all_custom_device_type():", types)
print("get_available_custom_device():", paddle.device.get_available_custom_device())
print("is_compiled_with_custom_device('devkit'):",
      paddle.is_compiled_with_custom_device("devkit"))
print("is_compiled_with_custom_device('nosuch'):",
      paddle.is_compiled_with_custom_device("nosuch"))
print("device_count('devkit'):", paddle.device.device_count("devkit")
      if hasattr(paddle.device, "device_count") else "n/a")
check("devkit listed", types == ["devkit"] or "devkit" in types, str(types))

paddle.set_device("devkit:0")
print("get_device():", paddle.device.get_device())
check("set_device", paddle.device.get_device() == "devkit:0")

place = paddle.CustomPlace("devkit", 0)
src = np.array([-2.0, -0.5, 0.0, 0.5, 3.0], dtype=np.float32)
x = paddle.to_tensor(src, place=place)
print("x:", x)
check("tensor on devkit place", "devkit" in str(x.place), str(x.place))
check("h2d->d2h roundtrip", np.array_equal(x.numpy(), src))

# Registered kernel: relu float32
os.environ["DEVKIT_TRACE"] = "1"
y = paddle.nn.functional.relu(x)
print("relu(x):", y)
check("relu on devkit", np.array_equal(y.numpy(), np.maximum(src, 0))
      and "devkit" in str(y.place), str(y.place))

# d2d copy
z = x.clone() if hasattr(x, "clone") else paddle.assign(x)
print("clone place:", z.place)

# Op with no devkit kernel: add (float32), and a float64 relu (dtype not registered)
for label, fn in [
    ("x + x (no 'add' kernel)", lambda: x + x),
    ("relu float64 (dtype not registered)",
     lambda: paddle.nn.functional.relu(paddle.to_tensor(src.astype("float64"), place=place))),
    ("matmul (no kernel)", lambda: paddle.matmul(x.reshape([1, 5]), x.reshape([5, 1]))),
]:
    try:
        r = fn()
        print(f"INFO: {label}: NO exception -> place={r.place} value={r.numpy().ravel().tolist()}")
    except Exception as e:  # noqa: BLE001
        msg = str(e)
        print(f"INFO: {label}: {type(e).__name__}:\n{msg[:1500]}")

# Autograd through the plugin kernel (relu_grad has no devkit kernel -> CPU fallback)
try:
    xg = paddle.to_tensor(src, place=place, stop_gradient=False)
    paddle.nn.functional.relu(xg).sum().backward()
    print("INFO: relu backward grad:", xg.grad.numpy().tolist(), "place:", xg.grad.place)
    check("relu backward", np.array_equal(xg.grad.numpy(), (src > 0).astype(np.float32)))
except Exception as e:  # noqa: BLE001
    print(f"INFO: relu backward: {type(e).__name__}: {str(e)[:800]}")
    check("relu backward", False)

# Same, with kernel fallback to CPU disabled
paddle.set_flags({"FLAGS_enable_api_kernel_fallback": False})
print("FLAGS_enable_api_kernel_fallback ->", paddle.get_flags(["FLAGS_enable_api_kernel_fallback"]))
try:
    r = x + x
    print(f"INFO: x + x with fallback off: NO exception -> place={r.place} value={r.numpy().tolist()}")
except Exception as e:  # noqa: BLE001
    print(f"INFO: x + x with fallback off: {type(e).__name__}:\n{str(e)[:1500]}")
paddle.set_flags({"FLAGS_enable_api_kernel_fallback": True})

# distributed / xccl presence (record only)
import paddle.distributed as dist  # noqa: E402
print("paddle.distributed import ok; has ProcessGroupCustom:",
      hasattr(paddle.base.core, "ProcessGroupCustom"))
print("core.is_compiled_with_custom_device:",
      getattr(paddle.base.core, "is_compiled_with_custom_device", None) and
      paddle.base.core.is_compiled_with_custom_device("devkit"))
import paddle.distributed.collective as coll  # noqa: E402
print("collective backends:", getattr(coll, "_BackendList", "n/a"))
print("core.is_compiled_with_distribute:", paddle.base.core.is_compiled_with_distribute())

print(f"SUMMARY: {fails} failure(s)")
sys.exit(fails)
