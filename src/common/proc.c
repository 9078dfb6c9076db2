/* Names of processes and threads, as the kernel keeps them (/proc/.../comm):
 * for `molt status` (threads of the process), a global update's timeout
 * message (threads that did not arrive) and the CLI (processes); and where
 * a thread of this process is blocked (/proc/self/task/TID/syscall), for
 * the same timeout message. */
#include "common/common.h"

#include <inttypes.h>
#include <stdio.h>
#include <string.h>

bool molt__proc_name(pid_t pid, pid_t tid, char *name, size_t len) {
  char path[64];
  char proc[24] = "self"; /* pid 0: this process */
  if (pid > 0)
    snprintf(proc, sizeof proc, "%d", (int)pid);
  if (tid > 0)
    snprintf(path, sizeof path, "/proc/%s/task/%d/comm", proc, (int)tid);
  else
    snprintf(path, sizeof path, "/proc/%s/comm", proc);
  if (len)
    name[0] = '\0';
  FILE *f = fopen(path, "re");
  if (!f)
    return false;
  bool ok = len && fgets(name, (int)len, f) != NULL;
  fclose(f);
  if (ok)
    name[strcspn(name, "\n")] = '\0';
  else if (len)
    name[0] = '\0';
  return ok;
}

bool molt__proc_blocked_at(pid_t tid, long *nr, uintptr_t *sp, uintptr_t *pc) {
  char path[64], line[256];
  snprintf(path, sizeof path, "/proc/self/task/%d/syscall", (int)tid);
  FILE *f = fopen(path, "re");
  if (!f)
    return false;
  bool ok = fgets(line, sizeof line, f) != NULL;
  fclose(f);
  if (!ok)
    return false;
  /* "NR ARG1 .. ARG6 SP PC" in a system call, "-1 SP PC" blocked outside
   * one, "running" otherwise (the arguments in hex with 0x). */
  long n = 0;
  int used = 0;
  if (sscanf(line, "%ld%n", &n, &used) != 1)
    return false;
  const char *rest = line + used;
  unsigned skip = n == -1 ? 0 : 6;
  for (unsigned i = 0; i < skip; i++) {
    uintmax_t a;
    if (sscanf(rest, "%jx%n", &a, &used) != 1)
      return false;
    rest += used;
  }
  uintmax_t s = 0, p = 0;
  if (sscanf(rest, "%jx %jx", &s, &p) != 2)
    return false;
  *nr = n;
  *sp = (uintptr_t)s;
  *pc = (uintptr_t)p;
  return true;
}
