/* Harness workaround for examples/fixes/dnsmasq (not molt code): an
 * LD_PRELOAD shim that keeps dnsmasq's "close every inherited descriptor"
 * loop (close_fds() in main) from closing the molt runtime's control socket
 * (@molt.<pid>) and its wake-up descriptor, which the runtime opened at the
 * first updatable call, earlier in main.  close() of such a descriptor
 * returns 0 and does nothing.  Needed until the runtime survives programs
 * that close every descriptor (branch fdsafe). */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>
#include <sys/socket.h>
#include <sys/un.h>

static int is_molt_fd(int fd) {
  char p[64], l[128];
  snprintf(p, sizeof p, "/proc/self/fd/%d", fd);
  ssize_t n = readlink(p, l, sizeof l - 1);
  if (n <= 0)
    return 0;
  l[n] = 0;
  if (strcmp(l, "anon_inode:[eventfd]") == 0)
    return 1;
  if (strncmp(l, "socket:", 7) != 0)
    return 0;
  struct sockaddr_un sa;
  socklen_t len = sizeof sa;
  if (getsockname(fd, (struct sockaddr *)&sa, &len) < 0 || sa.sun_family != AF_UNIX)
    return 0;
  return len > sizeof(sa_family_t) + 6 && sa.sun_path[0] == 0 &&
         strncmp(sa.sun_path + 1, "molt.", 5) == 0;
}

int close(int fd) {
  static int (*real_close)(int);
  if (!real_close)
    real_close = (int (*)(int))dlsym(RTLD_NEXT, "close");
  if (fd > 2 && is_molt_fd(fd))
    return 0;
  return real_close(fd);
}
