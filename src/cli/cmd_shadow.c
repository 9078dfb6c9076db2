/* molt shadow <pid> <image.so> [--timeout SEC], also spelled molt update
 * --shadow: a shadowed full update -- a forked follower performs the update
 * and replays the leader's calls while the process serves on in the old
 * version (docs/design.md §17).  `molt status` shows how it goes. */
#include "cli/cli.h"

#include <limits.h>
#include <stdlib.h>
#include <unistd.h>

int cli_cmd_shadow(const cli_args *a) {
  char what[PATH_MAX + 64];
  snprintf(what, sizeof what, "shadowed update of %ld to %s", (long)a->pid, a->pos[1]);
  molt__request req = {.op = MOLT__OP_SHADOW};
  char *abs;
  int fd;
  int code = cli_file_arg(what, a->pos[1], "program image",
                          "moltcc --molt-program --molt-from <running image>", &abs, &fd);
  if (code != 0)
    return code;
  snprintf(req.path, sizeof req.path, "%s", abs);
  char done[PATH_MAX + 64];
  snprintf(done, sizeof done, "shadowed update of %ld to %s started", (long)a->pid, abs);
  free(abs);
  req.has_fd = true;
  req.fd = fd;
  code = cli_change(a, what, &req, done);
  close(fd);
  return code;
}
