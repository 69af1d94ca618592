"""devkit.h compiles as C and C++, and cffi's view of it matches the C compiler's."""

import os
import subprocess

import pytest

from devkit.abi import ABI_MAJOR, ABI_MINOR, HEADER_PATH, ffi, header_to_cdef, include_dir

CC = os.environ.get("CC", "cc")
CXX = os.environ.get("CXX", "c++")


def _compile(compiler, std, source, tmp_path, suffix, link=False):
    src = tmp_path / f"probe{suffix}"
    src.write_text(source)
    out = tmp_path / ("probe" if link else "probe.o")
    command = [compiler, f"-std={std}", "-Wall", "-Wextra", "-Werror", "-pedantic",
               f"-I{include_dir()}", str(src), "-o", str(out)]
    if not link:
        command.insert(1, "-c")
    result = subprocess.run(command, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    return out


INCLUDE_ONLY = '#include "devkit.h"\nint probe(void) { return DK_ABI_MAJOR; }\n'


def test_compiles_as_c11(tmp_path):
    _compile(CC, "c11", INCLUDE_ONLY, tmp_path, ".c")


def test_compiles_as_cxx17(tmp_path):
    _compile(CXX, "c++17", INCLUDE_ONLY.replace("(void)", "()"), tmp_path, ".cpp")


def _struct_names():
    typedefs, _, _ = ffi.list_types()
    return sorted(name for name in typedefs if ffi.typeof(name).kind == "struct")


def _enum_constants():
    constants = {}
    for typedef in ("DK_StatusCode", "DK_DeviceType", "DK_DataTypeCode", "DK_DTypeKeys",
                    "DK_LogLevel", "DK_DeviceFlags", "DK_EventFlags", "DK_ReduceOp",
                    "DK_AttributeType", "DK_KernelFlags", "DK_ArgKind"):
        for value, name in ffi.typeof(f"enum {typedef}").elements.items():
            constants[name] = value
    return constants


def test_cffi_layout_matches_the_c_compiler(tmp_path):
    """Every struct size, field offset and enumerator cffi derived equals the compiler's."""
    lines = ['#include <stdio.h>', '#include <stddef.h>', '#include "devkit.h"', "int main(void) {"]
    expected = []
    for struct in _struct_names():
        lines.append(f'  printf("%zu\\n", sizeof({struct}));')
        expected.append(ffi.sizeof(struct))
        for field, _ in ffi.typeof(struct).fields:
            lines.append(f'  printf("%zu\\n", offsetof({struct}, {field}));')
            expected.append(ffi.offsetof(struct, field))
    for name, value in _enum_constants().items():
        lines.append(f'  printf("%lld\\n", (long long){name});')
        expected.append(value)
    lines.append('  printf("%d %d\\n", DK_ABI_MAJOR, DK_ABI_MINOR);\n  return 0;\n}')
    program = _compile(CC, "c11", "\n".join(lines), tmp_path, ".c", link=True)
    output = subprocess.run([str(program)], capture_output=True, text=True, check=True).stdout
    *values, versions = output.strip().splitlines()
    assert [int(v) for v in values] == expected
    assert versions == f"{ABI_MAJOR} {ABI_MINOR}"


def test_tensor_is_dlpack_dltensor_layout():
    """DK_Tensor, DK_Device and DK_DataType keep DLPack's DLTensor layout (LP64)."""
    assert [(f, ffi.offsetof("DK_Tensor", f)) for f, _ in ffi.typeof("DK_Tensor").fields] == [
        ("data", 0), ("device", 8), ("ndim", 16), ("dtype", 20), ("shape", 24),
        ("strides", 32), ("byte_offset", 40)]
    assert ffi.sizeof("DK_Tensor") == 48
    assert ffi.sizeof("DK_DataType") == 4 and ffi.sizeof("DK_Device") == 8


def test_every_boundary_struct_starts_with_struct_size():
    dlpack_layout = {"DK_Device", "DK_DataType", "DK_Tensor"}
    for struct in _struct_names():
        if struct in dlpack_layout:
            continue
        name, field = ffi.typeof(struct).fields[0]
        assert (name, field.type.cname, field.offset) == ("struct_size", "size_t", 0), struct


@pytest.mark.parametrize("directive", ["#ifdef __cplusplus", "#if defined(_WIN32)"])
def test_cdef_drops_compiler_specific_blocks(directive):
    text = f"{directive}\nthis is not C\n#else\nint kept;\n#endif\n#define DK_X 7\n"
    cdef = header_to_cdef(text)
    assert "this is not C" not in cdef and "int kept;" in cdef and "#define DK_X 7" in cdef


def test_header_is_the_only_declaration_source():
    assert "DK_PluginInit" in HEADER_PATH.read_text()
    assert "DK_EXPORT" not in header_to_cdef(HEADER_PATH.read_text())


def _graph_section_comment() -> str:
    text = HEADER_PATH.read_text()
    start = text.index("--- OPTIONAL: graphs")
    return " ".join(text[start:text.index("DK_Status (*graph_begin_capture)")].split())


GRAPH_SECTION = ["graph_begin_capture", "graph_end_capture", "graph_launch", "graph_rebind",
                 "graph_destroy"]
CODEGEN_SECTION = ["codegen_dialect", "codegen_compile", "codegen_get_function", "codegen_launch",
                   "codegen_unload"]


def test_graph_section_is_appended_after_1_0_in_minor_1():
    """ABI 1.1 is append-only: the graph functions follow every 1.0 function."""
    fields = [name for name, _ in ffi.typeof("DK_DeviceApi").fields]
    start = fields.index("graph_begin_capture")
    assert ABI_MINOR >= 1 and fields[start:start + len(GRAPH_SECTION)] == GRAPH_SECTION
    assert fields[start - 1] == "group_end"  # the last function of 1.0


def test_codegen_section_is_appended_after_1_1_in_minor_2():
    """ABI 1.2 is append-only: the codegen functions follow the 1.1 graph section."""
    fields = [name for name, _ in ffi.typeof("DK_DeviceApi").fields]
    start = fields.index(CODEGEN_SECTION[0])
    assert ABI_MINOR >= 2 and fields[start:start + len(CODEGEN_SECTION)] == CODEGEN_SECTION
    assert fields[start - 1] == GRAPH_SECTION[-1]


def test_host_registration_is_appended_last_in_minor_3():
    """ABI 1.3 is append-only: host memory registration follows the 1.2 codegen section."""
    fields = [name for name, _ in ffi.typeof("DK_DeviceApi").fields]
    assert ABI_MINOR >= 3 and fields[-2:] == ["mem_register_host", "mem_unregister_host"]
    assert fields[-3] == CODEGEN_SECTION[-1]


def test_codegen_section_states_its_conventions():
    """The header names each dialect's signature, ownership and what capture does."""
    text = HEADER_PATH.read_text()
    comment = " ".join(text[text.index("--- OPTIONAL: codegen"):text.index("DK_Status (*codegen_dialect)")].split())
    for phrase in ('"c": void NAME(void *const *args, int64_t begin, int64_t end)', '"opencl-c": a __kernel',
                   '"cuda-c":', "Ownership:", "Graph capture:", "slots (they keep their memory"):
        assert phrase in comment, phrase


def test_graph_section_names_what_it_records_and_refuses():
    """The header says which calls a capture records and which it refuses, and the
    host's replay path (devkit.engine.graph) follows the same lists."""
    from devkit.engine import graph

    comment = _graph_section_comment()
    recorded, refused = comment.split("Refused with DK_FAILED_PRECONDITION")
    functions = {name for name, _ in ffi.typeof("DK_DeviceApi").fields}
    for name in graph._RECORDED:
        assert name in functions and name in recorded.split("Recorded:")[1], name
    for name in [*graph._REFUSED, "device_synchronize", "mem_free"]:
        assert name in functions and name in refused.split("mem_alloc is allowed")[0], name
