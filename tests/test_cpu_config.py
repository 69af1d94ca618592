"""The cpu plugin's configuration and fault injection (read once per process)."""

import textwrap

from tests.conftest import run_python


def run(code: str, **env) -> list[str]:
    result = run_python(textwrap.dedent(code), env={k: str(v) for k, v in env.items()})
    assert result.returncode == 0, result.stderr
    return result.stdout.splitlines()


def test_device_count_and_capacity():
    lines = run("""
        import devkit
        cpu = devkit.load_plugin("cpu")
        dev = cpu.device(2)
        print(cpu.device_count, dev.properties.total_memory, dev.mem_get_info())
        try:
            dev.alloc((1 << 20) + 1)
        except devkit.OutOfMemoryError as e:
            print("OOM", e)
        b = dev.alloc(1 << 20)
        print(dev.mem_get_info())
    """, DEVKIT_CPU_DEVICES=3, DEVKIT_CPU_MEMORY="1MiB")
    assert lines[0] == "3 1048576 (1048576, 1048576)"
    assert lines[1] == ("OOM [RESOURCE_EXHAUSTED] cannot allocate 1048577 bytes on cpu:2: more than "
                        "its max_alloc_size of 1048576 bytes")
    assert lines[2] == "(0, 1048576)"


def test_default_configuration():
    lines = run("""
        import devkit
        cpu = devkit.load_plugin("cpu")
        print(cpu.device_count, cpu.device(0).properties.total_memory)
    """)
    assert lines == [f"2 {4 << 30}"]


def test_invalid_configuration_refuses_to_load():
    for variable, value in [("DEVKIT_CPU_DEVICES", "0"), ("DEVKIT_CPU_DEVICES", "two"),
                            ("DEVKIT_CPU_MEMORY", "12 parsecs"), ("DEVKIT_CPU_THREADS", "0"),
                            ("DEVKIT_CPU_THREADS", "two"), ("DEVKIT_CPU_THREADS", "257"),
                            ("DEVKIT_CPU_SPIN_US", "-1"), ("DEVKIT_CPU_SPIN_US", "100001")]:
        lines = run("""
            import devkit
            try:
                devkit.load_plugin("cpu")
            except devkit.PluginLoadError as e:
                print(e)
        """, **{variable: value})
        assert "DK_PluginInit failed with INVALID_ARGUMENT" in lines[0]
        assert variable in lines[0] and value in lines[0]


def test_fail_nth_allocation():
    lines = run("""
        import devkit
        dev = devkit.device("cpu:1")
        for i in range(1, 5):
            try:
                dev.alloc(64)
                print(i, "ok")
            except devkit.OutOfMemoryError as e:
                print(i, "OOM", e)
    """, DEVKIT_CPU_FAIL_ALLOC=3, DEVKIT_ALLOCATOR="none")  # every alloc reaches the plugin
    assert lines[:2] == ["1 ok", "2 ok"] and lines[3] == "4 ok"
    assert lines[2].startswith("3 OOM") and "injected" in lines[2] and "DEVKIT_CPU_FAIL_ALLOC" in lines[2]


def test_lost_device():
    lines = run("""
        import devkit
        cpu = devkit.load_plugin("cpu")
        lost = cpu.device(1)
        print(lost.properties.name)
        for action in (lambda: lost.alloc(8), lost.mem_get_info, lost.synchronize, lost.create_stream):
            try:
                action()
            except devkit.DeviceLostError as e:
                print("LOST", e)
        print(cpu.device(0).alloc(8).nbytes)
    """, DEVKIT_CPU_LOST_DEVICE=1)
    assert lines[0] == "devkit cpu device 1"
    assert len([line for line in lines if line.startswith("LOST [DEVICE_LOST] cpu.")]) == 4
    assert all("DEVKIT_CPU_LOST_DEVICE" in line for line in lines[1:5])
    assert lines[5] == "8"

