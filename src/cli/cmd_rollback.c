/* molt rollback <pid> [--policy P] [--timeout SEC] [--scan-limit MIB]: back to
 * the generation
 * before the last patch. */
#include "cli/cli.h"

int cli_cmd_rollback(const cli_args *a) {
  /* raised before anything else, in case it is an attached process; a
   * molt process's rollback is its runtime's work */
  cli_attach_raise();
  if (cli_attached(a->pid))
    return cli_attach_rollback(a);
  cli_attach_lower();
  if (a->scan_limit_mib >= 0)
    return cli_fail(
        EXIT_USAGE,
        "rollback %ld: --scan-limit applies only to a process patched by molt "
        "attach",
        (long)a->pid);
  char what[64], done[64];
  snprintf(what, sizeof what, "rollback %ld", (long)a->pid);
  snprintf(done, sizeof done, "rolled back %ld", (long)a->pid);
  molt__request req = {.op = MOLT__OP_ROLLBACK};
  return cli_change(a, what, &req, done);
}
