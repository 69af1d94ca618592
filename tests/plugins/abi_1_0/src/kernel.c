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
  const acme_kernel_def *defs;
  size_t count;
} registered;

static registered g_registered[64];
static size_t g_num_registered;
static bool g_registration_overflow;

void acme_register_kernels(const acme_kernel_def *defs, size_t count) {
  /* Constructors run single-threaded, while the library loads. */
  if (g_num_registered == sizeof g_registered / sizeof g_registered[0]) {
    g_registration_overflow = true;
    return;
  }
  g_registered[g_num_registered++] = (registered){defs, count};
}

static const acme_op_schema *g_schemas[512];
static size_t g_num_schemas;

void acme_register_schemas(const acme_op_schema *schemas, size_t count) {
  for (size_t i = 0; i < count; i++) {
    if (g_num_schemas == sizeof g_schemas / sizeof g_schemas[0]) {
      g_registration_overflow = true;
      return;
    }
    g_schemas[g_num_schemas++] = &schemas[i];
  }
}

static const acme_validator *g_validators[512];
static size_t g_num_validators;

void acme_register_validators(const acme_validator *validators, size_t count) {
  for (size_t i = 0; i < count; i++) {
    if (g_num_validators == sizeof g_validators / sizeof g_validators[0]) {
      g_registration_overflow = true;
      return;
    }
    g_validators[g_num_validators++] = &validators[i];
  }
}

/* What a kernel entry's user_data points to: its definition, and how its calls are checked. */
typedef struct entry_rules {
  const acme_kernel_def *def;
  const acme_op_schema *schema; /* NULL: the op has none */
  acme_validate_fn validate;    /* NULL: the op has none */
} entry_rules;

static DK_Status kernel_launch(const DK_KernelCall *call);
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

static DK_Status build_table(void) {
  static const char fn[] = "DK_PluginInit";
  if (g_registration_overflow)
    return acme_set_error(DK_INTERNAL, "%s: too many kernel files registered", fn);
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
    return acme_set_error(DK_RESOURCE_EXHAUSTED, "%s: out of memory for the kernel table", fn);
  }
  size_t n = 0;
  for (size_t r = 0; r < g_num_registered; r++) {
    for (size_t i = 0; i < g_registered[r].count; i++, n++) {
      const acme_kernel_def *def = &g_registered[r].defs[i];
      g_rules[n].def = def;
      for (size_t j = 0; j < g_num_schemas; j++)
        if (strcmp(g_schemas[j]->op, def->op) == 0) g_rules[n].schema = g_schemas[j];
      for (size_t j = 0; j < g_num_validators; j++)
        if (strcmp(g_validators[j]->op, def->op) == 0) g_rules[n].validate = g_validators[j]->validate;
      g_entries[n] = (DK_KernelEntry){
          .struct_size = sizeof(DK_KernelEntry),
          .op = def->op,
          .dtype = {.code = (uint8_t)(def->dtype & 0xff),
                    .bits = (uint8_t)((def->dtype >> 8) & 0xff),
                    .lanes = 1},
          .fn = kernel_launch,
          .flags = def->flags,
          .user_data = &g_rules[n],
      };
      g_entry_ptrs[n] = &g_entries[n];
    }
  }
  qsort(g_entry_ptrs, n, sizeof *g_entry_ptrs, compare_entries);
  for (size_t i = 1; i < n; i++)
    if (compare_entries(&g_entry_ptrs[i - 1], &g_entry_ptrs[i]) == 0)
      return acme_set_error(DK_INTERNAL, "%s: kernel %s is registered twice for one dtype",
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
    snprintf(g_build_message, sizeof g_build_message, "%s", acme_last_error());
}

DK_Status acme_kernel_table(const DK_KernelEntry *const **entries, size_t *count) {
  pthread_once(&g_build_once, build_once);
  if (g_build_status != DK_OK) return acme_set_error(g_build_status, "%s", g_build_message);
  *entries = g_entry_ptrs;
  *count = g_num_entries;
  return DK_OK;
}

/* ---- Launch ----------------------------------------------------------------- */

/* A launch is one stream work item: this header, then the tensors, the
 * attributes and an arena for what the attributes point to. */
typedef struct launch {
  const acme_kernel_def *def;
  acme_kernel_args args;
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
    return acme_set_error(DK_INVALID_ARGUMENT, "%s: attribute %zu is NULL, short or unnamed", op, i);
  bool list = a->type == DK_ATTR_INTS || a->type == DK_ATTR_FLOATS;
  if (a->type < DK_ATTR_INT || a->type > DK_ATTR_DTYPE)
    return acme_set_error(DK_INVALID_ARGUMENT, "%s: attribute '%s' has unknown type %d", op,
                         a->name, a->type);
  if (list && (a->count < 0 || (a->count && !(a->type == DK_ATTR_INTS ? (const void *)a->ints
                                                                         : (const void *)a->floats))))
    return acme_set_error(DK_INVALID_ARGUMENT, "%s: attribute '%s' has count %lld and no elements",
                         op, a->name, (long long)a->count);
  if (a->type == DK_ATTR_STRING && !a->s)
    return acme_set_error(DK_INVALID_ARGUMENT, "%s: string attribute '%s' is NULL", op, a->name);
  return DK_OK;
}

static int32_t itemsize_of(DK_DataType t) {
  bool known = (t.code == DK_DTYPE_CODE_INT || t.code == DK_DTYPE_CODE_UINT ||
                t.code == DK_DTYPE_CODE_FLOAT || t.code == DK_DTYPE_CODE_BFLOAT ||
                t.code == DK_DTYPE_CODE_BOOL);
  if (!known || t.lanes != 1 || !t.bits || t.bits % 8 || t.bits > 64) return 0;
  return t.bits / 8;
}

void acme_compact_strides(int32_t ndim, const int64_t *shape, int64_t *strides) {
  int64_t step = 1;
  for (int32_t d = ndim - 1; d >= 0; d--) {
    strides[d] = step;
    step *= shape[d] > 1 ? shape[d] : 1;
  }
}

/* Validates tensor `t` (role "input"/"output", position i) and resolves it
 * into *r. */
static DK_Status resolve_tensor(const char *op, acme_device *d, int32_t dev, bool strided,
                                const char *role, size_t i, const DK_Tensor *t,
                                acme_tensor *r) {
  memset(r, 0, sizeof *r);
  if (t->ndim == -1 && role[0] == 'i') {
    r->ndim = -1;
    return DK_OK;
  }
  if (t->ndim < 0 || t->ndim > ACME_MAX_DIMS)
    return acme_set_error(DK_INVALID_ARGUMENT, "%s: %s %zu has rank %d; the acme plugin supports 0 to %d",
                         op, role, i, t->ndim, ACME_MAX_DIMS);
  if (t->ndim > 0 && !t->shape)
    return acme_set_error(DK_INVALID_ARGUMENT, "%s: %s %zu has a NULL shape", op, role, i);
  if (t->device.device_type != ACME_DEVICE_TYPE || t->device.device_id != dev)
    return acme_set_error(DK_INVALID_ARGUMENT,
                         "%s: %s %zu is on device (type %d, id %d), not on acme device %d", op,
                         role, i, t->device.device_type, t->device.device_id, dev);
  r->itemsize = itemsize_of(t->dtype);
  if (!r->itemsize)
    return acme_set_error(DK_INVALID_ARGUMENT, "%s: %s %zu has unsupported dtype (code %u, bits %u, lanes %u)",
                         op, role, i, t->dtype.code, t->dtype.bits, t->dtype.lanes);
  r->ndim = t->ndim;
  r->dtype = (DK_DTypeKey)(t->dtype.code | t->dtype.bits << 8 | 1 << 16);
  r->size = 1;
  bool empty = false, size_overflows = false;
  for (int32_t k = 0; k < t->ndim; k++) {
    if (t->shape[k] < 0)
      return acme_set_error(DK_INVALID_ARGUMENT, "%s: %s %zu has negative dimension %lld", op,
                           role, i, (long long)t->shape[k]);
    r->shape[k] = t->shape[k];
    empty = empty || t->shape[k] == 0;
    size_overflows = size_overflows || __builtin_mul_overflow(r->size, t->shape[k], &r->size);
  }
  if (empty) r->size = 0;
  /* Checked even for a zero-stride view: kernels count elements in int64. */
  if (size_overflows && !empty)
    return acme_set_error(DK_OUT_OF_RANGE, "%s: %s %zu has more elements than int64 counts", op, role, i);
  acme_compact_strides(r->ndim, r->shape, r->strides);
  const bool honour_strides = true;
  if (t->strides && honour_strides) {
    for (int32_t k = 0; k < t->ndim; k++) {
      if (!strided && r->shape[k] > 1 && t->strides[k] != r->strides[k])
        return acme_set_error(DK_INVALID_ARGUMENT,
                             "%s: %s %zu is not compact (stride %lld in dim %d) and this kernel "
                             "takes compact tensors only",
                             op, role, i, (long long)t->strides[k], k);
      r->strides[k] = t->strides[k];
    }
  }
  if (r->size == 0) return DK_OK;
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
    return acme_set_error(DK_OUT_OF_RANGE, "%s: %s %zu reaches past any buffer (its shape, strides and "
                         "byte offset overflow int64)", op, role, i);
  if (start_offset < 0)
    return acme_set_error(DK_OUT_OF_RANGE, "%s: %s %zu reaches before the start of its buffer",
                         op, role, i);
  char what[32];
  snprintf(what, sizeof what, "%s %zu", role, i);
  uint8_t *first;
  size_t start = (size_t)start_offset;
  size_t span = (size_t)span_bytes;
  DK_Status st = acme_mem_range(op, what, d, (DK_Mem)t->data, start, span, &first);
  if (st != DK_OK) return st;
  r->data = first - low;
  return DK_OK;
}

DK_Status acme_invalid(const acme_kernel_args *k, const char *fmt, ...) {
  char message[768];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(message, sizeof message, fmt, ap);
  va_end(ap);
  return acme_set_error(DK_INVALID_ARGUMENT, "%s: %s", k->op, message);
}

static const char *attr_type_name(int32_t type) {
  static const char *const names[] = {"int", "float", "ints", "floats", "string", "dtype"};
  if (type == ACME_ATTR_NUMBERS) return "ints or floats";
  if (type == ACME_ATTR_NUMBER_OR_NUMBERS) return "a number or numbers";
  return type >= 0 && type <= DK_ATTR_DTYPE ? names[type] : "an unknown type";
}

static DK_Status check_attr_rule(const acme_kernel_args *k, const acme_attr_rule *rule) {
  const DK_Attribute *a = acme_attr(k, rule->name);
  if (!a)
    return rule->required ? acme_invalid(k, "attribute '%s' is missing", rule->name) : DK_OK;
  bool list = a->type == DK_ATTR_INTS || a->type == DK_ATTR_FLOATS;
  bool typed = rule->type == ACME_ATTR_NUMBERS             ? list
               : rule->type == ACME_ATTR_NUMBER_OR_NUMBERS ? list || a->type == DK_ATTR_INT ||
                                                                a->type == DK_ATTR_FLOAT
                                                          : a->type == rule->type;
  if (!typed)
    return acme_invalid(k, "attribute '%s' is %s; the op takes %s", rule->name, attr_type_name(a->type),
                       attr_type_name(rule->type));
  if (a->type == DK_ATTR_STRING && rule->strings) {
    for (const char *const *allowed = rule->strings; *allowed; allowed++)
      if (strcmp(*allowed, a->s) == 0) return DK_OK;
    return acme_invalid(k, "attribute '%s' is '%s', which the op does not take", rule->name, a->s);
  }
  if (a->type == DK_ATTR_INT && rule->ints) {
    for (int32_t i = 0; i < rule->num_ints; i++)
      if (rule->ints[i] == a->i) return DK_OK;
    return acme_invalid(k, "attribute '%s' is %lld, which the op does not take", rule->name, (long long)a->i);
  }
  if (a->type == DK_ATTR_DTYPE && !itemsize_of(a->dtype))
    return acme_invalid(k, "attribute '%s' is an unsupported dtype (code %u, bits %u, lanes %u)", rule->name,
                       a->dtype.code, a->dtype.bits, a->dtype.lanes);
  return DK_OK;
}

static DK_Status check_schema(const acme_kernel_args *k, const acme_op_schema *schema, DK_DTypeKey key) {
  if (!schema) return DK_OK;
  int64_t nin = (int64_t)k->num_inputs, nout = (int64_t)k->num_outputs;
  if (nin < schema->min_inputs || (schema->max_inputs >= 0 && nin > schema->max_inputs))
    return acme_invalid(k, "takes %d to %d inputs (-1: any), got %lld", schema->min_inputs,
                       schema->max_inputs, (long long)nin);
  if (nout < schema->min_outputs || (schema->max_outputs >= 0 && nout > schema->max_outputs))
    return acme_invalid(k, "has %d to %d outputs (-1: any), got %lld", schema->min_outputs,
                       schema->max_outputs, (long long)nout);
  for (int32_t i = 0; i < schema->min_inputs; i++)
    if (k->in[i].ndim < 0) return acme_invalid(k, "input %d is required but omitted", i);
  if (schema->key_input >= 0 && schema->key_input < nin && k->in[schema->key_input].ndim >= 0 &&
      k->in[schema->key_input].dtype != key)
    return acme_invalid(k, "input %d has dtype key 0x%x; this kernel is for dtype key 0x%x",
                       schema->key_input, (unsigned)k->in[schema->key_input].dtype, (unsigned)key);
  for (int32_t i = 0; i < schema->num_attrs; i++) {
    DK_Status st = check_attr_rule(k, &schema->attrs[i]);
    if (st != DK_OK) return st;
  }
  return DK_OK;
}

DK_Status acme_check_rank(const acme_kernel_args *k, size_t i, int32_t min_rank, int32_t max_rank) {
  if (i >= k->num_inputs || k->in[i].ndim < 0) return acme_invalid(k, "input %zu is missing", i);
  int32_t ndim = k->in[i].ndim;
  if (ndim < min_rank || ndim > max_rank)
    return acme_invalid(k, "input %zu has rank %d; the op takes rank %d to %d", i, ndim, min_rank, max_rank);
  return DK_OK;
}

DK_Status acme_check_axis(const acme_kernel_args *k, const char *name, int32_t rank, bool insert,
                         int64_t *axis) {
  int64_t value = acme_attr_int(k, name, 0), limit = insert ? rank + 1 : rank;
  if (value < -limit || value >= limit)
    return acme_invalid(k, "attribute '%s' is %lld, out of range for rank %d", name, (long long)value, rank);
  *axis = value < 0 ? value + limit : value;
  return DK_OK;
}

DK_Status acme_check_ints(const acme_kernel_args *k, const char *name, int64_t count, int64_t min) {
  int64_t n;
  const int64_t *values = acme_attr_ints(k, name, &n);
  if (!acme_attr(k, name)) return DK_OK;
  if (count >= 0 && n != count)
    return acme_invalid(k, "attribute '%s' has %lld values; the call needs %lld", name, (long long)n,
                       (long long)count);
  for (int64_t i = 0; i < n; i++)
    if (values[i] < min)
      return acme_invalid(k, "attribute '%s' value %lld is %lld; it must be at least %lld", name,
                         (long long)i, (long long)values[i], (long long)min);
  return DK_OK;
}

DK_Status acme_check_axes(const acme_kernel_args *k, const char *name, int32_t rank, int32_t *axes,
                         int64_t *count) {
  const int64_t *values = acme_attr_ints(k, name, count);
  if (!acme_attr(k, name)) {
    *count = -1;
    return DK_OK;
  }
  if (*count > rank)
    return acme_invalid(k, "attribute '%s' has %lld axes; the tensor has rank %d", name, (long long)*count, rank);
  bool seen[ACME_MAX_DIMS] = {false};
  for (int64_t i = 0; i < *count; i++) {
    if (values[i] < -rank || values[i] >= rank)
      return acme_invalid(k, "attribute '%s' value %lld is %lld, out of range for rank %d", name, (long long)i,
                         (long long)values[i], rank);
    int32_t axis = (int32_t)(values[i] < 0 ? values[i] + rank : values[i]);
    if (seen[axis]) return acme_invalid(k, "attribute '%s' names axis %d twice", name, axis);
    seen[axis] = true;
    axes[i] = axis;
  }
  return DK_OK;
}

DK_Status acme_check_output(const acme_kernel_args *k, size_t j, int32_t ndim, const int64_t *shape) {
  if (j >= k->num_outputs) return acme_invalid(k, "output %zu is missing", j);
  const acme_tensor *t = &k->out[j];
  bool same = t->ndim == ndim;
  for (int32_t d = 0; same && d < ndim; d++) same = t->shape[d] == shape[d];
  if (!same) {
    char want[256] = "", got[256] = "";
    for (int32_t d = 0; d < ndim; d++)
      snprintf(want + strlen(want), sizeof want - strlen(want), "%s%lld", d ? "," : "", (long long)shape[d]);
    for (int32_t d = 0; d < t->ndim; d++)
      snprintf(got + strlen(got), sizeof got - strlen(got), "%s%lld", d ? "," : "", (long long)t->shape[d]);
    return acme_invalid(k, "output %zu has shape (%s); the inputs and attributes give (%s)", j, got, want);
  }
  return DK_OK;
}

DK_Status acme_check_output_like(const acme_kernel_args *k, size_t j, size_t i) {
  if (i >= k->num_inputs || k->in[i].ndim < 0) return acme_invalid(k, "input %zu is missing", i);
  return acme_check_output(k, j, k->in[i].ndim, k->in[i].shape);
}

DK_Status acme_check_broadcast(const acme_kernel_args *k, size_t nin) {
  int32_t ndim = 0;
  for (size_t i = 0; i < nin; i++) {
    if (i >= k->num_inputs || k->in[i].ndim < 0) return acme_invalid(k, "input %zu is missing", i);
    if (k->in[i].ndim > ndim) ndim = k->in[i].ndim;
  }
  int64_t shape[ACME_MAX_DIMS];
  for (int32_t d = 0; d < ndim; d++) {
    shape[d] = 1;
    for (size_t i = 0; i < nin; i++) {
      int32_t td = d - (ndim - k->in[i].ndim);
      int64_t n = td < 0 ? 1 : k->in[i].shape[td];
      if (n == 1) continue;
      if (shape[d] != 1 && shape[d] != n)
        return acme_invalid(k, "inputs do not broadcast: dimension %d is %lld in one and %lld in input %zu",
                           d, (long long)shape[d], (long long)n, i);
      shape[d] = n;
    }
  }
  return acme_check_output(k, 0, ndim, shape);
}

DK_Status acme_check_dtype(const acme_kernel_args *k, const char *role, size_t i, DK_DTypeKey dtype) {
  const acme_tensor *t = role[0] == 'i' ? (i < k->num_inputs ? &k->in[i] : NULL)
                                       : (i < k->num_outputs ? &k->out[i] : NULL);
  if (!t || t->ndim < 0) return acme_invalid(k, "%s %zu is missing", role, i);
  if (t->dtype != dtype)
    return acme_invalid(k, "%s %zu has dtype key 0x%x; the op needs 0x%x here", role, i, (unsigned)t->dtype,
                       (unsigned)dtype);
  return DK_OK;
}

static void run_launch(void *arg) {
  launch *l = arg;
  l->def->compute(&l->args);
}

static DK_Status kernel_launch(const DK_KernelCall *call) {
  if (!call || call->struct_size < offsetof(DK_KernelCall, user_data) + sizeof(void *))
    return acme_set_error(DK_INVALID_ARGUMENT, "kernel: call is NULL or its struct_size is too small");
  const entry_rules *rules = call->user_data;
  /* Compared as addresses: a foreign pointer is refused without being read. */
  uintptr_t at = (uintptr_t)rules, first = (uintptr_t)g_rules;
  if (!g_rules || at < first || at >= (uintptr_t)(g_rules + g_num_entries) ||
      (at - first) % sizeof *g_rules)
    return acme_set_error(DK_INVALID_ARGUMENT, "kernel: call->user_data is not a kernel entry's");
  const acme_kernel_def *def = rules->def;
  const char *op = def->op;
  if ((call->num_inputs && !call->inputs) || (call->num_outputs && !call->outputs) ||
      (call->num_attributes && !call->attributes))
    return acme_set_error(DK_INVALID_ARGUMENT, "%s: a tensor or attribute array is NULL", op);
  if (call->num_inputs > 64 || call->num_outputs > 64 || call->num_attributes > 64)
    return acme_set_error(DK_INVALID_ARGUMENT, "%s: more than 64 inputs, outputs or attributes", op);
  acme_device *d;
  DK_Status st = acme_device_get(op, call->device, &d);
  if (st != DK_OK) return st;

  size_t bytes = ALIGN8(sizeof(launch)) +
                 (call->num_inputs + call->num_outputs) * sizeof(acme_tensor) +
                 call->num_attributes * sizeof(DK_Attribute);
  for (size_t i = 0; i < call->num_attributes; i++) {
    if ((st = check_attribute(op, i, call->attributes[i])) != DK_OK) return st;
    bytes += attribute_payload(call->attributes[i]);
  }
  acme_stream *s;
  if ((st = acme_stream_acquire(op, d, call->stream, &s)) != DK_OK) return st;
  launch *l = acme_work_new(bytes, run_launch, NULL);
  if (!l) {
    acme_stream_release(s);
    return acme_set_error(DK_RESOURCE_EXHAUSTED, "%s: host out of memory queuing the kernel", op);
  }
  acme_tensor *tensors = (acme_tensor *)((uint8_t *)l + ALIGN8(sizeof(launch)));
  DK_Attribute *attrs = (DK_Attribute *)(tensors + call->num_inputs + call->num_outputs);
  uint8_t *arena = (uint8_t *)(attrs + call->num_attributes);
  l->def = def;
  l->args = (acme_kernel_args){
      .op = op, .device = call->device,
      .num_inputs = call->num_inputs, .num_outputs = call->num_outputs,
      .num_attributes = call->num_attributes,
      .in = tensors, .out = tensors + call->num_inputs, .attributes = attrs,
  };
  bool strided_in = def->flags & DK_KERNEL_STRIDED_INPUTS;
  bool strided_out = def->flags & DK_KERNEL_STRIDED_OUTPUTS;
  for (size_t i = 0; st == DK_OK && i < call->num_inputs; i++)
    st = resolve_tensor(op, d, call->device, strided_in, "input", i, &call->inputs[i], &tensors[i]);
  for (size_t i = 0; st == DK_OK && i < call->num_outputs; i++)
    st = resolve_tensor(op, d, call->device, strided_out, "output", i, &call->outputs[i],
                        &tensors[call->num_inputs + i]);
  if (st != DK_OK) {
    acme_work_discard(l);
    acme_stream_release(s);
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
  st = check_schema(&l->args, rules->schema, def->dtype);
  if (st == DK_OK && rules->validate) st = rules->validate(&l->args);
  if (st != DK_OK) {
    acme_work_discard(l);
    acme_stream_release(s);
    return st;
  }
  st = acme_work_submit(s, l);
  acme_stream_release(s);
  return st;
}

DK_Status acme_kernel_fail(const acme_kernel_args *k, DK_Status status, const char *fmt, ...) {
  char message[768];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(message, sizeof message, fmt, ap);
  va_end(ap);
  return acme_work_fail(status, "%s: %s", k->op, message);
}

/* ---- Attributes -------------------------------------------------------------- */

const DK_Attribute *acme_attr(const acme_kernel_args *k, const char *name) {
  for (size_t i = 0; i < k->num_attributes; i++)
    if (strcmp(k->attributes[i].name, name) == 0) return &k->attributes[i];
  return NULL;
}

int64_t acme_attr_int(const acme_kernel_args *k, const char *name, int64_t fallback) {
  const DK_Attribute *a = acme_attr(k, name);
  if (!a) return fallback;
  return a->type == DK_ATTR_FLOAT ? (int64_t)a->f : a->i;
}

double acme_attr_float(const acme_kernel_args *k, const char *name, double fallback) {
  const DK_Attribute *a = acme_attr(k, name);
  if (!a) return fallback;
  return a->type == DK_ATTR_INT ? (double)a->i : a->f;
}

const int64_t *acme_attr_ints(const acme_kernel_args *k, const char *name, int64_t *count) {
  const DK_Attribute *a = acme_attr(k, name);
  *count = a && a->type == DK_ATTR_INTS ? a->count : 0;
  return *count ? a->ints : NULL;
}

const double *acme_attr_floats(const acme_kernel_args *k, const char *name, int64_t *count) {
  const DK_Attribute *a = acme_attr(k, name);
  *count = a && a->type == DK_ATTR_FLOATS ? a->count : 0;
  return *count ? a->floats : NULL;
}

const char *acme_attr_string(const acme_kernel_args *k, const char *name, const char *fallback) {
  const DK_Attribute *a = acme_attr(k, name);
  return a && a->type == DK_ATTR_STRING ? a->s : fallback;
}

DK_DTypeKey acme_attr_dtype(const acme_kernel_args *k, const char *name, DK_DTypeKey fallback) {
  const DK_Attribute *a = acme_attr(k, name);
  if (!a || a->type != DK_ATTR_DTYPE) return fallback;
  return (DK_DTypeKey)(a->dtype.code | a->dtype.bits << 8 | 1 << 16);
}

/* ---- Element loops --------------------------------------------------------- */

void acme_nd_loop(int nops, int32_t ndim, const int64_t *shape,
                 const int64_t byte_strides[][ACME_MAX_DIMS], uint8_t *const *base,
                 acme_inner_loop loop, void *ctx) {
  int64_t dims[ACME_MAX_DIMS], steps[ACME_MAX_DIMS][ACME_MAX_OPERANDS];
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
  uint8_t *ptrs[ACME_MAX_OPERANDS];
  for (int i = 0; i < nops; i++) ptrs[i] = base[i];
  if (n == 0) {
    int64_t zero[ACME_MAX_OPERANDS] = {0};
    loop(1, ptrs, zero, ctx);
    return;
  }
  int64_t index[ACME_MAX_DIMS] = {0};
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

void acme_broadcast_strides(const acme_tensor *t, int32_t out_ndim, int64_t *byte_strides) {
  int32_t lead = out_ndim - t->ndim;
  for (int32_t d = 0; d < out_ndim; d++) {
    int32_t td = d - lead;
    byte_strides[d] = td < 0 || t->shape[td] == 1 ? 0 : t->strides[td] * t->itemsize;
  }
}

void acme_elementwise(const acme_kernel_args *k, int nin, acme_inner_loop loop, void *ctx) {
  const acme_tensor *out = &k->out[0];
  int64_t strides[ACME_MAX_OPERANDS][ACME_MAX_DIMS];
  uint8_t *base[ACME_MAX_OPERANDS];
  acme_broadcast_strides(out, out->ndim, strides[0]);
  base[0] = out->data;
  for (int i = 0; i < nin; i++) {
    acme_broadcast_strides(&k->in[i], out->ndim, strides[i + 1]);
    base[i + 1] = k->in[i].data;
  }
  acme_nd_loop(nin + 1, out->ndim, out->shape, (const int64_t(*)[ACME_MAX_DIMS])strides, base,
              loop, ctx);
}

/* ---- Generic scalars ---------------------------------------------------------- */

double acme_load_as_double(const uint8_t *p, DK_DTypeKey dtype) {
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
    case DK_DTYPE_FLOAT16: return acme_f16_to_f32(*(const uint16_t *)p);
    case DK_DTYPE_BFLOAT16: return acme_bf16_to_f32(*(const uint16_t *)p);
    case DK_DTYPE_FLOAT32: return *(const float *)p;
    case DK_DTYPE_FLOAT64: return *(const double *)p;
    default: return NAN;
  }
}

/* Float -> integer conversion is undefined in C outside the target's range;
 * saturating (NaN -> 0) keeps it defined and matches common device behaviour. */
#define SATURATE(T, lo, hi, v) \
  ((v) != (v) ? (T)0 : (v) <= (double)(lo) ? (T)(lo) : (v) >= (double)(hi) ? (T)(hi) : (T)(v))

void acme_store_from_double(uint8_t *p, DK_DTypeKey dtype, double v) {
  switch ((int)dtype) {
    case DK_DTYPE_BOOL: *p = v != 0; break;
    case DK_DTYPE_INT8: *(int8_t *)p = SATURATE(int8_t, INT8_MIN, INT8_MAX, v); break;
    case DK_DTYPE_INT16: *(int16_t *)p = SATURATE(int16_t, INT16_MIN, INT16_MAX, v); break;
    case DK_DTYPE_INT32: *(int32_t *)p = SATURATE(int32_t, INT32_MIN, INT32_MAX, v); break;
    case DK_DTYPE_INT64: *(int64_t *)p = SATURATE(int64_t, INT64_MIN, INT64_MAX, v); break;
    case DK_DTYPE_UINT8: *p = SATURATE(uint8_t, 0, UINT8_MAX, v); break;
    case DK_DTYPE_UINT16: *(uint16_t *)p = SATURATE(uint16_t, 0, UINT16_MAX, v); break;
    case DK_DTYPE_UINT32: *(uint32_t *)p = SATURATE(uint32_t, 0, UINT32_MAX, v); break;
    case DK_DTYPE_UINT64: *(uint64_t *)p = SATURATE(uint64_t, 0, UINT64_MAX, v); break;
    case DK_DTYPE_FLOAT16: *(uint16_t *)p = acme_f32_to_f16((float)v); break;
    case DK_DTYPE_BFLOAT16: *(uint16_t *)p = acme_f32_to_bf16((float)v); break;
    case DK_DTYPE_FLOAT32: *(float *)p = (float)v; break;
    case DK_DTYPE_FLOAT64: *(double *)p = v; break;
    default: break;
  }
}

int64_t acme_load_as_int64(const uint8_t *p, DK_DTypeKey dtype) {
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
      double v = acme_load_as_double(p, dtype);
      return SATURATE(int64_t, INT64_MIN, INT64_MAX, v);
    }
  }
}

void acme_store_from_int64(uint8_t *p, DK_DTypeKey dtype, int64_t v) {
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
    default: acme_store_from_double(p, dtype, (double)v); break;
  }
}
