/* molt shadow <pid> <image.so> [--timeout SEC] [--rules FILE] [--retries N
 * [--retry-delay SEC]], also spelled
 * molt update --shadow: a shadowed full update -- a forked follower
 * performs the update and replays the leader's calls while the process
 * serves on in the old version (docs/design.md §17).  `molt status` shows
 * how it goes.  A rule file is parsed here first, so that a bad one is
 * refused with file:line:col before anything starts; the process parses
 * the text again. */
#include "cli/cli.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* Reads and checks the rule file into req.  0 or an exit code (printed). */
static int read_rules(const char *what, const char *path, molt__request *req) {
  int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC | O_NOCTTY);
  if (fd < 0)
    return cli_fail(EXIT_USAGE, "%s: rule file %s: %s", what, path, strerror(errno));
  struct stat st;
  if (fstat(fd, &st) < 0 || !S_ISREG(st.st_mode)) {
    close(fd);
    return cli_fail(EXIT_USAGE, "%s: rule file %s: not a regular file", what, path);
  }
  /* One byte more than the bound, to tell a file that is too long. */
  char *text = cli_xmalloc(MOLT__RULES_MAX_TEXT + 1);
  size_t n = 0;
  ssize_t r;
  while (n < MOLT__RULES_MAX_TEXT + 1 &&
         (r = read(fd, text + n, MOLT__RULES_MAX_TEXT + 1 - n)) != 0) {
    if (r < 0 && errno == EINTR)
      continue;
    if (r < 0) {
      int e = errno;
      close(fd);
      free(text);
      return cli_fail(EXIT_USAGE, "%s: rule file %s: %s", what, path, strerror(e));
    }
    n += (size_t)r;
  }
  close(fd);
  molt__rules *rules = cli_xmalloc(sizeof *rules);
  char err[512];
  int rc = molt__rules_parse(path, text, n, rules, err, sizeof err);
  free(rules);
  if (rc < 0) {
    free(text);
    return cli_fail(EXIT_USAGE, "%s: %s", what, err);
  }
  memcpy(req->rules, text, n);
  req->rules_len = n;
  snprintf(req->rules_name, sizeof req->rules_name, "%s", path);
  free(text);
  return 0;
}

int cli_cmd_shadow(const cli_args *a) {
  char what[PATH_MAX + 64];
  snprintf(what, sizeof what, "shadowed update of %ld to %s", (long)a->pid, a->pos[1]);
  molt__request *req = cli_xmalloc(sizeof *req);
  memset(req, 0, sizeof *req);
  req->op = MOLT__OP_SHADOW;
  req->retries = a->retries > 0 ? a->retries : 0;
  req->retry_delay_ms = a->retry_delay_ms; /* -1: the runtime's default */
  int code = a->rules ? read_rules(what, a->rules, req) : 0;
  if (code != 0) {
    free(req);
    return code;
  }
  code = cli_change_with_file(a, what, req, "program image",
                              "moltcc --molt-program --molt-from <running image>",
                              "shadowed update of %1$ld to %2$s started");
  free(req);
  return code;
}
