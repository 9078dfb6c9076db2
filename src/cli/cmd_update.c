/* molt update <pid> <image.so> [--timeout SEC] [--check-interior] [--shadow]:
 * a full update of a process started with `molt run`; with --shadow, the
 * operation shadow (cmd_shadow.c): the update rehearsed in a follower. */
#include "cli/cli.h"

#include <limits.h>
#include <stdlib.h>
#include <unistd.h>

int cli_cmd_update(const cli_args *a) {
  char what[PATH_MAX + 64];
  snprintf(what, sizeof what, "update %ld to %s", (long)a->pid, a->pos[1]);
  if (a->shadow)
    return cli_cmd_shadow(a);
  molt__request req = {.op = MOLT__OP_UPDATE};
  char *abs;
  int fd;
  int code = cli_file_arg(what, a->pos[1], "program image",
                          "moltcc --molt-program --molt-from <running image>", &abs, &fd);
  if (code != 0)
    return code;
  snprintf(req.path, sizeof req.path, "%s", abs);
  char done[PATH_MAX + 64];
  snprintf(done, sizeof done, "updated %ld to %s", (long)a->pid, abs);
  free(abs);
  req.has_fd = true;
  req.fd = fd;
  code = cli_change(a, what, &req, done);
  close(fd);
  return code;
}
