/* forker.c -- a forking thread for the soak (bench/soak/soak.py), linked
 * into the soak's build of examples/kvstore.
 *
 * With SOAK_FORK_MS=N in the environment, a constructor starts a thread
 * that forks every N ms while the soak patches and rolls back the
 * process.  Each child allocates, frees and exits with status 7 at once;
 * the thread waits for it for up to 10 s (then kills it: a child that did
 * not exit is "stuck", e.g. on a lock the fork left held) and keeps
 * figures in the file $SOAK_FORK_REPORT, rewritten after every fork:
 *   forks=N stuck=N bad_exit=N max_fork_us=N max_child_us=N
 * It is part of the program, not of molt: it never touches molt's API. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static unsigned long forks, stuck, bad_exit, max_fork_us, max_child_us;
static const char *report_path;
static unsigned period_ms;

static unsigned long now_us(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (unsigned long)t.tv_sec * 1000000ul + (unsigned long)t.tv_nsec / 1000ul;
}

static void report(void) {
  char tmp[4096], line[256];
  snprintf(tmp, sizeof tmp, "%s.tmp", report_path);
  int n = snprintf(line, sizeof line,
                   "forks=%lu stuck=%lu bad_exit=%lu max_fork_us=%lu max_child_us=%lu\n",
                   forks, stuck, bad_exit, max_fork_us, max_child_us);
  int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0)
    return;
  ssize_t w = write(fd, line, (size_t)n);
  close(fd);
  if (w == n)
    rename(tmp, report_path);
}

static void *forker(void *arg) {
  (void)arg;
  for (;;) {
    struct timespec pause = {period_ms / 1000, (long)(period_ms % 1000) * 1000000L};
    nanosleep(&pause, NULL);
    unsigned long t0 = now_us();
    pid_t pid = fork();
    if (pid == 0) {
      void *p = malloc(100);
      free(p);
      _exit(7);
    }
    if (pid < 0)
      continue;
    unsigned long t1 = now_us();
    if (t1 - t0 > max_fork_us)
      max_fork_us = t1 - t0;
    forks++;
    int st = 0;
    for (;;) {
      pid_t r = waitpid(pid, &st, WNOHANG);
      if (r == pid)
        break;
      if (r < 0 && errno != EINTR) {
        st = -1;
        break;
      }
      if (now_us() - t1 > 10000000ul) {
        stuck++;
        kill(pid, SIGKILL);
        waitpid(pid, &st, 0);
        st = -1;
        break;
      }
      struct timespec tick = {0, 1000000L};
      nanosleep(&tick, NULL);
    }
    if (st != -1 && !(WIFEXITED(st) && WEXITSTATUS(st) == 7))
      bad_exit++;
    if (now_us() - t1 > max_child_us)
      max_child_us = now_us() - t1;
    report();
  }
  return NULL;
}

__attribute__((constructor)) static void start_forker(void) {
  const char *ms = getenv("SOAK_FORK_MS");
  report_path = getenv("SOAK_FORK_REPORT");
  if (!ms || !report_path || atoi(ms) <= 0)
    return;
  period_ms = (unsigned)atoi(ms);
  pthread_t t;
  pthread_attr_t a;
  pthread_attr_init(&a);
  pthread_attr_setdetachstate(&a, PTHREAD_CREATE_DETACHED);
  pthread_create(&t, &a, forker, NULL);
  pthread_attr_destroy(&a);
}
