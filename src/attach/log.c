/* The log of an attached process: every attach, rollback, refusal,
 * interruption and reclamation molt carried out on it, kept beside its
 * record (<dir>/<pid>.log, the directory of state.c) so that any later
 * `molt log PID` shows it -- also after a rollback removed the record.
 *
 * One entry per line, tab-separated (tabs and line ends in a field become
 * spaces): seq, time (Unix), event, patch, functions (comma-separated),
 * stop in ms, threads stopped, message.  The first line carries the
 * target's start time: a log of an earlier process with the same pid is
 * stale, ignored by a reader and started afresh by the next writer.
 * Entries are appended by attach and rollback while they hold the
 * process's lock, so sequence numbers never repeat. */
#include "attach/internal.h"

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define LOG_MAGIC "molt-attach-log 1"

static void log_path(pid_t pid, char *path, size_t len) {
  char rec[512];
  molt__state_path(pid, rec, sizeof rec);
  snprintf(path, len, "%s.log", rec);
}

/* The log's entries if it belongs to the process running now. */
static int read_log(pid_t pid, char **text) {
  char path[600];
  log_path(pid, path, sizeof path);
  FILE *f = fopen(path, "re");
  if (!f)
    return MOLT_ENOHISTORY;
  molt__buf b;
  molt__buf_init(&b);
  char chunk[4096];
  size_t n;
  while ((n = fread(chunk, 1, sizeof chunk, f)) > 0)
    molt__buf_add(&b, chunk, n);
  fclose(f);
  molt__buf_add(&b, "", 1);
  unsigned long long start = 0;
  if (b.oom || sscanf(b.data, LOG_MAGIC "\t%llu", &start) != 1 || !start ||
      start != molt__os_start_time(pid)) {
    molt__buf_free(&b);
    return MOLT_ENOHISTORY;
  }
  *text = b.data;
  return 0;
}

static void field(molt__buf *b, const char *s) {
  molt__buf_printf(b, "\t");
  for (; *s; s++)
    molt__buf_printf(b, "%c", *s == '\t' || *s == '\n' || *s == '\r' ? ' ' : *s);
}

void molt__log_append(pid_t pid, const char *event, const molt__attach_state *st,
                      const char *message) {
  unsigned long long start = molt__os_start_time(pid);
  if (!start)
    return; /* the process is gone */
  char *old = NULL;
  unsigned long seq = 1;
  if (read_log(pid, &old) == 0) {
    for (const char *p = old; (p = strchr(p, '\n')) != NULL;)
      if (*++p)
        seq++;
  }
  char path[600];
  log_path(pid, path, sizeof path);
  molt__buf b;
  molt__buf_init(&b);
  if (!old)
    molt__buf_printf(&b, LOG_MAGIC "\t%llu\n", start);
  free(old);
  molt__buf_printf(&b, "%lu\t%lld", seq, (long long)time(NULL));
  field(&b, event);
  field(&b, st->patch);
  molt__buf_printf(&b, "\t");
  for (size_t i = 0; i < st->nfuncs; i++)
    molt__buf_printf(&b, "%s%s", i ? "," : "", st->funcs[i].name);
  molt__buf_printf(&b, "\t%.3f\t%d", st->stop_ms, st->threads);
  field(&b, message ? message : "");
  molt__buf_printf(&b, "\n");
  /* a stale log (another process had this pid) is started afresh */
  int fd = open(
      path, O_WRONLY | O_CREAT | O_CLOEXEC | O_NOFOLLOW | (seq == 1 ? O_TRUNC : O_APPEND),
      0600);
  if (fd >= 0 && !b.oom) {
    ssize_t w = write(fd, b.data, b.len);
    (void)w; /* the log is a report: a full disk must not fail the operation */
  }
  if (fd >= 0)
    close(fd);
  molt__buf_free(&b);
}

int molt__attach_log_read(pid_t pid, molt__attach_event **out, size_t *n) {
  *out = NULL;
  *n = 0;
  char *text;
  int rc = read_log(pid, &text);
  if (rc)
    return rc;
  size_t cap = 0;
  char *save = NULL;
  strtok_r(text, "\n", &save); /* the header */
  for (char *line; (line = strtok_r(NULL, "\n", &save)) != NULL;) {
    char *f[8];
    size_t k = 0;
    for (char *p = line; k < 8; k++) {
      f[k] = p;
      p = strchr(p, '\t');
      if (!p) {
        k++;
        break;
      }
      *p++ = '\0';
    }
    if (k != 8)
      continue; /* a line cut by a crash */
    if (*n == cap) {
      cap = cap ? cap * 2 : 16;
      molt__attach_event *ne = realloc(*out, cap * sizeof *ne);
      if (!ne) {
        free(text);
        return MOLT_ENOMEM;
      }
      *out = ne;
    }
    molt__attach_event *e = &(*out)[(*n)++];
    memset(e, 0, sizeof *e);
    e->seq = strtoul(f[0], NULL, 10);
    e->time = strtoll(f[1], NULL, 10);
    snprintf(e->event, sizeof e->event, "%s", f[2]);
    snprintf(e->patch, sizeof e->patch, "%s", f[3]);
    snprintf(e->functions, sizeof e->functions, "%s", f[4]);
    e->stop_ms = strtod(f[5], NULL);
    e->threads = atoi(f[6]);
    snprintf(e->message, sizeof e->message, "%s", f[7]);
  }
  free(text);
  return 0;
}
