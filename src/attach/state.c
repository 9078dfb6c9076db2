/* Where the state of an attached process lives, so that a later `molt`
 * sees it: a record under /run/molt/attach/<pid> (a directory only root
 * and the owner write; $MOLT_ATTACH_DIR overrides it for tests), and the
 * same text in the last page of the staged mapping in the target, which
 * goes with the process (and names it in /proc/PID/maps as
 * memfd:molt-attach).  The record carries the target's start time: a
 * record of an earlier process with the same pid is stale.  Each patch
 * of a process's stack has its own (levels.c): <pid> for the first,
 * <pid>.<level> for those stacked on it.
 *
 * The text: one "key<TAB>value" per line, and per function
 * "func<TAB>name<TAB>addr<TAB>at<TAB>len<TAB>orig<TAB>jump<TAB>new" (hex). */
#include "attach/internal.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/file.h>
#include <unistd.h>

#define STATE_MAGIC "molt-attach-state 1"

static const char *state_dir(void) {
  const char *d = getenv("MOLT_ATTACH_DIR");
  return d && *d ? d : "/run/molt/attach";
}

void molt__state_path(pid_t pid, char *path, size_t len) {
  snprintf(path, len, "%s/%d", state_dir(), (int)pid);
}

void molt__state_level_path(pid_t pid, int level, char *path, size_t len) {
  if (level <= 1)
    molt__state_path(pid, path, len);
  else
    snprintf(path, len, "%s/%d.%d", state_dir(), (int)pid, level);
}

const char *molt__state_dir(void) { return state_dir(); }

static void hex(molt__buf *b, const uint8_t *p, unsigned n) {
  for (unsigned i = 0; i < n; i++)
    molt__buf_printf(b, "%02x", p[i]);
}

static bool unhex(const char *s, uint8_t *out, unsigned n) {
  if (strlen(s) != 2 * (size_t)n)
    return false;
  for (unsigned i = 0; i < n; i++) {
    unsigned v;
    if (sscanf(s + 2 * i, "%2x", &v) != 1)
      return false;
    out[i] = (uint8_t)v;
  }
  return true;
}

void molt__state_format(const molt__attach_state *st, molt__buf *b) {
  molt__buf_printf(b, STATE_MAGIC "\n");
  molt__buf_pair(b, "phase", st->phase);
  molt__buf_printf(b, "level\t%d\n", st->level);
  molt__buf_printf(b, "start_time\t%llu\n", st->start_time);
  molt__buf_pair(b, "build_id", st->build_id);
  molt__buf_pair(b, "patch", st->patch);
  molt__buf_printf(b, "code\t%" PRIx64 "\t%" PRIx64 "\n", st->code_start, st->code_end);
  molt__buf_printf(b, "stop_ms\t%.3f\n", st->stop_ms);
  molt__buf_printf(b, "threads\t%d\n", st->threads);
  molt__buf_printf(b, "attempts\t%d\n", st->attempts);
  molt__buf_printf(b, "stepped\t%d\n", st->stepped);
  molt__buf_printf(b, "time\t%lld\n", st->time);
  molt__buf_pair(b, "note", st->note);
  molt__buf_pair(b, "callbacks", st->callbacks);
  for (size_t i = 0; i < st->nfuncs; i++) {
    const molt__attach_func *f = &st->funcs[i];
    molt__buf_printf(b, "func\t%s\t%" PRIx64 "\t%" PRIx64 "\t%u\t", f->name, f->addr,
                     f->at, f->len);
    hex(b, f->orig, f->len);
    molt__buf_printf(b, "\t");
    hex(b, f->jump, f->len);
    molt__buf_printf(b, "\t%" PRIx64 "\n", f->new_addr);
  }
}

int molt__state_parse(const char *text, molt__attach_state *st) {
  memset(st, 0, sizeof *st);
  if (strncmp(text, STATE_MAGIC "\n", strlen(STATE_MAGIC) + 1) != 0)
    return MOLT_ECORRUPT;
  const char *p = text + strlen(STATE_MAGIC) + 1;
  while (*p) {
    size_t n = strcspn(p, "\n");
    char line[8192];
    if (n >= sizeof line)
      return MOLT_ECORRUPT;
    memcpy(line, p, n);
    line[n] = '\0';
    p += n + (p[n] == '\n');
    char *tab = strchr(line, '\t');
    if (!tab)
      continue;
    *tab = '\0';
    const char *k = line, *v = tab + 1;
    if (strcmp(k, "phase") == 0)
      snprintf(st->phase, sizeof st->phase, "%s", v);
    else if (strcmp(k, "level") == 0)
      st->level = atoi(v);
    else if (strcmp(k, "callbacks") == 0)
      snprintf(st->callbacks, sizeof st->callbacks, "%s", v);
    else if (strcmp(k, "start_time") == 0)
      st->start_time = strtoull(v, NULL, 10);
    else if (strcmp(k, "build_id") == 0)
      snprintf(st->build_id, sizeof st->build_id, "%s", v);
    else if (strcmp(k, "patch") == 0)
      snprintf(st->patch, sizeof st->patch, "%s", v);
    else if (strcmp(k, "code") == 0) {
      if (sscanf(v, "%" SCNx64 "\t%" SCNx64, &st->code_start, &st->code_end) != 2)
        return MOLT_ECORRUPT;
    } else if (strcmp(k, "stop_ms") == 0)
      st->stop_ms = strtod(v, NULL);
    else if (strcmp(k, "threads") == 0)
      st->threads = atoi(v);
    else if (strcmp(k, "attempts") == 0)
      st->attempts = atoi(v);
    else if (strcmp(k, "stepped") == 0)
      st->stepped = atoi(v);
    else if (strcmp(k, "time") == 0)
      st->time = strtoll(v, NULL, 10);
    else if (strcmp(k, "note") == 0)
      snprintf(st->note, sizeof st->note, "%s", v);
    else if (strcmp(k, "func") == 0) {
      if (st->nfuncs == MOLT__ATTACH_MAX_FUNCS)
        return MOLT_ECORRUPT;
      molt__attach_func *f = &st->funcs[st->nfuncs];
      char name[128], orig[64], jump[64];
      if (sscanf(v,
                 "%127[^\t]\t%" SCNx64 "\t%" SCNx64
                 "\t%u\t%63[0-9a-f]\t%63[0-9a-f]\t%" SCNx64,
                 name, &f->addr, &f->at, &f->len, orig, jump, &f->new_addr) != 7 ||
          f->len == 0 || f->len > MOLT__ATTACH_MAX_BYTES ||
          !unhex(orig, f->orig, f->len) || !unhex(jump, f->jump, f->len))
        return MOLT_ECORRUPT;
      snprintf(f->name, sizeof f->name, "%s", name);
      st->nfuncs++;
    }
  }
  if (st->level == 0)
    st->level = 1; /* a record written before patches stacked */
  return st->phase[0] && st->start_time && st->level >= 1 &&
                 st->level <= MOLT__ATTACH_MAX_LEVELS
             ? 0
             : MOLT_ECORRUPT;
}

static int mkdirs(const char *dir) {
  char tmp[512];
  snprintf(tmp, sizeof tmp, "%s", dir);
  for (char *p = tmp + 1; *p; p++) {
    if (*p != '/')
      continue;
    *p = '\0';
    if (mkdir(tmp, 0755) != 0 && errno != EEXIST)
      return -1;
    *p = '/';
  }
  return mkdir(tmp, 0700) != 0 && errno != EEXIST ? -1 : 0;
}

int molt__state_lock(pid_t pid, char *err, size_t errlen) {
  char path[600];
  snprintf(path, sizeof path, "%s/%d.lock", state_dir(), (int)pid);
  int fd = -1;
  if (mkdirs(state_dir()) == 0)
    fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600);
  if (fd < 0) {
    molt__errmsg(err, errlen, "cannot open %s: %s", path, strerror(errno));
    return MOLT_EIO;
  }
  /* Held until this molt exits or is done; the kernel drops it with the
   * descriptor, so a killed molt never leaves it taken. */
  if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
    int e = errno;
    close(fd);
    if (e == EWOULDBLOCK) {
      molt__errmsg(err, errlen,
                   "another molt is attaching to or rolling back process %d; wait for "
                   "it to finish",
                   (int)pid);
      return MOLT_EBUSY;
    }
    molt__errmsg(err, errlen, "cannot lock %s: %s", path, strerror(e));
    return MOLT_EIO;
  }
  return fd;
}

int molt__state_save(pid_t pid, const molt__attach_state *st, uint64_t page, char *err,
                     size_t errlen) {
  molt__buf b;
  molt__buf_init(&b);
  molt__state_format(st, &b);
  if (b.oom) {
    molt__buf_free(&b);
    return MOLT_ENOMEM;
  }
  int rc = 0;
  if (b.len >= ATTACH_STATE_SIZE) {
    molt__buf_free(&b);
    molt__errmsg(err, errlen, "the attach record does not fit its %u bytes",
                 ATTACH_STATE_SIZE);
    return MOLT_EINTERNAL;
  }
  /* The state pages first: they go with the process.  The text and its
   * terminating zero (what follows a zero is never read). */
  if (page)
    rc = molt__os_write(pid, page, b.data, b.len + 1);
  char path[512], tmp[600];
  molt__state_level_path(pid, st->level, path, sizeof path);
  snprintf(tmp, sizeof tmp, "%s.tmp", path);
  int fd = -1;
  if (mkdirs(state_dir()) == 0)
    fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  bool ok = fd >= 0 && write(fd, b.data, b.len) == (ssize_t)b.len;
  if (fd >= 0)
    ok = close(fd) == 0 && ok;
  ok = ok && rename(tmp, path) == 0;
  if (!ok) {
    unlink(tmp);
    molt__errmsg(err, errlen, "cannot write the attach record %s: %s", path,
                 strerror(errno));
    rc = MOLT_EIO;
  } else if (rc) {
    molt__errmsg(err, errlen, "cannot write the state page in process %d", (int)pid);
  }
  molt__buf_free(&b);
  return rc;
}

void molt__state_remove(pid_t pid, int level) {
  char path[512];
  molt__state_level_path(pid, level, path, sizeof path);
  unlink(path);
}

int molt__state_from_page(pid_t pid, const attach_map *m, molt__attach_state *st) {
  if (!strstr(m->path, "molt-attach") || !m->w)
    return MOLT_ENOHISTORY;
  if (m->end - m->start < ATTACH_STATE_SIZE)
    return MOLT_ENOHISTORY;
  char *page = malloc(ATTACH_STATE_SIZE + 1);
  if (!page)
    return MOLT_ENOMEM;
  int rc = molt__os_read(pid, m->end - ATTACH_STATE_SIZE, page, ATTACH_STATE_SIZE);
  if (rc == 0) {
    page[ATTACH_STATE_SIZE] = '\0';
    rc = molt__state_parse(page, st);
  } else {
    rc = MOLT_EIO;
  }
  free(page);
  return rc;
}

int molt__state_load_level(pid_t pid, int level, molt__attach_state *st, char *err,
                           size_t errlen) {
  char path[512];
  molt__state_level_path(pid, level, path, sizeof path);
  char *text = NULL;
  FILE *f = fopen(path, "re");
  if (f) {
    text = calloc(1, ATTACH_STATE_SIZE + 1);
    if (!text) {
      fclose(f);
      return MOLT_ENOMEM;
    }
    size_t n = fread(text, 1, ATTACH_STATE_SIZE, f);
    text[n] = '\0';
    fclose(f);
  }
  unsigned long long now = molt__os_start_time(pid);
  int rc = text ? molt__state_parse(text, st) : MOLT_ENOHISTORY;
  free(text);
  if (rc == 0 && st->level != level)
    rc = MOLT_ECORRUPT;
  if (rc == 0 && st->start_time != now) {
    /* an earlier process had this pid */
    unlink(path);
    rc = MOLT_ENOHISTORY;
  }
  if (rc == MOLT_ENOHISTORY) {
    /* No record (e.g. /run was cleared): the state page, if the process
     * has one. */
    attach_map *maps = NULL;
    size_t n = 0;
    if (now && molt__os_maps(pid, &maps, &n) == 0) {
      for (size_t i = 0; i < n; i++) {
        if (molt__state_from_page(pid, &maps[i], st) == 0 && st->start_time == now &&
            st->level == level) {
          rc = 0;
          break;
        }
      }
      free(maps);
    }
  }
  if (rc == MOLT_ECORRUPT)
    molt__errmsg(err, errlen, "the attach record %s is corrupt", path);
  else if (rc == MOLT_ENOHISTORY)
    molt__errmsg(err, errlen, "process %d has no patch attached by molt", (int)pid);
  return rc;
}
