/* molt shadow <pid> <image.so> [--timeout SEC], also spelled molt update
 * --shadow: a shadowed full update -- a forked follower performs the update
 * and replays the leader's calls while the process serves on in the old
 * version (docs/design.md §17).  `molt status` shows how it goes. */
#include "cli/cli.h"

#include <limits.h>

int cli_cmd_shadow(const cli_args *a) {
  char what[PATH_MAX + 64];
  snprintf(what, sizeof what, "shadowed update of %ld to %s", (long)a->pid, a->pos[1]);
  return cli_change_with_file(a, what, MOLT__OP_SHADOW, "program image",
                              "moltcc --molt-program --molt-from <running image>",
                              "shadowed update of %1$ld to %2$s started");
}
