/*
 * graph.c -- the graph section (ABI 1.1) of the devkit plugin-support
 * library.
 *
 * Capture: while a stream captures, dks_work_submit hands every work item
 * (kernel launches, copies, memsets) to the graph, which keeps it and re-runs
 * it at each launch; event records and waits become event nodes, bound to a
 * fresh record / the current record at each launch. A kernel item already
 * holds a deep copy of its call (kernel.c), with every tensor resolved to
 * its address: the graph's slots point at those resolved tensors, and a
 * rebind re-resolves one.
 *
 * Launch: one work item on the stream's worker that runs every node in
 * capture order. Before submitting, the launch checks that every non-empty
 * slot's and every copy operand's memory is still allocated.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dks_internal.h"

typedef enum node_kind { NODE_WORK, NODE_RECORD, NODE_WAIT } node_kind;

typedef struct graph_node {
  node_kind kind;
  void *work;       /* NODE_WORK: the captured item's arg (owned) */
  dks_event *event; /* NODE_RECORD / NODE_WAIT: a reference */
} graph_node;

/* A tensor of a captured kernel call. Its elements span bytes
 * [low, low + span) relative to the slot's (mem, offset). */
typedef struct graph_slot {
  dks_tensor *tensor; /* inside the kernel's work item */
  DK_Mem mem;
  size_t offset;
  int64_t low;
  size_t span;
} graph_slot;

typedef struct graph_mem {
  DK_Mem mem;
  size_t offset, size;
} graph_mem;

struct dks_graph {
  dks_device *device;
  atomic_int refs;    /* the handle, and every launch not yet run */
  atomic_int pending; /* launches submitted and not yet run */
  pthread_mutex_t mu; /* guards the arrays below and the slots' tensors */
  graph_node *nodes;
  size_t num_nodes, nodes_cap;
  graph_slot *slots;
  size_t num_slots, slots_cap;
  graph_mem *mems;
  size_t num_mems, mems_cap;
  size_t num_event_nodes;
  dks_event **events; /* distinct events of the nodes, in address order */
  size_t num_events;
  bool out_of_memory; /* an append failed during capture */
};

/* Grows *items (of item_size bytes each) to hold `needed`. */
static bool reserve(void *items, size_t *cap, size_t needed, size_t item_size) {
  if (needed <= *cap) return true;
  size_t n = *cap ? *cap : 8;
  while (n < needed) n *= 2;
  void *grown = realloc(*(void **)items, n * item_size);
  if (!grown) return false;
  *(void **)items = grown;
  *cap = n;
  return true;
}

static void graph_free(dks_graph *g) {
  for (size_t i = 0; i < g->num_nodes; i++) {
    if (g->nodes[i].kind == NODE_WORK)
      dks_work_free(g->nodes[i].work);
    else
      dks_event_put(g->nodes[i].event);
  }
  free(g->nodes);
  free(g->slots);
  free(g->mems);
  free(g->events);
  pthread_mutex_destroy(&g->mu);
  free(g);
}

static void graph_put(dks_graph *g) {
  if (atomic_fetch_sub(&g->refs, 1) == 1) graph_free(g);
}

/* ---- Capture-time appends --------------------------------------------------- */

void dks_graph_add_work(dks_graph *g, void *arg) {
  pthread_mutex_lock(&g->mu);
  bool ok = reserve(&g->nodes, &g->nodes_cap, g->num_nodes + 1, sizeof *g->nodes);
  if (ok) g->nodes[g->num_nodes++] = (graph_node){NODE_WORK, arg, NULL};
  if (!ok) g->out_of_memory = true;
  pthread_mutex_unlock(&g->mu);
  if (!ok) dks_work_free(arg);
}

DK_Status dks_graph_add_event(dks_graph *g, dks_event *e, bool record) {
  pthread_mutex_lock(&g->mu);
  bool ok = reserve(&g->nodes, &g->nodes_cap, g->num_nodes + 1, sizeof *g->nodes);
  if (ok) {
    dks_event_retain(e);
    g->nodes[g->num_nodes++] = (graph_node){record ? NODE_RECORD : NODE_WAIT, NULL, e};
    g->num_event_nodes++;
  }
  pthread_mutex_unlock(&g->mu);
  return ok ? DK_OK
            : dks_set_error(DK_RESOURCE_EXHAUSTED, "%s: host out of memory capturing the event",
                            record ? "event_record" : "stream_wait_event");
}

DK_Status dks_graph_add_mem(dks_graph *g, DK_Mem mem, size_t offset, size_t size) {
  pthread_mutex_lock(&g->mu);
  bool ok = reserve(&g->mems, &g->mems_cap, g->num_mems + 1, sizeof *g->mems);
  if (ok) g->mems[g->num_mems++] = (graph_mem){mem, offset, size};
  pthread_mutex_unlock(&g->mu);
  return ok ? DK_OK : dks_set_error(DK_RESOURCE_EXHAUSTED, "copy: host out of memory capturing it");
}

/* The byte extent of t's elements relative to element 0's address: the
 * launch checked that it fits int64, except for an empty tensor, whose
 * strides may be anything (it reaches no memory). */
static void tensor_extent(const dks_tensor *t, int64_t *low, size_t *span) {
  *low = 0;
  *span = 0;
  if (!t->size) return;
  int64_t lo = 0, hi = 0;
  for (int32_t k = 0; k < t->ndim; k++) {
    int64_t reach = (t->shape[k] - 1) * t->strides[k];
    if (reach < 0) lo += reach; else hi += reach;
  }
  *low = lo * t->itemsize;
  *span = (size_t)((hi - lo + 1) * t->itemsize);
}

DK_Status dks_graph_add_tensors(dks_graph *g, const DK_KernelCall *call, dks_tensor *tensors) {
  size_t total = call->num_inputs + call->num_outputs;
  pthread_mutex_lock(&g->mu);
  bool ok = reserve(&g->slots, &g->slots_cap, g->num_slots + total, sizeof *g->slots);
  for (size_t i = 0; ok && i < total; i++) {
    const DK_Tensor *t = i < call->num_inputs ? &call->inputs[i]
                                              : &call->outputs[i - call->num_inputs];
    if (tensors[i].ndim == -1) continue; /* an omitted optional input */
    graph_slot *slot = &g->slots[g->num_slots++];
    *slot = (graph_slot){&tensors[i], (DK_Mem)t->data, (size_t)t->byte_offset, 0, 0};
    tensor_extent(&tensors[i], &slot->low, &slot->span);
  }
  pthread_mutex_unlock(&g->mu);
  return ok ? DK_OK
            : dks_set_error(DK_RESOURCE_EXHAUSTED, "kernel: host out of memory capturing its tensors");
}

/* ---- Handles ------------------------------------------------------------------ */

static DK_Status graph_acquire(const char *fn, dks_device *d, DK_Graph graph, dks_graph **out) {
  *out = NULL;
  if (!graph) return dks_set_error(DK_INVALID_ARGUMENT, "%s: graph is NULL", fn);
  dks_graph *g = (dks_graph *)graph;
  pthread_mutex_lock(&d->graph_mu);
  bool live = dks_table_find(&d->graphs, (uintptr_t)g, NULL);
  if (live) atomic_fetch_add(&g->refs, 1);
  pthread_mutex_unlock(&d->graph_mu);
  if (!live)
    return dks_set_error(DK_INVALID_ARGUMENT, "%s: graph %p is not a live graph on %s device %d",
                         fn, (void *)graph, dks_name(), (int)d->index);
  *out = g;
  return DK_OK;
}

/* Acquires the device and a non-NULL stream for a capture call. */
static DK_Status capture_stream(const char *fn, int32_t dev, DK_Stream stream, dks_device **d,
                                dks_stream **s) {
  *s = NULL;
  DK_Status st = dks_device_get(fn, dev, d);
  if (st != DK_OK) return st;
  if (!stream)
    return dks_set_error(DK_INVALID_ARGUMENT, "%s: stream is NULL; the default stream cannot capture",
                         fn);
  return dks_stream_acquire(fn, *d, stream, s);
}

DK_Status dks_graph_begin_capture(int32_t dev, DK_Stream stream) {
  static const char fn[] = "graph_begin_capture";
  dks_device *d;
  dks_stream *s;
  DK_Status st = capture_stream(fn, dev, stream, &d, &s);
  if (st != DK_OK) return st;
  dks_graph *g = calloc(1, sizeof *g);
  if (!g) {
    dks_stream_release(s);
    return dks_set_error(DK_RESOURCE_EXHAUSTED, "%s: host out of memory", fn);
  }
  g->device = d;
  atomic_init(&g->refs, 1);
  pthread_mutex_init(&g->mu, NULL);
  if ((st = dks_stream_begin_capture(fn, s, g)) != DK_OK)
    graph_free(g);
  else
    atomic_fetch_add(&d->capturing, 1);
  dks_stream_release(s);
  return st;
}

static int compare_pointers(const void *a, const void *b) {
  uintptr_t x = (uintptr_t) * (void *const *)a, y = (uintptr_t) * (void *const *)b;
  return (x > y) - (x < y);
}

/* The distinct events of g's nodes, in address order (the order a launch
 * locks them in). */
static bool collect_events(dks_graph *g) {
  if (!g->num_event_nodes) return true;
  g->events = malloc(g->num_event_nodes * sizeof *g->events);
  if (!g->events) return false;
  size_t n = 0;
  for (size_t i = 0; i < g->num_nodes; i++)
    if (g->nodes[i].kind != NODE_WORK) g->events[n++] = g->nodes[i].event;
  qsort(g->events, n, sizeof *g->events, compare_pointers);
  size_t distinct = 0;
  for (size_t i = 0; i < n; i++)
    if (!distinct || g->events[distinct - 1] != g->events[i]) g->events[distinct++] = g->events[i];
  g->num_events = distinct;
  return true;
}

DK_Status dks_graph_end_capture(int32_t dev, DK_Stream stream, DK_Graph *graph, size_t *num_slots) {
  static const char fn[] = "graph_end_capture";
  dks_device *d;
  dks_stream *s;
  DK_Status st = capture_stream(fn, dev, stream, &d, &s);
  if (st != DK_OK) return st;
  if (!graph || !num_slots) {
    dks_stream_release(s);
    return dks_set_error(DK_INVALID_ARGUMENT, "%s: %s is NULL", fn, graph ? "num_slots" : "graph");
  }
  dks_graph *g = dks_stream_end_capture(s);
  dks_stream_release(s);
  if (!g)
    return dks_set_error(DK_FAILED_PRECONDITION, "%s: stream %p is not capturing", fn,
                         (void *)stream);
  atomic_fetch_sub(&d->capturing, 1);
  bool ok = !g->out_of_memory && collect_events(g);
  if (ok) {
    pthread_mutex_lock(&d->graph_mu);
    ok = dks_table_insert(&d->graphs, (uintptr_t)g, 0);
    pthread_mutex_unlock(&d->graph_mu);
  }
  if (!ok) {
    graph_free(g);
    return dks_set_error(DK_RESOURCE_EXHAUSTED, "%s: host out of memory recording the graph", fn);
  }
  *graph = (DK_Graph)g;
  *num_slots = g->num_slots;
  return DK_OK;
}

DK_Status dks_graph_destroy(int32_t dev, DK_Graph graph) {
  dks_device *d;
  DK_Status st = dks_device_get("graph_destroy", dev, &d);
  if (st != DK_OK || !graph) return st;
  pthread_mutex_lock(&d->graph_mu);
  bool live = dks_table_remove(&d->graphs, (uintptr_t)graph, NULL);
  pthread_mutex_unlock(&d->graph_mu);
  if (!live)
    return dks_set_error(DK_INVALID_ARGUMENT,
                         "graph_destroy: graph %p is not a live graph on %s device %d",
                         (void *)graph, dks_name(), (int)d->index);
  graph_put((dks_graph *)graph); /* pending launches hold their own references */
  return DK_OK;
}

/* ---- Rebind ------------------------------------------------------------------- */

DK_Status dks_graph_rebind(int32_t dev, DK_Graph graph, size_t slot, DK_Mem mem, size_t offset) {
  static const char fn[] = "graph_rebind";
  dks_device *d;
  dks_graph *g;
  DK_Status st = dks_device_get(fn, dev, &d);
  if (st == DK_OK) st = graph_acquire(fn, d, graph, &g);
  if (st != DK_OK) return st;
  pthread_mutex_lock(&g->mu);
  if (slot >= g->num_slots) {
    st = dks_set_error(DK_OUT_OF_RANGE, "%s: slot %zu does not exist: the graph has %zu slot(s)",
                       fn, slot, g->num_slots);
  } else if (atomic_load(&g->pending)) {
    st = dks_set_error(DK_FAILED_PRECONDITION,
                       "%s: %d launch(es) of graph %p are pending; synchronize the streams "
                       "they were launched on first",
                       fn, atomic_load(&g->pending), (void *)graph);
  } else {
    graph_slot *s = &g->slots[slot];
    uint8_t *first;
    if ((int64_t)offset + s->low < 0)
      st = dks_set_error(DK_OUT_OF_RANGE, "%s: slot %zu would start before its buffer", fn, slot);
    else
      st = dks_mem_range(fn, "mem", d, mem, (size_t)((int64_t)offset + s->low), s->span, &first);
#ifndef DEVKIT_DEFECT_GRAPH_IGNORES_REBIND
    if (st == DK_OK) {
      s->mem = mem;
      s->offset = offset;
      s->tensor->data = s->span ? first - s->low : NULL;
    }
#endif
  }
  pthread_mutex_unlock(&g->mu);
  graph_put(g);
  return st;
}

/* ---- Launch ------------------------------------------------------------------- */

typedef struct launch_args {
  dks_graph *graph;
  void *bound[]; /* the launch's record / wait items, in node order */
} launch_args;

static void run_graph(void *arg) {
  launch_args *a = arg;
  dks_graph *g = a->graph;
  DK_Status first = DK_OK;
  char message[768] = "";
  size_t b = 0;
  /* Every node runs even after a failure (records must complete); the
   * first failure is the launch's. */
  for (size_t i = 0; i < g->num_nodes; i++) {
    DK_Status st = g->nodes[i].kind == NODE_WORK ? dks_work_rerun(g->nodes[i].work)
                                                 : dks_work_run_once(a->bound[b++]);
    if (st != DK_OK && first == DK_OK) {
      first = st;
      snprintf(message, sizeof message, "%s", dks_last_error());
    }
  }
  if (first != DK_OK) dks_work_fail(first, "graph_launch: %s", message);
}

static void destroy_launch(void *arg) {
  launch_args *a = arg;
  atomic_fetch_sub(&a->graph->pending, 1);
  graph_put(a->graph);
}

/* Whether [offset, offset + size) of mem lies inside a live allocation;
 * *last / *last_size cache the allocation checked before, since consecutive
 * slots mostly lie in one (a plan's arena). The caller holds d->mem_mu. */
static bool range_live(dks_device *d, DK_Mem mem, size_t offset, size_t size, DK_Mem *last,
                       size_t *last_size) {
  if (!mem) return false;
  if (mem != *last) {
    if (!dks_table_find(&d->mems, (uintptr_t)mem, last_size)) return false;
    *last = mem;
  }
  return offset <= *last_size && size <= *last_size - offset;
}

/* An empty tensor reaches no memory: the kernel launch accepted any data
 * for it (NULL too), so the launch checks none. */
static bool slot_reaches_memory(const graph_slot *s) { return s->span != 0; }

/* The fast check of check_memory: every range under one hold of the
 * device's memory lock, each allocation looked up once per run of ranges
 * in it. */
static bool memory_live(dks_graph *g) {
  dks_device *d = g->device;
  DK_Mem last = NULL;
  size_t last_size = 0;
  bool live = true;
  pthread_mutex_lock(&d->mem_mu);
  for (size_t i = 0; live && i < g->num_slots; i++) {
    const graph_slot *s = &g->slots[i];
    live = !slot_reaches_memory(s) ||
           range_live(d, s->mem, (size_t)((int64_t)s->offset + s->low), s->span, &last, &last_size);
  }
  for (size_t i = 0; live && i < g->num_mems; i++)
    live = range_live(d, g->mems[i].mem, g->mems[i].offset, g->mems[i].size, &last, &last_size);
  pthread_mutex_unlock(&d->mem_mu);
  return live;
}

/* Every slot and copy operand still lies inside a live allocation. A
 * failed fast check is redone range by range, for the error naming the
 * first bad one. The caller holds g->mu. */
static DK_Status check_memory(const char *fn, dks_graph *g) {
  if (memory_live(g)) return DK_OK;
  uint8_t *unused;
  DK_Status st = DK_OK;
  for (size_t i = 0; st == DK_OK && i < g->num_slots; i++) {
    const graph_slot *s = &g->slots[i];
    if (slot_reaches_memory(s))
      st = dks_mem_range(fn, "a slot's", g->device, s->mem, (size_t)((int64_t)s->offset + s->low),
                         s->span, &unused);
  }
  for (size_t i = 0; st == DK_OK && i < g->num_mems; i++)
    st = dks_mem_range(fn, "a copy's", g->device, g->mems[i].mem, g->mems[i].offset,
                       g->mems[i].size, &unused);
  return st;
}

/* Binds the launch's event items in node order, under every event's lock,
 * and submits it (on a stream, still under the locks: a concurrent wait on
 * the stream then cannot capture one of its records and be queued ahead of
 * it). On failure -- out of memory, or `s` began capturing since the
 * caller's check -- the items bound so far are run at once so that their
 * records complete, and false tells the caller it still owns the launch
 * item. *st: the failure, or a default-stream run's status. */
static bool bind_and_submit(const char *fn, dks_graph *g, launch_args *a, dks_stream *s, DK_Status *st) {
  for (size_t i = 0; i < g->num_events; i++) dks_event_lock(g->events[i]);
  size_t b = 0;
  bool bound = true, queued = false;
  for (size_t i = 0; bound && i < g->num_nodes; i++) {
    if (g->nodes[i].kind == NODE_WORK) continue;
    a->bound[b] = dks_event_bind(g->nodes[i].event, g->nodes[i].kind == NODE_RECORD);
    bound = a->bound[b] != NULL;
    b += bound;
  }
  if (bound && s) queued = dks_work_submit_uncaptured(s, a);
  for (size_t i = g->num_events; i-- > 0;) dks_event_unlock(g->events[i]);
  if (bound && !s) {
    *st = dks_work_submit(NULL, a); /* runs here: records take the event locks */
    return true;
  }
  if (queued) return true;
  for (size_t i = 0; i < b; i++) dks_work_run_once(a->bound[i]);
  *st = bound ? dks_capture_refused(fn, s)
              : dks_set_error(DK_RESOURCE_EXHAUSTED, "%s: host out of memory binding its events", fn);
  return false;
}

/* A launch item for g holding a reference to it, once its memory checks
 * out; NULL (with the error in *st) otherwise. */
static launch_args *new_launch(const char *fn, dks_graph *g, DK_Status *st) {
  launch_args *a = NULL;
  pthread_mutex_lock(&g->mu);
  *st = check_memory(fn, g);
  if (*st == DK_OK) {
    a = dks_work_new(sizeof *a + g->num_event_nodes * sizeof(void *), run_graph, destroy_launch);
    if (!a) *st = dks_set_error(DK_RESOURCE_EXHAUSTED, "%s: host out of memory", fn);
  }
  if (a) { /* counted before the lock drops, so a rebind now is refused */
    atomic_fetch_add(&g->refs, 1);
    atomic_fetch_add(&g->pending, 1);
    a->graph = g;
  }
  pthread_mutex_unlock(&g->mu);
  return a;
}

DK_Status dks_graph_launch(int32_t dev, DK_Graph graph, DK_Stream stream) {
  static const char fn[] = "graph_launch";
  dks_device *d;
  dks_graph *g;
  dks_stream *s = NULL;
  DK_Status st = dks_device_get(fn, dev, &d);
  if (st == DK_OK) st = graph_acquire(fn, d, graph, &g);
  if (st != DK_OK) return st;
  if ((st = dks_stream_acquire(fn, d, stream, &s)) == DK_OK && dks_stream_capturing(s))
    st = dks_capture_refused(fn, s);
  launch_args *a = st == DK_OK ? new_launch(fn, g, &st) : NULL;
  if (a) dks_threads_wake(); /* its kernels are coming: the pool's workers wait for them awake */
  if (a && !bind_and_submit(fn, g, a, s, &st)) {
    destroy_launch(a);
    dks_work_discard(a);
  }
  graph_put(g);
  dks_stream_release(s);
  return st;
}
