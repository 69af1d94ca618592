"""The collectives section of the cuda plugin, on NCCL (cupy.cuda.nccl).

The ABI's unique id is NCCL's ncclUniqueId (128 bytes) as raw bytes; CuPy
hands it out, and takes it back, as a tuple of 128 signed chars
(``id_to_bytes`` / ``bytes_to_id``). DK_ReduceOp's numbering is NCCL's
(ncclSum 0 ... ncclAvg 4); dtypes map through ``NCCL_TYPES``. all_to_all is
a group of a send and a recv per peer. The id mapping and the tables import
nothing of CuPy, so they are unit-tested without a GPU.
"""

from __future__ import annotations

import threading

from ...abi import C, ffi
from ..support.boundary import PluginError, handle_key, invalid
from .runtime import Device, cuda

UNIQUE_ID_BYTES = 128  # NCCL_UNIQUE_ID_BYTES
# ncclDataType_t by DK dtype key.
NCCL_TYPES = {
    C.DK_DTYPE_INT8: 0, C.DK_DTYPE_UINT8: 1, C.DK_DTYPE_BOOL: 1, C.DK_DTYPE_INT32: 2,
    C.DK_DTYPE_UINT32: 3, C.DK_DTYPE_INT64: 4, C.DK_DTYPE_UINT64: 5, C.DK_DTYPE_FLOAT16: 6,
    C.DK_DTYPE_FLOAT32: 7, C.DK_DTYPE_FLOAT64: 8, C.DK_DTYPE_BFLOAT16: 9,
}
REDUCE_OPS = {C.DK_REDUCE_SUM: 0, C.DK_REDUCE_PROD: 1, C.DK_REDUCE_MAX: 2, C.DK_REDUCE_MIN: 3,
              C.DK_REDUCE_AVG: 4}


def id_to_bytes(unique_id) -> bytes:
    """CuPy's id (128 ints in [-128, 127]) as the ABI's bytes."""
    if len(unique_id) != UNIQUE_ID_BYTES:
        raise invalid(f"an NCCL unique id has {UNIQUE_ID_BYTES} bytes, not {len(unique_id)}")
    return bytes(b & 0xFF for b in unique_id)


def bytes_to_id(data: bytes) -> tuple[int, ...]:
    """The ABI's bytes as CuPy's id tuple (signed chars)."""
    if len(data) != UNIQUE_ID_BYTES:
        raise invalid(f"id_size must be {UNIQUE_ID_BYTES} (ccl_unique_id_size), got {len(data)}")
    return tuple(b - 256 if b > 127 else b for b in data)


def itemsize(dtype: int) -> int:
    return max(1, ((dtype >> 8) & 0xFF) // 8)


def nccl_type(dtype: int) -> int:
    try:
        return NCCL_TYPES[dtype]
    except KeyError:
        raise invalid(f"dtype key {dtype:#x} has no NCCL type") from None


def nccl_op(op: int) -> int:
    try:
        return REDUCE_OPS[op]
    except KeyError:
        raise invalid(f"unknown reduce op {op} (DK_REDUCE_SUM..DK_REDUCE_AVG)") from None


class Comm:
    def __init__(self, device: Device, communicator, nranks: int, rank: int):
        self.device, self.nccl, self.nranks, self.rank = device, communicator, nranks, rank


def functions(devices: list[Device]) -> dict:
    """The table's collective functions over the plugin's ``devices``."""
    comms: dict[int, Comm] = {}
    handles = iter(range(1 << 40, 1 << 62, 16))
    lock = threading.Lock()

    def nccl():
        return cuda().cuda.nccl

    def comm_of(handle) -> Comm:
        with lock:
            comm = comms.get(handle_key(handle)) if handle != ffi.NULL else None
        if comm is None:
            raise invalid(f"communicator {handle_key(handle):#x} is not live")
        return comm

    def buffer(comm: Comm, what: str, mem, offset: int, count: int, dtype: int) -> int:
        if mem == ffi.NULL:
            return 0  # the unused buffer of a non-root rank
        return comm.device.mem(what, mem, offset, count * itemsize(dtype))

    def stream_of(comm: Comm, stream) -> int:
        s = comm.device.stream(stream)
        return comm.device.null_stream if s is None else s

    def finish(comm: Comm, stream) -> None:
        if stream == ffi.NULL:  # NULL stream: complete before returning
            comm.device.runtime.streamSynchronize(comm.device.null_stream)

    def unique_id_size(size):
        size[0] = UNIQUE_ID_BYTES

    def get_unique_id(out, size):
        if size != UNIQUE_ID_BYTES:
            raise invalid(f"size must be {UNIQUE_ID_BYTES}, got {size}")
        ffi.memmove(out, id_to_bytes(nccl().get_unique_id()), UNIQUE_ID_BYTES)

    def comm_init(dev, nranks, unique_id, id_size, rank, comm):
        if not 0 <= dev < len(devices):
            raise invalid(f"device index {dev} out of range [0, {len(devices)})")
        if not 0 <= rank < nranks:
            raise invalid(f"rank {rank} out of range [0, {nranks})")
        device = devices[dev]
        with device.context():
            communicator = nccl().NcclCommunicator(nranks, bytes_to_id(ffi.buffer(unique_id, id_size)[:]), rank)
        key = next(handles)
        with lock:
            comms[key] = Comm(device, communicator, nranks, rank)
        comm[0] = ffi.cast("DK_Comm", key)

    def comm_destroy(comm):
        if comm == ffi.NULL:
            return
        c = comm_of(comm)
        with lock:
            comms.pop(handle_key(comm), None)
        c.device.synchronize()
        c.nccl.destroy()

    def collective(run):
        def call(comm, *args):
            c = comm_of(comm)
            with c.device.context():
                run(c, *args)
        return call

    def all_reduce(c, send, so, recv, ro, count, dtype, op, stream):
        c.nccl.allReduce(buffer(c, "send", send, so, count, dtype), buffer(c, "recv", recv, ro, count, dtype),
                         count, nccl_type(dtype), nccl_op(op), stream_of(c, stream))
        finish(c, stream)

    def broadcast(c, send, so, recv, ro, count, dtype, root, stream):
        c.nccl.broadcast(buffer(c, "send", send, so, count, dtype), buffer(c, "recv", recv, ro, count, dtype),
                         count, nccl_type(dtype), root, stream_of(c, stream))
        finish(c, stream)

    def reduce(c, send, so, recv, ro, count, dtype, op, root, stream):
        c.nccl.reduce(buffer(c, "send", send, so, count, dtype), buffer(c, "recv", recv, ro, count, dtype),
                      count, nccl_type(dtype), nccl_op(op), root, stream_of(c, stream))
        finish(c, stream)

    def all_gather(c, send, so, recv, ro, count, dtype, stream):
        c.nccl.allGather(buffer(c, "send", send, so, count, dtype),
                         buffer(c, "recv", recv, ro, count * c.nranks, dtype), count, nccl_type(dtype),
                         stream_of(c, stream))
        finish(c, stream)

    def reduce_scatter(c, send, so, recv, ro, count, dtype, op, stream):
        c.nccl.reduceScatter(buffer(c, "send", send, so, count * c.nranks, dtype),
                             buffer(c, "recv", recv, ro, count, dtype), count, nccl_type(dtype),
                             nccl_op(op), stream_of(c, stream))
        finish(c, stream)

    def all_to_all(c, send, so, recv, ro, count, dtype, stream):
        if send == recv and so == ro and count and c.nranks > 1:
            raise PluginError(C.DK_UNIMPLEMENTED, "in-place all_to_all is not supported on NCCL yet")
        source = buffer(c, "send", send, so, count * c.nranks, dtype)
        target = buffer(c, "recv", recv, ro, count * c.nranks, dtype)
        block, s = count * itemsize(dtype), stream_of(c, stream)
        nccl().groupStart()
        try:
            for peer in range(c.nranks):
                c.nccl.send(source + peer * block, count, nccl_type(dtype), peer, s)
                c.nccl.recv(target + peer * block, count, nccl_type(dtype), peer, s)
        finally:
            nccl().groupEnd()
        finish(c, stream)

    def send(c, buf, offset, count, dtype, peer, stream):
        c.nccl.send(buffer(c, "buf", buf, offset, count, dtype), count, nccl_type(dtype), peer,
                    stream_of(c, stream))
        finish(c, stream)

    def recv(c, buf, offset, count, dtype, peer, stream):
        c.nccl.recv(buffer(c, "buf", buf, offset, count, dtype), count, nccl_type(dtype), peer,
                    stream_of(c, stream))
        finish(c, stream)

    return {
        "ccl_unique_id_size": unique_id_size, "ccl_get_unique_id": get_unique_id,
        "ccl_comm_init": comm_init, "ccl_comm_destroy": comm_destroy,
        "all_reduce": collective(all_reduce), "broadcast": collective(broadcast),
        "reduce": collective(reduce), "all_gather": collective(all_gather),
        "reduce_scatter": collective(reduce_scatter), "all_to_all": collective(all_to_all),
        "send": collective(send), "recv": collective(recv),
        "group_start": lambda: nccl().groupStart(), "group_end": lambda: nccl().groupEnd(),
    }
