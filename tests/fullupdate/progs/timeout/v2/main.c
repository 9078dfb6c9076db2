/* A thread that does not reach an update point: the update times out and
 * v1 goes on.  "block" makes the thread wait in read() on a pipe (no update
 * point, no wake-up callback); "release" lets it go back to its loop.  A
 * looper reaches its update point every 2 ms: test_failures.py stops it
 * with ptrace right after a barrier released it, and the next barrier must
 * still end at its timeout. */
#include "fu.h"
#include <pthread.h>
#include <stdatomic.h>
#include <time.h>

int counter = 1;
/* Shared by the blocker and main's commands, relaxed atomics: each is a
 * value on its own that publishes nothing else (the test gives the
 * blocker time to react to `blocked`; pipefd is written before the blocker
 * is created). */
_Atomic int blocker_tid, looper_tid;
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
    printf("version=2 counter=%d blocker_tid=%d looper_tid=%d blocked=%d\n", counter,
           atomic_load_explicit(&blocker_tid, memory_order_relaxed),
           atomic_load_explicit(&looper_tid, memory_order_relaxed),
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
