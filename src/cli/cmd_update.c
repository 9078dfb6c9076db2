/* molt update <pid> <image.so> [--timeout SEC] [--check-interior] [--shadow]:
 * a full update of a process started with `molt run`; with --shadow, the
 * operation shadow (cmd_shadow.c): the update rehearsed in a follower. */
#include "cli/cli.h"

#include <limits.h>
#include <stdlib.h>
#include <string.h>

int cli_cmd_update(const cli_args *a) {
  char what[PATH_MAX + 64];
  snprintf(what, sizeof what, "update %ld to %s", (long)a->pid, a->pos[1]);
  if (a->shadow)
    return cli_cmd_shadow(a);
  molt__request *req = cli_xmalloc(sizeof *req); /* large: the rules' text */
  memset(req, 0, sizeof *req);
  req->op = MOLT__OP_UPDATE;
  int code = cli_change_with_file(a, what, req, "program image",
                                  "moltcc --molt-program --molt-from <running image>",
                                  "updated %1$ld to %2$s");
  free(req);
  return code;
}
