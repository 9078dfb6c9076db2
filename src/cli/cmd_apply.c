/* molt apply <pid> <patch.so> [--policy P] [--timeout SEC]: a hot patch. */
#include "cli/cli.h"

#include <limits.h>
#include <stdlib.h>
#include <string.h>

int cli_cmd_apply(const cli_args *a) {
  char what[PATH_MAX + 64];
  snprintf(what, sizeof what, "apply %s to %ld", a->pos[1], (long)a->pid);
  molt__request *req = cli_xmalloc(sizeof *req); /* large: the rules' text */
  memset(req, 0, sizeof *req);
  req->op = MOLT__OP_APPLY;
  int code = cli_change_with_file(a, what, req, "patch file", "moltcc --molt-patch",
                                  "applied %2$s to %1$ld");
  free(req);
  return code;
}
