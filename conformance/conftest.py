"""Runs every conformance case once per plugin under test.

DEVKIT_TEST_PLUGINS=cpu,opencl picks the plugins (names or library paths),
DEVKIT_TEST_PLUGINS=all every discoverable plugin that loads (vendor plugins
installed in the environment too); unset, the built-in plugins that load (cpu,
and opencl where it finds a device). A plugin named there that fails to load
fails its cases: it is never silently dropped.
"""

import gc
import os

import numpy as np
import pytest

import devkit


def selected_plugins() -> list[str]:
    requested = os.environ.get("DEVKIT_TEST_PLUGINS", "").strip()
    if requested and requested != "all":
        return [name.strip() for name in requested.split(",") if name.strip()]
    return [descriptor.name for descriptor in devkit.list_plugins()
            if descriptor.loads and (requested == "all" or descriptor.source == "built-in")]


PLUGINS = selected_plugins()


def has_collectives(name: str) -> bool | None:
    """Whether the plugin has collectives; None when it does not load (its tests then fail)."""
    try:
        return devkit.load_plugin(name).has_collectives
    except devkit.PluginLoadError:
        return None


def pytest_configure(config):
    # Registered here rather than in pyproject.toml: the installed suite
    # (devkit.conformance) runs without the repository's configuration.
    config.addinivalue_line(
        "markers", "full: a heavy case; devkit-conformance runs it only with --profile full")


def pytest_generate_tests(metafunc):
    if "plugin" in metafunc.fixturenames:
        metafunc.parametrize("plugin", PLUGINS, ids=[os.path.basename(p) for p in PLUGINS],
                             indirect=True, scope="session")


@pytest.fixture(scope="session")
def plugin(request) -> devkit.Plugin:
    return devkit.load_plugin(request.param)


@pytest.fixture
def dev(plugin) -> devkit.Device:
    return plugin.device(0)


@pytest.fixture
def dev_pair(plugin) -> tuple[devkit.Device, devkit.Device]:
    if plugin.device_count < 2:
        pytest.skip(reason=f"plugin '{plugin.name}' has one device; this case needs two")
    return plugin.device(0), plugin.device(1)


def _plain(value):
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


@pytest.fixture
def record_property(record_property):
    """pytest's, with NumPy scalars made Python numbers: properties travel
    between processes (pytest-xdist, devkit-conformance's workers)."""
    return lambda name, value: record_property(name, _plain(value))


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    if call.when == "call":
        item.call_failed = outcome.get_result().failed


@pytest.fixture(autouse=True)
def plugin_allocator():
    """Cases drive the plugin's own mem_alloc / mem_free(_async): the runtime's
    caching allocator would answer in its place and hide a plugin that leaks."""
    previous = devkit.set_allocator("none")
    yield
    devkit.set_allocator(previous)


@pytest.fixture(autouse=True)
def memory_returns_to_baseline(request, plugin_allocator):
    """Leak check: every device's free memory is the same after the case as before."""
    if "plugin" not in request.fixturenames:
        yield
        return
    devices = request.getfixturevalue("plugin").devices()
    for device in devices:  # frees the last case ordered on its streams complete first
        device.synchronize()
    before = [device.mem_get_info()[0] for device in devices]
    yield
    if getattr(request.node, "call_failed", False):
        return  # the failure's traceback still holds the case's arrays
    for device in devices:
        device.synchronize()
    after = [device.mem_get_info()[0] for device in devices]
    if after != before:  # only arrays in reference cycles are left: collect them (slow), then look again
        gc.collect()
        for device in devices:
            device.synchronize()
        after = [device.mem_get_info()[0] for device in devices]
    # More free memory than before is no leak: an earlier case's last objects went meanwhile.
    leaked = {str(d): b - a for d, b, a in zip(devices, before, after) if b > a}
    assert not leaked, f"device memory not returned after the case (bytes): {leaked}"
