/*
 * stream.c -- streams (in-order queues, one worker thread each), work items
 * and events of the devkit plugin-support library.
 *
 * Lifetimes: a stream is pinned by every API call using it (refs) and
 * stream_destroy waits until it is unpinned and drained. An event is
 * reference-counted by its registry entry, by queued work that records or
 * waits on it and by API calls in flight, so event_destroy can return while
 * work on it is pending.
 *
 * Who runs the work: a stream's worker thread, or a thread that waits for
 * the stream (stream_synchronize, device_synchronize) and finds the next
 * item queued with nobody running it: it runs the items up to its target
 * itself, in order, as the worker would (one item at a time per stream, the
 * `running` flag), except host callbacks, which the ABI runs on a plugin
 * thread: the waiter leaves those, and what follows them, to the worker. A
 * launch followed at once by a synchronize then costs no thread wake-up
 * either way (on a virtual machine one costs 20-50 us):
 * the waiter does not sleep while the worker wakes, and the worker's
 * completion does not have to wake the waiter.
 *
 * Asynchronous failures: a work item reports one with dks_work_fail; the
 * worker then stores it in the stream's sticky error (first failure wins),
 * which every later synchronize / query of the stream reports, and which
 * event records queued behind it capture.
 */
#define _POSIX_C_SOURCE 200809L /* clock_gettime, pthreads */

#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "dks_internal.h"

/* ======================================================================== */
/* Work items and streams                                                    */
/* ======================================================================== */

typedef struct dks_work {
  struct dks_work *next;
  void (*run)(void *arg);
  void (*destroy)(void *arg);
  max_align_t arg[]; /* the closure's argument, allocated with the item */
} dks_work;

/* A stream's sticky error. Allocated with the stream (so recording a failure
 * on the worker cannot run out of memory) and reference-counted, because the
 * event records that capture it may outlive the stream. Only the stream's
 * worker writes it, once: message first, then status with release order. */
typedef struct dks_error {
  atomic_int refs;
  atomic_int status; /* DK_OK until the first failure */
  char message[1024];
} dks_error;

static void error_put(dks_error *e) {
  if (e && atomic_fetch_sub(&e->refs, 1) == 1) free(e);
}

/* The failure recorded in e, or DK_OK; the caller keeps e alive. */
static DK_Status error_status(const dks_error *e) {
  return atomic_load_explicit(&e->status, memory_order_acquire);
}

/* Re-raises a recorded failure in the calling thread as `fn`'s error. */
static DK_Status error_report(const char *fn, const void *what,
                              const char *kind, const dks_error *e) {
  return dks_set_error(error_status(e), "%s: work queued on %s %p failed: %s",
                       fn, kind, what, e->message);
}

struct dks_stream {
  pthread_t worker;
  pthread_mutex_t mu;
  pthread_cond_t work_cv;  /* worker: queue non-empty or stop */
  pthread_cond_t done_cv;  /* waiters: completed advanced or refs hit 0 */
  dks_work *head, *tail;   /* guarded by mu */
  bool running;            /* an item of it is running (guarded by mu) */
  bool stop;               /* guarded by mu */
#ifdef DEVKIT_DEFECT_OUT_OF_ORDER
  dks_work *moved_back; /* guarded by mu (see stream_take) */
#endif
  /* Written under mu; atomic so stream_query can read them without it. */
  atomic_uint_fast64_t submitted, completed;
  atomic_int refs; /* pins from dks_stream_acquire */
  dks_error *error; /* sticky; holds one reference */
  /* The graph being captured, or NULL; written under mu, read anywhere. */
  _Atomic(dks_graph *) capture;
};

/* The stream whose item the calling thread runs (its worker, or a waiter
 * running it; NULL elsewhere), and the failure reported by the work item
 * running in this thread. */
static _Thread_local dks_stream *t_stream;
static _Thread_local DK_Status t_work_status;

static dks_work *work_of(void *arg) {
  return (dks_work *)((char *)arg - offsetof(dks_work, arg));
}

void *dks_work_new(size_t arg_size, void (*run)(void *arg),
                   void (*destroy)(void *arg)) {
  dks_work *w = calloc(1, sizeof *w + arg_size);
  if (!w) return NULL;
  w->run = run;
  w->destroy = destroy;
  return w->arg;
}

void dks_work_discard(void *arg) { free(work_of(arg)); }

DK_Status dks_work_fail(DK_Status status, const char *fmt, ...) {
  char message[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(message, sizeof message, fmt, ap);
  va_end(ap);
  t_work_status = status;
  return dks_set_error(status, "%s", message);
}

dks_stream *dks_stream_current(void) { return t_stream; }

/* Runs w and returns what its run function reported through dks_work_fail
 * (saved and restored, since a default-stream item may run inside another
 * item, e.g. from a callback or a graph). */
static DK_Status work_rerun(dks_work *w) {
  DK_Status outer = t_work_status;
  t_work_status = DK_OK;
  w->run(w->arg);
  DK_Status st = t_work_status;
  t_work_status = outer;
  return st;
}

static void work_free(dks_work *w) {
  if (w->destroy) w->destroy(w->arg);
  free(w);
}

/* Runs and frees w. */
static DK_Status work_run(dks_work *w) {
  DK_Status st = work_rerun(w);
  work_free(w);
  return st;
}

DK_Status dks_work_rerun(void *arg) { return work_rerun(work_of(arg)); }
DK_Status dks_work_run_once(void *arg) { return work_run(work_of(arg)); }
void dks_work_free(void *arg) { work_free(work_of(arg)); }

/* Queues w on s, or hands it to s's capture; with `recordable` false a
 * capturing stream refuses it (false), the caller keeping w. The capture is
 * read under s->mu, so a capture begun by another thread after the caller's
 * own check cannot take an item it must not hold. */
static bool work_queue(dks_stream *s, dks_work *w, bool recordable) {
  pthread_mutex_lock(&s->mu);
  dks_graph *g = atomic_load(&s->capture);
  if (g) { /* recorded, not run: the graph owns the item from now on */
    if (recordable) dks_graph_add_work(g, w->arg);
    pthread_mutex_unlock(&s->mu);
    return recordable;
  }
  if (s->tail)
    s->tail->next = w;
  else
    s->head = w;
  s->tail = w;
  atomic_fetch_add(&s->submitted, 1);
  /* The worker only sleeps on an empty queue. */
  if (s->head == w) pthread_cond_signal(&s->work_cv);
  pthread_mutex_unlock(&s->mu);
  return true;
}

DK_Status dks_work_submit(dks_stream *s, void *arg) {
  dks_work *w = work_of(arg);
  if (!s) return work_run(w); /* its message is already this thread's */
  work_queue(s, w, true);
  return DK_OK;
}

bool dks_work_submit_uncaptured(dks_stream *s, void *arg) { return work_queue(s, work_of(arg), false); }

/* Keeps the first failure; the message is copied out of this (the worker's)
 * thread-local buffer. Runs before `completed` advances, so a waiter that
 * sees the item complete also sees its failure. */
static void stream_record_failure(dks_stream *s, DK_Status st) {
  dks_error *e = s->error;
  if (st == DK_OK || error_status(e) != DK_OK) return;
  snprintf(e->message, sizeof e->message, "%s", dks_last_error());
  atomic_store_explicit(&e->status, st, memory_order_release);
}

/* Takes the next item off s's queue to run it (under s->mu; the queue is
 * non-empty and nobody runs an item of s). */
static dks_work *stream_take(dks_stream *s) {
  dks_work *w = s->head;
#ifdef DEVKIT_DEFECT_OUT_OF_ORDER
  /* The defect: the second item runs before the first. The item a swap
   * moved back runs next, unswapped: swapping it again whenever more work
   * had arrived would float it to the end of the queue and leave the order
   * of all the rest intact, so whether the defect showed would depend on
   * how fast the worker woke up. */
  if (w == s->moved_back) {
    s->moved_back = NULL;
  } else if (w->next) {
    dks_work *second = w->next;
    w->next = second->next;
    second->next = w;
    if (s->tail == second) s->tail = w;
    s->moved_back = w;
    s->head = w = second;
  }
#endif
  s->head = w->next;
  if (!s->head) s->tail = NULL;
  s->running = true;
  return w;
}

/* Runs the next item of s in the calling thread, as s's (under s->mu,
 * released while it runs; stream_take's conditions hold). */
static void stream_run_next(dks_stream *s) {
  dks_work *w = stream_take(s);
  pthread_mutex_unlock(&s->mu);
  dks_stream *outer = t_stream; /* a waiter may itself be running an item */
  t_stream = s;
  stream_record_failure(s, work_run(w));
  t_stream = outer;
  pthread_mutex_lock(&s->mu);
  s->running = false;
  atomic_fetch_add(&s->completed, 1);
  pthread_cond_broadcast(&s->done_cv);
}

static void *stream_main(void *arg) {
  dks_stream *s = arg;
  pthread_mutex_lock(&s->mu);
  for (;;) {
    while ((!s->head || s->running) && !s->stop) pthread_cond_wait(&s->work_cv, &s->mu);
    if (!s->head) break; /* stop requested and the queue is drained */
    stream_run_next(s);
  }
  pthread_mutex_unlock(&s->mu);
  return NULL;
}

/* Waiting for a stream from one of its own items (a callback) would never
 * end. */
static bool on_worker(const dks_stream *s) { return t_stream == s; }

static DK_Status deadlock_error(const char *fn, const dks_stream *s) {
  return dks_set_error(DK_FAILED_PRECONDITION,
                       "%s: called from a callback running on stream %p, "
                       "which would wait for itself",
                       fn, (const void *)s);
}

static void run_callback(void *arg);

/* Blocks until everything submitted before the call has completed, running
 * the items that nobody runs yet itself, up to a host callback. */
static void stream_drain(dks_stream *s) {
  pthread_mutex_lock(&s->mu);
  uint64_t target = atomic_load(&s->submitted);
  bool callback = false;
  while (atomic_load(&s->completed) < target) {
    callback = callback || (s->head && s->head->run == run_callback);
    if (s->head && !s->running && !callback)
      stream_run_next(s);
    else {
      if (callback && !s->running) pthread_cond_signal(&s->work_cv);
      pthread_cond_wait(&s->done_cv, &s->mu);
    }
  }
  /* Items submitted since are the worker's; it slept while this thread ran. */
  if (s->head && !s->running) pthread_cond_signal(&s->work_cv);
  pthread_mutex_unlock(&s->mu);
}

dks_graph *dks_stream_capture(dks_stream *s) {
  return s ? atomic_load(&s->capture) : NULL;
}

bool dks_stream_capturing(const dks_stream *s) {
  return s && atomic_load(&((dks_stream *)s)->capture) != NULL;
}

DK_Status dks_capture_refused(const char *fn, const dks_stream *s) {
  return dks_set_error(DK_FAILED_PRECONDITION,
                       "%s: stream %p is capturing a graph; this call is "
                       "refused until graph_end_capture",
                       fn, (const void *)s);
}

DK_Status dks_device_capture_check(const char *fn, dks_device *d) {
  int n = atomic_load(&d->capturing);
  if (n == 0) return DK_OK;
  return dks_set_error(DK_FAILED_PRECONDITION,
                       "%s: %d stream(s) of %s device %d are capturing a "
                       "graph; this call is refused until graph_end_capture",
                       fn, n, dks_name(), (int)d->index);
}

DK_Status dks_stream_begin_capture(const char *fn, dks_stream *s,
                                   dks_graph *g) {
  pthread_mutex_lock(&s->mu);
  bool busy = atomic_load(&s->capture) != NULL;
  if (!busy) atomic_store(&s->capture, g);
  pthread_mutex_unlock(&s->mu);
  return busy ? dks_capture_refused(fn, s) : DK_OK;
}

dks_graph *dks_stream_end_capture(dks_stream *s) {
  pthread_mutex_lock(&s->mu);
  dks_graph *g = atomic_exchange(&s->capture, NULL);
  pthread_mutex_unlock(&s->mu);
  return g;
}

/* Stops the worker once its queue is empty, joins it and frees s. */
static void stream_free(dks_stream *s) {
  pthread_mutex_lock(&s->mu);
  s->stop = true;
  pthread_cond_signal(&s->work_cv);
  pthread_mutex_unlock(&s->mu);
  pthread_join(s->worker, NULL);
  pthread_cond_destroy(&s->done_cv);
  pthread_cond_destroy(&s->work_cv);
  pthread_mutex_destroy(&s->mu);
  error_put(s->error);
  free(s);
}

static DK_Status not_a_stream(const char *fn, dks_device *d, DK_Stream h) {
  return dks_set_error(DK_INVALID_ARGUMENT,
                       "%s: stream %p is not a live stream on %s device %d",
                       fn, (void *)h, dks_name(), (int)d->index);
}

DK_Status dks_stream_acquire(const char *fn, dks_device *d, DK_Stream stream,
                             dks_stream **out) {
  *out = NULL;
  if (!stream) return DK_OK;
  dks_stream *s = (dks_stream *)stream;
  pthread_mutex_lock(&d->stream_mu);
  bool live = dks_table_find(&d->streams, (uintptr_t)s, NULL);
  if (live) atomic_fetch_add(&s->refs, 1);
  pthread_mutex_unlock(&d->stream_mu);
  if (!live) return not_a_stream(fn, d, stream);
  *out = s;
  return DK_OK;
}

void dks_stream_release(dks_stream *s) {
  if (!s) return;
  /* Under mu so that stream_destroy, once it sees refs == 0, knows no
   * releaser still touches the stream. */
  pthread_mutex_lock(&s->mu);
  if (atomic_fetch_sub(&s->refs, 1) == 1) pthread_cond_broadcast(&s->done_cv);
  pthread_mutex_unlock(&s->mu);
}

DK_Status dks_stream_create(int32_t dev, DK_Stream *stream) {
  static const char fn[] = "stream_create";
  dks_device *d;
  DK_Status st = dks_device_get(fn, dev, &d);
  if (st != DK_OK) return st;
  if (!stream)
    return dks_set_error(DK_INVALID_ARGUMENT, "%s: stream is NULL", fn);
  dks_stream *s = calloc(1, sizeof *s);
  dks_error *e = calloc(1, sizeof *e);
  if (!s || !e) {
    free(s);
    free(e);
    return dks_set_error(DK_RESOURCE_EXHAUSTED, "%s: host out of memory", fn);
  }
  atomic_init(&e->refs, 1);
  s->error = e;
  pthread_mutex_init(&s->mu, NULL);
  pthread_cond_init(&s->work_cv, NULL);
  pthread_cond_init(&s->done_cv, NULL);
  int rc = pthread_create(&s->worker, NULL, stream_main, s);
  if (rc != 0) {
    pthread_cond_destroy(&s->done_cv);
    pthread_cond_destroy(&s->work_cv);
    pthread_mutex_destroy(&s->mu);
    free(e);
    free(s);
    return dks_set_error(DK_RESOURCE_EXHAUSTED,
                         "%s: cannot start a worker thread for %s device %d: "
                         "%s",
                         fn, dks_name(), (int)dev, strerror(rc));
  }
  pthread_mutex_lock(&d->stream_mu);
  bool ok = dks_table_insert(&d->streams, (uintptr_t)s, 0);
  pthread_mutex_unlock(&d->stream_mu);
  if (!ok) {
    stream_free(s);
    return dks_set_error(DK_RESOURCE_EXHAUSTED, "%s: host out of memory", fn);
  }
  *stream = (DK_Stream)s;
  return DK_OK;
}

DK_Status dks_stream_destroy(int32_t dev, DK_Stream stream) {
  static const char fn[] = "stream_destroy";
  dks_device *d;
  DK_Status st = dks_device_get(fn, dev, &d);
  if (st != DK_OK || !stream) return st;
  dks_stream *s = (dks_stream *)stream;
  pthread_mutex_lock(&d->stream_mu);
  bool live = dks_table_find(&d->streams, (uintptr_t)s, NULL);
  bool self = live && on_worker(s);
  bool capturing = live && dks_stream_capturing(s);
  if (live && !self && !capturing) dks_table_remove(&d->streams, (uintptr_t)s, NULL);
  pthread_mutex_unlock(&d->stream_mu);
  if (!live) return not_a_stream(fn, d, stream);
  if (self) return deadlock_error(fn, s);
  if (capturing) return dks_capture_refused(fn, s);
  /* Unregistered: no new pins. Wait for calls still using it, then for all
   * work they submitted. */
  pthread_mutex_lock(&s->mu);
  while (atomic_load(&s->refs) > 0 ||
         atomic_load(&s->completed) < atomic_load(&s->submitted))
    pthread_cond_wait(&s->done_cv, &s->mu);
  pthread_mutex_unlock(&s->mu);
  stream_free(s);
  return DK_OK;
}

DK_Status dks_stream_synchronize(int32_t dev, DK_Stream stream) {
  static const char fn[] = "stream_synchronize";
  dks_device *d;
  dks_stream *s;
  DK_Status st = dks_device_get(fn, dev, &d);
  if (st == DK_OK) st = dks_stream_acquire(fn, d, stream, &s);
  if (st != DK_OK || !s) return st;
  if (on_worker(s)) {
    st = deadlock_error(fn, s);
  } else if (dks_stream_capturing(s)) {
    st = dks_capture_refused(fn, s);
  } else {
    stream_drain(s);
    if (error_status(s->error) != DK_OK)
      st = error_report(fn, s, "stream", s->error);
  }
  dks_stream_release(s);
  return st;
}

/* Hot path: one registry lookup, read under the registry lock (which keeps
 * the stream alive) instead of pinning. */
DK_Status dks_stream_query(int32_t dev, DK_Stream stream) {
  static const char fn[] = "stream_query";
  dks_device *d;
  DK_Status st = dks_device_get(fn, dev, &d);
  if (st != DK_OK || !stream) return st;
  dks_stream *s = (dks_stream *)stream;
  pthread_mutex_lock(&d->stream_mu);
  bool live = dks_table_find(&d->streams, (uintptr_t)s, NULL);
  bool idle = live && atomic_load(&s->completed) == atomic_load(&s->submitted);
  if (live && dks_stream_capturing(s))
    st = dks_capture_refused(fn, s);
  else if (live && error_status(s->error) != DK_OK)
    st = error_report(fn, s, "stream", s->error);
  pthread_mutex_unlock(&d->stream_mu);
  if (!live) return not_a_stream(fn, d, stream);
  if (st != DK_OK) return st;
  return idle ? DK_OK : DK_NOT_READY;
}

DK_Status dks_device_synchronize(int32_t dev) {
  static const char fn[] = "device_synchronize";
  dks_device *d;
  DK_Status st = dks_device_get(fn, dev, &d);
  if (st == DK_OK) st = dks_device_capture_check(fn, d);
  if (st != DK_OK) return st;

  /* Pin a snapshot of the live streams, then drain them without holding the
   * registry lock (their work may itself create or look up streams). */
  pthread_mutex_lock(&d->stream_mu);
  size_t n = d->streams.count;
  dks_stream **streams = n ? malloc(n * sizeof *streams) : NULL;
  bool oom = n && !streams;
  dks_stream *self = NULL;
  for (size_t i = 0, k = 0; !oom && i < d->streams.capacity; i++) {
    dks_stream *s = (dks_stream *)d->streams.slots[i].key;
    if (!s) continue;
    if (on_worker(s)) self = s;
    atomic_fetch_add(&s->refs, 1);
    streams[k++] = s;
  }
  pthread_mutex_unlock(&d->stream_mu);

  if (oom)
    return dks_set_error(DK_RESOURCE_EXHAUSTED, "%s: host out of memory", fn);
  if (self) st = deadlock_error(fn, self);
  for (size_t i = 0; i < n; i++) {
    if (!self) stream_drain(streams[i]);
    if (st == DK_OK && error_status(streams[i]->error) != DK_OK)
      st = error_report(fn, streams[i], "stream", streams[i]->error);
    dks_stream_release(streams[i]);
  }
  free(streams);
  return st;
}

typedef struct callback_args {
  DK_HostFn fn;
  void *user_data;
} callback_args;

static void run_callback(void *arg) {
  callback_args *a = arg;
  a->fn(a->user_data);
}

DK_Status dks_stream_add_callback(int32_t dev, DK_Stream stream, DK_HostFn fn,
                                  void *user_data) {
  static const char fname[] = "stream_add_callback";
  dks_device *d;
  dks_stream *s;
  DK_Status st = dks_device_get(fname, dev, &d);
  if (st != DK_OK) return st;
  if (!fn) return dks_set_error(DK_INVALID_ARGUMENT, "%s: fn is NULL", fname);
  if ((st = dks_stream_acquire(fname, d, stream, &s)) != DK_OK) return st;
  if (dks_stream_capturing(s)) {
    st = dks_capture_refused(fname, s);
    dks_stream_release(s);
    return st;
  }
  callback_args *a = dks_work_new(sizeof *a, run_callback, NULL);
  if (!a) {
    dks_stream_release(s);
    return dks_set_error(DK_RESOURCE_EXHAUSTED,
                         "%s: host out of memory queuing the callback", fname);
  }
  *a = (callback_args){fn, user_data};
  st = DK_OK;
  if (!dks_work_submit_uncaptured(s, a)) { /* a capture began since the check above */
    dks_work_discard(a);
    st = dks_capture_refused(fname, s);
  }
  dks_stream_release(s);
  return st;
}

/* ======================================================================== */
/* Events                                                                    */
/* ======================================================================== */

/* One event_record: done once the worker reaches it. Each record gets its own
 * mark so that a wait captures exactly the record current at its call, even
 * when a later re-record on another stream completes first. */
typedef struct dks_mark {
  int refs;     /* the event's `last`, queued record/wait work, waiters */
  bool done;
  uint64_t ns;  /* CLOCK_MONOTONIC completion time */
  dks_error *error; /* the stream's sticky error when the record ran, if set */
} dks_mark;

struct dks_event {
  uint32_t flags;
  atomic_int refs; /* registry entry + queued work + calls in flight */
  pthread_mutex_t mu; /* guards last and every field of its marks */
  pthread_cond_t cv;  /* a mark of this event became done */
  dks_mark *last;     /* most recent record; NULL = never recorded */
};

static void mark_free(dks_mark *m) {
  if (!m) return;
  error_put(m->error);
  free(m);
}

/* Caller holds e->mu. */
static void mark_put(dks_mark *m) {
  if (--m->refs == 0) mark_free(m);
}

/* Caller holds e->mu; returns with it held once m is done. */
static void mark_wait(dks_event *e, dks_mark *m) {
  if (m->done) return;
  m->refs++; /* a re-record may drop the event's reference meanwhile */
  while (!m->done) pthread_cond_wait(&e->cv, &e->mu);
  mark_put(m);
}

static DK_Status event_acquire(const char *fn, const char *what,
                               dks_device *d, DK_Event event,
                               dks_event **out) {
  *out = NULL;
  if (!event)
    return dks_set_error(DK_INVALID_ARGUMENT, "%s: %s is NULL", fn, what);
  dks_event *e = (dks_event *)event;
  pthread_mutex_lock(&d->event_mu);
  bool live = dks_table_find(&d->events, (uintptr_t)e, NULL);
  if (live) atomic_fetch_add(&e->refs, 1);
  pthread_mutex_unlock(&d->event_mu);
  if (!live)
    return dks_set_error(DK_INVALID_ARGUMENT,
                         "%s: %s %p is not a live event on %s device %d", fn,
                         what, (void *)event, dks_name(), (int)d->index);
  *out = e;
  return DK_OK;
}

static void event_release(dks_event *e) {
  if (atomic_fetch_sub(&e->refs, 1) != 1) return;
  /* Last reference: no queued work remains, so only `last` holds its mark. */
  mark_free(e->last);
  pthread_cond_destroy(&e->cv);
  pthread_mutex_destroy(&e->mu);
  free(e);
}

DK_Status dks_event_create(int32_t dev, uint32_t flags, DK_Event *event) {
  static const char fn[] = "event_create";
  dks_device *d;
  DK_Status st = dks_device_get(fn, dev, &d);
  if (st != DK_OK) return st;
  if (!event) return dks_set_error(DK_INVALID_ARGUMENT, "%s: event is NULL", fn);
  if (flags & ~(uint32_t)DK_EVENT_DISABLE_TIMING)
    return dks_set_error(DK_INVALID_ARGUMENT,
                         "%s: unknown flags 0x%x (allowed: "
                         "DK_EVENT_DISABLE_TIMING = 0x%x)",
                         fn, (unsigned)flags, (unsigned)DK_EVENT_DISABLE_TIMING);
  dks_event *e = calloc(1, sizeof *e);
  if (!e) return dks_set_error(DK_RESOURCE_EXHAUSTED, "%s: host out of memory", fn);
  e->flags = flags;
  atomic_init(&e->refs, 1);
  pthread_mutex_init(&e->mu, NULL);
  pthread_cond_init(&e->cv, NULL);
  pthread_mutex_lock(&d->event_mu);
  bool ok = dks_table_insert(&d->events, (uintptr_t)e, 0);
  pthread_mutex_unlock(&d->event_mu);
  if (!ok) {
    event_release(e);
    return dks_set_error(DK_RESOURCE_EXHAUSTED, "%s: host out of memory", fn);
  }
  *event = (DK_Event)e;
  return DK_OK;
}

DK_Status dks_event_destroy(int32_t dev, DK_Event event) {
  dks_device *d;
  DK_Status st = dks_device_get("event_destroy", dev, &d);
  if (st != DK_OK || !event) return st;
  pthread_mutex_lock(&d->event_mu);
  bool live = dks_table_remove(&d->events, (uintptr_t)event, NULL);
  pthread_mutex_unlock(&d->event_mu);
  if (!live)
    return dks_set_error(DK_INVALID_ARGUMENT,
                         "event_destroy: event %p is not a live event on %s "
                         "device %d",
                         (void *)event, dks_name(), (int)d->index);
  event_release((dks_event *)event); /* queued work may still hold it */
  return DK_OK;
}

/* Argument of queued record and wait work: holds a reference to both. */
typedef struct mark_args {
  dks_event *event;
  dks_mark *mark;
} mark_args;

static void run_record(void *arg) {
  mark_args *a = arg;
  /* Records run as their stream's items, in order: a failure recorded by
   * now came from work queued before this record. */
  dks_error *err = t_stream ? t_stream->error : NULL;
  bool failed = err && error_status(err) != DK_OK;
  if (failed) atomic_fetch_add(&err->refs, 1);
  pthread_mutex_lock(&a->event->mu);
  if (failed) a->mark->error = err;
  a->mark->done = true;
  a->mark->ns = dks_now_ns();
  pthread_cond_broadcast(&a->event->cv);
  pthread_mutex_unlock(&a->event->mu);
}

static void run_wait(void *arg) {
  mark_args *a = arg;
  pthread_mutex_lock(&a->event->mu);
  mark_wait(a->event, a->mark);
  pthread_mutex_unlock(&a->event->mu);
}

static void destroy_mark_args(void *arg) {
  mark_args *a = arg;
  pthread_mutex_lock(&a->event->mu);
  mark_put(a->mark);
  pthread_mutex_unlock(&a->event->mu);
  event_release(a->event);
}

/* Pins the event and the stream of an event call on device d. */
static DK_Status acquire_pair(const char *fn, dks_device *d, DK_Event event,
                              DK_Stream stream, dks_event **e,
                              dks_stream **s) {
  *s = NULL;
  DK_Status st = event_acquire(fn, "event", d, event, e);
  if (st != DK_OK) return st;
  if ((st = dks_stream_acquire(fn, d, stream, s)) != DK_OK) event_release(*e);
  return st;
}

DK_Status dks_event_record(int32_t dev, DK_Event event, DK_Stream stream) {
  static const char fn[] = "event_record";
  dks_device *d;
  dks_event *e;
  dks_stream *s;
  DK_Status st = dks_device_get(fn, dev, &d);
  if (st == DK_OK) st = acquire_pair(fn, d, event, stream, &e, &s);
  if (st != DK_OK) return st;
  if (dks_stream_capture(s)) { /* every launch re-records the event here */
    st = dks_graph_add_event(dks_stream_capture(s), e, true);
    dks_stream_release(s);
    event_release(e);
    return st;
  }

  dks_mark *m = calloc(1, sizeof *m);
  mark_args *a = s ? dks_work_new(sizeof *a, run_record, destroy_mark_args)
                   : NULL;
  if (!m || (s && !a)) {
    free(m);
    if (a) dks_work_discard(a);
    st = dks_set_error(DK_RESOURCE_EXHAUSTED,
                       "%s: host out of memory queuing the record", fn);
  } else {
    if (s) {
      m->refs = 2; /* e->last and the queued record */
      atomic_fetch_add(&e->refs, 1);
      *a = (mark_args){e, m};
    } else { /* default stream: complete on return */
      m->refs = 1;
      m->done = true;
      m->ns = dks_now_ns();
    }
    /* Publish and queue under e->mu, so a wait that captures m is always
     * queued after m's record: otherwise a concurrent wait on the same
     * stream could land ahead of the record and never finish. (Lock order:
     * an event's mu, then a stream's mu; nothing takes them the other way.) */
    pthread_mutex_lock(&e->mu);
    dks_mark *old = e->last;
    e->last = m;
    if (old) mark_put(old);
    if (s) dks_work_submit(s, a);
    pthread_mutex_unlock(&e->mu);
  }
  dks_stream_release(s);
  event_release(e);
  return st;
}

DK_Status dks_stream_wait_event(int32_t dev, DK_Stream stream, DK_Event event) {
  static const char fn[] = "stream_wait_event";
  dks_device *d;
  dks_event *e;
  dks_stream *s;
  DK_Status st = dks_device_get(fn, dev, &d);
  if (st == DK_OK) st = acquire_pair(fn, d, event, stream, &e, &s);
  if (st != DK_OK) return st;
  if (dks_stream_capture(s)) { /* every launch waits for the record current then */
    st = dks_graph_add_event(dks_stream_capture(s), e, false);
    dks_stream_release(s);
    event_release(e);
    return st;
  }

  mark_args *a = s ? dks_work_new(sizeof *a, run_wait, destroy_mark_args)
                   : NULL;
  if (s && !a) {
    st = dks_set_error(DK_RESOURCE_EXHAUSTED,
                       "%s: host out of memory queuing the wait", fn);
  } else {
    /* Capture the record current at call time. */
    pthread_mutex_lock(&e->mu);
    dks_mark *m = e->last;
    bool pending = m && !m->done;
    if (pending && s) {
      m->refs++;
      atomic_fetch_add(&e->refs, 1);
      *a = (mark_args){e, m};
    } else if (pending) {
      mark_wait(e, m); /* default stream: the caller blocks */
    }
    pthread_mutex_unlock(&e->mu);
    if (a && pending)
      dks_work_submit(s, a);
    else if (a)
      dks_work_discard(a);
  }
  dks_stream_release(s);
  event_release(e);
  return st;
}

void dks_event_retain(dks_event *e) { atomic_fetch_add(&e->refs, 1); }
void dks_event_put(dks_event *e) { event_release(e); }
void dks_event_lock(dks_event *e) { pthread_mutex_lock(&e->mu); }
void dks_event_unlock(dks_event *e) { pthread_mutex_unlock(&e->mu); }

static void run_nothing(void *arg) { (void)arg; }

void *dks_event_bind(dks_event *e, bool record) {
  dks_mark *m = record ? calloc(1, sizeof *m) : e->last;
  bool pending = m && !m->done;
  if (!record && !pending) return dks_work_new(0, run_nothing, NULL);
  mark_args *a = dks_work_new(sizeof *a, record ? run_record : run_wait,
                              destroy_mark_args);
  if (!a) {
    if (record) free(m);
    return NULL;
  }
  atomic_fetch_add(&e->refs, 1);
  *a = (mark_args){e, m};
  if (record) {
    m->refs = 2; /* e->last and the item */
    if (e->last) mark_put(e->last);
    e->last = m;
  } else {
    m->refs++;
  }
  return a;
}

DK_Status dks_event_query(int32_t dev, DK_Event event) {
  static const char fn[] = "event_query";
  dks_device *d;
  dks_event *e;
  DK_Status st = dks_device_get(fn, dev, &d);
  if (st == DK_OK) st = event_acquire(fn, "event", d, event, &e);
  if (st != DK_OK) return st;
  pthread_mutex_lock(&e->mu);
#ifdef DEVKIT_DEFECT_EARLY_EVENT
  bool done = true;
#else
  bool done = !e->last || e->last->done;
#endif
  if (done && e->last && e->last->error)
    st = error_report(fn, e, "the stream before event", e->last->error);
  pthread_mutex_unlock(&e->mu);
  event_release(e);
  if (st != DK_OK) return st;
  return done ? DK_OK : DK_NOT_READY;
}

DK_Status dks_event_synchronize(int32_t dev, DK_Event event) {
  static const char fn[] = "event_synchronize";
  dks_device *d;
  dks_event *e;
  DK_Status st = dks_device_get(fn, dev, &d);
  if (st == DK_OK) st = event_acquire(fn, "event", d, event, &e);
  if (st != DK_OK) return st;
  pthread_mutex_lock(&e->mu);
  dks_mark *m = e->last;
#ifdef DEVKIT_DEFECT_EARLY_EVENT
  m = NULL;
#endif
  if (m) {
    m->refs++; /* a re-record during the wait may drop the event's reference */
    mark_wait(e, m);
    if (m->error) st = error_report(fn, e, "the stream before event", m->error);
    mark_put(m);
  }
  pthread_mutex_unlock(&e->mu);
  event_release(e);
  return st;
}

DK_Status dks_event_elapsed_ms(int32_t dev, DK_Event start, DK_Event end,
                               float *ms) {
  static const char fn[] = "event_elapsed_ms";
  dks_device *d;
  dks_event *ev[2];
  DK_Status st = dks_device_get(fn, dev, &d);
  if (st != DK_OK) return st;
  if (!ms) return dks_set_error(DK_INVALID_ARGUMENT, "%s: ms is NULL", fn);
  if ((st = event_acquire(fn, "start", d, start, &ev[0])) != DK_OK) return st;
  if ((st = event_acquire(fn, "end", d, end, &ev[1])) != DK_OK) {
    event_release(ev[0]);
    return st;
  }

  static const char *const names[2] = {"start", "end"};
  bool recorded[2], done[2];
  uint64_t ns[2] = {0, 0};
  for (int i = 0; i < 2; i++) {
    pthread_mutex_lock(&ev[i]->mu);
    recorded[i] = ev[i]->last != NULL;
    done[i] = recorded[i] && ev[i]->last->done;
    if (done[i]) ns[i] = ev[i]->last->ns;
    pthread_mutex_unlock(&ev[i]->mu);
  }
  for (int i = 0; i < 2 && st == DK_OK; i++) {
    if (!recorded[i])
      st = dks_set_error(DK_INVALID_ARGUMENT,
                         "%s: %s event %p was never recorded", fn, names[i],
                         (void *)ev[i]);
    else if (ev[i]->flags & DK_EVENT_DISABLE_TIMING)
      st = dks_set_error(DK_INVALID_ARGUMENT,
                         "%s: %s event %p was created with "
                         "DK_EVENT_DISABLE_TIMING",
                         fn, names[i], (void *)ev[i]);
  }
  if (st == DK_OK && (!done[0] || !done[1])) st = DK_NOT_READY;
  if (st == DK_OK) *ms = (float)((double)(int64_t)(ns[1] - ns[0]) / 1e6);
  event_release(ev[1]);
  event_release(ev[0]);
  return st;
}
