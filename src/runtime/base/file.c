/* Opening update files (patches and program images) once and checking them
 * (R7), then handing out a private, sealed copy.
 *
 * Everything after molt__file_open_checked() looks at the copy, never at the
 * path again: a file replaced or rewritten after the check cannot change
 * what is loaded. */
#include "base/base.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

/* R7: regular file, owned by the process owner or root, not writable by
 * group or others.  Checked on the open file (fstat), not on the path. */
static int check_file(int fd, const char *path, char *err, size_t errlen) {
  struct stat st;
  if (fstat(fd, &st) != 0) {
    molt__errmsg(err, errlen, "cannot stat %s: %s", path, strerror(errno));
    return MOLT_EIO;
  }
  if (!S_ISREG(st.st_mode)) {
    molt__errmsg(err, errlen, "%s is not a regular file", path);
    return MOLT_EINVAL;
  }
  uid_t me = geteuid();
  if (st.st_uid != me && st.st_uid != 0) {
    molt__errmsg(err, errlen,
                 "%s is owned by uid %u; an update file must belong to the "
                 "process owner (uid %u) or root",
                 path, (unsigned)st.st_uid, (unsigned)me);
    return MOLT_EUNSAFE;
  }
  if (st.st_mode & (S_IWGRP | S_IWOTH)) {
    molt__errmsg(err, errlen,
                 "%s is writable by group or others (mode %03o); run chmod go-w on it",
                 path, (unsigned)(st.st_mode & 0777));
    return MOLT_EUNSAFE;
  }
  return 0;
}

/* Copies the checked file into a sealed memfd.
 *
 * Why a copy: the dynamic loader shares one mapping between all dlopens of
 * the same inode and keeps the first name it was opened under.  If the same
 * file were loaded twice, the mapping could outlive the first load's
 * /proc/self/fd/N name, and a later file opened on a reused fd number N
 * would be handed that stale mapping.  A fresh inode per load makes every
 * load's mapping its own, and the seals make the copy immutable.
 *
 * Both descriptors are the runtime's for a moment only, but the host may
 * close them meanwhile (base.h): each read and write checks its
 * descriptor first. */
static int private_copy(const molt__fd *f, const char *path, size_t max_bytes,
                        molt__fd *out, molt__file_identity *id, char *err,
                        size_t errlen) {
  struct stat st;
  if (!molt__fd_ours(f) || fstat(f->fd, &st) != 0) {
    molt__errmsg(err, errlen, "cannot copy %s: the process closed the descriptor", path);
    return MOLT_EIO;
  }
  if ((uint64_t)st.st_size > max_bytes) {
    molt__errmsg(err, errlen, "%s is larger than %zu MiB: refusing to load it", path,
                 max_bytes >> 20);
    return MOLT_EINVAL;
  }
  const char *base = strrchr(path, '/');
  int mfd = memfd_create(base ? base + 1 : path, MFD_CLOEXEC | MFD_ALLOW_SEALING);
  molt__fd m;
  int rc = mfd < 0 ? molt__from_errno(errno) : molt__fd_keep(&m, mfd);
  if (rc < 0) {
    molt__errmsg(err, errlen, "cannot create a memfd: %s", molt_strerror(rc));
    return rc;
  }
  char buf[65536];
  off_t off = 0;
  molt__sha256 sha;
  molt__sha256_init(&sha);
  for (;;) {
    if (!molt__fd_ours(f) || !molt__fd_ours(&m)) {
      molt__errmsg(err, errlen, "cannot copy %s: the process closed the descriptor",
                   path);
      molt__fd_close(&m);
      return MOLT_EIO;
    }
    ssize_t n = pread(f->fd, buf, sizeof buf, off);
    if (n == 0)
      break;
    if (n < 0 && errno == EINTR)
      continue;
    if (n < 0 || write(m.fd, buf, (size_t)n) != n || (uint64_t)(off += n) > max_bytes) {
      molt__errmsg(err, errlen, "cannot copy %s: %s", path,
                   n < 0 ? strerror(errno) : "short write or file grew");
      molt__fd_close(&m);
      return MOLT_EIO;
    }
    molt__sha256_add(&sha, buf, (size_t)n);
  }
  if (id) {
    id->dev = st.st_dev;
    id->ino = st.st_ino;
    molt__sha256_hex(&sha, id->sha256);
  }
  if (!molt__fd_ours(&m) ||
      fcntl(m.fd, F_ADD_SEALS,
            F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_WRITE | F_SEAL_SEAL) != 0) {
    molt__errmsg(err, errlen, "cannot seal the copy of %s: %s", path, strerror(errno));
    molt__fd_close(&m);
    return MOLT_EIO;
  }
  /* Kept anew: its identity now includes the seals. */
  rc = molt__fd_keep(out, m.fd);
  if (rc < 0)
    molt__errmsg(err, errlen, "cannot keep the copy of %s: %s", path, molt_strerror(rc));
  return rc;
}

/* R7 on a descriptor that someone else opened (the CLI, or the calling
 * thread of molt_apply): besides check_file, opened for reading only -- a
 * descriptor that could write proves its sender may change the file. */
static int check_descriptor(const molt__fd *f, const char *name, char *err,
                            size_t errlen) {
  if (!molt__fd_ours(f)) {
    molt__errmsg(err, errlen, "cannot check %s: the process closed the descriptor", name);
    return MOLT_EIO;
  }
  int rc = check_file(f->fd, name, err, errlen);
  if (rc < 0)
    return rc;
  int fl = fcntl(f->fd, F_GETFL);
  if (fl < 0 || (fl & O_ACCMODE) != O_RDONLY) {
    molt__errmsg(err, errlen,
                 "%s was passed open for writing; an update file is passed read-only",
                 name);
    return MOLT_EUNSAFE;
  }
  return 0;
}

int molt__file_copy_checked(int fd, const char *name, size_t max_bytes, molt__fd *out,
                            molt__file_identity *id, char *err, size_t errlen) {
  *out = (molt__fd)MOLT__FD_NONE;
  if (!name || !*name)
    name = "the update file";
  molt__fd f; /* the caller's: checked and read, never closed here */
  int rc = molt__fd_take(&f, fd);
  if (rc < 0) {
    molt__errmsg(err, errlen, "cannot read %s: the descriptor is not open", name);
    return rc;
  }
  rc = check_descriptor(&f, name, err, errlen);
  if (rc == 0)
    rc = private_copy(&f, name, max_bytes, out, id, err, errlen);
  return rc;
}

int molt__file_open_path(const char *path, int *fd, char *err, size_t errlen) {
  *fd = -1;
  if (!path || !*path) {
    molt__errmsg(err, errlen, "no file name given");
    return MOLT_EINVAL;
  }
  /* O_NONBLOCK: opening a FIFO (or a device) must not block (issue 16);
   * its type is checked on the open file before anything is read. */
  int ffd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC | O_NOCTTY);
  if (ffd < 0) {
    int e = errno;
    molt__errmsg(err, errlen, "cannot open %s: %s", path, strerror(e));
    errno = e; /* for callers that pass the reason on */
    return molt__from_errno(e);
  }
  *fd = ffd;
  return 0;
}

int molt__file_open_checked(const char *path, size_t max_bytes, molt__fd *out, char *err,
                            size_t errlen) {
  *out = (molt__fd)MOLT__FD_NONE;
  int ffd;
  int rc = molt__file_open_path(path, &ffd, err, errlen);
  if (rc < 0)
    return rc;
  molt__fd f; /* for a moment: stays where the kernel put it */
  rc = molt__fd_take(&f, ffd);
  if (rc < 0) {
    molt__errmsg(err, errlen, "cannot open %s: %s", path, molt_strerror(rc));
    return rc;
  }
  rc = molt__file_copy_checked(f.fd, path, max_bytes, out, NULL, err, errlen);
  molt__fd_close(&f);
  return rc;
}
