/* The target of bench/attach (P11), built with plain gcc -O2: bench.py
 * prepends NFUNCS, the functions f0..f<NFUNCS-1> and their table.
 *
 *   target THREADS blocked|busy
 *
 * blocked: every thread waits in read() on a pipe that never gets data;
 * busy: every thread calls the functions through the table in a loop.
 * Prints "ready" once all threads run, then waits. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static volatile long sink;
static int pipe_fds[2];

static void *blocked(void *arg) {
  char c;
  (void)arg;
  for (;;)
    if (read(pipe_fds[0], &c, 1) == 1)
      sink += c;
}

static void *busy(void *arg) {
  long i = (long)arg, acc = 0;
  for (;;) {
    acc += table[i % NFUNCS](i);
    i++;
    if ((i & 1023) == 0)
      sink = acc;
  }
  return NULL;
}

int main(int argc, char **argv) {
  int n = argc > 1 ? atoi(argv[1]) : 1;
  int is_busy = argc > 2 && strcmp(argv[2], "busy") == 0;
  if (pipe(pipe_fds) != 0)
    return 1;
  pthread_attr_t attr;
  pthread_attr_init(&attr);
  pthread_attr_setstacksize(&attr, 64 * 1024);
  /* n threads in all: the main thread waits as one of the blocked ones */
  for (long i = 1; i < n; i++) {
    pthread_t t;
    if (pthread_create(&t, &attr, is_busy ? busy : blocked, (void *)i) != 0)
      return 1;
  }
  printf("ready\n");
  fflush(stdout);
  if (is_busy)
    busy((void *)0);
  blocked(NULL);
  return 0;
}
