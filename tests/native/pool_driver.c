/*
 * pool_driver.c -- drives the plugin-support library's thread pool
 * (devkit/abi/support/threads.c) alone, for tests/test_cpu_threads.py. Built
 * with threads.c; the thread budget comes from the command line, where the
 * library's configuration would give it.
 *
 *   pool_driver THREADS [SPIN_US]
 *                         prints one "name ok" line per check, or the
 *                         failure, and exits 1 on a failure. SPIN_US: the
 *                         workers' spin before they sleep (default 50).
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "dks.h"

static int g_threads;
static int64_t g_spin_ns;
int32_t dks_thread_count(void) { return g_threads; }
int64_t dks_spin_ns(void) { return g_spin_ns; }

static int failures;
#define CHECK(name, cond)                                         \
  do {                                                            \
    if (cond) printf("%s ok\n", name);                            \
    else { printf("%s FAILED (line %d)\n", name, __LINE__); failures++; } \
  } while (0)

/* Whether every thread but the calling one is asleep (state S in
 * /proc/self/task/TID/stat): an idle pool does not spin. */
static bool others_asleep(void) {
  char self[32], path[300], stat[256];
  snprintf(self, sizeof self, "%d", (int)gettid());
  DIR *d = opendir("/proc/self/task");
  bool asleep = true;
  for (struct dirent *e; (e = readdir(d));) {
    if (e->d_name[0] == '.' || strcmp(e->d_name, self) == 0) continue;
    snprintf(path, sizeof path, "/proc/self/task/%s/stat", e->d_name);
    FILE *f = fopen(path, "r");
    if (!f) continue; /* exited meanwhile */
    size_t n = fread(stat, 1, sizeof stat - 1, f);
    fclose(f);
    stat[n] = 0;
    const char *state = strrchr(stat, ')'); /* "TID (name) STATE ..." */
    asleep = asleep && state && state[1] == ' ' && state[2] == 'S';
  }
  closedir(d);
  return asleep;
}

static int task_count(void) {
  DIR *d = opendir("/proc/self/task");
  int n = 0;
  for (struct dirent *e; (e = readdir(d));) n += e->d_name[0] != '.';
  closedir(d);
  return n;
}

/* Counts how often each index is visited, and the smallest chunk but the last. */
typedef struct coverage {
  atomic_int *hits;
  int64_t n, grain;
  atomic_int_fast64_t short_chunks, chunks;
  pthread_t caller;
  atomic_int off_caller; /* chunks run on another thread */
} coverage;

static void cover(void *arg, int64_t begin, int64_t end) {
  coverage *c = arg;
  for (int64_t i = begin; i < end; i++) atomic_fetch_add(&c->hits[i], 1);
  if (end - begin < c->grain && end != c->n) atomic_fetch_add(&c->short_chunks, 1);
  atomic_fetch_add(&c->chunks, 1);
  if (!pthread_equal(pthread_self(), c->caller)) atomic_fetch_add(&c->off_caller, 1);
}

static bool covered_once(int64_t n, int64_t grain, coverage *c) {
  *c = (coverage){.hits = calloc((size_t)(n ? n : 1), sizeof(atomic_int)), .n = n, .grain = grain,
                  .caller = pthread_self()};
  dks_parallel_for(n, grain, cover, c);
  bool ok = c->short_chunks == 0;
  for (int64_t i = 0; i < n; i++) ok = ok && c->hits[i] == 1;
  free(c->hits);
  return ok;
}

/* Every chunk starts a nested loop, which must run whole on the chunk's thread. */
typedef struct nested {
  atomic_int bad;
} nested;

typedef struct inner_probe {
  pthread_t thread;
  int calls;
  int64_t begin, end;
} inner_probe;

static void inner_record(void *arg, int64_t begin, int64_t end) {
  inner_probe *p = arg;
  p->thread = pthread_self();
  p->calls++;
  p->begin = begin;
  p->end = end;
}

static void outer(void *arg, int64_t begin, int64_t end) {
  nested *n = arg;
  for (int64_t i = begin; i < end; i++) {
    inner_probe p = {0};
    dks_parallel_for(1000, 10, inner_record, &p);
    if (p.calls != 1 || !pthread_equal(p.thread, pthread_self()) || p.begin != 0 || p.end != 1000)
      atomic_fetch_add(&n->bad, 1);
  }
}

/* Home shares: per chunk of a 4-chunks-per-thread job, the thread that ran
 * it and its place in that thread's order. The caller's chunks are slow,
 * so every worker reaches its own share before the caller could take it. */
typedef struct share_probe {
  int job; /* 1, 2, ...: a thread's order restarts in each */
  pthread_t caller;
  pthread_t thread[4 * DKS_MAX_THREADS];
  int order[4 * DKS_MAX_THREADS];
} share_probe;

static _Thread_local int t_job, t_chunks_run;

static void record_share(void *arg, int64_t begin, int64_t end) {
  share_probe *p = arg;
  if (t_job != p->job) {
    t_job = p->job;
    t_chunks_run = 0;
  }
  for (int64_t i = begin; i < end; i++) {
    p->thread[i] = pthread_self();
    p->order[i] = t_chunks_run++;
  }
  usleep(pthread_equal(pthread_self(), p->caller) ? 20000 : 5000);
}

/* Runs one job; per share, the thread that ran its first chunk. */
static bool shares_of_job(int job, pthread_t *opener) {
  static share_probe p;
  memset(&p, 0, sizeof p);
  p.job = job;
  p.caller = pthread_self();
  dks_parallel_for(4 * g_threads, 1, record_share, &p);
  bool ok = true;
  for (int s = 0; s < g_threads; s++) {
    int first = 4 * s;
    opener[s] = p.thread[first];
    /* its first chunk was the share's, and it ran the share in order */
    ok = ok && p.order[first] == 0;
    for (int i = first + 1; i < first + 4; i++)
      ok = ok && (!pthread_equal(p.thread[i], p.thread[i - 1]) || p.order[i] == p.order[i - 1] + 1);
  }
  return ok && pthread_equal(opener[0], p.caller);
}

/* Sets the CPUs of every thread of the process. */
static void set_all_threads_cpus(const cpu_set_t *cpus) {
  DIR *d = opendir("/proc/self/task");
  for (struct dirent *e; (e = readdir(d));)
    if (e->d_name[0] != '.') sched_setaffinity(atoi(e->d_name), sizeof *cpus, cpus);
  closedir(d);
}

static bool all_threads_have_cpus(const cpu_set_t *cpus) {
  DIR *d = opendir("/proc/self/task");
  bool same = true;
  for (struct dirent *e; (e = readdir(d));) {
    cpu_set_t got;
    if (e->d_name[0] != '.' && sched_getaffinity(atoi(e->d_name), sizeof got, &got) == 0)
      same = same && CPU_EQUAL(&got, cpus);
  }
  closedir(d);
  return same;
}

typedef struct cpu_probe {
  pthread_t caller;
  int caller_cpu;
  atomic_int worker_chunks_on_caller_cpu;
} cpu_probe;

static void record_cpu(void *arg, int64_t begin, int64_t end) {
  (void)begin, (void)end;
  cpu_probe *p = arg;
  if (!pthread_equal(pthread_self(), p->caller) && sched_getcpu() == p->caller_cpu)
    atomic_fetch_add(&p->worker_chunks_on_caller_cpu, 1);
  struct timespec start, now; /* 200 us of work */
  clock_gettime(CLOCK_MONOTONIC, &start);
  do clock_gettime(CLOCK_MONOTONIC, &now);
  while ((now.tv_sec - start.tv_sec) * 1000000000L + (now.tv_nsec - start.tv_nsec) < 200000);
}

/* Workers left spinning on the caller's CPU (every thread pinned there for
 * a job, then the workers allowed every CPU again) run none of the next
 * job's chunks there: the caller moves them off its CPU, and they take
 * their CPUs back afterwards. There is nothing to check without two
 * threads, a spin, and a CPU for each thread (more threads than CPUs share
 * some anyway). */
static bool spinning_worker_moved_off_caller_cpu(void) {
  cpu_set_t all, first;
  if (sched_getaffinity(0, sizeof all, &all) != 0 || g_threads < 2 || g_threads > CPU_COUNT(&all) ||
      g_spin_ns == 0)
    return true;
  int cpu = 0;
  while (!CPU_ISSET(cpu, &all)) cpu++;
  CPU_ZERO(&first);
  CPU_SET(cpu, &first);
  int64_t spin = g_spin_ns;
  g_spin_ns = 200000000; /* the workers spin through the check */
  set_all_threads_cpus(&first);
  cpu_probe warm = {.caller = pthread_self(), .caller_cpu = -1};
  dks_parallel_for(8 * g_threads, 1, record_cpu, &warm); /* the workers take part, then spin on `cpu` */
  set_all_threads_cpus(&all);
  sched_setaffinity(0, sizeof first, &first); /* the caller stays there */
  cpu_probe p = {.caller = pthread_self(), .caller_cpu = cpu};
  dks_parallel_for(8 * g_threads, 1, record_cpu, &p);
  g_spin_ns = spin;
  sched_setaffinity(0, sizeof all, &all);
  bool restored = false;
  for (int tries = 0; tries < 100 && !restored; tries++) {
    usleep(1000);
    restored = all_threads_have_cpus(&all);
  }
  return atomic_load(&p.worker_chunks_on_caller_cpu) == 0 && restored;
}

/* Streams: several threads call at once; each must get its whole range. */
static void *stream_caller(void *arg) {
  atomic_int *bad = arg;
  for (int r = 0; r < 200; r++) {
    coverage c;
    if (!covered_once(10007, 100, &c)) atomic_fetch_add(bad, 1);
  }
  return NULL;
}

int main(int argc, char **argv) {
  g_threads = argc > 1 ? atoi(argv[1]) : 2;
  g_spin_ns = (argc > 2 ? atoi(argv[2]) : 50) * (int64_t)1000;
  int baseline = task_count();
  coverage c;
  bool all = true;
  for (int64_t n = 0; n < 300; n++)
    for (int64_t grain = 1; grain < 40; grain += 7) all = all && covered_once(n, grain, &c);
  all = all && covered_once(1 << 20, 1000, &c) && covered_once(999983, 1, &c);
  CHECK("every_index_once", all);

  covered_once(99, 50, &c); /* under 2 * grain: one call on the caller */
  CHECK("small_work_on_caller", c.chunks == 1 && c.off_caller == 0);

  covered_once(1 << 20, 1000, &c);
  CHECK("chunks_per_budget", g_threads == 1 ? c.chunks == 1 : c.chunks == 4 * g_threads);
  CHECK("workers_started", task_count() == baseline + g_threads - 1);
  /* Well past the spin: a worker's state is read some time after it
   * sleeps, even on a loaded machine. */
  bool asleep = false;
  for (int tries = 0; tries < 50 && !asleep; tries++) {
    usleep(20000);
    asleep = others_asleep();
  }
  CHECK("idle_workers_sleep", asleep);

  /* Every member runs its own share first, and the same one in every job. */
  pthread_t first_job[DKS_MAX_THREADS], second_job[DKS_MAX_THREADS];
  bool shares = shares_of_job(1, first_job) && shares_of_job(2, second_job);
  for (int s = 0; s < g_threads; s++) shares = shares && pthread_equal(first_job[s], second_job[s]);
  CHECK("home_shares", shares);

  nested nest = {0};
  dks_parallel_for(64, 1, outer, &nest);
  CHECK("nested_runs_serially", nest.bad == 0);

  pthread_t callers[3];
  atomic_int bad = 0;
  for (int i = 0; i < 3; i++) pthread_create(&callers[i], NULL, stream_caller, &bad);
  for (int i = 0; i < 3; i++) pthread_join(callers[i], NULL);
  CHECK("concurrent_callers", bad == 0);

  CHECK("spinning_worker_moved_off_caller_cpu", spinning_worker_moved_off_caller_cpu());

  fflush(stdout);
  pid_t child = fork();
  if (child == 0) { /* the child starts its own workers */
    coverage cc;
    int ok = covered_once(1 << 16, 100, &cc) && task_count() == g_threads;
    _exit(ok ? 0 : 1);
  }
  int status = 0;
  waitpid(child, &status, 0);
  CHECK("fork_child_pool", WIFEXITED(status) && WEXITSTATUS(status) == 0);

  dks_threads_shutdown();
  CHECK("shutdown_joins_workers", task_count() == baseline);
  CHECK("restart_after_shutdown", covered_once(1 << 16, 100, &c));
  return failures ? 1 : 0;
}
