/*
 * runner — runs two or more programs alternately and times every run.
 *
 *   runner RUNS < spec        spec: one program per line,
 *                             LABEL <TAB> ARGV0 <TAB> ARGV1 ...
 *
 * Why a C runner and not Python's subprocess: the short runs of the
 * benchmarks (10^3 loop iterations, start-up at 1,000 functions) last about a
 * millisecond, and an interpreter between fork and exec adds jitter of that
 * order.  Here the clock is read right before posix_spawn and right after
 * wait4, nothing else happens in between.
 *
 * Round r runs the programs in order when r is even and in reverse order
 * when r is odd, so slow drift of the machine (other load, frequency) hits
 * all programs alike and a comparison is a ratio taken in the same run.
 *
 * Output: one JSON object per run on stdout:
 *   {"label":..., "run":r, "t_spawn_ns":..., "wall_ns":..., "user_ns":...,
 *    "sys_ns":..., "maxrss_kb":..., "minflt":..., "status":..., "out":"<program stdout>"}
 * t_spawn_ns is CLOCK_MONOTONIC (system-wide) just before the spawn, so a
 * program that prints its own CLOCK_MONOTONIC at main() gives exec-to-main.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <spawn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

extern char **environ;

#define MAX_PROGS 64
#define MAX_ARGS 64
#define OUT_MAX (1 << 16)

typedef struct prog {
  char *label;
  char *argv[MAX_ARGS + 1];
} prog;

static uint64_t mono_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static uint64_t tv_ns(struct timeval tv) {
  return (uint64_t)tv.tv_sec * 1000000000u + (uint64_t)tv.tv_usec * 1000u;
}

static void json_string(const char *s, size_t n) {
  putchar('"');
  for (size_t i = 0; i < n; i++) {
    unsigned char c = (unsigned char)s[i];
    if (c == '"' || c == '\\')
      printf("\\%c", c);
    else if (c == '\n')
      fputs("\\n", stdout);
    else if (c < 0x20)
      printf("\\u%04x", c);
    else
      putchar(c);
  }
  putchar('"');
}

/* Runs p once; its stdout is collected through a pipe (read only after the
 * child exits would deadlock on a full pipe, so it is drained while it
 * runs; the programs print a few lines at most). */
static int run_one(const prog *p, int run) {
  int fds[2];
  if (pipe2(fds, O_CLOEXEC) != 0) {
    perror("runner: pipe");
    return -1;
  }
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_adddup2(&fa, fds[1], 1);
  static char out[OUT_MAX];
  size_t len = 0;
  pid_t pid;
  uint64_t t0 = mono_ns();
  int rc = posix_spawn(&pid, p->argv[0], &fa, NULL, p->argv, environ);
  close(fds[1]);
  posix_spawn_file_actions_destroy(&fa);
  if (rc != 0) {
    fprintf(stderr, "runner: cannot run %s: %s\n", p->argv[0], strerror(rc));
    close(fds[0]);
    return -1;
  }
  for (;;) {
    ssize_t n = read(fds[0], out + len, sizeof out - 1 - len);
    if (n < 0 && errno == EINTR)
      continue;
    if (n <= 0)
      break;
    len += (size_t)n;
    if (len == sizeof out - 1)
      break;
  }
  close(fds[0]);
  int status;
  struct rusage ru;
  while (wait4(pid, &status, 0, &ru) < 0 && errno == EINTR) {
  }
  uint64_t t1 = mono_ns();
  printf("{\"label\": ");
  json_string(p->label, strlen(p->label));
  printf(
      ", \"run\": %d, \"t_spawn_ns\": %llu, \"wall_ns\": %llu, \"user_ns\": %llu, "
      "\"sys_ns\": %llu, \"maxrss_kb\": %ld, \"minflt\": %ld, \"status\": %d, \"out\": ",
      run, (unsigned long long)t0, (unsigned long long)(t1 - t0),
      (unsigned long long)tv_ns(ru.ru_utime), (unsigned long long)tv_ns(ru.ru_stime),
      ru.ru_maxrss, ru.ru_minflt,
      WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status));
  json_string(out, len);
  printf("}\n");
  fflush(stdout);
  return 0;
}

int main(int argc, char **argv) {
  if (argc != 2 || atoi(argv[1]) < 1) {
    fprintf(stderr, "usage: runner RUNS < spec (LABEL\\tARGV0\\tARGV1...)\n");
    return 2;
  }
  int runs = atoi(argv[1]);
  static prog progs[MAX_PROGS];
  int n = 0;
  char *line = NULL;
  size_t cap = 0;
  ssize_t l;
  while ((l = getline(&line, &cap, stdin)) > 0 && n < MAX_PROGS) {
    if (line[l - 1] == '\n')
      line[--l] = '\0';
    if (l == 0)
      continue;
    char *save, *tok = strtok_r(strdup(line), "\t", &save);
    progs[n].label = tok;
    int a = 0;
    while ((tok = strtok_r(NULL, "\t", &save)) && a < MAX_ARGS)
      progs[n].argv[a++] = tok;
    progs[n].argv[a] = NULL;
    if (a == 0) {
      fprintf(stderr, "runner: no command for %s\n", progs[n].label);
      return 2;
    }
    n++;
  }
  for (int r = 0; r < runs; r++)
    for (int i = 0; i < n; i++)
      if (run_one(&progs[r % 2 ? n - 1 - i : i], r) < 0)
        return 1;
  return 0;
}
