"""devkit.distributed on the host side: where a rank learns its place, the errors
init() gives when something is missing, and a world of one."""

from __future__ import annotations

import sys

import pytest

import devkit
from devkit import distributed
from devkit.distributed import LaunchEnvironment, launch_environment

LAUNCHER_VARIABLES = ("DEVKIT_RANK", "DEVKIT_WORLD_SIZE", "DEVKIT_LOCAL_RANK", "DEVKIT_RENDEZVOUS",
                      "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
                      "PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "PMIX_RANK")


@pytest.fixture
def no_launcher(monkeypatch):
    """A process no launcher started; tests add the variables they need."""
    for name in LAUNCHER_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


@pytest.fixture
def without_mpi4py(monkeypatch):
    monkeypatch.setitem(sys.modules, "mpi4py", None)  # makes "from mpi4py import MPI" fail


@pytest.mark.parametrize("environ,expected", [
    ({}, LaunchEnvironment(0, 1, 0, "none", "")),
    ({"DEVKIT_RANK": "2", "DEVKIT_WORLD_SIZE": "4", "DEVKIT_LOCAL_RANK": "0"},
     LaunchEnvironment(2, 4, 0, "devkit-run", "DEVKIT_RANK")),
    ({"DEVKIT_RANK": "1", "DEVKIT_WORLD_SIZE": "2"},
     LaunchEnvironment(1, 2, 1, "devkit-run", "DEVKIT_RANK")),
    ({"OMPI_COMM_WORLD_RANK": "3", "OMPI_COMM_WORLD_SIZE": "8", "OMPI_COMM_WORLD_LOCAL_RANK": "1",
      "PMIX_RANK": "3"},
     LaunchEnvironment(3, 8, 1, "Open MPI", "OMPI_COMM_WORLD_RANK")),
    ({"PMI_RANK": "5", "PMI_SIZE": "6", "MPI_LOCALRANKID": "2"},
     LaunchEnvironment(5, 6, 2, "MPICH/Hydra", "PMI_RANK")),
    ({"DEVKIT_RANK": "0", "DEVKIT_WORLD_SIZE": "2", "OMPI_COMM_WORLD_RANK": "1",
      "OMPI_COMM_WORLD_SIZE": "2", "OMPI_COMM_WORLD_LOCAL_RANK": "1"},
     LaunchEnvironment(0, 2, 0, "devkit-run", "DEVKIT_RANK")),
], ids=["none", "devkit-run", "devkit-run-no-local-rank", "open-mpi", "mpich", "devkit-run-first"])
def test_launch_environment(environ, expected):
    assert launch_environment(environ) == expected


@pytest.mark.parametrize("environ,message", [
    ({"DEVKIT_RANK": "1"}, "DEVKIT_RANK is set but DEVKIT_WORLD_SIZE is not"),
    ({"DEVKIT_RANK": "one", "DEVKIT_WORLD_SIZE": "2"}, "DEVKIT_RANK='one' is not an integer"),
    ({"PMI_RANK": "4", "PMI_SIZE": "4"}, "MPICH/Hydra: rank 4 (PMI_RANK) is not in a world of 4"),
])
def test_launch_environment_refuses_bad_variables(environ, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        launch_environment(environ)


def test_pmix_without_mpi4py_says_what_to_install(without_mpi4py):
    with pytest.raises(ImportError, match=r"started by PMIx \(PMIX_RANK is set\).*pip install mpi4py"):
        launch_environment({"PMIX_RANK": "0"})


def test_init_names_a_plugin_without_collectives(build_plugin):
    path = build_plugin("nocollectives")
    with pytest.raises(devkit.UnimplementedError,
                       match="plugin 'nocollectives' has no collectives") as info:
        distributed.init(str(path))
    assert isinstance(info.value, NotImplementedError)
    with pytest.raises(devkit.UnimplementedError, match="plugin 'nocollectives' has no collectives"):
        distributed.group(str(path))


def _cpu_with_collectives() -> devkit.Plugin:
    cpu = devkit.load_plugin("cpu")
    assert cpu.has_collectives, "the cpu plugin lost its collectives"
    return cpu


def test_init_without_a_launcher_is_a_world_of_one(no_launcher):
    cpu = _cpu_with_collectives()
    with distributed.init("cpu") as comm:
        assert (comm.rank, comm.size, comm.device) == (0, 1, cpu.device(0))
        assert "rank 0 of 1 on cpu:0" in repr(comm)
    assert "destroyed" in repr(comm)


def test_init_under_mpi_without_mpi4py_says_what_to_install(no_launcher, without_mpi4py):
    _cpu_with_collectives()
    for name, value in {"OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_SIZE": "2",
                        "OMPI_COMM_WORLD_LOCAL_RANK": "1"}.items():
        no_launcher.setenv(name, value)
    with pytest.raises(ImportError, match=r"Open MPI \(OMPI_COMM_WORLD_RANK is set\).*"
                                          r"pip install mpi4py.*or start the ranks with devkit-run"):
        distributed.init("cpu")


def test_init_with_ranks_but_no_rendezvous_says_what_to_set(no_launcher):
    _cpu_with_collectives()
    no_launcher.setenv("DEVKIT_RANK", "1")
    no_launcher.setenv("DEVKIT_WORLD_SIZE", "2")
    with pytest.raises(RuntimeError, match="DEVKIT_RENDEZVOUS is not set. Start the ranks with devkit-run"):
        distributed.init("cpu")


def test_init_picks_the_device_by_local_rank(no_launcher):
    cpu = _cpu_with_collectives()
    count = cpu.device_count
    no_launcher.setenv("DEVKIT_RANK", "0")
    no_launcher.setenv("DEVKIT_WORLD_SIZE", "1")
    no_launcher.setenv("DEVKIT_LOCAL_RANK", str(count + 1))
    with distributed.init("cpu") as comm:
        assert comm.device is cpu.device((count + 1) % count)
    with distributed.init("cpu", device="cpu:0") as comm:
        assert comm.device is cpu.device(0)


def test_the_launchers_job_id_travels_in_the_cpu_unique_id(no_launcher):
    cpu = _cpu_with_collectives()
    no_launcher.setenv("DEVKIT_JOB_ID", "0123456789abcdef")
    unique_id = distributed.new_unique_id(cpu)
    assert unique_id[32:48] == b"0123456789abcdef" and unique_id[48:] == bytes(16)
    with distributed.Communicator(cpu.device(0), 0, 1, unique_id) as comm:  # its segment is named after it
        assert comm.size == 1
    corrupt = unique_id[:32] + b"0123456789abcdeX" + unique_id[48:]
    with pytest.raises(devkit.InvalidArgumentError, match=r"ccl_comm_init: the id's job id is not hex digits"):
        distributed.Communicator(cpu.device(0), 0, 1, corrupt)
    no_launcher.setenv("DEVKIT_JOB_ID", "../../etc")
    with pytest.raises(devkit.InvalidArgumentError,
                       match=r'ccl_get_unique_id: DEVKIT_JOB_ID="\.\./\.\./etc" is invalid: expected 1 to 16 '
                             r"lowercase hex digits \(devkit-run sets it\)"):
        distributed.new_unique_id(cpu)
