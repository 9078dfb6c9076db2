/* The runtime's descriptors, which the host may close and reuse (base.h:
 * "descriptors the host may close").
 *
 * A kept descriptor records what file it is when it is taken over, and
 * molt__fd_ours() compares that before each use:
 *   - device and inode (fstat): unique among live files -- but every
 *     eventfd, timerfd or epoll instance shares one anonymous inode, which
 *     is why the runtime's wake-up is a socket pair (sockets have an inode
 *     each) and not an eventfd;
 *   - the status flags (F_GETFL): the host reopening the very same file on
 *     the same number (say, a log file without O_APPEND) is not ours;
 *   - a memfd's seals, and a socket's own address (the control socket's
 *     "@molt.<pid>"): an inode number the kernel hands out again after
 *     ours died would still have to agree on these. */
#include "base/base.h"

#include <errno.h>
#include <fcntl.h>
#include <link.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <unistd.h>

/* Where kept descriptors go: the lowest free number from 7/8 of
 * min(RLIMIT_NOFILE, 1024) up, i.e. 896 and up under the usual limits.
 *   - Out of the small numbers.  Programs assume things about them: one
 *     started with stdin, stdout or stderr closed would find the runtime's
 *     socket on 0, 1 or 2 (and print into it); daemons expect their first
 *     open() to return 3, or dup2() onto 3, 4, ... -- which silently closes
 *     whatever is there.
 *   - Below 1024, not at the top of a raised limit: the kernel sizes a
 *     process's descriptor table to its highest number (a descriptor near
 *     a limit of 1048576 would cost every process 8 MiB of kernel memory),
 *     and numbers below FD_SETSIZE never upset a program that select()s.
 * Loops that close every descriptor (closefrom, close_range, up to
 * sysconf(_SC_OPEN_MAX)) still reach them; that is what the check is for. */
static int band_start(void) {
  struct rlimit rl;
  if (getrlimit(RLIMIT_NOFILE, &rl) != 0)
    return -1;
  rlim_t top = rl.rlim_cur < 1024 ? rl.rlim_cur : 1024;
  return (int)(top - top / 8);
}

int molt__fd_band(void) { return band_start(); }

/* The probes below look at a number that may not be ours any more: by the
 * time they run it may be a file of the host, or one the runtime has just
 * opened on another thread.  They are made as raw system calls, outside
 * ThreadSanitizer's model of descriptors, which would report each probe as
 * racing with whoever owns the number now -- the very thing the probe is
 * there to find out.  They only read the kernel's description of the file,
 * nothing of it. */
static long probe_fcntl(int fd, int cmd) { return syscall(SYS_fcntl, fd, cmd, 0); }

/* FNV-1a over a socket's own address; 0 for anything that is not a socket
 * (or has no address to tell). */
static uint64_t socket_name(int fd) {
  struct sockaddr_un sa;
  socklen_t len = sizeof sa;
  memset(&sa, 0, sizeof sa);
  if (syscall(SYS_getsockname, fd, (struct sockaddr *)&sa, &len) != 0)
    return 0;
  if (len > sizeof sa)
    len = sizeof sa;
  uint64_t h = 0xcbf29ce484222325u ^ len;
  const unsigned char *p = (const unsigned char *)&sa;
  for (socklen_t i = 0; i < len; i++)
    h = (h ^ p[i]) * 0x100000001b3u;
  return h | 1;
}

/* What file fd is now, in o (o->fd = fd).  false if fd is not open. */
static bool identify(int fd, molt__fd *o) {
  struct stat st;
  if (fd < 0 || syscall(SYS_fstat, fd, &st) != 0)
    return false;
  int flags = (int)probe_fcntl(fd, F_GETFL);
  if (flags < 0)
    return false;
  o->fd = fd;
  o->dev = st.st_dev;
  o->ino = st.st_ino;
  o->flags = flags;
  o->seals = S_ISREG(st.st_mode) ? (int)probe_fcntl(fd, F_GET_SEALS) : -1;
  o->name = S_ISSOCK(st.st_mode) ? socket_name(fd) : 0;
  return true;
}

/* fd_lock: the runtime's numbers are used by other threads in two places
 * -- a waker writes to the wake-up pair (state.c), any thread writes a log
 * line (log.c) -- each after checking the number under this lock.  Every
 * new descriptor is placed in the band under it too, and the wake-up pair
 * replaced under it, so none lands on a number such a thread has just
 * checked and is about to write to.  (A descriptor the kernel places, at
 * the lowest free number, is below the band unless the process has
 * hundreds open.)  A leaf, taken under log_lock. */
static molt__lock fd_lock = MOLT__LOCK_INIT(fd);

void molt__fd_lock(void) { molt__lock_acquire(&fd_lock); }
void molt__fd_unlock(void) { molt__lock_release(&fd_lock); }
void molt__fd_after_fork_child(void) { molt__lock_reinit(&fd_lock); }

static bool same_file(const molt__fd *a, const molt__fd *b) {
  return a->dev == b->dev && a->ino == b->ino && a->flags == b->flags &&
         a->seals == b->seals && a->name == b->name;
}

int molt__fd_take(molt__fd *o, int fd) {
  *o = (molt__fd)MOLT__FD_NONE;
  if (fd < 0)
    return MOLT_EINVAL;
  return identify(fd, o) ? 0 : MOLT_EIO; /* closed already: nothing to close */
}

int molt__fd_keep(molt__fd *o, int fd) {
  molt__fd was;
  int rc = molt__fd_take(&was, fd);
  if (rc < 0)
    return rc;
  int start = band_start();
  if (start > fd) {
    /* Where the band is full or the limit low, the number stays. */
    molt__fd_lock();
    int moved = fcntl(fd, F_DUPFD_CLOEXEC, start);
    molt__fd m;
    bool same = moved >= 0 && identify(moved, &m) && same_file(&m, &was);
    molt__fd_unlock();
    if (moved >= 0 && !same) {
      /* fd changed hands between the two calls: the copy is of the
       * host's file, and fd is the host's. */
      close(moved);
      return MOLT_EIO;
    }
    if (same) {
      if (molt__fd_ours(&was))
        close(fd);
      was = m;
    }
  }
  *o = was;
  return 0;
}

bool molt__fd_ours(const molt__fd *o) {
  molt__fd now;
  return o->fd >= 0 && identify(o->fd, &now) && same_file(&now, o);
}

bool molt__fd_close(molt__fd *o) {
  bool ours = molt__fd_ours(o);
  if (ours)
    close(o->fd);
  molt__fd_forget(o);
  return ours;
}

void molt__fd_forget(molt__fd *o) { *o = (molt__fd)MOLT__FD_NONE; }

int molt__fd_path(const molt__fd *o, char *buf, size_t len) {
  if (!molt__fd_ours(o))
    return MOLT_EIO;
  snprintf(buf, len, "/proc/self/fd/%d", o->fd);
  return 0;
}

struct name_match {
  const char *name;
  bool found;
};

static int match_name(struct dl_phdr_info *info, size_t size, void *data) {
  struct name_match *m = data;
  (void)size;
  if (info->dlpi_name && strcmp(info->dlpi_name, m->name) == 0) {
    m->found = true;
    return 1;
  }
  return 0;
}

/* Load names the loader still knows but no longer shows as an object's
 * name (hot/debug.c names a loaded patch by its file, for debuggers; the
 * loader keeps matching the name it was opened under).  Runtime thread,
 * op_lock: every load and unload happens there. */
static char **hidden_names;
static size_t nhidden;

int molt__fd_load_name_hidden(const char *name) {
  char *copy = strdup(name);
  char **p = copy ? realloc(hidden_names, (nhidden + 1) * sizeof *p) : NULL;
  if (!p) {
    free(copy);
    return MOLT_ENOMEM;
  }
  hidden_names = p;
  hidden_names[nhidden++] = copy;
  return 0;
}

void molt__fd_load_name_shown(const char *name) {
  for (size_t i = 0; i < nhidden; i++)
    if (strcmp(hidden_names[i], name) == 0) {
      free(hidden_names[i]);
      hidden_names[i] = hidden_names[--nhidden];
      return;
    }
}

static bool hidden_name(const char *name) {
  for (size_t i = 0; i < nhidden; i++)
    if (strcmp(hidden_names[i], name) == 0)
      return true;
  return false;
}

int molt__fd_load_path(molt__fd *o, char *buf, size_t len) {
  /* The dynamic loader looks a name up among the loaded objects before it
   * opens anything, and hands back the object it finds.  A loaded object
   * keeps the name it was opened under after its descriptor is gone -- an
   * image's copy is closed once loaded, a patch's may be closed by the
   * host -- so a later copy on the same number would get that old object.
   * Ours moves to another number until its name is nobody's. */
  for (int tries = 0; tries < 64; tries++) {
    if (!molt__fd_ours(o))
      return MOLT_EIO;
    snprintf(buf, len, "/proc/self/fd/%d", o->fd);
    struct name_match m = {buf, false};
    dl_iterate_phdr(match_name, &m);
    if (!m.found && !hidden_name(buf))
      return 0;
    molt__fd_lock();
    int moved = fcntl(o->fd, F_DUPFD_CLOEXEC, o->fd + 1);
    molt__fd_unlock();
    if (moved < 0)
      return molt__from_errno(errno);
    close(o->fd);
    o->fd = moved; /* the same open file: what o records still holds */
  }
  return MOLT_EIO;
}
