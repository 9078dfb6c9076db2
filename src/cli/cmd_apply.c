/* molt apply <pid> <patch.so> [--policy P] [--timeout SEC]: a hot patch. */
#include "cli/cli.h"

#include <limits.h>
#include <stdlib.h>
#include <unistd.h>

int cli_cmd_apply(const cli_args *a) {
  char what[PATH_MAX + 64];
  snprintf(what, sizeof what, "apply %s to %ld", a->pos[1], (long)a->pid);
  molt__request req = {.op = MOLT__OP_APPLY};
  char *abs;
  int fd;
  int code =
      cli_file_arg(what, a->pos[1], "patch file", "moltcc --molt-patch", &abs, &fd);
  if (code != 0)
    return code;
  snprintf(req.path, sizeof req.path, "%s", abs);
  char done[PATH_MAX + 64];
  snprintf(done, sizeof done, "applied %s to %ld", abs, (long)a->pid);
  free(abs);
  req.has_fd = true;
  req.fd = fd;
  code = cli_change(a, what, &req, done);
  close(fd);
  return code;
}
