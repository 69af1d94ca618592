/*
 * ccl.c -- collectives of the devkit "cpu" reference plugin.
 *
 * Ranks are processes, or threads, of one host. They meet in a POSIX
 * shared-memory segment named by the unique id ("/devkit-ccl-<32 hex>", or
 * "/devkit-ccl-<job>-<32 hex>" when the id was made under a launcher's
 * DEVKIT_JOB_ID): the first rank to arrive creates it, each rank claims its
 * slot, and once all have mapped it every rank unlinks the name (the mappings
 * stay valid), so the segment disappears with its last mapping. A rank whose
 * init times out unlinks the name too. Ranks killed before all joined leave
 * the name behind: devkit-run removes its job's names when the job ends. At
 * most MAX_RANKS ranks (the per-pair channels grow with the square of the
 * rank count).
 *
 * Segment layout (every rank derives it from nranks, see layout_for):
 *   header | rank control blocks | channel control blocks
 *   | per rank: 2 input buffers, 2 result buffers | channel slots
 *
 * Synchronisation. Each rank owns a step counter in the segment that only
 * it writes and that only grows. Every collective is a fixed sequence of
 * steps, the same on every rank for the same call, so "rank j has reached
 * step t" is the one primitive (wait_peer) and consecutive collectives
 * cannot mix. Each collective starts with a barrier step that publishes a
 * descriptor (kind, count, dtype, op, root) which every rank checks against
 * its own, so ranks that issue different collectives fail instead of
 * exchanging garbage. After that barrier every buffer is free. Waiters spin
 * briefly, then yield, then sleep on a futex (shared, so it works across
 * processes); sleeping waiters wake periodically to look for an aborted
 * communicator, a dead peer and the deadline.
 *
 * Algorithms. Data moves in chunks through each rank's two input buffers:
 * chunk k+1 fills one while peers still read chunk k from the other, and a
 * buffer is reused only once every rank has finished the chunk before
 * (double buffering). Every rank does its share of the work:
 *   all_reduce: each rank copies its chunk in (but for its own share, which
 *     it reads from send); each reduces its 1/n share of the chunk across all
 *     n ranks into its result buffer; each copies all n reduced shares out.
 *   reduce: the same, but only the root copies the shares out (the root
 *     reduces its own share straight into recv).
 *   reduce_scatter: each rank copies block j's chunk of its send buffer to
 *     slot j of its input buffer (j != itself); rank i reduces slot i of all
 *     buffers, and its own block, straight into its recv.
 *   all_gather: each rank copies its chunk in, then copies every peer's
 *     chunk out.
 *   all_to_all: like reduce_scatter's layout, but rank i copies slot i of
 *     every peer's buffer out to block j of its recv.
 *   broadcast: the root copies each chunk in once; every other rank copies
 *     it out.
 *   send/recv: one channel per directed pair of ranks, a ring of slots with
 *     a sent and a taken counter; each slot also carries the size of the
 *     message it belongs to, so mismatched send/recv sizes are caught. The
 *     p2p calls of a group that share a stream become one work item that
 *     progresses them all, so a ring of sends and receives cannot deadlock.
 *     A rank waits on its "doorbell", which peers ring when a channel to or
 *     from it moves.
 *
 * Failure. A wait that outlasts DEVKIT_CCL_TIMEOUT, or whose peer process
 * has exited, fails the collective with DK_DEADLINE_EXCEEDED naming the
 * ranks that did not arrive; the communicator is then failed: it records
 * the message, raises an abort flag in the segment (so its peers stop
 * waiting too), and answers DK_ABORTED to every later call and queued item.
 *
 * Threads: the communicator's queued work runs under its exec_mu (one item
 * at a time per communicator); pins, pending work and the failure record
 * are guarded by mu. The registry lock is taken only to look up handles.
 */
#define _GNU_SOURCE /* syscall, getrandom, posix_fallocate, shm_open */

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <linux/futex.h>
#include <sched.h>
#include <signal.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "cpu.h"

#define ID_SIZE 64
#define ID_VERSION 2
#define ID_JOB 32     /* offset of the job id: up to ID_JOB_MAX hex digits */
#define ID_JOB_MAX 16
#define MAX_RANKS 64
#define DEFAULT_TIMEOUT_S 300.0
#define LINE 64

/* Input buffers: at most COLL_BUF_MAX bytes each, and the 2 * nranks of them
 * together at most COLL_AREA. Chunks this small tend to stay in cache while
 * they are copied in, reduced and copied out. */
#define COLL_BUF_MAX ((size_t)1 << 20)
#define COLL_BUF_MIN ((size_t)64 << 10)
#define COLL_AREA ((size_t)32 << 20)
/* Channels: CHAN_SLOTS slots of at most CHAN_SLOT_MAX bytes per directed
 * pair, all of them together at most CHAN_AREA. */
#define CHAN_SLOTS 4
#define CHAN_SLOT_MAX ((size_t)128 << 10)
#define CHAN_SLOT_MIN ((size_t)4 << 10)
#define CHAN_AREA ((size_t)16 << 20)

#define SEG_READY UINT64_C(0x64766b74636c3031) /* set once the header is valid */
#define SEG_VERSION 1
#define JOIN_CLOSED 0x10000u /* join word: count of ranks | closed by a timeout */

#define SPIN_NS 20000u      /* busy-wait for a peer a few microseconds behind */
#define YIELD_NS 200000u    /* then yield: ranks may outnumber cores */
#define CHECK_NS 20000000u  /* a sleeping waiter checks aborts / dead peers */

static const char k_id_magic[8] = "DKCCLID";

/* ======================================================================== */
/* Small utilities                                                           */
/* ======================================================================== */

static uint64_t min_u64(uint64_t a, uint64_t b) { return a < b ? a : b; }
static size_t min_size(size_t a, size_t b) { return a < b ? a : b; }

/* Counters wrap; a peer is never 2^31 steps away. */
static bool reached(uint32_t value, uint32_t target) {
  return (int32_t)(value - target) >= 0;
}

/* Not FUTEX_PRIVATE: the word may be shared with other processes. */
static void futex_wait(atomic_uint *word, uint32_t seen, uint64_t ns) {
  struct timespec ts = {(time_t)(ns / 1000000000u), (long)(ns % 1000000000u)};
  syscall(SYS_futex, (uint32_t *)word, FUTEX_WAIT, seen, &ts, NULL, 0);
}

static void futex_wake_all(atomic_uint *word) {
  syscall(SYS_futex, (uint32_t *)word, FUTEX_WAKE, INT_MAX, NULL, NULL, 0);
}

/* Copies src into dst[size], truncating; always terminates. */
static void copy_str(char *dst, size_t size, const char *src) {
  size_t n = strnlen(src, size - 1);
  memcpy(dst, src, n);
  dst[n] = '\0';
}

/* Appends "a, b, c" style text to buf[*len..size). */
static void append(char *buf, size_t size, size_t *len, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static void append(char *buf, size_t size, size_t *len, const char *fmt, ...) {
  if (*len >= size) return;
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(buf + *len, size - *len, fmt, ap);
  va_end(ap);
  if (n > 0) *len += (size_t)n;
}

/* ======================================================================== */
/* Data types and reduction kernels                                         */
/* ======================================================================== */

/* IEEE binary16 <-> binary32 as the F16C instructions do it: round to
 * nearest even; NaNs stay NaNs (made quiet, top payload bits kept);
 * infinities and subnormals are exact. */
static float half_to_float(uint16_t h) {
  uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu, man = h & 0x3ffu, u;
  if (exp == 0x1f) { /* infinity, or NaN made quiet as F16C does */
    u = sign | 0x7f800000u | (man << 13) | (man ? 0x400000u : 0);
  } else if (exp != 0) {
    u = sign | ((exp + 112) << 23) | (man << 13);
  } else {
    float f = (float)man * 0x1p-24f; /* subnormal (or zero): exact */
    memcpy(&u, &f, sizeof u);
    u |= sign;
  }
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
}

static uint16_t float_to_half(float f) {
  uint32_t u;
  memcpy(&u, &f, sizeof u);
  uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
  uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) /* NaN */
    return (uint16_t)(sign | 0x7e00u | ((a >> 13) & 0x3ffu));
  if (a >= 0x477ff000u) /* rounds past 65504, or infinity */
    return (uint16_t)(sign | 0x7c00u);
  if (a >= 0x38800000u) { /* normal: rebias the exponent, round 13 bits */
    uint32_t r = a - 0x38000000u;
    r += 0xfffu + ((r >> 13) & 1u);
    return (uint16_t)(sign | (r >> 13));
  }
  if (a <= 0x33000000u) return sign; /* at most half the smallest subnormal */
  uint32_t e = a >> 23, m = (a & 0x7fffffu) | 0x800000u;
  uint32_t shift = 126 - e; /* 14..24: units of 2^-24 */
  uint32_t q = m >> shift, rem = m & ((1u << shift) - 1), half = 1u << (shift - 1);
  if (rem > half || (rem == half && (q & 1u))) q++;
  return (uint16_t)(sign | q); /* q == 0x400 is the smallest normal */
}

static float bf16_to_float(uint16_t b) {
  uint32_t u = (uint32_t)b << 16;
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
}

static uint16_t float_to_bf16(float f) {
  uint32_t u;
  memcpy(&u, &f, sizeof u);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40u);
  u += 0x7fffu + ((u >> 16) & 1u);
  return (uint16_t)(u >> 16);
}

/* MAX / MIN propagate NaN (the first NaN operand). */
static inline float max_f(float x, float y) { return (x != x || x > y) ? x : y; }
static inline float min_f(float x, float y) { return (x != x || x < y) ? x : y; }
static inline double max_d(double x, double y) { return (x != x || x > y) ? x : y; }
static inline double min_d(double x, double y) { return (x != x || x < y) ? x : y; }

/* dst = a op b, and dst = dst op b; operands never overlap. */
typedef void (*op3_fn)(void *restrict dst, const void *restrict a,
                       const void *restrict b, size_t n);
typedef void (*op2_fn)(void *restrict dst, const void *restrict b, size_t n);
typedef void (*avg_fn)(void *dst, size_t n, int32_t nranks);

#define KERNEL(name, T, EXPR)                                                \
  static void name##_3(void *restrict dst, const void *restrict pa,          \
                       const void *restrict pb, size_t n) {                  \
    T *restrict d = dst;                                                     \
    const T *restrict a = pa, *restrict b = pb;                              \
    for (size_t i = 0; i < n; i++) {                                         \
      T x = a[i], y = b[i];                                                  \
      d[i] = (EXPR);                                                         \
    }                                                                        \
  }                                                                          \
  static void name##_2(void *restrict dst, const void *restrict pb,          \
                       size_t n) {                                           \
    T *restrict d = dst;                                                     \
    const T *restrict b = pb;                                                \
    for (size_t i = 0; i < n; i++) {                                         \
      T x = d[i], y = b[i];                                                  \
      d[i] = (EXPR);                                                         \
    }                                                                        \
  }

/* Integers wrap, computed unsigned (signed overflow is undefined). */
#define INT_KERNELS(tag, T, U)                                 \
  KERNEL(tag##_sum, T, (T)(U)((uint64_t)(U)x + (U)y))          \
  KERNEL(tag##_prod, T, (T)(U)((uint64_t)(U)x * (U)y))         \
  KERNEL(tag##_max, T, x > y ? x : y)                          \
  KERNEL(tag##_min, T, x < y ? x : y)

/* 16-bit floats: widen, operate, round back to nearest even per step. */
#define HALF_KERNELS(tag, TO, FROM)                                 \
  KERNEL(tag##_sum, uint16_t, FROM(TO(x) + TO(y)))                  \
  KERNEL(tag##_prod, uint16_t, FROM(TO(x) * TO(y)))                 \
  KERNEL(tag##_max, uint16_t, FROM(max_f(TO(x), TO(y))))            \
  KERNEL(tag##_min, uint16_t, FROM(min_f(TO(x), TO(y))))            \
  static void tag##_avg(void *dst, size_t n, int32_t nranks) {      \
    uint16_t *d = dst;                                              \
    for (size_t i = 0; i < n; i++) d[i] = FROM(TO(d[i]) / (float)nranks); \
  }

INT_KERNELS(i8, int8_t, uint8_t)
INT_KERNELS(u8, uint8_t, uint8_t)
INT_KERNELS(i32, int32_t, uint32_t)
INT_KERNELS(i64, int64_t, uint64_t)
HALF_KERNELS(f16, half_to_float, float_to_half)
HALF_KERNELS(bf16, bf16_to_float, float_to_bf16)
KERNEL(f32_sum, float, x + y)
KERNEL(f32_prod, float, x * y)
KERNEL(f32_max, float, max_f(x, y))
KERNEL(f32_min, float, min_f(x, y))
KERNEL(f64_sum, double, x + y)
KERNEL(f64_prod, double, x * y)
KERNEL(f64_max, double, max_d(x, y))
KERNEL(f64_min, double, min_d(x, y))

static void f32_avg(void *dst, size_t n, int32_t nranks) {
  float *d = dst;
  for (size_t i = 0; i < n; i++) d[i] /= (float)nranks;
}

static void f64_avg(void *dst, size_t n, int32_t nranks) {
  double *d = dst;
  for (size_t i = 0; i < n; i++) d[i] /= (double)nranks;
}

typedef struct dtype_info {
  DK_DTypeKey key;
  const char *name;
  size_t size;
  op3_fn op3[4]; /* DK_REDUCE_SUM, PROD, MAX, MIN */
  op2_fn op2[4];
  avg_fn avg;    /* NULL: DK_REDUCE_AVG is refused (integers) */
} dtype_info;

#define OPS(tag)                                                      \
  {tag##_sum_3, tag##_prod_3, tag##_max_3, tag##_min_3},              \
  {tag##_sum_2, tag##_prod_2, tag##_max_2, tag##_min_2}

static const dtype_info k_dtypes[] = {
    {DK_DTYPE_INT8, "int8", 1, OPS(i8), NULL},
    {DK_DTYPE_UINT8, "uint8", 1, OPS(u8), NULL},
    {DK_DTYPE_INT32, "int32", 4, OPS(i32), NULL},
    {DK_DTYPE_INT64, "int64", 8, OPS(i64), NULL},
    {DK_DTYPE_FLOAT16, "float16", 2, OPS(f16), f16_avg},
    {DK_DTYPE_BFLOAT16, "bfloat16", 2, OPS(bf16), bf16_avg},
    {DK_DTYPE_FLOAT32, "float32", 4, OPS(f32), f32_avg},
    {DK_DTYPE_FLOAT64, "float64", 8, OPS(f64), f64_avg},
};

static const dtype_info *dtype_find(DK_DTypeKey key) {
  for (size_t i = 0; i < sizeof k_dtypes / sizeof k_dtypes[0]; i++)
    if (k_dtypes[i].key == key) return &k_dtypes[i];
  return NULL;
}

static const char *const k_op_names[] = {"SUM", "PROD", "MAX", "MIN", "AVG"};

/* dst = srcs[0] op ... op srcs[n-1] (in rank order), then / n for AVG.
 * Blocked so that dst stays in L1 across the n - 1 passes. */
static void reduce_n(uint8_t *dst, const uint8_t *const *srcs, int32_t n,
                     size_t len, const dtype_info *dt, int32_t op) {
  enum { BLOCK_BYTES = 16384 };
  size_t es = dt->size, block = BLOCK_BYTES / es;
  int32_t k = op == DK_REDUCE_AVG ? DK_REDUCE_SUM : op;
  for (size_t at = 0; at < len; at += block) {
    size_t m = min_size(block, len - at), o = at * es;
    if (n == 1) {
      memcpy(dst + o, srcs[0] + o, m * es);
    } else {
      dt->op3[k](dst + o, srcs[0] + o, srcs[1] + o, m);
      for (int32_t j = 2; j < n; j++) dt->op2[k](dst + o, srcs[j] + o, m);
    }
    if (op == DK_REDUCE_AVG) dt->avg(dst + o, m, n);
  }
}

/* ======================================================================== */
/* The shared segment                                                        */
/* ======================================================================== */

/* A futex word with a count of sleepers, so posting skips the wake syscall
 * when nobody sleeps. Alone on its cache line. */
typedef struct ccl_flag {
  _Alignas(LINE) atomic_uint value;
  atomic_uint sleepers;
} ccl_flag;

typedef enum ccl_kind {
  K_ALL_REDUCE,
  K_BROADCAST,
  K_REDUCE,
  K_ALL_GATHER,
  K_REDUCE_SCATTER,
  K_ALL_TO_ALL,
  K_SEND,
  K_RECV
} ccl_kind;

static const char *const k_kind_names[] = {
    "all_reduce", "broadcast", "reduce", "all_gather",
    "reduce_scatter", "all_to_all", "send", "recv"};

/* What a rank says it is doing in a collective; fields a kind does not use
 * are 0 so that descriptors compare whole. */
typedef struct ccl_desc {
  uint32_t coll; /* collective number on the communicator */
  uint32_t kind;
  uint64_t count;
  uint32_t dtype;
  int32_t op;
  int32_t root;
  uint32_t reserved; /* 0: leaves no padding for memcmp to trip on */
} ccl_desc;

/* Written by its rank only (claimed / pid at init, desc before a step). */
typedef struct ccl_rank_ctl {
  ccl_flag seq;  /* collective steps taken */
  ccl_flag bell; /* rung by peers when a channel to or from this rank moves */
  _Alignas(LINE) atomic_uint claimed;
  atomic_int pid;
  ccl_desc desc[2]; /* by collective number parity: a peer may still read
                       the previous one, never the one before */
} ccl_rank_ctl;

/* A directed channel from -> to: `sent` written by the sender, `taken` by
 * the receiver, msg_bytes[slot] by the sender before it publishes the slot. */
typedef struct ccl_chan {
  _Alignas(LINE) atomic_uint sent;
  _Alignas(LINE) atomic_uint taken;
  _Alignas(LINE) uint64_t msg_bytes[CHAN_SLOTS];
} ccl_chan;

typedef struct ccl_header {
  _Atomic uint64_t ready; /* SEG_READY once the fields below are set */
  uint32_t version;
  int32_t nranks;
  uint64_t size;
  ccl_flag join; /* ranks joined | JOIN_CLOSED */
  _Alignas(LINE) atomic_uint abort_claim; /* the first failing rank writes */
  atomic_int abort_status;                /* ... these, status last */
  int32_t abort_rank;
  char abort_msg[768];
} ccl_header;

typedef struct ccl_layout {
  size_t buf;   /* bytes of one input buffer */
  size_t res;   /* bytes of one result buffer */
  size_t slot;  /* bytes of one channel slot */
  size_t ctl, chan, data, chan_data, size; /* offsets and total size */
} ccl_layout;

static size_t round_up(size_t x, size_t a) { return (x + a - 1) / a * a; }

static size_t clamp_lines(size_t x, size_t lo, size_t hi) {
  x = x < lo ? lo : x > hi ? hi : x;
  return x / LINE * LINE;
}

static ccl_layout layout_for(int32_t nranks) {
  size_t n = (size_t)nranks;
  ccl_layout l;
  l.buf = clamp_lines(COLL_AREA / (2 * n), COLL_BUF_MIN, COLL_BUF_MAX);
  /* A share (see share_len) is at most ceil(buf / n) bytes plus one line. */
  l.res = round_up((l.buf + n - 1) / n + LINE, LINE);
  l.slot = clamp_lines(CHAN_AREA / (n * n * CHAN_SLOTS), CHAN_SLOT_MIN,
                       CHAN_SLOT_MAX);
  l.ctl = round_up(sizeof(ccl_header), LINE);
  l.chan = l.ctl + n * sizeof(ccl_rank_ctl);
  l.data = round_up(l.chan + n * n * sizeof(ccl_chan), 4096);
  l.chan_data = l.data + n * 2 * (l.buf + l.res);
  l.size = l.chan_data + n * n * CHAN_SLOTS * l.slot;
  return l;
}

/* ======================================================================== */
/* Communicators                                                             */
/* ======================================================================== */

/* A queued item's link in its communicator's pending list. */
typedef struct pending_node {
  struct pending_node *prev, *next;
  dks_stream *stream; /* NULL: the default stream */
} pending_node;

typedef struct ccl_comm {
  int32_t rank, nranks;
  dks_device *device;
  double timeout_s;
  uint64_t timeout_ns;
  ccl_layout lay;
  uint8_t *base; /* the mapping */
  ccl_header *hdr;
  ccl_rank_ctl *ctl;
  ccl_chan *chan;

  pthread_mutex_t exec_mu; /* held by the running item of this communicator */
  uint32_t seq;            /* this rank's step counter (ctl[rank].seq) */
  uint32_t coll;           /* collectives started */

  pthread_mutex_t mu; /* guards the fields below */
  pthread_cond_t cv;  /* pins or pending dropped */
  int pins;           /* API calls in flight */
  pending_node pending; /* list head of queued items */
  DK_Status failed;     /* DK_OK while usable */
  char fail_msg[1024];

  pid_t watch[]; /* per rank: a process to poll for death, or 0 */
} ccl_comm;

static pthread_mutex_t g_comms_mu = PTHREAD_MUTEX_INITIALIZER;
static dks_table g_comms; /* live ccl_comm pointers */

static uint8_t *in_buf(const ccl_comm *c, int32_t r, size_t b) {
  return c->base + c->lay.data + (size_t)r * 2 * (c->lay.buf + c->lay.res) +
         b * c->lay.buf;
}

static uint8_t *res_buf(const ccl_comm *c, int32_t r, size_t b) {
  return in_buf(c, r, 0) + 2 * c->lay.buf + b * c->lay.res;
}

static uint8_t *chan_slot(const ccl_comm *c, int32_t from, int32_t to,
                          uint32_t slot) {
  size_t pair = (size_t)from * (size_t)c->nranks + (size_t)to;
  return c->base + c->lay.chan_data +
         (pair * CHAN_SLOTS + slot % CHAN_SLOTS) * c->lay.slot;
}

static DK_Status comm_acquire(const char *fn, DK_Comm handle, ccl_comm **out) {
  *out = NULL;
  if (!handle) return dks_set_error(DK_INVALID_ARGUMENT, "%s: comm is NULL", fn);
  ccl_comm *c = (ccl_comm *)handle;
  DK_Status st = DK_OK;
  pthread_mutex_lock(&g_comms_mu);
  bool live = dks_table_find(&g_comms, (uintptr_t)c, NULL);
  if (live) {
    pthread_mutex_lock(&c->mu);
    if (c->failed != DK_OK)
      st = dks_set_error(DK_ABORTED,
                         "%s: communicator %p (rank %d of %d) has failed: %s",
                         fn, (void *)c, (int)c->rank, (int)c->nranks,
                         c->fail_msg);
    else
      c->pins++;
    pthread_mutex_unlock(&c->mu);
  }
  pthread_mutex_unlock(&g_comms_mu);
  if (!live)
    return dks_set_error(DK_INVALID_ARGUMENT,
                         "%s: comm %p is not a live communicator", fn,
                         (void *)handle);
  if (st == DK_OK) *out = c;
  return st;
}

static void comm_release(ccl_comm *c) {
  pthread_mutex_lock(&c->mu);
  if (--c->pins == 0) pthread_cond_broadcast(&c->cv);
  pthread_mutex_unlock(&c->mu);
}

static void comm_pend(ccl_comm *c, pending_node *n, dks_stream *s) {
  pthread_mutex_lock(&c->mu);
  n->stream = s;
  n->prev = &c->pending;
  n->next = c->pending.next;
  n->next->prev = n;
  c->pending.next = n;
  pthread_mutex_unlock(&c->mu);
}

static void comm_unpend(ccl_comm *c, pending_node *n) {
  pthread_mutex_lock(&c->mu);
  n->prev->next = n->next;
  n->next->prev = n->prev;
  if (c->pending.next == &c->pending) pthread_cond_broadcast(&c->cv);
  pthread_mutex_unlock(&c->mu);
}

/* The local failure record, or DK_OK; *msg is filled on failure. */
static DK_Status comm_failed(ccl_comm *c, char *msg, size_t size) {
  pthread_mutex_lock(&c->mu);
  DK_Status st = c->failed;
  if (st != DK_OK) snprintf(msg, size, "%s", c->fail_msg);
  pthread_mutex_unlock(&c->mu);
  return st;
}

/* Fails the communicator (the first failure is kept) and, if no rank has
 * yet, raises the abort flag in the segment and wakes every waiter so that
 * the peers stop waiting for this rank. */
static void comm_fail(ccl_comm *c, DK_Status st, const char *msg) {
  pthread_mutex_lock(&c->mu);
  if (c->failed == DK_OK) {
    c->failed = st;
    copy_str(c->fail_msg, sizeof c->fail_msg, msg);
  }
  pthread_mutex_unlock(&c->mu);
  ccl_header *h = c->hdr;
  if (atomic_exchange(&h->abort_claim, 1u) != 0) return;
  h->abort_rank = c->rank;
  copy_str(h->abort_msg, sizeof h->abort_msg, msg);
  atomic_store_explicit(&h->abort_status, st, memory_order_release);
  for (int32_t j = 0; j < c->nranks; j++) {
    futex_wake_all(&c->ctl[j].seq.value);
    futex_wake_all(&c->ctl[j].bell.value);
  }
}

/* Work-side failure: fails the communicator and the running item. */
static DK_Status work_fail(ccl_comm *c, DK_Status st, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static DK_Status work_fail(ccl_comm *c, DK_Status st, const char *fmt, ...) {
  char msg[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  comm_fail(c, st, msg);
  return dks_work_fail(st, "%s", msg);
}

/* Whether another rank failed the communicator. */
static DK_Status peer_abort(const ccl_comm *c) {
  return atomic_load_explicit(&c->hdr->abort_status, memory_order_acquire);
}

static DK_Status abort_fail(ccl_comm *c, const char *fn) {
  return work_fail(c, peer_abort(c),
                   "%s: rank %d failed the communicator (this is rank %d of "
                   "%d): %s",
                   fn, (int)c->hdr->abort_rank, (int)c->rank, (int)c->nranks,
                   c->hdr->abort_msg);
}

/* Refuses work on a communicator that has failed, locally (DK_ABORTED) or
 * on a peer (the peer's status: this rank learns of the failure now). */
static DK_Status comm_check(ccl_comm *c, const char *fn) {
  char msg[1024];
  if (comm_failed(c, msg, sizeof msg) != DK_OK)
    return dks_work_fail(DK_ABORTED,
                         "%s: communicator %p (rank %d of %d) failed "
                         "earlier: %s",
                         fn, (void *)c, (int)c->rank, (int)c->nranks, msg);
  if (peer_abort(c) != DK_OK) return abort_fail(c, fn);
  return DK_OK;
}

/* Whether the watched process of rank j has exited (zombies included). */
static bool peer_dead(const ccl_comm *c, int32_t j) {
  pid_t pid = c->watch[j];
  if (pid <= 0) return false;
  if (kill(pid, 0) != 0 && errno == ESRCH) return true;
  char path[64], buf[512];
  snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return errno == ENOENT;
  ssize_t n = read(fd, buf, sizeof buf - 1);
  close(fd);
  if (n <= 0) return false;
  buf[n] = '\0';
  const char *paren = strrchr(buf, ')'); /* the name may contain ") " */
  return paren && paren[1] == ' ' && (paren[2] == 'Z' || paren[2] == 'X');
}

/* ======================================================================== */
/* Waiting                                                                   */
/* ======================================================================== */

static bool flag_reached(ccl_flag *f, uint32_t target) {
  return reached(atomic_load_explicit(&f->value, memory_order_acquire), target);
}

/* Publishes value (after the data it covers) and wakes sleepers. The
 * seq_cst store / sleepers load pairs with the waiter's sleepers increment /
 * value load: one of the two sides always sees the other. */
static void flag_post(ccl_flag *f, uint32_t value) {
  atomic_store(&f->value, value);
  if (atomic_load(&f->sleepers)) futex_wake_all(&f->value);
}

static void flag_ring(ccl_flag *f) {
  atomic_fetch_add(&f->value, 1u);
  if (atomic_load(&f->sleepers)) futex_wake_all(&f->value);
}

/* Waits until f reaches target (true) or the clock passes `until` (false).
 * With `spin`, first busy-waits, then yields, before sleeping. */
static bool wait_until(ccl_flag *f, uint32_t target, uint64_t until,
                       bool spin) {
  if (spin) {
    uint64_t start = dks_now_ns();
    for (unsigned i = 1;; i++) {
      if (flag_reached(f, target)) return true;
      if (i % 64 == 0) {
        uint64_t spent = dks_now_ns() - start;
        if (spent > YIELD_NS) break;
        if (spent > SPIN_NS) sched_yield();
      }
      dks_spin_pause();
    }
  }
  for (;;) {
    if (flag_reached(f, target)) return true;
    uint64_t now = dks_now_ns();
    if (now >= until) return false;
    atomic_fetch_add(&f->sleepers, 1u);
    uint32_t seen = atomic_load(&f->value);
    if (!reached(seen, target)) futex_wait(&f->value, seen, until - now);
    atomic_fetch_sub(&f->sleepers, 1u);
  }
}

/* Fails the collective running on c for want of step `target`. */
static DK_Status lagging_fail(ccl_comm *c, const char *fn, uint32_t target) {
  char ranks[512];
  size_t len = 0;
  for (int32_t j = 0; j < c->nranks; j++)
    if (!flag_reached(&c->ctl[j].seq, target))
      append(ranks, sizeof ranks, &len, "%s%d", len ? ", " : "", (int)j);
  if (!len) append(ranks, sizeof ranks, &len, "none");
  return work_fail(c, DK_DEADLINE_EXCEEDED,
                   "%s: rank(s) %s did not arrive within %g s "
                   "(DEVKIT_CCL_TIMEOUT) in collective #%u (this is rank %d "
                   "of %d)",
                   fn, ranks, c->timeout_s, (unsigned)c->coll, (int)c->rank,
                   (int)c->nranks);
}

/* Waits until rank j has taken step `target` of the running collective. */
static DK_Status wait_peer(ccl_comm *c, const char *fn, int32_t j,
                           uint32_t target, uint64_t deadline) {
  ccl_flag *f = &c->ctl[j].seq;
  for (bool spin = true;; spin = false) {
    if (wait_until(f, target, min_u64(deadline, dks_now_ns() + CHECK_NS), spin))
      return DK_OK;
    if (peer_abort(c) != DK_OK) return abort_fail(c, fn);
    if (peer_dead(c, j))
      return work_fail(c, DK_DEADLINE_EXCEEDED,
                       "%s: rank %d (pid %d) exited during collective #%u "
                       "(this is rank %d of %d)",
                       fn, (int)j, (int)c->watch[j], (unsigned)c->coll,
                       (int)c->rank, (int)c->nranks);
    if (dks_now_ns() >= deadline) return lagging_fail(c, fn, target);
  }
}

static DK_Status wait_all(ccl_comm *c, const char *fn, uint32_t target) {
  uint64_t deadline = dks_now_ns() + c->timeout_ns;
  for (int32_t j = 0; j < c->nranks; j++) {
    if (j == c->rank) continue;
    DK_Status st = wait_peer(c, fn, j, target, deadline);
    if (st != DK_OK) return st;
  }
  return DK_OK;
}

/* Takes this rank's next step. */
static void step(ccl_comm *c) { flag_post(&c->ctl[c->rank].seq, ++c->seq); }

/* ======================================================================== */
/* Collectives                                                               */
/* ======================================================================== */

/* A validated call. Buffers are host addresses, NULL where this rank does
 * not use them (broadcast send off the root, reduce recv off the root). */
typedef struct ccl_call {
  ccl_kind kind;
  DK_Comm comm;
  DK_Stream stream;
  uint8_t *send, *recv;
  size_t count;
  const dtype_info *dt;
  int32_t op;   /* reductions only, else 0 */
  int32_t root; /* broadcast / reduce root, send / recv peer, else 0 */
} ccl_call;

static ccl_desc desc_of(uint32_t coll, const ccl_call *k) {
  return (ccl_desc){.coll = coll, .kind = (uint32_t)k->kind,
                    .count = k->count, .dtype = k->dt->key, .op = k->op,
                    .root = k->root};
}

static void describe(char *buf, size_t size, const ccl_desc *d) {
  const dtype_info *dt = dtype_find(d->dtype);
  size_t len = 0;
  append(buf, size, &len, "%s(count %llu, %s",
         d->kind <= K_RECV ? k_kind_names[d->kind] : "?",
         (unsigned long long)d->count, dt ? dt->name : "?");
  if (d->kind == K_ALL_REDUCE || d->kind == K_REDUCE ||
      d->kind == K_REDUCE_SCATTER)
    append(buf, size, &len, ", %s",
           d->op >= 0 && d->op <= DK_REDUCE_AVG ? k_op_names[d->op] : "?");
  if (d->kind == K_BROADCAST || d->kind == K_REDUCE)
    append(buf, size, &len, ", root %d", (int)d->root);
  append(buf, size, &len, ")");
}

/* The opening barrier: publishes this rank's descriptor and checks the
 * peers'. After it, no rank still reads any buffer of the collective
 * before. */
static DK_Status hello(ccl_comm *c, const char *fn, const ccl_call *k) {
  uint32_t coll = c->coll++;
  ccl_desc mine = desc_of(coll, k);
  c->ctl[c->rank].desc[coll & 1] = mine;
  step(c);
  DK_Status st = wait_all(c, fn, c->seq);
  if (st != DK_OK) return st;
  for (int32_t j = 0; j < c->nranks; j++) {
    ccl_desc theirs = c->ctl[j].desc[coll & 1];
    if (memcmp(&theirs, &mine, sizeof mine) == 0) continue;
    char a[160], b[160];
    describe(a, sizeof a, &mine);
    describe(b, sizeof b, &theirs);
    return work_fail(c, DK_FAILED_PRECONDITION,
                     "%s: ranks issued different collectives as #%u: this "
                     "rank (%d of %d) issued %s, rank %d issued %s",
                     fn, (unsigned)c->coll, (int)c->rank, (int)c->nranks, a,
                     (int)j, b);
  }
  return DK_OK;
}

/* Elements of each rank's share of a chunk of len: a whole number of cache
 * lines, so ranks never write the same line. */
static size_t share_len(size_t len, int32_t n, size_t es) {
  size_t per_line = LINE / es;
  return round_up((len + (size_t)n - 1) / (size_t)n, per_line);
}

/* Elements per block slot when a chunk carries one slot per rank. */
static size_t block_len(const ccl_comm *c, size_t es) {
  size_t per_line = LINE / es, len = c->lay.buf / es / (size_t)c->nranks;
  return len >= per_line ? len / per_line * per_line : len;
}

/* all_reduce (to_all) and reduce: 3 steps per chunk (in, reduced, out). */
static DK_Status run_reduce(ccl_comm *c, const char *fn, const ccl_call *k,
                            bool to_all) {
  const dtype_info *dt = k->dt;
  size_t es = dt->size, chunk = c->lay.buf / es;
  int32_t n = c->nranks, me = c->rank;
  bool out = to_all || me == k->root;
  const uint8_t *srcs[MAX_RANKS];
  uint32_t base = c->seq;
  DK_Status st;
  for (size_t off = 0, i = 0; off < k->count; off += chunk, i++) {
    size_t len = min_size(chunk, k->count - off), b = i & 1;
    size_t sh = share_len(len, n, es);
    uint32_t t = base + (uint32_t)(3 * i);
    size_t lo = min_size((size_t)me * sh, len), hi = min_size(lo + sh, len);
    uint8_t *dst = !to_all && me == k->root ? k->recv + (off + lo) * es
                                             : res_buf(c, me, b);
    /* Peers read only the shares they reduce: this rank's own share is read
     * from send directly, unless it is the destination (reduce in place). */
    const uint8_t *own = k->send + (off + lo) * es;
    bool direct = own != dst;
    if (i >= 2 && (st = wait_all(c, fn, t - 3)) != DK_OK) return st;
    if (direct) {
      memcpy(in_buf(c, me, b), k->send + off * es, lo * es);
      memcpy(in_buf(c, me, b) + hi * es, k->send + (off + hi) * es,
             (len - hi) * es);
    } else {
      memcpy(in_buf(c, me, b), k->send + off * es, len * es);
    }
    step(c);
    if ((st = wait_all(c, fn, t + 1)) != DK_OK) return st;
    for (int32_t j = 0; j < n; j++) srcs[j] = in_buf(c, j, b) + lo * es;
    if (direct) srcs[me] = own;
#ifdef DEVKIT_DEFECT_DROP_RANK
    reduce_n(dst, srcs, n - 1, hi - lo, dt, k->op); /* the last rank is left out */
#else
    reduce_n(dst, srcs, n, hi - lo, dt, k->op);
#endif
    step(c);
    if (out) {
      uint64_t deadline = dks_now_ns() + c->timeout_ns;
      for (int32_t j = 0; j < n; j++) {
        if (!to_all && j == me) continue; /* the root's share is in place */
        if (j != me && (st = wait_peer(c, fn, j, t + 2, deadline)) != DK_OK)
          return st;
        size_t jlo = min_size((size_t)j * sh, len);
        size_t jhi = min_size(jlo + sh, len);
        memcpy(k->recv + (off + jlo) * es, res_buf(c, j, b), (jhi - jlo) * es);
      }
    }
    step(c);
  }
  return DK_OK;
}

/* broadcast: 2 steps per chunk (root's chunk in, chunk read). */
static DK_Status run_broadcast(ccl_comm *c, const char *fn, const ccl_call *k) {
  size_t es = k->dt->size, chunk = c->lay.buf / es;
  int32_t root = k->root;
  uint32_t base = c->seq;
  DK_Status st;
  for (size_t off = 0, i = 0; off < k->count; off += chunk, i++) {
    size_t len = min_size(chunk, k->count - off), b = i & 1;
    size_t at = off * es, bytes = len * es;
    uint32_t t = base + (uint32_t)(2 * i);
    if (c->rank == root) {
      if (i >= 2 && (st = wait_all(c, fn, t - 2)) != DK_OK) return st;
      memcpy(in_buf(c, root, b), k->send + at, bytes);
      step(c);
      if (k->recv != k->send) memcpy(k->recv + at, k->send + at, bytes);
    } else {
      step(c);
      st = wait_peer(c, fn, root, t + 1, dks_now_ns() + c->timeout_ns);
      if (st != DK_OK) return st;
      memcpy(k->recv + at, in_buf(c, root, b), bytes);
    }
    step(c);
  }
  return DK_OK;
}

/* all_gather: 2 steps per chunk (chunk in, peers' chunks read). */
static DK_Status run_all_gather(ccl_comm *c, const char *fn,
                                const ccl_call *k) {
  size_t es = k->dt->size, chunk = c->lay.buf / es, count = k->count;
  int32_t n = c->nranks, me = c->rank;
  uint32_t base = c->seq;
  DK_Status st;
  for (size_t off = 0, i = 0; off < count; off += chunk, i++) {
    size_t len = min_size(chunk, count - off), b = i & 1, bytes = len * es;
    uint32_t t = base + (uint32_t)(2 * i);
    if (i >= 2 && (st = wait_all(c, fn, t - 2)) != DK_OK) return st;
    memcpy(in_buf(c, me, b), k->send + off * es, bytes);
    step(c);
    uint8_t *mine = k->recv + ((size_t)me * count + off) * es;
    if (mine != k->send + off * es) memcpy(mine, k->send + off * es, bytes);
    uint64_t deadline = dks_now_ns() + c->timeout_ns;
    for (int32_t j = 0; j < n; j++) {
      if (j == me) continue;
      if ((st = wait_peer(c, fn, j, t + 1, deadline)) != DK_OK) return st;
      memcpy(k->recv + ((size_t)j * count + off) * es, in_buf(c, j, b), bytes);
    }
    step(c);
  }
  return DK_OK;
}

/* reduce_scatter and all_to_all: each chunk carries one slot per rank;
 * 2 steps per chunk (slots in, slots read). */
static DK_Status run_blocks(ccl_comm *c, const char *fn, const ccl_call *k,
                            bool reduce) {
  const dtype_info *dt = k->dt;
  size_t es = dt->size, blk = block_len(c, es), count = k->count;
  int32_t n = c->nranks, me = c->rank;
  const uint8_t *srcs[MAX_RANKS];
  uint32_t base = c->seq;
  DK_Status st;
  for (size_t off = 0, i = 0; off < count; off += blk, i++) {
    size_t len = min_size(blk, count - off), b = i & 1, bytes = len * es;
    uint32_t t = base + (uint32_t)(2 * i);
    /* This rank's own block is read from send directly (copied straight
     * across for all_to_all), unless it is the destination (in place). */
    const uint8_t *own = k->send + ((size_t)me * count + off) * es;
    bool direct = !reduce || own != k->recv + off * es;
    if (i >= 2 && (st = wait_all(c, fn, t - 2)) != DK_OK) return st;
    for (int32_t j = 0; j < n; j++) {
      if (j == me && direct) continue;
      memcpy(in_buf(c, me, b) + (size_t)j * blk * es,
             k->send + ((size_t)j * count + off) * es, bytes);
    }
    step(c);
    if (reduce) {
      if ((st = wait_all(c, fn, t + 1)) != DK_OK) return st;
      for (int32_t j = 0; j < n; j++)
        srcs[j] = in_buf(c, j, b) + (size_t)me * blk * es;
      if (direct) srcs[me] = own;
      reduce_n(k->recv + off * es, srcs, n, len, dt, k->op);
    } else {
      size_t own = ((size_t)me * count + off) * es;
      if (k->recv != k->send) memcpy(k->recv + own, k->send + own, bytes);
      uint64_t deadline = dks_now_ns() + c->timeout_ns;
      for (int32_t j = 0; j < n; j++) {
        if (j == me) continue;
        if ((st = wait_peer(c, fn, j, t + 1, deadline)) != DK_OK) return st;
        memcpy(k->recv + ((size_t)j * count + off) * es,
               in_buf(c, j, b) + (size_t)me * blk * es, bytes);
      }
    }
    step(c);
  }
  return DK_OK;
}

typedef struct coll_args {
  pending_node node;
  ccl_comm *c;
  ccl_call call;
} coll_args;

static void run_coll(void *arg) {
  coll_args *a = arg;
  ccl_comm *c = a->c;
  const ccl_call *k = &a->call;
  const char *fn = k_kind_names[k->kind];
  pthread_mutex_lock(&c->exec_mu);
  DK_Status st = comm_check(c, fn);
  if (st == DK_OK) st = hello(c, fn, k);
  if (st == DK_OK && k->count) {
    switch (k->kind) {
      case K_ALL_REDUCE: run_reduce(c, fn, k, true); break;
      case K_REDUCE: run_reduce(c, fn, k, false); break;
      case K_BROADCAST: run_broadcast(c, fn, k); break;
      case K_ALL_GATHER: run_all_gather(c, fn, k); break;
      case K_REDUCE_SCATTER: run_blocks(c, fn, k, true); break;
      case K_ALL_TO_ALL: run_blocks(c, fn, k, false); break;
      case K_SEND: case K_RECV: break; /* p2p runs as run_p2p */
    }
  }
  pthread_mutex_unlock(&c->exec_mu);
}

static void destroy_coll(void *arg) {
  coll_args *a = arg;
  comm_unpend(a->c, &a->node);
}

/* ======================================================================== */
/* Point-to-point                                                            */
/* ======================================================================== */

typedef struct p2p_op {
  pending_node node;
  ccl_comm *c;
  bool is_send;
  int32_t peer;
  uint8_t *buf;
  size_t bytes, done;
  bool over; /* done, or failed */
} p2p_op;

typedef struct p2p_args {
  size_t n;
  p2p_op ops[];
} p2p_args;

/* The first failure among several, with its message saved before later
 * failures overwrite the thread's error buffer. */
typedef struct first_error {
  DK_Status st;
  char msg[1024];
} first_error;

static void note(first_error *f, DK_Status st) {
  if (st == DK_OK || f->st != DK_OK) return;
  f->st = st;
  copy_str(f->msg, sizeof f->msg, dks_last_error());
}

static const char *p2p_fn(const p2p_op *o) {
  return k_kind_names[o->is_send ? K_SEND : K_RECV];
}

/* Ends every unfinished op of c: the communicator has failed. */
static void p2p_end_comm(p2p_args *a, const ccl_comm *c) {
  for (size_t i = 0; i < a->n; i++)
    if (a->ops[i].c == c) a->ops[i].over = true;
}

/* Moves what the channel allows and sets *moved. Fails on a message whose
 * size differs from the recv's. */
static DK_Status p2p_progress(p2p_op *o, bool *moved) {
  ccl_comm *c = o->c;
  int32_t me = c->rank, p = o->peer;
  size_t n = (size_t)c->nranks;
  *moved = false;
  if (o->is_send) {
    ccl_chan *ch = &c->chan[(size_t)me * n + (size_t)p];
    uint32_t sent = atomic_load_explicit(&ch->sent, memory_order_relaxed);
    uint32_t taken = atomic_load_explicit(&ch->taken, memory_order_acquire);
    while (o->done < o->bytes && sent - taken < CHAN_SLOTS) {
      size_t len = min_size(c->lay.slot, o->bytes - o->done);
      memcpy(chan_slot(c, me, p, sent), o->buf + o->done, len);
      ch->msg_bytes[sent % CHAN_SLOTS] = o->bytes;
      o->done += len;
      atomic_store_explicit(&ch->sent, ++sent, memory_order_release);
      *moved = true;
    }
  } else {
    ccl_chan *ch = &c->chan[(size_t)p * n + (size_t)me];
    uint32_t taken = atomic_load_explicit(&ch->taken, memory_order_relaxed);
    uint32_t sent = atomic_load_explicit(&ch->sent, memory_order_acquire);
    while (o->done < o->bytes && taken != sent) {
      uint64_t msg_bytes = ch->msg_bytes[taken % CHAN_SLOTS];
      if (msg_bytes != o->bytes)
        return work_fail(c, DK_INVALID_ARGUMENT,
                         "recv: rank %d sent a message of %llu bytes but "
                         "this recv from it expects %zu bytes (this is rank "
                         "%d of %d)",
                         (int)p, (unsigned long long)msg_bytes, o->bytes,
                         (int)me, (int)c->nranks);
      size_t len = min_size(c->lay.slot, o->bytes - o->done);
      memcpy(o->buf + o->done, chan_slot(c, p, me, taken), len);
      o->done += len;
      atomic_store_explicit(&ch->taken, ++taken, memory_order_release);
      *moved = true;
    }
  }
  /* The peer reads its bell before the counters, so it either sees the
   * counter or sleeps on a bell value this increment changes. */
  if (*moved) flag_ring(&c->ctl[p].bell);
  if (o->done == o->bytes) o->over = true;
  return DK_OK;
}

/* Whether an earlier unfinished op of the batch uses o's channel (messages
 * on a channel match in issue order). */
static bool p2p_queued(const p2p_args *a, size_t i) {
  const p2p_op *o = &a->ops[i];
  for (size_t j = 0; j < i; j++) {
    const p2p_op *e = &a->ops[j];
    if (!e->over && e->c == o->c && e->peer == o->peer &&
        e->is_send == o->is_send)
      return true;
  }
  return false;
}

/* Fails c's unfinished ops at the batch deadline. */
static DK_Status p2p_timeout(const p2p_args *a, ccl_comm *c) {
  char ranks[512];
  size_t len = 0;
  const char *fn = NULL;
  for (size_t i = 0; i < a->n; i++) {
    const p2p_op *o = &a->ops[i];
    if (o->over || o->c != c) continue;
    if (!fn) fn = p2p_fn(o);
    append(ranks, sizeof ranks, &len, "%s%d (%s %zu of %zu bytes)",
           len ? ", " : "", (int)o->peer, o->is_send ? "sent" : "received",
           o->done, o->bytes);
  }
  return work_fail(c, DK_DEADLINE_EXCEEDED,
                   "%s: no progress with peer rank(s) %s within %g s "
                   "(DEVKIT_CCL_TIMEOUT; this is rank %d of %d)",
                   fn, ranks, c->timeout_s, (int)c->rank, (int)c->nranks);
}

/* Checks the communicators of a stalled batch: fails, and ends the ops of,
 * any that a peer aborted, that lost a peer, or (when `expired`) that is
 * still unfinished at the deadline. */
static void p2p_check(p2p_args *a, bool expired, first_error *fe) {
  for (size_t i = 0; i < a->n; i++) {
    p2p_op *o = &a->ops[i];
    if (o->over) continue;
    ccl_comm *c = o->c;
    DK_Status st = DK_OK;
    if (peer_abort(c) != DK_OK)
      st = abort_fail(c, p2p_fn(o));
    else if (peer_dead(c, o->peer))
      st = work_fail(c, DK_DEADLINE_EXCEEDED,
                     "%s: peer rank %d (pid %d) exited before the transfer "
                     "completed (%zu of %zu bytes; this is rank %d of %d)",
                     p2p_fn(o), (int)o->peer, (int)c->watch[o->peer], o->done,
                     o->bytes, (int)c->rank, (int)c->nranks);
    else if (expired)
      st = p2p_timeout(a, c);
    if (st == DK_OK) continue;
    p2p_end_comm(a, c);
    note(fe, st);
  }
}

/* The ops' communicators, each once, in address order (the lock order). */
static size_t p2p_comms(const p2p_args *a, ccl_comm **out) {
  size_t m = 0;
  for (ccl_comm *last = NULL;;) {
    ccl_comm *next = NULL;
    for (size_t i = 0; i < a->n; i++) {
      ccl_comm *c = a->ops[i].c;
      if ((!last || (uintptr_t)c > (uintptr_t)last) &&
          (!next || (uintptr_t)c < (uintptr_t)next))
        next = c;
    }
    if (!next) return m;
    out[m++] = last = next;
  }
}

/* Progresses every op of the batch until each is done or failed. Stalls
 * sleep on this rank's bell of one communicator (rotating, with a short
 * slice, when the batch spans several); the deadline restarts whenever
 * anything moves. */
static void run_p2p(void *arg) {
  p2p_args *a = arg;
  first_error fe = {DK_OK, ""};
  ccl_comm **comms = malloc(a->n * sizeof *comms);
  if (!comms) {
    dks_work_fail(DK_RESOURCE_EXHAUSTED,
                  "%s: host out of memory running %zu send/recv calls",
                  p2p_fn(&a->ops[0]), a->n);
    return;
  }
  size_t nc = p2p_comms(a, comms);
  uint64_t timeout = 0;
  for (size_t i = 0; i < nc; i++) {
    pthread_mutex_lock(&comms[i]->exec_mu);
    if (comms[i]->timeout_ns > timeout) timeout = comms[i]->timeout_ns;
  }
  for (size_t i = 0; i < nc; i++) {
    DK_Status st = comm_check(comms[i], "send/recv");
    if (st != DK_OK) p2p_end_comm(a, comms[i]);
    note(&fe, st);
  }

  uint64_t deadline = dks_now_ns() + timeout;
  bool spin = true;
  for (size_t turn = 0;; turn++) {
    /* The bell is read before the scan: progress a peer makes after the
     * scan looked at its channel rings it. */
    ccl_comm *wait_c = NULL;
    uint32_t bell = 0;
    for (size_t i = 0; i < a->n && !wait_c; i++) {
      const p2p_op *o = &a->ops[(i + turn) % a->n];
      if (o->over) continue;
      wait_c = o->c;
      bell = atomic_load(&wait_c->ctl[wait_c->rank].bell.value);
    }
    if (!wait_c) break; /* every op is over */
    bool any = false;
    for (size_t i = 0; i < a->n; i++) {
      p2p_op *o = &a->ops[i];
      bool moved;
      if (o->over || p2p_queued(a, i)) continue;
      DK_Status st = p2p_progress(o, &moved);
      any = any || moved;
      if (st == DK_OK) continue;
      p2p_end_comm(a, o->c);
      note(&fe, st);
    }
    uint64_t now = dks_now_ns();
    if (any) {
      deadline = now + timeout;
      spin = true;
      continue;
    }
    uint64_t slice = nc > 1 ? 1000000u : CHECK_NS;
    if (wait_until(&wait_c->ctl[wait_c->rank].bell, bell + 1,
                   min_u64(deadline, now + slice), spin))
      continue;
    spin = false;
    p2p_check(a, dks_now_ns() >= deadline, &fe);
  }
  for (size_t i = nc; i-- > 0;) pthread_mutex_unlock(&comms[i]->exec_mu);
  free(comms);
  if (fe.st != DK_OK) dks_work_fail(fe.st, "%s", fe.msg);
}

static void destroy_p2p(void *arg) {
  p2p_args *a = arg;
  for (size_t i = 0; i < a->n; i++) comm_unpend(a->ops[i].c, &a->ops[i].node);
}

/* ======================================================================== */
/* Unique ids and communicator setup                                         */
/* ======================================================================== */

DK_Status cpu_ccl_unique_id_size(size_t *size) {
  if (!size)
    return dks_set_error(DK_INVALID_ARGUMENT, "ccl_unique_id_size: size is NULL");
  *size = ID_SIZE;
  return DK_OK;
}

/* A job id is 1 to ID_JOB_MAX lowercase hex digits: it goes into file names. */
static bool valid_job_id(const char *job, size_t len) {
  if (len < 1 || len > ID_JOB_MAX) return false;
  for (size_t i = 0; i < len; i++)
    if (!((job[i] >= '0' && job[i] <= '9') || (job[i] >= 'a' && job[i] <= 'f')))
      return false;
  return true;
}

/* Layout: magic[8] | version (u32 little-endian) | 4 zero bytes | 16 random
 * bytes | the job id (DEVKIT_JOB_ID, zero-padded to 16 bytes) | 16 zero
 * bytes. The job id travels in the id so that every rank names the segment
 * alike, whatever its own environment. */
DK_Status cpu_ccl_get_unique_id(void *id, size_t size) {
  static const char fn[] = "ccl_get_unique_id";
  if (!id) return dks_set_error(DK_INVALID_ARGUMENT, "%s: id is NULL", fn);
  if (size != ID_SIZE)
    return dks_set_error(DK_INVALID_ARGUMENT,
                         "%s: size is %zu, expected %d (ccl_unique_id_size)",
                         fn, size, ID_SIZE);
  uint8_t buf[ID_SIZE] = {0};
  memcpy(buf, k_id_magic, sizeof k_id_magic);
  buf[8] = ID_VERSION;
  const char *job = getenv("DEVKIT_JOB_ID");
  if (job && *job) {
    if (!valid_job_id(job, strlen(job)))
      return dks_set_error(DK_INVALID_ARGUMENT,
                           "%s: DEVKIT_JOB_ID=\"%s\" is invalid: expected 1 to "
                           "%d lowercase hex digits (devkit-run sets it)",
                           fn, job, ID_JOB_MAX);
    memcpy(buf + ID_JOB, job, strlen(job));
  }
  for (size_t got = 0; got < 16;) {
    ssize_t n = getrandom(buf + 16 + got, 16 - got, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0)
      return dks_set_error(DK_UNAVAILABLE, "%s: getrandom failed: %s", fn,
                           strerror(errno));
    got += (size_t)n;
  }
  memcpy(id, buf, sizeof buf);
  return DK_OK;
}

static DK_Status check_id(const char *fn, const uint8_t *id, size_t size) {
  if (!id) return dks_set_error(DK_INVALID_ARGUMENT, "%s: id is NULL", fn);
  if (size != ID_SIZE)
    return dks_set_error(DK_INVALID_ARGUMENT,
                         "%s: id_size is %zu, expected %d (ccl_unique_id_size)",
                         fn, size, ID_SIZE);
  if (memcmp(id, k_id_magic, sizeof k_id_magic) != 0)
    return dks_set_error(DK_INVALID_ARGUMENT,
                         "%s: id was not made by ccl_get_unique_id of the cpu "
                         "plugin (bad magic)",
                         fn);
  uint32_t version = (uint32_t)id[8] | (uint32_t)id[9] << 8 |
                     (uint32_t)id[10] << 16 | (uint32_t)id[11] << 24;
  if (version != ID_VERSION)
    return dks_set_error(DK_INVALID_ARGUMENT,
                         "%s: id has version %u, this plugin reads version %d",
                         fn, (unsigned)version, ID_VERSION);
  size_t job_len = strnlen((const char *)id + ID_JOB, ID_JOB_MAX);
  if (job_len && !valid_job_id((const char *)id + ID_JOB, job_len))
    return dks_set_error(DK_INVALID_ARGUMENT,
                         "%s: the id's job id is not hex digits (corrupt id)",
                         fn);
  for (size_t i = 12; i < ID_SIZE; i++)
    if ((i < 16 || i >= ID_JOB + job_len) && id[i] != 0)
      return dks_set_error(DK_INVALID_ARGUMENT,
                           "%s: id byte %zu is %u, must be 0 (corrupt id)", fn,
                           i, (unsigned)id[i]);
  return DK_OK;
}

static DK_Status read_timeout(const char *fn, double *out) {
  const char *s = getenv("DEVKIT_CCL_TIMEOUT");
  *out = DEFAULT_TIMEOUT_S;
  if (!s || !*s) return DK_OK;
  char *end;
  double v = strtod(s, &end);
  if (end == s || *end != '\0' || !(v > 0 && v <= 1e9))
    return dks_set_error(DK_INVALID_ARGUMENT,
                         "%s: DEVKIT_CCL_TIMEOUT=\"%s\" is invalid: expected "
                         "a number of seconds in (0, 1e9]",
                         fn, s);
  *out = v;
  return DK_OK;
}

static void sleep_ms(long ms) {
  struct timespec ts = {0, ms * 1000000L};
  nanosleep(&ts, NULL);
}

/* Creates or opens and maps the segment `name` for c (nranks, layout set).
 * Only the creator sizes and initialises it; the others wait for that. */
static DK_Status seg_attach(const char *fn, ccl_comm *c, const char *name,
                            uint64_t deadline) {
  const ccl_layout *lay = &c->lay;
  int fd;
  bool created = false;
  for (;;) {
    fd = shm_open(name, O_RDWR | O_CREAT | O_EXCL, 0600);
    if (fd >= 0) {
      created = true;
      break;
    }
    if (errno != EEXIST) break;
    fd = shm_open(name, O_RDWR, 0);
    if (fd >= 0 || errno != ENOENT) break;
    /* Unlinked in between (the previous users of this id all joined). */
  }
  if (fd < 0)
    return dks_set_error(DK_UNAVAILABLE,
                         "%s: cannot open shared memory segment %s: %s", fn,
                         name, strerror(errno));

  DK_Status st = DK_OK;
  void *p = MAP_FAILED;
  if (created) {
    /* ftruncate sets the size in one step (joiners see 0 or all of it);
     * fallocate reserves the pages, so a full /dev/shm fails here instead of
     * raising SIGBUS on first touch. */
    int rc = ftruncate(fd, (off_t)lay->size) == 0 ? 0 : errno;
    if (rc == 0) rc = posix_fallocate(fd, 0, (off_t)lay->size);
    if (rc == 0) {
      p = mmap(NULL, lay->size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
      if (p == MAP_FAILED) rc = errno;
    }
    if (rc != 0) {
      shm_unlink(name);
      st = dks_set_error(DK_RESOURCE_EXHAUSTED,
                         "%s: cannot reserve %zu bytes of shared memory for "
                         "%d ranks (segment %s): %s",
                         fn, lay->size, (int)c->nranks, name, strerror(rc));
    } else {
      ccl_header *h = p;
      h->version = SEG_VERSION;
      h->nranks = c->nranks;
      h->size = lay->size;
      atomic_store_explicit(&h->ready, SEG_READY, memory_order_release);
    }
    close(fd);
    c->base = st == DK_OK ? p : NULL;
    return st;
  }

  struct stat sb;
  int rc;
  while ((rc = fstat(fd, &sb)) == 0 && sb.st_size == 0 && dks_now_ns() < deadline)
    sleep_ms(1);
  if (rc != 0) {
    rc = errno;
    close(fd);
    return dks_set_error(DK_UNAVAILABLE, "%s: cannot stat segment %s: %s", fn,
                         name, strerror(rc));
  }
  if ((size_t)sb.st_size < sizeof(ccl_header)) {
    shm_unlink(name); /* its creator is gone */
    close(fd);
    return dks_set_error(DK_DEADLINE_EXCEEDED,
                         "%s: shared memory segment %s was never set up by "
                         "the rank that created it (waited %g s, "
                         "DEVKIT_CCL_TIMEOUT)",
                         fn, name, c->timeout_s);
  }
  size_t size = (size_t)sb.st_size;
  p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  int err = errno;
  close(fd);
  if (p == MAP_FAILED)
    return dks_set_error(DK_UNAVAILABLE, "%s: cannot map segment %s: %s", fn,
                         name, strerror(err));
  ccl_header *h = p;
  while (atomic_load_explicit(&h->ready, memory_order_acquire) != SEG_READY &&
         dks_now_ns() < deadline)
    sleep_ms(1);
  if (atomic_load_explicit(&h->ready, memory_order_acquire) != SEG_READY) {
    shm_unlink(name);
    st = dks_set_error(DK_DEADLINE_EXCEEDED,
                       "%s: shared memory segment %s was never initialised "
                       "by the rank that created it (waited %g s, "
                       "DEVKIT_CCL_TIMEOUT)",
                       fn, name, c->timeout_s);
  } else if (h->version != SEG_VERSION) {
    st = dks_set_error(DK_FAILED_PRECONDITION,
                       "%s: segment %s has layout version %u, this plugin "
                       "uses %d (ranks run different plugin builds)",
                       fn, name, (unsigned)h->version, SEG_VERSION);
  } else if (h->nranks != c->nranks) {
    st = dks_set_error(DK_INVALID_ARGUMENT,
                       "%s: nranks is %d, but the rank that created this "
                       "id's communicator passed %d",
                       fn, (int)c->nranks, (int)h->nranks);
  } else if (h->size != lay->size || size != lay->size) {
    st = dks_set_error(DK_FAILED_PRECONDITION,
                       "%s: segment %s is %zu bytes, this plugin expects %zu "
                       "for %d ranks (ranks run different plugin builds)",
                       fn, name, size, lay->size, (int)c->nranks);
  }
  if (st != DK_OK) {
    munmap(p, size);
    return st;
  }
  c->base = p;
  return DK_OK;
}

/* Claims this rank's slot and waits for all ranks. Exactly one outcome wins
 * the join word: the last rank's increment or a timed-out rank's close. */
static DK_Status seg_join(const char *fn, ccl_comm *c, const char *name,
                          uint64_t deadline) {
  ccl_header *h = c->hdr;
  ccl_rank_ctl *me = &c->ctl[c->rank];
  uint32_t n = (uint32_t)c->nranks;
  unsigned unclaimed = 0;
  if (!atomic_compare_exchange_strong(&me->claimed, &unclaimed, 1u))
    return dks_set_error(DK_INVALID_ARGUMENT,
                         "%s: rank %d of this id was already joined by pid %d",
                         fn, (int)c->rank, (int)atomic_load(&me->pid));
  atomic_store(&me->pid, (int)getpid());

  ccl_flag *join = &h->join;
  uint32_t j = atomic_load(&join->value);
  do {
    if (j & JOIN_CLOSED) break;
  } while (!atomic_compare_exchange_weak(&join->value, &j, j + 1));
  for (bool spin = true; !(j & JOIN_CLOSED); spin = false) {
    j = atomic_load(&join->value);
    if (j == n) {
      /* Everyone has mapped the segment: nothing needs the name now. Every
       * rank unlinks, so that one dying here leaves nothing behind. */
      shm_unlink(name);
      if (atomic_load(&join->sleepers)) futex_wake_all(&join->value);
      return DK_OK;
    }
    uint64_t now = dks_now_ns();
    if (now < deadline) {
      wait_until(join, j + 1, min_u64(deadline, now + CHECK_NS), spin);
      continue;
    }
    if (atomic_compare_exchange_strong(&join->value, &j, j | JOIN_CLOSED)) {
      shm_unlink(name);
      futex_wake_all(&join->value);
      char ranks[512];
      size_t len = 0;
      for (int32_t r = 0; r < c->nranks; r++)
        if (!atomic_load(&c->ctl[r].claimed))
          append(ranks, sizeof ranks, &len, "%s%d", len ? ", " : "", (int)r);
      return dks_set_error(DK_DEADLINE_EXCEEDED,
                           "%s: rank(s) %s of %d did not join within %g s "
                           "(DEVKIT_CCL_TIMEOUT; this is rank %d)",
                           fn, ranks, (int)c->nranks, c->timeout_s,
                           (int)c->rank);
    }
  }
  return dks_set_error(DK_DEADLINE_EXCEEDED,
                       "%s: another rank gave up waiting for all %d ranks to "
                       "join within its DEVKIT_CCL_TIMEOUT (this is rank %d)",
                       fn, (int)c->nranks, (int)c->rank);
}

static void comm_free(ccl_comm *c) {
  if (c->base) munmap(c->base, c->lay.size);
  pthread_cond_destroy(&c->cv);
  pthread_mutex_destroy(&c->mu);
  pthread_mutex_destroy(&c->exec_mu);
  free(c);
}

DK_Status cpu_ccl_comm_init(int32_t dev, int32_t nranks, const void *id,
                            size_t id_size, int32_t rank, DK_Comm *comm) {
  static const char fn[] = "ccl_comm_init";
  dks_device *d;
  double timeout;
  DK_Status st = dks_device_get(fn, dev, &d);
  if (st != DK_OK) return st;
  if (!comm) return dks_set_error(DK_INVALID_ARGUMENT, "%s: comm is NULL", fn);
  if ((st = check_id(fn, id, id_size)) != DK_OK) return st;
  if (nranks < 1 || nranks > MAX_RANKS)
    return dks_set_error(DK_INVALID_ARGUMENT,
                         "%s: nranks %d out of range [1, %d]", fn, (int)nranks,
                         MAX_RANKS);
  if (rank < 0 || rank >= nranks)
    return dks_set_error(DK_INVALID_ARGUMENT,
                         "%s: rank %d out of range [0, %d)", fn, (int)rank,
                         (int)nranks);
  if ((st = read_timeout(fn, &timeout)) != DK_OK) return st;

  ccl_comm *c = calloc(1, sizeof *c + (size_t)nranks * sizeof c->watch[0]);
  if (!c) return dks_set_error(DK_RESOURCE_EXHAUSTED, "%s: host out of memory", fn);
  c->rank = rank;
  c->nranks = nranks;
  c->device = d;
  c->timeout_s = timeout;
  c->timeout_ns = (uint64_t)(timeout * 1e9);
  c->lay = layout_for(nranks);
  c->pending.prev = c->pending.next = &c->pending;
  pthread_mutex_init(&c->exec_mu, NULL);
  pthread_mutex_init(&c->mu, NULL);
  pthread_cond_init(&c->cv, NULL);
  pthread_mutex_lock(&g_comms_mu);
  bool ok = dks_table_insert(&g_comms, (uintptr_t)c, 0);
  pthread_mutex_unlock(&g_comms_mu);
  if (!ok) {
    comm_free(c);
    return dks_set_error(DK_RESOURCE_EXHAUSTED, "%s: host out of memory", fn);
  }

  const uint8_t *bytes = id;
  char name[64];
  int len = snprintf(name, sizeof name, "/devkit-ccl-");
  size_t job_len = strnlen((const char *)bytes + ID_JOB, ID_JOB_MAX);
  if (job_len)
    len += snprintf(name + len, sizeof name - (size_t)len, "%.*s-",
                    (int)job_len, (const char *)bytes + ID_JOB);
  for (int i = 16; i < 32; i++)
    len += snprintf(name + len, sizeof name - (size_t)len, "%02x", bytes[i]);

  uint64_t deadline = dks_now_ns() + c->timeout_ns;
  st = seg_attach(fn, c, name, deadline);
  if (st == DK_OK) {
    c->hdr = (ccl_header *)c->base;
    c->ctl = (ccl_rank_ctl *)(c->base + c->lay.ctl);
    c->chan = (ccl_chan *)(c->base + c->lay.chan);
    st = seg_join(fn, c, name, deadline);
  }
  if (st != DK_OK) {
    pthread_mutex_lock(&g_comms_mu);
    dks_table_remove(&g_comms, (uintptr_t)c, NULL);
    pthread_mutex_unlock(&g_comms_mu);
    comm_free(c);
    return st;
  }
  /* Watch peer processes that this process can see (not itself: a rank in
   * another thread of this process cannot die alone). */
  pid_t self = getpid();
  for (int32_t j = 0; j < nranks; j++) {
    pid_t pid = atomic_load(&c->ctl[j].pid);
    if (pid != self && (kill(pid, 0) == 0 || errno == EPERM)) c->watch[j] = pid;
  }
  *comm = (DK_Comm)c;
  return DK_OK;
}

DK_Status cpu_ccl_comm_destroy(DK_Comm comm) {
  static const char fn[] = "ccl_comm_destroy";
  if (!comm) return DK_OK;
  ccl_comm *c = (ccl_comm *)comm;
  dks_stream *self = dks_stream_current();
  bool waits_on_self = false;
  pthread_mutex_lock(&g_comms_mu);
  bool live = dks_table_find(&g_comms, (uintptr_t)c, NULL);
  if (live && self) {
    pthread_mutex_lock(&c->mu);
    for (pending_node *n = c->pending.next; n != &c->pending; n = n->next)
      if (n->stream == self) waits_on_self = true;
    pthread_mutex_unlock(&c->mu);
  }
  if (live && !waits_on_self) dks_table_remove(&g_comms, (uintptr_t)c, NULL);
  pthread_mutex_unlock(&g_comms_mu);
  if (!live)
    return dks_set_error(DK_INVALID_ARGUMENT,
                         "%s: comm %p is not a live communicator", fn,
                         (void *)comm);
  if (waits_on_self)
    return dks_set_error(DK_FAILED_PRECONDITION,
                         "%s: called from a callback running on stream %p, "
                         "which has work of this communicator queued and "
                         "would wait for itself",
                         fn, (void *)self);
  /* Unregistered: no new pins. Wait for calls in flight and queued work. */
  pthread_mutex_lock(&c->mu);
  while (c->pins > 0 || c->pending.next != &c->pending)
    pthread_cond_wait(&c->cv, &c->mu);
  pthread_mutex_unlock(&c->mu);
  comm_free(c);
  return DK_OK;
}

/* ======================================================================== */
/* Calls: validation, groups, submission                                     */
/* ======================================================================== */

/* A call with its communicator and stream pinned. */
typedef struct pinned_call {
  ccl_call call;
  ccl_comm *c;
  dks_stream *s;
} pinned_call;

static bool is_p2p(ccl_kind kind) { return kind == K_SEND || kind == K_RECV; }

static void unpin(pinned_call *p, size_t n) {
  for (size_t i = 0; i < n; i++) {
    dks_stream_release(p[i].s);
    comm_release(p[i].c);
  }
}

/* Pins a communicator and a stream of its device. */
static DK_Status pin(const char *fn, DK_Comm comm, DK_Stream stream,
                     pinned_call *p) {
  DK_Status st = comm_acquire(fn, comm, &p->c);
  if (st != DK_OK) return st;
  if ((st = dks_stream_acquire(fn, p->c->device, stream, &p->s)) != DK_OK)
    comm_release(p->c);
  return st;
}

/* One work item of an issue: a collective, or a batch of p2p calls. */
typedef struct plan_item {
  dks_stream *s;
  bool batch;
  size_t nops; /* p2p calls of a batch */
  void *arg;   /* the work item */
} plan_item;

/* Builds and submits the work for pinned calls, in order: each collective
 * is one item; consecutive p2p calls on one stream (up to the next
 * collective) become one item that progresses them together. Queued items
 * are submitted first, then default-stream ones run here. Everything is
 * allocated before anything is submitted, so a failure issues nothing. */
static DK_Status issue(const char *fn, pinned_call *p, size_t n) {
  plan_item *items = calloc(n, sizeof *items);
  size_t *item_of = calloc(n, sizeof *item_of); /* per call, its item */
  size_t *open = calloc(n, sizeof *open);       /* open batches' items */
  size_t nitems = 0, nopen = 0;
  bool ok = items && item_of && open;
  for (size_t i = 0; ok && i < n; i++) {
    if (!is_p2p(p[i].call.kind)) {
      nopen = 0; /* a collective closes the batches before it */
      items[nitems] = (plan_item){.s = p[i].s};
      item_of[i] = nitems++;
      continue;
    }
    size_t b = 0;
    while (b < nopen && items[open[b]].s != p[i].s) b++;
    if (b == nopen) {
      items[nitems] = (plan_item){.s = p[i].s, .batch = true};
      open[nopen++] = nitems++;
    }
    item_of[i] = open[b];
    items[open[b]].nops++;
  }
  for (size_t i = 0; ok && i < nitems; i++) {
    plan_item *it = &items[i];
    it->arg = it->batch ? dks_work_new(sizeof(p2p_args) +
                                           it->nops * sizeof(p2p_op),
                                       run_p2p, destroy_p2p)
                        : dks_work_new(sizeof(coll_args), run_coll,
                                       destroy_coll);
    ok = it->arg != NULL;
  }
  if (!ok) {
    for (size_t i = 0; items && i < nitems; i++)
      if (items[i].arg) dks_work_discard(items[i].arg);
    free(open);
    free(item_of);
    free(items);
    return dks_set_error(DK_RESOURCE_EXHAUSTED,
                         "%s: host out of memory queuing %zu call(s)", fn, n);
  }

  for (size_t i = 0; i < n; i++) {
    plan_item *it = &items[item_of[i]];
    const ccl_call *k = &p[i].call;
    if (!it->batch) {
      coll_args *a = it->arg;
      a->c = p[i].c;
      a->call = *k;
      comm_pend(a->c, &a->node, it->s);
      continue;
    }
    p2p_args *a = it->arg;
    p2p_op *o = &a->ops[a->n++];
    bool is_send = k->kind == K_SEND;
    size_t bytes = k->count * k->dt->size;
    *o = (p2p_op){.c = p[i].c, .is_send = is_send, .peer = k->root,
                  .buf = is_send ? k->send : k->recv, .bytes = bytes,
                  .over = bytes == 0};
    comm_pend(o->c, &o->node, it->s);
  }

  first_error fe = {DK_OK, ""};
  for (size_t i = 0; i < nitems; i++)
    if (items[i].s) dks_work_submit(items[i].s, items[i].arg);
  for (size_t i = 0; i < nitems; i++)
    if (!items[i].s) note(&fe, dks_work_submit(NULL, items[i].arg));
  free(open);
  free(item_of);
  free(items);
  return fe.st == DK_OK ? DK_OK : dks_set_error(fe.st, "%s", fe.msg);
}

/* A call as the API received it. */
typedef struct raw_call {
  ccl_kind kind;
  DK_Comm comm;
  DK_Mem send, recv;
  size_t send_offset, recv_offset, count;
  DK_DTypeKey dtype;
  int32_t op, root;
  DK_Stream stream;
} raw_call;

static bool overlap(const uint8_t *a, size_t an, const uint8_t *b, size_t bn) {
  uintptr_t x = (uintptr_t)a, y = (uintptr_t)b;
  return an && bn && x < y + bn && y < x + an;
}

/* Validates everything but the handles' liveness (pinned by the caller)
 * and fills *k. */
static DK_Status check_call(const char *fn, const ccl_comm *c,
                            const raw_call *r, ccl_call *k) {
  ccl_kind kind = r->kind;
  int32_t n = c->nranks, me = c->rank;
  const dtype_info *dt = dtype_find(r->dtype);
  if (!dt)
    return dks_set_error(DK_INVALID_ARGUMENT,
                         "%s: dtype key 0x%x (code %u, %u bits, %u lanes) is "
                         "not supported; use int8, uint8, int32, int64, "
                         "float16, bfloat16, float32 or float64",
                         fn, (unsigned)r->dtype, (unsigned)(r->dtype & 0xff),
                         (unsigned)((r->dtype >> 8) & 0xff),
                         (unsigned)(r->dtype >> 16));
  bool reduces = kind == K_ALL_REDUCE || kind == K_REDUCE ||
                 kind == K_REDUCE_SCATTER;
  bool rooted = kind == K_BROADCAST || kind == K_REDUCE;
  if (reduces && (r->op < DK_REDUCE_SUM || r->op > DK_REDUCE_AVG))
    return dks_set_error(DK_INVALID_ARGUMENT,
                         "%s: op %d is not a DK_ReduceOp (SUM 0, PROD 1, MAX "
                         "2, MIN 3, AVG 4)",
                         fn, (int)r->op);
  if (reduces && r->op == DK_REDUCE_AVG && !dt->avg)
    return dks_set_error(DK_INVALID_ARGUMENT,
                         "%s: DK_REDUCE_AVG needs a floating dtype, got %s",
                         fn, dt->name);
  if ((rooted || is_p2p(kind)) && (r->root < 0 || r->root >= n))
    return dks_set_error(DK_INVALID_ARGUMENT, "%s: %s %d out of range [0, %d)",
                         fn, rooted ? "root" : "peer", (int)r->root, (int)n);
  size_t es = dt->size;
  if (r->count > SIZE_MAX / es)
    return dks_set_error(DK_INVALID_ARGUMENT,
                         "%s: count %zu of %s overflows the address space", fn,
                         r->count, dt->name);
  size_t bytes = r->count * es, whole = bytes;
  bool blocks = kind == K_ALL_GATHER || kind == K_REDUCE_SCATTER ||
                kind == K_ALL_TO_ALL;
  if (blocks) {
    if (bytes > SIZE_MAX / (size_t)n)
      return dks_set_error(DK_INVALID_ARGUMENT,
                           "%s: %d ranks x count %zu of %s overflows the "
                           "address space",
                           fn, (int)n, r->count, dt->name);
    whole = bytes * (size_t)n;
  }
  size_t send_bytes = kind == K_REDUCE_SCATTER || kind == K_ALL_TO_ALL ? whole
                                                                       : bytes;
  size_t recv_bytes = kind == K_ALL_GATHER || kind == K_ALL_TO_ALL ? whole
                                                                   : bytes;
  bool uses_send = kind != K_RECV && (kind != K_BROADCAST || me == r->root);
  bool uses_recv = kind != K_SEND && (kind != K_REDUCE || me == r->root);
  uint8_t *send = NULL, *recv = NULL;
  DK_Status st;
  if (uses_send &&
      (st = dks_mem_range(fn, kind == K_SEND ? "buf" : "send", c->device,
                          r->send, r->send_offset, send_bytes, &send)) != DK_OK)
    return st;
  if (uses_recv &&
      (st = dks_mem_range(fn, kind == K_RECV ? "buf" : "recv", c->device,
                          r->recv, r->recv_offset, recv_bytes, &recv)) != DK_OK)
    return st;
  if (uses_send && uses_recv && overlap(send, send_bytes, recv, recv_bytes)) {
    /* In place as NCCL defines it, else the ranges must be disjoint. */
    const uint8_t *want = send;
    const char *how = "send == recv";
    if (kind == K_ALL_GATHER) {
      want = send - (size_t)me * bytes;
      how = "send == recv + rank * send_count elements";
    } else if (kind == K_REDUCE_SCATTER) {
      want = send + (size_t)me * bytes;
      how = "recv == send + rank * recv_count elements";
    }
    if (recv != want)
      return dks_set_error(DK_INVALID_ARGUMENT,
                           "%s: send [%p, +%zu bytes) and recv [%p, +%zu "
                           "bytes) overlap but are not in place (in place "
                           "means %s)",
                           fn, (void *)send, send_bytes, (void *)recv,
                           recv_bytes, how);
  }
  *k = (ccl_call){.kind = kind, .comm = r->comm, .stream = r->stream,
                  .send = send, .recv = recv, .count = r->count, .dt = dt,
                  .op = reduces ? r->op : 0,
                  .root = rooted || is_p2p(kind) ? r->root : 0};
  return DK_OK;
}

/* The calling thread's group: calls queued until the outermost group_end. */
static _Thread_local struct {
  int depth;
  ccl_call *calls;
  size_t count, cap;
} t_group;

static DK_Status group_add(const char *fn, const ccl_call *k) {
  if (t_group.count == t_group.cap) {
    size_t cap = t_group.cap ? 2 * t_group.cap : 16;
    ccl_call *calls = realloc(t_group.calls, cap * sizeof *calls);
    if (!calls)
      return dks_set_error(DK_RESOURCE_EXHAUSTED,
                           "%s: host out of memory queuing the call in a "
                           "group",
                           fn);
    t_group.calls = calls;
    t_group.cap = cap;
  }
  t_group.calls[t_group.count++] = *k;
  return DK_OK;
}

/* Validates a call now; issues it, or queues it in the thread's group. */
static DK_Status submit(const raw_call *r) {
  const char *fn = k_kind_names[r->kind];
  pinned_call p;
  DK_Status st = pin(fn, r->comm, r->stream, &p);
  if (st != DK_OK) return st;
  st = check_call(fn, p.c, r, &p.call);
  if (st == DK_OK)
    st = t_group.depth > 0 ? group_add(fn, &p.call) : issue(fn, &p, 1);
  unpin(&p, 1);
  return st;
}

DK_Status cpu_group_start(void) {
  if (t_group.depth == INT_MAX)
    return dks_set_error(DK_OUT_OF_RANGE,
                         "group_start: groups nested %d deep on this thread",
                         INT_MAX);
  t_group.depth++;
  return DK_OK;
}

/* The outermost group_end re-pins the queued calls' communicators and
 * streams (they may have been destroyed meanwhile) and issues them. */
DK_Status cpu_group_end(void) {
  static const char fn[] = "group_end";
  if (t_group.depth == 0)
    return dks_set_error(DK_FAILED_PRECONDITION,
                         "%s: no group_start is open on this thread", fn);
  if (--t_group.depth > 0) return DK_OK;
  ccl_call *calls = t_group.calls;
  size_t n = t_group.count, pinned = 0;
  t_group.calls = NULL;
  t_group.count = t_group.cap = 0;
  if (n == 0) {
    free(calls);
    return DK_OK;
  }
  DK_Status st = DK_OK;
  pinned_call *p = malloc(n * sizeof *p);
  if (!p)
    st = dks_set_error(DK_RESOURCE_EXHAUSTED,
                       "%s: host out of memory issuing %zu call(s)", fn, n);
  while (st == DK_OK && pinned < n) {
    char where[96];
    snprintf(where, sizeof where, "%s: %s (call %zu of the group)", fn,
             k_kind_names[calls[pinned].kind], pinned + 1);
    st = pin(where, calls[pinned].comm, calls[pinned].stream, &p[pinned]);
    if (st == DK_OK) {
      p[pinned].call = calls[pinned];
      pinned++;
    }
  }
  if (st == DK_OK) st = issue(fn, p, n);
  if (p) unpin(p, pinned);
  free(p);
  free(calls);
  return st;
}

/* ======================================================================== */
/* DK_DeviceApi entry points                                                 */
/* ======================================================================== */

DK_Status cpu_all_reduce(DK_Comm comm, DK_Mem send, size_t send_offset,
                         DK_Mem recv, size_t recv_offset, size_t count,
                         DK_DTypeKey dtype, int32_t op, DK_Stream stream) {
  return submit(&(raw_call){K_ALL_REDUCE, comm, send, recv, send_offset,
                            recv_offset, count, dtype, op, 0, stream});
}

DK_Status cpu_broadcast(DK_Comm comm, DK_Mem send, size_t send_offset,
                        DK_Mem recv, size_t recv_offset, size_t count,
                        DK_DTypeKey dtype, int32_t root, DK_Stream stream) {
  return submit(&(raw_call){K_BROADCAST, comm, send, recv, send_offset,
                            recv_offset, count, dtype, 0, root, stream});
}

DK_Status cpu_reduce(DK_Comm comm, DK_Mem send, size_t send_offset,
                     DK_Mem recv, size_t recv_offset, size_t count,
                     DK_DTypeKey dtype, int32_t op, int32_t root,
                     DK_Stream stream) {
  return submit(&(raw_call){K_REDUCE, comm, send, recv, send_offset,
                            recv_offset, count, dtype, op, root, stream});
}

DK_Status cpu_all_gather(DK_Comm comm, DK_Mem send, size_t send_offset,
                         DK_Mem recv, size_t recv_offset, size_t send_count,
                         DK_DTypeKey dtype, DK_Stream stream) {
  return submit(&(raw_call){K_ALL_GATHER, comm, send, recv, send_offset,
                            recv_offset, send_count, dtype, 0, 0, stream});
}

DK_Status cpu_reduce_scatter(DK_Comm comm, DK_Mem send, size_t send_offset,
                             DK_Mem recv, size_t recv_offset,
                             size_t recv_count, DK_DTypeKey dtype, int32_t op,
                             DK_Stream stream) {
  return submit(&(raw_call){K_REDUCE_SCATTER, comm, send, recv, send_offset,
                            recv_offset, recv_count, dtype, op, 0, stream});
}

DK_Status cpu_all_to_all(DK_Comm comm, DK_Mem send, size_t send_offset,
                         DK_Mem recv, size_t recv_offset, size_t count,
                         DK_DTypeKey dtype, DK_Stream stream) {
  return submit(&(raw_call){K_ALL_TO_ALL, comm, send, recv, send_offset,
                            recv_offset, count, dtype, 0, 0, stream});
}

DK_Status cpu_send(DK_Comm comm, DK_Mem buf, size_t offset, size_t count,
                   DK_DTypeKey dtype, int32_t peer, DK_Stream stream) {
  return submit(&(raw_call){K_SEND, comm, buf, NULL, offset, 0, count, dtype,
                            0, peer, stream});
}

DK_Status cpu_recv(DK_Comm comm, DK_Mem buf, size_t offset, size_t count,
                   DK_DTypeKey dtype, int32_t peer, DK_Stream stream) {
  return submit(&(raw_call){K_RECV, comm, NULL, buf, 0, offset, count, dtype,
                            0, peer, stream});
}
