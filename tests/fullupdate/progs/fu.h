/* fu.h -- the command loop shared by the full-update test programs.
 *
 * A test program answers commands on stdin, one line each, with exactly
 * one line on stdout; the test (tests/fullupdate/fuprogs.py) reads the
 * state through them before and after `molt update`.  Between two
 * commands the main thread passes its update point "main". */
#ifndef FU_H
#define FU_H

#define _GNU_SOURCE
#include <molt.h>
#include <poll.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

/* Defined by each program: answers one command (the line without its
 * newline) with one line on stdout.  Returns 0 to make fu_serve return. */
static int fu_handle(char *cmd);

static char fu_line[512];
static size_t fu_len;

static int fu_tid(void) { return (int)syscall(SYS_gettid); }

/* Reads and answers commands until stdin closes or a handler returns 0. */
static void fu_serve(void) {
  for (;;) {
    molt_update_point("main");
    struct pollfd p = {0, POLLIN, 0};
    if (poll(&p, 1, 10) <= 0)
      continue;
    ssize_t r = read(0, fu_line + fu_len, sizeof fu_line - 1 - fu_len);
    if (r <= 0)
      return;
    fu_len += (size_t)r;
    char *nl;
    while ((nl = memchr(fu_line, '\n', fu_len)) != NULL) {
      *nl = 0;
      int go = fu_handle(fu_line);
      fflush(stdout);
      size_t used = (size_t)(nl + 1 - fu_line);
      memmove(fu_line, nl + 1, fu_len - used);
      fu_len -= used;
      if (!go)
        return;
    }
  }
}

/* "quit" ends the program (exit status 0); anything unknown is an error. */
#define FU_COMMON(cmd)                                                                   \
  if (!strcmp(cmd, "quit")) {                                                            \
    printf("bye\n");                                                                     \
    return 0;                                                                            \
  }                                                                                      \
  if (!strcmp(cmd, "ping")) {                                                            \
    printf("pong\n");                                                                    \
    return 1;                                                                            \
  }

#endif
