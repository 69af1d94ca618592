/*
 * kernel.c -- the kernel table, the launcher every kernel entry shares, and
 * the element-loop helpers of dks_kernel.h.
 */
#include "dks_internal.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

/* ---- Registration ---------------------------------------------------------- */

typedef struct registered {
  const dks_kernel_def *defs;
  size_t count;
} registered;

static registered g_registered[64];
static size_t g_num_registered;
static bool g_registration_overflow;

void dks_register_kernels(const dks_kernel_def *defs, size_t count) {
  /* Constructors run single-threaded, while the library loads. */
  if (g_num_registered == sizeof g_registered / sizeof g_registered[0]) {
    g_registration_overflow = true;
    return;
  }
  g_registered[g_num_registered++] = (registered){defs, count};
}

static dks_init_fn g_inits[16];
static size_t g_num_inits;

void dks_register_init(dks_init_fn fn) {
  if (g_num_inits == sizeof g_inits / sizeof g_inits[0]) {
    g_registration_overflow = true;
    return;
  }
  g_inits[g_num_inits++] = fn;
}

static const dks_op_schema *g_schemas[512];
static size_t g_num_schemas;

void dks_register_schemas(const dks_op_schema *schemas, size_t count) {
  for (size_t i = 0; i < count; i++) {
    if (g_num_schemas == sizeof g_schemas / sizeof g_schemas[0]) {
      g_registration_overflow = true;
      return;
    }
    g_schemas[g_num_schemas++] = &schemas[i];
  }
}

static const dks_validator *g_validators[512];
static size_t g_num_validators;

void dks_register_validators(const dks_validator *validators, size_t count) {
  for (size_t i = 0; i < count; i++) {
    if (g_num_validators == sizeof g_validators / sizeof g_validators[0]) {
      g_registration_overflow = true;
      return;
    }
    g_validators[g_num_validators++] = &validators[i];
  }
}

static const dks_preparer *g_preparers[64];
static size_t g_num_preparers;

void dks_register_preparers(const dks_preparer *preparers, size_t count) {
  for (size_t i = 0; i < count; i++) {
    if (g_num_preparers == sizeof g_preparers / sizeof g_preparers[0]) {
      g_registration_overflow = true;
      return;
    }
    g_preparers[g_num_preparers++] = &preparers[i];
  }
}

/* What a kernel entry's user_data points to: its definition, how its calls
 * are checked, and its prepare. */
typedef struct entry_rules {
  const dks_kernel_def *def;
  const dks_op_schema *schema; /* NULL: the op has none */
  dks_validate_fn validate;    /* NULL: the op has none */
  dks_prepare_fn prepare;      /* NULL: the op prepares no input */
} entry_rules;

static DK_Status kernel_launch(const DK_KernelCall *call);
static DK_Status kernel_prepare(const DK_KernelCall *call, size_t input, DK_Mem prepared,
                                size_t prepared_offset, size_t *prepared_size);
static entry_rules *g_rules;

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

/* DEVKIT_<NAME>_KERNELS=primitives publishes only the kernels of the primitive
 * set (devkit.ops.PRIMITIVES; tests/test_ops_dispatch.py checks that the two
 * lists agree), so a plugin (the cpu one, say) stands in for a new chip that has only those. */
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
    return dks_set_error(DK_INTERNAL, "%s: too many kernel files or initialisers registered", fn);
  for (size_t i = 0; i < g_num_inits; i++) {
    DK_Status st = g_inits[i]();
    if (st != DK_OK) return st;
  }
  bool only_primitives = dks_primitives_only();
  size_t total = 0;
  for (size_t r = 0; r < g_num_registered; r++) total += g_registered[r].count;
  g_entries = calloc(total ? total : 1, sizeof *g_entries);
  g_entry_ptrs = calloc(total ? total : 1, sizeof *g_entry_ptrs);
  g_rules = calloc(total ? total : 1, sizeof *g_rules);
  if (!g_entries || !g_entry_ptrs || !g_rules) {
    free(g_entries);
    free(g_entry_ptrs);
    free(g_rules);
    g_entries = NULL;
    g_entry_ptrs = NULL;
    g_rules = NULL;
    return dks_set_error(DK_RESOURCE_EXHAUSTED, "%s: out of memory for the kernel table", fn);
  }
  size_t n = 0;
  for (size_t r = 0; r < g_num_registered; r++) {
    for (size_t i = 0; i < g_registered[r].count; i++) {
      const dks_kernel_def *def = &g_registered[r].defs[i];
      if (only_primitives && !is_primitive(def->op)) continue;
      g_rules[n].def = def;
      for (size_t j = 0; j < g_num_schemas; j++)
        if (strcmp(g_schemas[j]->op, def->op) == 0) g_rules[n].schema = g_schemas[j];
      for (size_t j = 0; j < g_num_validators; j++)
        if (strcmp(g_validators[j]->op, def->op) == 0) g_rules[n].validate = g_validators[j]->validate;
      for (size_t j = 0; j < g_num_preparers; j++)
        if (strcmp(g_preparers[j]->op, def->op) == 0) g_rules[n].prepare = g_preparers[j]->prepare;
      g_entries[n] = (DK_KernelEntry){
          .struct_size = sizeof(DK_KernelEntry),
          .op = def->op,
          .dtype = {.code = (uint8_t)(def->dtype & 0xff),
                    .bits = (uint8_t)((def->dtype >> 8) & 0xff),
                    .lanes = 1},
          .fn = kernel_launch,
          .flags = def->flags,
          .user_data = &g_rules[n],
          .prepare = g_rules[n].prepare ? kernel_prepare : NULL,
      };
      g_entry_ptrs[n] = &g_entries[n];
      n++;
    }
  }
  qsort(g_entry_ptrs, n, sizeof *g_entry_ptrs, compare_entries);
  for (size_t i = 1; i < n; i++)
    if (compare_entries(&g_entry_ptrs[i - 1], &g_entry_ptrs[i]) == 0)
      return dks_set_error(DK_INTERNAL, "%s: kernel %s is registered twice for one dtype",
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
    snprintf(g_build_message, sizeof g_build_message, "%s", dks_last_error());
}

DK_Status dks_kernel_table(const DK_KernelEntry *const **entries, size_t *count) {
  pthread_once(&g_build_once, build_once);
  if (g_build_status != DK_OK) return dks_set_error(g_build_status, "%s", g_build_message);
  *entries = g_entry_ptrs;
  *count = g_num_entries;
  return DK_OK;
}

/* ---- Launch ----------------------------------------------------------------- */

/* A launch is one stream work item: this header, then the tensors, the
 * attributes and an arena for what the attributes point to. */
typedef struct launch {
  const dks_kernel_def *def;
  dks_prepare_fn prepare;
  dks_kernel_args args;
  /* A prepare's (kernel_prepare): the input, where its form goes, its size. */
  size_t prepare_input;
  uint8_t *prepare_dst;
  size_t prepare_size;
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
    return dks_set_error(DK_INVALID_ARGUMENT, "%s: attribute %zu is NULL, short or unnamed", op, i);
  bool list = a->type == DK_ATTR_INTS || a->type == DK_ATTR_FLOATS;
  if (a->type < DK_ATTR_INT || a->type > DK_ATTR_DTYPE)
    return dks_set_error(DK_INVALID_ARGUMENT, "%s: attribute '%s' has unknown type %d", op,
                         a->name, a->type);
  if (list && (a->count < 0 || (a->count && !(a->type == DK_ATTR_INTS ? (const void *)a->ints
                                                                         : (const void *)a->floats))))
    return dks_set_error(DK_INVALID_ARGUMENT, "%s: attribute '%s' has count %lld and no elements",
                         op, a->name, (long long)a->count);
  if (a->type == DK_ATTR_STRING && !a->s)
    return dks_set_error(DK_INVALID_ARGUMENT, "%s: string attribute '%s' is NULL", op, a->name);
  return DK_OK;
}

static int32_t itemsize_of(DK_DataType t) {
  bool known = (t.code == DK_DTYPE_CODE_INT || t.code == DK_DTYPE_CODE_UINT ||
                t.code == DK_DTYPE_CODE_FLOAT || t.code == DK_DTYPE_CODE_BFLOAT ||
                t.code == DK_DTYPE_CODE_BOOL);
  if (!known || t.lanes != 1 || !t.bits || t.bits % 8 || t.bits > 64) return 0;
  return t.bits / 8;
}

/* Only an empty tensor's shape can overflow the steps (dks_resolve_tensor
 * refuses a non-empty one first): no element is addressed through its
 * strides, and those past the overflow are 0. */
void dks_compact_strides(int32_t ndim, const int64_t *shape, int64_t *strides) {
  int64_t step = 1;
  for (int32_t d = ndim - 1; d >= 0; d--) {
    strides[d] = step;
    if (__builtin_mul_overflow(step, shape[d] > 1 ? shape[d] : 1, &step)) step = 0;
  }
}

/* The checks of dks_resolve_tensor that read no memory: rank, shape, dtype,
 * device and strides, into *r (data left NULL). */
static DK_Status resolve_geometry(const char *op, int32_t dev, bool strided, const char *role,
                                  size_t i, const DK_Tensor *t, dks_tensor *r) {
  memset(r, 0, sizeof *r);
  if (t->ndim == -1 && role[0] == 'i') {
    r->ndim = -1;
    return DK_OK;
  }
  if (t->ndim < 0 || t->ndim > DKS_MAX_DIMS)
    return dks_set_error(DK_INVALID_ARGUMENT, "%s: %s %zu has rank %d; the %s plugin supports 0 to %d",
                         op, role, i, t->ndim, dks_name(), DKS_MAX_DIMS);
  if (t->ndim > 0 && !t->shape)
    return dks_set_error(DK_INVALID_ARGUMENT, "%s: %s %zu has a NULL shape", op, role, i);
  if (t->device.device_type != dks_hooks.device_type || t->device.device_id != dev)
    return dks_set_error(DK_INVALID_ARGUMENT,
                         "%s: %s %zu is on device (type %d, id %d), not on %s device %d", op,
                         role, i, t->device.device_type, t->device.device_id, dks_name(), dev);
  r->itemsize = itemsize_of(t->dtype);
  if (!r->itemsize)
    return dks_set_error(DK_INVALID_ARGUMENT, "%s: %s %zu has unsupported dtype (code %u, bits %u, lanes %u)",
                         op, role, i, t->dtype.code, t->dtype.bits, t->dtype.lanes);
  r->ndim = t->ndim;
  r->dtype = (DK_DTypeKey)(t->dtype.code | t->dtype.bits << 8 | 1 << 16);
  r->size = 1;
  bool empty = false, size_overflows = false;
  for (int32_t k = 0; k < t->ndim; k++) {
    if (t->shape[k] < 0)
      return dks_set_error(DK_INVALID_ARGUMENT, "%s: %s %zu has negative dimension %lld", op,
                           role, i, (long long)t->shape[k]);
    r->shape[k] = t->shape[k];
    empty = empty || t->shape[k] == 0;
    size_overflows = size_overflows || __builtin_mul_overflow(r->size, t->shape[k], &r->size);
  }
  if (empty) r->size = 0;
  /* Checked even for a zero-stride view: kernels count elements in int64. */
  if (size_overflows && !empty)
    return dks_set_error(DK_OUT_OF_RANGE, "%s: %s %zu has more elements than int64 counts", op, role, i);
  dks_compact_strides(r->ndim, r->shape, r->strides);
#ifdef DEVKIT_DEFECT_IGNORE_STRIDES
  const bool honour_strides = false; /* the defect: every view read as compact */
#else
  const bool honour_strides = true;
#endif
  /* An empty tensor keeps compact strides: it addresses nothing, and the
   * kernels' stride arithmetic must not overflow on strides given for it. */
  if (t->strides && honour_strides && !empty) {
    for (int32_t k = 0; k < t->ndim; k++) {
      if (!strided && r->shape[k] > 1 && t->strides[k] != r->strides[k])
        return dks_set_error(DK_INVALID_ARGUMENT,
                             "%s: %s %zu is not compact (stride %lld in dim %d) and this kernel "
                             "takes compact tensors only",
                             op, role, i, (long long)t->strides[k], k);
      r->strides[k] = t->strides[k];
    }
  }
  return DK_OK;
}

DK_Status dks_resolve_tensor(const char *op, dks_device *d, int32_t dev, bool strided,
                             const char *role, size_t i, const DK_Tensor *t,
                             dks_tensor *r) {
  DK_Status st = resolve_geometry(op, dev, strided, role, i, t, r);
  if (st != DK_OK || r->ndim < 0 || r->size == 0) return st;
  /* Byte offsets reached, relative to element 0; every step overflow-checked. */
  int64_t low = 0, high = 0, reach, start_offset, span_elements, span_bytes;
  bool overflows = false;
  for (int32_t k = 0; k < r->ndim; k++) {
    overflows = overflows || __builtin_mul_overflow(r->shape[k] - 1, r->strides[k], &reach) ||
                __builtin_mul_overflow(reach, (int64_t)r->itemsize, &reach) ||
                __builtin_add_overflow(reach < 0 ? low : high, reach, reach < 0 ? &low : &high);
  }
  overflows = overflows || t->byte_offset > (uint64_t)INT64_MAX ||
              __builtin_add_overflow((int64_t)t->byte_offset, low, &start_offset) ||
              __builtin_sub_overflow(high, low, &span_elements) ||
              __builtin_add_overflow(span_elements, (int64_t)r->itemsize, &span_bytes);
  if (overflows)
    return dks_set_error(DK_OUT_OF_RANGE, "%s: %s %zu reaches past any buffer (its shape, strides and "
                         "byte offset overflow int64)", op, role, i);
  if (start_offset < 0)
    return dks_set_error(DK_OUT_OF_RANGE, "%s: %s %zu reaches before the start of its buffer",
                         op, role, i);
  uint8_t *first;
  size_t start = (size_t)start_offset;
  size_t span = (size_t)span_bytes;
  st = dks_mem_range(op, role, d, (DK_Mem)t->data, start, span, &first);
  if (st != DK_OK) { /* checked again to name the tensor: formatted on failure only */
    char what[32];
    snprintf(what, sizeof what, "%s %zu", role, i);
    return dks_mem_range(op, what, d, (DK_Mem)t->data, start, span, &first);
  }
  r->data = first - low;
  return DK_OK;
}

/* A prepared input: its geometry as given (any strides: the kernel reads
 * the prepared form, not the tensor), its memory from byte_offset to the
 * end of the allocation. */
static DK_Status resolve_prepared(const char *op, dks_device *d, int32_t dev, size_t i,
                                  const DK_Tensor *t, dks_tensor *r) {
  DK_Status st = resolve_geometry(op, dev, true, "input", i, t, r);
  if (st == DK_OK && r->ndim < 0)
    st = dks_set_error(DK_INVALID_ARGUMENT, "%s: input %zu is marked prepared and omitted", op, i);
  if (st == DK_OK)
    st = dks_mem_extent(op, "prepared input", d, (DK_Mem)t->data, t->byte_offset, &r->data,
                        &r->prepared_bytes);
  return st;
}

DK_Status dks_invalid(const dks_kernel_args *k, const char *fmt, ...) {
  char message[768];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(message, sizeof message, fmt, ap);
  va_end(ap);
  return dks_set_error(DK_INVALID_ARGUMENT, "%s: %s", k->op, message);
}

static const char *attr_type_name(int32_t type) {
  static const char *const names[] = {"int", "float", "ints", "floats", "string", "dtype"};
  if (type == DKS_ATTR_NUMBERS) return "ints or floats";
  if (type == DKS_ATTR_NUMBER_OR_NUMBERS) return "a number or numbers";
  return type >= 0 && type <= DK_ATTR_DTYPE ? names[type] : "an unknown type";
}

static DK_Status check_attr_rule(const dks_kernel_args *k, const dks_attr_rule *rule) {
  const DK_Attribute *a = dks_attr(k, rule->name);
  if (!a)
    return rule->required ? dks_invalid(k, "attribute '%s' is missing", rule->name) : DK_OK;
  bool list = a->type == DK_ATTR_INTS || a->type == DK_ATTR_FLOATS;
  bool typed = rule->type == DKS_ATTR_NUMBERS             ? list
               : rule->type == DKS_ATTR_NUMBER_OR_NUMBERS ? list || a->type == DK_ATTR_INT ||
                                                                a->type == DK_ATTR_FLOAT
                                                          : a->type == rule->type;
  /* An empty list carries no element type: hosts encode [] as either. */
  bool list_rule = rule->type == DK_ATTR_INTS || rule->type == DK_ATTR_FLOATS;
  if (!typed && list && list_rule && a->count == 0) typed = true;
  if (!typed)
    return dks_invalid(k, "attribute '%s' is %s; the op takes %s", rule->name, attr_type_name(a->type),
                       attr_type_name(rule->type));
  if (a->type == DK_ATTR_STRING && rule->strings) {
    for (const char *const *allowed = rule->strings; *allowed; allowed++)
      if (strcmp(*allowed, a->s) == 0) return DK_OK;
    return dks_invalid(k, "attribute '%s' is '%s', which the op does not take", rule->name, a->s);
  }
  if (a->type == DK_ATTR_INT && rule->ints) {
    for (int32_t i = 0; i < rule->num_ints; i++)
      if (rule->ints[i] == a->i) return DK_OK;
    return dks_invalid(k, "attribute '%s' is %lld, which the op does not take", rule->name, (long long)a->i);
  }
  if (a->type == DK_ATTR_DTYPE && !itemsize_of(a->dtype))
    return dks_invalid(k, "attribute '%s' is an unsupported dtype (code %u, bits %u, lanes %u)", rule->name,
                       a->dtype.code, a->dtype.bits, a->dtype.lanes);
  return DK_OK;
}

static DK_Status check_schema(const dks_kernel_args *k, const dks_op_schema *schema, DK_DTypeKey key) {
  if (!schema) return DK_OK;
  int64_t nin = (int64_t)k->num_inputs, nout = (int64_t)k->num_outputs;
  if (nin < schema->min_inputs || (schema->max_inputs >= 0 && nin > schema->max_inputs))
    return dks_invalid(k, "takes %d to %d inputs (-1: any), got %lld", schema->min_inputs,
                       schema->max_inputs, (long long)nin);
  if (nout < schema->min_outputs || (schema->max_outputs >= 0 && nout > schema->max_outputs))
    return dks_invalid(k, "has %d to %d outputs (-1: any), got %lld", schema->min_outputs,
                       schema->max_outputs, (long long)nout);
  for (int32_t i = 0; i < schema->min_inputs; i++)
    if (k->in[i].ndim < 0) return dks_invalid(k, "input %d is required but omitted", i);
  if (schema->key_input >= 0 && schema->key_input < nin && k->in[schema->key_input].ndim >= 0 &&
      k->in[schema->key_input].dtype != key)
    return dks_invalid(k, "input %d has dtype key 0x%x; this kernel is for dtype key 0x%x",
                       schema->key_input, (unsigned)k->in[schema->key_input].dtype, (unsigned)key);
  for (int32_t i = 0; i < schema->num_attrs; i++) {
    DK_Status st = check_attr_rule(k, &schema->attrs[i]);
    if (st != DK_OK) return st;
  }
  return DK_OK;
}

DK_Status dks_check_rank(const dks_kernel_args *k, size_t i, int32_t min_rank, int32_t max_rank) {
  if (i >= k->num_inputs || k->in[i].ndim < 0) return dks_invalid(k, "input %zu is missing", i);
  int32_t ndim = k->in[i].ndim;
  if (ndim < min_rank || ndim > max_rank)
    return dks_invalid(k, "input %zu has rank %d; the op takes rank %d to %d", i, ndim, min_rank, max_rank);
  return DK_OK;
}

DK_Status dks_check_axis(const dks_kernel_args *k, const char *name, int32_t rank, bool insert,
                         int64_t *axis) {
  int64_t value = dks_attr_int(k, name, 0), limit = insert ? rank + 1 : rank;
  if (value < -limit || value >= limit)
    return dks_invalid(k, "attribute '%s' is %lld, out of range for rank %d", name, (long long)value, rank);
  *axis = value < 0 ? value + limit : value;
  return DK_OK;
}

DK_Status dks_check_ints(const dks_kernel_args *k, const char *name, int64_t count, int64_t min) {
  int64_t n;
  const int64_t *values = dks_attr_ints(k, name, &n);
  if (!dks_attr(k, name)) return DK_OK;
  if (count >= 0 && n != count)
    return dks_invalid(k, "attribute '%s' has %lld values; the call needs %lld", name, (long long)n,
                       (long long)count);
  for (int64_t i = 0; i < n; i++)
    if (values[i] < min)
      return dks_invalid(k, "attribute '%s' value %lld is %lld; it must be at least %lld", name,
                         (long long)i, (long long)values[i], (long long)min);
  return DK_OK;
}

DK_Status dks_check_int_list(const dks_kernel_args *k, const char *name) {
  const DK_Attribute *a = dks_attr(k, name);
  bool listed = a && (a->type == DK_ATTR_INTS || (a->type == DK_ATTR_FLOATS && a->count == 0));
  return !a || listed ? DK_OK : dks_invalid(k, "attribute '%s' must be a list of integers", name);
}

DK_Status dks_check_axes(const dks_kernel_args *k, const char *name, int32_t rank, int32_t *axes,
                         int64_t *count) {
  const int64_t *values = dks_attr_ints(k, name, count);
  if (!dks_attr(k, name)) {
    *count = -1;
    return DK_OK;
  }
  DK_Status st = dks_check_int_list(k, name);
  if (st != DK_OK) return st;
  if (*count > rank)
    return dks_invalid(k, "attribute '%s' has %lld axes; the tensor has rank %d", name, (long long)*count, rank);
  bool seen[DKS_MAX_DIMS] = {false};
  for (int64_t i = 0; i < *count; i++) {
    if (values[i] < -rank || values[i] >= rank)
      return dks_invalid(k, "attribute '%s' value %lld is %lld, out of range for rank %d", name, (long long)i,
                         (long long)values[i], rank);
    int32_t axis = (int32_t)(values[i] < 0 ? values[i] + rank : values[i]);
    if (seen[axis]) return dks_invalid(k, "attribute '%s' names axis %d twice", name, axis);
    seen[axis] = true;
    axes[i] = axis;
  }
  return DK_OK;
}

DK_Status dks_check_float(const dks_kernel_args *k, const char *name, double min) {
  double value = dks_attr_float(k, name, 0.0);
  if (!dks_attr(k, name) || (isfinite(value) && value >= min)) return DK_OK;
  return dks_invalid(k, "attribute '%s' is %g; it must be finite and at least %g", name, value, min);
}

DK_Status dks_check_output(const dks_kernel_args *k, size_t j, int32_t ndim, const int64_t *shape) {
  if (j >= k->num_outputs) return dks_invalid(k, "output %zu is missing", j);
  const dks_tensor *t = &k->out[j];
  bool same = t->ndim == ndim;
  for (int32_t d = 0; same && d < ndim; d++) same = t->shape[d] == shape[d];
  if (!same) {
    char want[256] = "", got[256] = "";
    for (int32_t d = 0; d < ndim; d++)
      snprintf(want + strlen(want), sizeof want - strlen(want), "%s%lld", d ? "," : "", (long long)shape[d]);
    for (int32_t d = 0; d < t->ndim; d++)
      snprintf(got + strlen(got), sizeof got - strlen(got), "%s%lld", d ? "," : "", (long long)t->shape[d]);
    return dks_invalid(k, "output %zu has shape (%s); the inputs and attributes give (%s)", j, got, want);
  }
  return DK_OK;
}

DK_Status dks_check_output_like(const dks_kernel_args *k, size_t j, size_t i) {
  if (i >= k->num_inputs || k->in[i].ndim < 0) return dks_invalid(k, "input %zu is missing", i);
  return dks_check_output(k, j, k->in[i].ndim, k->in[i].shape);
}

DK_Status dks_check_broadcast(const dks_kernel_args *k, size_t nin) {
  int32_t ndim = 0;
  for (size_t i = 0; i < nin; i++) {
    if (i >= k->num_inputs || k->in[i].ndim < 0) return dks_invalid(k, "input %zu is missing", i);
    if (k->in[i].ndim > ndim) ndim = k->in[i].ndim;
  }
  int64_t shape[DKS_MAX_DIMS];
  for (int32_t d = 0; d < ndim; d++) {
    shape[d] = 1;
    for (size_t i = 0; i < nin; i++) {
      int32_t td = d - (ndim - k->in[i].ndim);
      int64_t n = td < 0 ? 1 : k->in[i].shape[td];
      if (n == 1) continue;
      if (shape[d] != 1 && shape[d] != n)
        return dks_invalid(k, "inputs do not broadcast: dimension %d is %lld in one and %lld in input %zu",
                           d, (long long)shape[d], (long long)n, i);
      shape[d] = n;
    }
  }
  return dks_check_output(k, 0, ndim, shape);
}

/* Input or output i (role "input" or "output"), NULL when the call has none. */
static const dks_tensor *tensor_of(const dks_kernel_args *k, const char *role, size_t i) {
  const dks_tensor *t = role[0] == 'i' ? (i < k->num_inputs ? &k->in[i] : NULL)
                                       : (i < k->num_outputs ? &k->out[i] : NULL);
  return t && t->ndim >= 0 ? t : NULL;
}

DK_Status dks_check_dtype(const dks_kernel_args *k, const char *role, size_t i, DK_DTypeKey dtype) {
  const dks_tensor *t = tensor_of(k, role, i);
  if (!t) return dks_invalid(k, "%s %zu is missing", role, i);
  if (t->dtype != dtype)
    return dks_invalid(k, "%s %zu has dtype key 0x%x; the op needs 0x%x here", role, i, (unsigned)t->dtype,
                       (unsigned)dtype);
  return DK_OK;
}

DK_Status dks_check_float_dtype(const dks_kernel_args *k, const char *role, size_t i) {
  const dks_tensor *t = tensor_of(k, role, i);
  if (!t) return dks_invalid(k, "%s %zu is missing", role, i);
  DK_DTypeKey d = t->dtype;
  if (d == DK_DTYPE_FLOAT16 || d == DK_DTYPE_BFLOAT16 || d == DK_DTYPE_FLOAT32 || d == DK_DTYPE_FLOAT64) return DK_OK;
  return dks_invalid(k, "%s %zu has dtype key 0x%x; the op needs a float tensor here", role, i, (unsigned)d);
}

DK_Status dks_validate_like_input(const dks_kernel_args *k) {
  DK_Status st = dks_check_output_like(k, 0, 0);
  for (size_t i = 1; st == DK_OK && i < k->num_inputs; i++)
    if (k->in[i].ndim >= 0) st = dks_check_dtype(k, "input", i, k->in[0].dtype);
  return st != DK_OK ? st : dks_check_dtype(k, "output", 0, k->in[0].dtype);
}

static DK_Status check_pair(const dks_kernel_args *k) {
  DK_Status st = dks_check_rank(k, 1, k->in[0].ndim, k->in[0].ndim);
  for (int32_t d = 0; st == DK_OK && d < k->in[0].ndim; d++)
    if (k->in[1].shape[d] != k->in[0].shape[d])
      st = dks_invalid(k, "input 1's dimension %d is %lld; input 0's is %lld", d, (long long)k->in[1].shape[d],
                       (long long)k->in[0].shape[d]);
  return st;
}

DK_Status dks_validate_pair_like_input(const dks_kernel_args *k) {
  DK_Status st = check_pair(k);
  return st != DK_OK ? st : dks_validate_like_input(k);
}

DK_Status dks_validate_axis_like_input(const dks_kernel_args *k) {
  int64_t axis;
  DK_Status st = dks_check_axis(k, "axis", k->in[0].ndim, false, &axis);
  return st != DK_OK ? st : dks_validate_like_input(k);
}

DK_Status dks_validate_axis_pair_like_input(const dks_kernel_args *k) {
  DK_Status st = check_pair(k);
  return st != DK_OK ? st : dks_validate_axis_like_input(k);
}

static void run_launch(void *arg) {
  launch *l = arg;
  l->def->compute(&l->args);
}

static void run_prepare(void *arg) {
  launch *l = arg;
  size_t size = l->prepare_size;
  DK_Status st = l->prepare(&l->args, l->prepare_input, l->prepare_dst, &size);
  if (st == DK_OK && size != l->prepare_size)
    dks_kernel_fail(&l->args, DK_INTERNAL, "prepare of input %zu wrote %zu bytes, not the %zu it asked for",
                    l->prepare_input, size, l->prepare_size);
}

/* The inputs a call marks prepared (DK_KernelCall.prepared_inputs; 0 past
 * the caller's struct_size). */
static uint64_t prepared_inputs(const DK_KernelCall *call) {
  return call->struct_size >= offsetof(DK_KernelCall, prepared_inputs) + sizeof(uint64_t)
             ? call->prepared_inputs
             : 0;
}

/* Validates `call` as its entry's launch (its tensors, their memory, the
 * op's schema and validators) and builds the stream work item that `run`
 * runs, on *out_s, pinned (the caller submits or discards the item, then
 * releases the stream). */
static DK_Status build_launch(const DK_KernelCall *call, void (*run)(void *), launch **out,
                              dks_stream **out_s, dks_device **out_d) {
  *out = NULL;
  if (!call || call->struct_size < offsetof(DK_KernelCall, user_data) + sizeof(void *))
    return dks_set_error(DK_INVALID_ARGUMENT, "kernel: call is NULL or its struct_size is too small");
  const entry_rules *rules = call->user_data;
  /* Compared as addresses: a foreign pointer is refused without being read. */
  uintptr_t at = (uintptr_t)rules, first = (uintptr_t)g_rules;
  if (!g_rules || at < first || at >= (uintptr_t)(g_rules + g_num_entries) ||
      (at - first) % sizeof *g_rules)
    return dks_set_error(DK_INVALID_ARGUMENT, "kernel: call->user_data is not a kernel entry's");
  const dks_kernel_def *def = rules->def;
  const char *op = def->op;
  if ((call->num_inputs && !call->inputs) || (call->num_outputs && !call->outputs) ||
      (call->num_attributes && !call->attributes))
    return dks_set_error(DK_INVALID_ARGUMENT, "%s: a tensor or attribute array is NULL", op);
  if (call->num_inputs > 64 || call->num_outputs > 64 || call->num_attributes > 64)
    return dks_set_error(DK_INVALID_ARGUMENT, "%s: more than 64 inputs, outputs or attributes", op);
  uint64_t prepared = prepared_inputs(call);
  if (prepared && !rules->prepare)
    return dks_set_error(DK_INVALID_ARGUMENT, "%s: the call marks inputs prepared, and this kernel "
                         "prepares none", op);
  if (call->num_inputs < 64 && prepared >> call->num_inputs)
    return dks_set_error(DK_INVALID_ARGUMENT, "%s: the call marks input %d prepared, of %zu inputs", op,
                         63 - __builtin_clzll(prepared), call->num_inputs);
  dks_device *d;
  DK_Status st = dks_device_get(op, call->device, &d);
  if (st != DK_OK) return st;

  size_t bytes = ALIGN8(sizeof(launch)) +
                 (call->num_inputs + call->num_outputs) * sizeof(dks_tensor) +
                 call->num_attributes * sizeof(DK_Attribute);
  for (size_t i = 0; i < call->num_attributes; i++) {
    if ((st = check_attribute(op, i, call->attributes[i])) != DK_OK) return st;
    bytes += attribute_payload(call->attributes[i]);
  }
  dks_stream *s;
  if ((st = dks_stream_acquire(op, d, call->stream, &s)) != DK_OK) return st;
  launch *l = dks_work_new(bytes, run, NULL);
  if (!l) {
    dks_stream_release(s);
    return dks_set_error(DK_RESOURCE_EXHAUSTED, "%s: host out of memory queuing the kernel", op);
  }
  dks_tensor *tensors = (dks_tensor *)((uint8_t *)l + ALIGN8(sizeof(launch)));
  DK_Attribute *attrs = (DK_Attribute *)(tensors + call->num_inputs + call->num_outputs);
  uint8_t *arena = (uint8_t *)(attrs + call->num_attributes);
  l->def = def;
  l->prepare = rules->prepare;
  l->args = (dks_kernel_args){
      .op = op, .dtype = def->dtype, .device = call->device,
      .num_inputs = call->num_inputs, .num_outputs = call->num_outputs,
      .num_attributes = call->num_attributes,
      .in = tensors, .out = tensors + call->num_inputs, .attributes = attrs,
  };
  bool strided_in = def->flags & DK_KERNEL_STRIDED_INPUTS;
  bool strided_out = def->flags & DK_KERNEL_STRIDED_OUTPUTS;
  for (size_t i = 0; st == DK_OK && i < call->num_inputs; i++)
    st = prepared >> i & 1
             ? resolve_prepared(op, d, call->device, i, &call->inputs[i], &tensors[i])
             : dks_resolve_tensor(op, d, call->device, strided_in, "input", i, &call->inputs[i], &tensors[i]);
  for (size_t i = 0; st == DK_OK && i < call->num_outputs; i++)
    st = dks_resolve_tensor(op, d, call->device, strided_out, "output", i, &call->outputs[i],
                        &tensors[call->num_inputs + i]);
  if (st != DK_OK) {
    dks_work_discard(l);
    dks_stream_release(s);
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
#ifndef DEVKIT_DEFECT_TRUST_ATTRIBUTES /* the defect: attributes and shapes go unchecked */
  st = check_schema(&l->args, rules->schema, def->dtype);
  if (st == DK_OK && rules->validate) st = rules->validate(&l->args);
#endif
  /* A prepared input must be one the preparer makes for this call, and its
   * allocation must hold the form: the compute then checks only its tag. */
  for (size_t i = 0; st == DK_OK && i < call->num_inputs; i++) {
    size_t needed = 0;
    if (!(prepared >> i & 1)) continue;
    st = rules->prepare(&l->args, i, NULL, &needed);
    if (st == DK_OK && !needed)
      st = dks_set_error(DK_INVALID_ARGUMENT, "%s: input %zu is marked prepared, and this kernel "
                         "prepares no such input for this call", op, i);
    else if (st == DK_OK && needed > tensors[i].prepared_bytes)
      st = dks_set_error(DK_OUT_OF_RANGE, "%s: prepared input %zu has %zu bytes to the end of its "
                         "allocation; its prepared form takes %zu", op, i, tensors[i].prepared_bytes, needed);
  }
  if (st != DK_OK) {
    dks_work_discard(l);
    dks_stream_release(s);
    return st;
  }
  *out = l;
  *out_s = s;
  *out_d = d;
  return DK_OK;
}

static DK_Status kernel_launch(const DK_KernelCall *call) {
  launch *l;
  dks_stream *s;
  dks_device *d;
  DK_Status st = build_launch(call, run_launch, &l, &s, &d);
  if (st != DK_OK) return st;
  dks_graph *g = dks_stream_capture(s);
  if (g) st = dks_graph_add_tensors(g, call, (dks_tensor *)l->args.in);
  if (st != DK_OK) {
    dks_work_discard(l);
    dks_stream_release(s);
    return st;
  }
  st = dks_work_submit(s, l);
  dks_stream_release(s);
  return st;
}

/* DK_KernelEntry.prepare of an entry whose definition has a prepare. */
static DK_Status kernel_prepare(const DK_KernelCall *call, size_t input, DK_Mem prepared,
                                size_t prepared_offset, size_t *prepared_size) {
  launch *l;
  dks_stream *s;
  dks_device *d;
  DK_Status st = build_launch(call, run_prepare, &l, &s, &d);
  if (st != DK_OK) return st;
  const char *op = l->def->op;
  uint8_t *dst = NULL;
  size_t size = 0;
  if (!l->prepare) /* a raw call: another entry's user_data, of a kernel that prepares nothing */
    st = dks_set_error(DK_INVALID_ARGUMENT, "%s: prepare: this kernel prepares no input", op);
  else if (!prepared_size)
    st = dks_set_error(DK_INVALID_ARGUMENT, "%s: prepare: prepared_size is NULL", op);
  else if (input >= call->num_inputs || l->args.in[input].ndim < 0)
    st = dks_set_error(DK_INVALID_ARGUMENT, "%s: prepare: input %zu is not a present input of the call",
                       op, input);
  else if (l->args.in[input].prepared_bytes)
    st = dks_set_error(DK_INVALID_ARGUMENT, "%s: prepare: input %zu is marked prepared already", op, input);
  if (st == DK_OK) st = l->prepare(&l->args, input, NULL, &size);
  if (st == DK_OK && prepared) {
    if (size == 0 || size != *prepared_size)
      st = dks_set_error(DK_INVALID_ARGUMENT, "%s: prepare: prepared_size %zu for input %zu; its query "
                         "gives %zu", op, *prepared_size, input, size);
    else if (dks_stream_capture(s))
      st = dks_capture_refused(op, s);
    else
      st = dks_mem_range(op, "prepared", d, prepared, prepared_offset, size, &dst);
  }
  if (st != DK_OK || !prepared) {
    if (st == DK_OK) *prepared_size = size;
    dks_work_discard(l);
    dks_stream_release(s);
    return st;
  }
  l->prepare_input = input;
  l->prepare_dst = dst;
  l->prepare_size = size;
  st = dks_work_submit(s, l);
  dks_stream_release(s);
  return st;
}

DK_Status dks_kernel_fail(const dks_kernel_args *k, DK_Status status, const char *fmt, ...) {
  char message[768];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(message, sizeof message, fmt, ap);
  va_end(ap);
  return dks_work_fail(status, "%s: %s", k->op, message);
}

/* ---- Attributes -------------------------------------------------------------- */

const DK_Attribute *dks_attr(const dks_kernel_args *k, const char *name) {
  for (size_t i = 0; i < k->num_attributes; i++)
    if (strcmp(k->attributes[i].name, name) == 0) return &k->attributes[i];
  return NULL;
}

int64_t dks_attr_int(const dks_kernel_args *k, const char *name, int64_t fallback) {
  const DK_Attribute *a = dks_attr(k, name);
  if (!a) return fallback;
  return a->type == DK_ATTR_FLOAT ? (int64_t)a->f : a->i;
}

double dks_attr_float(const dks_kernel_args *k, const char *name, double fallback) {
  const DK_Attribute *a = dks_attr(k, name);
  if (!a) return fallback;
  return a->type == DK_ATTR_INT ? (double)a->i : a->f;
}

const int64_t *dks_attr_ints(const dks_kernel_args *k, const char *name, int64_t *count) {
  const DK_Attribute *a = dks_attr(k, name);
  *count = a && a->type == DK_ATTR_INTS ? a->count : 0;
  return *count ? a->ints : NULL;
}

const double *dks_attr_floats(const dks_kernel_args *k, const char *name, int64_t *count) {
  const DK_Attribute *a = dks_attr(k, name);
  *count = a && a->type == DK_ATTR_FLOATS ? a->count : 0;
  return *count ? a->floats : NULL;
}

const char *dks_attr_string(const dks_kernel_args *k, const char *name, const char *fallback) {
  const DK_Attribute *a = dks_attr(k, name);
  return a && a->type == DK_ATTR_STRING ? a->s : fallback;
}

DK_DTypeKey dks_attr_dtype(const dks_kernel_args *k, const char *name, DK_DTypeKey fallback) {
  const DK_Attribute *a = dks_attr(k, name);
  if (!a || a->type != DK_ATTR_DTYPE) return fallback;
  return (DK_DTypeKey)(a->dtype.code | a->dtype.bits << 8 | 1 << 16);
}

/* ---- Element loops --------------------------------------------------------- */

/* An element loop with its dimensions merged: dims[0] is the innermost run. */
typedef struct nd_plan {
  int nops, n; /* operands, merged dims (0: a single element) */
  int64_t total;
  int64_t dims[DKS_MAX_DIMS], steps[DKS_MAX_DIMS][DKS_MAX_OPERANDS];
  uint8_t *base[DKS_MAX_OPERANDS];
  dks_inner_loop loop;
  void *ctx;
} nd_plan;

/* Merges the dims that are contiguous for every operand; false for an
 * empty shape. */
static bool nd_plan_init(nd_plan *p, int nops, int32_t ndim, const int64_t *shape,
                         const int64_t byte_strides[][DKS_MAX_DIMS], uint8_t *const *base,
                         dks_inner_loop loop, void *ctx) {
  p->nops = nops;
  p->n = 0;
  p->total = 1;
  p->loop = loop;
  p->ctx = ctx;
  for (int i = 0; i < nops; i++) p->base[i] = base[i];
  for (int32_t d = ndim - 1; d >= 0; d--) {
    if (shape[d] == 0) return false;
    p->total *= shape[d];
    if (shape[d] == 1) continue;
    int n = p->n;
    bool merge = n > 0;
    for (int i = 0; merge && i < nops; i++)
      merge = byte_strides[i][d] == p->steps[n - 1][i] * p->dims[n - 1];
    if (merge) {
      p->dims[n - 1] *= shape[d];
      continue;
    }
    p->dims[n] = shape[d];
    for (int i = 0; i < nops; i++) p->steps[n][i] = byte_strides[i][d];
    p->n++;
  }
  return true;
}

/* Runs the loop over flat indices [begin, end) of the merged shape: a first
 * partial run, whole runs, a last partial one. */
static void nd_range(void *arg, int64_t begin, int64_t end) {
  const nd_plan *p = arg;
  uint8_t *ptrs[DKS_MAX_OPERANDS];
  for (int i = 0; i < p->nops; i++) ptrs[i] = p->base[i];
  if (p->n == 0) {
    int64_t zero[DKS_MAX_OPERANDS] = {0};
    p->loop(1, ptrs, zero, p->ctx);
    return;
  }
  int64_t index[DKS_MAX_DIMS], rest = begin;
  for (int d = 0; d < p->n; d++) {
    index[d] = rest % p->dims[d];
    rest /= p->dims[d];
    for (int i = 0; i < p->nops; i++) ptrs[i] += index[d] * p->steps[d][i];
  }
  for (int64_t left = end - begin;;) {
    int64_t run = p->dims[0] - index[0] < left ? p->dims[0] - index[0] : left;
    p->loop(run, ptrs, p->steps[0], p->ctx);
    if ((left -= run) == 0) return;
    /* the run reached the end of dim 0: back to its start, then the odometer */
    for (int i = 0; i < p->nops; i++) ptrs[i] -= index[0] * p->steps[0][i];
    index[0] = 0;
    for (int d = 1; d < p->n; d++) {
      for (int i = 0; i < p->nops; i++) ptrs[i] += p->steps[d][i];
      if (++index[d] < p->dims[d]) break;
      for (int i = 0; i < p->nops; i++) ptrs[i] -= p->steps[d][i] * p->dims[d];
      index[d] = 0;
    }
  }
}

void dks_nd_loop(int nops, int32_t ndim, const int64_t *shape,
                 const int64_t byte_strides[][DKS_MAX_DIMS], uint8_t *const *base,
                 dks_inner_loop loop, void *ctx) {
  nd_plan p;
  if (nd_plan_init(&p, nops, ndim, shape, byte_strides, base, loop, ctx)) nd_range(&p, 0, p.total);
}

void dks_broadcast_strides(const dks_tensor *t, int32_t out_ndim, int64_t *byte_strides) {
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

void dks_elementwise(const dks_kernel_args *k, int nin, dks_inner_loop loop, void *ctx) {
  dks_elementwise_grain(k, nin, loop, ctx, DKS_ELEMENTWISE_GRAIN);
}

void dks_elementwise_grain(const dks_kernel_args *k, int nin, dks_inner_loop loop, void *ctx, int64_t grain) {
  const dks_tensor *out = &k->out[0];
  int64_t strides[DKS_MAX_OPERANDS][DKS_MAX_DIMS];
  uint8_t *base[DKS_MAX_OPERANDS];
  dks_broadcast_strides(out, out->ndim, strides[0]);
  base[0] = out->data;
  for (int i = 0; i < nin; i++) {
    dks_broadcast_strides(&k->in[i], out->ndim, strides[i + 1]);
    base[i + 1] = k->in[i].data;
  }
  nd_plan p;
  if (nd_plan_init(&p, nin + 1, out->ndim, out->shape, (const int64_t(*)[DKS_MAX_DIMS])strides,
                   base, loop, ctx))
    dks_parallel_for(p.total, grain, nd_range, &p);
}

/* ---- Generic scalars ---------------------------------------------------------- */

double dks_load_as_double(const uint8_t *p, DK_DTypeKey dtype) {
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
    case DK_DTYPE_FLOAT16: return dks_f16_to_f32(*(const uint16_t *)p);
    case DK_DTYPE_BFLOAT16: return dks_bf16_to_f32(*(const uint16_t *)p);
    case DK_DTYPE_FLOAT32: return *(const float *)p;
    case DK_DTYPE_FLOAT64: return *(const double *)p;
    default: return NAN;
  }
}

void dks_store_from_double(uint8_t *p, DK_DTypeKey dtype, double v) {
  switch ((int)dtype) {
    case DK_DTYPE_BOOL: *p = v != 0; break;
    case DK_DTYPE_INT8: *(int8_t *)p = DKS_SATURATE(int8_t, INT8_MIN, INT8_MAX, v); break;
    case DK_DTYPE_INT16: *(int16_t *)p = DKS_SATURATE(int16_t, INT16_MIN, INT16_MAX, v); break;
    case DK_DTYPE_INT32: *(int32_t *)p = DKS_SATURATE(int32_t, INT32_MIN, INT32_MAX, v); break;
    case DK_DTYPE_INT64: *(int64_t *)p = DKS_SATURATE(int64_t, INT64_MIN, INT64_MAX, v); break;
    case DK_DTYPE_UINT8: *p = DKS_SATURATE(uint8_t, 0, UINT8_MAX, v); break;
    case DK_DTYPE_UINT16: *(uint16_t *)p = DKS_SATURATE(uint16_t, 0, UINT16_MAX, v); break;
    case DK_DTYPE_UINT32: *(uint32_t *)p = DKS_SATURATE(uint32_t, 0, UINT32_MAX, v); break;
    case DK_DTYPE_UINT64: *(uint64_t *)p = DKS_SATURATE(uint64_t, 0, UINT64_MAX, v); break;
    case DK_DTYPE_FLOAT16: *(uint16_t *)p = dks_f64_to_f16(v); break;
    case DK_DTYPE_BFLOAT16: *(uint16_t *)p = dks_f64_to_bf16(v); break;
    case DK_DTYPE_FLOAT32: *(float *)p = (float)v; break;
    case DK_DTYPE_FLOAT64: *(double *)p = v; break;
    default: break;
  }
}

int64_t dks_load_as_int64(const uint8_t *p, DK_DTypeKey dtype) {
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
      double v = dks_load_as_double(p, dtype);
      return DKS_SATURATE(int64_t, INT64_MIN, INT64_MAX, v);
    }
  }
}

void dks_store_from_int64(uint8_t *p, DK_DTypeKey dtype, int64_t v) {
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
    case DK_DTYPE_FLOAT16: *(uint16_t *)p = dks_i64_to_f16(v); break;
    case DK_DTYPE_BFLOAT16: *(uint16_t *)p = dks_i64_to_bf16(v); break;
    case DK_DTYPE_FLOAT32: *(float *)p = (float)v; break;
    default: dks_store_from_double(p, dtype, (double)v); break;
  }
}
