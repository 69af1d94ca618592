"""The kernel library of the plugins written in Python: every op as OpenCL C
kernels, planned in a dialect-neutral layer (layer.py) and grouped in
families (elementwise, reduce, linalg, nn, movement, shape, training, each
with its helper modules). The opencl plugin builds the programs with
pyopencl (devkit/backends/opencl/launch.py); the cuda plugin renders them as
CUDA C and builds them with NVRTC (devkit/backends/cuda/kernels.py).

Nothing here imports pyopencl or CuPy, so either plugin imports it without
the other's library."""
