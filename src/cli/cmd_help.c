/* molt help, molt --version. */
#include "cli/cli.h"

int cli_cmd_help(const cli_args *a) {
  (void)a;
  cli_usage(stdout);
  return EXIT_OK;
}

int cli_cmd_version(const cli_args *a) {
  (void)a;
  printf("molt %s (control protocol %u)\n", MOLT_VERSION_STRING, MOLT__PROTO_VERSION);
  return EXIT_OK;
}
