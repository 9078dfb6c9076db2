/* A lock held at an update point (as a library lock can be): a helper
 * thread parks while it holds big_lock.  The new version's
 * molt_on_migrated takes the lock -- its migrated copy says "locked", and
 * nobody will ever unlock it: the migration blocks in libc's futex wait,
 * which libc retries after every signal.  `molt update` must still answer,
 * and the old version go on. */
#include "fu.h"
#include <pthread.h>

static pthread_mutex_t big_lock = PTHREAD_MUTEX_INITIALIZER;
static volatile int helper_loops;

static void *helper(void *arg) {
  (void)arg;
  for (;;) {
    pthread_mutex_lock(&big_lock);
    helper_loops++;
    molt_update_point("helper"); /* the bug: a lock held at the point */
    pthread_mutex_unlock(&big_lock);
    usleep(2000);
  }
  return NULL;
}

static int fu_handle(char *cmd) {
  FU_COMMON(cmd)
  if (!strcmp(cmd, "dump")) {
    printf("version=2 loops=%d\n", helper_loops > 0);
  } else if (!strcmp(cmd, "loops")) {
    printf("%d\n", helper_loops);
  } else {
    printf("error %s\n", cmd);
  }
  return 1;
}

int molt_on_migrated(char *why, size_t len) {
  (void)why;
  (void)len;
  pthread_mutex_lock(&big_lock); /* blocks for ever */
  pthread_mutex_unlock(&big_lock);
  return 0;
}

int main(void) {
  if (!molt_is_updating()) {
    pthread_t t;
    pthread_create(&t, NULL, helper, NULL);
  }
  fu_serve();
  return 0;
}
