/* molt attach --all PROGRAM patch.so (issue 13 item 7): every running
 * process of one program -- a master and its workers -- patched, all or
 * nothing.
 *
 * The processes are those whose executable has PROGRAM's build-id (a
 * program file replaced on disk since they started is still matched by
 * what they run, and another program's process is never touched even at
 * the same path).  A process whose executable molt may not read (another
 * user's, for a caller who is not root: its exe link is hidden too) but
 * whose name (/proc/PID/comm, readable by all) is PROGRAM's file name is
 * counted in: it may be one, and it cannot be patched, so the whole
 * attach fails, naming it -- a master and its workers patched except one
 * would serve two versions.  (Another user's process of another program
 * with the same name fails the run too; root sees every executable.)
 *
 * They are attached one after the other, in pid order (a master before
 * the workers it forked), each with the steps and checks of a single
 * attach (attach.c) and its stack (levels.c).  The first failure stops the
 * run: each process patched before it is rolled back (its new patch
 * popped, newest first), the later ones are never touched. */
#include "attach/internal.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static int build_id_of(const char *path, char *hex, size_t len, char *err,
                       size_t errlen) {
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    molt__errmsg(err, errlen, "cannot open %s: %s", path, strerror(errno));
    return errno == ENOENT ? MOLT_ENOENT : errno == EACCES ? MOLT_EPERM : MOLT_EIO;
  }
  int rc = molt__elf_file_build_id(fd, hex, len, err, errlen);
  close(fd);
  return rc;
}

/* Whether pid's name (its comm, at most 15 characters) is that of the
 * file `path`. */
static bool named_like(long pid, const char *path) {
  char p[64], comm[32] = "";
  snprintf(p, sizeof p, "/proc/%ld/comm", pid);
  int fd = open(p, O_RDONLY | O_CLOEXEC);
  if (fd < 0)
    return false;
  ssize_t k = read(fd, comm, sizeof comm - 1);
  close(fd);
  comm[k > 0 ? k : 0] = '\0';
  comm[strcspn(comm, "\n")] = '\0';
  const char *base = strrchr(path, '/');
  base = base ? base + 1 : path;
  return comm[0] && strncmp(comm, base, 15) == 0 && strlen(comm) == strnlen(base, 15);
}

/* Whether pid is gone or on its way out: no /proc entry, or a zombie
 * (Z), dead (X) or exiting with its threads gone (/proc/PID/stat's state).
 * Such a process is not one to patch: it was listed, or ptrace refused it
 * with "no process", only because its exit was not over yet. */
static bool exiting(long pid) {
  char p[64], buf[512];
  snprintf(p, sizeof p, "/proc/%ld/stat", pid);
  int fd = open(p, O_RDONLY | O_CLOEXEC);
  if (fd < 0)
    return true;
  ssize_t k = read(fd, buf, sizeof buf - 1);
  close(fd);
  if (k <= 0)
    return true;
  buf[k] = '\0';
  const char *paren = strrchr(buf, ')'); /* the name may hold spaces and ')' */
  char state = paren && paren[1] == ' ' ? paren[2] : '?';
  return state == 'Z' || state == 'X' || state == 'x';
}

static int by_pid(const void *a, const void *b) {
  const molt__attach_one *x = a, *y = b;
  return (x->pid > y->pid) - (x->pid < y->pid);
}

/* The processes running the program whose build-id is `want` (or, not
 * readable by us, whose executable's path, else name, is `path`'s). */
static int find_processes(const char *want, const char *path, molt__attach_one **out,
                          size_t *n, char *err, size_t errlen) {
  DIR *d = opendir("/proc");
  if (!d) {
    molt__errmsg(err, errlen, "cannot read /proc: %s", strerror(errno));
    return MOLT_EIO;
  }
  molt__attach_one *v = NULL;
  size_t cnt = 0, cap = 0;
  struct dirent *e;
  int rc = 0;
  while (rc == 0 && (e = readdir(d))) {
    char *end;
    long pid = strtol(e->d_name, &end, 10);
    if (*end != '\0' || pid <= 0 || pid == (long)getpid())
      continue;
    char exe[64], link[PATH_MAX], hex[81], ignored[256];
    snprintf(exe, sizeof exe, "/proc/%ld/exe", pid);
    ssize_t k = readlink(exe, link, sizeof link - 1);
    link[k > 0 ? k : 0] = '\0';
    int brc = build_id_of(exe, hex, sizeof hex, ignored, sizeof ignored);
    bool match = brc == 0            ? strcmp(hex, want) == 0
                 : brc != MOLT_EPERM ? false
                 : k > 0             ? strcmp(link, path) == 0
                                     : named_like(pid, path);
    if (!match || exiting(pid))
      continue; /* another program, a kernel thread, a process gone or going */
    if (cnt == cap) {
      cap = cap ? 2 * cap : 16;
      molt__attach_one *nv = realloc(v, cap * sizeof *v);
      if (!nv) {
        rc = MOLT_ENOMEM;
        break;
      }
      v = nv;
    }
    memset(&v[cnt], 0, sizeof v[cnt]);
    v[cnt].pid = (pid_t)pid;
    v[cnt].outcome = MOLT__ATTACH_NOT_TRIED;
    cnt++;
  }
  closedir(d);
  if (rc) {
    free(v);
    return rc;
  }
  if (cnt > 1) /* v is NULL when none was found */
    qsort(v, cnt, sizeof *v, by_pid);
  *out = v;
  *n = cnt;
  return 0;
}

int molt__attach_all(const char *program, const molt__attach_opts *o,
                     molt__attach_one **out, size_t *n, char *err, size_t errlen) {
  *out = NULL;
  *n = 0;
  char path[PATH_MAX], want[81];
  if (!realpath(program, path)) {
    molt__errmsg(err, errlen, "cannot find the program %s: %s", program, strerror(errno));
    return MOLT_ENOENT;
  }
  char why[256];
  int rc = build_id_of(path, want, sizeof want, why, sizeof why);
  if (rc == MOLT_ENOSYM)
    molt__errmsg(err, errlen,
                 "%s has no build-id (link it with -Wl,--build-id); attach --all "
                 "matches processes by it",
                 path);
  else if (rc)
    molt__errmsg(err, errlen, "%s", why);
  if (rc)
    return rc;
  /* The patch is for that program: said once, before any process. */
  attach_patch p;
  rc = molt__patch_open(o->patch, &p, err, errlen);
  if (rc)
    return rc;
  char patch_id[81];
  snprintf(patch_id, sizeof patch_id, "%s", p.build_id);
  molt__patch_close(&p);
  if (strcmp(patch_id, want) != 0) {
    molt__errmsg(err, errlen,
                 "the patch was built for build-id %s, %s is %s; build it against "
                 "that program",
                 patch_id, path, want);
    return MOLT_EBUILDID;
  }
  molt__attach_one *v;
  size_t cnt;
  rc = find_processes(want, path, &v, &cnt, err, errlen);
  if (rc)
    return rc;
  if (cnt == 0) {
    free(v);
    molt__errmsg(err, errlen, "no running process of %s (build-id %s)", path, want);
    return MOLT_ENOENT;
  }
  *out = v;
  *n = cnt;
  size_t failed = cnt;
  for (size_t i = 0; i < cnt; i++) {
    int sig = molt__attach_interrupted();
    if (sig) {
      /* molt was told to stop after the last one: none more, and all or
       * nothing rolls back those done */
      const char *abbrev = sigabbrev_np(sig);
      snprintf(v[i].err, sizeof v[i].err, "interrupted by SIG%s before it was patched",
               abbrev ? abbrev : "?");
      v[i].rc = MOLT_EBUSY;
      v[i].outcome = MOLT__ATTACH_FAILED;
      failed = i;
      break;
    }
    molt__attach_opts one = *o;
    one.pid = v[i].pid;
    v[i].rc = molt__attach(&one, &v[i].st, v[i].err, sizeof v[i].err);
    if (v[i].rc == MOLT_ENOENT &&
        (molt__os_start_time(v[i].pid) == 0 || exiting(v[i].pid))) {
      /* exited since it was listed: nothing to patch there */
      v[i].outcome = MOLT__ATTACH_GONE;
      continue;
    }
    v[i].outcome = v[i].rc == 0 ? MOLT__ATTACH_DONE : MOLT__ATTACH_FAILED;
    if (v[i].rc) {
      failed = i;
      break;
    }
  }
  if (failed == cnt) {
    for (size_t i = 0; i < cnt; i++)
      if (v[i].outcome == MOLT__ATTACH_DONE)
        return 0;
    /* every one exited before it was patched */
    molt__errmsg(err, errlen, "no running process of %s (build-id %s)", path, want);
    return MOLT_ENOENT;
  }
  /* All or nothing: the ones patched, newest first, each its new patch
   * popped. */
  for (size_t i = failed; i-- > 0;) {
    if (v[i].outcome != MOLT__ATTACH_DONE)
      continue;
    molt__attach_state popped;
    char e2[512];
    int r = molt__attach_rollback(v[i].pid, o->timeout_ms, &popped, e2, sizeof e2);
    v[i].outcome = r == 0 ? MOLT__ATTACH_ROLLED_BACK : MOLT__ATTACH_ROLLBACK_FAILED;
    if (r)
      snprintf(v[i].err, sizeof v[i].err, "%s", e2);
    else if (popped.note[0])
      snprintf(v[i].err, sizeof v[i].err, "%s", popped.note);
  }
  molt__errmsg(err, errlen, "process %d: %s", (int)v[failed].pid, v[failed].err);
  return v[failed].rc;
}
