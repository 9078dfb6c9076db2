/* Cost of shadow data (molt_shadow_*, guarantee H13), one operation kind per run:
 *
 *   shadow_cost OP ITERATIONS [THREADS]
 *
 * OP: get_hit get_miss get_or_alloc_hit alloc_free attach_free
 *     mutex_hit (the same lookup in a hash table under one pthread mutex:
 *     what a locked get would cost at best) field (reading a real struct
 *     field: what the shadow replaces).
 * The measured work is the function run_op (callgrind --toggle-collect=
 * run_op counts it alone); the program prints ns per operation of the
 * whole loop (per thread, threads running the loop at once). */
#define _GNU_SOURCE
#include "molt.h"

#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define OBJECTS 1024 /* shadows in the table: a realistic small server */
#define ID 0x5e5510f1ull

struct obj {
  uint64_t serial;
  int field;
  char rest[48];
};

static struct obj objs[OBJECTS];
static struct obj others[OBJECTS]; /* no shadow */

/* The baseline: chained hash under one mutex. */
struct mnode {
  const void *obj;
  uint64_t id;
  struct mnode *next;
  int data;
};
static struct mnode *mbuckets[OBJECTS];
static pthread_mutex_t mlock = PTHREAD_MUTEX_INITIALIZER;

static inline size_t mhash(const void *o) { return ((uintptr_t)o >> 6) % OBJECTS; }

static __attribute__((noinline)) void *mutex_get(const void *o, uint64_t id) {
  pthread_mutex_lock(&mlock);
  struct mnode *n = mbuckets[mhash(o)];
  while (n && !(n->obj == o && n->id == id))
    n = n->next;
  pthread_mutex_unlock(&mlock);
  return n ? &n->data : NULL;
}

static const char *op;
static long iterations;
static volatile long sink;

static __attribute__((noinline)) long run_op(void) {
  long acc = 0;
  if (!strcmp(op, "get_hit")) {
    for (long i = 0; i < iterations; i++)
      acc += *(int *)molt_shadow_get(&objs[i & (OBJECTS - 1)], ID);
  } else if (!strcmp(op, "get_miss")) {
    for (long i = 0; i < iterations; i++)
      acc += molt_shadow_get(&others[i & (OBJECTS - 1)], ID) != NULL;
  } else if (!strcmp(op, "get_or_alloc_hit")) {
    for (long i = 0; i < iterations; i++)
      acc += *(int *)molt_shadow_get_or_alloc(&objs[i & (OBJECTS - 1)], ID, sizeof(int),
                                              NULL, NULL);
  } else if (!strcmp(op, "alloc_free")) {
    for (long i = 0; i < iterations; i++) {
      const void *o = &others[i & (OBJECTS - 1)];
      acc += molt_shadow_alloc(o, ID, sizeof(int), NULL, NULL) != NULL;
      acc += molt_shadow_free(o, ID, NULL);
    }
  } else if (!strcmp(op, "attach_free")) {
    for (long i = 0; i < iterations; i++) {
      const void *o = &others[i & (OBJECTS - 1)];
      acc += molt_shadow_attach(o, ID, sizeof(int), NULL, NULL, NULL) != NULL;
      acc += molt_shadow_free(o, ID, NULL);
    }
  } else if (!strcmp(op, "mutex_hit")) {
    for (long i = 0; i < iterations; i++)
      acc += *(int *)mutex_get(&objs[i & (OBJECTS - 1)], ID);
  } else if (!strcmp(op, "field")) {
    for (long i = 0; i < iterations; i++)
      acc += *(volatile int *)&objs[i & (OBJECTS - 1)].field;
  } else {
    fprintf(stderr, "unknown op %s\n", op);
    exit(2);
  }
  return acc;
}

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec + ts.tv_nsec / 1e9;
}

static pthread_barrier_t start;
static void *thread_main(void *arg) {
  double *ns = arg;
  molt_shadow_get(&objs[0], ID); /* this thread's reader record */
  pthread_barrier_wait(&start);
  double t0 = now_s();
  sink = run_op();
  *ns = (now_s() - t0) * 1e9 / (double)iterations;
  return NULL;
}

int main(int argc, char **argv) {
  if (argc < 3) {
    fprintf(stderr, "usage: %s OP ITERATIONS [THREADS]\n", argv[0]);
    return 2;
  }
  op = argv[1];
  iterations = atol(argv[2]);
  int threads = argc > 3 ? atoi(argv[3]) : 1;
  for (int i = 0; i < OBJECTS; i++) {
    int *d = molt_shadow_alloc(&objs[i], ID, sizeof(int), NULL, NULL);
    if (!d)
      return 1;
    *d = i;
    objs[i].field = i;
    struct mnode *m = calloc(1, sizeof *m);
    m->obj = &objs[i];
    m->id = ID;
    m->data = i;
    m->next = mbuckets[mhash(&objs[i])];
    mbuckets[mhash(&objs[i])] = m;
  }
  pthread_barrier_init(&start, NULL, (unsigned)threads);
  pthread_t th[64];
  double ns[64];
  for (int t = 0; t < threads && t < 64; t++)
    pthread_create(&th[t], NULL, thread_main, &ns[t]);
  double sum = 0;
  for (int t = 0; t < threads && t < 64; t++) {
    pthread_join(th[t], NULL);
    sum += ns[t];
  }
  printf("%s threads=%d ns_per_op=%.2f\n", op, threads, sum / threads);
  return 0;
}
