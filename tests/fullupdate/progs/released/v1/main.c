/* A thread released by one barrier and stopped (by a debugger, ptrace)
 * before it ran again must not hold up the next barrier's end.  Three
 * threads: main (its command loop), a looper that reaches its update point
 * every 2 ms, and a blocker that "block" sends into read() on a pipe (no
 * update point) so that every update times out until "release". */
#include "fu.h"
#include <pthread.h>
#include <stdatomic.h>
#include <time.h>

int counter = 1;
/* Written by their threads, read by main's "dump": relaxed atomics, each a
 * value on its own that publishes nothing else. */
_Atomic int blocker_tid, looper_tid;
_Atomic long looper_rounds;
int pipefd[2];
_Atomic int blocked;

void *blocker(void *arg) {
  atomic_store_explicit(&blocker_tid, fu_tid(), memory_order_relaxed);
  for (;;) {
    molt_update_point("blocker");
    if (atomic_load_explicit(&blocked, memory_order_relaxed)) {
      char c;
      while (read(pipefd[0], &c, 1) < 0) {
      }
      atomic_store_explicit(&blocked, 0, memory_order_relaxed);
    }
    struct timespec ts = {0, 2000000L};
    nanosleep(&ts, NULL);
  }
  return NULL;
}

void *looper(void *arg) {
  atomic_store_explicit(&looper_tid, fu_tid(), memory_order_relaxed);
  for (;;) {
    molt_update_point("looper");
    atomic_fetch_add_explicit(&looper_rounds, 1, memory_order_relaxed);
    struct timespec ts = {0, 2000000L};
    nanosleep(&ts, NULL);
  }
  return NULL;
}

static int fu_handle(char *cmd) {
  FU_COMMON(cmd)
  if (!strcmp(cmd, "inc")) {
    counter++;
    printf("ok\n");
  } else if (!strcmp(cmd, "block")) {
    atomic_store_explicit(&blocked, 1, memory_order_relaxed);
    printf("ok\n");
  } else if (!strcmp(cmd, "release")) {
    if (write(pipefd[1], "x", 1) != 1)
      printf("error write\n");
    else
      printf("ok\n");
  } else if (!strcmp(cmd, "dump")) {
    printf("version=1 counter=%d blocker_tid=%d looper_tid=%d looper_rounds=%ld "
           "blocked=%d\n",
           counter, atomic_load_explicit(&blocker_tid, memory_order_relaxed),
           atomic_load_explicit(&looper_tid, memory_order_relaxed),
           atomic_load_explicit(&looper_rounds, memory_order_relaxed),
           atomic_load_explicit(&blocked, memory_order_relaxed));
  } else {
    printf("error %s\n", cmd);
  }
  return 1;
}

int main(void) {
  if (!molt_is_updating()) {
    if (pipe(pipefd) != 0)
      return 1;
    pthread_t t;
    pthread_create(&t, NULL, blocker, NULL);
    pthread_create(&t, NULL, looper, NULL);
  }
  fu_serve();
  _exit(0);
}
