/*
 * linalg_conv.c -- Conv (im2col + GEMM, or Winograd F(2x2, 3x3) for float32
 * 3x3 kernels with unit strides on planes of 48 tiles or more, 16 with the
 * filters' transforms prepared; many filters on strided windows or small
 * planes by whole-plane columns in blocks, or with W prepared by
 * linalg_conv_indirect.h's product, vectorised over the filters) and
 * ConvTranspose (GEMM +
 * col2im), N-D, per image and group, split over the plugin's thread pool;
 * 1x1 kernels with unit strides and no padding multiply the image
 * directly. float32 products go by linalg_packed.h's AVX-512 block where
 * the CPU has it, else the BLAS. float16/bfloat16 run as float32.
 */
#include "linalg_conv_broadcast.h"
#include "linalg_conv_direct.h"
#include "linalg_conv_epilogue.h"
#include "linalg_conv_indirect.h"
#include "linalg_conv_pointwise.h"
#include "linalg_packed.h"

#include <stdatomic.h>
#include <stdlib.h>

/* Column buffers cover a band of grid positions at a time: at most this
 * many elements, or one position's column when that is larger. */
#define COL_BUDGET ((int64_t)1 << 22)

/* ---- Walking a band of grid positions ------------------------------------------- */

/* The grid positions [p0, p0 + count) of one kernel tap, in runs along the
 * last axis. Each run covers columns [p, p + len) of a column-buffer row;
 * column p + j meets target element base + j * step (row-major in the
 * target plane) for j in [lo, hi), and lies in the padding otherwise. */
typedef struct band_walk {
  const linalg_window *w;
  const int64_t *tap;
  int64_t q[DKS_MAX_DIMS]; /* grid coordinates of the next run */
  int64_t p, end;
} band_walk;

typedef struct band_run {
  int64_t p, len, base, step, lo, hi;
} band_run;

static void band_start(band_walk *it, const linalg_window *w, const int64_t *tap, int64_t p0,
                       int64_t count) {
  it->w = w;
  it->tap = tap;
  it->p = p0;
  it->end = p0 + count;
  for (int32_t d = w->n - 1; d >= 0; d--) {
    it->q[d] = p0 % w->grid[d];
    p0 /= w->grid[d];
  }
}

static bool band_next(band_walk *it, band_run *r) {
  const linalg_window *w = it->w;
  int32_t last = w->n - 1;
  if (it->p >= it->end) return false;
  r->p = it->p;
  r->len = w->grid[last] - it->q[last];
  if (r->len > it->end - it->p) r->len = it->end - it->p;
  r->step = w->stride[last];
  int64_t base = 0;
  bool inside = true;
  for (int32_t d = 0; d < last; d++) {
    int64_t pos = it->q[d] * w->stride[d] - w->pad[d] + it->tap[d] * w->dilation[d];
    inside = inside && pos >= 0 && pos < w->target[d];
    base = base * w->target[d] + pos;
  }
  int64_t first = it->q[last] * w->stride[last] - w->pad[last] + it->tap[last] * w->dilation[last];
  r->base = base * w->target[last] + first;
  if (inside) {
    linalg_valid_range(first, r->step, r->len, w->target[last], &r->lo, &r->hi);
  } else {
    r->lo = r->hi = 0;
  }
  it->p += r->len;
  it->q[last] += r->len;
  for (int32_t d = last; d > 0 && it->q[d] == w->grid[d]; d--) {
    it->q[d] = 0;
    it->q[d - 1]++;
  }
  return true;
}

static void next_tap(int64_t *tap, const linalg_window *w) {
  for (int32_t d = w->n - 1; d >= 0; d--) {
    if (++tap[d] < w->kernel[d]) return;
    tap[d] = 0;
  }
}

/* to[j] = from[j * step] for j in [0, n): the strided reads of strided
 * convolutions (ResNet's stem and downsampling layers: step 2). */
#define GATHER(NAME, T)                                                                    \
  DKS_VECTOR_CLONES static void NAME(T *to, const T *from, int64_t step, int64_t n) {      \
    if (step == 2)                                                                         \
      for (int64_t j = 0; j < n; j++) to[j] = from[2 * j];                                 \
    else                                                                                   \
      for (int64_t j = 0; j < n; j++) to[j] = from[j * step];                              \
  }
GATHER(gather_f32, float)
GATHER(gather_f64, double)

/* col[(c, tap)][p] = image[c] at the target of grid position p0 + p (0 in
 * the padding), for `channels` planes of the image. Runs along the last
 * axis with unit steps are copies. A 2-D window takes a shorter way: per
 * tap, the valid columns of an output row are found once, and each row of
 * the band is a copy (or a strided gather) between two runs of zeros. */
#define IM2COL(NAME, T, GATHER_FN)                                                        \
  static void NAME##_2d(const linalg_window *w, const T *image, int64_t channels, int64_t p0, \
                        int64_t count, T *col) {                                          \
    int64_t ow = w->grid[1], ih = w->target[0], iw = w->target[1];                        \
    int64_t kh_n = w->kernel[0], kw_n = w->kernel[1], sw = w->stride[1];                  \
    for (int64_t c = 0; c < channels; c++) {                                              \
      const T *src = image + c * ih * iw;                                                 \
      for (int64_t kh = 0; kh < kh_n; kh++)                                               \
        for (int64_t kw = 0; kw < kw_n; kw++) {                                           \
          T *dst = col + ((c * kh_n + kh) * kw_n + kw) * count;                           \
          int64_t x0 = kw * w->dilation[1] - w->pad[1], lo, hi;                           \
          linalg_valid_range(x0, sw, ow, iw, &lo, &hi);                                   \
          for (int64_t p = p0; p < p0 + count;) {                                         \
            int64_t oy = p / ow, ox = p % ow, len = ow - ox;                              \
            if (len > p0 + count - p) len = p0 + count - p;                               \
            int64_t iy = oy * w->stride[0] - w->pad[0] + kh * w->dilation[0];             \
            T *out = dst + (p - p0) - ox; /* out[j]: output column j of this row */       \
            int64_t a = lo > ox ? lo : ox, b = hi < ox + len ? hi : ox + len;             \
            if (iy < 0 || iy >= ih || b < a) a = b = ox + len;                            \
            for (int64_t j = ox; j < a; j++) out[j] = 0;                                  \
            if (b > a) { /* in[j * sw]: the input under output column j */                \
              const T *in = src + iy * iw + x0;                                           \
              if (sw == 1)                                                                \
                memcpy(out + a, in + a, (size_t)(b - a) * sizeof(T));                     \
              else                                                                        \
                GATHER_FN(out + a, in + a * sw, sw, b - a);                               \
            }                                                                             \
            for (int64_t j = b; j < ox + len; j++) out[j] = 0;                            \
            p += len;                                                                     \
          }                                                                               \
        }                                                                                 \
    }                                                                                     \
  }                                                                                       \
  static void NAME(const linalg_window *w, const void *from, int64_t channels, int64_t p0, \
                   int64_t count, void *to) {                                             \
    const T *image = from;                                                                \
    T *col = to;                                                                          \
    if (w->n == 2) {                                                                      \
      NAME##_2d(w, image, channels, p0, count, col);                                      \
      return;                                                                             \
    }                                                                                     \
    int64_t taps = linalg_prod(w->kernel, w->n), plane = linalg_prod(w->target, w->n);    \
    for (int64_t c = 0; c < channels; c++) {                                              \
      const T *src = image + c * plane;                                                   \
      int64_t tap[DKS_MAX_DIMS] = {0};                                                    \
      for (int64_t t = 0; t < taps; t++, next_tap(tap, w)) {                              \
        T *dst = col + (c * taps + t) * count;                                            \
        band_walk it;                                                                     \
        band_run r;                                                                       \
        band_start(&it, w, tap, p0, count);                                               \
        while (band_next(&it, &r)) {                                                      \
          T *out = dst + (r.p - p0);                                                      \
          for (int64_t j = 0; j < r.lo; j++) out[j] = 0;                                  \
          if (r.step == 1)                                                                \
            memcpy(out + r.lo, src + r.base + r.lo, (size_t)(r.hi - r.lo) * sizeof(T));   \
          else                                                                            \
            GATHER_FN(out + r.lo, src + r.base + r.lo * r.step, r.step, r.hi - r.lo);     \
          for (int64_t j = r.hi; j < r.len; j++) out[j] = 0;                              \
        }                                                                                 \
      }                                                                                   \
    }                                                                                     \
  }
IM2COL(im2col_f32, float, gather_f32)
IM2COL(im2col_f64, double, gather_f64)

/* image[m] at the target of grid position p0 + p += col[(m, tap)][p]: the
 * adjoint of im2col, for `channels` planes of the image. */
#define COL2IM(NAME, T)                                                                   \
  static void NAME(const linalg_window *w, const void *from, int64_t channels, int64_t p0, \
                   int64_t count, void *to) {                                             \
    const T *col = from;                                                                  \
    T *image = to;                                                                        \
    int64_t taps = linalg_prod(w->kernel, w->n), plane = linalg_prod(w->target, w->n);    \
    for (int64_t c = 0; c < channels; c++) {                                              \
      T *dst = image + c * plane;                                                         \
      int64_t tap[DKS_MAX_DIMS] = {0};                                                    \
      for (int64_t t = 0; t < taps; t++, next_tap(tap, w)) {                              \
        const T *src = col + (c * taps + t) * count;                                      \
        band_walk it;                                                                     \
        band_run r;                                                                       \
        band_start(&it, w, tap, p0, count);                                               \
        while (band_next(&it, &r)) {                                                      \
          const T *in = src + (r.p - p0);                                                 \
          for (int64_t j = r.lo; j < r.hi; j++) dst[r.base + j * r.step] += in[j];        \
        }                                                                                 \
      }                                                                                   \
    }                                                                                     \
  }
COL2IM(col2im_f32, float)
COL2IM(col2im_f64, double)

void linalg_im2col(linalg_real real, const linalg_window *w, const void *image, int64_t channels, int64_t p0,
                   int64_t count, void *col) {
  (real == LINALG_F64 ? im2col_f64 : im2col_f32)(w, image, channels, p0, count, col);
}

void linalg_col2im(linalg_real real, const linalg_window *w, const void *col, int64_t channels, int64_t p0,
                   int64_t count, void *image) {
  (real == LINALG_F64 ? col2im_f64 : col2im_f32)(w, col, channels, p0, count, image);
}

typedef struct filter_blocks_job {
  const float *wt;
  float *dst;
  int64_t mg, steps, block, per_group; /* blocks per group */
} filter_blocks_job;

/* Blocks [begin, end) (over groups) of linalg_conv_filter_blocks. */
static void filter_blocks(void *arg, int64_t begin, int64_t end) {
  const filter_blocks_job *j = arg;
  for (int64_t i = begin; i < end; i++) {
    int64_t g = i / j->per_group, m0 = i % j->per_group * j->block;
    float *out = j->dst + i * j->steps * j->block;
    for (int64_t f = 0; f < j->block; f++) {
      const float *src = j->wt + (g * j->mg + m0 + f) * j->steps;
      bool inside = m0 + f < j->mg;
      for (int64_t s = 0; s < j->steps; s++) out[s * j->block + f] = inside ? src[s] : 0.0f;
    }
  }
}

int64_t linalg_conv_filter_block_floats(int64_t group, int64_t mg, int64_t steps, int64_t block) {
  return group * linalg_ceil_div(mg, block) * block * steps;
}

void linalg_conv_filter_blocks(const float *wt, int64_t group, int64_t mg, int64_t steps, int64_t block,
                               float *dst) {
  filter_blocks_job j = {.wt = wt, .dst = dst, .mg = mg, .steps = steps, .block = block,
                         .per_group = linalg_ceil_div(mg, block)};
  dks_parallel_for(group * j.per_group, linalg_ceil_div(1 << 16, steps * block), filter_blocks, &j);
}

/* y[m][j] += b[m] for `rows` rows of `cols` elements, `ld` apart. */
#define ADD_BIAS(NAME, T)                                                                 \
  static void NAME(T *y, const T *b, int64_t rows, int64_t cols, int64_t ld) {            \
    for (int64_t m = 0; m < rows; m++) {                                                  \
      T bias = b[m], *row = y + m * ld;                                                   \
      for (int64_t j = 0; j < cols; j++) row[j] += bias;                                  \
    }                                                                                     \
  }
ADD_BIAS(add_bias_f32, float)
ADD_BIAS(add_bias_f64, double)

static void add_bias(linalg_real real, void *y, const void *b, int64_t rows, int64_t cols, int64_t ld) {
  if (real == LINALG_F64)
    add_bias_f64(y, b, rows, cols, ld);
  else
    add_bias_f32(y, b, rows, cols, ld);
}

/* A 1x1 kernel with unit strides and no padding maps grid to target 1:1. */
static bool pointwise(const linalg_window *w) {
  for (int32_t d = 0; d < w->n; d++)
    if (w->kernel[d] != 1 || w->stride[d] != 1 || w->pad[d] != 0 || w->grid[d] != w->target[d])
      return false;
  return true;
}

/* Grid positions per band for columns of `rows` elements. */
static int64_t band_width(int64_t rows, int64_t positions) {
  int64_t band = rows > 0 ? COL_BUDGET / rows : positions;
  if (band > positions) band = positions;
  return band > 0 ? band : 1;
}

static const dks_tensor *bias_of(const dks_kernel_args *k) {
  return k->num_inputs > 2 && k->in[2].ndim >= 0 ? &k->in[2] : NULL;
}

/* With no input channels or no input positions nothing is summed: y is the
 * epilogue of 0 (the bias, Z, the activation). Handled first, so no pointer
 * is formed from an empty (NULL) tensor's data. */
static bool nothing_summed(const dks_tensor *x, const dks_tensor *y, const conv_epilogue *e, int64_t plane) {
  if (x->size) return false;
  memset(y->data, 0, (size_t)(y->size * y->itemsize));
  for (int64_t n = 0; n < y->shape[0]; n++)
    conv_epilogue_apply(e, y->data + n * y->shape[1] * plane * y->itemsize, 0, y->shape[1], plane, plane);
  return true;
}

/* ---- Parallel parts with their own scratch ------------------------------------------- */

/* A pool chunk allocates its scratch once for its items; one that cannot
 * sets `failed` and the kernel reports it after the split. */
typedef struct conv_split {
  linalg_real real;
  const linalg_window *w;
  int64_t es, group, items, block, scratch;
  atomic_bool failed;
} conv_split;

/* Scratch starts on a cache line: the AVX-512 products' 16-float panel
 * rows then each lie in one line (a row across two is two reads). */
static void *aligned_scratch(int64_t bytes) {
  return aligned_alloc(64, (size_t)((bytes + 63) / 64 * 64));
}

static void *chunk_scratch(conv_split *s, int64_t elements) {
  void *p = elements ? aligned_scratch(elements * s->es) : NULL;
  if (elements && !p) atomic_store(&s->failed, true);
  return p;
}

/* Scratch the kernel writes in full before reading: no clearing (calloc
 * clears megabytes for nothing); NULL after reporting failure. */
static void *uncleared_scratch(const dks_kernel_args *k, int64_t elements, int64_t es) {
  void *p = aligned_scratch(elements ? elements * es : 1);
  if (!p)
    dks_kernel_fail(k, DK_RESOURCE_EXHAUSTED, "out of host memory for %lld scratch elements of %lld bytes",
                    (long long)elements, (long long)es);
  return p;
}

static DK_Status split_status(const dks_kernel_args *k, conv_split *s) {
  if (!atomic_load(&s->failed)) return DK_OK;
  return dks_kernel_fail(k, DK_RESOURCE_EXHAUSTED, "out of host memory for a thread's column buffer");
}

/* ---- Conv --------------------------------------------------------------------------- */

/* Work is split over the pool in tiles of output positions per image and
 * group: a chunk builds a tile's columns in its own buffer (sized for the
 * core's cache), multiplies them on its thread and adds the bias while the
 * tile is in cache. Planes too small for tiles of TILE_MIN positions per
 * thread are computed whole instead, with the columns built by channel on
 * the pool and the product split by output channels (linalg_gemm): a tile's
 * product would pack all the weights again for few positions. */
#define TILE_BYTES ((int64_t)1 << 19)
#define TILE_MIN 64
/* A chunk the OS delays on a busy machine holds up the split: when tiles
 * are few, they are cut down to this size, for a few chunks per thread
 * (not pointwise ones: their product is short, and one part per thread
 * measured faster). */
#define TILE_EVEN 128

typedef struct conv_job {
  conv_split s;
  bool direct;
  int64_t cg, mg, rows, in_plane, out_plane, x_channels, y_channels;
  const uint8_t *x, *wt;
  const conv_epilogue *ep; /* B, Z and the activation */
  uint8_t *y;
  uint8_t *col; /* the shared column buffer of a whole plane */
  int64_t p0, count;
  int64_t filter0; /* conv_blocked: the group's first filter */
} conv_job;

/* y (m x n, rows ldy apart) = w (m x k) @ b (k x n): float32 by the
 * AVX-512 packed block on the chunk's thread where there is one. */
static void conv_product(const conv_job *j, int64_t m, int64_t n, int64_t k, const uint8_t *w, int64_t ldw,
                         const uint8_t *b, int64_t ldb, uint8_t *y, int64_t ldy) {
  if (j->s.real == LINALG_F32 && packed_block_avx512())
    packed_gemm_rows(m, n, k, (const float *)w, ldw, (const float *)b, ldb, false, (float *)y, ldy);
  else
    linalg_gemm(j->s.real, false, false, m, n, k, 1.0, w, ldw, b, ldb, 0.0, y, ldy);
}

static void conv_tiles(void *arg, int64_t begin, int64_t end) {
  conv_job *j = arg;
  int64_t es = j->s.es, tiles = linalg_ceil_div(j->out_plane, j->s.block);
  uint8_t *col = j->direct ? NULL : chunk_scratch(&j->s, j->rows * j->s.block);
  if (!j->direct && !col) return;
  for (int64_t i = begin; i < end; i++) {
    int64_t ng = i / tiles, n = ng / j->s.group, g = ng % j->s.group;
    int64_t p0 = i % tiles * j->s.block, count = j->out_plane - p0;
    if (count > j->s.block) count = j->s.block;
    const uint8_t *xg = j->x + (n * j->x_channels + g * j->cg) * j->in_plane * es;
    const uint8_t *wg = j->wt + g * j->mg * j->rows * es;
    uint8_t *yg = j->y + ((n * j->y_channels + g * j->mg) * j->out_plane + p0) * es;
    if (j->direct) {
      conv_product(j, j->mg, count, j->cg, wg, j->rows, xg + p0 * es, j->in_plane, yg, j->out_plane);
    } else {
      linalg_im2col(j->s.real, j->s.w, xg, j->cg, p0, count, col);
      conv_product(j, j->mg, count, j->rows, wg, j->rows, col, count, yg, j->out_plane);
    }
    conv_epilogue_apply(j->ep, yg, g * j->mg, j->mg, count, j->out_plane);
  }
  free(col);
}

/* Columns of channels [begin, end) of the image at j->x, positions j->p0.. */
static void conv_columns(void *arg, int64_t begin, int64_t end) {
  conv_job *j = arg;
  int64_t taps = j->rows / j->cg;
  linalg_im2col(j->s.real, j->s.w, j->x + begin * j->in_plane * j->s.es, end - begin, j->p0, j->count,
                j->col + begin * taps * j->count * j->s.es);
}

/* The small-plane path: per image, group and band, the columns on the pool
 * (a chunk per run of channels; a pointwise kernel reads the image itself),
 * then one pool-split product. */
static DK_Status conv_whole(const dks_kernel_args *k, conv_job *j, int64_t batch) {
  int64_t es = j->s.es, band = j->direct ? j->out_plane : band_width(j->rows, j->out_plane);
  uint8_t *col = j->direct ? NULL : uncleared_scratch(k, j->rows * band, es);
  if (!j->direct && !col) return DK_RESOURCE_EXHAUSTED;
  conv_job part = *j;
  part.col = col;
  int64_t taps = j->rows / j->cg;
  for (int64_t n = 0; n < batch; n++) {
    for (int64_t g = 0; g < j->s.group; g++) {
      const uint8_t *xg = j->x + (n * j->x_channels + g * j->cg) * j->in_plane * es;
      const uint8_t *wg = j->wt + g * j->mg * j->rows * es;
      uint8_t *yg = j->y + (n * j->y_channels + g * j->mg) * j->out_plane * es;
      for (int64_t p0 = 0; p0 < j->out_plane; p0 += band) {
        part.x = xg, part.p0 = p0;
        part.count = j->out_plane - p0 < band ? j->out_plane - p0 : band;
        if (j->direct) {
          linalg_gemm(j->s.real, false, false, j->mg, part.count, j->cg, 1.0, wg, j->rows, xg, j->in_plane,
                      0.0, yg, j->out_plane);
        } else { /* about 16 Ki column elements per chunk */
          dks_parallel_for(j->cg, linalg_ceil_div(16384, taps * part.count), conv_columns, &part);
          linalg_gemm(j->s.real, false, false, j->mg, part.count, j->rows, 1.0, wg, j->rows, col, part.count,
                      0.0, yg + p0 * es, j->out_plane);
        }
        conv_epilogue_apply(j->ep, yg + p0 * es, g * j->mg, j->mg, part.count, j->out_plane);
      }
    }
  }
  free(col);
  return DK_OK;
}

/* ---- Winograd F(2x2, 3x3) ---------------------------------------------------------- */

/* A float32 2-D 3x3 convolution with unit strides and dilations computes
 * each 2x2 block of outputs (a tile) from the 4x4 input patch under it in a
 * transformed space: Y = A^T [sum over channels of U (.) V] A, with
 * U = G g G^T the filter's and V = B^T d B the patch's transform, so a
 * tile's 36 multiply-adds per channel become 16 -- 16 GEMMs (one per
 * transformed position) of (filters x channels) by (channels x tiles). The
 * transforms add and subtract a few values and halve, so the sums stay
 * within the op's dot-product tolerance (measured: at most 0.4 of it, on
 * same-sign operands with few channels). A non-finite value anywhere spreads
 * across the tile differently than in the direct sum, so a result with any
 * non-finite output is computed again by im2col + GEMM. */
#define WINO_BYTES ((int64_t)1 << 21) /* a chunk's transformed patches */
#define WINO_MIN_CHANNELS 8
/* Fewer tiles make narrow products that pack the transformed filters for
 * little work: a chunk takes at least this many (or the image's). */
#define WINO_MIN_TILES 64
/* An image needs this many tiles: each call transforms the filters again,
 * which the tiles' savings must pay for. On ResNet's 3x3 layers (one
 * thread), a 14x14 plane (49 tiles, 256 channels) measured 1.25x faster
 * than im2col + GEMM, a 7x7 one (16 tiles, 512 channels) 5x slower. */
#define WINO_FIT_TILES 48

typedef struct wino_job {
  conv_split s;
  int64_t batch, cg, mg, x_channels, y_channels;
  int64_t h, wd, oh, ow, pad_h, pad_w, tiles_w, tiles, tblock, tblocks, mblock, mblocks;
  int64_t vstep, mstep; /* floats from one xi's transforms (or sums) to the next's: see WINO_SKEW */
  bool panels; /* the transforms lie in PACKED_PANEL-tile panels, multiplied by packed_gemm_panels */
  const float *x, *b;
  conv_epilogue rest; /* Z and the activation (b is added in the output transform) */
  const float *u; /* [group][16][mg][cg] */
  float *v; /* with runs of filters: the patches' transforms, [images][tblocks][16][cg][tblock]
             * (with panels: [images][tblocks][16][tblock / PACKED_PANEL][cg][PACKED_PANEL]), each
             * xi vstep floats on from the one before; else NULL */
  const float *wt;
  float *y;
  atomic_bool non_finite;
} wino_job;

/* With the filters' transforms prepared and the AVX-512 panel products,
 * planes down to this many tiles: ResNet's 14x14 (49 tiles) and 7x7 (16)
 * 3x3 layers. */
#define WINO_PREPARED_FIT_TILES 16

static bool wino_geometry_fits(const linalg_window *w, DK_DTypeKey dtype, int64_t cg, int64_t mg, int64_t tiles) {
  if (w->n != 2 || dtype != DK_DTYPE_FLOAT32 || cg < WINO_MIN_CHANNELS || mg < WINO_MIN_CHANNELS) return false;
  for (int32_t d = 0; d < 2; d++)
    if (w->kernel[d] != 3 || w->stride[d] != 1 || w->dilation[d] != 1) return false;
  return linalg_ceil_div(w->grid[0], 2) * linalg_ceil_div(w->grid[1], 2) >= tiles;
}

bool linalg_winograd_fits(const linalg_window *w, DK_DTypeKey dtype, int64_t cg, int64_t mg) {
  return wino_geometry_fits(w, dtype, cg, mg, WINO_FIT_TILES);
}

/* The transforms run across WINO_LANES kernels or tiles at a time, staged
 * in small arrays with unit strides: the compiler turns those loops into
 * vector code, which the kernels' stride-9 and stride-2 layouts defeat. */
#define WINO_LANES 8
/* The 16 transforms of a tile lie a power-of-two multiple of 4 KiB apart
 * without this many floats (a cache line) between one xi's and the next's:
 * the transforms' 16 streams then fall into one L1 set and evict each
 * other. */
#define WINO_SKEW 16
#define WINO_RUN 64

/* U = G g G^T: u[xi * step + i] for the 3x3 kernels k[i] (9 apart), i in [0, count). */
DKS_VECTOR_CLONES static void wino_filter_run(const float *k, int64_t count, float *u, int64_t step) {
  for (int64_t i0 = 0; i0 < count; i0 += WINO_LANES) {
    int64_t lanes = count - i0 < WINO_LANES ? count - i0 : WINO_LANES;
    float g[9][WINO_LANES] = {{0}}, t[4][3][WINO_LANES], o[16][WINO_LANES];
    for (int64_t l = 0; l < lanes; l++)
      for (int s = 0; s < 9; s++) g[s][l] = k[9 * (i0 + l) + s];
    for (int s = 0; s < 3; s++)
      for (int l = 0; l < WINO_LANES; l++) {
        t[0][s][l] = g[s][l];
        t[1][s][l] = 0.5f * (g[s][l] + g[3 + s][l] + g[6 + s][l]);
        t[2][s][l] = 0.5f * (g[s][l] - g[3 + s][l] + g[6 + s][l]);
        t[3][s][l] = g[6 + s][l];
      }
    for (int r = 0; r < 4; r++)
      for (int l = 0; l < WINO_LANES; l++) {
        o[4 * r + 0][l] = t[r][0][l];
        o[4 * r + 1][l] = 0.5f * (t[r][0][l] + t[r][1][l] + t[r][2][l]);
        o[4 * r + 2][l] = 0.5f * (t[r][0][l] - t[r][1][l] + t[r][2][l]);
        o[4 * r + 3][l] = t[r][2][l];
      }
    for (int xi = 0; xi < 16; xi++)
      for (int64_t l = 0; l < lanes; l++) u[xi * step + i0 + l] = o[xi][l];
  }
}

/* The transforms of kernels [begin, end) of W (index (g * mg + m) * cg + c),
 * into u[g][xi][m][c]. */
typedef struct wino_filter_job {
  const float *wt;
  float *u;
  int64_t per_group; /* mg * cg */
} wino_filter_job;

static void wino_filters(void *arg, int64_t begin, int64_t end) {
  const wino_filter_job *j = arg;
  while (begin < end) {
    int64_t g = begin / j->per_group, i = begin % j->per_group;
    int64_t count = j->per_group - i < end - begin ? j->per_group - i : end - begin;
    wino_filter_run(j->wt + 9 * begin, count, j->u + g * 16 * j->per_group + i, j->per_group);
    begin += count;
  }
}

void linalg_winograd_filters(const float *wt, int64_t group, int64_t mg, int64_t cg, float *u) {
  wino_filter_job j = {.wt = wt, .u = u, .per_group = mg * cg};
  dks_parallel_for(group * mg * cg, 8192, wino_filters, &j);
}

/* v[xi * step + i] = (B^T d B)[xi] for the 4x4 patches d at p + 2 * i
 * (rows ld apart), i in [0, count): a run of tiles along a row. The row
 * combinations (B^T d) come first, split into even and odd columns, so the
 * column combinations read neighbours with unit strides. */
DKS_VECTOR_CLONES static void wino_input_run(const float *p, int64_t ld, int64_t count, float *v, int64_t step) {
  for (int64_t i0 = 0; i0 < count; i0 += WINO_RUN) {
    int64_t n = count - i0 < WINO_RUN ? count - i0 : WINO_RUN;
    const float *d = p + 2 * i0;
    float ev[4][WINO_RUN + 1], od[4][WINO_RUN + 1];
    for (int64_t x = 0; x <= n; x++) {
      const float *a = d + 2 * x;
      ev[0][x] = a[0] - a[2 * ld];
      ev[1][x] = a[ld] + a[2 * ld];
      ev[2][x] = a[2 * ld] - a[ld];
      ev[3][x] = a[ld] - a[3 * ld];
      od[0][x] = a[1] - a[2 * ld + 1];
      od[1][x] = a[ld + 1] + a[2 * ld + 1];
      od[2][x] = a[2 * ld + 1] - a[ld + 1];
      od[3][x] = a[ld + 1] - a[3 * ld + 1];
    }
    for (int r = 0; r < 4; r++) {
      float *o = v + 4 * r * step + i0;
      for (int64_t i = 0; i < n; i++) {
        o[i] = ev[r][i] - ev[r][i + 1];
        o[step + i] = od[r][i] + ev[r][i + 1];
        o[2 * step + i] = ev[r][i + 1] - od[r][i];
        o[3 * step + i] = od[r][i] - od[r][i + 1];
      }
    }
  }
}

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>

static __mmask16 lanes_below(int64_t n) {
  return n <= 0 ? 0 : n >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << n) - 1);
}

/* wino_input_run for a run of count <= PACKED_PANEL tiles into one panel
 * (v: the first tile's lane), with AVX-512, reading the plane (h x wd) in
 * place: the patches' rows y0.. and columns x0.., with those outside the
 * plane (the padding) zero by masked loads, which read nothing of a masked
 * lane -- no staged copy of the image's edges (its copies and clears took a
 * tenth of ResNet's 56x56 and 28x28 Winograd layers). Each patch row's even
 * and odd columns (and those two further on) are gathered across the 16
 * tiles by two permutes, then the same additions in the same order (the
 * same values, bit for bit) run on whole vectors, stored straight into the
 * panel. */
__attribute__((target("avx512f"))) static void wino_input_panel(const float *plane, int64_t h, int64_t wd,
                                                                 int64_t y0, int64_t x0, int64_t count,
                                                                 float *v, int64_t step) {
  const __m512i even = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
  const __m512i odd = _mm512_setr_epi32(1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31);
  /* the run's columns x0 .. x0 + 2 * count + 1 that lie in the plane: [lo, hi) */
  int64_t lo = x0 > 0 ? x0 : 0, hi = x0 + 2 * count + 2 < wd ? x0 + 2 * count + 2 : wd;
  __mmask16 store = lanes_below(count), in[4];
  for (int q = 0; q < 4; q++) { /* the loads from columns x0 + {0, 16, 2, 18} */
    int64_t first = x0 + (q & 1) * 16 + (q >> 1) * 2;
    in[q] = lanes_below(hi - first) & (__mmask16)~lanes_below(lo - first);
  }
  /* col[r][q]: row r's column 2i + q of tile i, q in 0..3 */
  __m512 col[4][4];
  for (int r = 0; r < 4; r++) {
    bool inside = y0 + r >= 0 && y0 + r < h;
    /* integer arithmetic: the address may lie outside the plane, where no lane is read */
    uintptr_t a = (uintptr_t)plane + (uintptr_t)(((y0 + r) * wd + x0) * (int64_t)sizeof(float));
    __m512 v4[4];
    for (int q = 0; q < 4; q++)
      v4[q] = _mm512_maskz_loadu_ps(inside ? in[q] : 0,
                                    (const float *)(a + (uintptr_t)(((q & 1) * 16 + (q >> 1) * 2) * sizeof(float))));
    col[r][0] = _mm512_permutex2var_ps(v4[0], even, v4[1]);
    col[r][1] = _mm512_permutex2var_ps(v4[0], odd, v4[1]);
    col[r][2] = _mm512_permutex2var_ps(v4[2], even, v4[3]);
    col[r][3] = _mm512_permutex2var_ps(v4[2], odd, v4[3]);
  }
  for (int r = 0; r < 4; r++) {
    __m512 t[4]; /* (B^T d)[r] per column */
    for (int q = 0; q < 4; q++)
      t[q] = r == 0   ? _mm512_sub_ps(col[0][q], col[2][q])
             : r == 1 ? _mm512_add_ps(col[1][q], col[2][q])
             : r == 2 ? _mm512_sub_ps(col[2][q], col[1][q])
                      : _mm512_sub_ps(col[1][q], col[3][q]);
    float *o = v + 4 * r * step;
    _mm512_mask_storeu_ps(o, store, _mm512_sub_ps(t[0], t[2]));
    _mm512_mask_storeu_ps(o + step, store, _mm512_add_ps(t[1], t[2]));
    _mm512_mask_storeu_ps(o + 2 * step, store, _mm512_sub_ps(t[2], t[1]));
    _mm512_mask_storeu_ps(o + 3 * step, store, _mm512_sub_ps(t[1], t[3]));
  }
}
#define WINO_PANEL_INPUTS 1
#endif

/* The transforms of a run of tiles whose patches start at row y0, column
 * x0 of `plane`: read in place when inside it, else from a zero-padded copy
 * of the run's 4 rows. */
static void wino_input_segment(const wino_job *j, const float *plane, int64_t y0, int64_t x0, int64_t run,
                               float *out, int64_t step) {
  float stage[4 * (2 * WINO_RUN + 2)];
  int64_t width = 2 * run + 2;
  if (y0 >= 0 && y0 + 4 <= j->h && x0 >= 0 && x0 + width <= j->wd) {
    wino_input_run(plane + y0 * j->wd + x0, j->wd, run, out, step);
    return;
  }
  int64_t lo, hi;
  linalg_valid_range(x0, 1, width, j->wd, &lo, &hi);
  for (int r = 0; r < 4; r++) {
    float *row = stage + r * width;
    int64_t iy = y0 + r;
    if (iy < 0 || iy >= j->h) {
      memset(row, 0, (size_t)width * sizeof(float));
      continue;
    }
    memset(row, 0, (size_t)lo * sizeof(float));
    memcpy(row + lo, plane + iy * j->wd + x0 + lo, (size_t)(hi - lo) * sizeof(float));
    memset(row + hi, 0, (size_t)(width - hi) * sizeof(float));
  }
  wino_input_run(stage, width, run, out, step);
}

/* Where tile t (of the block) of channel c lies in one xi's transforms. */
static int64_t wino_v_index(const wino_job *j, int64_t c, int64_t t) {
  if (!j->panels) return c * j->tblock + t;
  return (t / PACKED_PANEL * j->cg + c) * PACKED_PANEL + t % PACKED_PANEL;
}

/* v[xi][c][t] = (B^T d B)[xi] for the patches of tiles [t0, t0 + count) of
 * channels [c0, c0 + channels) of the group at xg (v: the block's
 * transforms, vstep floats per xi), in runs along tile rows: the
 * tiles inside the image, and those at its edges (through a zero-padded
 * copy), in up to WINO_RUN at a time (with panels, not across one's edge;
 * a last panel's lanes past `count` are left as they are: the product's
 * loads mask them). */
static void wino_inputs(const wino_job *j, const float *xg, int64_t c0, int64_t channels, int64_t t0,
                        int64_t count, float *v) {
  int64_t step = j->vstep;
#ifdef WINO_PANEL_INPUTS
  if (j->panels) { /* runs cut by tile rows and panels only: the padding is masked */
    for (int64_t c = c0; c < c0 + channels; c++)
      for (int64_t t = 0; t < count;) {
        int64_t ty = (t0 + t) / j->tiles_w, tx = (t0 + t) % j->tiles_w;
        int64_t run = j->tiles_w - tx < count - t ? j->tiles_w - tx : count - t;
        if (run > PACKED_PANEL - t % PACKED_PANEL) run = PACKED_PANEL - t % PACKED_PANEL;
        wino_input_panel(xg + c * j->h * j->wd, j->h, j->wd, 2 * ty - j->pad_h, 2 * tx - j->pad_w, run,
                         v + wino_v_index(j, c, t), step);
        t += run;
      }
    return;
  }
#endif
  /* tiles tx in [inner_lo, inner_hi) of a row have patches inside the columns */
  int64_t inner_lo = linalg_ceil_div(j->pad_w, 2), inner_hi = (j->wd - 4 + j->pad_w) / 2 + 1;
  if (j->wd < 4 || inner_hi < inner_lo) inner_lo = inner_hi = 0;
  for (int64_t c = c0; c < c0 + channels; c++) {
    const float *plane = xg + c * j->h * j->wd;
    for (int64_t t = 0; t < count;) {
      int64_t ty = (t0 + t) / j->tiles_w, tx = (t0 + t) % j->tiles_w;
      int64_t run = j->tiles_w - tx < count - t ? j->tiles_w - tx : count - t;
      if (tx < inner_lo) {
        if (run > inner_lo - tx) run = inner_lo - tx;
      } else if (tx < inner_hi && run > inner_hi - tx) {
        run = inner_hi - tx;
      }
      if (run > WINO_RUN) run = WINO_RUN;
      wino_input_segment(j, plane, 2 * ty - j->pad_h, 2 * tx - j->pad_w, run, v + wino_v_index(j, c, t), step);
      t += run;
    }
  }
}

/* o[r * ld + 2 * i + c] = (A^T m A)[r][c] + add for the transformed sums m
 * at p[xi * step + i], i in [0, count): a run of whole 2x2 output tiles
 * (count <= WINO_RUN). Returns whether every output is finite. */
DKS_VECTOR_CLONES static bool wino_output_run(const float *p, int64_t step, int64_t count, float add, float *o,
                                             int64_t ld) {
  float out[2][2][WINO_RUN];
  for (int64_t i = 0; i < count; i++) {
    float s[2][4];
    for (int c = 0; c < 4; c++) {
      s[0][c] = p[c * step + i] + p[(4 + c) * step + i] + p[(8 + c) * step + i];
      s[1][c] = p[(4 + c) * step + i] - p[(8 + c) * step + i] - p[(12 + c) * step + i];
    }
    for (int r = 0; r < 2; r++) {
      out[r][0][i] = s[r][0] + s[r][1] + s[r][2] + add;
      out[r][1][i] = s[r][1] - s[r][2] - s[r][3] + add;
    }
  }
  /* finite: the exponent bits are not all set (an integer OR vectorises) */
  uint32_t bad = 0;
  for (int r = 0; r < 2; r++)
    for (int64_t i = 0; i < count; i++) {
      uint32_t b0, b1;
      memcpy(&b0, &out[r][0][i], sizeof b0);
      memcpy(&b1, &out[r][1][i], sizeof b1);
      bad |= ((b0 & 0x7f800000u) == 0x7f800000u) | ((b1 & 0x7f800000u) == 0x7f800000u);
      o[r * ld + 2 * i] = out[r][0][i];
      o[r * ld + 2 * i + 1] = out[r][1][i];
    }
  return !bad;
}

#ifdef WINO_PANEL_INPUTS
/* wino_output_run for count <= 16 tiles with AVX-512: the same additions in
 * the same order on vectors of 16 tiles, each row's two outputs per tile
 * interleaved by two permutes into 2 * count consecutive floats (the
 * compiler's clone of wino_output_run stored them one by one: a tenth of
 * ResNet's 56x56 Winograd layers). */
__attribute__((target("avx512f"))) static bool wino_output_panel(const float *p, int64_t step, int64_t count,
                                                                 float add, float *o, int64_t ld) {
  const __m512i first = _mm512_setr_epi32(0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23);
  const __m512i second = _mm512_setr_epi32(8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31);
  const __m512i exponent = _mm512_set1_epi32(0x7f800000);
  __mmask16 lanes = lanes_below(count), bad = 0;
  __m512 m[16], s[2][4], bias = _mm512_set1_ps(add);
  for (int xi = 0; xi < 16; xi++) m[xi] = _mm512_maskz_loadu_ps(lanes, p + xi * step);
  for (int c = 0; c < 4; c++) {
    s[0][c] = _mm512_add_ps(_mm512_add_ps(m[c], m[4 + c]), m[8 + c]);
    s[1][c] = _mm512_sub_ps(_mm512_sub_ps(m[4 + c], m[8 + c]), m[12 + c]);
  }
  for (int r = 0; r < 2; r++) {
    __m512 left = _mm512_add_ps(_mm512_add_ps(_mm512_add_ps(s[r][0], s[r][1]), s[r][2]), bias);
    __m512 right = _mm512_add_ps(_mm512_sub_ps(_mm512_sub_ps(s[r][1], s[r][2]), s[r][3]), bias);
    bad |= _mm512_cmpeq_epi32_mask(_mm512_and_si512(_mm512_castps_si512(left), exponent), exponent);
    bad |= _mm512_cmpeq_epi32_mask(_mm512_and_si512(_mm512_castps_si512(right), exponent), exponent);
    _mm512_mask_storeu_ps(o + r * ld, lanes_below(2 * count), _mm512_permutex2var_ps(left, first, right));
    _mm512_mask_storeu_ps(o + r * ld + 16, lanes_below(2 * count - 16),
                          _mm512_permutex2var_ps(left, second, right));
  }
  return !(bad & lanes);
}
#endif

/* y (filters m0.., tiles t0..) = A^T mx A (+ bias); false if any output is
 * not finite. mx is [16][mb][tblock], mstep floats per xi; tiles cut by the plane's last row or
 * column go through a 2x2 buffer. */
static bool wino_outputs(const wino_job *j, const float *mx, int64_t mb, int64_t t0, int64_t count,
                         const float *bias, float *yg) {
  bool finite = true;
  int64_t step = j->mstep, whole_w = j->ow / 2;
  for (int64_t m = 0; m < mb; m++) {
    float add = bias ? bias[m] : 0.0f, *plane = yg + m * j->oh * j->ow;
    for (int64_t t = 0; t < count;) {
      int64_t ty = (t0 + t) / j->tiles_w, tx = (t0 + t) % j->tiles_w;
      const float *p = mx + m * j->tblock + t;
      float *o = plane + 2 * ty * j->ow + 2 * tx;
      int64_t run = whole_w - tx;
      if (run > count - t) run = count - t;
      if (run > WINO_RUN) run = WINO_RUN;
      if (2 * ty + 2 <= j->oh && run > 0) {
#ifdef WINO_PANEL_INPUTS
        if (j->panels) {
          if (run > 16) run = 16;
          finite = wino_output_panel(p, step, run, add, o, j->ow) && finite;
          t += run;
          continue;
        }
#endif
        finite = wino_output_run(p, step, run, add, o, j->ow) && finite;
        t += run;
        continue;
      }
      float part[4];
      wino_output_run(p, step, 1, add, part, 2);
      for (int r = 0; r < 2 && 2 * ty + r < j->oh; r++)
        for (int c = 0; c < 2 && 2 * tx + c < j->ow; c++) {
          o[r * j->ow + c] = part[2 * r + c];
          finite = finite && isfinite(part[2 * r + c]);
        }
      t++;
    }
  }
  return finite;
}

static int64_t wino_count(int64_t total, int64_t first, int64_t block) {
  return total - first < block ? total - first : block;
}

/* The shared patch transforms: items (image, tile block, channel). */
static void wino_shared_inputs(void *arg, int64_t begin, int64_t end) {
  wino_job *j = arg;
  while (begin < end) {
    int64_t b = begin / j->cg, c0 = begin % j->cg, channels = wino_count(j->cg, c0, end - begin);
    int64_t ng = b / j->tblocks, n = ng / j->s.group, g = ng % j->s.group, t0 = b % j->tblocks * j->tblock;
    wino_inputs(j, j->x + (n * j->x_channels + g * j->cg) * j->h * j->wd, c0, channels, t0,
                wino_count(j->tiles, t0, j->tblock), j->v + b * 16 * j->vstep);
    begin += channels;
  }
}

static void wino_part(void *arg, int64_t begin, int64_t end) {
  wino_job *j = arg;
  int64_t patches = j->v ? 0 : 16 * j->vstep;
  float *own = chunk_scratch(&j->s, patches + 16 * j->mstep);
  if (!own) return;
  float *mx = own + patches;
  for (int64_t i = begin; i < end; i++) {
    int64_t mi = i % j->mblocks, b = i / j->mblocks, ti = b % j->tblocks, ng = b / j->tblocks;
    int64_t n = ng / j->s.group, g = ng % j->s.group;
    int64_t t0 = ti * j->tblock, count = wino_count(j->tiles, t0, j->tblock);
    int64_t m0 = mi * j->mblock, mb = wino_count(j->mg, m0, j->mblock);
    float *v = own;
    if (j->v)
      v = j->v + b * 16 * j->vstep;
    else
      wino_inputs(j, j->x + (n * j->x_channels + g * j->cg) * j->h * j->wd, 0, j->cg, t0, count, v);
    for (int xi = 0; xi < 16; xi++) {
      const float *u = j->u + ((g * 16 + xi) * j->mg + m0) * j->cg;
      if (j->panels)
        packed_gemm_panels(mb, count, j->cg, u, j->cg, v + xi * j->vstep, mx + xi * j->mstep, j->tblock);
      else
        linalg_gemm(LINALG_F32, false, false, mb, count, j->cg, 1.0, u, j->cg, v + xi * j->vstep, j->tblock, 0.0,
                    mx + xi * j->mstep, j->tblock);
    }
    float *yg = j->y + (n * j->y_channels + g * j->mg + m0) * j->oh * j->ow;
    if (!wino_outputs(j, mx, mb, t0, count, j->b ? j->b + g * j->mg + m0 : NULL, yg))
      atomic_store(&j->non_finite, true);
    /* the rest of the epilogue, per filter on the block's output rows: whole tile rows are one run of y */
    for (int64_t t = t0, end = t0 + count; t < end;) {
      int64_t tx = t % j->tiles_w, oy = 2 * (t / j->tiles_w);
      int64_t tiles = tx == 0 && end - t >= j->tiles_w ? (end - t) / j->tiles_w * j->tiles_w
                                                       : wino_count(j->tiles_w, tx, end - t);
      int64_t rows = 2 * linalg_ceil_div(tiles, j->tiles_w), x0 = 2 * tx;
      int64_t cols = x0 + 2 * tiles < j->ow ? 2 * tiles : j->ow - x0;
      if (oy + rows > j->oh) rows = j->oh - oy;
      for (int64_t m = 0; m < mb; m++) {
        float *first = yg + (m * j->oh + oy) * j->ow + x0;
        if (cols == j->ow)
          conv_epilogue_apply(&j->rest, first, g * j->mg + m0 + m, 1, rows * cols, cols);
        else
          for (int64_t r = 0; r < rows; r++)
            conv_epilogue_apply(&j->rest, first + r * j->ow, g * j->mg + m0 + m, 1, cols, j->ow);
      }
      t += tiles;
    }
  }
  free(own);
}

DK_Status linalg_conv_winograd(const dks_kernel_args *k, const dks_tensor *x, const dks_tensor *wt,
                               const float *u, const dks_tensor *b, const dks_tensor *y, const linalg_window *w,
                               int64_t group, bool *redo) {
  wino_job j = {.s = {.real = LINALG_F32, .w = w, .es = sizeof(float), .group = group},
                .batch = x->shape[0], .cg = x->shape[1] / group, .mg = y->shape[1] / group,
                .x_channels = x->shape[1], .y_channels = y->shape[1], .h = w->target[0], .wd = w->target[1],
                .oh = w->grid[0], .ow = w->grid[1], .pad_h = w->pad[0], .pad_w = w->pad[1],
                .x = (const float *)x->data, .b = b ? (const float *)b->data : NULL,
                .wt = (const float *)wt->data, .y = (float *)y->data};
  atomic_init(&j.s.failed, false);
  atomic_init(&j.non_finite, false);
  j.rest = conv_epilogue_without_bias(k);
  j.tiles_w = linalg_ceil_div(j.ow, 2);
  j.tiles = linalg_ceil_div(j.oh, 2) * j.tiles_w;
  /* Blocks of tiles whose transforms fit WINO_BYTES; with few, more blocks
   * (of at least 64 tiles) and then runs of filters, for a few chunks per thread. */
  int64_t threads = dks_thread_count(), images = j.batch * group;
  int64_t tblock = WINO_BYTES / (16 * j.cg * (int64_t)sizeof(float));
  if (tblock < WINO_MIN_TILES) tblock = WINO_MIN_TILES;
  j.tblocks = linalg_ceil_div(j.tiles, tblock);
  j.mblocks = 1;
  if (threads > 1 && images * j.tblocks < 4 * threads) {
    int64_t most = linalg_ceil_div(j.tiles, WINO_MIN_TILES) > j.tblocks ? linalg_ceil_div(j.tiles, WINO_MIN_TILES) : j.tblocks;
    j.tblocks = linalg_ceil_div(4 * threads, images) < most ? linalg_ceil_div(4 * threads, images) : most;
    if (images * j.tblocks < 2 * threads) {
      int64_t runs = linalg_ceil_div(2 * threads, images * j.tblocks), most_runs = linalg_ceil_div(j.mg, 32);
      j.mblocks = runs < most_runs ? runs : most_runs;
    }
  }
  j.tblock = linalg_ceil_div(j.tiles, j.tblocks);
  j.panels = packed_block_avx512();
  if (j.panels) j.tblock = linalg_ceil_div(j.tblock, PACKED_PANEL) * PACKED_PANEL;
  j.tblocks = linalg_ceil_div(j.tiles, j.tblock);
  j.mblock = linalg_ceil_div(j.mg, j.mblocks);
  j.mblocks = linalg_ceil_div(j.mg, j.mblock);
  j.vstep = j.cg * j.tblock + WINO_SKEW;
  j.mstep = j.mblock * j.tblock + WINO_SKEW;
  float *own_u = u ? NULL : uncleared_scratch(k, group * 16 * j.mg * j.cg, sizeof(float));
  if (!u && !own_u) return DK_RESOURCE_EXHAUSTED;
  if (own_u) linalg_winograd_filters(j.wt, group, j.mg, j.cg, own_u);
  j.u = u ? u : own_u;
  /* Runs of filters of one tile block would each transform its patches
   * again: they share one transform, made first (about 4 Ki tile-channels a chunk). */
  if (j.mblocks > 1) {
    j.v = uncleared_scratch(k, images * j.tblocks * 16 * j.vstep, sizeof(float));
    if (!j.v) {
      free(own_u);
      return DK_RESOURCE_EXHAUSTED;
    }
    dks_parallel_for(images * j.tblocks * j.cg, linalg_ceil_div(4096, j.tblock), wino_shared_inputs, &j);
  }
  dks_parallel_for(images * j.tblocks * j.mblocks, 1, wino_part, &j);
  free(own_u);
  free(j.v);
  *redo = atomic_load(&j.non_finite);
  return split_status(k, &j.s);
}

/* ---- Register-blocked direct Conv (x86-64 with AVX2 and FMA) ----------------------- */

/* A float32 2-D Conv with unit dilations on a small plane with many
 * channels (ResNet's 14x14 and 7x7 3x3 layers, and with AVX-512 its
 * stride-2 3x3 ones onto 14x14 and 7x7), summed over (channel, tap) by an
 * AVX2 register block of PACKED_MB output channels by PACKED_NV output
 * positions (12 accumulators of 8 lanes; with AVX-512, 6 of 16), each
 * weight broadcast from W's rows as stored: no im2col, and no GEMM packing, which reads and writes every
 * weight on each call (2.4 MB on the 256-channel layers), nor Winograd's
 * filter transforms, which on a 49-tile plane cost about what they save.
 * The input is first copied into one shift plane per kernel column kx and
 * row phase ry (strides sh, sw):
 *   s[c][ry][kx][r][ox] = padded x[c][r * sh + ry][ox * sw + kx],
 * so tap (ky, kx) of output position p = oy * ow + ox reads element
 * p + (ky / sh) * ow of shift plane (ky % sh, kx): consecutive positions
 * read consecutive elements, across rows too, and only the plane's last
 * block computes lanes it drops. From the shift planes, each block's inputs
 * are copied into a panel, one row of PACKED_NV per step, which the filter
 * blocks then read in order; a plane's last few positions (PACKED_DOT_COLS
 * or fewer: 1 of 49, 4 of 196) are instead dot products along the steps.
 * Each sum runs in (channel, tap) order with
 * fused multiply-adds, as the BLAS products of the other paths do here,
 * within the op's dot-product tolerance; a non-finite value reaches the
 * outputs whose windows hold it, as there (0 * inf in the padding is NaN). */
#define PACKED_MB 6
#define PACKED_NV 16
/* A plane's last block of at most this many positions goes by dot products (packed_dot). */
#define PACKED_DOT_COLS 4
/* k = (channel, tap) steps per pass (at most; the passes are of even
 * length): a filter block keeps its weights for the pass (PACKED_MB rows
 * of 256, 6 KB) in L1 while it runs over the item's panels (ResNet's 14x14
 * layer, one thread, on a loaded machine, when the blocks of positions ran
 * over the filter blocks instead: 256 steps about 5% faster than 128, 512
 * and 1024 within the noise of it, the whole 2304 about 15% slower; with
 * the panels, 256 and 1024 within 4% on the 14x14 and 7x7 layers). */
#define PACKED_KC 256
/* A run of filter blocks per item and blocks of positions whose outputs
 * stay in L2 across the passes. */
#define PACKED_RUN_BLOCKS 16
#define PACKED_OUT_BYTES ((int64_t)64 << 10)
/* What goes this way: unit strides (and, but for 1x1 kernels, other
 * strides where the CPU has AVX-512), output positions in this range, at
 * least this many (channel, tap) steps and filters per group. Measured per
 * layer against the paths they would take (a loaded 2-core Zen 4, so
 * within about 10%): ResNet's 14x14 3x3 0.85x Winograd's time on one
 * thread and on two (0.82-0.87x more with the panels); its 7x7 3x3 (49
 * positions) 0.79x im2col + GEMM's with the panels and the last
 * position's dot products (1.0-1.13x before them: its last block spent an
 * 8-wide vector per filter and step on one position); its 28x28 and 56x56
 * 3x3 1.3-1.45x Winograd's, the stride-2 3x3 and 1x1 1.1-1.2x im2col +
 * GEMM's, the 7x7/2 stem 1.05x, all on one. With the AVX-512 block (a Zen
 * 4, one and two threads), the stride-2 3x3 on 14x14 outputs 0.93x im2col +
 * GEMM's time (whose product there is OpenBLAS's AVX-512 kernel), on 7x7
 * 0.82-0.84x, but on 28x28 1.02x and the stem 1.05-1.09x: those stay out,
 * by the positions' bound, and the AVX2 block's strided planes measured no
 * gain (0.9-1.1x). */
#define PACKED_MIN_POSITIONS 49
/* 1x1 kernels keep the bounds they were measured with (unit strides, 100
 * positions or more); their own paths are tuned apart. */
#define PACKED_MIN_POSITIONS_1X1 100
#define PACKED_MAX_POSITIONS 256
#define PACKED_MIN_STEPS 256
#define PACKED_MIN_FILTERS 32

typedef struct packed_job {
  int64_t cg, mg, x_channels, y_channels, h, wd, oh, ow, sh, sw, pad_h, pad_w, kw;
  int64_t rows, shifts, plane; /* a shift plane's rows; planes per channel; floats per plane, with slack */
  int64_t k, pass, positions, pblock, pblocks, mrun, mruns;
  const float *x, *wt;
  const conv_epilogue *ep; /* B, Z and the activation */
  float *y;
  float *xs;       /* one image's shift planes, [channel][shift][plane] */
  int64_t *offset; /* per step k = c * taps + t: its element's offset from position 0 of the group's planes */
  int64_t nblocks; /* blocks of PACKED_NV positions per plane */
  float *panels;   /* per group and block, its panel over all k steps: [group][block][k][PACKED_NV] */
} packed_job;

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)

/* c[i][q] (+)= sum over k < count of w[i * ldw + k] * x[k * PACKED_NV + q],
 * rows i < PACKED_MB (rows past `rows` repeat the last and are not stored),
 * positions q < 8 * VECS. */
#define PACKED_KERNEL(NAME, VECS)                                                                     \
  __attribute__((target("avx2,fma"))) static void NAME(const float *x, int64_t count, const float *w,  \
                                                       int64_t ldw,                                   \
                                                       int64_t rows, float *c, int64_t ldc,           \
                                                       bool accumulate) {                             \
    const float *wr[PACKED_MB];                                                                       \
    for (int i = 0; i < PACKED_MB; i++) wr[i] = w + (i < rows ? i : rows - 1) * ldw;                  \
    __m256 acc[PACKED_MB][VECS];                                                                      \
    _Pragma("GCC unroll 6") for (int i = 0; i < PACKED_MB; i++)                                       \
      _Pragma("GCC unroll 2") for (int v = 0; v < VECS; v++)                                          \
        acc[i][v] = accumulate && i < rows ? _mm256_loadu_ps(c + i * ldc + 8 * v) : _mm256_setzero_ps(); \
    for (int64_t k = 0; k < count; k++) {                                                             \
      const float *xk = x + k * PACKED_NV;                                                            \
      __m256 in[VECS];                                                                                \
      _Pragma("GCC unroll 2") for (int v = 0; v < VECS; v++) in[v] = _mm256_loadu_ps(xk + 8 * v);    \
      _Pragma("GCC unroll 6") for (int i = 0; i < PACKED_MB; i++) {                                   \
        __m256 weight = _mm256_broadcast_ss(wr[i] + k);                                               \
        _Pragma("GCC unroll 2") for (int v = 0; v < VECS; v++)                                        \
          acc[i][v] = _mm256_fmadd_ps(weight, in[v], acc[i][v]);                                      \
      }                                                                                               \
    }                                                                                                 \
    _Pragma("GCC unroll 6") for (int i = 0; i < PACKED_MB; i++)                                       \
      if (i < rows)                                                                                   \
        _Pragma("GCC unroll 2") for (int v = 0; v < VECS; v++)                                        \
          _mm256_storeu_ps(c + i * ldc + 8 * v, acc[i][v]);                                           \
  }
PACKED_KERNEL(packed_block_16_avx2, 2)
PACKED_KERNEL(packed_block_8, 1)

/* packed_block_16 where the CPU has AVX-512: one 16-lane vector per filter,
 * its weight broadcast from memory by the multiply-add itself: the same
 * fused multiply-adds in the same order (the same sums, bit for bit) in
 * half the instructions (on a Zen 4, whose 512-bit FMAs are two 256-bit
 * halves: ResNet's 14x14 and 7x7 layers 0.86-0.88x the AVX2 block's time). */
__attribute__((target("avx512f"))) static void packed_block_16_avx512(const float *x, int64_t count,
                                                                      const float *w, int64_t ldw, int64_t rows,
                                                                      float *c, int64_t ldc, bool accumulate) {
  const float *wr[PACKED_MB];
  for (int i = 0; i < PACKED_MB; i++) wr[i] = w + (i < rows ? i : rows - 1) * ldw;
  __m512 acc[PACKED_MB];
  _Pragma("GCC unroll 6") for (int i = 0; i < PACKED_MB; i++)
    acc[i] = accumulate && i < rows ? _mm512_loadu_ps(c + i * ldc) : _mm512_setzero_ps();
  for (int64_t k = 0; k < count; k++) {
    __m512 in = _mm512_loadu_ps(x + k * PACKED_NV);
    _Pragma("GCC unroll 6") for (int i = 0; i < PACKED_MB; i++)
      acc[i] = _mm512_fmadd_ps(_mm512_set1_ps(wr[i][k]), in, acc[i]);
  }
  _Pragma("GCC unroll 6") for (int i = 0; i < PACKED_MB; i++)
    if (i < rows) _mm512_storeu_ps(c + i * ldc, acc[i]);
}

static void packed_block_16(const float *x, int64_t count, const float *w, int64_t ldw, int64_t rows, float *c,
                            int64_t ldc, bool accumulate) {
  if (__builtin_cpu_supports("avx512f"))
    packed_block_16_avx512(x, count, w, ldw, rows, c, ldc, accumulate);
  else
    packed_block_16_avx2(x, count, w, ldw, rows, c, ldc, accumulate);
}

/* c[i * ldc + q] (+)= sum over k < count of w[i * ldw + k] * col[q * ldcol + k]
 * for rows i < rows (<= PACKED_MB) and positions q < cols (<= 2): a plane's
 * last few positions (ResNet's 7x7 planes: 1 of 49), as dot products along
 * the steps, PACKED_MB x 2 sums of 8 lanes: the 8-wide block would spend a
 * vector per filter and step on one position. */
__attribute__((target("avx2,fma"))) static void packed_dot(const float *col, int64_t ldcol, int64_t count,
                                                           const float *w, int64_t ldw, int64_t rows, int64_t cols,
                                                           float *c, int64_t ldc, bool accumulate) {
  const float *wr[PACKED_MB], *xr[2] = {col, col + (cols > 1) * ldcol};
  for (int i = 0; i < PACKED_MB; i++) wr[i] = w + (i < rows ? i : rows - 1) * ldw;
  __m256 acc[PACKED_MB][2];
  for (int i = 0; i < PACKED_MB; i++) acc[i][0] = acc[i][1] = _mm256_setzero_ps();
  int64_t k = 0;
  for (; k + 8 <= count; k += 8) {
    __m256 in[2] = {_mm256_loadu_ps(xr[0] + k), _mm256_loadu_ps(xr[1] + k)};
    _Pragma("GCC unroll 6") for (int i = 0; i < PACKED_MB; i++) {
      __m256 weight = _mm256_loadu_ps(wr[i] + k);
      acc[i][0] = _mm256_fmadd_ps(weight, in[0], acc[i][0]);
      acc[i][1] = _mm256_fmadd_ps(weight, in[1], acc[i][1]);
    }
  }
  for (int64_t i = 0; i < rows; i++)
    for (int64_t q = 0; q < cols; q++) {
      float lanes[8], sum = accumulate ? c[i * ldc + q] : 0.0f, part = 0.0f;
      _mm256_storeu_ps(lanes, acc[i][q]);
      for (int l = 0; l < 8; l++) part += lanes[l];
      for (int64_t t = k; t < count; t++) part += wr[i][t] * xr[q][t];
      c[i * ldc + q] = sum + part;
    }
}

static bool packed_supported(void) { return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"); }
#else
/* Never called: packed_supported() keeps every Conv off this path. */
static void packed_block_16(const float *x, int64_t count, const float *w, int64_t ldw, int64_t rows, float *c,
                            int64_t ldc, bool accumulate) {
  (void)x, (void)count, (void)w, (void)ldw, (void)rows, (void)c, (void)ldc, (void)accumulate;
}
#define packed_block_8 packed_block_16
static void packed_dot(const float *col, int64_t ldcol, int64_t count, const float *w, int64_t ldw, int64_t rows,
                       int64_t cols, float *c, int64_t ldc, bool accumulate) {
  (void)col, (void)ldcol, (void)count, (void)w, (void)ldw, (void)rows, (void)cols, (void)c, (void)ldc, (void)accumulate;
}
static bool packed_supported(void) { return false; }
#endif

static bool packed_fits(const linalg_window *w, DK_DTypeKey dtype, int64_t cg, int64_t mg) {
  if (w->n != 2 || dtype != DK_DTYPE_FLOAT32 || !packed_supported()) return false;
  bool strided = w->stride[0] != 1 || w->stride[1] != 1, one_tap = w->kernel[0] * w->kernel[1] == 1;
  if (w->dilation[0] != 1 || w->dilation[1] != 1) return false;
  if (strided && (one_tap || !__builtin_cpu_supports("avx512f"))) return false;
  int64_t positions = w->grid[0] * w->grid[1];
  return positions >= (one_tap ? PACKED_MIN_POSITIONS_1X1 : PACKED_MIN_POSITIONS) &&
         positions <= PACKED_MAX_POSITIONS && cg * w->kernel[0] * w->kernel[1] >= PACKED_MIN_STEPS &&
         mg >= PACKED_MIN_FILTERS;
}

/* The shift planes of channels [begin, end) of the image at j->x. */
static void packed_shift_planes(void *arg, int64_t begin, int64_t end) {
  packed_job *j = arg;
  for (int64_t c = begin; c < end; c++)
    for (int64_t s = 0; s < j->shifts; s++) {
      int64_t ry = s / j->kw, kx = s % j->kw;
      float *out = j->xs + (c * j->shifts + s) * j->plane;
      for (int64_t r = 0; r < j->rows; r++, out += j->ow)
        linalg_padded_row(out, j->x + c * j->h * j->wd, j->h, j->wd, r * j->sh + ry - j->pad_h, kx - j->pad_w,
                          j->sw, j->ow);
      memset(out, 0, (size_t)(j->plane - j->rows * j->ow) * sizeof *out); /* the slack the last block reads */
    }
}

/* The panels of blocks [begin, end) (over groups and blocks): panel[k][q]
 * = the group's shift-plane element of step k under position p + q, for
 * the block's PACKED_NV positions from p: its inputs in the order the
 * kernel reads them, one 64-byte row per step. Read in place, a step's 16
 * floats lie in its own shift plane and row, and the kernel's loads cross
 * cache lines and wait on L2 (on the 14x14 layer: 0.82-0.87x the time with
 * the panels). Lanes past the plane read its zeroed slack. The plane's last
 * block, of PACKED_DOT_COLS positions or fewer, holds their columns
 * instead, col[q][k] (what packed_dot reads). Made once per image, before
 * the items, which share them. */
static void packed_make_panels(void *arg, int64_t begin, int64_t end) {
  packed_job *j = arg;
  for (int64_t i = begin; i < end; i++) {
    int64_t g = i / j->nblocks, p = i % j->nblocks * PACKED_NV, cols = j->positions - p;
    const float *xg = j->xs + g * j->cg * j->shifts * j->plane + p;
    float *panel = j->panels + i * j->k * PACKED_NV;
    if (cols > PACKED_DOT_COLS)
      for (int64_t k = 0; k < j->k; k++) memcpy(panel + k * PACKED_NV, xg + j->offset[k], PACKED_NV * sizeof(float));
    else
      for (int64_t q = 0; q < cols; q++)
        for (int64_t k = 0; k < j->k; k++) panel[q * j->k + k] = xg[j->offset[k] + q];
  }
}

/* out (rows x cols, ld apart) (+)= the block of filters wm over steps [k0,
 * k0 + count) of the panel: whole blocks in place, the plane's last one
 * through a buffer that drops its lanes past the plane, or by dot products. */
static void packed_block(const packed_job *j, const float *panel, int64_t cols, int64_t k0, int64_t count,
                         const float *wm, int64_t rows, float *out) {
  if (cols <= PACKED_DOT_COLS) {
    for (int64_t q = 0; q < cols; q += 2)
      packed_dot(panel + q * j->k + k0, j->k, count, wm, j->k, rows, cols - q < 2 ? cols - q : 2, out + q,
                 j->positions, k0 > 0);
    return;
  }
  panel += k0 * PACKED_NV;
  if (cols == PACKED_NV) {
    packed_block_16(panel, count, wm, j->k, rows, out, j->positions, k0 > 0);
    return;
  }
  float part[PACKED_MB * PACKED_NV];
  for (int64_t r = 0; k0 > 0 && r < rows; r++)
    memcpy(part + r * PACKED_NV, out + r * j->positions, (size_t)cols * sizeof(float));
  (cols <= 8 ? packed_block_8 : packed_block_16)(panel, count, wm, j->k, rows, part, PACKED_NV, k0 > 0);
  for (int64_t r = 0; r < rows; r++)
    memcpy(out + r * j->positions, part + r * PACKED_NV, (size_t)cols * sizeof(float));
}

/* Items [begin, end) of one image: (group, run of filters, run of blocks of
 * positions), summed in passes of PACKED_KC steps, then its epilogue (B, Z,
 * the activation). Per pass each filter block runs over all of the item's
 * blocks of positions, its weights for the pass (6 KB) staying in L1
 * (ResNet's stem, 37 KB of weights, 0.95x the time of the position-outer
 * order; its 7x7 layer 0.97x). */
static void packed_parts(void *arg, int64_t begin, int64_t end) {
  packed_job *j = arg;
  for (int64_t i = begin; i < end; i++) {
    int64_t pi = i % j->pblocks, mi = i / j->pblocks % j->mruns, g = i / j->pblocks / j->mruns;
    int64_t p0 = pi * j->pblock, p1 = p0 + j->pblock < j->positions ? p0 + j->pblock : j->positions;
    int64_t m0 = mi * j->mrun, m1 = m0 + j->mrun < j->mg ? m0 + j->mrun : j->mg;
    const float *wg = j->wt + g * j->mg * j->k, *panels = j->panels + g * j->nblocks * j->k * PACKED_NV;
    float *yg = j->y + g * j->mg * j->positions;
    for (int64_t k0 = 0; k0 < j->k; k0 += j->pass) {
      int64_t count = j->k - k0 < j->pass ? j->k - k0 : j->pass;
      for (int64_t m = m0; m < m1; m += PACKED_MB)
        for (int64_t p = p0; p < p1; p += PACKED_NV)
          packed_block(j, panels + p * j->k, p1 - p < PACKED_NV ? p1 - p : PACKED_NV, k0, count,
                       wg + m * j->k + k0, m1 - m < PACKED_MB ? m1 - m : PACKED_MB, yg + m * j->positions + p);
    }
    conv_epilogue_apply(j->ep, yg + m0 * j->positions + p0, g * j->mg + m0, m1 - m0, p1 - p0, j->positions);
  }
}

static DK_Status conv_packed(const dks_kernel_args *k, const dks_tensor *x, const dks_tensor *wt,
                             const conv_epilogue *ep, const dks_tensor *y, const linalg_window *w, int64_t group) {
  packed_job j = {.cg = x->shape[1] / group, .mg = y->shape[1] / group, .x_channels = x->shape[1],
                  .y_channels = y->shape[1], .h = w->target[0], .wd = w->target[1], .oh = w->grid[0],
                  .ow = w->grid[1], .sh = w->stride[0], .sw = w->stride[1], .pad_h = w->pad[0], .pad_w = w->pad[1],
                  .kw = w->kernel[1], .wt = (const float *)wt->data, .ep = ep};
  int64_t kh = w->kernel[0], taps = kh * j.kw, phases = j.sh < kh ? j.sh : kh;
  j.rows = j.oh + (kh - 1) / j.sh;
  j.shifts = phases * j.kw;
  j.plane = j.rows * j.ow + PACKED_NV;
  j.k = j.cg * taps;
  j.pass = linalg_ceil_div(j.k, linalg_ceil_div(j.k, PACKED_KC)); /* passes of even length */
  j.positions = j.oh * j.ow;
  int64_t mblocks = linalg_ceil_div(j.mg, PACKED_MB), runs = linalg_ceil_div(mblocks, PACKED_RUN_BLOCKS);
  int64_t pblock = PACKED_OUT_BYTES / (linalg_ceil_div(mblocks, runs) * PACKED_MB * (int64_t)sizeof(float));
  j.pblocks = linalg_ceil_div(j.positions, pblock > PACKED_NV ? pblock : PACKED_NV);
  j.pblock = linalg_ceil_div(linalg_ceil_div(j.positions, j.pblocks), PACKED_NV) * PACKED_NV;
  j.pblocks = linalg_ceil_div(j.positions, j.pblock);
  /* with few items, shorter runs: a few items per thread, for the pool's
   * dynamic split to even out (ResNet's 14x14 and 7x7 layers: 8, not 6) */
  int64_t threads = dks_thread_count(), items = group * runs * j.pblocks;
  if (threads > 1 && items < 4 * threads) runs = linalg_ceil_div(4 * threads, group * j.pblocks);
  if (runs > mblocks) runs = mblocks;
  j.mrun = linalg_ceil_div(mblocks, runs) * PACKED_MB;
  j.mruns = linalg_ceil_div(j.mg, j.mrun);
  j.nblocks = linalg_ceil_div(j.positions, PACKED_NV);
  j.xs = uncleared_scratch(k, j.x_channels * j.shifts * j.plane, sizeof(float));
  j.offset = j.xs ? uncleared_scratch(k, j.k, sizeof(int64_t)) : NULL;
  j.panels = j.offset ? uncleared_scratch(k, group * j.nblocks * j.k * PACKED_NV, sizeof(float)) : NULL;
  if (!j.panels) {
    free(j.xs);
    free(j.offset);
    return DK_RESOURCE_EXHAUSTED;
  }
  for (int64_t c = 0, i = 0; c < j.cg; c++)
    for (int64_t t = 0; t < taps; t++, i++) {
      int64_t ky = t / j.kw, kx = t % j.kw;
      j.offset[i] = (c * j.shifts + ky % j.sh * j.kw + kx) * j.plane + ky / j.sh * j.ow;
    }
  for (int64_t n = 0; n < x->shape[0]; n++) { /* about 16 Ki shift-plane elements per chunk */
    j.x = (const float *)x->data + n * j.x_channels * j.h * j.wd;
    j.y = (float *)y->data + n * j.y_channels * j.positions;
    dks_parallel_for(j.x_channels, linalg_ceil_div(1 << 14, j.shifts * j.plane), packed_shift_planes, &j);
    dks_parallel_for(group * j.nblocks, linalg_ceil_div(1 << 14, j.k * PACKED_NV), packed_make_panels, &j);
    dks_parallel_for(group * j.mruns * j.pblocks, 1, packed_parts, &j);
  }
  free(j.xs);
  free(j.offset);
  free(j.panels);
  return DK_OK;
}

/* Whether a geometry goes by Winograd: with the filters' transforms
 * prepared, down to WINO_PREPARED_FIT_TILES tiles (ResNet's 14x14 and 7x7
 * 3x3 layers: measured faster than the register block there, whose
 * multiply-adds are 2.25x as many); else where no register block fits. */
static bool winograd_takes(const linalg_window *w, DK_DTypeKey dtype, int64_t cg, int64_t mg, bool prepared) {
  if (prepared && packed_block_avx512() && wino_geometry_fits(w, dtype, cg, mg, WINO_PREPARED_FIT_TILES))
    return true;
  return !packed_fits(w, dtype, cg, mg) && linalg_winograd_fits(w, dtype, cg, mg);
}

/* ---- Blocked: whole-plane columns, the packed block by position tiles and filters ---- */

/* A float32 Conv with many filters on a strided window (ResNet's 3x3/2
 * layers) or a small plane (its 7x7 3x3 layers: 49 positions, 4608
 * (channel, tap) steps, 512 filters): per image and group the plane's
 * columns are built once (by tile and channel; each tile's are a block of
 * their own), then the pool takes items of (a tile of BLOCKED_TILE positions, a run of filters)
 * and each runs over the steps in passes of BLOCKED_KC: a pass's columns
 * for the tile (BLOCKED_KC x BLOCKED_TILE floats, 128 KiB) stay in L2
 * while each block of 8 filters reads its part of W once, adding into its
 * outputs. Per layer (2 threads, min of 60, against the paths they took):
 * the 3x3/2 layers 0.78-0.79x (im2col tiles and the register block read W
 * once per tile of positions), the 7x7 3x3 layers about Winograd's time
 * with 9/16 of its weight reads. A W of BLOCKED_MIN_W_BYTES or less stays
 * in cache across im2col's tiles, which then need no whole-plane columns:
 * the 7x7/2 stem (37 KiB) 0.773 ms that way against 0.85 blocked and 0.87
 * by the direct path. */
#define BLOCKED_KC LINALG_CONV_PASS
#define BLOCKED_TILE 128
#define BLOCKED_SMALL_PLANE 64
#define BLOCKED_MIN_STEPS 64
#define BLOCKED_MIN_FILTERS 64
#define BLOCKED_ROWS 8 /* filters per product: the packed block's rows */
#define BLOCKED_MIN_W_BYTES ((int64_t)256 << 10)
#define BLOCKED_ITEMS 8

/* Whether a Conv goes by the packed block on im2col's columns: the blocked
 * path where W is large (*blocked), else im2col tiles, which keep a small W
 * in cache across their tiles (the stem's 37 KiB). Strided 1x1 kernels
 * too: ResNet-18's 1x1/2 projections 0.65-0.76x the pointwise path's time
 * (2 threads, interleaved). */
static bool panel_fits(const linalg_window *w, DK_DTypeKey dtype, int64_t rows, int64_t mg, int64_t positions,
                       bool *blocked) {
  bool strided = w->n == 2 && (w->stride[0] != 1 || w->stride[1] != 1);
  bool fits = w->n == 2 && dtype == DK_DTYPE_FLOAT32 && packed_block_avx512() && !pointwise(w) &&
              (strided || positions <= BLOCKED_SMALL_PLANE) && rows >= BLOCKED_MIN_STEPS &&
              mg >= BLOCKED_MIN_FILTERS;
  *blocked = fits && mg * rows * (int64_t)sizeof(float) > BLOCKED_MIN_W_BYTES;
  return fits;
}

static int64_t blocked_tile_count(const conv_job *j, int64_t p0) {
  return j->out_plane - p0 < BLOCKED_TILE ? j->out_plane - p0 : BLOCKED_TILE;
}

/* The columns of items [begin, end) of (position tile, channel), tile by
 * tile: a tile's columns are one (steps x tile) block of its own, so a
 * product's rows of B lie close (the plane's full rows put 256 steps of
 * a pass over 200 pages on a 56x56 plane). */
static void blocked_columns(void *arg, int64_t begin, int64_t end) {
  const conv_job *j = arg;
  int64_t taps = j->rows / j->cg, es = j->s.es;
  for (int64_t i = begin; i < end; i++) {
    int64_t t = i / j->cg, c = i % j->cg, p0 = t * BLOCKED_TILE, n = blocked_tile_count(j, p0);
    linalg_im2col(j->s.real, j->s.w, j->x + c * j->in_plane * es, 1, p0, n,
                  j->col + (t * BLOCKED_TILE * j->rows + c * taps * n) * es);
  }
}

/* Items [begin, end) of (position tile, run of filters), filters inner:
 * tiles of BLOCKED_TILE positions, j->s.block filters a run. */
static void blocked_items(void *arg, int64_t begin, int64_t end) {
  const conv_job *j = arg;
  const float *wg = (const float *)j->wt;
  float *yg = (float *)j->y;
  int64_t runs = linalg_ceil_div(j->mg, j->s.block);
  for (int64_t i = begin; i < end; i++) {
    int64_t p0 = i / runs * BLOCKED_TILE, n = blocked_tile_count(j, p0);
    int64_t m0 = i % runs * j->s.block, m1 = m0 + j->s.block < j->mg ? m0 + j->s.block : j->mg;
    const float *col = (const float *)j->col + p0 * j->rows; /* the tile's (steps x n) block */
    for (int64_t k0 = 0; k0 < j->rows; k0 += BLOCKED_KC) {
      int64_t kc = j->rows - k0 < BLOCKED_KC ? j->rows - k0 : BLOCKED_KC;
      for (int64_t m = m0; m < m1; m += BLOCKED_ROWS)
        packed_gemm_rows(m1 - m < BLOCKED_ROWS ? m1 - m : BLOCKED_ROWS, n, kc, wg + m * j->rows + k0, j->rows,
                         col + k0 * n, n, k0 > 0, yg + m * j->out_plane + p0, j->out_plane);
    }
    conv_epilogue_apply(j->ep, (uint8_t *)(yg + m0 * j->out_plane + p0), j->filter0 + m0, m1 - m0, n,
                        j->out_plane);
  }
}

static DK_Status conv_blocked(const dks_kernel_args *k, conv_job *j, int64_t batch) {
  int64_t es = j->s.es, taps = j->rows / j->cg, tiles = linalg_ceil_div(j->out_plane, BLOCKED_TILE);
  /* runs of filters: enough for BLOCKED_ITEMS items per thread where the
   * tiles are few (a run splits W: no part of it is read twice), so that
   * a thread the OS delays (a shared machine) leaves little for the others */
  int64_t threads = dks_thread_count(), runs = linalg_ceil_div(BLOCKED_ITEMS * threads, tiles);
  int64_t blocks = linalg_ceil_div(j->mg, BLOCKED_ROWS);
  if (runs > blocks) runs = blocks;
  uint8_t *col = uncleared_scratch(k, j->rows * j->out_plane, es);
  if (!col) return DK_RESOURCE_EXHAUSTED;
  conv_job part = *j;
  part.col = col;
  part.s.block = linalg_ceil_div(blocks, runs) * BLOCKED_ROWS;
  int64_t items = tiles * linalg_ceil_div(j->mg, part.s.block);
  for (int64_t n = 0; n < batch; n++)
    for (int64_t g = 0; g < j->s.group; g++) {
      part.x = j->x + (n * j->x_channels + g * j->cg) * j->in_plane * es;
      dks_parallel_for(tiles * j->cg, linalg_ceil_div(16384, taps * BLOCKED_TILE), blocked_columns, &part);
      part.wt = j->wt + g * j->mg * j->rows * es;
      part.y = j->y + (n * j->y_channels + g * j->mg) * j->out_plane * es;
      part.filter0 = g * j->mg;
      dks_parallel_for(items, 1, blocked_items, &part);
    }
  free(col);
  return DK_OK;
}

/* ---- Prepared W (DK_KernelEntry.prepare) --------------------------------------------- */

/* A float32 Conv's W, prepared where the call goes by Winograd: the
 * filters' transforms, made once instead of at every call (on a 49-tile
 * plane they cost about what the transform saves); where it goes the direct
 * or the broadcast way: the filters in its register blocks' order (on an
 * 8x8 plane their packing took about a quarter of the sums' time); where it
 * goes the indirect way: the filter panels that path runs on. Then W
 * itself, which a Winograd call whose outputs are not finite sums again the
 * direct way (not after the indirect path's panels, which is all that path
 * reads). */
typedef struct conv_prepared {
  uint32_t tag;  /* CONV_PREPARED_TAG */
  uint32_t kind; /* conv_prepared_kind */
  int64_t group, mg, cg, w_elements;
  uint8_t pad[24]; /* to 64 bytes: U starts cache-line aligned */
} conv_prepared;
_Static_assert(sizeof(conv_prepared) == 64, "U starts 64 bytes in");
#define CONV_PREPARED_TAG 0x57434b44u /* "DKCW" */
typedef enum {
  CONV_PREPARED_WINOGRAD,
  CONV_PREPARED_DIRECT,
  CONV_PREPARED_BROADCAST,
  CONV_PREPARED_INDIRECT
} conv_prepared_kind;

/* The paths of a float Conv, in the order conv_path_of tries them. */
typedef enum {
  CONV_INDIRECT,
  CONV_BLOCKED,
  CONV_POINTWISE,
  CONV_BROADCAST,
  CONV_DIRECT,
  CONV_WINOGRAD,
  CONV_PACKED,
  CONV_TILES
} conv_path;

/* The path conv_float takes for this geometry: the one choice, made alike
 * at plan time (what to prepare: both flags set) and at each call.
 * `winograd_prepared`: W carries Winograd's filter transforms, which let
 * smaller planes go that way; `indirect_prepared`: W carries the indirect
 * path's filter panels, which it runs on only. Winograd falls back to the
 * tiles for a result that is not finite. */
static conv_path conv_path_of(const linalg_window *w, DK_DTypeKey dtype, int64_t cg, int64_t mg,
                              bool winograd_prepared, bool indirect_prepared) {
  bool blocked;
  if (indirect_prepared && linalg_conv_indirect_fits(w, dtype, cg, mg)) return CONV_INDIRECT;
  if (panel_fits(w, dtype, cg * linalg_prod(w->kernel, w->n), mg, linalg_prod(w->grid, w->n), &blocked))
    return blocked ? CONV_BLOCKED : CONV_TILES; /* the tiles by the packed block */
  if (linalg_conv_pointwise_fits(w, dtype, cg, mg)) return CONV_POINTWISE;
  if (linalg_conv_broadcast_fits(w, dtype, cg, mg)) return CONV_BROADCAST;
  if (linalg_conv_direct_fits(w, dtype, cg, mg)) return CONV_DIRECT;
  if (winograd_takes(w, dtype, cg, mg, winograd_prepared)) return CONV_WINOGRAD;
  if (packed_fits(w, dtype, cg, mg)) return CONV_PACKED;
  return CONV_TILES;
}

/* Filters per block of a prepared kind other than Winograd's (the paths'
 * linalg_conv_filter_blocks layout). */
static int64_t conv_prepared_block(uint32_t kind, const linalg_window *w, int64_t mg) {
  return kind == CONV_PREPARED_DIRECT      ? linalg_conv_direct_filter_block()
         : kind == CONV_PREPARED_BROADCAST ? linalg_conv_broadcast_filter_block(w, mg)
                                           : PACKED_PANEL; /* the indirect path's panels */
}

/* The prepared form's bytes before W (U: the transforms or the packed
 * filters), in whole cache lines so that W starts aligned too. */
static size_t conv_prepared_u_bytes(uint32_t kind, const linalg_window *w, int64_t group, int64_t mg, int64_t cg) {
  int64_t floats = kind == CONV_PREPARED_WINOGRAD
                       ? group * 16 * mg * cg
                       : linalg_conv_filter_block_floats(group, mg, cg * linalg_prod(w->kernel, w->n),
                                                         conv_prepared_block(kind, w, mg));
  return ((size_t)floats * sizeof(float) + 63) / 64 * 64;
}

/* W's elements kept after U. */
static int64_t conv_prepared_w_elements(uint32_t kind, int64_t w_elements) {
  return kind == CONV_PREPARED_INDIRECT ? 0 : w_elements;
}

static size_t conv_prepared_bytes(uint32_t kind, const linalg_window *w, int64_t group, int64_t mg, int64_t cg,
                                  int64_t w_elements) {
  return sizeof(conv_prepared) + conv_prepared_u_bytes(kind, w, group, mg, cg) +
         (size_t)conv_prepared_w_elements(kind, w_elements) * sizeof(float);
}

static DK_Status prepare_conv(const dks_kernel_args *k, size_t input, uint8_t *dst, size_t *size) {
  const dks_tensor *x = &k->in[0], *wt = &k->in[1], *y = &k->out[0];
  *size = 0;
  if (input != 1 || y->dtype != DK_DTYPE_FLOAT32 || x->ndim != 4 || y->size == 0) return DK_OK;
  linalg_window w;
  linalg_window_forward(k, 2, x->shape + 2, y->shape + 2, wt->shape + 2, &w);
  int64_t group = dks_attr_int(k, "group", 1), cg = x->shape[1] / group, mg = y->shape[1] / group;
  uint32_t kind;
  switch (conv_path_of(&w, y->dtype, cg, mg, true, true)) {
  case CONV_WINOGRAD: kind = CONV_PREPARED_WINOGRAD; break;
  case CONV_DIRECT: kind = CONV_PREPARED_DIRECT; break;
  case CONV_BROADCAST: kind = CONV_PREPARED_BROADCAST; break;
  case CONV_INDIRECT: kind = CONV_PREPARED_INDIRECT; break;
  default: return DK_OK;
  }
  *size = conv_prepared_bytes(kind, &w, group, mg, cg, wt->size);
  if (!dst) return DK_OK;
  conv_prepared h = {.tag = CONV_PREPARED_TAG, .kind = kind, .group = group, .mg = mg, .cg = cg,
                     .w_elements = wt->size};
  memcpy(dst, &h, sizeof h);
  float *u = (float *)(dst + sizeof h);
  if (kind == CONV_PREPARED_WINOGRAD)
    linalg_winograd_filters((const float *)wt->data, group, mg, cg, u);
  else
    linalg_conv_filter_blocks((const float *)wt->data, group, mg, cg * linalg_prod(w.kernel, w.n),
                              conv_prepared_block(kind, &w, mg), u);
  memcpy(dst + sizeof h + conv_prepared_u_bytes(kind, &w, group, mg, cg), wt->data,
         (size_t)conv_prepared_w_elements(kind, wt->size) * sizeof(float));
  return DK_OK;
}

/* A prepared W's U (*u, of *kind) and W (*view, a compact tensor like wt),
 * once its header is checked. */
static DK_Status conv_unpack(const dks_kernel_args *k, const dks_tensor *wt, const linalg_window *w, int64_t group,
                             int64_t mg, int64_t cg, const float **u, uint32_t *kind, dks_tensor *view) {
  conv_prepared h;
  bool ok = wt->prepared_bytes >= sizeof h;
  if (ok) memcpy(&h, wt->data, sizeof h);
  ok = ok && h.tag == CONV_PREPARED_TAG && h.kind <= CONV_PREPARED_INDIRECT &&
       h.group == group && h.mg == mg && h.cg == cg && h.w_elements == wt->size &&
       wt->prepared_bytes >= conv_prepared_bytes(h.kind, w, group, mg, cg, wt->size);
  if (!ok)
    return dks_kernel_fail(k, DK_INVALID_ARGUMENT,
                           "input 1 is marked prepared and is not this kernel's prepared form of "
                           "its W");
  *kind = h.kind;
  *u = (const float *)(wt->data + sizeof h);
  *view = *wt;
  view->data = wt->data + sizeof h + conv_prepared_u_bytes(h.kind, w, group, mg, cg);
  view->prepared_bytes = 0;
  return DK_OK;
}

/* W for the direct or the broadcast path (`path_kind`): its packed filters
 * U, marked prepared, where W was prepared for that path (`kind`), else W
 * as given (the path packs it). */
static const dks_tensor *path_filters(const dks_tensor *wt, const float *u, uint32_t kind, uint32_t path_kind,
                                      const linalg_window *w, int64_t group, int64_t mg, int64_t cg,
                                      dks_tensor *filters) {
  if (!u || kind != path_kind) return wt;
  *filters = *wt;
  filters->data = (uint8_t *)u;
  filters->prepared_bytes = conv_prepared_u_bytes(kind, w, group, mg, cg);
  return filters;
}

static DK_Status conv_float(const dks_kernel_args *k) {
  const dks_tensor *x = &k->in[0], *wt = &k->in[1], *y = &k->out[0], *b = bias_of(k);
  if (y->size == 0) return DK_OK;
  linalg_real real = linalg_real_of(y);
  linalg_window w;
  linalg_window_forward(k, x->ndim - 2, x->shape + 2, y->shape + 2, wt->shape + 2, &w);
  int64_t group = dks_attr_int(k, "group", 1);
  const float *u = NULL; /* the prepared U, Winograd's (kind) or the direct path's */
  uint32_t kind = CONV_PREPARED_WINOGRAD;
  dks_tensor w_view, filters;
  if (wt->prepared_bytes) {
    DK_Status st = conv_unpack(k, wt, &w, group, y->shape[1] / group, x->shape[1] / group, &u, &kind, &w_view);
    if (st != DK_OK) return st;
    wt = &w_view;
  }
  conv_epilogue ep = conv_epilogue_of(k);
  conv_job j = {.s = {.real = real, .w = &w, .es = y->itemsize, .group = group},
                .direct = pointwise(&w), .cg = x->shape[1] / group, .mg = y->shape[1] / group,
                .in_plane = linalg_prod(w.target, w.n), .out_plane = linalg_prod(w.grid, w.n),
                .x_channels = x->shape[1], .y_channels = y->shape[1],
                .x = x->data, .wt = wt->data, .ep = &ep, .y = y->data};
  j.rows = j.cg * linalg_prod(w.kernel, w.n);
  if (nothing_summed(x, y, &ep, j.out_plane)) return DK_OK;
  conv_path path = conv_path_of(&w, y->dtype, j.cg, j.mg, u && kind == CONV_PREPARED_WINOGRAD,
                                u && kind == CONV_PREPARED_INDIRECT);
  if (u && kind == CONV_PREPARED_INDIRECT && path != CONV_INDIRECT) /* its form holds no W for another path */
    return dks_kernel_fail(k, DK_INVALID_ARGUMENT,
                           "input 1 is prepared for the indirect Conv path, which this call's window does not take");
  switch (path) {
  case CONV_INDIRECT: return linalg_conv_indirect(k, x, u, &ep, y, &w, group);
  case CONV_BLOCKED: return conv_blocked(k, &j, x->shape[0]);
  case CONV_POINTWISE: return linalg_conv_pointwise(k, x, wt, &ep, y, &w, group);
  case CONV_DIRECT:
    return linalg_conv_direct(k, x, path_filters(wt, u, kind, CONV_PREPARED_DIRECT, &w, group, j.mg, j.cg, &filters),
                              b, y, &w, group);
  case CONV_BROADCAST:
    return linalg_conv_broadcast(k, x,
                                 path_filters(wt, u, kind, CONV_PREPARED_BROADCAST, &w, group, j.mg, j.cg, &filters),
                                 b, y, &w, group);
  case CONV_PACKED: return conv_packed(k, x, wt, &ep, y, &w, group);
  case CONV_WINOGRAD: {
    bool redo = false;
    DK_Status st = linalg_conv_winograd(k, x, wt, kind == CONV_PREPARED_WINOGRAD ? u : NULL, b, y, &w, group, &redo);
    if (st != DK_OK || !redo) return st;
    break; /* a result that is not finite: the tiles again */
  }
  case CONV_TILES: break;
  }
  atomic_init(&j.s.failed, false);
  /* Tiles that fit the cache, at least TILE_MIN positions; when there are
   * few, as many more as make their count a multiple of the threads. */
  int64_t threads = dks_thread_count(), images = x->shape[0] * group;
  int64_t tile = TILE_BYTES / (j.rows * j.s.es);
  if (tile < TILE_MIN) tile = TILE_MIN;
  int64_t tiles = linalg_ceil_div(j.out_plane, tile);
  if (threads > 1 && !j.direct && images * tiles < 4 * threads) { /* more tiles, down to TILE_EVEN positions */
    int64_t most = j.out_plane / TILE_EVEN > tiles ? j.out_plane / TILE_EVEN : tiles;
    tiles = linalg_ceil_div(4 * threads, images) < most ? linalg_ceil_div(4 * threads, images) : most;
  }
  if (threads > 1 && images * tiles < 8 * threads) /* a multiple of the threads */
    tiles = linalg_ceil_div(linalg_ceil_div(images * tiles, threads) * threads, images);
  j.s.block = linalg_ceil_div(j.out_plane, tiles);
  if (threads > 1 && j.s.block < TILE_MIN && images < 2 * threads)
    return conv_whole(k, &j, x->shape[0]);
  if (j.s.block < 1) j.s.block = 1;
  dks_parallel_for(images * linalg_ceil_div(j.out_plane, j.s.block), 1, conv_tiles, &j);
  return split_status(k, &j.s);
}

static DK_Status conv_low(const dks_kernel_args *k) { return linalg_run_as_f32(k, conv_float); }

/* ---- ConvTranspose --------------------------------------------------------------------- */

static int64_t floor_half(int64_t v) { return v >= 0 ? v / 2 : -((-v + 1) / 2); }

/* ConvTranspose's geometry: the grid is the input, the target the output,
 * and the begin pads follow the spec (devkit/ops/linalg.py,
 * conv_transpose_geometry). */
static void window_transpose(const dks_kernel_args *k, int32_t n, const int64_t *in, const int64_t *out,
                             const int64_t *kernel, linalg_window *w) {
  int64_t ns, nd, np, nop, nshape;
  const int64_t *strides = dks_attr_ints(k, "strides", &ns);
  const int64_t *dilations = dks_attr_ints(k, "dilations", &nd);
  const int64_t *pads = dks_attr_ints(k, "pads", &np);
  const int64_t *output_padding = dks_attr_ints(k, "output_padding", &nop);
  dks_attr_ints(k, "output_shape", &nshape);
  const char *auto_pad = dks_attr_string(k, "auto_pad", "NOTSET");
  bool upper = strcmp(auto_pad, "SAME_UPPER") == 0;
  bool derived = nshape > 0 || upper || strcmp(auto_pad, "SAME_LOWER") == 0;
  bool explicit_pads = strcmp(auto_pad, "NOTSET") == 0 && np == 2 * n;
  memset(w, 0, sizeof *w);
  w->n = n;
  for (int32_t d = 0; d < n; d++) {
    w->grid[d] = in[d];
    w->target[d] = out[d];
    w->kernel[d] = kernel[d];
    w->stride[d] = ns == n ? strides[d] : 1;
    w->dilation[d] = nd == n ? dilations[d] : 1;
    int64_t extra = nop == n ? output_padding[d] : 0;
    int64_t full = in[d] ? w->stride[d] * (in[d] - 1) + extra + (kernel[d] - 1) * w->dilation[d] + 1 : 0;
    if (derived) {
      int64_t total = full - out[d];
      w->pad[d] = upper ? floor_half(total) : total - floor_half(total);
    } else if (explicit_pads) {
      w->pad[d] = pads[d];
    }
  }
}

/* Split over the pool by image, group and run of output channels: a chunk
 * owns its channels' planes, so it clears them, scatters its columns into
 * them (col2im) and adds their bias with no other thread writing there. */
typedef struct conv_transpose_job {
  conv_split s;
  bool direct;
  int64_t cg, mg, taps, in_plane, out_plane, x_channels, y_channels, band;
  const uint8_t *x, *wt, *b;
  uint8_t *y;
} conv_transpose_job;

static void conv_transpose_part(void *arg, int64_t begin, int64_t end) {
  conv_transpose_job *j = arg;
  int64_t es = j->s.es, rows = j->mg * j->taps, blocks = linalg_ceil_div(j->mg, j->s.block);
  uint8_t *col = j->direct ? NULL : chunk_scratch(&j->s, j->s.block * j->taps * j->band);
  if (!j->direct && !col) return;
  for (int64_t i = begin; i < end; i++) {
    int64_t ng = i / blocks, n = ng / j->s.group, g = ng % j->s.group;
    int64_t m0 = i % blocks * j->s.block, mb = j->mg - m0 < j->s.block ? j->mg - m0 : j->s.block;
    const uint8_t *xg = j->x + (n * j->x_channels + g * j->cg) * j->in_plane * es;
    const uint8_t *wg = j->wt + (g * j->cg * rows + m0 * j->taps) * es; /* W_g (cg x rows), columns from m0 */
    uint8_t *yg = j->y + (n * j->y_channels + g * j->mg + m0) * j->out_plane * es;
    if (j->direct) { /* yg (mb x plane) = wg^T (mb x cg) @ xg (cg x plane) */
      linalg_gemm(j->s.real, true, false, mb, j->in_plane, j->cg, 1.0, wg, rows, xg, j->in_plane, 0.0, yg,
                  j->out_plane);
    } else {
      memset(yg, 0, (size_t)(mb * j->out_plane * es));
      for (int64_t p0 = 0; p0 < j->in_plane; p0 += j->band) {
        int64_t count = j->in_plane - p0 < j->band ? j->in_plane - p0 : j->band;
        linalg_gemm(j->s.real, true, false, mb * j->taps, count, j->cg, 1.0, wg, rows, xg + p0 * es,
                    j->in_plane, 0.0, col, count);
        linalg_col2im(j->s.real, j->s.w, col, mb, p0, count, yg);
      }
    }
    if (j->b) add_bias(j->s.real, yg, j->b + (g * j->mg + m0) * es, mb, j->out_plane, j->out_plane);
  }
  free(col);
}

static DK_Status conv_transpose_float(const dks_kernel_args *k) {
  const dks_tensor *x = &k->in[0], *wt = &k->in[1], *y = &k->out[0], *b = bias_of(k);
  if (y->size == 0) return DK_OK;
  linalg_real real = linalg_real_of(y);
  linalg_window w;
  window_transpose(k, x->ndim - 2, x->shape + 2, y->shape + 2, wt->shape + 2, &w);
  int64_t group = dks_attr_int(k, "group", 1);
  conv_transpose_job j = {.s = {.real = real, .w = &w, .es = y->itemsize, .group = group},
                          .direct = pointwise(&w), .cg = x->shape[1] / group, .mg = wt->shape[1],
                          .taps = linalg_prod(w.kernel, w.n), .in_plane = linalg_prod(w.grid, w.n),
                          .out_plane = linalg_prod(w.target, w.n), .x_channels = x->shape[1],
                          .y_channels = y->shape[1], .x = x->data, .wt = wt->data, .b = b ? b->data : NULL,
                          .y = y->data};
  conv_epilogue ep = conv_epilogue_of(k);
  if (nothing_summed(x, y, &ep, j.out_plane)) return DK_OK;
  atomic_init(&j.s.failed, false);
  /* Runs of channels: enough for a few chunks per thread. */
  int64_t threads = dks_thread_count(), images = x->shape[0] * group;
  int64_t blocks = threads > 1 ? linalg_ceil_div(4 * threads, images) : 1;
  if (blocks > j.mg) blocks = j.mg;
  j.s.block = linalg_ceil_div(j.mg, blocks);
  j.band = band_width(j.s.block * j.taps, j.in_plane);
  dks_parallel_for(images * linalg_ceil_div(j.mg, j.s.block), 1, conv_transpose_part, &j);
  return split_status(k, &j.s);
}

static DK_Status conv_transpose_low(const dks_kernel_args *k) {
  return linalg_run_as_f32(k, conv_transpose_float);
}

/* Compact tensors only: the host copies strided inputs. */
static const dks_kernel_def k_linalg_conv[] = {
    {"Conv", DK_DTYPE_FLOAT32, conv_float, 0},
    {"Conv", DK_DTYPE_FLOAT64, conv_float, 0},
    {"Conv", DK_DTYPE_FLOAT16, conv_low, 0},
    {"Conv", DK_DTYPE_BFLOAT16, conv_low, 0},
    {"FusedConv", DK_DTYPE_FLOAT32, conv_float, 0}, /* Conv with Z and the activation in its epilogue */
    {"FusedConv", DK_DTYPE_FLOAT64, conv_float, 0},
    {"FusedConv", DK_DTYPE_FLOAT16, conv_low, 0},
    {"FusedConv", DK_DTYPE_BFLOAT16, conv_low, 0},
    {"ConvTranspose", DK_DTYPE_FLOAT32, conv_transpose_float, 0},
    {"ConvTranspose", DK_DTYPE_FLOAT64, conv_transpose_float, 0},
    {"ConvTranspose", DK_DTYPE_FLOAT16, conv_transpose_low, 0},
    {"ConvTranspose", DK_DTYPE_BFLOAT16, conv_transpose_low, 0},
};
DKS_REGISTER_KERNELS(k_linalg_conv)

static const dks_preparer p_linalg_conv[] = {{"Conv", prepare_conv}, {"FusedConv", prepare_conv}};
DKS_REGISTER_PREPARERS(p_linalg_conv)

/* X, W, optional B and Y: one dtype; Y's shape as X, W and the attributes give it. */
static DK_Status validate_conv_common(const dks_kernel_args *k, bool transpose) {
  DK_Status st = dks_check_rank(k, 0, 3, DKS_MAX_DIMS);
  if (st == DK_OK) st = dks_check_rank(k, 1, k->in[0].ndim, k->in[0].ndim);
  const dks_tensor *b = k->num_inputs > 2 && k->in[2].ndim >= 0 ? &k->in[2] : NULL;
  int64_t out[DKS_MAX_DIMS];
  if (st == DK_OK) st = linalg_check_conv(k, &k->in[0], &k->in[1], b, transpose, out);
  for (size_t i = 1; st == DK_OK && i < k->num_inputs; i++)
    if (k->in[i].ndim >= 0) st = dks_check_dtype(k, "input", i, k->in[0].dtype);
  if (st == DK_OK) st = dks_check_dtype(k, "output", 0, k->in[0].dtype);
  return st != DK_OK ? st : dks_check_output(k, 0, k->in[0].ndim, out);
}

static DK_Status validate_conv(const dks_kernel_args *k) { return validate_conv_common(k, false); }
static DK_Status validate_conv_transpose(const dks_kernel_args *k) { return validate_conv_common(k, true); }
static DK_Status validate_fused_conv(const dks_kernel_args *k) {
  DK_Status st = validate_conv(k);
  return st != DK_OK ? st : conv_epilogue_validate(k);
}

static const dks_validator v_linalg_conv[] = {
    {"Conv", validate_conv},
    {"FusedConv", validate_fused_conv},
    {"ConvTranspose", validate_conv_transpose},
};
DKS_REGISTER_VALIDATORS(v_linalg_conv)
