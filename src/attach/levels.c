/* Patches stacked on one attached process (issue 13 item 4).
 *
 * Every patch attached to a process is one level of its stack: level 1 is
 * the first, each later attach goes on top.  A level has its own staged
 * mapping, its own state page and its own record (<dir>/<pid> for level
 * 1, <dir>/<pid>.<level> above), in the format of state.c.
 *
 * One level of indirection: a function's entry always holds one jump,
 * straight to its newest version.  A patch that replaces a function a
 * patch below replaced already rewrites that patch's jump (the same site:
 * the same bytes at the same address) and records it as "the bytes
 * before", so popping it writes back exactly the jump of the patch below;
 * popping the last one writes back the original bytes.  Calls never go
 * through the code of an older patch, which therefore can be unmapped as
 * soon as no thread runs it, whatever is stacked on top of it.
 *
 * A popped level whose code a thread may still run stays in the stack,
 * "rolled-back", until a later rollback or attach finds it unused
 * (attach.c reclaims it); it is never reapplied.  Only the newest applied
 * level can be popped. */
#include "attach/internal.h"

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

bool molt__levels_active(const molt__attach_state *st) {
  return strcmp(st->phase, "rolled-back") != 0;
}

/* The levels of pid found in the records' directory and in the state
 * pages of its staged mappings, each once: a bit per level. */
static uint32_t levels_present(pid_t pid) {
  uint32_t mask = 0;
  char self[32];
  snprintf(self, sizeof self, "%d", (int)pid);
  size_t selflen = strlen(self);
  DIR *d = opendir(molt__state_dir());
  struct dirent *e;
  while (d && (e = readdir(d))) {
    if (strncmp(e->d_name, self, selflen) != 0)
      continue;
    const char *rest = e->d_name + selflen;
    int level = 0;
    if (*rest == '\0') {
      level = 1;
    } else if (rest[0] == '.' && rest[1] >= '1' && rest[1] <= '9') {
      char *end;
      long v = strtol(rest + 1, &end, 10);
      level = *end == '\0' && v >= 2 && v <= MOLT__ATTACH_MAX_LEVELS ? (int)v : 0;
    }
    if (level)
      mask |= 1u << (level - 1);
  }
  if (d)
    closedir(d);
  /* A level without a record (/run was cleared): its state page says. */
  attach_map *maps = NULL;
  size_t n = 0;
  unsigned long long now = molt__os_start_time(pid);
  if (now && molt__os_maps(pid, &maps, &n) == 0) {
    for (size_t i = 0; i < n; i++) {
      molt__attach_state st;
      if (molt__state_from_page(pid, &maps[i], &st) == 0 && st.start_time == now)
        mask |= 1u << (st.level - 1);
    }
    free(maps);
  }
  return mask;
}

int molt__attach_stack_load(pid_t pid, molt__attach_stack *s, char *err, size_t errlen) {
  memset(s, 0, sizeof *s);
  uint32_t mask = levels_present(pid);
  int rc = 0;
  for (int level = 1; level <= MOLT__ATTACH_MAX_LEVELS && rc == 0; level++) {
    if (!(mask & (1u << (level - 1))))
      continue;
    if (!s->levels) {
      s->levels = calloc(MOLT__ATTACH_MAX_LEVELS, sizeof *s->levels);
      if (!s->levels)
        return MOLT_ENOMEM;
    }
    rc = molt__state_load_level(pid, level, &s->levels[s->n], err, errlen);
    if (rc == 0)
      s->n++;
    else if (rc == MOLT_ENOHISTORY)
      rc = 0; /* stale: a record of an earlier process with this pid */
  }
  if (rc == 0 && s->n == 0) {
    molt__errmsg(err, errlen, "process %d has no patch attached by molt", (int)pid);
    rc = MOLT_ENOHISTORY;
  }
  if (rc)
    molt__attach_stack_free(s);
  return rc;
}

void molt__attach_stack_free(molt__attach_stack *s) {
  free(s->levels);
  memset(s, 0, sizeof *s);
}

int molt__attach_state_load(pid_t pid, molt__attach_state *st, char *err, size_t errlen) {
  molt__attach_stack s;
  int rc = molt__attach_stack_load(pid, &s, err, errlen);
  if (rc)
    return rc;
  const molt__attach_state *top = &s.levels[s.n - 1];
  for (size_t i = s.n; i-- > 0;) {
    if (molt__levels_active(&s.levels[i])) {
      top = &s.levels[i];
      break;
    }
  }
  *st = *top;
  molt__attach_stack_free(&s);
  return 0;
}

int molt__levels_next(pid_t pid, const molt__attach_stack *s, int *level, char *err,
                      size_t errlen) {
  *level = 1;
  for (size_t i = 0; i < s->n; i++) {
    const molt__attach_state *st = &s->levels[i];
    if (st->level >= *level)
      *level = st->level + 1;
    if (molt__levels_active(st) && strcmp(st->phase, "applied") != 0) {
      molt__errmsg(err, errlen,
                   "process %d has an unfinished attach (%s, %s); roll it back first "
                   "(molt rollback %d)",
                   (int)pid, st->patch, st->phase, (int)pid);
      return MOLT_EBUSY;
    }
  }
  if (*level > MOLT__ATTACH_MAX_LEVELS) {
    molt__errmsg(err, errlen,
                 "process %d has %d patches stacked (or kept mapped), the most molt "
                 "attach stacks; roll one back first",
                 (int)pid, MOLT__ATTACH_MAX_LEVELS);
    return MOLT_EBUSY;
  }
  return 0;
}

int molt__levels_inherit(pid_t pid, const molt__attach_stack *s, molt__attach_func *f,
                         char *err, size_t errlen) {
  /* The newest applied level that replaced it: its jump is what the entry
   * holds now. */
  for (size_t i = s->n; i-- > 0;) {
    const molt__attach_state *st = &s->levels[i];
    if (!molt__levels_active(st))
      continue;
    for (size_t k = 0; k < st->nfuncs; k++) {
      const molt__attach_func *below = &st->funcs[k];
      /* by address when the patch says where (two statics of one name
       * in two files are two functions), else by name */
      if (f->addr ? below->addr != f->addr : strcmp(below->name, f->name) != 0)
        continue;
      uint8_t now[MOLT__ATTACH_MAX_BYTES];
      if (molt__os_read(pid, below->at, now, below->len) != 0 ||
          memcmp(now, below->jump, below->len) != 0) {
        molt__errmsg(err, errlen,
                     "the entry of '%s' does not hold the jump of the patch below "
                     "(%s); not touched",
                     f->name, st->patch);
        return MOLT_EIO;
      }
      f->addr = below->addr;
      f->at = below->at;
      f->len = below->len;
      memcpy(f->orig, below->jump, below->len);
      return 1;
    }
  }
  return 0;
}

void molt__attach_stack_func_state(pid_t pid, const molt__attach_stack *s, size_t i,
                                   const molt__attach_func *f, char *buf, size_t len) {
  uint8_t now[MOLT__ATTACH_MAX_BYTES];
  if (molt__os_read(pid, f->at, now, f->len) != 0) {
    snprintf(buf, len, "unreadable");
    return;
  }
  if (memcmp(now, f->jump, f->len) == 0) {
    snprintf(buf, len, "patched");
    return;
  }
  for (size_t k = i + 1; k < s->n; k++) {
    const molt__attach_state *up = &s->levels[k];
    for (size_t j = 0; j < up->nfuncs; j++) {
      if (up->funcs[j].at == f->at && up->funcs[j].len == f->len &&
          memcmp(now, up->funcs[j].jump, f->len) == 0) {
        snprintf(buf, len, "replaced by %d", up->level);
        return;
      }
    }
  }
  snprintf(buf, len, "%s", memcmp(now, f->orig, f->len) == 0 ? "original" : "changed");
}
