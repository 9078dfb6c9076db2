/* Updates that fail before any thread is disturbed: a new image with an
 * unresolved symbol, and one without the entry function of a thread. */
#include "fu.h"
#include <pthread.h>
#include <time.h>

int counter = 1;
long helper_loops;

void *helper(void *arg) {
  for (;;) {
    molt_update_point("helper");
    __atomic_add_fetch(&helper_loops, 1, __ATOMIC_RELAXED);
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
  } else if (!strcmp(cmd, "dump")) {
    printf("version=1 counter=%d helper_loops=%ld\n", counter,
           __atomic_load_n(&helper_loops, __ATOMIC_RELAXED));
  } else {
    printf("error %s\n", cmd);
  }
  return 1;
}

int main(void) {
  if (!molt_is_updating()) {
    pthread_t t;
    pthread_create(&t, NULL, helper, NULL);
  }
  fu_serve();
  _exit(0);
}
