/* Names of processes and threads, as the kernel keeps them (/proc/.../comm):
 * for `molt status` (threads of the process), a global update's timeout
 * message (threads that did not arrive) and the CLI (processes). */
#include "common/common.h"

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
