/* Threads that block where only molt.h's waits reach them: one in
 * molt_cond_wait on a condition nobody signals, one in molt_usleep for a
 * minute, one in poll() on molt_update_fd() without a timeout.  An update
 * must reach all three at once (none would pass an update point for a
 * minute otherwise).  A SIGUSR1 handler installed once, at the first start:
 * after a full update it is the new version's function (redirected by
 * name at the commit). */
#include "fu.h"
#include <errno.h>
#include <pthread.h>
#include <signal.h>

#define VERSION 1

/* Written by each thread when it starts (a restart too), read by "dump":
 * under lock. */
int starts[3], versions[3];
long tokens[2]; /* each waiter's local `token`, carried with MOLT_MIGRATE_LOCAL */
int cond_eintr; /* molt_cond_wait returned EINTR (an update that did not restart it) */
pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
pthread_mutex_t wait_mutex = PTHREAD_MUTEX_INITIALIZER;
pthread_cond_t never = PTHREAD_COND_INITIALIZER;
volatile sig_atomic_t handled_by; /* the version whose handler ran last */

static void started(int i) {
  pthread_mutex_lock(&lock);
  starts[i]++;
  versions[i] = VERSION;
  pthread_mutex_unlock(&lock);
}

/* A fresh start makes its token from VERSION; a restarted thread gets the
 * old one back (the frame-pointer chain from its update point, inside
 * molt_cond_wait or molt_usleep, reaches this frame). */
static void keep_token(int i, long *token) {
  pthread_mutex_lock(&lock);
  tokens[i] = *token;
  pthread_mutex_unlock(&lock);
}

void *condwaiter(void *arg) {
  long token = 0;
  if (!MOLT_MIGRATE_LOCAL(token))
    token = 1000 + VERSION;
  started(0);
  keep_token(0, &token);
  pthread_mutex_lock(&wait_mutex);
  for (;;)
    if (molt_cond_wait(&never, &wait_mutex, "cond") == EINTR) {
      pthread_mutex_lock(&lock);
      cond_eintr++;
      pthread_mutex_unlock(&lock);
    }
  return arg;
}

void *sleeper(void *arg) {
  long token = 0;
  if (!MOLT_MIGRATE_LOCAL(token))
    token = 2000 + VERSION;
  started(1);
  keep_token(1, &token);
  for (;;)
    molt_usleep(60 * 1000000UL, "sleep");
  return arg;
}

void *poller(void *arg) {
  started(2);
  struct pollfd p = {molt_update_fd(), POLLIN, 0};
  for (;;) {
    molt_update_point("poll");
    poll(&p, 1, -1);
  }
  return arg;
}

void on_usr1(int sig) {
  (void)sig;
  handled_by = VERSION;
}

static int fu_handle(char *cmd) {
  FU_COMMON(cmd)
  if (!strcmp(cmd, "dump")) {
    pthread_mutex_lock(&lock);
    printf("version=%d", VERSION);
    for (int i = 0; i < 3; i++)
      printf(" starts%d=%d version%d=%d", i, starts[i], i, versions[i]);
    printf(" cond_eintr=%d token0=%ld token1=%ld\n", cond_eintr, tokens[0], tokens[1]);
    pthread_mutex_unlock(&lock);
  } else if (!strcmp(cmd, "signal")) {
    handled_by = 0;
    raise(SIGUSR1);
    printf("handled_by=%d\n", (int)handled_by);
  } else if (!strcmp(cmd, "mutex")) {
    /* The condition waiter's mutex is free while it waits. */
    int rc = pthread_mutex_trylock(&wait_mutex);
    if (rc == 0)
      pthread_mutex_unlock(&wait_mutex);
    printf("trylock=%d\n", rc);
  } else if (!strcmp(cmd, "fd")) {
    struct pollfd p = {molt_update_fd(), POLLIN, 0};
    printf("readable=%d\n", poll(&p, 1, 0));
  } else {
    printf("error %s\n", cmd);
  }
  return 1;
}

int main(void) {
  if (!molt_is_updating()) {
    signal(SIGUSR1, on_usr1);
    pthread_t t[3];
    pthread_create(&t[0], NULL, condwaiter, NULL);
    pthread_create(&t[1], NULL, sleeper, NULL);
    pthread_create(&t[2], NULL, poller, NULL);
  }
  fu_serve();
  _exit(0); /* the threads never stop */
}
