/*
 * codegen.c -- the codegen section (ABI 1.2) of the cpu plugin: dialect
 * "c", compiled at run time by the C compiler found when the plugin loads
 * ($CC, else cc, else gcc on PATH) into a shared object (-O3 -fPIC
 * -shared), loaded with dlopen and looked up with dlsym. Without a compiler
 * the section is absent (NULL in the table).
 *
 * Compiled objects are cached on disk under <cache>/codegen/<plugin>/<hash>.so,
 * <cache> being $DEVKIT_CACHE_DIR, else $XDG_CACHE_HOME/devkit, else
 * ~/.cache/devkit; the hash covers the source, the options and the compiler.
 * A launch is one stream work item that runs the function over the launch
 * range in chunks (dks_parallel_for).
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <spawn.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "cpu.h"

extern char **environ;

typedef void (*codegen_fn)(void *const *args, int64_t begin, int64_t end);

typedef struct cpu_function cpu_function;
typedef struct cpu_module {
  atomic_int refs; /* the registry's (until unload) and one per pending or captured launch */
  void *library;
  cpu_function *functions; /* owned: freed with the module */
} cpu_module;

struct cpu_function {
  cpu_module *module;
  cpu_function *next;
  codegen_fn fn;
  size_t num_args;
  int32_t kinds[]; /* DK_ArgKind per argument */
};

/* Live module and function handles (the module of a function is live too). */
static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
static dks_table g_modules, g_functions;
static char g_compiler[4096];
static char g_cpu_features[8192]; /* /proc/cpuinfo's first flags (x86) or Features (Arm) line */
static atomic_ulong g_counter;

static void module_put(cpu_module *m) {
  if (atomic_fetch_sub(&m->refs, 1) != 1) return;
  dlclose(m->library);
  for (cpu_function *f = m->functions, *next; f; f = next) {
    next = f->next;
    free(f);
  }
  free(m);
}

/* ---- Compiler and cache ---------------------------------------------------- */

static bool executable_on_path(const char *name, char *out, size_t size) {
  if (strchr(name, '/')) {
    if (access(name, X_OK) != 0) return false;
    snprintf(out, size, "%s", name);
    return true;
  }
  const char *path = getenv("PATH");
  if (!path) return false;
  while (*path) {
    size_t n = strcspn(path, ":");
    snprintf(out, size, "%.*s/%s", (int)n, path, name);
    if (n && access(out, X_OK) == 0) return true;
    path += n + (path[n] == ':');
  }
  return false;
}

static void read_cpu_features(void) {
  g_cpu_features[0] = '\0';
  FILE *f = fopen("/proc/cpuinfo", "r");
  if (!f) return;
  char line[sizeof g_cpu_features];
  while (fgets(line, sizeof line, f)) {
    if (!strncmp(line, "flags", 5) || !strncmp(line, "Features", 8)) {
      memcpy(g_cpu_features, line, sizeof line);
      break;
    }
  }
  fclose(f);
}

bool cpu_codegen_available(void) {
  read_cpu_features();
  const char *cc = getenv("CC");
  if (cc && *cc) return executable_on_path(cc, g_compiler, sizeof g_compiler);
  return executable_on_path("cc", g_compiler, sizeof g_compiler) ||
         executable_on_path("gcc", g_compiler, sizeof g_compiler);
}

static bool make_dirs(char *path) {
  for (char *p = path + 1; *p; p++) {
    if (*p != '/') continue;
    *p = '\0';
    bool ok = mkdir(path, 0755) == 0 || errno == EEXIST;
    *p = '/';
    if (!ok) return false;
  }
  return mkdir(path, 0755) == 0 || errno == EEXIST;
}

/* The cache directory (created), or false when there is none to write. */
static bool cache_dir(char *out, size_t size) {
  const char *root = getenv("DEVKIT_CACHE_DIR"), *xdg = getenv("XDG_CACHE_HOME"),
             *home = getenv("HOME");
  if (root && *root) snprintf(out, size, "%s/codegen/%s", root, CPU_PLUGIN_NAME);
  else if (xdg && *xdg) snprintf(out, size, "%s/devkit/codegen/%s", xdg, CPU_PLUGIN_NAME);
  else if (home && *home) snprintf(out, size, "%s/.cache/devkit/codegen/%s", home, CPU_PLUGIN_NAME);
  else return false;
  return make_dirs(out);
}

static uint64_t fnv1a(uint64_t h, const char *s) {
  for (; *s; s++) h = (h ^ (uint8_t)*s) * 0x100000001b3ULL;
  return (h ^ 0xff) * 0x100000001b3ULL; /* a separator, so ("ab","c") != ("a","bc") */
}

static char *read_file(const char *path) {
  FILE *f = fopen(path, "rb");
  if (!f) return NULL;
  fseek(f, 0, SEEK_END);
  long n = ftell(f);
  fseek(f, 0, SEEK_SET);
  char *text = malloc((size_t)(n > 0 ? n : 0) + 1);
  size_t got = text ? fread(text, 1, (size_t)(n > 0 ? n : 0), f) : 0;
  if (text) text[got] = '\0';
  fclose(f);
  return text;
}

/* Runs the compiler on `src` into `so`; on failure sets the error with the log. */
static DK_Status run_compiler(const char *fn, const char *src, const char *so,
                              const char *options, const char *log_path) {
  char *opts = strdup(options ? options : "");
  const char *argv[256];
  int argc = 0;
  argv[argc++] = g_compiler;
  argv[argc++] = "-O3";
  argv[argc++] = "-march=native";
  argv[argc++] = "-fPIC";
  argv[argc++] = "-shared";
  for (char *save = NULL, *tok = strtok_r(opts, " \t\n", &save); tok && argc < 248;
       tok = strtok_r(NULL, " \t\n", &save))
    argv[argc++] = tok;
  argv[argc++] = "-o";
  argv[argc++] = so;
  argv[argc++] = src;
  argv[argc++] = "-lm";
  argv[argc] = NULL;
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, 1, log_path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
  posix_spawn_file_actions_adddup2(&actions, 1, 2);
  pid_t pid;
  int rc = posix_spawn(&pid, g_compiler, &actions, NULL, (char *const *)argv, environ);
  posix_spawn_file_actions_destroy(&actions);
  free(opts);
  if (rc != 0)
    return dks_set_error(DK_UNAVAILABLE, "%s: cannot run the C compiler %s: %s", fn, g_compiler,
                         strerror(rc));
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {}
  if (WIFEXITED(status) && WEXITSTATUS(status) == 0) return DK_OK;
  char *log = read_file(log_path);
  DK_Status st = dks_set_error(DK_INVALID_ARGUMENT, "%s: the source does not compile (%s):\n%s",
                               fn, g_compiler, log ? log : "(no log)");
  free(log);
  return st;
}

DK_Status cpu_codegen_dialect(int32_t dev, const char **dialect) {
  dks_device *d;
  DK_Status st = dks_device_get("codegen_dialect", dev, &d);
  if (st != DK_OK) return st;
  if (!dialect) return dks_set_error(DK_INVALID_ARGUMENT, "codegen_dialect: dialect is NULL");
  *dialect = "c";
  return DK_OK;
}

DK_Status cpu_codegen_compile(int32_t dev, const char *source, const char *options,
                              DK_Module *module, int32_t *from_cache) {
  static const char fn[] = "codegen_compile";
  dks_device *d;
  DK_Status st = dks_device_get(fn, dev, &d);
  if (st != DK_OK) return st;
  if (!source || !module)
    return dks_set_error(DK_INVALID_ARGUMENT, "%s: %s is NULL", fn, source ? "module" : "source");
  char dir[2048], so[2400], src[2400], log[2500];
  unsigned long unique = atomic_fetch_add(&g_counter, 1);
  bool cached_dir = cache_dir(dir, sizeof dir);
  if (!cached_dir) {
    snprintf(dir, sizeof dir, "%s/devkit-codegen-XXXXXX", getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
    if (!mkdtemp(dir))
      return dks_set_error(DK_UNAVAILABLE, "%s: no cache directory and no temporary one: %s", fn,
                           strerror(errno));
  }
  uint64_t h = fnv1a(fnv1a(fnv1a(fnv1a(0xcbf29ce484222325ULL, source), options ? options : ""), g_compiler),
                     g_cpu_features);
  snprintf(so, sizeof so, "%s/%016llx.so", dir, (unsigned long long)h);
  bool hit = cached_dir && access(so, R_OK) == 0;
  if (!hit) {
    /* Compiled under a name of this call's own, then renamed: a concurrent
     * compile of the same source never sees a half-written object. */
    char tmp_so[2500];
    snprintf(src, sizeof src, "%s/%016llx.%d.%lu.c", dir, (unsigned long long)h, (int)getpid(), unique);
    snprintf(tmp_so, sizeof tmp_so, "%s.%d.%lu.tmp", so, (int)getpid(), unique);
    snprintf(log, sizeof log, "%s.log", src);
    FILE *f = fopen(src, "w");
    if (!f) return dks_set_error(DK_UNAVAILABLE, "%s: cannot write %s: %s", fn, src, strerror(errno));
    fputs(source, f);
    fclose(f);
    st = run_compiler(fn, src, tmp_so, options, log);
    unlink(src);
    unlink(log);
    if (st == DK_OK && rename(tmp_so, so) != 0)
      st = dks_set_error(DK_UNAVAILABLE, "%s: cannot move the object to %s: %s", fn, so, strerror(errno));
    if (st != DK_OK) {
      unlink(tmp_so);
      if (!cached_dir) rmdir(dir);
      return st;
    }
  }
  void *library = dlopen(so, RTLD_NOW | RTLD_LOCAL);
  if (!cached_dir) { /* loaded objects stay mapped after unlink */
    unlink(so);
    rmdir(dir);
  }
  if (!library) return dks_set_error(DK_INTERNAL, "%s: dlopen of %s failed: %s", fn, so, dlerror());
  cpu_module *m = calloc(1, sizeof *m);
  if (!m) {
    dlclose(library);
    return dks_set_error(DK_RESOURCE_EXHAUSTED, "%s: host out of memory", fn);
  }
  atomic_init(&m->refs, 1);
  m->library = library;
  pthread_mutex_lock(&g_mu);
  bool ok = dks_table_insert(&g_modules, (uintptr_t)m, 0);
  pthread_mutex_unlock(&g_mu);
  if (!ok) {
    module_put(m);
    return dks_set_error(DK_RESOURCE_EXHAUSTED, "%s: host out of memory", fn);
  }
  *module = (DK_Module)m;
  if (from_cache) *from_cache = hit;
  return DK_OK;
}

DK_Status cpu_codegen_get_function(int32_t dev, DK_Module module, const char *name,
                                   const int32_t *arg_kinds, size_t num_args,
                                   DK_Function *function) {
  static const char fn[] = "codegen_get_function";
  dks_device *d;
  DK_Status st = dks_device_get(fn, dev, &d);
  if (st != DK_OK) return st;
  if (!name || !function || (num_args && !arg_kinds))
    return dks_set_error(DK_INVALID_ARGUMENT, "%s: %s is NULL", fn,
                         !name ? "name" : !function ? "function" : "arg_kinds");
  for (size_t k = 0; k < num_args; k++)
    if (arg_kinds[k] < DK_ARG_TENSOR || arg_kinds[k] > DK_ARG_FLOAT64)
      return dks_set_error(DK_INVALID_ARGUMENT, "%s: argument %zu has unknown kind %d", fn, k,
                           arg_kinds[k]);
  pthread_mutex_lock(&g_mu);
  cpu_module *m = (cpu_module *)module;
  if (!module || !dks_table_find(&g_modules, (uintptr_t)m, NULL)) {
    pthread_mutex_unlock(&g_mu);
    return dks_set_error(DK_INVALID_ARGUMENT, "%s: module %p is not a live module", fn, (void *)module);
  }
  codegen_fn symbol = (codegen_fn)dlsym(m->library, name);
  if (!symbol) {
    pthread_mutex_unlock(&g_mu);
    return dks_set_error(DK_NOT_FOUND, "%s: the module has no function '%s'", fn, name);
  }
  cpu_function *f = calloc(1, sizeof *f + num_args * sizeof(int32_t));
  if (!f || !dks_table_insert(&g_functions, (uintptr_t)f, 0)) {
    pthread_mutex_unlock(&g_mu);
    free(f);
    return dks_set_error(DK_RESOURCE_EXHAUSTED, "%s: host out of memory", fn);
  }
  f->module = m;
  f->fn = symbol;
  f->num_args = num_args;
  memcpy(f->kinds, arg_kinds, num_args * sizeof(int32_t));
  f->next = m->functions;
  m->functions = f;
  pthread_mutex_unlock(&g_mu);
  *function = (DK_Function)f;
  return DK_OK;
}

/* ---- Launches ---------------------------------------------------------------- */

typedef struct launch_args {
  cpu_function *function; /* holds a reference on its module */
  int64_t items, grain;
  void **pointers;        /* num_args entries: tensor addresses or &scalars[k] */
  union { int64_t i; float f32; double f64; } *scalars;
} launch_args;

static void run_chunk(void *ctx, int64_t begin, int64_t end) {
  const launch_args *a = ctx;
  a->function->fn((void *const *)a->pointers, begin, end);
}

static void run_launch(void *arg) {
  launch_args *a = arg;
  if (a->items) dks_parallel_for(a->items, a->grain, run_chunk, a);
}

static void destroy_launch(void *arg) {
  launch_args *a = arg;
  module_put(a->function->module);
}

DK_Status cpu_codegen_launch(int32_t dev, DK_Function function, const DK_LaunchArg *args,
                             size_t num_args, const DK_LaunchShape *shape, DK_Stream stream) {
  static const char fn[] = "codegen_launch";
  dks_device *d;
  DK_Status st = dks_device_get(fn, dev, &d);
  if (st != DK_OK) return st;
  if (!shape || (num_args && !args))
    return dks_set_error(DK_INVALID_ARGUMENT, "%s: %s is NULL", fn, shape ? "args" : "shape");
  if (shape->struct_size < sizeof(DK_LaunchShape))
    return dks_set_error(DK_INVALID_ARGUMENT, "%s: shape->struct_size %zu is short (needs %zu)", fn,
                         shape->struct_size, sizeof(DK_LaunchShape));
  if (shape->ndim < 1 || shape->ndim > 3)
    return dks_set_error(DK_INVALID_ARGUMENT, "%s: shape->ndim is %u; it must be 1, 2 or 3", fn,
                         shape->ndim);
  int64_t items = 1, grain = 1;
  bool has_local = false;
  for (uint32_t k = 0; k < shape->ndim; k++) has_local |= shape->local[k] != 0;
  for (uint32_t k = 0; k < shape->ndim; k++) {
    if (shape->global[k] > (uint64_t)INT64_MAX / (uint64_t)(items ? items : 1))
      return dks_set_error(DK_INVALID_ARGUMENT, "%s: the launch range overflows int64", fn);
    items *= (int64_t)shape->global[k];
    if (has_local && shape->local[k] == 0)
      return dks_set_error(DK_INVALID_ARGUMENT, "%s: shape->local[%u] is 0 while another is set", fn, k);
    grain *= has_local ? (int64_t)shape->local[k] : 1;
  }
  pthread_mutex_lock(&g_mu);
  cpu_function *f = (cpu_function *)function;
  if (!function || !dks_table_find(&g_functions, (uintptr_t)f, NULL)) {
    pthread_mutex_unlock(&g_mu);
    return dks_set_error(DK_INVALID_ARGUMENT, "%s: function %p is not a live function", fn,
                         (void *)function);
  }
  atomic_fetch_add(&f->module->refs, 1); /* the launch's, dropped by destroy_launch */
  pthread_mutex_unlock(&g_mu);
  if (num_args != f->num_args) {
    module_put(f->module);
    return dks_set_error(DK_INVALID_ARGUMENT, "%s: %zu arguments given; the function takes %zu", fn,
                         num_args, f->num_args);
  }
  size_t bytes = sizeof(launch_args) + num_args * (sizeof(void *) + sizeof(double));
  launch_args *a = dks_work_new(bytes, run_launch, destroy_launch);
  if (!a) {
    module_put(f->module);
    return dks_set_error(DK_RESOURCE_EXHAUSTED, "%s: host out of memory", fn);
  }
  a->function = f;
  a->items = items;
  a->grain = grain;
  a->pointers = (void **)(a + 1);
  a->scalars = (void *)(a->pointers + num_args);
  for (size_t k = 0; k < num_args; k++) {
    const DK_LaunchArg *arg = &args[k];
    if (arg->struct_size < offsetof(DK_LaunchArg, f) + sizeof arg->f || arg->kind != f->kinds[k]) {
      st = dks_set_error(DK_INVALID_ARGUMENT, "%s: argument %zu %s (kind %d; the function declared %d)",
                         fn, k, arg->struct_size < sizeof(DK_LaunchArg) ? "is short" : "has the wrong kind",
                         arg->kind, f->kinds[k]);
      break;
    }
    if (arg->kind == DK_ARG_TENSOR) {
      dks_tensor t;
      if (!arg->tensor.data) {
        st = dks_set_error(DK_INVALID_ARGUMENT, "%s: tensor argument %zu has a NULL data handle", fn, k);
        break;
      }
      if ((st = dks_resolve_tensor(fn, d, dev, true, "argument", k, &arg->tensor, &t)) != DK_OK) break;
      a->pointers[k] = t.data;
    } else {
      if (arg->kind == DK_ARG_INT64) a->scalars[k].i = arg->i;
      else if (arg->kind == DK_ARG_FLOAT32) a->scalars[k].f32 = (float)arg->f;
      else a->scalars[k].f64 = arg->f;
      a->pointers[k] = &a->scalars[k];
    }
  }
  if (st != DK_OK) {
    dks_work_discard(a);
    module_put(f->module);
    return st;
  }
  dks_stream *s;
  if ((st = dks_stream_acquire(fn, d, stream, &s)) != DK_OK) {
    destroy_launch(a);
    dks_work_discard(a);
    return st;
  }
  st = dks_work_submit(s, a);
  dks_stream_release(s);
  return st;
}

DK_Status cpu_codegen_unload(int32_t dev, DK_Module module) {
  static const char fn[] = "codegen_unload";
  dks_device *d;
  DK_Status st = dks_device_get(fn, dev, &d);
  if (st != DK_OK) return st;
  if (!module) return DK_OK;
  cpu_module *m = (cpu_module *)module;
  pthread_mutex_lock(&g_mu);
  bool live = dks_table_remove(&g_modules, (uintptr_t)m, NULL);
  if (live)
    for (cpu_function *f = m->functions; f; f = f->next) dks_table_remove(&g_functions, (uintptr_t)f, NULL);
  pthread_mutex_unlock(&g_mu);
  if (!live) return dks_set_error(DK_INVALID_ARGUMENT, "%s: module %p is not a live module", fn, (void *)module);
  module_put(m);
  return DK_OK;
}
