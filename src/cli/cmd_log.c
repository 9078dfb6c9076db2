/* molt log <pid> [--json]: the process's update log (of a process patched
 * by molt attach: its attach log, cmd_attach.c). */
#include "cli/cli.h"

static const cli_view entries = {
    "log", NULL, "log",
    CLI_FIELDS({"seq", 1, CLI_NUM}, {"time", 2, CLI_NUM}, {"event", 3, CLI_STR},
               {"generation", 4, CLI_NUM}, {"patch", 5, CLI_PATCH},
               {"message", 6, CLI_STR}),
    CLI_COLUMNS({"SEQ", 1, CLI_AS_IS}, {"TIME", 2, CLI_TIME}, {"EVENT", 3, CLI_AS_IS},
                {"GENERATION", 4, CLI_AS_IS}, {"PATCH", 5, CLI_AS_IS},
                {"MESSAGE", 6, CLI_AS_IS})};

int cli_cmd_log(const cli_args *a) {
  if (cli_attached(a->pid) || cli_attach_logged(a->pid))
    return cli_attach_log(a);
  cli_reply r;
  int code = cli_report(a, MOLT__OP_LOG, &r);
  if (code != 0)
    return code;
  if (a->json) {
    cli_json j = {0};
    cli_json_records(&j, &r.recs, &entries);
    cli_json_done(&j);
  } else {
    cli_table_records(&r.recs, &entries, "");
  }
  cli_reply_free(&r);
  return EXIT_OK;
}
