/*
 * threads.c -- the cpu plugin's one thread pool, behind cpu_parallel_for
 * (the contract is in kernel.h).
 *
 * The pool holds cpu_thread_count() - 1 workers, started by the first call
 * that splits work: the calling thread (a stream worker) is the last member
 * of the budget and takes chunks itself, so a job starts without waiting for
 * a wake-up and a pool of one thread is no pool at all. Chunks are claimed
 * from an atomic counter, so a worker the OS delays (the machine is shared)
 * simply takes fewer. Idle workers sleep on a condition variable: no
 * spinning.
 *
 * One job runs at a time: a call that finds the pool busy (another stream's
 * kernel) runs its range on its own thread, which keeps the streams together
 * inside about the thread budget instead of queueing one behind another.
 *
 * The workers are joined when the plugin is unloaded (or at exit); a child
 * process of fork() starts with no workers and starts its own when needed.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>

#include "kernel.h"

typedef struct pool_job {
  cpu_range_fn fn;
  void *ctx;
  int64_t n, chunk, num_chunks;
  atomic_int_fast64_t next_chunk;
  int members; /* threads working on the job, the caller included (under mu) */
} pool_job;

static struct {
  pthread_mutex_t mu;
  pthread_cond_t wake;     /* workers: a new job, or stop */
  pthread_cond_t finished; /* the caller: the last member left its job */
  pool_job *job;           /* the job taking members; NULL when none */
  uint64_t generation;     /* jobs posted so far: a worker joins each once */
  int num_workers;         /* started */
  bool stop;
  pthread_t workers[CPU_MAX_THREADS];
} g_pool = {.mu = PTHREAD_MUTEX_INITIALIZER, .wake = PTHREAD_COND_INITIALIZER,
            .finished = PTHREAD_COND_INITIALIZER};

/* Set while this thread runs a chunk: a cpu_parallel_for made there runs
 * serially. */
static _Thread_local bool t_in_chunk;

static void run_chunks(pool_job *job) {
  t_in_chunk = true;
  for (int64_t c; (c = atomic_fetch_add(&job->next_chunk, 1)) < job->num_chunks;) {
    int64_t begin = c * job->chunk, end = begin + job->chunk;
    job->fn(job->ctx, begin, end < job->n ? end : job->n);
  }
  t_in_chunk = false;
}

static void leave_job(pool_job *job) {
  if (--job->members == 0) pthread_cond_signal(&g_pool.finished);
}

static void *worker_main(void *arg) {
  (void)arg;
  uint64_t seen = 0;
  pthread_mutex_lock(&g_pool.mu);
  for (;;) {
    while (!g_pool.stop && (!g_pool.job || seen == g_pool.generation))
      pthread_cond_wait(&g_pool.wake, &g_pool.mu);
    if (g_pool.stop) break;
    seen = g_pool.generation;
    pool_job *job = g_pool.job;
    job->members++;
    pthread_mutex_unlock(&g_pool.mu);
    run_chunks(job);
    pthread_mutex_lock(&g_pool.mu);
    leave_job(job);
  }
  pthread_mutex_unlock(&g_pool.mu);
  return NULL;
}

/* Starts the missing workers (under mu); false when none can be started. */
static bool start_workers(void) {
  int wanted = cpu_thread_count() - 1;
  while (g_pool.num_workers < wanted &&
         pthread_create(&g_pool.workers[g_pool.num_workers], NULL, worker_main, NULL) == 0)
    g_pool.num_workers++;
  return g_pool.num_workers > 0;
}

void cpu_parallel_for(int64_t n, int64_t grain, cpu_range_fn fn, void *ctx) {
  if (n <= 0) return;
  if (grain < 1) grain = 1;
  int threads = cpu_thread_count();
  if (t_in_chunk || threads < 2 || n < 2 * grain) {
    fn(ctx, 0, n);
    return;
  }
  /* A few chunks per thread, so a delayed thread costs less than a share. */
  int64_t num_chunks = n / grain < 4 * (int64_t)threads ? n / grain : 4 * (int64_t)threads;
  int64_t chunk = (n + num_chunks - 1) / num_chunks;
  pool_job job = {.fn = fn, .ctx = ctx, .n = n, .chunk = chunk,
                  .num_chunks = (n + chunk - 1) / chunk, .members = 1};
  atomic_init(&job.next_chunk, 0);

  pthread_mutex_lock(&g_pool.mu);
  if (g_pool.job || g_pool.stop || !start_workers()) {
    pthread_mutex_unlock(&g_pool.mu);
    fn(ctx, 0, n);
    return;
  }
  g_pool.job = &job;
  g_pool.generation++;
  pthread_cond_broadcast(&g_pool.wake);
  pthread_mutex_unlock(&g_pool.mu);

  run_chunks(&job);

  /* Every chunk is claimed: close the job to late workers, then wait for
   * those still running theirs (they touch `job`, on this stack). */
  pthread_mutex_lock(&g_pool.mu);
  g_pool.job = NULL;
  leave_job(&job);
  while (job.members > 0) pthread_cond_wait(&g_pool.finished, &g_pool.mu);
  pthread_mutex_unlock(&g_pool.mu);
}

void cpu_threads_shutdown(void) {
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

__attribute__((destructor)) static void threads_unload(void) { cpu_threads_shutdown(); }

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
  g_pool.stop = false;
  t_in_chunk = false;
}

__attribute__((constructor)) static void threads_load(void) {
  pthread_atfork(fork_prepare, fork_parent, fork_child);
}
