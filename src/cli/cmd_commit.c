/* molt commit <pid> [--timeout SEC]: keeps a shadowed update's new version:
 * the follower ends and the process performs the rehearsed full update in
 * place, keeping its pid (docs/design.md §17). */
#include "cli/cli.h"

int cli_cmd_commit(const cli_args *a) {
  char what[64], done[64];
  snprintf(what, sizeof what, "commit %ld", (long)a->pid);
  snprintf(done, sizeof done, "committed %ld", (long)a->pid);
  molt__request req = {.op = MOLT__OP_COMMIT};
  return cli_change(a, what, &req, done);
}
