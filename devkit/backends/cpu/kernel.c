/*
 * kernel.c -- the kernel table, the launcher every kernel entry shares, and
 * the element-loop helpers of kernel.h.
 */
#include "kernel.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

/* ---- Registration ---------------------------------------------------------- */

typedef struct registered {
  const cpu_kernel_def *defs;
  size_t count;
} registered;

static registered g_registered[64];
static size_t g_num_registered;
static bool g_registration_overflow;

void cpu_register_kernels(const cpu_kernel_def *defs, size_t count) {
  /* Constructors run single-threaded, while the library loads. */
  if (g_num_registered == sizeof g_registered / sizeof g_registered[0]) {
    g_registration_overflow = true;
    return;
  }
  g_registered[g_num_registered++] = (registered){defs, count};
}

static cpu_init_fn g_inits[16];
static size_t g_num_inits;

void cpu_register_init(cpu_init_fn fn) {
  if (g_num_inits == sizeof g_inits / sizeof g_inits[0]) {
    g_registration_overflow = true;
    return;
  }
  g_inits[g_num_inits++] = fn;
}

static DK_Status kernel_launch(const DK_KernelCall *call);

static DK_KernelEntry *g_entries;
static const DK_KernelEntry **g_entry_ptrs;
static size_t g_num_entries;

static int compare_entries(const void *a, const void *b) {
  const DK_KernelEntry *x = *(const DK_KernelEntry *const *)a;
  const DK_KernelEntry *y = *(const DK_KernelEntry *const *)b;
  int c = strcmp(x->op, y->op);
  if (c) return c;
  uint32_t kx = x->dtype.code | (uint32_t)x->dtype.bits << 8;
  uint32_t ky = y->dtype.code | (uint32_t)y->dtype.bits << 8;
  return (kx > ky) - (kx < ky);
}

/* DEVKIT_CPU_KERNELS=primitives publishes only the kernels of the primitive
 * set (devkit.ops.PRIMITIVES; tests/test_ops_dispatch.py checks that the two
 * lists agree), so the cpu plugin stands in for a new chip that has only those. */
static const char *const k_primitives[] = {
    "Add", "Atan", "BitwiseAnd", "Cast", "Concat", "Cos", "CumSum", "Div",
    "Equal", "Erf", "Exp", "Expand", "Floor", "Gather", "Less", "Log",
    "MatMul", "Mod", "Mul", "Pow", "ReduceMax", "ReduceSum", "Reshape",
    "ScatterElements", "Sin", "Slice", "Sqrt", "Transpose", "Where",
};

static bool is_primitive(const char *op) {
  for (size_t i = 0; i < sizeof k_primitives / sizeof k_primitives[0]; i++)
    if (strcmp(op, k_primitives[i]) == 0) return true;
  return false;
}

static DK_Status build_table(void) {
  static const char fn[] = "DK_PluginInit";
  if (g_registration_overflow)
    return cpu_set_error(DK_INTERNAL, "%s: too many kernel files or initialisers registered", fn);
  for (size_t i = 0; i < g_num_inits; i++) {
    DK_Status st = g_inits[i]();
    if (st != DK_OK) return st;
  }
  bool only_primitives = cpu_primitives_only();
  size_t total = 0;
  for (size_t r = 0; r < g_num_registered; r++) total += g_registered[r].count;
  g_entries = calloc(total ? total : 1, sizeof *g_entries);
  g_entry_ptrs = calloc(total ? total : 1, sizeof *g_entry_ptrs);
  if (!g_entries || !g_entry_ptrs) {
    free(g_entries);
    free(g_entry_ptrs);
    g_entries = NULL;
    g_entry_ptrs = NULL;
    return cpu_set_error(DK_RESOURCE_EXHAUSTED, "%s: out of memory for the kernel table", fn);
  }
  size_t n = 0;
  for (size_t r = 0; r < g_num_registered; r++) {
    for (size_t i = 0; i < g_registered[r].count; i++) {
      const cpu_kernel_def *def = &g_registered[r].defs[i];
      if (only_primitives && !is_primitive(def->op)) continue;
      g_entries[n] = (DK_KernelEntry){
          .struct_size = sizeof(DK_KernelEntry),
          .op = def->op,
          .dtype = {.code = (uint8_t)(def->dtype & 0xff),
                    .bits = (uint8_t)((def->dtype >> 8) & 0xff),
                    .lanes = 1},
          .fn = kernel_launch,
          .flags = def->flags,
          .user_data = (void *)def,
      };
      g_entry_ptrs[n] = &g_entries[n];
      n++;
    }
  }
  qsort(g_entry_ptrs, n, sizeof *g_entry_ptrs, compare_entries);
  for (size_t i = 1; i < n; i++)
    if (compare_entries(&g_entry_ptrs[i - 1], &g_entry_ptrs[i]) == 0)
      return cpu_set_error(DK_INTERNAL, "%s: kernel %s is registered twice for one dtype",
                           fn, g_entry_ptrs[i]->op);
  g_num_entries = n;
  return DK_OK;
}

static pthread_once_t g_build_once = PTHREAD_ONCE_INIT;
static DK_Status g_build_status;
static char g_build_message[256];

static void build_once(void) {
  g_build_status = build_table();
  if (g_build_status != DK_OK)
    snprintf(g_build_message, sizeof g_build_message, "%s", cpu_last_error());
}

DK_Status cpu_kernel_table(const DK_KernelEntry *const **entries, size_t *count) {
  pthread_once(&g_build_once, build_once);
  if (g_build_status != DK_OK) return cpu_set_error(g_build_status, "%s", g_build_message);
  *entries = g_entry_ptrs;
  *count = g_num_entries;
  return DK_OK;
}

/* ---- Launch ----------------------------------------------------------------- */

/* A launch is one stream work item: this header, then the tensors, the
 * attributes and an arena for what the attributes point to. */
typedef struct launch {
  const cpu_kernel_def *def;
  cpu_kernel_args args;
} launch;

#define ALIGN8(n) (((n) + 7) & ~(size_t)7)

static size_t attribute_payload(const DK_Attribute *a) {
  size_t bytes = ALIGN8(strlen(a->name) + 1);
  if (a->type == DK_ATTR_INTS) bytes += ALIGN8((size_t)a->count * sizeof(int64_t));
  if (a->type == DK_ATTR_FLOATS) bytes += ALIGN8((size_t)a->count * sizeof(double));
  if (a->type == DK_ATTR_STRING) bytes += ALIGN8(strlen(a->s) + 1);
  return bytes;
}

static DK_Status check_attribute(const char *op, size_t i, const DK_Attribute *a) {
  if (!a || a->struct_size < offsetof(DK_Attribute, dtype) + sizeof a->dtype || !a->name)
    return cpu_set_error(DK_INVALID_ARGUMENT, "%s: attribute %zu is NULL, short or unnamed", op, i);
  bool list = a->type == DK_ATTR_INTS || a->type == DK_ATTR_FLOATS;
  if (a->type < DK_ATTR_INT || a->type > DK_ATTR_DTYPE)
    return cpu_set_error(DK_INVALID_ARGUMENT, "%s: attribute '%s' has unknown type %d", op,
                         a->name, a->type);
  if (list && (a->count < 0 || (a->count && !(a->type == DK_ATTR_INTS ? (const void *)a->ints
                                                                         : (const void *)a->floats))))
    return cpu_set_error(DK_INVALID_ARGUMENT, "%s: attribute '%s' has count %lld and no elements",
                         op, a->name, (long long)a->count);
  if (a->type == DK_ATTR_STRING && !a->s)
    return cpu_set_error(DK_INVALID_ARGUMENT, "%s: string attribute '%s' is NULL", op, a->name);
  return DK_OK;
}

static int32_t itemsize_of(DK_DataType t) {
  bool known = (t.code == DK_DTYPE_CODE_INT || t.code == DK_DTYPE_CODE_UINT ||
                t.code == DK_DTYPE_CODE_FLOAT || t.code == DK_DTYPE_CODE_BFLOAT ||
                t.code == DK_DTYPE_CODE_BOOL);
  if (!known || t.lanes != 1 || !t.bits || t.bits % 8 || t.bits > 64) return 0;
  return t.bits / 8;
}

void cpu_compact_strides(int32_t ndim, const int64_t *shape, int64_t *strides) {
  int64_t step = 1;
  for (int32_t d = ndim - 1; d >= 0; d--) {
    strides[d] = step;
    step *= shape[d] > 1 ? shape[d] : 1;
  }
}

DK_Status cpu_resolve_tensor(const char *op, cpu_device *d, int32_t dev, bool strided,
                             const char *role, size_t i, const DK_Tensor *t,
                             cpu_tensor *r) {
  memset(r, 0, sizeof *r);
  if (t->ndim == -1 && role[0] == 'i') {
    r->ndim = -1;
    return DK_OK;
  }
  if (t->ndim < 0 || t->ndim > CPU_MAX_DIMS)
    return cpu_set_error(DK_INVALID_ARGUMENT, "%s: %s %zu has rank %d; the cpu plugin supports 0 to %d",
                         op, role, i, t->ndim, CPU_MAX_DIMS);
  if (t->ndim > 0 && !t->shape)
    return cpu_set_error(DK_INVALID_ARGUMENT, "%s: %s %zu has a NULL shape", op, role, i);
  if (t->device.device_type != DK_DEVICE_TYPE_CPU || t->device.device_id != dev)
    return cpu_set_error(DK_INVALID_ARGUMENT,
                         "%s: %s %zu is on device (type %d, id %d), not on cpu device %d", op,
                         role, i, t->device.device_type, t->device.device_id, dev);
  r->itemsize = itemsize_of(t->dtype);
  if (!r->itemsize)
    return cpu_set_error(DK_INVALID_ARGUMENT, "%s: %s %zu has unsupported dtype (code %u, bits %u, lanes %u)",
                         op, role, i, t->dtype.code, t->dtype.bits, t->dtype.lanes);
  r->ndim = t->ndim;
  r->dtype = (DK_DTypeKey)(t->dtype.code | t->dtype.bits << 8 | 1 << 16);
  r->size = 1;
  for (int32_t k = 0; k < t->ndim; k++) {
    if (t->shape[k] < 0)
      return cpu_set_error(DK_INVALID_ARGUMENT, "%s: %s %zu has negative dimension %lld", op,
                           role, i, (long long)t->shape[k]);
    r->shape[k] = t->shape[k];
    r->size *= t->shape[k];
  }
  cpu_compact_strides(r->ndim, r->shape, r->strides);
#ifdef DEVKIT_DEFECT_IGNORE_STRIDES
  const bool honour_strides = false; /* the defect: every view read as compact */
#else
  const bool honour_strides = true;
#endif
  if (t->strides && honour_strides) {
    for (int32_t k = 0; k < t->ndim; k++) {
      if (!strided && r->shape[k] > 1 && t->strides[k] != r->strides[k])
        return cpu_set_error(DK_INVALID_ARGUMENT,
                             "%s: %s %zu is not compact (stride %lld in dim %d) and this kernel "
                             "takes compact tensors only",
                             op, role, i, (long long)t->strides[k], k);
      r->strides[k] = t->strides[k];
    }
  }
  if (r->size == 0) return DK_OK;
  int64_t low = 0, high = 0; /* element offsets reached, relative to element 0 */
  for (int32_t k = 0; k < r->ndim; k++) {
    int64_t reach = (r->shape[k] - 1) * r->strides[k];
    if (reach < 0) low += reach; else high += reach;
  }
  if ((int64_t)t->byte_offset + low * r->itemsize < 0)
    return cpu_set_error(DK_OUT_OF_RANGE, "%s: %s %zu reaches before the start of its buffer",
                         op, role, i);
  char what[32];
  snprintf(what, sizeof what, "%s %zu", role, i);
  uint8_t *first;
  size_t start = (size_t)((int64_t)t->byte_offset + low * r->itemsize);
  size_t span = (size_t)((high - low + 1) * r->itemsize);
  DK_Status st = cpu_mem_range(op, what, d, (DK_Mem)t->data, start, span, &first);
  if (st != DK_OK) return st;
  r->data = first - low * r->itemsize;
  return DK_OK;
}

static void run_launch(void *arg) {
  launch *l = arg;
  l->def->compute(&l->args);
}

static DK_Status kernel_launch(const DK_KernelCall *call) {
  if (!call || call->struct_size < offsetof(DK_KernelCall, user_data) + sizeof(void *))
    return cpu_set_error(DK_INVALID_ARGUMENT, "kernel: call is NULL or its struct_size is too small");
  const cpu_kernel_def *def = call->user_data;
  if (!def) return cpu_set_error(DK_INVALID_ARGUMENT, "kernel: call->user_data is not the entry's");
  const char *op = def->op;
  if ((call->num_inputs && !call->inputs) || (call->num_outputs && !call->outputs) ||
      (call->num_attributes && !call->attributes))
    return cpu_set_error(DK_INVALID_ARGUMENT, "%s: a tensor or attribute array is NULL", op);
  if (call->num_inputs > 64 || call->num_outputs > 64 || call->num_attributes > 64)
    return cpu_set_error(DK_INVALID_ARGUMENT, "%s: more than 64 inputs, outputs or attributes", op);
  cpu_device *d;
  DK_Status st = cpu_device_get(op, call->device, &d);
  if (st != DK_OK) return st;

  size_t bytes = ALIGN8(sizeof(launch)) +
                 (call->num_inputs + call->num_outputs) * sizeof(cpu_tensor) +
                 call->num_attributes * sizeof(DK_Attribute);
  for (size_t i = 0; i < call->num_attributes; i++) {
    if ((st = check_attribute(op, i, call->attributes[i])) != DK_OK) return st;
    bytes += attribute_payload(call->attributes[i]);
  }
  cpu_stream *s;
  if ((st = cpu_stream_acquire(op, d, call->stream, &s)) != DK_OK) return st;
  launch *l = cpu_work_new(bytes, run_launch, NULL);
  if (!l) {
    cpu_stream_release(s);
    return cpu_set_error(DK_RESOURCE_EXHAUSTED, "%s: host out of memory queuing the kernel", op);
  }
  cpu_tensor *tensors = (cpu_tensor *)((uint8_t *)l + ALIGN8(sizeof(launch)));
  DK_Attribute *attrs = (DK_Attribute *)(tensors + call->num_inputs + call->num_outputs);
  uint8_t *arena = (uint8_t *)(attrs + call->num_attributes);
  l->def = def;
  l->args = (cpu_kernel_args){
      .op = op, .device = call->device,
      .num_inputs = call->num_inputs, .num_outputs = call->num_outputs,
      .num_attributes = call->num_attributes,
      .in = tensors, .out = tensors + call->num_inputs, .attributes = attrs,
  };
  bool strided_in = def->flags & DK_KERNEL_STRIDED_INPUTS;
  bool strided_out = def->flags & DK_KERNEL_STRIDED_OUTPUTS;
  for (size_t i = 0; st == DK_OK && i < call->num_inputs; i++)
    st = cpu_resolve_tensor(op, d, call->device, strided_in, "input", i, &call->inputs[i], &tensors[i]);
  for (size_t i = 0; st == DK_OK && i < call->num_outputs; i++)
    st = cpu_resolve_tensor(op, d, call->device, strided_out, "output", i, &call->outputs[i],
                        &tensors[call->num_inputs + i]);
  if (st != DK_OK) {
    cpu_work_discard(l);
    cpu_stream_release(s);
    return st;
  }
  for (size_t i = 0; i < call->num_attributes; i++) {
    const DK_Attribute *a = call->attributes[i];
    attrs[i] = *a;
    attrs[i].struct_size = sizeof(DK_Attribute);
    size_t n = strlen(a->name) + 1;
    attrs[i].name = memcpy(arena, a->name, n);
    arena += ALIGN8(n);
    if (a->type == DK_ATTR_INTS) {
      attrs[i].ints = memcpy(arena, a->ints, (size_t)a->count * sizeof(int64_t));
      arena += ALIGN8((size_t)a->count * sizeof(int64_t));
    } else if (a->type == DK_ATTR_FLOATS) {
      attrs[i].floats = memcpy(arena, a->floats, (size_t)a->count * sizeof(double));
      arena += ALIGN8((size_t)a->count * sizeof(double));
    } else if (a->type == DK_ATTR_STRING) {
      n = strlen(a->s) + 1;
      attrs[i].s = memcpy(arena, a->s, n);
      arena += ALIGN8(n);
    }
  }
  cpu_graph *g = cpu_stream_capture(s);
  if (g && (st = cpu_graph_add_tensors(g, call, tensors)) != DK_OK) {
    cpu_work_discard(l);
    cpu_stream_release(s);
    return st;
  }
  st = cpu_work_submit(s, l);
  cpu_stream_release(s);
  return st;
}

DK_Status cpu_kernel_fail(const cpu_kernel_args *k, DK_Status status, const char *fmt, ...) {
  char message[768];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(message, sizeof message, fmt, ap);
  va_end(ap);
  return cpu_work_fail(status, "%s: %s", k->op, message);
}

/* ---- Attributes -------------------------------------------------------------- */

const DK_Attribute *cpu_attr(const cpu_kernel_args *k, const char *name) {
  for (size_t i = 0; i < k->num_attributes; i++)
    if (strcmp(k->attributes[i].name, name) == 0) return &k->attributes[i];
  return NULL;
}

int64_t cpu_attr_int(const cpu_kernel_args *k, const char *name, int64_t fallback) {
  const DK_Attribute *a = cpu_attr(k, name);
  if (!a) return fallback;
  return a->type == DK_ATTR_FLOAT ? (int64_t)a->f : a->i;
}

double cpu_attr_float(const cpu_kernel_args *k, const char *name, double fallback) {
  const DK_Attribute *a = cpu_attr(k, name);
  if (!a) return fallback;
  return a->type == DK_ATTR_INT ? (double)a->i : a->f;
}

const int64_t *cpu_attr_ints(const cpu_kernel_args *k, const char *name, int64_t *count) {
  const DK_Attribute *a = cpu_attr(k, name);
  *count = a && a->type == DK_ATTR_INTS ? a->count : 0;
  return *count ? a->ints : NULL;
}

const double *cpu_attr_floats(const cpu_kernel_args *k, const char *name, int64_t *count) {
  const DK_Attribute *a = cpu_attr(k, name);
  *count = a && a->type == DK_ATTR_FLOATS ? a->count : 0;
  return *count ? a->floats : NULL;
}

const char *cpu_attr_string(const cpu_kernel_args *k, const char *name, const char *fallback) {
  const DK_Attribute *a = cpu_attr(k, name);
  return a && a->type == DK_ATTR_STRING ? a->s : fallback;
}

DK_DTypeKey cpu_attr_dtype(const cpu_kernel_args *k, const char *name, DK_DTypeKey fallback) {
  const DK_Attribute *a = cpu_attr(k, name);
  if (!a || a->type != DK_ATTR_DTYPE) return fallback;
  return (DK_DTypeKey)(a->dtype.code | a->dtype.bits << 8 | 1 << 16);
}

/* ---- Element loops --------------------------------------------------------- */

void cpu_nd_loop(int nops, int32_t ndim, const int64_t *shape,
                 const int64_t byte_strides[][CPU_MAX_DIMS], uint8_t *const *base,
                 cpu_inner_loop loop, void *ctx) {
  int64_t dims[CPU_MAX_DIMS], steps[CPU_MAX_DIMS][CPU_MAX_OPERANDS];
  int n = 0; /* merged dims, innermost first */
  for (int32_t d = ndim - 1; d >= 0; d--) {
    if (shape[d] == 0) return;
    if (shape[d] == 1) continue;
    bool merge = n > 0;
    for (int i = 0; merge && i < nops; i++)
      merge = byte_strides[i][d] == steps[n - 1][i] * dims[n - 1];
    if (merge) {
      dims[n - 1] *= shape[d];
      continue;
    }
    dims[n] = shape[d];
    for (int i = 0; i < nops; i++) steps[n][i] = byte_strides[i][d];
    n++;
  }
  uint8_t *ptrs[CPU_MAX_OPERANDS];
  for (int i = 0; i < nops; i++) ptrs[i] = base[i];
  if (n == 0) {
    int64_t zero[CPU_MAX_OPERANDS] = {0};
    loop(1, ptrs, zero, ctx);
    return;
  }
  int64_t index[CPU_MAX_DIMS] = {0};
  for (;;) {
    loop(dims[0], ptrs, steps[0], ctx);
    int d = 1;
    for (; d < n; d++) { /* odometer over the outer dims */
      for (int i = 0; i < nops; i++) ptrs[i] += steps[d][i];
      if (++index[d] < dims[d]) break;
      for (int i = 0; i < nops; i++) ptrs[i] -= steps[d][i] * dims[d];
      index[d] = 0;
    }
    if (d == n) return;
  }
}

void cpu_broadcast_strides(const cpu_tensor *t, int32_t out_ndim, int64_t *byte_strides) {
  int32_t lead = out_ndim - t->ndim;
  for (int32_t d = 0; d < out_ndim; d++) {
    int32_t td = d - lead;
#ifdef DEVKIT_DEFECT_SIZE1_BROADCAST
    /* only missing leading dims broadcast; a present size-1 dim is walked */
    byte_strides[d] = td < 0 ? 0 : t->strides[td] * t->itemsize;
#else
    byte_strides[d] = td < 0 || t->shape[td] == 1 ? 0 : t->strides[td] * t->itemsize;
#endif
  }
}

void cpu_elementwise(const cpu_kernel_args *k, int nin, cpu_inner_loop loop, void *ctx) {
  const cpu_tensor *out = &k->out[0];
  int64_t strides[CPU_MAX_OPERANDS][CPU_MAX_DIMS];
  uint8_t *base[CPU_MAX_OPERANDS];
  cpu_broadcast_strides(out, out->ndim, strides[0]);
  base[0] = out->data;
  for (int i = 0; i < nin; i++) {
    cpu_broadcast_strides(&k->in[i], out->ndim, strides[i + 1]);
    base[i + 1] = k->in[i].data;
  }
  cpu_nd_loop(nin + 1, out->ndim, out->shape, (const int64_t(*)[CPU_MAX_DIMS])strides, base,
              loop, ctx);
}

/* ---- Generic scalars ---------------------------------------------------------- */

double cpu_load_as_double(const uint8_t *p, DK_DTypeKey dtype) {
  switch ((int)dtype) {
    case DK_DTYPE_BOOL: return *p != 0;
    case DK_DTYPE_INT8: return *(const int8_t *)p;
    case DK_DTYPE_INT16: return *(const int16_t *)p;
    case DK_DTYPE_INT32: return *(const int32_t *)p;
    case DK_DTYPE_INT64: return (double)*(const int64_t *)p;
    case DK_DTYPE_UINT8: return *p;
    case DK_DTYPE_UINT16: return *(const uint16_t *)p;
    case DK_DTYPE_UINT32: return *(const uint32_t *)p;
    case DK_DTYPE_UINT64: return (double)*(const uint64_t *)p;
    case DK_DTYPE_FLOAT16: return cpu_f16_to_f32(*(const uint16_t *)p);
    case DK_DTYPE_BFLOAT16: return cpu_bf16_to_f32(*(const uint16_t *)p);
    case DK_DTYPE_FLOAT32: return *(const float *)p;
    case DK_DTYPE_FLOAT64: return *(const double *)p;
    default: return NAN;
  }
}

void cpu_store_from_double(uint8_t *p, DK_DTypeKey dtype, double v) {
  switch ((int)dtype) {
    case DK_DTYPE_BOOL: *p = v != 0; break;
    case DK_DTYPE_INT8: *(int8_t *)p = CPU_SATURATE(int8_t, INT8_MIN, INT8_MAX, v); break;
    case DK_DTYPE_INT16: *(int16_t *)p = CPU_SATURATE(int16_t, INT16_MIN, INT16_MAX, v); break;
    case DK_DTYPE_INT32: *(int32_t *)p = CPU_SATURATE(int32_t, INT32_MIN, INT32_MAX, v); break;
    case DK_DTYPE_INT64: *(int64_t *)p = CPU_SATURATE(int64_t, INT64_MIN, INT64_MAX, v); break;
    case DK_DTYPE_UINT8: *p = CPU_SATURATE(uint8_t, 0, UINT8_MAX, v); break;
    case DK_DTYPE_UINT16: *(uint16_t *)p = CPU_SATURATE(uint16_t, 0, UINT16_MAX, v); break;
    case DK_DTYPE_UINT32: *(uint32_t *)p = CPU_SATURATE(uint32_t, 0, UINT32_MAX, v); break;
    case DK_DTYPE_UINT64: *(uint64_t *)p = CPU_SATURATE(uint64_t, 0, UINT64_MAX, v); break;
    case DK_DTYPE_FLOAT16: *(uint16_t *)p = cpu_f64_to_f16(v); break;
    case DK_DTYPE_BFLOAT16: *(uint16_t *)p = cpu_f64_to_bf16(v); break;
    case DK_DTYPE_FLOAT32: *(float *)p = (float)v; break;
    case DK_DTYPE_FLOAT64: *(double *)p = v; break;
    default: break;
  }
}

int64_t cpu_load_as_int64(const uint8_t *p, DK_DTypeKey dtype) {
  switch ((int)dtype) {
    case DK_DTYPE_INT64: return *(const int64_t *)p;
    case DK_DTYPE_UINT64: return (int64_t)*(const uint64_t *)p;
    case DK_DTYPE_INT32: return *(const int32_t *)p;
    case DK_DTYPE_UINT32: return *(const uint32_t *)p;
    case DK_DTYPE_INT16: return *(const int16_t *)p;
    case DK_DTYPE_UINT16: return *(const uint16_t *)p;
    case DK_DTYPE_INT8: return *(const int8_t *)p;
    case DK_DTYPE_UINT8: return *p;
    case DK_DTYPE_BOOL: return *p != 0;
    default: {
      double v = cpu_load_as_double(p, dtype);
      return CPU_SATURATE(int64_t, INT64_MIN, INT64_MAX, v);
    }
  }
}

void cpu_store_from_int64(uint8_t *p, DK_DTypeKey dtype, int64_t v) {
  switch ((int)dtype) { /* integer targets wrap, as C's unsigned conversion does */
    case DK_DTYPE_INT64: *(int64_t *)p = v; break;
    case DK_DTYPE_UINT64: *(uint64_t *)p = (uint64_t)v; break;
    case DK_DTYPE_INT32: *(int32_t *)p = (int32_t)(uint32_t)v; break;
    case DK_DTYPE_UINT32: *(uint32_t *)p = (uint32_t)v; break;
    case DK_DTYPE_INT16: *(int16_t *)p = (int16_t)(uint16_t)v; break;
    case DK_DTYPE_UINT16: *(uint16_t *)p = (uint16_t)v; break;
    case DK_DTYPE_INT8: *(int8_t *)p = (int8_t)(uint8_t)v; break;
    case DK_DTYPE_UINT8: *p = (uint8_t)v; break;
    case DK_DTYPE_BOOL: *p = v != 0; break;
    case DK_DTYPE_FLOAT16: *(uint16_t *)p = cpu_i64_to_f16(v); break;
    case DK_DTYPE_BFLOAT16: *(uint16_t *)p = cpu_i64_to_bf16(v); break;
    case DK_DTYPE_FLOAT32: *(float *)p = (float)v; break;
    default: cpu_store_from_double(p, dtype, (double)v); break;
  }
}
