/* molt promote <pid> [--timeout SEC]: a shadowed update's new version (the
 * follower) leads and the old one follows under the reverse rules
 * (docs/design.md §17). */
#include "cli/cli.h"

int cli_cmd_promote(const cli_args *a) {
  char what[64], done[64];
  snprintf(what, sizeof what, "promote %ld", (long)a->pid);
  snprintf(done, sizeof done, "promoted %ld", (long)a->pid);
  molt__request req = {.op = MOLT__OP_PROMOTE};
  return cli_change(a, what, &req, done);
}
