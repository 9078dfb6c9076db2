/* molt-run: the driver that `molt run` execs, so that the process the user
 * sees (its PID) is the program's.  It loads the program image given as
 * its first argument and runs the image's main with the remaining
 * arguments (argv[0] of the program is the image path).  If the image
 * cannot be run, the driver -- not the runtime inside it, which never
 * writes to its host's stderr -- says why in one line and exits with 127. */
#include "molt.h"
#include "molt/program.h"

#include <stdio.h>

int main(int argc, char **argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: molt-run <image.so> [arguments...]\n"
                    "  runs a molt program image (built with moltcc --molt-program);\n"
                    "  normally started through 'molt run'\n");
    return 2;
  }
  char err[1024];
  int status = 0;
  if (molt__program_run(argv[1], argc - 1, argv + 1, &status, err, sizeof err) < 0) {
    fprintf(stderr, "molt-run: cannot run %s: %s\n", argv[1], err);
    return 127;
  }
  return status;
}
