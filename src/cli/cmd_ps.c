/* molt ps: the molt processes of this machine (their control sockets in
 * /proc/net/unix), with the generation and state of those the caller may
 * ask. */
#include "cli/cli.h"

#include <errno.h>
#include <pwd.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static int cmp_pid(const void *a, const void *b) {
  pid_t x = *(const pid_t *)a, y = *(const pid_t *)b;
  return (x > y) - (x < y);
}

/* Collects the pids of "@molt.<pid>[.<random>]" sockets in /proc/net/unix (which shows
 * an abstract name with '@' for its leading NUL).  Sorted, deduplicated
 * (accepted connections show the listener's name too). */
static int find_molt_pids(pid_t **out, size_t *n) {
  *out = NULL;
  *n = 0;
  FILE *f = fopen("/proc/net/unix", "re");
  if (f == NULL)
    return -errno;
  char line[1024];
  size_t cap = 0;
  bool first = true;
  while (fgets(line, sizeof line, f) != NULL) {
    if (first) { /* header */
      first = false;
      continue;
    }
    /* Num RefCount Protocol Flags Type St Inode Path */
    char *save = NULL, *tok = strtok_r(line, " \t\n", &save);
    for (int i = 0; tok != NULL && i < 7; i++)
      tok = strtok_r(NULL, " \t\n", &save);
    static const char prefix[] = "@" MOLT__PROTO_NAME_PREFIX;
    if (tok == NULL || strncmp(tok, prefix, sizeof prefix - 1) != 0)
      continue;
    /* "molt.<pid>", or a fallback name "molt.<pid>.<random>" taken when
     * another socket held the first (docs/protocol.md). */
    char *num = tok + sizeof prefix - 1, *dot = strchr(num, '.');
    if (dot != NULL)
      *dot = '\0';
    pid_t pid;
    if (!cli_parse_pid(num, &pid))
      continue;
    if (*n == cap) {
      cap = cap ? 2 * cap : 16;
      *out = cli_xrealloc(*out, cap * sizeof **out);
    }
    (*out)[(*n)++] = pid;
  }
  fclose(f);
  if (*n > 0) {
    qsort(*out, *n, sizeof **out, cmp_pid);
    size_t w = 1;
    for (size_t r = 1; r < *n; r++)
      if ((*out)[r] != (*out)[w - 1])
        (*out)[w++] = (*out)[r];
    *n = w;
  }
  return 0;
}

int cli_cmd_ps(const cli_args *a) {
  (void)a;
  pid_t *pids;
  size_t n;
  int e = find_molt_pids(&pids, &n);
  if (e < 0)
    return cli_fail(EXIT_CONNECT,
                    "ps: cannot read /proc/net/unix: %s; molt ps needs /proc "
                    "mounted",
                    strerror(-e));
  cli_table t;
  cli_table_init(&t, 5,
                 (const char *const[]){"PID", "USER", "COMMAND", "GENERATION", "STATE"});
  uid_t me = geteuid();
  for (size_t i = 0; i < n; i++) {
    pid_t pid = pids[i];
    char path[64], pidbuf[16], user[64], comm[64], gen[32], state[32];
    struct stat st;
    snprintf(path, sizeof path, "/proc/%ld", (long)pid);
    if (stat(path, &st) < 0)
      continue; /* exited since we read the socket table */
    snprintf(pidbuf, sizeof pidbuf, "%ld", (long)pid);
    struct passwd pw, *pwp = NULL;
    char pwbuf[1024];
    if (getpwuid_r(st.st_uid, &pw, pwbuf, sizeof pwbuf, &pwp) == 0 && pwp != NULL)
      snprintf(user, sizeof user, "%s", pw.pw_name);
    else
      snprintf(user, sizeof user, "%u", (unsigned)st.st_uid);
    cli_comm(pid, comm, sizeof comm);
    snprintf(gen, sizeof gen, "-");
    snprintf(state, sizeof state, "-");
    /* /proc/<pid> belongs to the process's effective uid.  Do not knock on
     * the doors of other users' processes: it would only be refused and
     * fill their logs with refusals. */
    if (me == 0 || st.st_uid == me) {
      cli_reply r;
      char err[512];
      int rc = cli_call(pid, MOLT__OP_STATUS, NULL, PS_TIMEOUT_MS, &r, err, sizeof err);
      if (rc == 0 && r.status == 0) {
        const molt__record *g = molt__tsv_find(&r.recs, "generation");
        const molt__record *s = molt__tsv_find(&r.recs, "state");
        snprintf(gen, sizeof gen, "%s", g != NULL ? cli_field_of(g, 1) : "?");
        snprintf(state, sizeof state, "%s", s != NULL ? cli_field_of(s, 1) : "?");
      } else if (rc == 0 && r.status != MOLT_EPERM) {
        snprintf(state, sizeof state, "error");
      } else if (rc == MOLT_ETIMEDOUT) {
        snprintf(state, sizeof state, "busy");
      } else if (rc == MOLT_ECONNECT && strstr(err, "refusing") != NULL) {
        snprintf(state, sizeof state, "impostor");
      } else if (rc == MOLT_EPROTO || rc == MOLT_EVERSION) {
        snprintf(state, sizeof state, "incompatible");
      } else if (rc != 0) {
        snprintf(state, sizeof state, "gone");
      }
      if (rc == 0)
        cli_reply_free(&r);
    }
    cli_table_add(&t, (const char *const[]){pidbuf, user, comm, gen, state});
  }
  cli_table_print(&t, "");
  free(pids);
  return EXIT_OK;
}
