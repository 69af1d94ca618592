/*
 * training.c -- the pointwise activation gradients (ReluGrad, LeakyReluGrad,
 * SigmoidGrad, TanhGrad, GeluGrad), SoftmaxGrad and LogSoftmaxGrad, the
 * optimizer updates of ai.onnx.preview.training (Momentum, Adagrad, Adam),
 * and the helpers every training kernel file shares (training.h).
 *
 * Everything computes in double and rounds once on store. The pointwise
 * gradients run on dks_elementwise and honour strides (DKS_STRIDED); the
 * others take compact tensors. The formulas are those of
 * devkit/ops/training.py, term for term.
 */
#include "training.h"

#include <stdlib.h>

/* ---- Shared helpers (training.h) ------------------------------------------ */

void training_widen(double *dst, const uint8_t *src, DK_DTypeKey dtype, int64_t n) {
  if (n <= 0) return; /* src may be an empty tensor's NULL */
  switch (dtype) {
    case DK_DTYPE_FLOAT32:
      for (int64_t i = 0; i < n; i++) dst[i] = ((const float *)src)[i];
      break;
    case DK_DTYPE_FLOAT64:
      memcpy(dst, src, (size_t)n * sizeof *dst);
      break;
    case DK_DTYPE_FLOAT16:
      for (int64_t i = 0; i < n; i++) dst[i] = dks_f16_to_f32(((const uint16_t *)src)[i]);
      break;
    default: /* bfloat16: the host admits float dtypes only */
      for (int64_t i = 0; i < n; i++) dst[i] = dks_bf16_to_f32(((const uint16_t *)src)[i]);
      break;
  }
}

void training_narrow(uint8_t *dst, DK_DTypeKey dtype, const double *src, int64_t n) {
  if (n <= 0) return;
  switch (dtype) {
    case DK_DTYPE_FLOAT32:
      for (int64_t i = 0; i < n; i++) ((float *)dst)[i] = (float)src[i];
      break;
    case DK_DTYPE_FLOAT64:
      memcpy(dst, src, (size_t)n * sizeof *src);
      break;
    case DK_DTYPE_FLOAT16:
      for (int64_t i = 0; i < n; i++) ((uint16_t *)dst)[i] = dks_f32_to_f16((float)src[i]);
      break;
    default:
      for (int64_t i = 0; i < n; i++) ((uint16_t *)dst)[i] = dks_f32_to_bf16((float)src[i]);
      break;
  }
}

/* Below this many terms a sum runs sequentially with four accumulators. */
#define PAIRWISE_BLOCK 128

double training_sum(const double *x, int64_t n) {
  if (n > PAIRWISE_BLOCK) return training_sum(x, n / 2) + training_sum(x + n / 2, n - n / 2);
  double s0 = 0, s1 = 0, s2 = 0, s3 = 0;
  int64_t i = 0;
  for (; i + 4 <= n; i += 4) {
    s0 += x[i];
    s1 += x[i + 1];
    s2 += x[i + 2];
    s3 += x[i + 3];
  }
  for (; i < n; i++) s0 += x[i];
  return (s0 + s1) + (s2 + s3);
}

double *training_scratch(const dks_kernel_args *k, int64_t count) {
  double *p = calloc(count > 0 ? (size_t)count : 1, sizeof *p);
  if (!p)
    dks_kernel_fail(k, DK_RESOURCE_EXHAUSTED, "out of host memory for %lld scratch doubles",
                    (long long)count);
  return p;
}

/* ---- Pointwise activation gradients --------------------------------------- */

static const double SQRT_HALF = 0.70710678118654752440;
static const double INV_SQRT_2PI = 0.39894228040143267794;
static const double GELU_K = 0.79788456080286535588; /* sqrt(2 / pi) */
static const double GELU_C = 0.044715;

static inline double sigmoid(double z) {
  double e = exp(-fabs(z));
  return (z >= 0 ? 1.0 : e) / (1.0 + e);
}

/* Phi(x) + x phi(x); x phi(x) is 0 where phi underflows (its limit, and
 * what keeps +-inf from giving inf * 0). */
static inline double gelu_derivative(double x) {
  double phi = exp(-0.5 * x * x) * INV_SQRT_2PI;
  return 0.5 * erfc(-x * SQRT_HALF) + (phi == 0.0 ? 0.0 : x * phi);
}

/* d/dx of x sigmoid(2u), u = K (x + C x^3): sigmoid(2u) + slope sech^2(u),
 * sech^2 from e^-2|u| so that nothing overflows; 0 where it underflows. */
static inline double gelu_tanh_derivative(double x) {
  double u = GELU_K * (x + GELU_C * x * x * x);
  double e = exp(-2.0 * fabs(u));
  double sech2 = 4.0 * e / ((1.0 + e) * (1.0 + e));
  double slope = 0.5 * x * GELU_K * (1.0 + 3.0 * GELU_C * x * x);
  return sigmoid(2.0 * u) + (sech2 == 0.0 ? 0.0 : slope * sech2);
}

#define AS_DOUBLE(v) ((double)(v))
#define STORE_F32(v) ((float)(v))
#define STORE_F64(v) (v)
#define STORE_F16(v) dks_f32_to_f16((float)(v))
#define STORE_BF16(v) dks_f32_to_bf16((float)(v))

/* X(SFX, T, LOAD, STORE): storage T, loaded as double, stored rounded once. */
#define POINTWISE_TYPES(X)                              \
  X(f32, float, AS_DOUBLE, STORE_F32)                   \
  X(f64, double, AS_DOUBLE, STORE_F64)                  \
  X(f16, uint16_t, dks_f16_to_f32, STORE_F16)           \
  X(bf16, uint16_t, dks_bf16_to_f32, STORE_BF16)

/* An inner loop dX = EXPR over operands (dX, dY, v), v being X or Y; EXPR
 * may read the attribute `alpha`. */
#define POINTWISE_LOOP(NAME, SFX, T, LOAD, STORE, EXPR)                                 \
  static void NAME##_##SFX(int64_t n, uint8_t *const *p, const int64_t *s, void *ctx) { \
    double alpha = *(const double *)ctx;                                                \
    (void)alpha;                                                                        \
    uint8_t *o = p[0];                                                                  \
    const uint8_t *a = p[1], *b = p[2];                                                 \
    for (int64_t i = 0; i < n; i++, o += s[0], a += s[1], b += s[2]) {                  \
      double dy = LOAD(*(const T *)a), v = LOAD(*(const T *)b);                         \
      *(T *)o = STORE(EXPR);                                                            \
    }                                                                                   \
  }

#define POINTWISE_LOOPS(SFX, T, LOAD, STORE)                                             \
  POINTWISE_LOOP(relu_grad, SFX, T, LOAD, STORE, v <= 0 ? 0.0 : dy)                      \
  POINTWISE_LOOP(leaky_relu_grad, SFX, T, LOAD, STORE, v > 0 ? dy : alpha * dy)          \
  POINTWISE_LOOP(sigmoid_grad, SFX, T, LOAD, STORE, dy * (v * (1.0 - v)))                \
  POINTWISE_LOOP(tanh_grad, SFX, T, LOAD, STORE, dy * ((1.0 - v) * (1.0 + v)))           \
  POINTWISE_LOOP(gelu_grad, SFX, T, LOAD, STORE, dy * gelu_derivative(v))                \
  POINTWISE_LOOP(gelu_tanh_grad, SFX, T, LOAD, STORE, dy * gelu_tanh_derivative(v))      \
  static DK_Status relu_grad_kernel_##SFX(const dks_kernel_args *k) {                    \
    return pointwise(k, relu_grad_##SFX);                                                \
  }                                                                                      \
  static DK_Status leaky_relu_grad_kernel_##SFX(const dks_kernel_args *k) {              \
    return pointwise(k, leaky_relu_grad_##SFX);                                          \
  }                                                                                      \
  static DK_Status sigmoid_grad_kernel_##SFX(const dks_kernel_args *k) {                 \
    return pointwise(k, sigmoid_grad_##SFX);                                             \
  }                                                                                      \
  static DK_Status tanh_grad_kernel_##SFX(const dks_kernel_args *k) {                    \
    return pointwise(k, tanh_grad_##SFX);                                                \
  }                                                                                      \
  static DK_Status gelu_grad_kernel_##SFX(const dks_kernel_args *k) {                    \
    bool tanh_form = strcmp(dks_attr_string(k, "approximate", "none"), "tanh") == 0;     \
    return pointwise(k, tanh_form ? gelu_tanh_grad_##SFX : gelu_grad_##SFX);             \
  }

static DK_Status pointwise(const dks_kernel_args *k, dks_inner_loop loop) {
  double alpha = dks_attr_float(k, "alpha", 0.01);
  dks_elementwise(k, 2, loop, &alpha);
  return DK_OK;
}

POINTWISE_TYPES(POINTWISE_LOOPS)

/* ---- SoftmaxGrad, LogSoftmaxGrad --------------------------------------------- */

/* The tensors as (outer, n, inner), n the axis. Per outer slice: widen dY
 * and Y, sum along the axis per inner position (pairwise, on a gathered
 * column), apply the formula in place and narrow. */
static DK_Status softmax_grad(const dks_kernel_args *k, bool log) {
  const dks_tensor *dy = &k->in[0], *y = &k->in[1], *dx = &k->out[0];
  if (dx->size == 0) return DK_OK;
  int64_t axis = dks_attr_int(k, "axis", -1);
  if (axis < 0) axis += dy->ndim;
  int64_t n = dy->shape[axis], inner = training_prod(dy->shape, (int32_t)axis + 1, dy->ndim);
  int64_t slice = n * inner, outer = dx->size / slice;
  double *buf = training_scratch(k, 3 * slice + n);
  if (!buf) return DK_RESOURCE_EXHAUSTED;
  double *g = buf, *v = buf + slice, *terms = buf + 2 * slice, *column = buf + 3 * slice;
  for (int64_t o = 0; o < outer; o++) {
    training_widen(g, dy->data + o * slice * dy->itemsize, dy->dtype, slice);
    training_widen(v, y->data + o * slice * y->itemsize, y->dtype, slice);
    for (int64_t j = 0; j < slice; j++) terms[j] = log ? g[j] : g[j] * v[j];
    for (int64_t i = 0; i < inner; i++) {
      const double *col = terms + i;
      if (inner > 1) {
        for (int64_t a = 0; a < n; a++) column[a] = terms[a * inner + i];
        col = column;
      }
      double sum = training_sum(col, n);
      for (int64_t a = 0; a < n; a++) {
        int64_t j = a * inner + i;
        g[j] = log ? g[j] - exp(v[j]) * sum : v[j] * (g[j] - sum);
      }
    }
    training_narrow(dx->data + o * slice * dx->itemsize, dx->dtype, g, slice);
  }
  free(buf);
  return DK_OK;
}

static DK_Status softmax_grad_kernel(const dks_kernel_args *k) { return softmax_grad(k, false); }
static DK_Status log_softmax_grad_kernel(const dks_kernel_args *k) { return softmax_grad(k, true); }

/* ---- Optimizers: Momentum, Adagrad, Adam --------------------------------- */

/* Inputs X1..Xn, G1..Gn, then the state (V1..Vn, H1..Hn); outputs X_new
 * and the new state in the same grouping. R and T arrive as attributes. */
typedef struct optimizer_args {
  double r;  /* the learning rate (Adagrad, Adam: already adjusted for T) */
  int64_t t; /* the update count */
  double alpha, beta, epsilon, decay, post;
  bool nesterov;
} optimizer_args;

/* One optimized tensor of n elements and its state; v or h unused by
 * Momentum (h) and Adagrad (v). */
typedef struct optimizer_tensor {
  int64_t n;
  const uint8_t *x, *g, *v, *h;
  uint8_t *x_new, *v_new, *h_new;
} optimizer_tensor;

typedef void (*optimizer_step)(const optimizer_args *p, const optimizer_tensor *m);

#define OPTIMIZER_STEPS(SFX, T)                                                              \
  static void momentum_##SFX(const optimizer_args *p, const optimizer_tensor *m) {           \
    const T *x = (const T *)m->x, *g = (const T *)m->g, *v = (const T *)m->v;                \
    T *x_new = (T *)m->x_new, *v_new = (T *)m->v_new;                                        \
    double beta = p->t > 0 ? p->beta : 1.0; /* the first update takes the whole gradient */  \
    for (int64_t i = 0; i < m->n; i++) {                                                     \
      double gr = p->decay * (double)x[i] + (double)g[i];                                    \
      double vn = p->alpha * (double)v[i] + beta * gr;                                       \
      v_new[i] = (T)vn;                                                                      \
      x_new[i] = (T)(p->nesterov ? (double)x[i] - p->r * (gr + p->alpha * vn)                \
                                 : (double)x[i] - p->r * vn);                                \
    }                                                                                        \
  }                                                                                          \
  static void adagrad_##SFX(const optimizer_args *p, const optimizer_tensor *m) {            \
    const T *x = (const T *)m->x, *g = (const T *)m->g, *h = (const T *)m->h;                \
    T *x_new = (T *)m->x_new, *h_new = (T *)m->h_new;                                        \
    for (int64_t i = 0; i < m->n; i++) {                                                     \
      double gr = p->decay * (double)x[i] + (double)g[i];                                    \
      double hn = (double)h[i] + gr * gr;                                                    \
      h_new[i] = (T)hn;                                                                      \
      x_new[i] = (T)((double)x[i] - p->r * gr / (sqrt(hn) + p->epsilon));                    \
    }                                                                                        \
  }                                                                                          \
  static void adam_##SFX(const optimizer_args *p, const optimizer_tensor *m) {               \
    const T *x = (const T *)m->x, *g = (const T *)m->g, *v = (const T *)m->v;                \
    const T *h = (const T *)m->h;                                                            \
    T *x_new = (T *)m->x_new, *v_new = (T *)m->v_new, *h_new = (T *)m->h_new;                \
    for (int64_t i = 0; i < m->n; i++) {                                                     \
      double gr = p->decay * (double)x[i] + (double)g[i];                                    \
      double vn = p->alpha * (double)v[i] + (1.0 - p->alpha) * gr;                           \
      double hn = p->beta * (double)h[i] + (1.0 - p->beta) * (gr * gr);                      \
      v_new[i] = (T)vn;                                                                      \
      h_new[i] = (T)hn;                                                                      \
      x_new[i] = (T)((1.0 - p->post) * ((double)x[i] - p->r * (vn / (sqrt(hn) + p->epsilon)))); \
    }                                                                                        \
  }
OPTIMIZER_STEPS(f32, float)
OPTIMIZER_STEPS(f64, double)

typedef enum { MOMENTUM, ADAGRAD, ADAM } optimizer_kind;

/* [kind][0: float32, 1: float64] */
static const optimizer_step optimizer_steps[3][2] = {
    {momentum_f32, momentum_f64}, {adagrad_f32, adagrad_f64}, {adam_f32, adam_f64}};

static DK_Status optimizer(const dks_kernel_args *k, optimizer_kind kind) {
  int64_t count;
  optimizer_args p = {.r = dks_attr_floats(k, "R", &count)[0], .t = dks_attr_ints(k, "T", &count)[0]};
  p.decay = dks_attr_float(k, "norm_coefficient", 0.0);
  p.alpha = dks_attr_float(k, "alpha", 0.9);
  p.beta = dks_attr_float(k, "beta", 0.999);
  p.epsilon = dks_attr_float(k, "epsilon", 1e-6);
  p.post = dks_attr_float(k, "norm_coefficient_post", 0.0);
  p.nesterov = strcmp(dks_attr_string(k, "mode", "standard"), "nesterov") == 0;
  if (kind == ADAGRAD) p.r /= 1.0 + (double)p.t * dks_attr_float(k, "decay_factor", 0.0);
  if (kind == ADAM && p.t > 0)
    p.r = p.r * sqrt(1.0 - pow(p.beta, (double)p.t)) / (1.0 - pow(p.alpha, (double)p.t));
  optimizer_step step = optimizer_steps[kind][k->in[0].dtype == DK_DTYPE_FLOAT64];
  /* The state groups after G: V then H for Adam, the one state otherwise. */
  size_t groups = kind == ADAM ? 4 : 3, n = k->num_inputs / groups;
  const dks_tensor *in = k->in, *out = k->out;
  for (size_t i = 0; i < n; i++) {
    if (in[i].size == 0) continue;
    optimizer_tensor m = {.n = in[i].size, .x = in[i].data, .g = in[n + i].data, .x_new = out[i].data};
    if (kind == ADAGRAD) {
      m.h = in[2 * n + i].data;
      m.h_new = out[n + i].data;
    } else {
      m.v = in[2 * n + i].data;
      m.v_new = out[n + i].data;
    }
    if (kind == ADAM) {
      m.h = in[3 * n + i].data;
      m.h_new = out[2 * n + i].data;
    }
    step(&p, &m);
  }
  return DK_OK;
}

static DK_Status momentum_kernel(const dks_kernel_args *k) { return optimizer(k, MOMENTUM); }
static DK_Status adagrad_kernel(const dks_kernel_args *k) { return optimizer(k, ADAGRAD); }
static DK_Status adam_kernel(const dks_kernel_args *k) { return optimizer(k, ADAM); }

/* ---- Registration ----------------------------------------------------------- */

#define TRAINING_DEFS(SFX, DT)                                          \
  {"ReluGrad", DT, relu_grad_kernel_##SFX, DKS_STRIDED},                \
  {"LeakyReluGrad", DT, leaky_relu_grad_kernel_##SFX, DKS_STRIDED},     \
  {"SigmoidGrad", DT, sigmoid_grad_kernel_##SFX, DKS_STRIDED},          \
  {"TanhGrad", DT, tanh_grad_kernel_##SFX, DKS_STRIDED},                \
  {"GeluGrad", DT, gelu_grad_kernel_##SFX, DKS_STRIDED},                \
  {"SoftmaxGrad", DT, softmax_grad_kernel, 0},                          \
  {"LogSoftmaxGrad", DT, log_softmax_grad_kernel, 0},

static const dks_kernel_def k_training[] = {
    TRAINING_FLOAT_TYPES(TRAINING_DEFS)
    {"Momentum", DK_DTYPE_FLOAT32, momentum_kernel, 0},
    {"Momentum", DK_DTYPE_FLOAT64, momentum_kernel, 0},
    {"Adagrad", DK_DTYPE_FLOAT32, adagrad_kernel, 0},
    {"Adagrad", DK_DTYPE_FLOAT64, adagrad_kernel, 0},
    {"Adam", DK_DTYPE_FLOAT32, adam_kernel, 0},
    {"Adam", DK_DTYPE_FLOAT64, adam_kernel, 0},
};
DKS_REGISTER_KERNELS(k_training)

/* The optimizers: every float attribute finite; R and T are one value each;
 * then per tensor X the inputs G (and V, H) share X's shape and dtype, and
 * each output its input's. */
static DK_Status validate_optimizer(const dks_kernel_args *k) {
  for (size_t i = 0; i < k->num_attributes; i++) {
    const DK_Attribute *a = &k->attributes[i];
    DK_Status st = a->type == DK_ATTR_FLOAT ? dks_check_float(k, a->name, -INFINITY) : DK_OK;
    if (st != DK_OK) return st;
  }
  int64_t nr, nt;
  const DK_Attribute *r = dks_attr(k, "R"), *t = dks_attr(k, "T");
  nr = r->count;
  nt = t->count;
  if (nr != 1 || nt != 1)
    return dks_invalid(k, "R and T must be one value each, got %lld and %lld", (long long)nr, (long long)nt);
  size_t per = strcmp(k->op, "Adam") == 0 ? 4 : 3, n = k->num_inputs / per;
  if (n == 0 || k->num_inputs % per || k->num_outputs != n * (per - 1))
    return dks_invalid(k, "%zu inputs and %zu outputs do not make groups of %zu inputs and %zu outputs",
                       k->num_inputs, k->num_outputs, per, per - 1);
  for (size_t i = 0; i < k->num_inputs; i++) {
    const dks_tensor *x = &k->in[i % n], *t2 = &k->in[i];
    bool same = t2->ndim == x->ndim && t2->dtype == x->dtype;
    for (int32_t d = 0; same && d < x->ndim; d++) same = t2->shape[d] == x->shape[d];
    if (!same) return dks_invalid(k, "input %zu does not have the shape and dtype of input %zu", i, i % n);
  }
  for (size_t j = 0; j < k->num_outputs; j++) {
    const dks_tensor *x = &k->in[j % n], *o = &k->out[j];
    bool same = o->ndim == x->ndim && o->dtype == x->dtype;
    for (int32_t d = 0; same && d < x->ndim; d++) same = o->shape[d] == x->shape[d];
    if (!same) return dks_invalid(k, "output %zu does not have the shape and dtype of input %zu", j, j % n);
  }
  return DK_OK;
}

static const dks_validator v_training[] = {
    {"ReluGrad", dks_validate_pair_like_input},     {"SigmoidGrad", dks_validate_pair_like_input},
    {"LeakyReluGrad", dks_validate_pair_like_input}, {"TanhGrad", dks_validate_pair_like_input},
    {"GeluGrad", dks_validate_pair_like_input},     {"SoftmaxGrad", dks_validate_axis_pair_like_input},
    {"LogSoftmaxGrad", dks_validate_axis_pair_like_input},
    {"Momentum", validate_optimizer},               {"Adagrad", validate_optimizer},
    {"Adam", validate_optimizer},
};
DKS_REGISTER_VALIDATORS(v_training)
