/* molt apply <pid> <patch.so> [--policy P] [--timeout SEC]: a hot patch. */
#include "cli/cli.h"

#include <limits.h>

int cli_cmd_apply(const cli_args *a) {
  char what[PATH_MAX + 64];
  snprintf(what, sizeof what, "apply %s to %ld", a->pos[1], (long)a->pid);
  return cli_change_with_file(a, what, MOLT__OP_APPLY, "patch file",
                              "moltcc --molt-patch", "applied %2$s to %1$ld");
}
