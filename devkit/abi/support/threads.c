/*
 * threads.c -- the plugin's one thread pool, behind dks_parallel_for
 * (the contract is in dks.h).
 *
 * The pool holds dks_thread_count() - 1 workers, started by the first call
 * that splits work: the calling thread (a stream worker) is the last member
 * of the budget and takes chunks itself, so a job starts without waiting for
 * a wake-up and a pool of one thread is no pool at all.
 *
 * Each member has a home share of a job's chunks, the same part of [0, n)
 * in every job (of dks_thread_count() equal parts, share 0 is the caller's
 * and share k + 1 worker k's), which it claims first, in order, from
 * its own atomic counter; then it takes what is left of the others' shares.
 * So consecutive kernels over the same range find the bytes that the one
 * before wrote on their core, in its L2, where one shared counter dealt the
 * chunks at random (the fused RMSNorm kernel on 256 x 2048 float32, 2
 * threads on a Zen 3 VM: 88 -> 79 us, medians of 10 interleaved runs), and
 * a member the OS delays (the machine is shared) simply takes fewer.
 *
 * Waking a sleeping thread costs as long as a small kernel (20-50 us on a
 * virtual machine), so neither side sleeps at once:
 * a worker that finished a job spins for DEVKIT_<NAME>_SPIN_US (dks_spin_ns,
 * default 50 us; 0: it sleeps at once) for the next one before it sleeps on
 * a condition variable, which lets a plan's kernels, a few microseconds
 * apart, reach it without a wake-up and leaves an idle pool quiet soon
 * after; the caller, once every chunk is claimed, spins as long for the
 * members still running their last chunk, work in progress, before it
 * sleeps. A spin yields the core after its first few microseconds, so on a
 * loaded machine it costs the threads with work little. A graph launch
 * wakes sleeping workers ahead of its kernels (dks_threads_wake): a plan
 * run after the pool went idle (the first of a batch, or one following
 * other work) then finds them spinning by its first split kernel.
 *
 * A worker on the caller's CPU is moved to the other CPUs for the job
 * (move_worker_off, Linux): left there, the two would share one core for
 * the whole job.
 *
 * One job runs at a time: a call that finds the pool busy (another stream's
 * kernel) runs its range on its own thread, which keeps the streams together
 * inside about the thread budget instead of queueing one behind another.
 *
 * The workers are joined when the plugin is unloaded (or at exit); a child
 * process of fork() starts with no workers and starts its own when needed.
 */
#define _GNU_SOURCE /* sched_getcpu, sched_setaffinity, CPU_* */
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <time.h>
#ifdef __linux__
#include <sys/syscall.h>
#include <unistd.h>
#endif

#include "dks_internal.h"

#define PAUSE_NS 5000 /* a spin's first part, before it yields the core */

typedef struct pool_job {
  dks_range_fn fn;
  void *ctx;
  int64_t n, chunk;
  int num_shares; /* the thread budget: one home share per member */
  /* Share s is chunks [next_chunk[s], share_end[s]): a member claims from
   * next_chunk[s] until it passes share_end[s]. */
  atomic_int_fast64_t next_chunk[DKS_MAX_THREADS];
  int64_t share_end[DKS_MAX_THREADS];
  /* Threads working on the job, the caller included: joined under mu while
   * the job is posted, left with the decrement (the job may be gone after). */
  atomic_int members;
  int caller_cpu; /* where the caller runs (-1: unknown) */
} pool_job;

static struct {
  pthread_mutex_t mu;
  pthread_cond_t wake;     /* workers: a new job, or stop */
  pthread_cond_t finished; /* the caller: the last member left its job */
  pool_job *job;           /* the job taking members; NULL when none */
  /* Jobs posted so far, a worker joins each once: written under mu, read
   * without it by a spinning worker. */
  atomic_uint_fast64_t generation;
  int num_workers;         /* started */
  int num_sleeping;        /* workers waiting on `wake` */
  bool stop;
  pthread_t workers[DKS_MAX_THREADS];
  /* Per worker: the CPU it ran its last job on (-1 while it sleeps), its
   * thread id, and whether it was moved off a caller's CPU (move_worker_off). */
  atomic_int last_cpu[DKS_MAX_THREADS];
  atomic_long tid[DKS_MAX_THREADS];
  atomic_bool moved[DKS_MAX_THREADS];
} g_pool = {.mu = PTHREAD_MUTEX_INITIALIZER, .wake = PTHREAD_COND_INITIALIZER,
            .finished = PTHREAD_COND_INITIALIZER};

/* Set while this thread runs a chunk: a dks_parallel_for made there runs
 * serially. */
static _Thread_local bool t_in_chunk;

/* The member with home share `home` runs chunks until none is left: its
 * share's first, then the others', from the next share on. */
static void run_chunks(pool_job *job, int home) {
  t_in_chunk = true;
  for (int k = 0; k < job->num_shares; k++) {
    int s = (home + k) % job->num_shares;
    for (int64_t c; (c = atomic_fetch_add(&job->next_chunk[s], 1)) < job->share_end[s];) {
      int64_t begin = c * job->chunk, end = begin + job->chunk;
      job->fn(job->ctx, begin, end < job->n ? end : job->n);
    }
  }
  t_in_chunk = false;
}

/* A worker leaves (under mu): the caller may be asleep waiting for it. */
static void leave_job(pool_job *job) {
  if (atomic_fetch_sub(&job->members, 1) == 2) pthread_cond_signal(&g_pool.finished);
}

uint64_t dks_now_ns(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (uint64_t)t.tv_sec * 1000000000u + (uint64_t)t.tv_nsec;
}

void dks_spin_pause(void) {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  __asm__ __volatile__("yield");
#endif
}

/* Spins for up to dks_spin_ns() until done(arg): with pause at first,
 * then yielding the core (sched_yield), so that on a loaded machine the
 * wait gives way to the threads that have work. */
static void spin_until(bool (*done)(const void *), const void *arg) {
  int64_t start = (int64_t)dks_now_ns(), spin = dks_spin_ns();
  for (int64_t t = start; !done(arg) && t - start < spin; t = (int64_t)dks_now_ns()) {
    if (t - start < PAUSE_NS)
      for (int i = 0; i < 64 && !done(arg); i++) dks_spin_pause();
    else
      sched_yield();
  }
}

static bool alone_in_job(const void *job) {
  return atomic_load(&((const pool_job *)job)->members) == 1;
}

static bool job_posted_since(const void *generation) {
  return atomic_load(&g_pool.generation) != *(const uint64_t *)generation;
}

static int current_cpu(void) {
#ifdef __linux__
  return sched_getcpu();
#else
  return -1;
#endif
}

/* A worker on the caller's own CPU would share it with the caller for the
 * whole job: the scheduler keeps a thread that ran moments ago where its
 * cache is, and wakes one beside its waker, even next to an idle CPU (a
 * stream's worker, woken onto the pool worker's CPU while the host thread
 * slept in synchronize, ran 2-thread kernels at 1-thread speed: the fused
 * GELU on 256 x 2048 float32 in 208 us, 98 us launched from the host
 * thread). So a caller moves the workers awake on its CPU to the other CPUs
 * they may use before it posts a job (under mu), a worker that finds itself
 * on the caller's CPU as it joins moves itself, and a moved worker takes its
 * own CPUs back (`g_saved`) when the job is done, or before it sleeps if it
 * joined none. */
#ifdef __linux__
static cpu_set_t g_saved[DKS_MAX_THREADS]; /* a moved worker's CPUs before the move */

/* Moves worker k (thread `tid`; 0: the calling thread) off `busy_cpu`, where it
 * may use another. */
static void move_worker_off(int k, long tid, int busy_cpu) {
  cpu_set_t saved, others;
  if (atomic_load(&g_pool.moved[k]) || sched_getaffinity((pid_t)tid, sizeof saved, &saved) != 0) return;
  others = saved;
  CPU_CLR(busy_cpu, &others);
  if (CPU_COUNT(&others) == 0) return;
  g_saved[k] = saved;
  if (sched_setaffinity((pid_t)tid, sizeof others, &others) == 0) atomic_store(&g_pool.moved[k], true);
}

static void restore_cpus(int k) { sched_setaffinity(0, sizeof g_saved[k], &g_saved[k]); }
#else
static void move_worker_off(int k, long tid, int busy_cpu) { (void)k, (void)tid, (void)busy_cpu; }
static void restore_cpus(int k) { (void)k; }
#endif

/* The caller waits until it is the job's last member. */
static void join_members(pool_job *job) {
  spin_until(alone_in_job, job);
  pthread_mutex_lock(&g_pool.mu);
  while (atomic_load(&job->members) > 1) pthread_cond_wait(&g_pool.finished, &g_pool.mu);
  pthread_mutex_unlock(&g_pool.mu);
}

/* A worker's wait (under mu) for a job posted after its last one, `seen`,
 * or for stop: spinning while jobs keep coming, then asleep. */
static void await_job(int worker, uint64_t seen) {
  bool spin = dks_spin_ns() > 0;
  while (!g_pool.stop && (!g_pool.job || atomic_load(&g_pool.generation) == seen)) {
    if (!spin) {
      atomic_store(&g_pool.last_cpu[worker], -1); /* where it wakes is the scheduler's choice */
      g_pool.num_sleeping++;
      pthread_cond_wait(&g_pool.wake, &g_pool.mu);
      g_pool.num_sleeping--;
      spin = dks_spin_ns() > 0; /* woken ahead of a job (dks_threads_wake) or for one: wait awake */
      continue;
    }
    /* A job posted and finished since (all claimed before this worker
     * came) does not end the wait; the next one posted does. */
    uint64_t at = atomic_load(&g_pool.generation);
    pthread_mutex_unlock(&g_pool.mu);
    spin_until(job_posted_since, &at);
    pthread_mutex_lock(&g_pool.mu);
    spin = atomic_load(&g_pool.generation) != at; /* nothing came: sleep */
    /* moved for a job it did not join: its CPUs back before it sleeps */
    if (!spin && atomic_exchange(&g_pool.moved[worker], false)) restore_cpus(worker);
  }
}

static void *worker_main(void *arg) {
  int home = (int)(intptr_t)arg; /* worker k: share k + 1 */
  uint64_t seen = 0;
#ifdef __linux__
  atomic_store(&g_pool.tid[home - 1], (long)syscall(SYS_gettid));
#endif
  pthread_mutex_lock(&g_pool.mu);
  for (;;) {
    if (atomic_exchange(&g_pool.moved[home - 1], false)) restore_cpus(home - 1);
    await_job(home - 1, seen);
    if (g_pool.stop) break;
    seen = atomic_load(&g_pool.generation);
    pool_job *job = g_pool.job;
    atomic_fetch_add(&job->members, 1);
    pthread_mutex_unlock(&g_pool.mu);
    if (job->caller_cpu >= 0 && current_cpu() == job->caller_cpu) move_worker_off(home - 1, 0, job->caller_cpu);
    run_chunks(job, home);
    atomic_store(&g_pool.last_cpu[home - 1], current_cpu());
    pthread_mutex_lock(&g_pool.mu);
    leave_job(job);
  }
  pthread_mutex_unlock(&g_pool.mu);
  return NULL;
}

/* Starts the missing workers (under mu); false when none can be started. */
static bool start_workers(void) {
  int wanted = dks_thread_count() - 1;
  for (int k = g_pool.num_workers; k < wanted; k++) {
    atomic_store(&g_pool.last_cpu[k], -1);
    atomic_store(&g_pool.moved[k], false);
  }
  while (g_pool.num_workers < wanted &&
         pthread_create(&g_pool.workers[g_pool.num_workers], NULL, worker_main,
                        (void *)(intptr_t)(g_pool.num_workers + 1)) == 0)
    g_pool.num_workers++;
  return g_pool.num_workers > 0;
}

void dks_parallel_for(int64_t n, int64_t grain, dks_range_fn fn, void *ctx) {
  if (n <= 0) return;
  if (grain < 1) grain = 1;
  int threads = dks_thread_count();
  if (t_in_chunk || threads < 2 || n < 2 * grain) {
    fn(ctx, 0, n);
    return;
  }
  /* A few chunks per thread, so a delayed thread costs less than a share. */
  int64_t num_chunks = n / grain < 4 * (int64_t)threads ? n / grain : 4 * (int64_t)threads;
  int64_t chunk = (n + num_chunks - 1) / num_chunks;
  num_chunks = (n + chunk - 1) / chunk;
  pool_job job; /* next_chunk and share_end set up to num_shares only */
  job.fn = fn;
  job.ctx = ctx;
  job.n = n;
  job.chunk = chunk;
  job.num_shares = threads;
  for (int s = 0; s < threads; s++) {
    atomic_init(&job.next_chunk[s], num_chunks * s / threads);
    job.share_end[s] = num_chunks * (s + 1) / threads;
  }
  atomic_init(&job.members, 1);
  job.caller_cpu = current_cpu();

  pthread_mutex_lock(&g_pool.mu);
  if (g_pool.job || g_pool.stop || !start_workers()) {
    pthread_mutex_unlock(&g_pool.mu);
    fn(ctx, 0, n);
    return;
  }
  for (int k = 0; k < g_pool.num_workers && job.caller_cpu >= 0; k++) /* none has joined the job yet */
    if (atomic_load(&g_pool.last_cpu[k]) == job.caller_cpu) move_worker_off(k, atomic_load(&g_pool.tid[k]), job.caller_cpu);
  g_pool.job = &job;
  atomic_fetch_add(&g_pool.generation, 1);
  pthread_cond_broadcast(&g_pool.wake);
  pthread_mutex_unlock(&g_pool.mu);

  run_chunks(&job, 0);

  /* Every chunk is claimed: close the job to late workers, then wait for
   * those still running theirs (they touch `job`, on this stack). */
  pthread_mutex_lock(&g_pool.mu);
  g_pool.job = NULL;
  pthread_mutex_unlock(&g_pool.mu);
  join_members(&job);
}

void dks_threads_wake(void) {
  if (dks_thread_count() < 2 || dks_spin_ns() == 0) return;
  pthread_mutex_lock(&g_pool.mu);
  if (g_pool.num_sleeping > 0) pthread_cond_broadcast(&g_pool.wake);
  pthread_mutex_unlock(&g_pool.mu);
}

void dks_threads_shutdown(void) {
  pthread_mutex_lock(&g_pool.mu);
  g_pool.stop = true;
  pthread_cond_broadcast(&g_pool.wake);
  int n = g_pool.num_workers;
  pthread_mutex_unlock(&g_pool.mu);
  for (int i = 0; i < n; i++) pthread_join(g_pool.workers[i], NULL);
  pthread_mutex_lock(&g_pool.mu);
  g_pool.num_workers = 0;
  g_pool.stop = false;
  pthread_mutex_unlock(&g_pool.mu);
}

__attribute__((destructor)) static void threads_unload(void) { dks_threads_shutdown(); }

/* fork() copies only the forking thread: the child has no workers and no job
 * of its parent's, and its pool starts afresh. The lock held across the fork
 * keeps the state consistent while it is copied. */
static void fork_prepare(void) { pthread_mutex_lock(&g_pool.mu); }
static void fork_parent(void) { pthread_mutex_unlock(&g_pool.mu); }
static void fork_child(void) {
  pthread_mutex_init(&g_pool.mu, NULL);
  pthread_cond_init(&g_pool.wake, NULL);
  pthread_cond_init(&g_pool.finished, NULL);
  g_pool.job = NULL;
  g_pool.num_workers = 0;
  g_pool.num_sleeping = 0;
  g_pool.stop = false;
  t_in_chunk = false;
}

__attribute__((constructor)) static void threads_load(void) {
  pthread_atfork(fork_prepare, fork_parent, fork_child);
}
