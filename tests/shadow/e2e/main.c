/* The test server: worker threads open, use and close sessions
 * (session.c) in a shared table, and check every reply.  Commands on stdin:
 *   stats   one line of counters, then one line per (generation at open,
 *           generation at close) pair seen: how many sessions behaved as
 *           version 1, as version 2 (locked after 3 failures), or mixed
 *   quit    stop, close every open session, print the final stats, exit
 * Each session runs the script BAD BAD BAD GOOD BAD GOOD:
 *   version 1 answers  0 0 0  1  0  1
 *   version 2 answers  0 0 0 -1 -1 -1
 * A session that is locked before its third failure inherited another
 * session's failures: a wrong reply. */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <molt.h>

#include "session.h"

#define SLOTS 256
#define WORKERS 4
#define STEPS 6
#define MAX_GEN 8

static const int script_good[STEPS] = {0, 0, 0, 1, 0, 1};

struct slot {
  pthread_mutex_t lock;
  struct session *s;
  int step;
  uint64_t gen_open;
  int replies[STEPS];
};

static struct slot slots[SLOTS];
static atomic_bool stop;
static atomic_ulong opened, closed, wrong, requests;
/* [gen at open][gen at close][0 v1, 1 v2, 2 mixed] */
static atomic_ulong pairs[MAX_GEN][MAX_GEN][3];
static uint64_t next_id = 1;
static pthread_mutex_t id_lock = PTHREAD_MUTEX_INITIALIZER;

static uint64_t gen_now(void) {
  uint64_t g = molt_generation();
  return g < MAX_GEN ? g : MAX_GEN - 1;
}

/* Checks a finished session (slot lock held) and records its class. */
static void finish(struct slot *sl, uint64_t gen_close) {
  int v1 = 1, v2 = 1;
  for (int i = 0; i < STEPS; i++) {
    int r = sl->replies[i], good = script_good[i];
    int want1 = good ? LOGIN_OK : LOGIN_BAD;
    int want2 = i < 3 ? LOGIN_BAD : LOGIN_LOCKED;
    v1 &= r == want1;
    v2 &= r == want2;
    /* never locked before three failures; otherwise either version's
     * answer (a session alive across a switch may mix them) */
    if (r != want1 && r != want2) {
      atomic_fetch_add(&wrong, 1);
      fprintf(stderr, "wrong reply: session opened in generation %llu step %d reply %d\n",
              (unsigned long long)sl->gen_open, i, r);
    }
  }
  atomic_fetch_add(&pairs[sl->gen_open][gen_close][v1 ? 0 : v2 ? 1 : 2], 1);
}

static void work_on(struct slot *sl) {
  if (!sl->s) {
    pthread_mutex_lock(&id_lock);
    uint64_t id = next_id++;
    pthread_mutex_unlock(&id_lock);
    sl->gen_open = gen_now();
    sl->s = session_open(id, (int)(id % 1000));
    if (!sl->s)
      return;
    sl->step = 0;
    atomic_fetch_add(&opened, 1);
    return;
  }
  if (sl->step < STEPS) {
    int pw = session_password(sl->s->user) + (script_good[sl->step] ? 0 : 1);
    sl->replies[sl->step] = session_login(sl->s, pw);
    sl->step++;
    atomic_fetch_add(&requests, 1);
    return;
  }
  session_close(sl->s);
  sl->s = NULL;
  finish(sl, gen_now());
  atomic_fetch_add(&closed, 1);
}

static void *worker(void *arg) {
  unsigned seed = (unsigned)(uintptr_t)arg * 2654435761u + 1;
  while (!atomic_load(&stop)) {
    struct slot *sl = &slots[rand_r(&seed) % SLOTS];
    pthread_mutex_lock(&sl->lock);
    work_on(sl);
    pthread_mutex_unlock(&sl->lock);
    if (rand_r(&seed) % 64 == 0)
      usleep(100); /* let some sessions live across an update */
  }
  return NULL;
}

static void print_stats(const char *what) {
  printf("%s opened=%lu closed=%lu requests=%lu wrong=%lu shadows=%zu generation=%llu\n",
         what, atomic_load(&opened), atomic_load(&closed), atomic_load(&requests),
         atomic_load(&wrong), molt_shadow_total(), (unsigned long long)molt_generation());
  for (int a = 0; a < MAX_GEN; a++)
    for (int b = 0; b < MAX_GEN; b++)
      if (atomic_load(&pairs[a][b][0]) + atomic_load(&pairs[a][b][1]) +
          atomic_load(&pairs[a][b][2]))
        printf("pair %d %d v1=%lu v2=%lu mixed=%lu\n", a, b, atomic_load(&pairs[a][b][0]),
               atomic_load(&pairs[a][b][1]), atomic_load(&pairs[a][b][2]));
  printf("end\n");
  fflush(stdout);
}

int main(void) {
  for (int i = 0; i < SLOTS; i++)
    pthread_mutex_init(&slots[i].lock, NULL);
  pthread_t th[WORKERS];
  for (int i = 0; i < WORKERS; i++)
    pthread_create(&th[i], NULL, worker, (void *)(uintptr_t)i);
  printf("ready pid=%d\n", (int)getpid());
  fflush(stdout);
  char line[64];
  while (fgets(line, sizeof line, stdin)) {
    if (!strncmp(line, "stats", 5))
      print_stats("stats");
    else if (!strncmp(line, "quit", 4))
      break;
  }
  atomic_store(&stop, 1);
  for (int i = 0; i < WORKERS; i++)
    pthread_join(th[i], NULL);
  for (int i = 0; i < SLOTS; i++)
    if (slots[i].s) {
      session_close(slots[i].s);
      slots[i].s = NULL;
      atomic_fetch_add(&closed, 1);
    }
  print_stats("final");
  return 0;
}
