/* molt-run: the driver that `molt run` execs, so that the process the user
 * sees (its PID) is the program's.  It loads the program image given as
 * its first argument and runs the image's main with the remaining
 * arguments (argv[0] of the program is the image path). */
#include "molt.h"

#include <stdio.h>

int main(int argc, char **argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: molt-run <image.so> [arguments...]\n"
                    "  runs a molt program image (built with moltcc --molt-program);\n"
                    "  normally started through 'molt run'\n");
    return 2;
  }
  return molt__program_run(argv[1], argc - 1, argv + 1);
}
