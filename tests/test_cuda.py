"""The cuda plugin's CPU-side parts: the OpenCL C -> CUDA C dialect, the
enumeration of every kernel program, the nvcc check, the NCCL id mapping and
the load refusal's reason. The GPU-side cases run where a CUDA device is
(ci/gpu-check.sh) and skip elsewhere with the reason the plugin gives."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

import devkit
from devkit.backends.cuda import ccl, check, dialect, sources
from devkit.backends.cuda.runtime import unavailable_reason

NVCC = check.find_nvcc()
REASON = unavailable_reason()


def test_list_plugins_shows_cuda_with_the_reason_it_does_not_load():
    if REASON is None:
        pytest.skip("this machine has a usable CUDA device")
    (cuda,) = [d for d in devkit.list_plugins() if d.name == "cuda"]
    assert (cuda.loads, cuda.source) == (False, "built-in")
    assert REASON in cuda.error
    assert re.search(r"CuPy is not installed|no CUDA driver|no usable CUDA driver|no CUDA device", cuda.error)


@pytest.mark.skipif(REASON is not None, reason=f"cuda plugin unavailable: {REASON}")
def test_cuda_device_round_trip():
    import numpy as np

    plugin = devkit.load_plugin("cuda")
    assert plugin.device_count >= 1
    data = np.arange(1 << 20, dtype=np.float32)
    device = devkit.device("cuda:0")
    assert np.array_equal(devkit.asarray(data, device=device).numpy(), data)


# -- the dialect ----------------------------------------------------------------------

_OPENCL = """#pragma OPENCL EXTENSION cl_khr_fp64 : enable
constant double table[2] = {1, 2};
inline float twice(global const float *x, local float *s, int i) { constant double *t = table; return x[i] * 2; }
kernel __attribute__((reqd_work_group_size(WN, WM, 1))) void k_tiled(global float *y) { y[0] = 1; }
kernel void k_sum(global const float *x, long n, local float *scratch, global float *y,
                  local long *counts) {
  local float tile[64];
  tile[get_local_id(0)] = x[get_global_id(0)];
  barrier(CLK_LOCAL_MEM_FENCE);
  y[get_group_id(0)] = tile[0] + scratch[0] + counts[0];
}
"""


def test_render_rewrites_qualifiers_and_kernel_signatures():
    cuda = dialect.render(_OPENCL)
    body = cuda[len(dialect.PRELUDE):]
    assert "#pragma OPENCL" not in body
    assert not re.search(r"\bglobal\b|\blocal\b|(?<!__)\bkernel\b", body)
    assert "__constant__ double table[2]" in body
    assert "__device__ inline float twice(const float *x, float *s, int i) { double *t = table;" in body
    assert 'extern "C" __global__ void __launch_bounds__(WN * WM * 1) k_tiled(float *y)' in body
    # local pointer parameters: byte offsets into the dynamic shared memory, in place.
    assert ('extern "C" __global__ void k_sum(const float *x, long n, unsigned long dk_local_scratch, '
            'float *y, unsigned long dk_local_counts) {') in body
    assert "float *scratch = (float *)(dk_shared_bytes + dk_local_scratch);" in body
    assert "long *counts = (long *)(dk_shared_bytes + dk_local_counts);" in body
    assert "__shared__ float tile[64];" in body
    assert dialect.local_parameters(_OPENCL, "k_sum") == ["scratch", "counts"]
    assert dialect.local_parameters(_OPENCL, "k_tiled") == []
    assert dialect.kernel_names(_OPENCL) == ["k_tiled", "k_sum"]


def test_a_kernel_a_macro_defines_gets_its_local_parameters_as_shared_memory_too():
    """SoftmaxGrad's kernels come from a macro: their ``local`` parameter must
    become an offset into the shared memory, inside the macro (an illegal
    address on the H200 while it stayed a pointer)."""
    source = ("#define DK_ROWS(NAME, TERM)                          \\\n"
              "  kernel void NAME(global float *x, long n,        \\\n"
              "                   local float *s) {               \\\n"
              "    s[0] = TERM;                                   \\\n"
              "  }\n"
              "DK_ROWS(k_one, x[0])\n")
    body = dialect.render(source)[len(dialect.PRELUDE):]
    header = body.split("\n")[1]  # the pointer is made on the brace's line, which continues the macro
    assert header.startswith('  extern "C" __global__ void NAME(float *x, long n, unsigned long dk_local_s) {')
    assert "float *s = (float *)(dk_shared_bytes + dk_local_s);" in header and header.endswith("\\")
    assert not re.search(r"\blocal\b", body)


def test_defines_keep_only_the_preprocessor_options():
    assert dialect.defines("-DWG=256 -cl-fp32-correctly-rounded-divide-sqrt -DTK=16") == ["-DWG=256", "-DTK=16"]


# -- the programs ---------------------------------------------------------------------


@pytest.fixture(scope="module")
def programs():
    return sources.programs()


def test_every_source_builder_of_the_families_is_enumerated(programs):
    import importlib

    built = {p.name.split("[")[0] for p in programs}
    expected = set()
    for module_name in sources.family_modules():
        module = importlib.import_module(f"{sources.KERNELS}.{module_name}")
        expected |= {f"{module_name}.{name}" for name, _ in sources._builders(module)}
    assert expected and expected <= built, sorted(expected - built)
    assert {"layer.copy", "training_conv._conv_grad", "training_rows._softmax_grad"} <= built


def test_programs_cover_every_dtype_of_the_elementwise_ops(programs):
    unary = sorted(p.name for p in programs if p.name.startswith("elementwise._unary_source"))
    assert unary == sorted(f"elementwise._unary_source[{n}]" for n in
                           ("bfloat16", "bool", "float16", "float32", "float64", "int32", "int64", "int8", "uint8"))
    assert len({p.source for p in programs}) == len(programs)
    assert all(dialect.kernel_names(p.source) or "NAME" in p.source for p in programs)


@pytest.mark.skipif(NVCC is None, reason="nvcc not found (PATH, $CUDA_HOME/bin, /usr/local/cuda/bin)")
def test_check_compiles_rendered_programs_with_nvcc(capsys):
    assert check.main(["-k", "elementwise._binary_source[float16]", "-j", "2"]) == 0
    assert re.fullmatch(r"1 sources compiled \(2 compilations: sm_90, sm_75; .*\)\n", capsys.readouterr().out)


@pytest.mark.skipif(NVCC is None, reason="nvcc not found (PATH, $CUDA_HOME/bin, /usr/local/cuda/bin)")
def test_check_reports_a_compile_error_and_a_missing_entry(tmp_path):
    broken = tmp_path / "broken.cu"
    broken.write_text(dialect.render("kernel void k_bad(global float *y) { y[0] = undeclared; }"))
    error = check.compile_ptx(NVCC, broken, "sm_90", [], ["k_bad"])
    assert error.startswith("nvcc exit status") and 'identifier "undeclared" is undefined' in error
    helper = tmp_path / "helper.cu"
    helper.write_text(dialect.render("inline float f(float x) { return x; }"))
    assert check.compile_ptx(NVCC, helper, "sm_90", [], ["k_gone"]) == \
        "no entry point for kernel(s) k_gone in the PTX"


def test_check_without_nvcc_skips_with_a_message(monkeypatch, capsys):
    monkeypatch.setattr(check, "find_nvcc", lambda: None)
    assert check.main([]) == 0
    assert "cuda kernel check skipped: nvcc not found" in capsys.readouterr().err
    assert check.main(["--require-nvcc"]) == 1


def test_check_runs_as_a_module():
    result = subprocess.run([sys.executable, "-m", "devkit.backends.cuda.check", "--help"],
                            capture_output=True, text=True)
    assert result.returncode == 0 and "nvcc --ptx" in result.stdout


# -- NCCL ids and tables --------------------------------------------------------------


def test_unique_id_round_trips_between_the_abi_bytes_and_cupys_tuple():
    raw = bytes(range(128))
    as_tuple = ccl.bytes_to_id(bytes(b ^ 0x80 for b in raw))
    assert all(-128 <= b <= 127 for b in as_tuple) and len(as_tuple) == 128
    assert ccl.id_to_bytes(as_tuple) == bytes(b ^ 0x80 for b in raw)
    assert ccl.id_to_bytes(ccl.bytes_to_id(raw)) == raw


def test_unique_id_of_the_wrong_size_is_refused():
    with pytest.raises(ccl.PluginError, match="id_size must be 128"):
        ccl.bytes_to_id(b"\0" * 64)
    with pytest.raises(ccl.PluginError, match="has 128 bytes, not 3"):
        ccl.id_to_bytes((1, 2, 3))


def test_reduce_ops_and_dtypes_map_to_nccl():
    from devkit.abi import C

    assert [ccl.nccl_op(op) for op in (C.DK_REDUCE_SUM, C.DK_REDUCE_PROD, C.DK_REDUCE_MAX,
                                       C.DK_REDUCE_MIN, C.DK_REDUCE_AVG)] == [0, 1, 2, 3, 4]
    assert (ccl.nccl_type(C.DK_DTYPE_FLOAT32), ccl.nccl_type(C.DK_DTYPE_BFLOAT16)) == (7, 9)
    with pytest.raises(ccl.PluginError, match="has no NCCL type"):
        ccl.nccl_type(C.DK_DTYPE_INT16)
    with pytest.raises(ccl.PluginError, match="unknown reduce op 9"):
        ccl.nccl_op(9)
