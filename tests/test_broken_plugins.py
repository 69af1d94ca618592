"""Each broken plugin is refused with a PluginLoadError naming the cause, never a crash."""

import pytest

import devkit

MAJOR, MINOR = devkit.ABI_MAJOR, devkit.ABI_MINOR
BROKEN = {
    "WRONG_MAJOR": rf"implements devkit ABI {MAJOR + 1}\.{MINOR} but this host implements ABI {MAJOR}\.{MINOR}; "
                   r"the major versions must match",
    "SHORT_INFO": rf"DK_PluginInfo\.struct_size is \d+ bytes; ABI {MAJOR}\.{MINOR} needs at least \d+",
    "NULL_TABLE": r"returned a NULL DK_DeviceApi table",
    "SHORT_TABLE": r"DK_DeviceApi table is too short \(\d+ bytes.*missing required functions: stream_create, "
                   r"stream_destroy",
    "NULL_FUNCTION": r"required DK_DeviceApi functions are NULL: mem_free",
    "INIT_FAILS": r"DK_PluginInit failed with FAILED_PRECONDITION: no accelerator found on PCI bus 3",
    "NO_ENTRY": r"is not a devkit plugin: it does not export DK_PluginInit",
    "PARTIAL_GRAPHS": r"the graph section is partial: it has graph_begin_capture but not graph_end_capture, "
                      r"graph_launch, graph_rebind, graph_destroy .*all 5 graph functions or none",
    "PARTIAL_CODEGEN": r"the codegen section is partial: it has codegen_dialect but not codegen_compile, "
                       r"codegen_get_function, codegen_launch, codegen_unload .*all 5 codegen functions or none",
    "PARTIAL_HOST_REGISTRATION": r"the host registration section is partial: it has mem_register_host but not "
                                 r"mem_unregister_host .*all 2 host registration functions or none",
}


@pytest.mark.parametrize("variant", sorted(BROKEN))
def test_broken_plugin_is_refused(build_plugin, variant):
    path = build_plugin(variant.lower(), variant)
    with pytest.raises(devkit.PluginLoadError, match=BROKEN[variant]) as info:
        devkit.load_plugin(path)
    assert str(path) in str(info.value)


def test_wrong_major_reports_its_version(build_plugin):
    with pytest.raises(devkit.PluginLoadError) as info:
        devkit.load_plugin(build_plugin("major2", "WRONG_MAJOR"))
    assert info.value.abi_version == (devkit.ABI_MAJOR + 1, devkit.ABI_MINOR)


def test_not_a_shared_library(tmp_path):
    fake = tmp_path / "libdevkit_fake.so"
    fake.write_text("not an ELF file")
    with pytest.raises(devkit.PluginLoadError, match="cannot open plugin library"):
        devkit.load_plugin(fake)


def test_list_plugins_reports_broken_plugins_without_raising(tmp_path, monkeypatch, build_plugin):
    for variant in ("WRONG_MAJOR", "NULL_FUNCTION"):
        build_plugin(variant.lower(), variant)  # into tmp_path
    monkeypatch.setenv("DEVKIT_PLUGIN_PATH", str(tmp_path))
    listed = {d.name: d for d in devkit.list_plugins()}
    assert not listed["wrong_major"].loads and listed["wrong_major"].abi_version == (MAJOR + 1, MINOR)
    assert "major versions must match" in listed["wrong_major"].error
    assert not listed["null_function"].loads and "mem_free" in listed["null_function"].error
    assert listed["cpu"].loads
