"""Collectives across ranks (processes, or threads) through a plugin's CCL.

    import devkit.distributed as dist

    comm = dist.init()                        # rank / world size from devkit-run or mpirun
    x = devkit.asarray(np.ones(1024, np.float32), device=comm.device)
    comm.all_reduce(x)                        # in place: every rank now holds the sum

``init()`` learns its rank and the world size from the launcher's environment
(devkit-run's DEVKIT_* variables, or Open MPI's, MPICH/Hydra's or PMIx's),
has rank 0 make the communicator's unique id, carries the id to the other
ranks (through devkit-run's rendezvous store, or MPI_Bcast via mpi4py) and
joins the communicator. Without any launcher variables the process is a
world of one.

Every collective takes contiguous ``devkit.Array``s on the communicator's
device, checks them before calling into the plugin, and returns its output
array. With ``stream=None`` the call is complete when it returns; with a
stream it is enqueued and the arrays are kept alive until the stream is
synchronized; freeing one meanwhile releases its memory only after the
collective (docs/framework-guide.md). See docs/collectives.md.
"""

from __future__ import annotations

import dataclasses
import os
import threading

import numpy as np

from .. import dtypes, runtime
from ..abi import C, ffi
from ..errors import DeadlineExceededError, UnimplementedError
from ..plugin import Plugin, load_plugin
from ..runtime import Array, Destroyable, Device, Stream, empty
from .rendezvous import RENDEZVOUS_ENV, RendezvousClient

__all__ = [
    "COLLECTIVE_DTYPES", "Communicator", "Group", "LaunchEnvironment", "REDUCE_OPS", "group", "init",
    "launch_environment", "new_unique_id",
]

# The dtypes the header's collectives section promises.
COLLECTIVE_DTYPES = tuple(np.dtype(name) for name in (
    "int8", "uint8", "int32", "int64", "float16", "float32", "float64")) + (dtypes.bfloat16,)

REDUCE_OPS = {"sum": C.DK_REDUCE_SUM, "prod": C.DK_REDUCE_PROD, "max": C.DK_REDUCE_MAX,
              "min": C.DK_REDUCE_MIN, "avg": C.DK_REDUCE_AVG}

RENDEZVOUS_TIMEOUT_ENV = "DEVKIT_RENDEZVOUS_TIMEOUT"
DEFAULT_RENDEZVOUS_TIMEOUT = 300.0  # seconds a rank waits for rank 0's unique id

# What init() needs; each collective checks its own function when called.
_SETUP_FUNCTIONS = ("ccl_unique_id_size", "ccl_get_unique_id", "ccl_comm_init", "ccl_comm_destroy")

# (launcher, rank, world size, local rank) variables, in the order they are tried.
# PMIx exports no world size or local rank: those come from mpi4py.
_LAUNCHER_VARIABLES = (
    ("devkit-run", "DEVKIT_RANK", "DEVKIT_WORLD_SIZE", "DEVKIT_LOCAL_RANK"),
    ("Open MPI", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK"),
    ("MPICH/Hydra", "PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID"),
    ("PMIx", "PMIX_RANK", None, None),
)


# -- where this process sits -------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class LaunchEnvironment:
    """This process's place in the job, as its launcher described it."""

    rank: int
    world_size: int
    local_rank: int
    launcher: str        # "devkit-run", "Open MPI", "MPICH/Hydra", "PMIx" or "none"
    rank_variable: str   # the variable the rank was read from ("" for "none")

    @property
    def is_mpi(self) -> bool:
        return self.launcher not in ("devkit-run", "none")


def launch_environment(environ=None) -> LaunchEnvironment:
    """Read rank, world size and local rank from devkit-run's or an MPI launcher's variables."""
    environ = os.environ if environ is None else environ
    for launcher, rank_var, size_var, local_var in _LAUNCHER_VARIABLES:
        if rank_var not in environ:
            continue
        rank = _int_variable(environ, rank_var)
        if size_var is None:
            world_size = _mpi_module(launcher, rank_var).COMM_WORLD.Get_size()
        elif size_var in environ:
            world_size = _int_variable(environ, size_var)
        else:
            raise ValueError(f"{rank_var} is set but {size_var} is not: {launcher} sets both")
        if world_size < 1 or not 0 <= rank < world_size:
            raise ValueError(f"{launcher}: rank {rank} ({rank_var}) is not in a world of {world_size}")
        if local_var is not None and local_var in environ:
            local_rank = _int_variable(environ, local_var)
        elif launcher == "devkit-run":
            local_rank = rank
        else:  # the rank among those sharing this machine's memory
            mpi = _mpi_module(launcher, rank_var)
            local_rank = mpi.COMM_WORLD.Split_type(mpi.COMM_TYPE_SHARED).Get_rank()
        return LaunchEnvironment(rank, world_size, local_rank, launcher, rank_var)
    return LaunchEnvironment(0, 1, 0, "none", "")


def _int_variable(environ, name: str) -> int:
    value = environ[name]
    try:
        return int(value)
    except ValueError:
        raise ValueError(f"{name}={value!r} is not an integer") from None


def _seconds_variable(name: str, default: float) -> float:
    value = os.environ.get(name)
    if value is None:
        return default
    try:
        seconds = float(value)
    except ValueError:
        seconds = -1.0
    if seconds <= 0:
        raise ValueError(f"{name}={value!r} is not a positive number of seconds")
    return seconds


def _mpi_module(launcher: str, rank_var: str):
    try:
        from mpi4py import MPI
    except ImportError as exc:
        raise ImportError(
            f"devkit.distributed: this process was started by {launcher} ({rank_var} is set); "
            f"the ranks exchange the communicator's unique id through MPI_Bcast, which needs "
            f"mpi4py: pip install mpi4py (or pip install 'devkit[mpi]'), or start the ranks "
            f"with devkit-run instead") from exc
    return MPI


# -- joining a communicator -----------------------------------------------------------


def require_collectives(plugin: Plugin, functions=_SETUP_FUNCTIONS) -> None:
    """Raise UnimplementedError naming the plugin unless it has ``functions``."""
    missing = [name for name in functions if not plugin.has(name)]
    if missing:
        what = "no collectives" if not plugin.has_collectives else "no " + ", ".join(missing)
        raise UnimplementedError(
            f"plugin '{plugin.name}' has {what}: its DK_DeviceApi leaves "
            f"{', '.join(missing)} NULL ({plugin.location})")


def new_unique_id(plugin: Plugin | str = "cpu") -> bytes:
    """A fresh communicator id: made once, by rank 0, and carried to every rank."""
    plugin = load_plugin(plugin) if not isinstance(plugin, Plugin) else plugin
    require_collectives(plugin, ("ccl_unique_id_size", "ccl_get_unique_id"))
    size = ffi.new("size_t *")
    plugin.call("ccl_unique_id_size", size)
    unique_id = ffi.new("char[]", int(size[0]))
    plugin.call("ccl_get_unique_id", unique_id, int(size[0]))
    return bytes(ffi.buffer(unique_id, int(size[0])))


_init_lock = threading.Lock()
_init_count = 0  # names each init()'s rendezvous key: ranks call init() in the same order


def init(plugin: Plugin | str = "cpu", device: Device | int | str | None = None) -> Communicator:
    """Join the job's communicator; blocks until every rank has joined.

    ``device`` defaults to local_rank % the plugin's device count. Every rank
    must call init() the same number of times, in the same order.
    """
    global _init_count
    plugin = load_plugin(plugin) if not isinstance(plugin, Plugin) else plugin
    require_collectives(plugin)
    env = launch_environment()
    device = _resolve_device(plugin, device, env.local_rank)
    with _init_lock:
        sequence = _init_count
        _init_count += 1
    unique_id = _share_unique_id(plugin, env, sequence)
    return Communicator(device, env.rank, env.world_size, unique_id)


def _resolve_device(plugin: Plugin, device, local_rank: int) -> Device:
    if device is None:
        count = plugin.device_count
        if count < 1:
            raise RuntimeError(f"plugin '{plugin.name}' has no devices")
        return plugin.device(local_rank % count)
    if isinstance(device, Device):
        if device.plugin is not plugin:
            raise ValueError(f"device {device} does not belong to plugin '{plugin.name}'")
        return device
    if isinstance(device, str):
        return _resolve_device(plugin, runtime.device(device), local_rank)
    return plugin.device(int(device))


def _share_unique_id(plugin: Plugin, env: LaunchEnvironment, sequence: int) -> bytes:
    if env.world_size == 1:
        return new_unique_id(plugin)
    address = os.environ.get(RENDEZVOUS_ENV)
    if address:
        return _share_through_rendezvous(plugin, env, sequence, address)
    if env.is_mpi:
        communicator = _mpi_module(env.launcher, env.rank_variable).COMM_WORLD
        return communicator.bcast(new_unique_id(plugin) if env.rank == 0 else None, root=0)
    raise RuntimeError(
        f"devkit.distributed.init: rank {env.rank} of {env.world_size} ({env.launcher}) cannot "
        f"receive rank 0's unique id: {RENDEZVOUS_ENV} is not set. Start the ranks with "
        f"devkit-run, which sets it, or set {RENDEZVOUS_ENV}=host:port of a devkit rendezvous store")


def _share_through_rendezvous(plugin: Plugin, env: LaunchEnvironment, sequence: int,
                              address: str) -> bytes:
    client = RendezvousClient(address)
    key = f"devkit.distributed.unique_id.{sequence}"
    if env.rank == 0:
        unique_id = new_unique_id(plugin)
        client.put(key, unique_id)
        return unique_id
    timeout = _seconds_variable(RENDEZVOUS_TIMEOUT_ENV, DEFAULT_RENDEZVOUS_TIMEOUT)
    try:
        return client.get(key, timeout)
    except DeadlineExceededError as exc:
        raise DeadlineExceededError(
            f"devkit.distributed.init: rank {env.rank} of {env.world_size} waited {timeout:g} s at "
            f"rendezvous {address} for rank 0's unique id (init call #{sequence}); rank 0 did not "
            f"call devkit.distributed.init() in time (set {RENDEZVOUS_TIMEOUT_ENV} to wait "
            f"longer)") from exc


# -- groups ------------------------------------------------------------------------------


class _GroupState(threading.local):
    """Groups are per thread (as in the plugin); their calls are issued at the outermost end,
    so until then their arrays are held (a free() waits) and their streams retain them after."""

    def __init__(self):
        self.depth = 0
        self.pending: list[tuple[Stream | None, tuple]] = []  # (stream, the call's objects)

    def issued(self) -> None:
        """The outermost group ended: its work is on its streams now."""
        pending, self.pending = self.pending, []
        for stream, objects in pending:
            if stream is not None:
                stream.retain(*objects)
        for stream, objects in pending:
            for obj in objects:
                if isinstance(obj, Array):
                    obj.buffer._allocation.unhold()


_group_state = _GroupState()


def group(plugin: Plugin | str = "cpu") -> Group:
    """``with group(plugin):`` issues the enclosed send/recv/collectives together at the end.

    Groups are per thread and nest; only the outermost exit issues. Paired
    sends and receives inside one group cannot deadlock.
    """
    return Group(load_plugin(plugin) if not isinstance(plugin, Plugin) else plugin)


class Group:
    """The context manager ``group()`` returns: group_start on entry, group_end on exit."""

    def __init__(self, plugin: Plugin):
        require_collectives(plugin, ("group_start", "group_end"))
        self.plugin = plugin

    def __enter__(self) -> Group:
        self.plugin.call("group_start")
        _group_state.depth += 1
        return self

    def __exit__(self, *exc_info) -> None:
        _group_state.depth -= 1
        try:
            self.plugin.call("group_end")
        finally:
            if _group_state.depth == 0:
                _group_state.issued()


# -- the communicator -------------------------------------------------------------------


class Communicator(Destroyable):
    """One rank's handle on a communicator of ``size`` ranks, bound to ``device``.

    Usually made by ``init()``; the constructor joins directly, given the id
    rank 0 made with ``new_unique_id()`` (ranks may be threads of one process).
    Released by ``destroy()``, a ``with`` block, or garbage collection.
    """

    def __init__(self, device: Device, rank: int, size: int, unique_id: bytes):
        self._handle = None  # set once joined; __del__ may run if joining fails
        require_collectives(device.plugin)
        if size < 1 or not 0 <= rank < size:
            raise ValueError(f"rank {rank} is not in a communicator of {size} ranks")
        self.device = device
        self.rank = int(rank)
        self.size = int(size)
        self._barrier_buffer: Array | None = None
        out = ffi.new("DK_Comm *")
        unique_id = bytes(unique_id)
        device.call("ccl_comm_init", device.index, self.size, ffi.from_buffer(unique_id),
                    len(unique_id), self.rank, out)
        self._handle = out[0]

    @property
    def plugin(self) -> Plugin:
        return self.device.plugin

    @property
    def handle(self):
        if self._handle is None:
            raise ValueError("communicator has been destroyed")
        return self._handle

    # -- collectives ----------------------------------------------------------

    def all_reduce(self, x: Array, out: Array | None = None, op: str = "sum",
                   stream: Stream | None = None) -> Array:
        """Every rank receives the reduction of every rank's ``x`` (in place when out is None)."""
        x, out = self._same_size_pair("all_reduce", x, out)
        self._issue("all_reduce", (x, out), stream, *_location(x), *_location(out), x.size,
                    _key(x), _reduce_op(op, x.dtype))
        return out

    def broadcast(self, x: Array, root: int = 0, out: Array | None = None,
                  stream: Stream | None = None) -> Array:
        """Every rank receives ``root``'s ``x`` (into x itself when out is None)."""
        x, out = self._same_size_pair("broadcast", x, out)
        self._issue("broadcast", (x, out), stream, *_location(x), *_location(out), x.size, _key(x),
                    self._rank_argument("root", root))
        return out

    def reduce(self, x: Array, out: Array | None = None, op: str = "sum", root: int = 0,
               stream: Stream | None = None) -> Array:
        """``root`` receives the reduction; ``out`` (x when None) is untouched on other ranks."""
        x, out = self._same_size_pair("reduce", x, out)
        self._issue("reduce", (x, out), stream, *_location(x), *_location(out), x.size, _key(x),
                    _reduce_op(op, x.dtype), self._rank_argument("root", root))
        return out

    def all_gather(self, x: Array, out: Array | None = None, stream: Stream | None = None) -> Array:
        """``out`` holds every rank's ``x``, rank-major; shape (size * x.shape[0], ...) when made here.

        In place: ``x`` is ``out``'s block for this rank, out[rank * n:(rank + 1) * n].
        """
        x = self._operand("x", x)
        if out is None:
            shape = (self.size * x.shape[0], *x.shape[1:]) if x.ndim else (self.size,)
            out = empty(shape, x.dtype, self.device, stream)
        out = self._output(out, x)
        if out.size != self.size * x.size:
            raise ValueError(f"all_gather: out has {out.size} elements; {self.size} ranks x "
                             f"{x.size} elements of x need {self.size * x.size}")
        _check_overlap("all_gather", x, "x", out, "out", out.buffer.offset + out.offset
                       + self.rank * x.nbytes, f"out's block for rank {self.rank}")
        self._issue("all_gather", (x, out), stream, *_location(x), *_location(out), x.size, _key(x))
        return out

    def reduce_scatter(self, x: Array, out: Array | None = None, op: str = "sum",
                       stream: Stream | None = None) -> Array:
        """Rank r receives block r of the reduction of every rank's ``x``.

        ``x`` holds size blocks; ``out`` is made with shape (x.shape[0] // size, ...)
        when None (flat when the first axis does not divide). In place: ``out``
        is ``x``'s block for this rank.
        """
        x = self._operand("x", x)
        if x.size % self.size:
            raise ValueError(f"reduce_scatter: x has {x.size} elements, not a multiple of the "
                             f"{self.size} ranks")
        count = x.size // self.size
        if out is None:
            shape = ((x.shape[0] // self.size, *x.shape[1:])
                     if x.ndim and x.shape[0] % self.size == 0 else (count,))
            out = empty(shape, x.dtype, self.device, stream)
        out = self._output(out, x)
        if out.size != count:
            raise ValueError(f"reduce_scatter: out has {out.size} elements; x's {x.size} elements "
                             f"over {self.size} ranks give {count}")
        _check_overlap("reduce_scatter", out, "out", x, "x", x.buffer.offset + x.offset
                       + self.rank * out.nbytes, f"x's block for rank {self.rank}")
        self._issue("reduce_scatter", (x, out), stream, *_location(x), *_location(out), count,
                    _key(x), _reduce_op(op, x.dtype))
        return out

    def all_to_all(self, x: Array, out: Array | None = None, stream: Stream | None = None) -> Array:
        """Block j of ``x`` goes to rank j; block i of ``out`` comes from rank i (in place when out is None)."""
        x, out = self._same_size_pair("all_to_all", x, out)
        if x.size % self.size:
            raise ValueError(f"all_to_all: x has {x.size} elements, not a multiple of the "
                             f"{self.size} ranks")
        self._issue("all_to_all", (x, out), stream, *_location(x), *_location(out),
                    x.size // self.size, _key(x))
        return out

    def send(self, x: Array, peer: int, stream: Stream | None = None) -> None:
        """Send all of ``x`` to rank ``peer``, which must issue the matching recv."""
        x = self._operand("x", x)
        self._issue("send", (x,), stream, *_location(x), x.size, _key(x),
                    self._rank_argument("peer", peer))

    def recv(self, out: Array, peer: int, stream: Stream | None = None) -> Array:
        """Receive ``out.size`` elements from rank ``peer`` into ``out``."""
        out = self._operand("out", out)
        self._issue("recv", (out,), stream, *_location(out), out.size, _key(out),
                    self._rank_argument("peer", peer))
        return out

    def group(self) -> Group:
        """``with comm.group():`` issues the enclosed calls together (see ``group``)."""
        return Group(self.plugin)

    def barrier(self) -> None:
        """Returns once every rank has called barrier()."""
        if _group_state.depth:
            raise RuntimeError("barrier() inside a group would only be issued at the group's end")
        if self._barrier_buffer is None:
            self._barrier_buffer = empty((1,), np.int32, self.device)
            self._barrier_buffer.buffer.fill(0)
        self.all_reduce(self._barrier_buffer)

    # -- lifetime ----------------------------------------------------------------

    def destroy(self) -> None:
        """Wait for this communicator's pending work, then release it."""
        if self._handle is not None:
            handle, self._handle = self._handle, None
            self.plugin.call("ccl_comm_destroy", handle)
            self._barrier_buffer = None

    def __repr__(self) -> str:
        state = "" if self._handle is not None else " destroyed"
        return f"<devkit.distributed.Communicator rank {self.rank} of {self.size} on {self.device}{state}>"

    # -- checks and the call ---------------------------------------------------------

    def _operand(self, what: str, array) -> Array:
        if not isinstance(array, Array):
            raise TypeError(f"{what} must be a devkit.Array, got {type(array).__name__}")
        if array.device is not self.device:
            raise ValueError(f"{what} is on {array.device}, but this communicator's device is "
                             f"{self.device}")
        if not array.is_contiguous:
            raise ValueError(f"{what} is not contiguous (shape {array.shape}, strides "
                             f"{array.strides}); collectives need contiguous arrays: copy() it")
        if array.dtype not in COLLECTIVE_DTYPES:
            raise TypeError(f"{what} has dtype {array.dtype}, which collectives do not carry "
                            f"(supported: {', '.join(str(d) for d in COLLECTIVE_DTYPES)})")
        return array

    def _output(self, out, x: Array) -> Array:
        out = self._operand("out", out)
        if out.dtype != x.dtype:
            raise TypeError(f"out has dtype {out.dtype} but x has {x.dtype}; they must match")
        return out

    def _same_size_pair(self, function: str, x, out):
        x = self._operand("x", x)
        if out is None:
            return x, x
        out = self._output(out, x)
        if out.size != x.size:
            raise ValueError(f"{function}: out has {out.size} elements (shape {out.shape}) but x "
                             f"has {x.size} (shape {x.shape}); they must match")
        start = out.buffer.offset + out.offset
        _check_overlap(function, x, "x", out, "out", start, "out itself")
        return x, out

    def _rank_argument(self, what: str, value: int) -> int:
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
            raise TypeError(f"{what} must be an int rank, got {type(value).__name__}")
        if not 0 <= value < self.size:
            raise ValueError(f"{what} {value} is not a rank of this communicator "
                             f"(0 <= {what} < {self.size})")
        return int(value)

    def _issue(self, function: str, arrays: tuple, stream: Stream | None, *args) -> None:
        require_collectives(self.plugin, (function,))
        if stream is not None:
            if not isinstance(stream, Stream):
                raise TypeError(f"stream must be a devkit.Stream or None, got {type(stream).__name__}")
            if stream.device is not self.device:
                raise ValueError(f"stream belongs to {stream.device}, but this communicator's "
                                 f"device is {self.device}")
        self.plugin.call(function, self.handle, *args,
                         stream.handle if stream is not None else ffi.NULL)
        if _group_state.depth:  # issued only at the group's end: hold the memory until then
            for array in arrays:
                array.buffer._allocation.hold()
            _group_state.pending.append((stream, (self, *arrays)))
        elif stream is not None:
            stream.retain(self, *arrays)


def _location(array: Array) -> tuple:
    """(DK_Mem handle, byte offset) of a contiguous array's first element."""
    return array.buffer.handle, array.buffer.offset + array.offset


def _key(array: Array) -> int:
    return dtypes.dtype_key(array.dtype)


def _reduce_op(op: str, dtype: np.dtype) -> int:
    if op not in REDUCE_OPS:
        raise ValueError(f"unknown reduction op {op!r} (choose from {', '.join(REDUCE_OPS)})")
    if op == "avg" and dtype.kind != "f" and dtype != dtypes.bfloat16:
        raise TypeError(f"op 'avg' needs a floating dtype, got {dtype}")
    return REDUCE_OPS[op]


def _check_overlap(function: str, a: Array, a_name: str, b: Array, b_name: str,
                   allowed_start: int, allowed_name: str) -> None:
    """Overlapping operands must be exactly in place: ``a`` starting at ``allowed_start`` of b's memory."""
    if not a.nbytes or not b.nbytes or a.buffer.handle != b.buffer.handle:
        return
    a_start, b_start = a.buffer.offset + a.offset, b.buffer.offset + b.offset
    if a_start < b_start + b.nbytes and b_start < a_start + a.nbytes and a_start != allowed_start:
        raise ValueError(f"{function}: {a_name} overlaps {b_name} without being {allowed_name}; "
                         f"pass separate memory, or exactly {allowed_name} for in place")
