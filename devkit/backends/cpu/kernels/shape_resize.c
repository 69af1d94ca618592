/*
 * shape_resize.c -- Resize (ONNX opset 19).
 *
 * The geometry (per-dim scale, roi) comes from the host inputs as
 * devkit/ops/shape.py's _resize_geometry derives it; each output position of
 * a resized dim maps to an input coordinate x by the
 * coordinate_transformation_mode. Then:
 *
 * - nearest: one input index per output position (x rounded by
 *   nearest_mode, clamped); the output is a gather of elements, exact for
 *   every dtype.
 * - linear / cubic: separable. Each resized dim, in the order of `axes`, is
 *   one pass over a float64 tensor: an output row is the weighted sum of the
 *   input rows at its taps (indices clamped to the edge), taps of weight
 *   exactly 0 skipped. The weights follow ONNX's reference formulas
 *   operation for operation, so the result matches the NumPy reference bit
 *   for bit; one rounding to the output dtype at the end (integers: half to
 *   even, saturated).
 *
 * tf_crop_and_resize positions whose x falls outside [0, n_in - 1] take
 * extrapolation_value.
 */
#include <stdlib.h>

#include "shape.h"

enum coordinate_mode {
  HALF_PIXEL, HALF_PIXEL_SYMMETRIC, PYTORCH_HALF_PIXEL, ALIGN_CORNERS, ASYMMETRIC, TF_CROP_AND_RESIZE
};
enum interpolation { NEAREST, LINEAR, CUBIC };
enum nearest_rounding { ROUND_PREFER_FLOOR, ROUND_PREFER_CEIL, FLOOR, CEIL };
enum aspect_policy { STRETCH, NOT_LARGER, NOT_SMALLER };

typedef struct resize_params {
  int32_t naxes;
  int64_t axes[DKS_MAX_DIMS]; /* the resized dims, in processing order */
  double scale[DKS_MAX_DIMS];
  double roi_start[DKS_MAX_DIMS], roi_end[DKS_MAX_DIMS];
  enum coordinate_mode coordinates;
  enum interpolation mode;
  enum nearest_rounding rounding;
  bool antialias, exclude_outside;
  double cubic_a, extrapolation;
} resize_params;

static int choice(const char *value, const char *const *names, int count) {
  for (int i = 0; i < count; i++)
    if (strcmp(value, names[i]) == 0) return i;
  return -1;
}

/* The geometry (*p, and the output shape into out_shape) from the
 * attributes, checked as devkit/ops/shape.py's _resize_geometry checks them:
 * validate_resize runs it at launch, so when the compute function rereads
 * the call it cannot fail. */
static DK_Status read_params(const dks_kernel_args *k, resize_params *p, int64_t *out_shape) {
  static const char *const coordinate_names[] = {"half_pixel", "half_pixel_symmetric",
                                                 "pytorch_half_pixel", "align_corners",
                                                 "asymmetric", "tf_crop_and_resize"};
  static const char *const mode_names[] = {"nearest", "linear", "cubic"};
  static const char *const rounding_names[] = {"round_prefer_floor", "round_prefer_ceil", "floor",
                                               "ceil"};
  static const char *const policy_names[] = {"stretch", "not_larger", "not_smaller"};
  const dks_tensor *x = &k->in[0];
  int32_t rank = x->ndim, axes[DKS_MAX_DIMS];
  int64_t naxes, nscales, nsizes, nroi;
  /* Empty host inputs count as omitted, whichever element type they carry. */
  const DK_Attribute *scales_attr = dks_attr(k, "scales"), *sizes_attr = dks_attr(k, "sizes");
  const DK_Attribute *roi_attr = dks_attr(k, "roi");
  if ((scales_attr && scales_attr->count && scales_attr->type != DK_ATTR_FLOATS) ||
      (roi_attr && roi_attr->count && roi_attr->type != DK_ATTR_FLOATS) ||
      (sizes_attr && sizes_attr->count && sizes_attr->type != DK_ATTR_INTS))
    return dks_invalid(k, "scales and roi must be floats, sizes integers");
  const double *scales = dks_attr_floats(k, "scales", &nscales);
  const int64_t *sizes = dks_attr_ints(k, "sizes", &nsizes);
  const double *roi = dks_attr_floats(k, "roi", &nroi);
  DK_Status st = dks_check_axes(k, "axes", rank, axes, &naxes);
  if (st != DK_OK) return st;
  if (naxes < 0) {
    naxes = rank;
    for (int32_t i = 0; i < rank; i++) axes[i] = i;
  }
  if ((nscales != 0) == (nsizes != 0) || (nscales && nscales != naxes) ||
      (nsizes && nsizes != naxes) || (nroi && nroi != 2 * naxes))
    return dks_invalid(k, "needs scales or sizes with one entry per axis and roi with two (got %lld scales, "
                       "%lld sizes, %lld roi for %lld axes)", (long long)nscales, (long long)nsizes,
                       (long long)nroi, (long long)naxes);
  p->naxes = (int32_t)naxes;
  for (int32_t i = 0; i < p->naxes; i++) p->axes[i] = axes[i];
  /* The schema checked the strings against their choices. */
  int coordinates = choice(dks_attr_string(k, "coordinate_transformation_mode", "half_pixel"),
                           coordinate_names, 6);
  int mode = choice(dks_attr_string(k, "mode", "nearest"), mode_names, 3);
  int rounding = choice(dks_attr_string(k, "nearest_mode", "round_prefer_floor"), rounding_names, 4);
  int policy = choice(dks_attr_string(k, "keep_aspect_ratio_policy", "stretch"), policy_names, 3);
  if (coordinates < 0 || mode < 0 || rounding < 0 || policy < 0)
    return dks_invalid(k, "unknown mode string");
  p->coordinates = (enum coordinate_mode)coordinates;
  p->mode = (enum interpolation)mode;
  p->rounding = (enum nearest_rounding)rounding;
  p->antialias = dks_attr_int(k, "antialias", 0) != 0;
  p->exclude_outside = dks_attr_int(k, "exclude_outside", 0) != 0;
  p->cubic_a = dks_attr_float(k, "cubic_coeff_a", -0.75);
  p->extrapolation = dks_attr_float(k, "extrapolation_value", 0.0);
  if (p->coordinates == TF_CROP_AND_RESIZE && !roi)
    return dks_invalid(k, "coordinate_transformation_mode tf_crop_and_resize needs roi");
  for (int64_t i = 0; i < nroi; i++)
    if (!isfinite(roi[i])) return dks_invalid(k, "roi value %lld is %g, not finite", (long long)i, roi[i]);

  for (int32_t d = 0; d < rank; d++) {
    p->scale[d] = 1.0;
    p->roi_start[d] = 0.0;
    p->roi_end[d] = 1.0;
    out_shape[d] = x->shape[d];
  }
  double common = 0.0;
  for (int32_t i = 0; i < p->naxes; i++) {
    int64_t a = p->axes[i], n_in = x->shape[a];
    if (scales && !(isfinite(scales[i]) && scales[i] > 0))
      return dks_invalid(k, "scale %g for axis %lld is not a positive number", scales[i], (long long)a);
    if (sizes && (sizes[i] < 0 || (n_in == 0 && (sizes[i] || policy != STRETCH))))
      return dks_invalid(k, "size %lld for axis %lld of %lld elements is negative or resizes an empty axis",
                         (long long)sizes[i], (long long)a, (long long)n_in);
    double ratio = scales ? scales[i] : n_in ? (double)sizes[i] / (double)n_in : 1.0;
    p->scale[a] = ratio;
    if (i == 0 || (policy == NOT_LARGER && ratio < common) || (policy == NOT_SMALLER && ratio > common))
      common = ratio;
    if (roi) {
      p->roi_start[a] = roi[i];
      p->roi_end[a] = roi[naxes + i];
    }
  }
  if (sizes && policy != STRETCH) /* one scale for every axis, keeping the aspect ratio */
    for (int32_t i = 0; i < p->naxes; i++) p->scale[p->axes[i]] = common;
  for (int32_t i = 0; i < p->naxes; i++) {
    int64_t a = p->axes[i];
    double length = scales                      ? floor((double)x->shape[a] * p->scale[a])
                    : policy == STRETCH         ? (double)sizes[i]
                                                : floor(p->scale[a] * (double)x->shape[a] + 0.5);
    if (!(length < 0x1p63))
      return dks_invalid(k, "axis %lld resized by %g has more elements than int64 counts", (long long)a,
                         p->scale[a]);
    out_shape[a] = (int64_t)length;
    /* A non-empty output needs scale * n_in >= 1/2 (floor(n_in * scale) >=
     * 1, or round(n_in * scale) >= 1); that also bounds the antialias
     * filter's width, 2 / scale taps. */
    if (out_shape[a] && !(p->scale[a] * (double)x->shape[a] >= 0.5))
      return dks_invalid(k, "scale %g of axis %lld does not give a non-empty output", p->scale[a], (long long)a);
  }
  return DK_OK;
}

/* Output position y of dim d -> input coordinate; *outside for
 * tf_crop_and_resize positions beyond the input. `width` is ONNX's
 * length_resized, scale * n_in (fractional). */
static double source_coordinate(const resize_params *p, int64_t d, double y, int64_t n_in,
                                int64_t n_out, bool *outside) {
  double scale = p->scale[d], width = scale * (double)n_in;
  *outside = false;
  switch (p->coordinates) {
    case HALF_PIXEL: return (y + 0.5) / scale - 0.5;
    case HALF_PIXEL_SYMMETRIC: {
      double adjustment = (double)n_out / width, center = (double)n_in / 2;
      double offset = center * (1 - adjustment);
      return offset + (y + 0.5) / scale - 0.5;
    }
    case PYTORCH_HALF_PIXEL: return width > 1 ? (y + 0.5) / scale - 0.5 : 0.0;
    case ALIGN_CORNERS: return width != 1 ? y * (double)(n_in - 1) / (width - 1) : 0.0;
    case ASYMMETRIC: return y / scale;
    case TF_CROP_AND_RESIZE: {
      double start = p->roi_start[d], end = p->roi_end[d], x;
      if (width != 1)
        x = y * (end - start) * (double)(n_in - 1) / (width - 1);
      else
        x = (end - start) * (double)(n_in - 1) / 2;
      x = x + start * (double)(n_in - 1);
      *outside = !(x >= 0 && x <= (double)(n_in - 1));
      return x;
    }
  }
  return 0.0;
}

/* A double holding an index-like value, clamped into [lo, hi] before it
 * becomes an int64 (NaN -> lo): far-out coordinates then stay defined. */
static int64_t clamped_index(double v, int64_t lo, int64_t hi) {
  return v >= (double)hi ? hi : v >= (double)lo ? (int64_t)v : lo;
}

/* ---- nearest ------------------------------------------------------------------ */

/* Input index of each output position of dim d, or -1 where outside. */
static void nearest_indices(const resize_params *p, int64_t d, int64_t n_in, int64_t n_out,
                            bool resized, int64_t *index) {
  for (int64_t j = 0; j < n_out; j++) {
    if (!resized) {
      index[j] = j;
      continue;
    }
    bool outside;
    double x = source_coordinate(p, d, (double)j, n_in, n_out, &outside);
    double floor_x = floor(x), fraction = x - floor_x;
    bool up = p->rounding == ROUND_PREFER_FLOOR ? fraction > 0.5
              : p->rounding == ROUND_PREFER_CEIL ? fraction >= 0.5
              : p->rounding == CEIL              ? fraction > 0
                                                 : false;
    index[j] = outside ? -1 : clamped_index(floor_x + up, 0, n_in - 1);
  }
}

static DK_Status resize_nearest(const dks_kernel_args *k, const resize_params *p) {
  const dks_tensor *x = &k->in[0], *out = &k->out[0];
  int32_t rank = x->ndim;
  int64_t size = x->itemsize, total = 0, *index[DKS_MAX_DIMS];
  for (int32_t d = 0; d < rank; d++) total += out->shape[d];
  int64_t *tables = malloc((size_t)total * sizeof *tables);
  if (!tables) return dks_kernel_fail(k, DK_RESOURCE_EXHAUSTED, "out of host memory");
  bool resized[DKS_MAX_DIMS] = {false};
  for (int32_t i = 0; i < p->naxes; i++) resized[p->axes[i]] = true;
  int64_t *next = tables;
  for (int32_t d = 0; d < rank; d++) {
    index[d] = next;
    nearest_indices(p, d, x->shape[d], out->shape[d], resized[d], index[d]);
    next += out->shape[d];
  }
  uint8_t fill[8];
  dks_store_from_double(fill, out->dtype,
                     shape_is_float(out->dtype) ? p->extrapolation : nearbyint(p->extrapolation));
  /* Output rows along the last dim (rank >= 1: scales or sizes has an entry
   * per axis); pos indexes the dims before it. */
  int64_t row = out->shape[rank - 1], step = x->strides[rank - 1], pos[DKS_MAX_DIMS] = {0};
  uint8_t *dst = out->data;
  for (int64_t done = 0; done < out->size; done += row) {
    int64_t base = 0;
    bool outside = false;
    for (int32_t d = 0; d < rank - 1; d++) {
      outside |= index[d][pos[d]] < 0;
      base += index[d][pos[d]] * x->strides[d];
    }
    for (int64_t j = 0; j < row; j++, dst += size) {
      int64_t last = index[rank - 1][j];
      if (outside || last < 0)
        memcpy(dst, fill, (size_t)size);
      else
        memcpy(dst, x->data + (base + last * step) * size, (size_t)size);
    }
    for (int32_t d = rank - 2; d >= 0 && ++pos[d] == out->shape[d]; d--) pos[d] = 0;
  }
  free(tables);
  return DK_OK;
}

/* ---- linear and cubic --------------------------------------------------------- */

/* The taps of one dim: for output position j, `count` input indices
 * (clamped) and weights at index[j * count + t] / weight[...]; outside[j]
 * for tf_crop_and_resize positions. */
typedef struct axis_taps {
  int64_t count;
  int64_t *index;
  double *weight;
  bool *outside;
  bool identity; /* every position copies its own input row: no pass needed */
} axis_taps;

static double filter(enum interpolation mode, double x, double a) {
  x = fabs(x);
  if (mode == LINEAR) {
    double w = 1 - x;
    return w < 0 ? 0 : w > 1 ? 1 : w;
  }
  double x2 = x * x, x3 = x * x2;
  if (x <= 1) return (a + 2) * x3 - (a + 3) * x2 + 1;
  if (x < 2) return a * x3 - 5 * a * x2 + 8 * a * x - 4 * a;
  return 0.0;
}

/* The weights of the `count` taps from `first` past the left neighbour of
 * a coordinate that lies `ratio` in (0, 1] past it. */
static void tap_weights(const resize_params *p, double scale, int64_t first, int64_t count,
                        double ratio, double *w) {
  double a = p->cubic_a;
  if (p->antialias) {
    double stretch = scale < 1 ? scale : 1, total = 0;
    for (int64_t t = 0; t < count; t++) {
      w[t] = filter(p->mode, ((double)(first + t) - ratio) * stretch, a);
      total = total + w[t];
    }
    for (int64_t t = 0; t < count; t++) w[t] = w[t] / total;
  } else if (p->mode == LINEAR) {
    w[0] = 1 - ratio;
    w[1] = ratio;
  } else {
    double r1 = ratio + 1, q = 1 - ratio, q1 = (1 - ratio) + 1;
    w[0] = ((a * r1 - 5 * a) * r1 + 8 * a) * r1 - 4 * a;
    w[1] = ((a + 2) * ratio - (a + 3)) * ratio * ratio + 1;
    w[2] = ((a + 2) * q - (a + 3)) * q * q + 1;
    w[3] = ((a * q1 - 5 * a) * q1 + 8 * a) * q1 - 4 * a;
  }
}

static void free_taps(axis_taps *t) {
  free(t->index);
  free(t->weight);
  free(t->outside);
}

static bool build_taps(const resize_params *p, int64_t d, int64_t n_in, int64_t n_out,
                       axis_taps *t) {
  int64_t support = p->mode == LINEAR ? 1 : 2, first = 1 - support;
  if (p->antialias) {
    double stretch = p->scale[d] < 1 ? p->scale[d] : 1;
    first = (int64_t)floor(-(double)support / stretch) + 1;
  }
  t->count = 2 - 2 * first;
  t->index = malloc((size_t)(n_out * t->count) * sizeof *t->index);
  t->weight = malloc((size_t)(n_out * t->count) * sizeof *t->weight);
  t->outside = malloc((size_t)n_out * sizeof *t->outside);
  if (!t->index || !t->weight || !t->outside) return false;
  t->identity = n_out == n_in;
  for (int64_t j = 0; j < n_out; j++) {
    int64_t *index = t->index + j * t->count;
    double *w = t->weight + j * t->count;
    double x = source_coordinate(p, d, (double)j, n_in, n_out, &t->outside[j]);
    double floor_x = floor(x), left = x == floor_x ? x - 1 : floor_x;
    tap_weights(p, p->scale[d], first, t->count, x - left, w);
    /* Far beyond the edges every tap clamps to the same element: clamping
     * `left` there changes nothing but keeps the conversion defined. */
    int64_t base = clamped_index(left, -t->count - 1, n_in + t->count + 1);
    double total = 0;
    for (int64_t k = 0; k < t->count; k++) {
      index[k] = base + first + k;
      if (p->exclude_outside && (index[k] < 0 || index[k] >= n_in)) w[k] = 0;
      total = total + w[k];
    }
    int64_t used = 0;
    for (int64_t k = 0; k < t->count; k++) {
      if (p->exclude_outside && total != 0) w[k] = w[k] / total;
      index[k] = index[k] < 0 ? 0 : index[k] >= n_in ? n_in - 1 : index[k];
      if (w[k] == 0) continue;
      used++;
      if (w[k] != 1 || index[k] != j) t->identity = false;
    }
    if (used != 1 || t->outside[j]) t->identity = false;
  }
  return true;
}

/* The pass over the last dim (inner 1): per output element the sum of its
 * taps, in the order and with the skips of the general pass (the same
 * bits) as selects, so that with the tap count constant (linear: 2) the
 * loop over the outputs vectorises. */
static inline __attribute__((always_inline)) void last_dim_row(const double *src, double *dst, int64_t n_out,
                                                               const axis_taps *t, int64_t count, double fill) {
  for (int64_t j = 0; j < n_out; j++) {
    double sum = 0.0;
    for (int64_t k = 0; k < count; k++) {
      double w = t->weight[j * count + k], term = sum + w * src[t->index[j * count + k]];
      sum = w != 0 ? term : sum;
    }
    dst[j] = t->outside[j] ? fill : sum;
  }
}

DKS_VECTOR_CLONES static void interpolate_last(const double *src, double *dst, int64_t outer, int64_t n_in,
                                               int64_t n_out, const axis_taps *t, double fill) {
  for (int64_t o = 0; o < outer; o++, src += n_in, dst += n_out) {
    if (t->count == 2)
      last_dim_row(src, dst, n_out, t, 2, fill);
    else
      last_dim_row(src, dst, n_out, t, t->count, fill);
  }
}

/* One separable pass over [outer, n_in, inner] -> [outer, n_out, inner]. */
static void interpolate(const double *src, double *dst, int64_t outer, int64_t n_in,
                        int64_t n_out, int64_t inner, const axis_taps *t, double fill) {
  if (inner == 1) {
    interpolate_last(src, dst, outer, n_in, n_out, t, fill);
    return;
  }
  for (int64_t o = 0; o < outer; o++) {
    for (int64_t j = 0; j < n_out; j++) {
      double *row = dst + (o * n_out + j) * inner;
      if (t->outside[j]) {
        for (int64_t i = 0; i < inner; i++) row[i] = fill;
        continue;
      }
      for (int64_t i = 0; i < inner; i++) row[i] = 0.0;
      for (int64_t k = 0; k < t->count; k++) {
        double w = t->weight[j * t->count + k];
        if (w == 0) continue;
        const double *in = src + (o * n_in + t->index[j * t->count + k]) * inner;
        for (int64_t i = 0; i < inner; i++) row[i] += w * in[i];
      }
    }
  }
}

/* float32, the common case, converts in a plain loop; the others element by element. */
static void load_doubles(const dks_tensor *x, double *dst) {
  if (x->dtype == DK_DTYPE_FLOAT32) {
    const float *src = (const float *)x->data;
    for (int64_t i = 0; i < x->size; i++) dst[i] = src[i];
    return;
  }
  for (int64_t i = 0; i < x->size; i++) dst[i] = dks_load_as_double(x->data + i * x->itemsize, x->dtype);
}

static void store_doubles(const double *src, const dks_tensor *out) {
  if (out->dtype == DK_DTYPE_FLOAT32) {
    float *dst = (float *)out->data;
    for (int64_t i = 0; i < out->size; i++) dst[i] = (float)src[i];
    return;
  }
  bool integer = !shape_is_float(out->dtype);
  for (int64_t i = 0; i < out->size; i++)
    dks_store_from_double(out->data + i * out->itemsize, out->dtype, integer ? nearbyint(src[i]) : src[i]);
}

/* A float32 resize of the last two dims only (the others' passes
 * identities, none outside the input): per output row, the pass over rows
 * into one float64 row, then the pass over its columns straight into the
 * output -- the sums of the two passes in their order (the same bits), with
 * no float64 copy of the input, the intermediate or the output. */
typedef struct plane_resize {
  const float *x;
  float *y;
  int64_t planes, rows_in, cols_in, rows_out, cols_out;
  const axis_taps *rows, *cols;
} plane_resize;

static bool no_outside(const axis_taps *t, int64_t n_out) {
  for (int64_t j = 0; j < n_out; j++)
    if (t->outside[j]) return false;
  return true;
}

/* out[i] = the sum of row's taps for column i (as last_dim_row: zero
 * weights skipped by selects, so that with `count` constant the loop
 * vectorises), rounded to float32. */
static inline __attribute__((always_inline)) void resize_columns(const double *row, float *out, int64_t n,
                                                                 const int64_t *index, const double *weight,
                                                                 int64_t count) {
  for (int64_t i = 0; i < n; i++) {
    double sum = 0.0;
    for (int64_t k = 0; k < count; k++) {
      double w = weight[i * count + k], term = sum + w * row[index[i * count + k]];
      sum = w != 0 ? term : sum;
    }
    out[i] = (float)sum;
  }
}

DKS_VECTOR_CLONES static void resize_planes(const plane_resize *r, double *row) {
  const axis_taps *tr = r->rows, *tc = r->cols;
  for (int64_t o = 0; o < r->planes; o++) {
    const float *plane = r->x + o * r->rows_in * r->cols_in;
    for (int64_t j = 0; j < r->rows_out; j++) {
      for (int64_t c = 0; c < r->cols_in; c++) row[c] = 0.0;
      for (int64_t k = 0; k < tr->count; k++) {
        double w = tr->weight[j * tr->count + k];
        if (w == 0) continue;
        const float *in = plane + tr->index[j * tr->count + k] * r->cols_in;
        for (int64_t c = 0; c < r->cols_in; c++) row[c] += w * (double)in[c];
      }
      float *out = r->y + (o * r->rows_out + j) * r->cols_out;
      if (tc->count == 2)
        resize_columns(row, out, r->cols_out, tc->index, tc->weight, 2);
      else
        resize_columns(row, out, r->cols_out, tc->index, tc->weight, tc->count);
    }
  }
}

static bool resize_last_two(const dks_kernel_args *k, const resize_params *p, const axis_taps *taps, int32_t last,
                            DK_Status *status) {
  const dks_tensor *x = &k->in[0], *out = &k->out[0];
  int32_t n = x->ndim, first = -1;
  if (x->dtype != DK_DTYPE_FLOAT32 || out->dtype != DK_DTYPE_FLOAT32 || n < 2 || last < 1) return false;
  for (int32_t i = 0; i <= last; i++) {
    if (taps[i].identity) continue;
    if (p->axes[i] == n - 2 && first < 0 && i < last) {
      first = i;
    } else if (!(p->axes[i] == n - 1 && i == last)) {
      return false;
    }
  }
  if (first < 0 || p->axes[last] != n - 1 || !no_outside(&taps[first], out->shape[n - 2]) ||
      !no_outside(&taps[last], out->shape[n - 1]))
    return false;
  plane_resize r = {.x = (const float *)x->data, .y = (float *)out->data, .planes = 1, .rows_in = x->shape[n - 2],
                    .cols_in = x->shape[n - 1], .rows_out = out->shape[n - 2], .cols_out = out->shape[n - 1],
                    .rows = &taps[first], .cols = &taps[last]};
  for (int32_t d = 0; d < n - 2; d++) r.planes *= x->shape[d];
  double *row = malloc((size_t)r.cols_in * sizeof *row);
  if (!row) {
    *status = dks_kernel_fail(k, DK_RESOURCE_EXHAUSTED, "out of host memory");
    return true;
  }
  resize_planes(&r, row);
  free(row);
  *status = DK_OK;
  return true;
}

/* Runs the passes of taps[0..last] (identity ones skipped), float64 in
 * between, and stores the result. */
static DK_Status run_passes(const dks_kernel_args *k, const resize_params *p,
                            const axis_taps *taps, int32_t last) {
  const dks_tensor *x = &k->in[0], *out = &k->out[0];
  DK_Status fused;
  if (resize_last_two(k, p, taps, last, &fused)) return fused;
  bool f64 = out->dtype == DK_DTYPE_FLOAT64;
  double *owned = NULL, *result = (double *)out->data;
  const double *current = (const double *)x->data;
  if (!f64 || last < 0) { /* with no pass to run, the converted input is the result */
    owned = malloc((size_t)x->size * sizeof *owned);
    if (!owned) return dks_kernel_fail(k, DK_RESOURCE_EXHAUSTED, "out of host memory");
    load_doubles(x, owned);
    current = owned;
  }
  int64_t shape[DKS_MAX_DIMS];
  memcpy(shape, x->shape, (size_t)x->ndim * sizeof *shape);
  for (int32_t i = 0; i <= last; i++) {
    int64_t d = p->axes[i], outer = 1, inner = 1;
    if (taps[i].identity) continue;
    for (int64_t e = 0; e < d; e++) outer *= shape[e];
    for (int64_t e = d + 1; e < x->ndim; e++) inner *= shape[e];
    double *next = i == last && f64 ? result
                                    : malloc((size_t)(outer * out->shape[d] * inner) * sizeof *next);
    if (!next) {
      free(owned);
      return dks_kernel_fail(k, DK_RESOURCE_EXHAUSTED, "out of host memory");
    }
    interpolate(current, next, outer, shape[d], out->shape[d], inner, &taps[i], p->extrapolation);
    free(owned);
    owned = next == result ? NULL : next;
    current = next;
    shape[d] = out->shape[d];
  }
  if (current != result) store_doubles(current, out);
  free(owned);
  return DK_OK;
}

static DK_Status resize_interpolate(const dks_kernel_args *k, const resize_params *p) {
  const dks_tensor *x = &k->in[0], *out = &k->out[0];
  axis_taps taps[DKS_MAX_DIMS] = {{0}};
  DK_Status status = DK_OK;
  int32_t last = -1; /* the last pass that does any work */
  for (int32_t i = 0; i < p->naxes && status == DK_OK; i++) {
    int64_t d = p->axes[i];
    if (!build_taps(p, d, x->shape[d], out->shape[d], &taps[i]))
      status = dks_kernel_fail(k, DK_RESOURCE_EXHAUSTED, "out of host memory for the taps");
    else if (!taps[i].identity)
      last = i;
  }
  if (status == DK_OK) status = run_passes(k, p, taps, last);
  for (int32_t i = 0; i < p->naxes; i++) free_taps(&taps[i]);
  return status;
}

/* An empty input gives an empty output (validate_resize checked the shape). */
static DK_Status resize(const dks_kernel_args *k) {
  if (!k->out[0].size) return DK_OK;
  resize_params p;
  int64_t shape[DKS_MAX_DIMS];
  DK_Status status = read_params(k, &p, shape);
  if (status != DK_OK) return status;
  return p.mode == NEAREST ? resize_nearest(k, &p) : resize_interpolate(k, &p);
}

static const dks_kernel_def k_resize[] = {
    {"Resize", DK_DTYPE_FLOAT32, resize, 0},  {"Resize", DK_DTYPE_FLOAT64, resize, 0},
    {"Resize", DK_DTYPE_FLOAT16, resize, 0},  {"Resize", DK_DTYPE_BFLOAT16, resize, 0},
    {"Resize", DK_DTYPE_INT8, resize, 0},     {"Resize", DK_DTYPE_UINT8, resize, 0},
};
DKS_REGISTER_KERNELS(k_resize)

/* Resize: the geometry as read_params checks it, and Y of X's dtype and the
 * shape it gives. */
static DK_Status validate_resize(const dks_kernel_args *k) {
  resize_params p;
  int64_t shape[DKS_MAX_DIMS];
  DK_Status st = read_params(k, &p, shape);
  if (st == DK_OK) st = dks_check_dtype(k, "output", 0, k->in[0].dtype);
  return st != DK_OK ? st : dks_check_output(k, 0, k->in[0].ndim, shape);
}

static const dks_validator v_resize[] = {{"Resize", validate_resize}};
DKS_REGISTER_VALIDATORS(v_resize)
