/*
 * stream.c -- streams (in-order queues, one worker thread each), work items
 * and events of the devkit "acme" plugin.
 *
 * Lifetimes: a stream is pinned by every API call using it (refs) and
 * stream_destroy waits until it is unpinned and drained. An event is
 * reference-counted by its registry entry, by queued work that records or
 * waits on it and by API calls in flight, so event_destroy can return while
 * work on it is pending.
 *
 * Asynchronous failures: a work item reports one with acme_work_fail; the
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

#include "acme_internal.h"

/* ======================================================================== */
/* Work items and streams                                                    */
/* ======================================================================== */

typedef struct acme_work {
  struct acme_work *next;
  void (*run)(void *arg);
  void (*destroy)(void *arg);
  max_align_t arg[]; /* the closure's argument, allocated with the item */
} acme_work;

/* A stream's sticky error. Allocated with the stream (so recording a failure
 * on the worker cannot run out of memory) and reference-counted, because the
 * event records that capture it may outlive the stream. Only the stream's
 * worker writes it, once: message first, then status with release order. */
typedef struct acme_error {
  atomic_int refs;
  atomic_int status; /* DK_OK until the first failure */
  char message[1024];
} acme_error;

static void error_put(acme_error *e) {
  if (e && atomic_fetch_sub(&e->refs, 1) == 1) free(e);
}

/* The failure recorded in e, or DK_OK; the caller keeps e alive. */
static DK_Status error_status(const acme_error *e) {
  return atomic_load_explicit(&e->status, memory_order_acquire);
}

/* Re-raises a recorded failure in the calling thread as `fn`'s error. */
static DK_Status error_report(const char *fn, const void *what,
                              const char *kind, const acme_error *e) {
  return acme_set_error(error_status(e), "%s: work queued on %s %p failed: %s",
                       fn, kind, what, e->message);
}

struct acme_stream {
  pthread_t worker;
  pthread_mutex_t mu;
  pthread_cond_t work_cv;  /* worker: queue non-empty or stop */
  pthread_cond_t done_cv;  /* waiters: completed advanced or refs hit 0 */
  acme_work *head, *tail;   /* guarded by mu */
  bool stop;               /* guarded by mu */
  /* Written under mu; atomic so stream_query can read them without it. */
  atomic_uint_fast64_t submitted, completed;
  atomic_int refs; /* pins from acme_stream_acquire */
  acme_error *error; /* sticky; holds one reference */
};

/* The stream whose worker is the calling thread (NULL elsewhere), and the
 * failure reported by the work item running in this thread. */
static _Thread_local acme_stream *t_stream;
static _Thread_local DK_Status t_work_status;

static acme_work *work_of(void *arg) {
  return (acme_work *)((char *)arg - offsetof(acme_work, arg));
}

void *acme_work_new(size_t arg_size, void (*run)(void *arg),
                   void (*destroy)(void *arg)) {
  acme_work *w = calloc(1, sizeof *w + arg_size);
  if (!w) return NULL;
  w->run = run;
  w->destroy = destroy;
  return w->arg;
}

void acme_work_discard(void *arg) { free(work_of(arg)); }

DK_Status acme_work_fail(DK_Status status, const char *fmt, ...) {
  char message[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(message, sizeof message, fmt, ap);
  va_end(ap);
  t_work_status = status;
  return acme_set_error(status, "%s", message);
}

acme_stream *acme_stream_current(void) { return t_stream; }

/* Runs and frees w; returns what its run function reported through
 * acme_work_fail (saved and restored, since a default-stream item may run
 * inside another item, e.g. from a callback). */
static DK_Status work_run(acme_work *w) {
  DK_Status outer = t_work_status;
  t_work_status = DK_OK;
  w->run(w->arg);
  DK_Status st = t_work_status;
  t_work_status = outer;
  if (w->destroy) w->destroy(w->arg);
  free(w);
  return st;
}

DK_Status acme_work_submit(acme_stream *s, void *arg) {
  acme_work *w = work_of(arg);
  if (!s) return work_run(w); /* its message is already this thread's */
  pthread_mutex_lock(&s->mu);
  if (s->tail)
    s->tail->next = w;
  else
    s->head = w;
  s->tail = w;
  atomic_fetch_add(&s->submitted, 1);
  /* The worker only sleeps on an empty queue. */
  if (s->head == w) pthread_cond_signal(&s->work_cv);
  pthread_mutex_unlock(&s->mu);
  return DK_OK;
}

/* Keeps the first failure; the message is copied out of this (the worker's)
 * thread-local buffer. Runs before `completed` advances, so a waiter that
 * sees the item complete also sees its failure. */
static void stream_record_failure(acme_stream *s, DK_Status st) {
  acme_error *e = s->error;
  if (st == DK_OK || error_status(e) != DK_OK) return;
  snprintf(e->message, sizeof e->message, "%s", acme_last_error());
  atomic_store_explicit(&e->status, st, memory_order_release);
}

static void *stream_main(void *arg) {
  acme_stream *s = arg;
  t_stream = s;
  pthread_mutex_lock(&s->mu);
  for (;;) {
    while (!s->head && !s->stop) pthread_cond_wait(&s->work_cv, &s->mu);
    acme_work *w = s->head;
    if (!w) break; /* stop requested and the queue is drained */
    s->head = w->next;
    if (!s->head) s->tail = NULL;
    pthread_mutex_unlock(&s->mu);
    stream_record_failure(s, work_run(w));
    pthread_mutex_lock(&s->mu);
    atomic_fetch_add(&s->completed, 1);
    pthread_cond_broadcast(&s->done_cv);
  }
  pthread_mutex_unlock(&s->mu);
  return NULL;
}

/* Waiting for a stream from its own worker (a callback) would never end. */
static bool on_worker(const acme_stream *s) {
  return pthread_equal(pthread_self(), s->worker);
}

static DK_Status deadlock_error(const char *fn, const acme_stream *s) {
  return acme_set_error(DK_FAILED_PRECONDITION,
                       "%s: called from a callback running on stream %p, "
                       "which would wait for itself",
                       fn, (const void *)s);
}

/* Blocks until everything submitted before the call has completed. */
static void stream_drain(acme_stream *s) {
  pthread_mutex_lock(&s->mu);
  uint64_t target = atomic_load(&s->submitted);
  while (atomic_load(&s->completed) < target)
    pthread_cond_wait(&s->done_cv, &s->mu);
  pthread_mutex_unlock(&s->mu);
}

/* Stops the worker once its queue is empty, joins it and frees s. */
static void stream_free(acme_stream *s) {
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

static DK_Status not_a_stream(const char *fn, acme_device *d, DK_Stream h) {
  return acme_set_error(DK_INVALID_ARGUMENT,
                       "%s: stream %p is not a live stream on acme device %d",
                       fn, (void *)h, (int)d->index);
}

DK_Status acme_stream_acquire(const char *fn, acme_device *d, DK_Stream stream,
                             acme_stream **out) {
  *out = NULL;
  if (!stream) return DK_OK;
  acme_stream *s = (acme_stream *)stream;
  pthread_mutex_lock(&d->stream_mu);
  bool live = acme_table_find(&d->streams, (uintptr_t)s, NULL);
  if (live) atomic_fetch_add(&s->refs, 1);
  pthread_mutex_unlock(&d->stream_mu);
  if (!live) return not_a_stream(fn, d, stream);
  *out = s;
  return DK_OK;
}

void acme_stream_release(acme_stream *s) {
  if (!s) return;
  /* Under mu so that stream_destroy, once it sees refs == 0, knows no
   * releaser still touches the stream. */
  pthread_mutex_lock(&s->mu);
  if (atomic_fetch_sub(&s->refs, 1) == 1) pthread_cond_broadcast(&s->done_cv);
  pthread_mutex_unlock(&s->mu);
}

DK_Status acme_stream_create(int32_t dev, DK_Stream *stream) {
  static const char fn[] = "stream_create";
  acme_device *d;
  DK_Status st = acme_device_get(fn, dev, &d);
  if (st != DK_OK) return st;
  if (!stream)
    return acme_set_error(DK_INVALID_ARGUMENT, "%s: stream is NULL", fn);
  acme_stream *s = calloc(1, sizeof *s);
  acme_error *e = calloc(1, sizeof *e);
  if (!s || !e) {
    free(s);
    free(e);
    return acme_set_error(DK_RESOURCE_EXHAUSTED, "%s: host out of memory", fn);
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
    return acme_set_error(DK_RESOURCE_EXHAUSTED,
                         "%s: cannot start a worker thread for acme device %d: "
                         "%s",
                         fn, (int)dev, strerror(rc));
  }
  pthread_mutex_lock(&d->stream_mu);
  bool ok = acme_table_insert(&d->streams, (uintptr_t)s, 0);
  pthread_mutex_unlock(&d->stream_mu);
  if (!ok) {
    stream_free(s);
    return acme_set_error(DK_RESOURCE_EXHAUSTED, "%s: host out of memory", fn);
  }
  *stream = (DK_Stream)s;
  return DK_OK;
}

DK_Status acme_stream_destroy(int32_t dev, DK_Stream stream) {
  static const char fn[] = "stream_destroy";
  acme_device *d;
  DK_Status st = acme_device_get(fn, dev, &d);
  if (st != DK_OK || !stream) return st;
  acme_stream *s = (acme_stream *)stream;
  pthread_mutex_lock(&d->stream_mu);
  bool live = acme_table_find(&d->streams, (uintptr_t)s, NULL);
  bool self = live && on_worker(s);
  if (live && !self) acme_table_remove(&d->streams, (uintptr_t)s, NULL);
  pthread_mutex_unlock(&d->stream_mu);
  if (!live) return not_a_stream(fn, d, stream);
  if (self) return deadlock_error(fn, s);
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

DK_Status acme_stream_synchronize(int32_t dev, DK_Stream stream) {
  static const char fn[] = "stream_synchronize";
  acme_device *d;
  acme_stream *s;
  DK_Status st = acme_device_get(fn, dev, &d);
  if (st == DK_OK) st = acme_stream_acquire(fn, d, stream, &s);
  if (st != DK_OK || !s) return st;
  if (on_worker(s)) {
    st = deadlock_error(fn, s);
  } else {
    stream_drain(s);
    if (error_status(s->error) != DK_OK)
      st = error_report(fn, s, "stream", s->error);
  }
  acme_stream_release(s);
  return st;
}

/* Hot path: one registry lookup, read under the registry lock (which keeps
 * the stream alive) instead of pinning. */
DK_Status acme_stream_query(int32_t dev, DK_Stream stream) {
  static const char fn[] = "stream_query";
  acme_device *d;
  DK_Status st = acme_device_get(fn, dev, &d);
  if (st != DK_OK || !stream) return st;
  acme_stream *s = (acme_stream *)stream;
  pthread_mutex_lock(&d->stream_mu);
  bool live = acme_table_find(&d->streams, (uintptr_t)s, NULL);
  bool idle = live && atomic_load(&s->completed) == atomic_load(&s->submitted);
  if (live && error_status(s->error) != DK_OK)
    st = error_report(fn, s, "stream", s->error);
  pthread_mutex_unlock(&d->stream_mu);
  if (!live) return not_a_stream(fn, d, stream);
  if (st != DK_OK) return st;
  return idle ? DK_OK : DK_NOT_READY;
}

DK_Status acme_device_synchronize(int32_t dev) {
  static const char fn[] = "device_synchronize";
  acme_device *d;
  DK_Status st = acme_device_get(fn, dev, &d);
  if (st != DK_OK) return st;

  /* Pin a snapshot of the live streams, then drain them without holding the
   * registry lock (their work may itself create or look up streams). */
  pthread_mutex_lock(&d->stream_mu);
  size_t n = d->streams.count;
  acme_stream **streams = n ? malloc(n * sizeof *streams) : NULL;
  bool oom = n && !streams;
  acme_stream *self = NULL;
  for (size_t i = 0, k = 0; !oom && i < d->streams.capacity; i++) {
    acme_stream *s = (acme_stream *)d->streams.slots[i].key;
    if (!s) continue;
    if (on_worker(s)) self = s;
    atomic_fetch_add(&s->refs, 1);
    streams[k++] = s;
  }
  pthread_mutex_unlock(&d->stream_mu);

  if (oom)
    return acme_set_error(DK_RESOURCE_EXHAUSTED, "%s: host out of memory", fn);
  if (self) st = deadlock_error(fn, self);
  for (size_t i = 0; i < n; i++) {
    if (!self) stream_drain(streams[i]);
    if (st == DK_OK && error_status(streams[i]->error) != DK_OK)
      st = error_report(fn, streams[i], "stream", streams[i]->error);
    acme_stream_release(streams[i]);
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

DK_Status acme_stream_add_callback(int32_t dev, DK_Stream stream, DK_HostFn fn,
                                  void *user_data) {
  static const char fname[] = "stream_add_callback";
  acme_device *d;
  acme_stream *s;
  DK_Status st = acme_device_get(fname, dev, &d);
  if (st != DK_OK) return st;
  if (!fn) return acme_set_error(DK_INVALID_ARGUMENT, "%s: fn is NULL", fname);
  if ((st = acme_stream_acquire(fname, d, stream, &s)) != DK_OK) return st;
  callback_args *a = acme_work_new(sizeof *a, run_callback, NULL);
  if (!a) {
    acme_stream_release(s);
    return acme_set_error(DK_RESOURCE_EXHAUSTED,
                         "%s: host out of memory queuing the callback", fname);
  }
  *a = (callback_args){fn, user_data};
  acme_work_submit(s, a);
  acme_stream_release(s);
  return DK_OK;
}

/* ======================================================================== */
/* Events                                                                    */
/* ======================================================================== */

/* One event_record: done once the worker reaches it. Each record gets its own
 * mark so that a wait captures exactly the record current at its call, even
 * when a later re-record on another stream completes first. */
typedef struct acme_mark {
  int refs;     /* the event's `last`, queued record/wait work, waiters */
  bool done;
  uint64_t ns;  /* CLOCK_MONOTONIC completion time */
  acme_error *error; /* the stream's sticky error when the record ran, if set */
} acme_mark;

typedef struct acme_event {
  uint32_t flags;
  atomic_int refs; /* registry entry + queued work + calls in flight */
  pthread_mutex_t mu; /* guards last and every field of its marks */
  pthread_cond_t cv;  /* a mark of this event became done */
  acme_mark *last;     /* most recent record; NULL = never recorded */
} acme_event;

static uint64_t now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static void mark_free(acme_mark *m) {
  if (!m) return;
  error_put(m->error);
  free(m);
}

/* Caller holds e->mu. */
static void mark_put(acme_mark *m) {
  if (--m->refs == 0) mark_free(m);
}

/* Caller holds e->mu; returns with it held once m is done. */
static void mark_wait(acme_event *e, acme_mark *m) {
  if (m->done) return;
  m->refs++; /* a re-record may drop the event's reference meanwhile */
  while (!m->done) pthread_cond_wait(&e->cv, &e->mu);
  mark_put(m);
}

static DK_Status event_acquire(const char *fn, const char *what,
                               acme_device *d, DK_Event event,
                               acme_event **out) {
  *out = NULL;
  if (!event)
    return acme_set_error(DK_INVALID_ARGUMENT, "%s: %s is NULL", fn, what);
  acme_event *e = (acme_event *)event;
  pthread_mutex_lock(&d->event_mu);
  bool live = acme_table_find(&d->events, (uintptr_t)e, NULL);
  if (live) atomic_fetch_add(&e->refs, 1);
  pthread_mutex_unlock(&d->event_mu);
  if (!live)
    return acme_set_error(DK_INVALID_ARGUMENT,
                         "%s: %s %p is not a live event on acme device %d", fn,
                         what, (void *)event, (int)d->index);
  *out = e;
  return DK_OK;
}

static void event_release(acme_event *e) {
  if (atomic_fetch_sub(&e->refs, 1) != 1) return;
  /* Last reference: no queued work remains, so only `last` holds its mark. */
  mark_free(e->last);
  pthread_cond_destroy(&e->cv);
  pthread_mutex_destroy(&e->mu);
  free(e);
}

DK_Status acme_event_create(int32_t dev, uint32_t flags, DK_Event *event) {
  static const char fn[] = "event_create";
  acme_device *d;
  DK_Status st = acme_device_get(fn, dev, &d);
  if (st != DK_OK) return st;
  if (!event) return acme_set_error(DK_INVALID_ARGUMENT, "%s: event is NULL", fn);
  if (flags & ~(uint32_t)DK_EVENT_DISABLE_TIMING)
    return acme_set_error(DK_INVALID_ARGUMENT,
                         "%s: unknown flags 0x%x (allowed: "
                         "DK_EVENT_DISABLE_TIMING = 0x%x)",
                         fn, (unsigned)flags, (unsigned)DK_EVENT_DISABLE_TIMING);
  acme_event *e = calloc(1, sizeof *e);
  if (!e) return acme_set_error(DK_RESOURCE_EXHAUSTED, "%s: host out of memory", fn);
  e->flags = flags;
  atomic_init(&e->refs, 1);
  pthread_mutex_init(&e->mu, NULL);
  pthread_cond_init(&e->cv, NULL);
  pthread_mutex_lock(&d->event_mu);
  bool ok = acme_table_insert(&d->events, (uintptr_t)e, 0);
  pthread_mutex_unlock(&d->event_mu);
  if (!ok) {
    event_release(e);
    return acme_set_error(DK_RESOURCE_EXHAUSTED, "%s: host out of memory", fn);
  }
  *event = (DK_Event)e;
  return DK_OK;
}

DK_Status acme_event_destroy(int32_t dev, DK_Event event) {
  acme_device *d;
  DK_Status st = acme_device_get("event_destroy", dev, &d);
  if (st != DK_OK || !event) return st;
  pthread_mutex_lock(&d->event_mu);
  bool live = acme_table_remove(&d->events, (uintptr_t)event, NULL);
  pthread_mutex_unlock(&d->event_mu);
  if (!live)
    return acme_set_error(DK_INVALID_ARGUMENT,
                         "event_destroy: event %p is not a live event on acme "
                         "device %d",
                         (void *)event, (int)d->index);
  event_release((acme_event *)event); /* queued work may still hold it */
  return DK_OK;
}

/* Argument of queued record and wait work: holds a reference to both. */
typedef struct mark_args {
  acme_event *event;
  acme_mark *mark;
} mark_args;

static void run_record(void *arg) {
  mark_args *a = arg;
  /* Records run on their stream's worker, in order: a failure recorded by
   * now came from work queued before this record. */
  acme_error *err = t_stream->error;
  bool failed = error_status(err) != DK_OK;
  if (failed) atomic_fetch_add(&err->refs, 1);
  pthread_mutex_lock(&a->event->mu);
  if (failed) a->mark->error = err;
  a->mark->done = true;
  a->mark->ns = now_ns();
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
static DK_Status acquire_pair(const char *fn, acme_device *d, DK_Event event,
                              DK_Stream stream, acme_event **e,
                              acme_stream **s) {
  *s = NULL;
  DK_Status st = event_acquire(fn, "event", d, event, e);
  if (st != DK_OK) return st;
  if ((st = acme_stream_acquire(fn, d, stream, s)) != DK_OK) event_release(*e);
  return st;
}

DK_Status acme_event_record(int32_t dev, DK_Event event, DK_Stream stream) {
  static const char fn[] = "event_record";
  acme_device *d;
  acme_event *e;
  acme_stream *s;
  DK_Status st = acme_device_get(fn, dev, &d);
  if (st == DK_OK) st = acquire_pair(fn, d, event, stream, &e, &s);
  if (st != DK_OK) return st;

  acme_mark *m = calloc(1, sizeof *m);
  mark_args *a = s ? acme_work_new(sizeof *a, run_record, destroy_mark_args)
                   : NULL;
  if (!m || (s && !a)) {
    free(m);
    if (a) acme_work_discard(a);
    st = acme_set_error(DK_RESOURCE_EXHAUSTED,
                       "%s: host out of memory queuing the record", fn);
  } else {
    if (s) {
      m->refs = 2; /* e->last and the queued record */
      atomic_fetch_add(&e->refs, 1);
      *a = (mark_args){e, m};
    } else { /* default stream: complete on return */
      m->refs = 1;
      m->done = true;
      m->ns = now_ns();
    }
    /* Publish and queue under e->mu, so a wait that captures m is always
     * queued after m's record: otherwise a concurrent wait on the same
     * stream could land ahead of the record and never finish. (Lock order:
     * an event's mu, then a stream's mu; nothing takes them the other way.) */
    pthread_mutex_lock(&e->mu);
    acme_mark *old = e->last;
    e->last = m;
    if (old) mark_put(old);
    if (s) acme_work_submit(s, a);
    pthread_mutex_unlock(&e->mu);
  }
  acme_stream_release(s);
  event_release(e);
  return st;
}

DK_Status acme_stream_wait_event(int32_t dev, DK_Stream stream, DK_Event event) {
  static const char fn[] = "stream_wait_event";
  acme_device *d;
  acme_event *e;
  acme_stream *s;
  DK_Status st = acme_device_get(fn, dev, &d);
  if (st == DK_OK) st = acquire_pair(fn, d, event, stream, &e, &s);
  if (st != DK_OK) return st;

  mark_args *a = s ? acme_work_new(sizeof *a, run_wait, destroy_mark_args)
                   : NULL;
  if (s && !a) {
    st = acme_set_error(DK_RESOURCE_EXHAUSTED,
                       "%s: host out of memory queuing the wait", fn);
  } else {
    /* Capture the record current at call time. */
    pthread_mutex_lock(&e->mu);
    acme_mark *m = e->last;
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
      acme_work_submit(s, a);
    else if (a)
      acme_work_discard(a);
  }
  acme_stream_release(s);
  event_release(e);
  return st;
}

DK_Status acme_event_query(int32_t dev, DK_Event event) {
  static const char fn[] = "event_query";
  acme_device *d;
  acme_event *e;
  DK_Status st = acme_device_get(fn, dev, &d);
  if (st == DK_OK) st = event_acquire(fn, "event", d, event, &e);
  if (st != DK_OK) return st;
  pthread_mutex_lock(&e->mu);
  bool done = !e->last || e->last->done;
  if (done && e->last && e->last->error)
    st = error_report(fn, e, "the stream before event", e->last->error);
  pthread_mutex_unlock(&e->mu);
  event_release(e);
  if (st != DK_OK) return st;
  return done ? DK_OK : DK_NOT_READY;
}

DK_Status acme_event_synchronize(int32_t dev, DK_Event event) {
  static const char fn[] = "event_synchronize";
  acme_device *d;
  acme_event *e;
  DK_Status st = acme_device_get(fn, dev, &d);
  if (st == DK_OK) st = event_acquire(fn, "event", d, event, &e);
  if (st != DK_OK) return st;
  pthread_mutex_lock(&e->mu);
  acme_mark *m = e->last;
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

DK_Status acme_event_elapsed_ms(int32_t dev, DK_Event start, DK_Event end,
                               float *ms) {
  static const char fn[] = "event_elapsed_ms";
  acme_device *d;
  acme_event *ev[2];
  DK_Status st = acme_device_get(fn, dev, &d);
  if (st != DK_OK) return st;
  if (!ms) return acme_set_error(DK_INVALID_ARGUMENT, "%s: ms is NULL", fn);
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
      st = acme_set_error(DK_INVALID_ARGUMENT,
                         "%s: %s event %p was never recorded", fn, names[i],
                         (void *)ev[i]);
    else if (ev[i]->flags & DK_EVENT_DISABLE_TIMING)
      st = acme_set_error(DK_INVALID_ARGUMENT,
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
