/* Relaunched threads: two threads, one with an int argument and one with
 * a pointer to a global; after the update each runs again in the new
 * version's function of the same name, on the same OS thread, with the
 * same (redirected) argument. */
#include "fu.h"
#include <pthread.h>
#include <time.h>

#define VERSION 1

struct tinfo {
  int tid;        /* OS thread id, recorded on every (re)start */
  long arg;       /* the argument as the thread saw it */
  int version;    /* version of the code the thread runs */
  int starts;     /* starts in this version (1 unless restarted) */
  int updating;   /* molt_is_updating() at the start */
  int from_point; /* molt_is_updating_from(its point) at the start */
  int from_other; /* molt_is_updating_from("elsewhere") at the start */
  int after;      /* molt_is_updating() after its first update point */
  long loops;
};

struct config {
  int magic;
};

/* tinfo[i] is written by thread i (begin(), and `after` after its first
 * update point) and read by main's "dump": every access but `loops` is
 * under tinfo_lock, so a dump sees each thread's record either before or
 * after a begin(), never half-written.  `loops` is a relaxed atomic
 * counter, also read under the lock for the same reason (a dump that sees
 * loops > 0 sees the begin() that preceded the first increment). */
struct tinfo tinfo[2];
pthread_mutex_t tinfo_lock = PTHREAD_MUTEX_INITIALIZER;
struct config cfg = {4242};
int main_tid, main_updating, main_from, main_starts;

static void pause_ms(int ms) {
  struct timespec ts = {0, ms * 1000000L};
  nanosleep(&ts, NULL);
}

static void begin(struct tinfo *t, long arg, const char *point) {
  int tid = fu_tid(), updating = molt_is_updating();
  int from_point = molt_is_updating_from(point);
  int from_other = molt_is_updating_from("elsewhere");
  pthread_mutex_lock(&tinfo_lock);
  t->tid = tid;
  t->arg = arg;
  t->version = VERSION;
  t->starts++;
  t->updating = updating;
  t->from_point = from_point;
  t->from_other = from_other;
  t->after = -1;
  pthread_mutex_unlock(&tinfo_lock);
}

/* Records molt_is_updating() once, after the thread's first update point. */
static void note_after(struct tinfo *t) {
  int updating = molt_is_updating();
  pthread_mutex_lock(&tinfo_lock);
  if (t->after < 0)
    t->after = updating;
  pthread_mutex_unlock(&tinfo_lock);
}

void *worker(void *arg) {
  struct tinfo *t = &tinfo[0];
  begin(t, (long)(intptr_t)arg, "worker-point");
  for (;;) {
    molt_update_point("worker-point");
    note_after(t);
    /* relaxed: a counter that orders nothing (see tinfo_lock) */
    __atomic_add_fetch(&t->loops, 1, __ATOMIC_RELAXED);
    pause_ms(2);
  }
  return NULL;
}

void *sampler(void *arg) {
  struct tinfo *t = &tinfo[1];
  struct config *c = arg;
  begin(t, c == &cfg ? c->magic : -1, "sampler-point");
  for (;;) {
    molt_update_point("sampler-point");
    note_after(t);
    /* relaxed: a counter that orders nothing (see tinfo_lock) */
    __atomic_add_fetch(&t->loops, 1, __ATOMIC_RELAXED);
    pause_ms(2);
  }
  return NULL;
}

static int fu_handle(char *cmd) {
  FU_COMMON(cmd)
  if (!strcmp(cmd, "dump")) {
    printf("version=%d main_tid=%d main_updating=%d main_from=%d main_starts=%d", VERSION,
           main_tid, main_updating, main_from, main_starts);
    struct tinfo snap[2];
    pthread_mutex_lock(&tinfo_lock);
    for (int i = 0; i < 2; i++) {
      struct tinfo *t = &tinfo[i], *s = &snap[i];
      s->tid = t->tid;
      s->arg = t->arg;
      s->version = t->version;
      s->starts = t->starts;
      s->updating = t->updating;
      s->from_point = t->from_point;
      s->from_other = t->from_other;
      /* A thread that has not yet run begin() in this version still shows
       * the migrated record of the old one: report "not yet" for it. */
      s->after = t->version == VERSION ? t->after : -1;
      /* relaxed: a counter; the lock orders it with the rest of tinfo */
      s->loops = __atomic_load_n(&t->loops, __ATOMIC_RELAXED);
    }
    pthread_mutex_unlock(&tinfo_lock);
    for (int i = 0; i < 2; i++) {
      struct tinfo *t = &snap[i];
      printf(" t%d_tid=%d t%d_arg=%ld t%d_version=%d t%d_starts=%d "
             "t%d_updating=%d t%d_from=%d t%d_from_other=%d t%d_after=%d "
             "t%d_loops=%ld",
             i, t->tid, i, t->arg, i, t->version, i, t->starts, i, t->updating, i,
             t->from_point, i, t->from_other, i, t->after, i, t->loops);
    }
    printf("\n");
  } else {
    printf("error %s\n", cmd);
  }
  return 1;
}

int main(void) {
  main_tid = fu_tid();
  main_updating = molt_is_updating();
  main_from = molt_is_updating_from("main");
  main_starts++;
  if (!main_updating) {
    pthread_t a, b;
    pthread_create(&a, NULL, worker, (void *)(intptr_t)7);
    pthread_create(&b, NULL, sampler, &cfg);
  }
  fu_serve();
  _exit(0); /* the threads never stop */
}
