/* The update log (guarantee H11): a fixed ring in memory, read by `molt log`, and
 * optionally a file named by $MOLT_LOG_FILE.  Never stdout/stderr (R3).
 *
 * `denied` entries (refused control connections, which any local user can
 * cause at will) go to a small ring of their own, so that no number of
 * them can push the history of loads, switches, rollbacks and updates out
 * of the main ring; `molt log` shows both, in order.  The control server
 * (service/control.c) logs refusals in summary, so they add a bounded
 * number of lines to the file too.
 *
 * The file's descriptor is checked before every write (base.h, "descriptors
 * the host may close"): if the host closed it, possibly reusing the number,
 * the file is opened again by its name (O_APPEND) and an `info` entry says
 * so; no line ever goes to the host's descriptor.
 *
 * Lock: log_lock; only fd_lock is taken under it (to check and write the
 * file's descriptor, and to keep a reopened one). */
#include "base/base.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#define RING 1024
#define DENIED_RING 64

typedef struct entry {
  uint64_t seq;
  uint64_t time_ns;
  molt__event ev;
  uint64_t gen;
  char patch[64];
  char msg[512]; /* a full update names two images, a build-id and figures */
} entry;

static molt__lock log_lock = MOLT__LOCK_INIT(log);
static entry ring[RING];
static entry denied_ring[DENIED_RING];
static uint64_t next_seq = 1;
static molt__fd log_fd = MOLT__FD_NONE;
/* $MOLT_LOG_FILE as the process started ("" = none): the environment may
 * change later, the file to reopen may not. */
static char log_path[PATH_MAX];

static const char *const names[] = {
#define MOLT__EV_NAME(NAME, name) [MOLT__EV_##NAME] = name,
    MOLT__EVENTS(MOLT__EV_NAME)
#undef MOLT__EV_NAME
};

const char *molt__event_name(molt__event ev) {
  if ((unsigned)ev < sizeof names / sizeof names[0] && names[ev])
    return names[ev];
  return "?";
}

/* Opens the log file (log_lock held). */
static void open_file_locked(void) {
  int fd = open(log_path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
  if (fd >= 0)
    (void)molt__fd_keep(&log_fd, fd);
}

/* The rings are written with a whole entry (608 bytes) at a time, in
 * order, so untouched they would take one more page of the process's
 * resident memory every few entries until they wrap -- about 2.4 KiB per
 * full update (four entries) for the first 250 updates, which reads as a
 * leak of a long-running server's updates.  Their pages are made resident
 * once, at start (the rings, not the file: about 650 KiB), so the
 * resident size does not move with the log from then on.  Writing one
 * byte per page with itself where MADV_POPULATE_WRITE (Linux 5.14) is
 * missing. */
static void make_resident(void *area, size_t size) {
  long pg = sysconf(_SC_PAGESIZE);
  size_t page = pg > 0 ? (size_t)pg : 4096;
  /* Whole pages, the ones the rings share with their neighbours included
   * (populating or rewriting a byte with itself changes no content). */
  uintptr_t lo = (uintptr_t)area & ~(uintptr_t)(page - 1);
  uintptr_t hi = ((uintptr_t)area + size + page - 1) & ~(uintptr_t)(page - 1);
#ifdef MADV_POPULATE_WRITE
  if (madvise((void *)lo, hi - lo, MADV_POPULATE_WRITE) == 0)
    return;
#endif
  /* A constructor: no other thread of the runtime runs yet. */
  for (uintptr_t a = lo; a < hi; a += page)
    *(volatile char *)a = *(volatile char *)a;
}

void molt__log_init(void) {
  const char *path = getenv("MOLT_LOG_FILE");
  make_resident(ring, sizeof ring);
  make_resident(denied_ring, sizeof denied_ring);
  molt__lock_acquire(&log_lock);
  molt__fd_close(&log_fd);
  log_path[0] = '\0';
  if (path && *path && strlen(path) < sizeof log_path) {
    strcpy(log_path, path);
    open_file_locked();
  }
  molt__lock_release(&log_lock);
}

/* One line of the file (log_lock held).  The descriptor is checked and
 * written under fd_lock: no new descriptor of the runtime can land on its
 * number in between (fd.c). */
static void write_locked(const entry *e) {
  char line[768];
  int n = snprintf(line, sizeof line,
                   "%" PRIu64 " %" PRIu64 ".%06" PRIu64 " pid=%d %s gen=%" PRIu64
                   " patch=%s %s\n",
                   e->seq, e->time_ns / 1000000000u, (e->time_ns / 1000u) % 1000000u,
                   (int)getpid(), molt__event_name(e->ev), e->gen, e->patch, e->msg);
  molt__fd_lock();
  if (n > 0 && molt__fd_ours(&log_fd)) {
    /* A failing log file must not disturb the host: result ignored. */
    ssize_t w =
        write(log_fd.fd, line, (size_t)n < sizeof line ? (size_t)n : sizeof line - 1);
    (void)w;
  }
  molt__fd_unlock();
}

/* Numbers e, puts it into the ring and the file (log_lock held). */
static void append_locked(entry *e) {
  molt__fd_lock();
  bool lost = log_path[0] && !molt__fd_ours(&log_fd);
  molt__fd_unlock();
  if (lost) {
    /* Lost (the number is the host's now: never written to again), or an
     * earlier reopen failed: open the file again.  A loss is an entry of
     * its own, before the one that found it. */
    int lost = log_fd.fd;
    molt__fd_forget(&log_fd);
    open_file_locked();
    if (lost >= 0) {
      entry info;
      memset(&info, 0, sizeof info);
      info.seq = next_seq++;
      info.time_ns = e->time_ns;
      info.ev = MOLT__EV_INFO;
      snprintf(info.patch, sizeof info.patch, "-");
      /* molt__errmsg: a long path is cut, not a warning. */
      if (log_fd.fd >= 0)
        molt__errmsg(info.msg, sizeof info.msg,
                     "the process closed or replaced molt's log file descriptor (fd "
                     "%d): reopened %s (fd %d)",
                     lost, log_path, log_fd.fd);
      else
        molt__errmsg(info.msg, sizeof info.msg,
                     "the process closed or replaced molt's log file descriptor (fd "
                     "%d); cannot reopen %s: %s",
                     lost, log_path, strerror(errno));
      ring[info.seq % RING] = info;
      if (log_fd.fd >= 0)
        write_locked(&info);
    }
  }
  e->seq = next_seq++;
  if (e->ev == MOLT__EV_DENIED)
    denied_ring[e->seq % DENIED_RING] = *e;
  else
    ring[e->seq % RING] = *e;
  if (log_fd.fd >= 0)
    write_locked(e);
}

void molt__log(molt__event ev, uint64_t gen, const char *patch_id, const char *fmt, ...) {
  entry e;
  memset(&e, 0, sizeof e);
  e.time_ns = molt__realtime_ns();
  e.ev = ev;
  e.gen = gen;
  snprintf(e.patch, sizeof e.patch, "%s", patch_id && *patch_id ? patch_id : "-");
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(e.msg, sizeof e.msg, fmt, ap);
  va_end(ap);

  /* write() below is a cancellation point: an application thread that logs
   * (program threads do) must not be cancelled while it holds log_lock. */
  int cancel_state;
  pthread_setcancelstate(PTHREAD_CANCEL_DISABLE, &cancel_state);
  molt__lock_acquire(&log_lock);
  append_locked(&e);
  molt__lock_release(&log_lock);
  pthread_setcancelstate(cancel_state, NULL);
}

/* No thread is in the middle of an entry while fork() copies the ring. */
void molt__log_fork_prepare(void) { molt__lock_acquire(&log_lock); }
void molt__log_fork_parent(void) { molt__lock_release(&log_lock); }
void molt__log_after_fork_child(void) { molt__lock_reinit(&log_lock); }

static int by_seq(const void *a, const void *b) {
  uint64_t x = (*(const entry *const *)a)->seq, y = (*(const entry *const *)b)->seq;
  return x < y ? -1 : x > y;
}

void molt__log_dump(molt__buf *out) {
  /* Copy under the lock, format outside it: the buffer may allocate. */
  entry *copy = malloc(sizeof ring + sizeof denied_ring);
  if (!copy) {
    out->oom = true;
    return;
  }
  entry *denied_copy = copy + RING;
  molt__lock_acquire(&log_lock);
  memcpy(copy, ring, sizeof ring);
  memcpy(denied_copy, denied_ring, sizeof denied_ring);
  molt__lock_release(&log_lock);

  /* The entries held, oldest first: the main ring may hold entries far
   * older than the denied ring's, so the two are merged by number. */
  const entry *held[RING + DENIED_RING];
  size_t n = 0;
  for (size_t i = 0; i < RING + DENIED_RING; i++)
    if (copy[i].seq != 0)
      held[n++] = &copy[i];
  qsort(held, n, sizeof held[0], by_seq);
  for (size_t i = 0; i < n; i++) {
    const entry *e = held[i];
    char seq[24], t[40], gen[24];
    snprintf(seq, sizeof seq, "%" PRIu64, e->seq);
    snprintf(t, sizeof t, "%" PRIu64 ".%06" PRIu64, e->time_ns / 1000000000u,
             (e->time_ns / 1000u) % 1000000u);
    snprintf(gen, sizeof gen, "%" PRIu64, e->gen);
    const char *f[] = {"log", seq, t, molt__event_name(e->ev), gen, e->patch, e->msg};
    molt__buf_record(out, 7, f);
  }
  free(copy);
}
