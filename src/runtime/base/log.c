/* The update log (guarantee H11): a fixed ring in memory, read by `molt log`, and
 * optionally a file named by $MOLT_LOG_FILE.  Never stdout/stderr (R3).
 *
 * Lock: log_lock is a leaf (nothing is called while holding it). */
#include "base/base.h"

#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define RING 1024

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
static uint64_t next_seq = 1;
static int log_fd = -1;

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

void molt__log_init(void) {
  const char *path = getenv("MOLT_LOG_FILE");
  molt__lock_acquire(&log_lock);
  if (log_fd >= 0) {
    close(log_fd);
    log_fd = -1;
  }
  if (path && *path)
    log_fd = open(path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
  molt__lock_release(&log_lock);
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
  e.seq = next_seq++;
  ring[e.seq % RING] = e;
  int fd = log_fd;
  if (fd >= 0) {
    char line[768];
    int n = snprintf(line, sizeof line,
                     "%" PRIu64 " %" PRIu64 ".%06" PRIu64 " pid=%d %s gen=%" PRIu64
                     " patch=%s %s\n",
                     e.seq, e.time_ns / 1000000000u, (e.time_ns / 1000u) % 1000000u,
                     (int)getpid(), molt__event_name(ev), gen, e.patch, e.msg);
    if (n > 0) {
      /* A failing log file must not disturb the host: result ignored. */
      ssize_t w = write(fd, line, (size_t)n < sizeof line ? (size_t)n : sizeof line - 1);
      (void)w;
    }
  }
  molt__lock_release(&log_lock);
  pthread_setcancelstate(cancel_state, NULL);
}

void molt__log_dump(molt__buf *out) {
  /* Copy under the lock, format outside it: the buffer may allocate. */
  entry *copy = malloc(sizeof ring);
  if (!copy) {
    out->oom = true;
    return;
  }
  molt__lock_acquire(&log_lock);
  uint64_t last = next_seq;
  memcpy(copy, ring, sizeof ring);
  molt__lock_release(&log_lock);

  uint64_t first = last > RING ? last - RING : 1;
  for (uint64_t s = first; s < last; s++) {
    const entry *e = &copy[s % RING];
    if (e->seq != s)
      continue;
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
