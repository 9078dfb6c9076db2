/* molt rollback <pid> [--policy P] [--timeout SEC]: back to the generation
 * before the last patch. */
#include "cli/cli.h"

int cli_cmd_rollback(const cli_args *a) {
  if (cli_attached(a->pid))
    return cli_attach_rollback(a);
  char what[64], done[64];
  snprintf(what, sizeof what, "rollback %ld", (long)a->pid);
  snprintf(done, sizeof done, "rolled back %ld", (long)a->pid);
  molt__request req = {.op = MOLT__OP_ROLLBACK};
  return cli_change(a, what, &req, done);
}
