#define _GNU_SOURCE
/* Shadow data (molt_shadow_*, src/runtime/core/shadow.c): every call and
 * error case, the get-or-alloc race, constructors that call into the
 * runtime (the place of the shadow locks in the lock table),
 * growth under lock-free readers, fork, a signal handler nested in a get,
 * memory given back, and a stress run of objects created and destroyed by
 * several threads while others read and write their shadow fields.
 *
 *   test_shadow CASE [SECONDS]
 *
 * Each case exits 0 on success and prints what failed; after every case
 * the runtime must not be refusing (no lock-order violation was seen). */
#include "../harness/check.h"
#include "molt.h"

#include <inttypes.h>
#include <malloc.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

/* xorshift, per thread */
static uint64_t rnd(uint64_t *s) {
  uint64_t x = *s;
  x ^= x << 13;
  x ^= x >> 7;
  x ^= x << 17;
  return *s = x;
}

/* ---- api: every call and error case ----------------------------------------*/

enum { ID_A = 1, ID_B = 0xfeedface00000002ull };

typedef struct {
  int calls;
  const void *obj;
  void *data;
  int fail;  /* return this */
  int value; /* written into the data */
} ctor_rec;

static int rec_ctor(const void *obj, void *data, void *arg) {
  ctor_rec *r = arg;
  r->calls++;
  r->obj = obj;
  r->data = data;
  if (!r->fail)
    *(int *)data = r->value;
  return r->fail;
}

static int dtor_calls;
static const void *dtor_obj;
static int dtor_value;
static void rec_dtor(const void *obj, void *data) {
  dtor_calls++;
  dtor_obj = obj;
  dtor_value = *(int *)data;
}

/* Calls from inside a constructor: everything but get must refuse. */
static int nested_results[8];
static int nesting_ctor(const void *obj, void *data, void *arg) {
  int other = 0;
  const void *o2 = &other;
  nested_results[0] = molt_shadow_alloc(o2, ID_A, 8, NULL, NULL) == NULL;
  nested_results[1] = molt_shadow_get_or_alloc(o2, ID_A, 8, NULL, NULL) == NULL;
  nested_results[2] = molt_shadow_attach(o2, ID_A, 8, NULL, NULL, NULL) == NULL;
  nested_results[3] = molt_shadow_free(arg, ID_A, NULL) == MOLT_EBUSY;
  nested_results[4] = molt_shadow_free_all(ID_A, NULL) == 0;
  nested_results[5] = molt_shadow_count(ID_A) == 0 && molt_shadow_total() == 0;
  /* get works, also for the shadow being constructed (not there yet) */
  nested_results[6] =
      molt_shadow_get(arg, ID_A) != NULL && molt_shadow_get(obj, ID_B) == NULL;
  *(int *)data = 7;
  return 0;
}

/* A destructor may free other shadows (it runs outside every lock). */
static void chained_dtor(const void *obj, void *data) {
  (void)data;
  const char *o = obj;
  dtor_calls++;
  molt_shadow_free(o + 1, ID_A, NULL);
}

static int case_api(void) {
  static char objs[16];
  const void *o1 = &objs[0], *o2 = &objs[1];

  CHECK(molt_shadow_get(NULL, ID_A) == NULL, "get(NULL)");
  CHECK(molt_shadow_get(o1, ID_A) == NULL, "get on nothing");
  CHECK(molt_shadow_total() == 0, "total %zu", molt_shadow_total());

  /* alloc: zero-filled, aligned, once per (obj, id) */
  unsigned char *a = molt_shadow_alloc(o1, ID_A, 100, NULL, NULL);
  CHECK(a != NULL, "alloc");
  bool zero = true;
  for (int i = 0; a && i < 100; i++)
    zero &= a[i] == 0;
  CHECK(zero, "alloc data is zero-filled");
  CHECK(((uintptr_t)a % _Alignof(max_align_t)) == 0, "alignment of %p", (void *)a);
  CHECK(molt_shadow_get(o1, ID_A) == a, "get finds it");
  CHECK(molt_shadow_alloc(o1, ID_A, 100, NULL, NULL) == NULL, "second alloc refused");
  CHECK(molt_shadow_get(o1, ID_A) == a, "still the first");
  void *b = molt_shadow_alloc(o1, ID_B, 8, NULL, NULL);
  void *c = molt_shadow_alloc(o2, ID_A, 8, NULL, NULL);
  CHECK(b && c && b != a && c != a && b != c, "other id, other object: other data");
  CHECK(molt_shadow_count(ID_A) == 2 && molt_shadow_count(ID_B) == 1, "counts %zu %zu",
        molt_shadow_count(ID_A), molt_shadow_count(ID_B));
  CHECK(molt_shadow_total() == 3, "total %zu", molt_shadow_total());

  /* argument errors */
  CHECK(molt_shadow_alloc(NULL, ID_A, 8, NULL, NULL) == NULL, "alloc(NULL)");
  CHECK(molt_shadow_alloc(&objs[3], ID_A, 0, NULL, NULL) == NULL, "size 0");
  CHECK(molt_shadow_alloc(&objs[3], ID_A, SIZE_MAX, NULL, NULL) == NULL, "size max");
  CHECK(molt_shadow_alloc(&objs[3], ID_A, SIZE_MAX / 2, NULL, NULL) == NULL,
        "size max/2");
  CHECK(molt_shadow_get_or_alloc(NULL, ID_A, 8, NULL, NULL) == NULL, "goa(NULL)");
  CHECK(molt_shadow_get_or_alloc(&objs[3], ID_A, 0, NULL, NULL) == NULL, "goa size 0");
  CHECK(molt_shadow_attach(NULL, ID_A, 8, NULL, NULL, NULL) == NULL, "attach(NULL)");
  CHECK(molt_shadow_free(NULL, ID_A, NULL) == MOLT_EINVAL, "free(NULL)");
  CHECK(molt_shadow_get(&objs[3], ID_A) == NULL && molt_shadow_total() == 3,
        "nothing made");

  /* constructors: arguments, value, failure */
  ctor_rec r = {.value = 41};
  int *d = molt_shadow_alloc(&objs[4], ID_A, sizeof(int), rec_ctor, &r);
  CHECK(d && *d == 41 && r.calls == 1 && r.obj == &objs[4] && r.data == d,
        "ctor ran once with obj and data (calls %d)", r.calls);
  ctor_rec f = {.fail = 5};
  CHECK(molt_shadow_alloc(&objs[5], ID_A, sizeof(int), rec_ctor, &f) == NULL &&
            f.calls == 1,
        "failing ctor: NULL");
  CHECK(molt_shadow_get(&objs[5], ID_A) == NULL, "failing ctor allocates nothing");
  CHECK(molt_shadow_get_or_alloc(&objs[5], ID_A, sizeof(int), rec_ctor, &f) == NULL &&
            molt_shadow_get(&objs[5], ID_A) == NULL && f.calls == 2,
        "failing ctor in get_or_alloc: nothing");

  /* get_or_alloc: existing data, ctor not called; else a new one */
  r.calls = 0;
  CHECK(molt_shadow_get_or_alloc(&objs[4], ID_A, sizeof(int), rec_ctor, &r) == d &&
            r.calls == 0,
        "get_or_alloc returns the existing one without ctor");
  r.value = 9;
  int *e = molt_shadow_get_or_alloc(&objs[6], ID_A, sizeof(int), rec_ctor, &r);
  CHECK(e && *e == 9 && r.calls == 1 && molt_shadow_get(&objs[6], ID_A) == e,
        "get_or_alloc new");

  /* free: destructor sees the data; then gone; second free ENOENT */
  *e = 1234;
  dtor_calls = 0;
  CHECK(molt_shadow_free(&objs[6], ID_A, rec_dtor) == 0, "free");
  CHECK(dtor_calls == 1 && dtor_obj == &objs[6] && dtor_value == 1234,
        "dtor got the data");
  CHECK(molt_shadow_get(&objs[6], ID_A) == NULL, "freed: gone");
  CHECK(molt_shadow_free(&objs[6], ID_A, rec_dtor) == MOLT_ENOENT && dtor_calls == 1,
        "second free: ENOENT, no dtor");
  CHECK(molt_shadow_free(&objs[6], ID_B, NULL) == MOLT_ENOENT, "free of another id");

  /* attach: fresh object, and one whose address has a stale shadow */
  r.calls = 0;
  r.value = 5;
  int *g = molt_shadow_attach(&objs[7], ID_A, sizeof(int), rec_ctor, &r, rec_dtor);
  CHECK(g && *g == 5 && r.calls == 1, "attach without a stale shadow");
  *g = 77;
  dtor_calls = 0;
  r.value = 6;
  int *h = molt_shadow_attach(&objs[7], ID_A, sizeof(int), rec_ctor, &r, rec_dtor);
  CHECK(h && *h == 6 && dtor_calls == 1 && dtor_value == 77 && dtor_obj == &objs[7],
        "attach replaced the stale one (dtor %d value %d)", dtor_calls, dtor_value);
  CHECK(molt_shadow_get(&objs[7], ID_A) == h && molt_shadow_count(ID_A) == 4,
        "one shadow, the new one (count %zu)", molt_shadow_count(ID_A));
  *h = 88;
  f.calls = 0;
  dtor_calls = 0;
  CHECK(molt_shadow_attach(&objs[7], ID_A, sizeof(int), rec_ctor, &f, rec_dtor) == NULL &&
            f.calls == 1 && dtor_calls == 1 && dtor_value == 88,
        "attach with a failing ctor destroys the stale one");
  CHECK(molt_shadow_get(&objs[7], ID_A) == NULL, "and leaves none: looks pre-patch");
  CHECK(molt_shadow_attach(&objs[7], ID_A, sizeof(int), NULL, NULL, NULL) != NULL,
        "attach without ctor and dtor");
  CHECK(molt_shadow_attach(&objs[7], ID_A, sizeof(int), NULL, NULL, NULL) != NULL &&
            molt_shadow_count(ID_A) == 4,
        "replacing without a dtor");

  /* calls from inside a constructor */
  memset(nested_results, 0, sizeof nested_results);
  int *n = molt_shadow_alloc(&objs[8], ID_B, sizeof(int), nesting_ctor, (void *)o1);
  CHECK(n && *n == 7, "nesting ctor succeeded");
  for (int i = 0; i < 7; i++)
    CHECK(nested_results[i], "nested call %d inside a ctor", i);

  /* a destructor that frees another shadow */
  CHECK(molt_shadow_alloc(&objs[10], ID_A, 4, NULL, NULL) &&
            molt_shadow_alloc(&objs[11], ID_A, 4, NULL, NULL),
        "two more");
  dtor_calls = 0;
  CHECK(molt_shadow_free(&objs[10], ID_A, chained_dtor) == 0 && dtor_calls == 1,
        "chained");
  CHECK(molt_shadow_get(&objs[11], ID_A) == NULL, "the dtor freed the other one");

  /* free_all: one id only, dtor on each */
  size_t before_b = molt_shadow_count(ID_B);
  size_t before_a = molt_shadow_count(ID_A);
  dtor_calls = 0;
  size_t k = molt_shadow_free_all(ID_A, rec_dtor);
  CHECK(k == before_a && (size_t)dtor_calls == before_a,
        "free_all freed %zu of %zu (dtor %d)", k, before_a, dtor_calls);
  CHECK(molt_shadow_count(ID_A) == 0 && molt_shadow_get(o1, ID_A) == NULL, "id A gone");
  CHECK(molt_shadow_count(ID_B) == before_b && molt_shadow_get(o1, ID_B) == b,
        "id B kept");
  CHECK(molt_shadow_free_all(ID_A, rec_dtor) == 0, "free_all of nothing");
  CHECK(molt_shadow_free_all(ID_B, NULL) == before_b && molt_shadow_total() == 0,
        "all gone (total %zu)", molt_shadow_total());

  /* many objects: the shards grow; everything is still found */
  enum { N = 100000 };
  char *many = calloc(N, 1);
  for (int i = 0; i < N; i++) {
    int *p = molt_shadow_alloc(many + i, ID_A, sizeof(int), NULL, NULL);
    if (!p) {
      CHECK(p, "alloc %d", i);
      break;
    }
    *p = i;
  }
  int found = 0;
  for (int i = 0; i < N; i++) {
    int *p = molt_shadow_get(many + i, ID_A);
    found += p && *p == i;
  }
  CHECK(found == N && molt_shadow_count(ID_A) == N, "found %d of %d", found, N);
  for (int i = 0; i < N; i += 2)
    molt_shadow_free(many + i, ID_A, NULL);
  found = 0;
  for (int i = 0; i < N; i++)
    found += (molt_shadow_get(many + i, ID_A) != NULL) == (i & 1);
  CHECK(found == N, "after freeing the even ones: %d right", found);
  CHECK(molt_shadow_free_all(ID_A, NULL) == N / 2 && molt_shadow_total() == 0,
        "many freed");
  free(many);
  return failures ? 1 : 0;
}

/* ---- memory: freed shadows are given back to malloc ------------------------*/

static int case_memory(void) {
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
  /* The sanitizers' allocators keep freed memory in quarantine: mallinfo2
   * says nothing there.  Their runs check the use-after-free side. */
  puts("memory: plain build only (sanitizer allocators quarantine frees)");
  return 0;
#else
  static char objs[50000];
  /* warm up: tables at their final size, reader record claimed */
  for (int i = 0; i < 50000; i++)
    molt_shadow_alloc(&objs[i], ID_A, 64, NULL, NULL);
  molt_shadow_free_all(ID_A, NULL);
  size_t base = mallinfo2().uordblks;
  for (int round = 0; round < 20; round++) {
    for (int i = 0; i < 50000; i++)
      molt_shadow_alloc(&objs[i], ID_A, 64, NULL, NULL);
    for (int i = 0; i < 50000; i++) {
      molt_shadow_get(&objs[i], ID_A);
      molt_shadow_free(&objs[i], ID_A, NULL);
    }
  }
  size_t after = mallinfo2().uordblks;
  /* 20 rounds x 50,000 x ~112 bytes went through; what is left is the
   * last batches of retired nodes (bounded by the batch size per shard) */
  CHECK(after < base + 1024 * 1024, "memory grew from %zu to %zu bytes", base, after);
  CHECK(molt_shadow_total() == 0, "total %zu", molt_shadow_total());
  printf("memory: %zu -> %zu bytes in use after 1,000,000 alloc/free\n", base, after);
  return failures ? 1 : 0;
#endif
}

/* ---- ctor_race: get_or_alloc from many threads at once ---------------------*/

enum { RACE_THREADS = 6, RACE_OBJECTS = 2000 };
static char race_objs[RACE_OBJECTS];
static _Atomic int race_ctor_calls[RACE_OBJECTS];
static void *race_results[RACE_THREADS][RACE_OBJECTS];
static pthread_barrier_t race_barrier;

static int race_ctor(const void *obj, void *data, void *arg) {
  (void)arg;
  size_t i = (size_t)((const char *)obj - race_objs);
  atomic_fetch_add(&race_ctor_calls[i], 1);
  /* widen the window: the others see no shadow in their lock-free get
   * and queue up on the shard lock behind us */
  struct timespec ts = {0, 100000};
  nanosleep(&ts, NULL);
  *(size_t *)data = i;
  return 0;
}

static void *race_thread(void *arg) {
  int t = (int)(intptr_t)arg;
  for (int i = 0; i < RACE_OBJECTS; i++) {
    pthread_barrier_wait(&race_barrier);
    race_results[t][i] =
        molt_shadow_get_or_alloc(&race_objs[i], ID_A, sizeof(size_t), race_ctor, NULL);
  }
  return NULL;
}

static int case_ctor_race(void) {
  pthread_barrier_init(&race_barrier, NULL, RACE_THREADS);
  pthread_t th[RACE_THREADS];
  for (int t = 0; t < RACE_THREADS; t++)
    pthread_create(&th[t], NULL, race_thread, (void *)(intptr_t)t);
  for (int t = 0; t < RACE_THREADS; t++)
    pthread_join(th[t], NULL);
  int bad_calls = 0, bad_ptr = 0;
  for (int i = 0; i < RACE_OBJECTS; i++) {
    bad_calls += atomic_load(&race_ctor_calls[i]) != 1;
    size_t *p = race_results[0][i];
    for (int t = 0; t < RACE_THREADS; t++)
      bad_ptr += race_results[t][i] != p || !p || *p != (size_t)i;
  }
  CHECK(bad_calls == 0, "%d objects had their constructor run other than once",
        bad_calls);
  CHECK(bad_ptr == 0, "%d results differ between threads or are wrong", bad_ptr);
  CHECK(molt_shadow_free_all(ID_A, NULL) == RACE_OBJECTS, "free_all");
  pthread_barrier_destroy(&race_barrier);
  return failures ? 1 : 0;
}

/* ---- grow: readers must always find present shadows while tables grow -------*/

enum { GROW_KEEP = 512, GROW_READERS = 3 };
static char grow_keep[GROW_KEEP];
static _Atomic bool grow_stop;
static _Atomic long grow_misses, grow_reads;

static void *grow_reader(void *arg) {
  uint64_t s = 0x9e3779b97f4a7c15ull + (uintptr_t)arg;
  long reads = 0, misses = 0;
  while (!atomic_load_explicit(&grow_stop, memory_order_relaxed)) {
    int i = (int)(rnd(&s) % GROW_KEEP);
    int *p = molt_shadow_get(&grow_keep[i], ID_B);
    if (!p || *p != i)
      misses++;
    reads++;
  }
  atomic_fetch_add(&grow_misses, misses);
  atomic_fetch_add(&grow_reads, reads);
  return NULL;
}

static int case_grow(void) {
  for (int i = 0; i < GROW_KEEP; i++) {
    int *p = molt_shadow_alloc(&grow_keep[i], ID_B, sizeof(int), NULL, NULL);
    if (p)
      *p = i;
  }
  pthread_t th[GROW_READERS];
  for (int t = 0; t < GROW_READERS; t++)
    pthread_create(&th[t], NULL, grow_reader, (void *)(intptr_t)t);
  /* Many rounds of filling and emptying: each round grows tables (several
   * doublings per shard) and retires tables and nodes while readers walk. */
  enum { FILL = 40000 };
  char *fill = malloc(FILL);
  for (int round = 0; round < 6; round++) {
    for (int i = 0; i < FILL; i++)
      molt_shadow_alloc(fill + i, (uint64_t)round + 100, 16, NULL, NULL);
    for (int i = 0; i < FILL; i++)
      molt_shadow_free(fill + i, (uint64_t)round + 100, NULL);
  }
  atomic_store(&grow_stop, true);
  for (int t = 0; t < GROW_READERS; t++)
    pthread_join(th[t], NULL);
  free(fill);
  CHECK(atomic_load(&grow_misses) == 0, "%ld of %ld reads missed a present shadow",
        atomic_load(&grow_misses), atomic_load(&grow_reads));
  CHECK(atomic_load(&grow_reads) > 0, "no reads");
  CHECK(molt_shadow_free_all(ID_B, NULL) == GROW_KEEP && molt_shadow_total() == 0,
        "left: %zu", molt_shadow_total());
  printf("grow: %ld reads during 240,000 inserts and frees, no miss\n",
         atomic_load(&grow_reads));
  return failures ? 1 : 0;
}

/* ---- ctor_calls: a constructor may do what any application thread may ----*/

/* An updatable function (manual interface): a thread's first call registers
 * it (reg_lock); in a forked child it also starts the runtime thread
 * (op_lock: case_fork). */
MOLT_FUNCTION(int, updatable_twice, (int x), (x)) { return 2 * x; }

/* 0: the runtime is not refusing.  A lock-order violation (base.h: the
 * shadow locks come before every runtime lock) would have put it into the
 * refusing state, and an update would then fail with MOLT_EREFUSING instead
 * of finding nothing to roll back. */
static int rollback_nothing(const char *where) {
  char err[512] = "";
  int rc = molt_rollback(MOLT_POLICY_IMMEDIATE, -1, err, sizeof err);
  if (rc == MOLT_ENOHISTORY)
    return 0;
  fprintf(stderr, "%s: molt_rollback gave %s: %s\n", where, molt_err_name(rc), err);
  return 1;
}

static _Atomic int ctor_bad;

/* Runs under the shard lock on a thread that has not called an updatable
 * function yet: registration, an update point, the generation, an update
 * request the runtime thread carries out (under op_lock) while this thread
 * waits, and a shadow read. */
static int runtime_ctor(const void *obj, void *data, void *arg) {
  (void)arg;
  int bad = 0;
  bad += updatable_twice(21) != 42;
  bad += molt_update_point("in a shadow constructor") != 0; /* nothing pending */
  bad += molt_generation() != 0;
  bad += rollback_nothing("rollback inside a constructor");
  bad += molt_shadow_get(obj, ID_B) != NULL; /* not published yet */
  atomic_fetch_add(&ctor_bad, bad);
  *(int *)data = 99;
  return 0;
}

static void *runtime_ctor_thread(void *arg) {
  int *d = molt_shadow_alloc(arg, ID_B, sizeof(int), runtime_ctor, NULL);
  return d && *d == 99 ? arg : NULL;
}

static int case_ctor_calls(void) {
  static char objs[8];
  /* Two threads at once, each registering inside its constructor. */
  pthread_t th[2];
  for (int t = 0; t < 2; t++)
    pthread_create(&th[t], NULL, runtime_ctor_thread, &objs[t]);
  for (int t = 0; t < 2; t++) {
    void *ok = NULL;
    pthread_join(th[t], &ok);
    CHECK(ok == &objs[t], "constructor on thread %d", t);
  }
  CHECK(atomic_load(&ctor_bad) == 0, "%d calls inside constructors failed",
        atomic_load(&ctor_bad));
  CHECK(molt_shadow_count(ID_B) == 2, "both made: %zu", molt_shadow_count(ID_B));
  CHECK(molt_shadow_free_all(ID_B, NULL) == 2 && molt_shadow_total() == 0, "clean-up");
  return failures ? 1 : 0;
}

/* ---- fork: a child of a process whose threads use shadows ------------------*/

#if !defined(__SANITIZE_ADDRESS__) && !defined(__SANITIZE_THREAD__)
static int child_ctor(const void *obj, void *data, void *arg) {
  (void)obj, (void)arg;
  *(int *)data = updatable_twice(1) + 1;
  return rollback_nothing("child, inside a constructor");
}
#endif

static _Atomic bool fork_stop;
static void *fork_churn(void *arg) {
  char *objs = arg;
  uint64_t s = 12345;
  while (!atomic_load(&fork_stop)) {
    int i = (int)(rnd(&s) % 256);
    if (!molt_shadow_alloc(objs + i, ID_A, 32, NULL, NULL))
      molt_shadow_free(objs + i, ID_A, NULL);
    molt_shadow_get(objs + (i ^ 1), ID_A);
  }
  return NULL;
}

static int case_fork(void) {
  static char objs[256];
  molt_shadow_get(objs, ID_A); /* this thread's reader record */
  pthread_t th[2];
  for (int t = 0; t < 2; t++)
    pthread_create(&th[t], NULL, fork_churn, objs);
  int bad = 0;
  for (int k = 0; k < 50; k++) {
    pid_t pid = fork();
    if (pid == 0) {
      /* Only this thread exists: every shard lock must be free (count and
       * total take each of them) and no grace period may wait for the
       * parent's other threads (free_all waits for one). */
      if (molt_shadow_count(ID_A) > 256 || molt_shadow_total() > 256)
        _exit(5);
      for (int i = 0; i < 256; i++)
        molt_shadow_get(objs + i, ID_A);
#if !defined(__SANITIZE_ADDRESS__) && !defined(__SANITIZE_THREAD__)
      /* (Plain build only: the allocators of gcc 12's ASan and TSan
       * runtimes are not fork-safe, a child that allocates can block on an
       * allocator lock that a parent thread held at fork.) */
      static char mine[1000];
      for (int i = 0; i < 1000; i++)
        if (!molt_shadow_alloc(&mine[i], ID_B, 16, NULL, NULL))
          _exit(3);
      for (int i = 0; i < 256; i++)
        molt_shadow_free(objs + i, ID_A, NULL);
      if (molt_shadow_free_all(ID_B, NULL) != 1000 || molt_shadow_count(ID_A) != 0)
        _exit(4);
      /* A constructor's first updatable call starts the child's runtime
       * thread (op_lock inside the shard lock), which then answers a
       * request; nothing is reported.  (Plain build only, as above, and
       * ThreadSanitizer does not let a child of a threaded process start
       * threads.) */
      int *c = molt_shadow_alloc(&mine[0], ID_B, sizeof(int), child_ctor, NULL);
      if (!c || *c != 3 || rollback_nothing("child"))
        _exit(6);
#endif
      _exit(0);
    }
    int st = 0;
    /* a deadlocked child would hang the test: ctest's timeout names it */
    waitpid(pid, &st, 0);
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
      bad++;
      fprintf(stderr, "child %d: status %#x\n", k, st);
    }
  }
  atomic_store(&fork_stop, true);
  for (int t = 0; t < 2; t++)
    pthread_join(th[t], NULL);
  CHECK(bad == 0, "%d children failed", bad);
  molt_shadow_free_all(ID_A, NULL);
  return failures ? 1 : 0;
}

/* ---- signal: a handler that calls molt_shadow_get inside a get -------------*/

static char sig_obj[2];
static _Atomic long sig_bad, sig_seen;
static void on_signal(int sig) {
  (void)sig;
  int *p = molt_shadow_get(&sig_obj[1], ID_A);
  if (!p || *p != 2)
    atomic_fetch_add(&sig_bad, 1);
  atomic_fetch_add(&sig_seen, 1);
}

static void *sig_freer(void *arg) {
  /* keeps reclamation going: grace periods run while the main thread is
   * interrupted inside its read sections */
  static char objs[64];
  uint64_t end = now_ns() + 1000000000ull;
  (void)arg;
  while (now_ns() < end)
    for (int i = 0; i < 64; i++)
      if (!molt_shadow_alloc(&objs[i], ID_B, 8, NULL, NULL))
        molt_shadow_free(&objs[i], ID_B, NULL);
  return NULL;
}

static int case_signal(void) {
  int *p0 = molt_shadow_alloc(&sig_obj[0], ID_A, sizeof(int), NULL, NULL);
  int *p1 = molt_shadow_alloc(&sig_obj[1], ID_A, sizeof(int), NULL, NULL);
  if (!p0 || !p1)
    return 1;
  *p0 = 1;
  *p1 = 2;
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_signal;
  sigaction(SIGUSR1, &sa, NULL);
  pthread_t me = pthread_self(), fr;
  pthread_create(&fr, NULL, sig_freer, NULL);
  long bad = 0, loops = 0;
  uint64_t end = now_ns() + 1000000000ull;
  while (now_ns() < end) {
    for (int k = 0; k < 1000; k++) {
      int *p = molt_shadow_get(&sig_obj[0], ID_A);
      bad += !p || *p != 1;
    }
    pthread_kill(me, SIGUSR1);
    loops++;
  }
  pthread_join(fr, NULL);
  CHECK(bad == 0 && atomic_load(&sig_bad) == 0, "wrong reads: %ld, in handlers %ld", bad,
        atomic_load(&sig_bad));
  CHECK(atomic_load(&sig_seen) > 0, "no signal handled");
  molt_shadow_free_all(ID_A, NULL);
  molt_shadow_free_all(ID_B, NULL);
  return failures ? 1 : 0;
}

/* ---- stress: objects created and destroyed concurrently ---------------------
 *
 * SLOTS slots hold live objects.  Churn threads replace the object of a
 * random slot: the new object is created the way a patched creation path
 * does it (molt_shadow_attach of field F with the object's serial) and the
 * old one destroyed either the patched way (molt_shadow_free of both
 * fields) or, one time in eight, the way old code still finishing does it
 * (free() only: its shadows stay behind, and the next object at that
 * address must not inherit them).  User threads take a slot's read lock and
 * use its object: read and update field F (its serial must be the object's
 * own) and get-or-alloc a lazily added field L, racing each other on the
 * same object (its constructor must run once).  Peeker threads call
 * molt_shadow_get without any lock on addresses of objects that may be
 * being freed, to keep lock-free walks running across every unlink, retire
 * and reclamation.  At the end everything is accounted for. */

enum { SLOTS = 2048, CHURNERS = 2, USERS = 3, PEEKERS = 1 };
enum { FIELD_F = 0xf1e1d, FIELD_L = 0x1a2f };

typedef struct object {
  uint64_t serial;
  struct object *next_free;
  char payload[32];
} object;

/* The program's allocator: a LIFO free list, so that a freed object's
 * address comes back at once (malloc under ASan would quarantine it). */
static object pool[SLOTS + 64];
static object *pool_free_list;
static pthread_mutex_t pool_lock = PTHREAD_MUTEX_INITIALIZER;

static object *pool_get(void) {
  pthread_mutex_lock(&pool_lock);
  object *o = pool_free_list;
  if (o)
    pool_free_list = o->next_free;
  pthread_mutex_unlock(&pool_lock);
  return o;
}

static void pool_put(object *o) {
  pthread_mutex_lock(&pool_lock);
  o->next_free = pool_free_list;
  pool_free_list = o;
  pthread_mutex_unlock(&pool_lock);
}

typedef struct field_f {
  uint64_t serial; /* the object's own serial: a stale field shows here */
  _Atomic long uses;
} field_f;

typedef struct field_l {
  uint64_t serial;
  _Atomic long uses;
} field_l;

static struct slot {
  pthread_rwlock_t lock;
  _Atomic(object *) obj; /* written under the write lock; peekers read it */
} slots[SLOTS];

static _Atomic bool stress_stop;
static _Atomic uint64_t next_serial = 1;
static _Atomic long f_made, f_freed, f_stale, f_bad, f_missing, l_ctor, l_freed, l_stale,
    l_bad, uses_total, old_frees, peeks;

static int f_ctor(const void *obj, void *data, void *arg) {
  (void)arg;
  field_f *f = data;
  f->serial = ((const object *)obj)->serial;
  return 0;
}

static void f_dtor(const void *obj, void *data) {
  (void)obj;
  (void)data;
  atomic_fetch_add(&f_freed, 1);
}

static void f_stale_dtor(const void *obj, void *data) {
  field_f *f = data;
  /* the stale field belonged to an earlier object at this address */
  if (f->serial == ((const object *)obj)->serial)
    atomic_fetch_add(&f_bad, 1);
  atomic_fetch_add(&f_stale, 1);
}

static int l_ctor_fn(const void *obj, void *data, void *arg) {
  (void)arg;
  field_l *l = data;
  /* exactly once per object: nobody has it yet */
  if (molt_shadow_get(obj, FIELD_L) != NULL)
    atomic_fetch_add(&l_bad, 1);
  l->serial = ((const object *)obj)->serial;
  atomic_fetch_add(&l_ctor, 1);
  return 0;
}

static void l_dtor(const void *obj, void *data) {
  (void)obj;
  (void)data;
  atomic_fetch_add(&l_freed, 1);
}

static void l_stale_dtor(const void *obj, void *data) {
  (void)obj;
  (void)data;
  atomic_fetch_add(&l_stale, 1);
}

/* The patched creation path: the new object gets field F, and a field the
 * patch adds lazily (L) that an earlier object at this address left behind
 * is dropped, so that it is constructed afresh for this object. */
static object *create_object(void) {
  object *o = pool_get();
  if (!o)
    return NULL;
  o->serial = atomic_fetch_add(&next_serial, 1);
  if (molt_shadow_attach(o, FIELD_F, sizeof(field_f), f_ctor, NULL, f_stale_dtor))
    atomic_fetch_add(&f_made, 1);
  molt_shadow_free(o, FIELD_L, l_stale_dtor);
  return o;
}

static void destroy_object(object *o, bool patched) {
  if (patched) {
    molt_shadow_free(o, FIELD_F, f_dtor);
    molt_shadow_free(o, FIELD_L, l_dtor);
  } else {
    atomic_fetch_add(&old_frees, 1);
  }
  pool_put(o);
}

static void *churner(void *arg) {
  uint64_t s = 0x1234567ull * ((uintptr_t)arg + 1);
  while (!atomic_load_explicit(&stress_stop, memory_order_relaxed)) {
    struct slot *sl = &slots[rnd(&s) % SLOTS];
    object *n = create_object();
    if (!n)
      continue;
    pthread_rwlock_wrlock(&sl->lock);
    object *old = atomic_exchange(&sl->obj, n);
    pthread_rwlock_unlock(&sl->lock);
    if (old)
      destroy_object(old, rnd(&s) % 8 != 0);
  }
  return NULL;
}

static void *user(void *arg) {
  uint64_t s = 0x7654321ull * ((uintptr_t)arg + 1);
  long uses = 0;
  while (!atomic_load_explicit(&stress_stop, memory_order_relaxed)) {
    struct slot *sl = &slots[rnd(&s) % (SLOTS / 8)]; /* fewer slots: users collide */
    pthread_rwlock_rdlock(&sl->lock);
    object *o = atomic_load_explicit(&sl->obj, memory_order_relaxed);
    if (o) {
      field_f *f = molt_shadow_get(o, FIELD_F);
      if (!f)
        atomic_fetch_add(&f_missing, 1);
      else if (f->serial != o->serial)
        atomic_fetch_add(&f_bad, 1);
      else
        atomic_fetch_add_explicit(&f->uses, 1, memory_order_relaxed);
      field_l *l = molt_shadow_get_or_alloc(o, FIELD_L, sizeof(field_l), l_ctor_fn, NULL);
      if (!l || l->serial != o->serial)
        atomic_fetch_add(&l_bad, 1);
      else
        atomic_fetch_add_explicit(&l->uses, 1, memory_order_relaxed);
      uses++;
    }
    pthread_rwlock_unlock(&sl->lock);
  }
  atomic_fetch_add(&uses_total, uses);
  return NULL;
}

static void *peeker(void *arg) {
  uint64_t s = 0xabcdefull * ((uintptr_t)arg + 1);
  long n = 0;
  while (!atomic_load_explicit(&stress_stop, memory_order_relaxed)) {
    /* the object may be freed right now: only its address is used */
    object *o = atomic_load_explicit(&slots[rnd(&s) % SLOTS].obj, memory_order_relaxed);
    molt_shadow_get(o, FIELD_F);
    molt_shadow_get(o, FIELD_L);
    n++;
  }
  atomic_fetch_add(&peeks, n);
  return NULL;
}

static int case_stress(int seconds) {
  for (int i = 0; i < SLOTS; i++)
    pthread_rwlock_init(&slots[i].lock, NULL);
  for (size_t i = 0; i < sizeof pool / sizeof pool[0]; i++)
    pool_put(&pool[i]);
  pthread_t th[CHURNERS + USERS + PEEKERS];
  int k = 0;
  for (int t = 0; t < CHURNERS; t++)
    pthread_create(&th[k++], NULL, churner, (void *)(intptr_t)t);
  for (int t = 0; t < USERS; t++)
    pthread_create(&th[k++], NULL, user, (void *)(intptr_t)t);
  for (int t = 0; t < PEEKERS; t++)
    pthread_create(&th[k++], NULL, peeker, (void *)(intptr_t)t);
  uint64_t end = now_ns() + (uint64_t)seconds * 1000000000ull;
  while (now_ns() < end)
    usleep(20000);
  atomic_store(&stress_stop, true);
  for (int t = 0; t < k; t++)
    pthread_join(th[t], NULL);

  /* the live objects are destroyed the patched way */
  for (int i = 0; i < SLOTS; i++) {
    object *o = atomic_exchange(&slots[i].obj, NULL);
    if (o)
      destroy_object(o, true);
  }
  /* what old code left behind: shadows of freed objects never reused by a
   * patched creation.  A rollback's clean-up does the same. */
  long stale_f_left = (long)molt_shadow_count(FIELD_F);
  long stale_l_left = (long)molt_shadow_count(FIELD_L);
  size_t fa = molt_shadow_free_all(FIELD_F, f_dtor);
  size_t la = molt_shadow_free_all(FIELD_L, l_dtor);

  long made = atomic_load(&f_made), freed = atomic_load(&f_freed),
       stale = atomic_load(&f_stale);
  printf("stress: %ds, %" PRIu64
         " objects, %ld uses, %ld lock-free peeks; field F: %ld made, "
         "%ld freed, %ld stale replaced at creation, %ld left by old frees; field L: %ld "
         "constructed, %ld freed, %ld stale dropped at creation\n",
         seconds, atomic_load(&next_serial) - 1, atomic_load(&uses_total),
         atomic_load(&peeks), made, freed, stale, stale_f_left, atomic_load(&l_ctor),
         atomic_load(&l_freed), atomic_load(&l_stale));
  CHECK(atomic_load(&f_bad) == 0, "%ld uses saw another object's field F",
        atomic_load(&f_bad));
  CHECK(atomic_load(&f_missing) == 0,
        "%ld objects made by the patched creation had no field F",
        atomic_load(&f_missing));
  CHECK(atomic_load(&l_bad) == 0, "%ld uses of field L went wrong (or a ctor ran twice)",
        atomic_load(&l_bad));
  CHECK((uint64_t)made == atomic_load(&next_serial) - 1,
        "F made %ld for %" PRIu64 " objects", made, atomic_load(&next_serial) - 1);
  CHECK(made == freed + stale,
        "F: made %ld != freed %ld + stale %ld (incl. free_all %zu)", made, freed, stale,
        fa);
  CHECK((long)fa == stale_f_left && (long)la == stale_l_left,
        "free_all %zu/%zu of %ld/%ld", fa, la, stale_f_left, stale_l_left);
  CHECK(atomic_load(&l_ctor) == atomic_load(&l_freed) + atomic_load(&l_stale),
        "L: constructed %ld, freed %ld + stale %ld", atomic_load(&l_ctor),
        atomic_load(&l_freed), atomic_load(&l_stale));
  CHECK(molt_shadow_total() == 0, "left: %zu", molt_shadow_total());
  CHECK(atomic_load(&old_frees) > 0 && stale > 0, "the stale path was not exercised");
  CHECK(atomic_load(&uses_total) > 1000, "too few uses: %ld", atomic_load(&uses_total));
  return failures ? 1 : 0;
}

int main(int argc, char **argv) {
  if (argc < 2) {
    fprintf(
        stderr,
        "usage: %s api|memory|ctor_race|ctor_calls|grow|fork|signal|stress [SECONDS]\n",
        argv[0]);
    return 2;
  }
  const char *c = argv[1];
  int seconds = argc > 2 ? atoi(argv[2]) : 3;
  int rc;
  if (!strcmp(c, "api"))
    rc = case_api();
  else if (!strcmp(c, "memory"))
    rc = case_memory();
  else if (!strcmp(c, "ctor_race"))
    rc = case_ctor_race();
  else if (!strcmp(c, "ctor_calls"))
    rc = case_ctor_calls();
  else if (!strcmp(c, "grow"))
    rc = case_grow();
  else if (!strcmp(c, "fork"))
    rc = case_fork();
  else if (!strcmp(c, "signal"))
    rc = case_signal();
  else if (!strcmp(c, "stress"))
    rc = case_stress(seconds);
  else {
    fprintf(stderr, "unknown case %s\n", c);
    return 2;
  }
  /* No case may have caused a lock-order violation (the test builds check
   * the order: base.h). */
  if (rollback_nothing(c))
    rc = 1;
  if (rc == 0)
    printf("%s: ok\n", c);
  return rc;
}
