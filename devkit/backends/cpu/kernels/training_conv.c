/*
 * training_conv.c -- ConvGrad: the gradients of Conv with respect to X, W
 * and B, through OpenBLAS.
 *
 * Per image and group, over bands of output positions: the im2col columns
 * of X give dW += dY col^T (one GEMM), and dcol = W^T dY (another) is
 * scattered back into dX by col2im, the adjoint of im2col (both shared with
 * Conv, linalg.h); for float32 3x3 kernels with unit strides dX is a Conv of
 * dY by Winograd instead. The work is split over the pool by group and run
 * of input channels. dB sums dY over the batch and the output positions.
 * The geometry is Conv's
 * (linalg_window_forward, with dY's spatial sizes as the grid); float16 and
 * bfloat16 run as float32 (linalg_run_as_f32).
 */
#include "linalg.h"
#include "training.h"

#include <stdatomic.h>
#include <stdlib.h>

/* Column buffers cover a band of output positions: at most this many
 * elements each, or one position's column when that is larger. */
#define COL_BUDGET ((int64_t)1 << 21)

/* db[m] = sum of dY[n, m, ...] over n and the plane, pairwise per plane. */
static DK_Status bias_grad(const dks_kernel_args *k, const dks_tensor *dy, const dks_tensor *db, int64_t plane) {
  int64_t batch = dy->size ? dy->shape[0] : 0, filters = dy->shape[1];
  double *sums = training_scratch(k, filters + plane);
  if (!sums) return DK_RESOURCE_EXHAUSTED;
  double *row = sums + filters;
  for (int64_t n = 0; n < batch; n++) {
    for (int64_t m = 0; m < filters; m++) {
      training_widen(row, dy->data + (n * filters + m) * plane * dy->itemsize, dy->dtype, plane);
      sums[m] += training_sum(row, plane);
    }
  }
  training_narrow(db->data, db->dtype, sums, filters);
  free(sums);
  return DK_OK;
}

/* Split over the pool by group and run of input channels: a chunk owns
 * its channels' columns of dW and their planes of dX, so no other thread
 * writes there; it walks the images and bands itself, summing into dW. */
typedef struct conv_grad_job {
  linalg_real real;
  const linalg_window *w;
  int64_t es, group, cg, mg, taps, rows, in_plane, out_plane, batch, block, band;
  const uint8_t *dy, *x, *wt;
  uint8_t *dx, *dw;
  bool with_dx; /* false: dX is computed already */
  atomic_bool failed;
} conv_grad_job;

static void conv_grad_part(void *arg, int64_t begin, int64_t end) {
  conv_grad_job *j = arg;
  int64_t es = j->es, blocks = (j->cg + j->block - 1) / j->block, size = j->block * j->taps * j->band;
  uint8_t *col = malloc((size_t)(2 * size * es));
  if (!col) {
    atomic_store(&j->failed, true);
    return;
  }
  uint8_t *dcol = col + size * es;
  for (int64_t i = begin; i < end; i++) {
    int64_t g = i / blocks, c0 = i % blocks * j->block, cb = j->cg - c0 < j->block ? j->cg - c0 : j->block;
    int64_t first = c0 * j->taps, width = cb * j->taps; /* this run's columns of W_g (mg x rows) */
    const uint8_t *wg = j->wt + (g * j->mg * j->rows + first) * es;
    uint8_t *dwg = j->dw + (g * j->mg * j->rows + first) * es;
    for (int64_t n = 0; n < j->batch; n++) {
      int64_t channel = n * j->group * j->cg + g * j->cg + c0;
      const uint8_t *xg = j->x + channel * j->in_plane * es;
      const uint8_t *dyg = j->dy + (n * j->group + g) * j->mg * j->out_plane * es;
      uint8_t *dxg = j->dx + channel * j->in_plane * es;
      for (int64_t p0 = 0; p0 < j->out_plane; p0 += j->band) {
        int64_t count = j->out_plane - p0 < j->band ? j->out_plane - p0 : j->band;
        linalg_im2col(j->real, j->w, xg, cb, p0, count, col);
        /* dW_g[:, run] (mg x width) += dY_g[:, band] (mg x count) @ col^T (count x width) */
        linalg_gemm(j->real, false, true, j->mg, width, count, 1.0, dyg + p0 * es, j->out_plane, col, count, 1.0,
                    dwg, j->rows);
        if (!j->with_dx) continue;
        /* dcol (width x count) = W_g[:, run]^T (width x mg) @ dY_g[:, band] (mg x count) */
        linalg_gemm(j->real, true, false, width, count, j->mg, 1.0, wg, j->rows, dyg + p0 * es, j->out_plane, 0.0,
                    dcol, count);
        linalg_col2im(j->real, j->w, dcol, cb, p0, count, dxg);
      }
    }
  }
  free(col);
}

/* dX of a 3x3 Conv with unit strides and dilations is the Conv of dY with
 * the kernels flipped and their channel axes swapped, begin pads 2 - pad
 * (W' (group * cg, mg, 3, 3)): by Winograd where that fits. *done is false
 * when it does not, or when a non-finite value asks for the direct way. */
static DK_Status grad_input_winograd(const dks_kernel_args *k, const linalg_window *w, int64_t group,
                                     bool *done) {
  const dks_tensor *dy = &k->in[0], *x = &k->in[1], *wt = &k->in[2], *dx = &k->out[0];
  int64_t cg = x->shape[1] / group, mg = dy->shape[1] / group;
  linalg_window flipped = *w;
  for (int32_t d = 0; d < w->n; d++) {
    flipped.grid[d] = w->target[d];
    flipped.target[d] = w->grid[d];
    flipped.pad[d] = 2 - w->pad[d];
  }
  *done = false;
  if (w->n != 2 || flipped.pad[0] < 0 || flipped.pad[1] < 0 || !linalg_winograd_fits(&flipped, dx->dtype, mg, cg))
    return DK_OK;
  dks_tensor turned = *wt;
  turned.shape[0] = group * cg;
  turned.shape[1] = mg;
  float *kernels = malloc((size_t)wt->size * sizeof(float));
  if (!kernels) return dks_kernel_fail(k, DK_RESOURCE_EXHAUSTED, "out of host memory for the flipped kernels");
  const float *from = (const float *)wt->data;
  for (int64_t g = 0; g < group; g++)
    for (int64_t m = 0; m < mg; m++)
      for (int64_t c = 0; c < cg; c++)
        for (int t = 0; t < 9; t++)
          kernels[((g * cg + c) * mg + m) * 9 + t] = from[((g * mg + m) * cg + c) * 9 + 8 - t];
  turned.data = (uint8_t *)kernels;
  bool redo = false;
  DK_Status st = linalg_conv_winograd(k, dy, &turned, NULL, NULL, dx, &flipped, group, &redo);
  free(kernels);
  *done = st == DK_OK && !redo;
  return st;
}

static DK_Status conv_grad_float(const dks_kernel_args *k) {
  const dks_tensor *dy = &k->in[0], *x = &k->in[1], *wt = &k->in[2];
  const dks_tensor *dx = &k->out[0], *dw = &k->out[1], *db = &k->out[2];
  if (dw->size) memset(dw->data, 0, (size_t)(dw->size * dw->itemsize));
  linalg_window w;
  linalg_window_forward(k, x->ndim - 2, x->shape + 2, dy->shape + 2, wt->shape + 2, &w);
  int64_t in_plane = linalg_prod(w.target, w.n), out_plane = linalg_prod(w.grid, w.n);
  DK_Status st = bias_grad(k, dy, db, out_plane);
  /* Without products (no images, channels, filters or positions) dX and dW stay 0. */
  if (st != DK_OK || dy->size == 0 || x->size == 0) {
    if (dx->size) memset(dx->data, 0, (size_t)(dx->size * dx->itemsize));
    return st;
  }
  int64_t group = dks_attr_int(k, "group", 1), taps = linalg_prod(w.kernel, w.n);
  conv_grad_job j = {.real = linalg_real_of(dx), .w = &w, .es = dx->itemsize, .group = group,
                     .cg = x->shape[1] / group, .mg = dy->shape[1] / group, .taps = taps,
                     .in_plane = in_plane, .out_plane = out_plane, .batch = x->shape[0],
                     .dy = dy->data, .x = x->data, .wt = wt->data, .dx = dx->data, .dw = dw->data};
  j.rows = j.cg * taps;
  bool dx_done = false;
  if ((st = grad_input_winograd(k, &w, group, &dx_done)) != DK_OK) return st;
  j.with_dx = !dx_done;
  if (j.with_dx) memset(dx->data, 0, (size_t)(dx->size * dx->itemsize)); /* col2im adds into dX */
  atomic_init(&j.failed, false);
  /* Runs of channels: a few chunks per thread. */
  int64_t threads = dks_thread_count(), blocks = threads > 1 ? (4 * threads + group - 1) / group : 1;
  if (blocks > j.cg) blocks = j.cg;
  j.block = (j.cg + blocks - 1) / blocks;
  j.band = COL_BUDGET / (j.block * taps);
  j.band = j.band < 1 ? 1 : j.band > out_plane ? out_plane : j.band;
  dks_parallel_for(group * ((j.cg + j.block - 1) / j.block), 1, conv_grad_part, &j);
  if (atomic_load(&j.failed))
    return dks_kernel_fail(k, DK_RESOURCE_EXHAUSTED, "out of host memory for a thread's column buffer");
  return DK_OK;
}

static DK_Status conv_grad_low(const dks_kernel_args *k) { return linalg_run_as_f32(k, conv_grad_float); }

/* Compact tensors only: the host copies strided inputs. */
static const dks_kernel_def k_training_conv[] = {
    {"ConvGrad", DK_DTYPE_FLOAT32, conv_grad_float, 0},
    {"ConvGrad", DK_DTYPE_FLOAT64, conv_grad_float, 0},
    {"ConvGrad", DK_DTYPE_FLOAT16, conv_grad_low, 0},
    {"ConvGrad", DK_DTYPE_BFLOAT16, conv_grad_low, 0},
};
DKS_REGISTER_KERNELS(k_training_conv)

/* ConvGrad(dY, X, W) -> dX (X's shape), dW (W's), dB (M): dY is Conv(X, W)'s shape. */
static DK_Status validate_conv_grad(const dks_kernel_args *k) {
  DK_Status st = dks_check_rank(k, 1, 3, DKS_MAX_DIMS);
  if (st == DK_OK) st = dks_check_rank(k, 2, k->in[1].ndim, k->in[1].ndim);
  if (st == DK_OK) st = dks_check_rank(k, 0, k->in[1].ndim, k->in[1].ndim);
  int64_t y[DKS_MAX_DIMS];
  if (st == DK_OK) st = linalg_check_conv(k, &k->in[1], &k->in[2], NULL, false, y);
  for (size_t i = 1; st == DK_OK && i < 3; i++) st = dks_check_dtype(k, "input", i, k->in[0].dtype);
  for (size_t j = 0; st == DK_OK && j < k->num_outputs; j++) st = dks_check_dtype(k, "output", j, k->in[0].dtype);
  if (st != DK_OK) return st;
  bool same = true;
  for (int32_t d = 0; d < k->in[1].ndim; d++) same = same && k->in[0].shape[d] == y[d];
  if (!same) return dks_invalid(k, "dY's shape is not what Conv of X and W gives");
  if ((st = dks_check_output_like(k, 0, 1)) != DK_OK) return st;
  if (k->num_outputs > 1 && (st = dks_check_output_like(k, 1, 2)) != DK_OK) return st;
  if (k->num_outputs > 2) st = dks_check_output(k, 2, 1, &k->in[2].shape[0]);
  return st;
}

static const dks_validator v_training_conv[] = {{"ConvGrad", validate_conv_grad}};
DKS_REGISTER_VALIDATORS(v_training_conv)
