/*
 * linalg_einsum.c -- Einsum with NumPy's rules (devkit/ops/linalg.py has
 * the parsing the host validates; this one trusts it but never crashes).
 *
 * Every operand becomes a strided view with one dimension per distinct
 * label: a repeated label (a diagonal) sums its strides, a size-1 dimension
 * that broadcasts gets stride 0. Operands contract pairwise, left to right.
 * Labels that neither the output nor a later operand needs are first summed
 * out of the operand that alone holds them; what remains is a batched GEMM
 * over batch labels (in both operands, kept), M (left only), K (in both,
 * summed) and N (right only), each operand read in place when it already
 * lies as [batch][M][K] (or [batch][K][M]) and gathered otherwise. The last
 * product lands in the output directly when its label order is the
 * output's, and is permuted into it otherwise. A single operand is summed
 * or permuted into the output by the general loop.
 */
#include "linalg.h"

#include <stdlib.h>

#define LETTERS 52 /* A-Z then a-z: ids in ASCII order */
#define MAX_LABELS (LETTERS + DKS_MAX_DIMS)
#define MAX_OPERANDS 64

typedef struct ein_view {
  int32_t n;
  int32_t label[MAX_LABELS];
  int64_t size[MAX_LABELS];
  int64_t stride[MAX_LABELS]; /* elements */
  const uint8_t *data;
} ein_view;

typedef struct ein_plan {
  int32_t operands, out_n;
  int8_t term[MAX_OPERANDS][DKS_MAX_DIMS]; /* label of each operand dim */
  int32_t out[MAX_LABELS];
  int32_t rank[MAX_LABELS];  /* output position, or out_n + id for other labels */
  int64_t size[MAX_LABELS];  /* broadcast size of each label */
} ein_plan;

/* ---- Parsing ------------------------------------------------------------------------ */

static int32_t letter_id(char c) {
  if (c >= 'A' && c <= 'Z') return c - 'A';
  if (c >= 'a' && c <= 'z') return 26 + (c - 'a');
  return -1;
}

/* Reads one term (letters and at most one "..."), ending at NUL or a
 * character of `stops`. ids[] gets letter ids, -1 for the ellipsis; returns
 * the count, or -1 for a malformed term. */
static int32_t read_term(const char **s, const char *stops, int32_t *ids, int32_t capacity) {
  int32_t n = 0;
  bool ellipsis = false;
  while (**s && !strchr(stops, **s)) {
    if (n == capacity) return -1;
    if (strncmp(*s, "...", 3) == 0) {
      if (ellipsis) return -1;
      ellipsis = true;
      ids[n++] = -1;
      *s += 3;
    } else if ((ids[n++] = letter_id(**s)) >= 0) {
      (*s)++;
    } else {
      return -1;
    }
  }
  return n;
}

static DK_Status parse(const dks_kernel_args *k, ein_plan *p) {
  const char *equation = dks_attr_string(k, "equation", "");
  size_t length = strlen(equation);
  char *eq = linalg_scratch(k, length + 1, 1);
  if (!eq) return DK_RESOURCE_EXHAUSTED;
  size_t m = 0;
  for (size_t i = 0; i < length; i++)
    if (equation[i] != ' ') eq[m++] = equation[i];
  eq[m] = '\0';
  memset(p, 0, sizeof *p);
  p->operands = (int32_t)k->num_inputs;
  int32_t ids[MAX_LABELS], span[MAX_OPERANDS], ellipsis = 0, counts[LETTERS] = {0};
  bool seen[MAX_LABELS] = {false};
  int32_t where[MAX_OPERANDS], lengths[MAX_OPERANDS];
  const char *s = eq;
  bool ok = p->operands >= 1 && p->operands <= MAX_OPERANDS;
  /* First pass: each term's letters and how many dims its ellipsis spans. */
  for (int32_t i = 0; ok && i < p->operands; i++) {
    const dks_tensor *t = &k->in[i];
    where[i] = (int32_t)(s - eq);
    int32_t n = read_term(&s, ",-", ids, MAX_LABELS);
    bool has_ellipsis = false;
    for (int32_t j = 0; j < n; j++) has_ellipsis = has_ellipsis || ids[j] < 0;
    lengths[i] = n;
    span[i] = has_ellipsis ? t->ndim - (n - 1) : 0;
    ok = n >= 0 && span[i] >= 0 && (has_ellipsis || n == t->ndim) && (*s == ',') == (i + 1 < p->operands);
    if (*s == ',') s++;
    if (span[i] > ellipsis) ellipsis = span[i];
  }
  ok = ok && (*s == '\0' || strncmp(s, "->", 2) == 0);
  /* Second pass: every dim's label; ellipsis dims right-aligned after the letters. */
  for (int32_t i = 0; ok && i < p->operands; i++) {
    const char *term = eq + where[i];
    read_term(&term, ",-", ids, MAX_LABELS);
    int32_t d = 0;
    for (int32_t j = 0; j < lengths[i]; j++) {
      if (ids[j] >= 0) {
        counts[ids[j]]++;
        p->term[i][d++] = (int8_t)ids[j];
      } else {
        for (int32_t e = 0; e < span[i]; e++) p->term[i][d++] = (int8_t)(LETTERS + ellipsis - span[i] + e);
      }
    }
    for (d = 0; d < k->in[i].ndim; d++) { /* sizes agree or broadcast from 1 */
      int32_t label = p->term[i][d];
      int64_t size = k->in[i].shape[d];
      ok = ok && (!seen[label] || size == 1 || p->size[label] == 1 || size == p->size[label]);
      if (!seen[label] || p->size[label] == 1) p->size[label] = size;
      seen[label] = true;
    }
    for (d = 0; d < k->in[i].ndim; d++) /* a diagonal's dims agree */
      for (int32_t e = d + 1; e < k->in[i].ndim; e++)
        ok = ok && (p->term[i][d] != p->term[i][e] || k->in[i].shape[d] == k->in[i].shape[e]);
  }
  if (ok && *s) { /* explicit output */
    s += 2;
    int32_t n = read_term(&s, "", ids, MAX_LABELS);
    ok = n >= 0;
    for (int32_t j = 0; ok && j < n; j++) {
      if (p->out_n + (ids[j] >= 0 ? 1 : ellipsis) > MAX_LABELS) {
        ok = false;
      } else if (ids[j] >= 0) {
        ok = seen[ids[j]];
        p->out[p->out_n++] = ids[j];
      } else {
        for (int32_t e = 0; e < ellipsis; e++) p->out[p->out_n++] = LETTERS + e;
      }
    }
  } else if (ok) { /* implicit: the ellipsis, then letters seen once, in ASCII order */
    for (int32_t e = 0; e < ellipsis; e++) p->out[p->out_n++] = LETTERS + e;
    for (int32_t id = 0; id < LETTERS; id++)
      if (counts[id] == 1) p->out[p->out_n++] = id;
  }
  free(eq);
  const dks_tensor *y = &k->out[0];
  ok = ok && p->out_n == y->ndim;
  for (int32_t d = 0; ok && d < p->out_n; d++) ok = p->size[p->out[d]] == y->shape[d];
  if (!ok)
    return dks_kernel_fail(k, DK_INVALID_ARGUMENT, "equation '%s' does not match the operands", equation);
  for (int32_t id = 0; id < MAX_LABELS; id++) p->rank[id] = p->out_n + id;
  for (int32_t d = 0; d < p->out_n; d++) p->rank[p->out[d]] = d;
  return DK_OK;
}

/* ---- Views ------------------------------------------------------------------------------ */

static int32_t find(const ein_view *v, int32_t label) {
  for (int32_t i = 0; i < v->n; i++)
    if (v->label[i] == label) return i;
  return -1;
}

static void view_of_operand(const ein_plan *p, int32_t i, const dks_tensor *t, ein_view *v) {
  v->n = 0;
  v->data = t->data;
  for (int32_t d = 0; d < t->ndim; d++) {
    int32_t label = p->term[i][d], at = find(v, label);
    if (at >= 0) { /* a diagonal: both indices step together */
      v->stride[at] += t->strides[d];
      continue;
    }
    v->label[v->n] = label;
    v->size[v->n] = t->shape[d];
    v->stride[v->n++] = t->strides[d];
  }
  for (int32_t j = 0; j < v->n; j++) {
    if (v->size[j] == 1 && p->size[v->label[j]] != 1) { /* broadcast */
      v->size[j] = p->size[v->label[j]];
      v->stride[j] = 0;
    }
  }
}

/* A compact view over `labels` (sizes from p) at data. */
static void compact_view(const ein_plan *p, const int32_t *labels, int32_t n, const uint8_t *data,
                         ein_view *v) {
  v->n = n;
  v->data = data;
  int64_t step = 1;
  for (int32_t j = n - 1; j >= 0; j--) {
    v->label[j] = labels[j];
    v->size[j] = p->size[labels[j]];
    v->stride[j] = step;
    step *= v->size[j] > 1 ? v->size[j] : 1;
  }
}

/* Whether v lies compact in the order of `labels` (all of v's labels). */
static bool lies_as(const ein_view *v, const int32_t *labels, int32_t n) {
  int64_t step = 1;
  for (int32_t j = n - 1; j >= 0; j--) {
    int32_t at = find(v, labels[j]);
    if (v->size[at] > 1 && v->stride[at] != step) return false;
    step *= v->size[at] > 1 ? v->size[at] : 1;
  }
  return true;
}

static int64_t view_count(const ein_view *v) { return linalg_prod(v->size, v->n); }

/* ---- The general loop ------------------------------------------------------------------ */

/* dst, compact over `order` (labels of v, in that order) = v summed over
 * its other labels, accumulated in float64; a plain gather when there are
 * none. The innermost kept label is the inner loop. */
#define EIN_SUM(NAME, T)                                                                 \
  static void NAME(const ein_view *v, const int32_t *order, int32_t n_order, T *dst) {   \
    int64_t ks[MAX_LABELS], kst[MAX_LABELS], ss[MAX_LABELS], sst[MAX_LABELS];            \
    int32_t ns = 0;                                                                      \
    for (int32_t j = 0; j < n_order; j++) {                                              \
      int32_t at = find(v, order[j]);                                                    \
      ks[j] = v->size[at];                                                               \
      kst[j] = v->stride[at];                                                            \
    }                                                                                    \
    for (int32_t j = 0; j < v->n; j++) {                                                 \
      bool kept = false;                                                                 \
      for (int32_t i = 0; i < n_order; i++) kept = kept || order[i] == v->label[j];      \
      if (!kept) {                                                                       \
        ss[ns] = v->size[j];                                                             \
        sst[ns++] = v->stride[j];                                                        \
      }                                                                                  \
    }                                                                                    \
    int64_t width = n_order ? ks[n_order - 1] : 1, step = n_order ? kst[n_order - 1] : 0; \
    int64_t rows = width ? linalg_prod(ks, n_order) / width : 0;                         \
    bool empty_sum = linalg_prod(ss, ns) == 0;                                           \
    const T *src = (const T *)v->data;                                                   \
    int64_t ki[MAX_LABELS] = {0}, koff = 0;                                              \
    for (int64_t r = 0; r < rows; r++) {                                                 \
      T *out = dst + r * width;                                                          \
      for (int64_t c = 0; c < width; c++) {                                              \
        int64_t base = koff + c * step;                                                  \
        if (ns == 0) {                                                                   \
          out[c] = src[base];                                                            \
          continue;                                                                      \
        }                                                                                \
        double acc = 0.0;                                                                \
        int64_t si[MAX_LABELS] = {0}, soff = 0;                                          \
        while (!empty_sum) {                                                             \
          for (int64_t j = 0; j < ss[ns - 1]; j++) acc += src[base + soff + j * sst[ns - 1]]; \
          int32_t d = ns - 2;                                                            \
          for (; d >= 0; d--) {                                                          \
            soff += sst[d];                                                              \
            if (++si[d] < ss[d]) break;                                                  \
            soff -= sst[d] * ss[d];                                                      \
            si[d] = 0;                                                                   \
          }                                                                              \
          if (d < 0) break;                                                              \
        }                                                                                \
        out[c] = (T)acc;                                                                 \
      }                                                                                  \
      for (int32_t d = n_order - 2; d >= 0; d--) {                                       \
        koff += kst[d];                                                                  \
        if (++ki[d] < ks[d]) break;                                                      \
        koff -= kst[d] * ks[d];                                                          \
        ki[d] = 0;                                                                       \
      }                                                                                  \
    }                                                                                    \
  }
EIN_SUM(ein_sum_f32, float)
EIN_SUM(ein_sum_f64, double)

static void ein_sum(linalg_real real, const ein_view *v, const int32_t *order, int32_t n, void *dst) {
  if (real == LINALG_F64)
    ein_sum_f64(v, order, n, dst);
  else
    ein_sum_f32(v, order, n, dst);
}

/* ---- Pairwise contraction ----------------------------------------------------------------- */

static void sort_by_rank(const ein_plan *p, int32_t *labels, int32_t n) {
  for (int32_t i = 1; i < n; i++)
    for (int32_t j = i; j > 0 && p->rank[labels[j - 1]] > p->rank[labels[j]]; j--) {
      int32_t t = labels[j];
      labels[j] = labels[j - 1];
      labels[j - 1] = t;
    }
}

/* v without the labels that `other` lacks and `keep` does not list, summed
 * out into fresh scratch (*owned) when there are any. */
static DK_Status drop_unneeded(const dks_kernel_args *k, linalg_real real, const ein_plan *p,
                               ein_view *v, const ein_view *other, const bool *keep, void **owned) {
  int32_t labels[MAX_LABELS], n = 0;
  for (int32_t j = 0; j < v->n; j++)
    if (keep[v->label[j]] || find(other, v->label[j]) >= 0) labels[n++] = v->label[j];
  *owned = NULL;
  if (n == v->n) return DK_OK;
  ein_view reduced;
  compact_view(p, labels, n, NULL, &reduced);
  *owned = linalg_scratch(k, (size_t)view_count(&reduced), real == LINALG_F64 ? 8 : 4);
  if (!*owned) return DK_RESOURCE_EXHAUSTED;
  ein_sum(real, v, labels, n, *owned);
  reduced.data = *owned;
  *v = reduced;
  return DK_OK;
}

/* An operand of the batched GEMM: read in place when v lies as
 * [batch][outer][inner] (trans false) or [batch][inner][outer] (trans true),
 * else gathered into the first layout (*owned). */
static DK_Status gemm_operand(const dks_kernel_args *k, linalg_real real, const ein_plan *p,
                              const ein_view *v, const int32_t *batch, int32_t nb, const int32_t *outer,
                              int32_t no, const int32_t *inner, int32_t ni, const uint8_t **data,
                              bool *trans, void **owned) {
  int32_t order[MAX_LABELS];
  memcpy(order, batch, (size_t)nb * sizeof *order);
  memcpy(order + nb, inner, (size_t)ni * sizeof *order);
  memcpy(order + nb + ni, outer, (size_t)no * sizeof *order);
  *owned = NULL;
  *data = v->data;
  if (lies_as(v, order, nb + ni + no)) {
    *trans = true;
    return DK_OK;
  }
  memcpy(order + nb, outer, (size_t)no * sizeof *order);
  memcpy(order + nb + no, inner, (size_t)ni * sizeof *order);
  *trans = false;
  if (lies_as(v, order, nb + ni + no)) return DK_OK;
  ein_view gathered;
  compact_view(p, order, nb + no + ni, NULL, &gathered);
  *owned = linalg_scratch(k, (size_t)view_count(&gathered), real == LINALG_F64 ? 8 : 4);
  if (!*owned) return DK_RESOURCE_EXHAUSTED;
  ein_sum(real, v, order, nb + no + ni, *owned);
  *data = *owned;
  return DK_OK;
}

/* result (labels batch, left-only, right-only, each in output order) = l * r
 * summed over their shared labels that `keep` does not list. The product
 * goes to `out` when its order is the output's and `out` is given, else to
 * fresh scratch (*owned). */
static DK_Status contract(const dks_kernel_args *k, linalg_real real, const ein_plan *p, ein_view l,
                          ein_view r, const bool *keep, uint8_t *out, ein_view *result, void **owned) {
  void *l_sum, *r_sum, *l_pack = NULL, *r_pack = NULL;
  *owned = NULL;
  DK_Status st = drop_unneeded(k, real, p, &l, &r, keep, &l_sum);
  if (st != DK_OK) return st;
  st = drop_unneeded(k, real, p, &r, &l, keep, &r_sum);
  int32_t batch[MAX_LABELS], left[MAX_LABELS], right[MAX_LABELS], summed[MAX_LABELS];
  int32_t nb = 0, nl = 0, nr = 0, ns = 0;
  for (int32_t j = 0; j < l.n; j++) {
    int32_t label = l.label[j];
    if (find(&r, label) < 0) left[nl++] = label;
    else if (keep[label]) batch[nb++] = label;
    else summed[ns++] = label;
  }
  for (int32_t j = 0; j < r.n; j++)
    if (find(&l, r.label[j]) < 0) right[nr++] = r.label[j];
  sort_by_rank(p, batch, nb);
  sort_by_rank(p, left, nl);
  sort_by_rank(p, right, nr);
  int32_t labels[MAX_LABELS], n = 0;
  for (int32_t j = 0; j < nb; j++) labels[n++] = batch[j];
  for (int32_t j = 0; j < nl; j++) labels[n++] = left[j];
  for (int32_t j = 0; j < nr; j++) labels[n++] = right[j];
  bool in_order = out != NULL && n == p->out_n;
  for (int32_t j = 0; in_order && j < n; j++) in_order = p->rank[labels[j]] == j;
  int64_t B = 1, M = 1, N = 1, K = 1;
  for (int32_t j = 0; j < nb; j++) B *= p->size[batch[j]];
  for (int32_t j = 0; j < nl; j++) M *= p->size[left[j]];
  for (int32_t j = 0; j < nr; j++) N *= p->size[right[j]];
  for (int32_t j = 0; j < ns; j++) K *= p->size[summed[j]];
  size_t es = real == LINALG_F64 ? 8 : 4;
  uint8_t *dst = in_order ? out : NULL;
  if (st == DK_OK && !dst) {
    dst = linalg_scratch(k, (size_t)(B * M * N), es);
    *owned = dst;
    if (!dst) st = DK_RESOURCE_EXHAUSTED;
  }
  const uint8_t *a = NULL, *b = NULL;
  bool ta = false, tb = false;
  if (st == DK_OK && B * M * N * K > 0) {
    st = gemm_operand(k, real, p, &l, batch, nb, left, nl, summed, ns, &a, &ta, &l_pack);
    if (st == DK_OK) st = gemm_operand(k, real, p, &r, batch, nb, summed, ns, right, nr, &b, &tb, &r_pack);
  }
  if (st == DK_OK && B * M * N > 0) {
    if (K == 0) {
      memset(dst, 0, (size_t)(B * M * N) * es);
    } else {
      for (int64_t i = 0; i < B; i++)
        linalg_gemm(real, ta, tb, M, N, K, 1.0, a + i * M * K * (int64_t)es, ta ? M : K,
                    b + i * K * N * (int64_t)es, tb ? K : N, 0.0, dst + i * M * N * (int64_t)es, N);
    }
  }
  free(l_sum);
  free(r_sum);
  free(l_pack);
  free(r_pack);
  if (st != DK_OK) {
    free(*owned);
    *owned = NULL;
    return st;
  }
  compact_view(p, labels, n, dst, result);
  return DK_OK;
}

/* ---- The kernel -------------------------------------------------------------------------- */

static DK_Status einsum_float(const dks_kernel_args *k) {
  const dks_tensor *y = &k->out[0];
  linalg_real real = linalg_real_of(y);
  ein_plan *p = linalg_scratch(k, 1, sizeof *p);
  if (!p) return DK_RESOURCE_EXHAUSTED;
  DK_Status st = parse(k, p);
  if (st != DK_OK || y->size == 0) {
    free(p);
    return st;
  }
  ein_view current;
  view_of_operand(p, 0, &k->in[0], &current);
  void *held = NULL; /* the scratch `current` lies in */
  bool done = false;
  for (int32_t i = 1; st == DK_OK && i < p->operands; i++) {
    bool keep[MAX_LABELS] = {false};
    for (int32_t d = 0; d < p->out_n; d++) keep[p->out[d]] = true;
    for (int32_t j = i + 1; j < p->operands; j++)
      for (int32_t d = 0; d < k->in[j].ndim; d++) keep[p->term[j][d]] = true;
    ein_view next, product;
    view_of_operand(p, i, &k->in[i], &next);
    void *owned;
    bool last = i + 1 == p->operands;
    st = contract(k, real, p, current, next, keep, last ? y->data : NULL, &product, &owned);
    free(held);
    held = owned;
    current = product;
    done = last && st == DK_OK && current.data == y->data;
  }
  if (st == DK_OK && !done) ein_sum(real, &current, p->out, p->out_n, y->data);
  free(held);
  free(p);
  return st;
}

static DK_Status einsum_low(const dks_kernel_args *k) { return linalg_run_as_f32(k, einsum_float); }

/* Strided inputs are read in place (views carry strides); the output is compact. */
static const dks_kernel_def k_linalg_einsum[] = {
    {"Einsum", DK_DTYPE_FLOAT32, einsum_float, DK_KERNEL_STRIDED_INPUTS},
    {"Einsum", DK_DTYPE_FLOAT64, einsum_float, DK_KERNEL_STRIDED_INPUTS},
    {"Einsum", DK_DTYPE_FLOAT16, einsum_low, DK_KERNEL_STRIDED_INPUTS},
    {"Einsum", DK_DTYPE_BFLOAT16, einsum_low, DK_KERNEL_STRIDED_INPUTS},
};
DKS_REGISTER_KERNELS(k_linalg_einsum)

/* Einsum: every operand and Y of the key dtype. (The kernel matches the
 * equation to the operands' shapes as it parses it, before it reads any.) */
static DK_Status validate_einsum(const dks_kernel_args *k) {
  DK_Status st = DK_OK;
  for (size_t i = 1; st == DK_OK && i < k->num_inputs; i++) st = dks_check_dtype(k, "input", i, k->in[0].dtype);
  return st != DK_OK ? st : dks_check_dtype(k, "output", 0, k->in[0].dtype);
}

static const dks_validator v_linalg_einsum[] = {{"Einsum", validate_einsum}};
DKS_REGISTER_VALIDATORS(v_linalg_einsum)
