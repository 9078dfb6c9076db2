/* molt run <image.so> [args...]: exec the driver (bin/molt-run next to
 * this executable, else molt-run on PATH), so that the program keeps the
 * PID the user sees.  The words after the image are the program's, never
 * molt's options. */
#include "cli/cli.h"

#include <errno.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

int cli_cmd_run(const cli_args *a) {
  int argc = a->argc;
  char **argv = a->argv;
  if (argc < 3)
    return cli_fail(EXIT_USAGE, "run: missing arguments; usage: molt run "
                                "<image.so> [args...]");
  const char *image = argv[2];
  int first = 2;
  if (strcmp(image, "--") == 0) {
    if (argc < 4)
      return cli_fail(EXIT_USAGE, "run: missing arguments; usage: molt run "
                                  "<image.so> [args...]");
    image = argv[3];
    first = 3;
  }
  struct stat st;
  if (stat(image, &st) < 0)
    return cli_fail(EXIT_USAGE, "run %s: %s; check the path of the program image", image,
                    strerror(errno));
  if (!S_ISREG(st.st_mode))
    return cli_fail(EXIT_USAGE,
                    "run %s: not a regular file; give the .so file built by "
                    "'moltcc --molt-program'",
                    image);
  char *abs = realpath(image, NULL);
  if (abs == NULL)
    return cli_fail(EXIT_USAGE, "run %s: cannot resolve the path: %s", image,
                    strerror(errno));
  /* argv of the driver: molt-run <image> <program args...> */
  int n = argc - first;
  char **av = cli_xmalloc(((size_t)n + 2) * sizeof *av);
  av[0] = "molt-run";
  av[1] = abs;
  for (int i = 1; i < n; i++)
    av[i + 1] = argv[first + i];
  av[n + 1] = NULL;

  char self[PATH_MAX];
  ssize_t len = readlink("/proc/self/exe", self, sizeof self - 1);
  if (len > 0) {
    self[len] = '\0';
    char *slash = strrchr(self, '/');
    if (slash != NULL && (size_t)(slash - self) + sizeof "/molt-run" <= sizeof self) {
      strcpy(slash + 1, "molt-run");
      if (access(self, X_OK) == 0) {
        execv(self, av);
        int e = errno;
        free(av);
        free(abs);
        return cli_fail(127,
                        "run %s: cannot execute %s: %s; check the molt "
                        "installation",
                        image, self, strerror(e));
      }
    }
  }
  execvp("molt-run", av);
  int e = errno;
  free(av);
  free(abs);
  return cli_fail(127,
                  "run %s: cannot execute molt-run: %s; install molt-run next "
                  "to molt or on PATH",
                  image, strerror(e));
}
