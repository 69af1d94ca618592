// Paddle's xccl_* hooks (device_ext.h) forwarded onto the devkit plugin's
// collectives section (devkit.h, "OPTIONAL: collectives"). Paddle's
// ProcessGroupCustom (backend "xccl") drives them: rank 0 makes the unique id,
// Paddle's TCP store carries it to every rank, each rank joins with
// xccl_comm_init_rank on its current device (FLAGS_selected_devkits).
//
// A C_CCLComm is the plugin's DK_Comm itself. Buffers are pointers Paddle
// holds, resolved to (handle, offset) as the rest of the bridge does.
// Collectives run on the device's default (NULL) stream, so each is complete
// when its call returns (inside a group: when the outermost group_end
// returns), as the bridge's kernels and copies are; Paddle's stream argument
// is not used, and the stream work Paddle orders after it (events, waits) is
// then already satisfied.
//
// What the plugin lacks (no collectives section, a dtype or reduce op it
// refuses) is C_ERROR with the reason on stderr; Paddle raises it as its
// "CustomDevice error".
#include "bridge_ccl.h"

#include <cstdlib>

namespace devkit_paddle {
namespace {

BridgeAccess g;

const char* plugin_name() {
  const char* name = std::getenv("DEVKIT_PADDLE_PLUGIN");
  return name != nullptr && *name != '\0' ? name : "cpu";
}

// C_ERROR, saying that the plugin has no `function` (its collectives section leaves it NULL).
C_Status missing(const char* hook, const char* function) {
  g.report(std::string(hook) + ": devkit plugin '" + plugin_name() + "' has no " + function +
           " (its collectives section leaves it NULL)");
  return C_ERROR;
}

bool dtype_key(C_DataType type, DK_DTypeKey* key) {
  switch (type) {
    case BOOL: *key = DK_DTYPE_BOOL; return true;
    case UINT8: *key = DK_DTYPE_UINT8; return true;
    case UINT16: *key = DK_DTYPE_UINT16; return true;
    case UINT32: *key = DK_DTYPE_UINT32; return true;
    case UINT64: *key = DK_DTYPE_UINT64; return true;
    case INT8: *key = DK_DTYPE_INT8; return true;
    case INT16: *key = DK_DTYPE_INT16; return true;
    case INT32: *key = DK_DTYPE_INT32; return true;
    case INT64: *key = DK_DTYPE_INT64; return true;
    case FLOAT16: *key = DK_DTYPE_FLOAT16; return true;
    case FLOAT32: *key = DK_DTYPE_FLOAT32; return true;
    case FLOAT64: *key = DK_DTYPE_FLOAT64; return true;
    case BFLOAT16: *key = DK_DTYPE_BFLOAT16; return true;
    default: return false;  // complex and undefined: devkit has no such dtype
  }
}

const char* dtype_name(C_DataType type) {
  switch (type) {
    case COMPLEX64: return "complex64";
    case COMPLEX128: return "complex128";
    case UNDEFINED: return "undefined";
    default: return "(unknown)";  // dtype_key maps every other C_DataType
  }
}

bool reduce_op(C_CCLReduceOp op, int32_t* out) {
  switch (op) {
    case SUM: *out = DK_REDUCE_SUM; return true;
    case AVG: *out = DK_REDUCE_AVG; return true;
    case MAX: *out = DK_REDUCE_MAX; return true;
    case MIN: *out = DK_REDUCE_MIN; return true;
    case PRODUCT: *out = DK_REDUCE_PROD; return true;
    default: return false;
  }
}

// A buffer argument: where Paddle's pointer lies.
struct Operand {
  DK_Mem mem = nullptr;
  size_t offset = 0;
};

// The arguments every hook checks and converts; `ok` false once one failed (already reported).
struct Call {
  const char* hook;
  bool ok = true;
  DK_DTypeKey dtype = 0;
  int32_t op = 0;

  explicit Call(const char* hook) : hook(hook) {}
  Call(const char* hook, C_DataType type) : hook(hook) {
    if (!dtype_key(type, &dtype)) fail(std::string("Paddle dtype ") + dtype_name(type) + " has no devkit dtype");
  }
  void reduce(C_CCLReduceOp paddle_op) {
    if (ok && !reduce_op(paddle_op, &op))
      fail("Paddle reduce op " + std::to_string(static_cast<int>(paddle_op)) + " has no devkit reduce op");
  }
  Operand buffer(const void* pointer) {
    Operand operand;
    if (ok && !g.resolve(pointer, &operand.mem, &operand.offset))
      fail("pointer " + std::to_string(reinterpret_cast<uintptr_t>(pointer)) +
           " is not inside a live devkit allocation");
    return operand;
  }
  int32_t rank(size_t value) {
    if (ok && value > static_cast<size_t>(INT32_MAX)) fail("rank " + std::to_string(value) + " is out of range");
    return static_cast<int32_t>(value);
  }
  void fail(const std::string& why) {
    g.report(std::string(hook) + ": " + why);
    ok = false;
  }
};

DK_Comm comm_of(C_CCLComm comm) { return reinterpret_cast<DK_Comm>(comm); }

C_Status get_unique_id_size(size_t* size) {
  if (g.api->ccl_unique_id_size == nullptr) return missing("xccl_get_unique_id_size", "ccl_unique_id_size");
  return g.status(g.api->ccl_unique_id_size(size), "ccl_unique_id_size");
}

C_Status get_unique_id(C_CCLRootId* id) {
  if (g.api->ccl_get_unique_id == nullptr) return missing("xccl_get_unique_id", "ccl_get_unique_id");
  return g.status(g.api->ccl_get_unique_id(id->data, id->sz), "ccl_get_unique_id");
}

C_Status comm_init_rank(size_t nranks, C_CCLRootId* id, size_t rank, C_CCLComm* comm) {
  if (g.api->ccl_comm_init == nullptr) return missing("xccl_comm_init_rank", "ccl_comm_init");
  Call call("xccl_comm_init_rank");
  int32_t n = call.rank(nranks), r = call.rank(rank);
  if (!call.ok) return C_ERROR;
  DK_Comm made = nullptr;
  C_Status st = g.status(g.api->ccl_comm_init(g.current_device(), n, id->data, id->sz, r, &made), "ccl_comm_init");
  *comm = reinterpret_cast<C_CCLComm>(made);
  return st;
}

C_Status destroy_comm(C_CCLComm comm) {
  if (g.api->ccl_comm_destroy == nullptr) return missing("xccl_destroy_comm", "ccl_comm_destroy");
  return g.status(g.api->ccl_comm_destroy(comm_of(comm)), "ccl_comm_destroy");
}

// all_reduce and reduce_scatter: (send, recv, count, dtype, op).
using ReducingFn = DK_Status (*)(DK_Comm, DK_Mem, size_t, DK_Mem, size_t, size_t, DK_DTypeKey, int32_t, DK_Stream);
C_Status reducing(const char* hook, const char* function, ReducingFn fn, void* send, void* recv, size_t count,
                  C_DataType type, C_CCLReduceOp op, C_CCLComm comm) {
  if (fn == nullptr) return missing(hook, function);
  Call call(hook, type);
  call.reduce(op);
  Operand in = call.buffer(send), out = call.buffer(recv);
  if (!call.ok) return C_ERROR;
  return g.status(fn(comm_of(comm), in.mem, in.offset, out.mem, out.offset, count, call.dtype, call.op, nullptr),
                  function);
}

C_Status all_reduce(void* send, void* recv, size_t count, C_DataType type, C_CCLReduceOp op, C_CCLComm comm,
                    C_Stream) {
  return reducing("xccl_all_reduce", "all_reduce", g.api->all_reduce, send, recv, count, type, op, comm);
}

C_Status reduce_scatter(void* send, void* recv, size_t count, C_DataType type, C_CCLReduceOp op, C_CCLComm comm,
                        C_Stream) {
  return reducing("xccl_reduce_scatter", "reduce_scatter", g.api->reduce_scatter, send, recv, count, type, op, comm);
}

// In place on `buf`: the root's data reaches every rank.
C_Status broadcast(void* buf, size_t count, C_DataType type, size_t root, C_CCLComm comm, C_Stream) {
  if (g.api->broadcast == nullptr) return missing("xccl_broadcast", "broadcast");
  Call call("xccl_broadcast", type);
  Operand data = call.buffer(buf);
  int32_t r = call.rank(root);
  if (!call.ok) return C_ERROR;
  return g.status(g.api->broadcast(comm_of(comm), data.mem, data.offset, data.mem, data.offset, count, call.dtype,
                                   r, nullptr), "broadcast");
}

C_Status reduce(void* send, void* recv, size_t count, C_DataType type, C_CCLReduceOp op, size_t root,
                C_CCLComm comm, C_Stream) {
  if (g.api->reduce == nullptr) return missing("xccl_reduce", "reduce");
  Call call("xccl_reduce", type);
  call.reduce(op);
  Operand in = call.buffer(send), out = call.buffer(recv);
  int32_t r = call.rank(root);
  if (!call.ok) return C_ERROR;
  return g.status(g.api->reduce(comm_of(comm), in.mem, in.offset, out.mem, out.offset, count, call.dtype, call.op,
                                r, nullptr), "reduce");
}

C_Status all_gather(void* send, void* recv, size_t count, C_DataType type, C_CCLComm comm, C_Stream) {
  if (g.api->all_gather == nullptr) return missing("xccl_all_gather", "all_gather");
  Call call("xccl_all_gather", type);
  Operand in = call.buffer(send), out = call.buffer(recv);
  if (!call.ok) return C_ERROR;
  return g.status(g.api->all_gather(comm_of(comm), in.mem, in.offset, out.mem, out.offset, count, call.dtype,
                                    nullptr), "all_gather");
}

C_Status group_start() {
  if (g.api->group_start == nullptr) return missing("xccl_group_start", "group_start");
  return g.status(g.api->group_start(), "group_start");
}

C_Status group_end() {
  if (g.api->group_end == nullptr) return missing("xccl_group_end", "group_end");
  return g.status(g.api->group_end(), "group_end");
}

// send and recv: `count` elements of `buf` to / from rank `peer`.
using PeerFn = DK_Status (*)(DK_Comm, DK_Mem, size_t, size_t, DK_DTypeKey, int32_t, DK_Stream);
C_Status point_to_point(const char* hook, const char* function, PeerFn fn, void* buf, size_t count, C_DataType type,
                        size_t peer, C_CCLComm comm) {
  if (fn == nullptr) return missing(hook, function);
  Call call(hook, type);
  Operand data = call.buffer(buf);
  int32_t p = call.rank(peer);
  if (!call.ok) return C_ERROR;
  return g.status(fn(comm_of(comm), data.mem, data.offset, count, call.dtype, p, nullptr), function);
}

C_Status send(void* buf, size_t count, C_DataType type, size_t peer, C_CCLComm comm, C_Stream) {
  return point_to_point("xccl_send", "send", g.api->send, buf, count, type, peer, comm);
}

C_Status recv(void* buf, size_t count, C_DataType type, size_t peer, C_CCLComm comm, C_Stream) {
  return point_to_point("xccl_recv", "recv", g.api->recv, buf, count, type, peer, comm);
}

}  // namespace

void register_collectives(C_DeviceInterface* i, const BridgeAccess& access) {
  if (access.api == nullptr) return;  // no plugin: Paddle's own "not implemented" errors say so
  g = access;
  // Filled even where the plugin has no collectives, so that Paddle's error comes with the reason.
  i->xccl_get_unique_id_size = get_unique_id_size;
  i->xccl_get_unique_id = get_unique_id;
  i->xccl_comm_init_rank = comm_init_rank;
  i->xccl_destroy_comm = destroy_comm;
  i->xccl_all_reduce = all_reduce;
  i->xccl_broadcast = broadcast;
  i->xccl_reduce = reduce;
  i->xccl_all_gather = all_gather;
  i->xccl_reduce_scatter = reduce_scatter;
  i->xccl_group_start = group_start;
  i->xccl_group_end = group_end;
  i->xccl_send = send;
  i->xccl_recv = recv;
}

}  // namespace devkit_paddle
