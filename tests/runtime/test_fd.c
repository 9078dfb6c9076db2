/* The runtime's kept descriptors (src/runtime/base/fd.c) on their own:
 * moved out of the small numbers, told apart from a file the host opened on
 * the same number, never closed once they are the host's, and loaded under
 * a name no loaded object has.
 *
 *   test_fd PLAIN_LIB   (a shared object to load: tests/runtime's plain_lib) */
#include "../harness/check.h"
#include "base/base.h"

#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

static int band_start(void) {
  struct rlimit rl;
  getrlimit(RLIMIT_NOFILE, &rl);
  rlim_t top = rl.rlim_cur < 1024 ? rl.rlim_cur : 1024;
  return (int)(top - top / 8);
}

static ino_t ino_of(int fd) {
  struct stat st;
  return fstat(fd, &st) == 0 ? st.st_ino : 0;
}

/* A memfd holding a copy of `path`. */
static int copy_of(const char *path) {
  int src = open(path, O_RDONLY | O_CLOEXEC);
  int m = memfd_create("test_fd", MFD_CLOEXEC);
  char buf[65536];
  ssize_t k;
  while (src >= 0 && (k = read(src, buf, sizeof buf)) > 0)
    CHECK(write(m, buf, (size_t)k) == k, "copy");
  CHECK(src >= 0, "open %s: %s", path, strerror(errno));
  close(src);
  return m;
}

static void test_keep_and_lose(void) {
  molt__fd none = MOLT__FD_NONE;
  CHECK(!molt__fd_ours(&none) && !molt__fd_close(&none), "none is nobody's");

  int sv[2];
  CHECK(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) == 0, "socketpair");
  int low = sv[0];
  molt__fd a;
  CHECK(molt__fd_keep(&a, low) == 0, "keep");
  CHECK(a.fd >= band_start() && a.fd != low, "moved from %d to %d (band from %d)", low,
        a.fd, band_start());
  CHECK(fcntl(low, F_GETFD) < 0 && errno == EBADF, "the small number is free again");
  CHECK((fcntl(a.fd, F_GETFD) & FD_CLOEXEC) != 0, "close-on-exec");
  CHECK(molt__fd_ours(&a), "ours");

  /* The host closes it and puts a socket of its own on the number: not
   * ours, and closing ours leaves the host's open. */
  int n = a.fd, host[2];
  close(n);
  CHECK(!molt__fd_ours(&a), "closed: not ours");
  CHECK(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, host) == 0 &&
            dup2(host[0], n) == n,
        "reuse");
  close(host[0]);
  CHECK(!molt__fd_ours(&a), "a socket of the host on the same number: not ours");
  CHECK(!molt__fd_close(&a) && a.fd == -1, "reported lost, forgotten");
  CHECK(fcntl(n, F_GETFD) >= 0, "the host's socket is still open");
  close(n);
  close(host[1]);
  close(sv[1]);

  /* The same file opened again on the same number is not ours either when
   * its flags differ (a log file without O_APPEND). */
  char tmpl[] = "/tmp/test_fd.XXXXXX";
  int f = mkstemp(tmpl);
  int app = open(tmpl, O_WRONLY | O_APPEND | O_CLOEXEC);
  molt__fd l;
  CHECK(molt__fd_keep(&l, app) == 0 && molt__fd_ours(&l), "keep the log");
  n = l.fd;
  close(n);
  CHECK(dup2(f, n) == n, "reuse");
  CHECK(ino_of(n) == l.ino && !molt__fd_ours(&l), "same file, other flags: not ours");
  molt__fd_forget(&l);
  close(n);
  close(f);
  unlink(tmpl);
}

/* Taking a descriptor for a moment leaves it where it is; a number that
 * is not open is nobody's to take or keep, and nothing gets closed. */
static void test_take_and_closed(void) {
  int p[2];
  CHECK(pipe2(p, O_CLOEXEC) == 0, "pipe");
  molt__fd t;
  CHECK(molt__fd_take(&t, p[0]) == 0 && t.fd == p[0] && molt__fd_ours(&t),
        "taken where it is");
  CHECK(molt__fd_close(&t) && fcntl(p[0], F_GETFD) < 0, "closed");
  CHECK(molt__fd_take(&t, p[0]) == MOLT_EIO && t.fd == -1, "a closed number: not taken");
  CHECK(molt__fd_keep(&t, p[0]) == MOLT_EIO && t.fd == -1, "a closed number: not kept");
  CHECK(molt__fd_take(&t, -1) == MOLT_EINVAL && molt__fd_keep(&t, -1) == MOLT_EINVAL,
        "no number");
  CHECK(fcntl(p[1], F_GETFD) >= 0, "the other end untouched");

  /* Kept again where it already is (in the band): stays, still ours. */
  molt__fd k;
  CHECK(molt__fd_keep(&k, p[1]) == 0 && k.fd >= band_start(), "kept");
  int n = k.fd;
  CHECK(molt__fd_keep(&k, n) == 0 && k.fd == n && molt__fd_ours(&k), "kept in place");
  CHECK(molt__fd_close(&k), "closed");
}

/* A socket's address is part of what it is. */
static void test_socket_name(void) {
  int s = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  molt__fd k;
  CHECK(molt__fd_keep(&k, s) == 0, "keep");
  uint64_t unnamed = k.name;
  struct sockaddr_un sa = {.sun_family = AF_UNIX};
  int len =
      snprintf(sa.sun_path + 1, sizeof sa.sun_path - 1, "test_fd.%d", (int)getpid());
  CHECK(bind(k.fd, (struct sockaddr *)&sa,
             offsetof(struct sockaddr_un, sun_path) + 1 + (socklen_t)len) == 0,
        "bind");
  CHECK(!molt__fd_ours(&k), "bound since it was kept: not the socket recorded");
  CHECK(molt__fd_keep(&k, k.fd) == 0 && k.name != unnamed && molt__fd_ours(&k),
        "kept again with its name");
  CHECK(molt__fd_close(&k), "closed");
}

/* The dynamic loader finds a loaded object by the name it was opened under
 * before it opens anything: a copy on the number of an object whose own
 * descriptor is gone must be loaded under another name, or dlopen would
 * hand back the old object. */
static void test_load_path(const char *lib) {
  molt__fd a, b;
  char pa[64], pb[64];
  CHECK(molt__fd_keep(&a, copy_of(lib)) == 0, "keep a");
  CHECK(molt__fd_load_path(&a, pa, sizeof pa) == 0, "path of a");
  void *ha = dlopen(pa, RTLD_NOW | RTLD_LOCAL);
  CHECK(ha != NULL, "dlopen %s: %s", pa, dlerror());
  int n = a.fd;
  CHECK(molt__fd_close(&a), "a's copy closed (a stays loaded)");

  CHECK(molt__fd_keep(&b, copy_of(lib)) == 0, "keep b");
  if (b.fd != n) { /* put it where a's was */
    CHECK(dup2(b.fd, n) == n, "move");
    close(b.fd);
    b.fd = n;
  }
  CHECK(molt__fd_ours(&b), "b on a's old number");
  CHECK(molt__fd_load_path(&b, pb, sizeof pb) == 0, "path of b");
  CHECK(strcmp(pa, pb) != 0 && b.fd != n && molt__fd_ours(&b),
        "b moved off the name of a loaded object: %s %s", pa, pb);
  void *hb = dlopen(pb, RTLD_NOW | RTLD_LOCAL);
  CHECK(hb != NULL && hb != ha, "b is an object of its own");
  if (hb)
    dlclose(hb);
  if (ha)
    dlclose(ha);
  CHECK(molt__fd_close(&b), "b closed");
  CHECK(molt__fd_load_path(&b, pb, sizeof pb) == MOLT_EIO, "none has no path");
}

int main(int argc, char **argv) {
  if (argc != 2) {
    fprintf(stderr, "usage: %s PLAIN_LIB\n", argv[0]);
    return 2;
  }
  test_keep_and_lose();
  test_take_and_closed();
  test_socket_name();
  test_load_path(argv[1]);
  if (failures) {
    fprintf(stderr, "test_fd: %d check(s) failed\n", failures);
    return 1;
  }
  printf("test_fd: all checks passed\n");
  return 0;
}
