/*
 * molt/program.h -- the ABI of full updates (not an API).
 *
 * Between the code moltcc generates into a program image (tools/moltcc,
 * from DWARF and the .xf file) and the runtime (src/runtime/full/), and
 * between the `molt run` driver and the runtime.  See
 * docs/full-updates.md.  Only generated code (and hand-written images that
 * take its place, e.g. in the tests) includes this header.
 */
#ifndef MOLT_PROGRAM_H
#define MOLT_PROGRAM_H

#include "../molt.h"

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <poll.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/types.h>
#include <sys/uio.h>
#include <time.h>

#ifdef __cplusplus
extern "C" {
#endif

/*
 * The migration.
 *
 * Every program image defines `const molt__program_info molt__program`.
 * The runtime calls `migrate` of the NEW image on the runtime thread while
 * every thread of the old version waits at an update point; it reads the
 * old version through `in` pointers and writes the new one through `out`.
 * Any molt__xf_* call may abort the migration (it does not return then);
 * a fault inside `migrate` aborts it too, and so does its deadline (the
 * update's --timeout, counted from the moment every thread is parked).  On
 * abort every in-place write is undone, everything allocated (by the
 * runtime, and by rule bodies through molt__xf_malloc & co.) is freed and
 * the old version continues.
 */
#define MOLT__PROGRAM_ABI 1u

typedef struct molt__xf_ctx molt__xf_ctx; /* runtime-private */

/* Transforms (or, for unchanged types, fixes the pointers of) one object:
 * in = old object, out = new object (in == out when fixed in place). */
typedef void (*molt__xf_fn)(molt__xf_ctx *cx, const void *in, void *out);

enum {
  /* The new representation differs: a migrated heap object is replaced by a
   * new one (calloc'ed, then fn(in, out)); the old one is freed after the
   * update commits. */
  MOLT__XF_CHANGED = 1u,
  /* The type (transitively) contains pointers: objects must be visited.
   * Unchanged types without this flag are copied as bytes, never visited. */
  MOLT__XF_TRAVERSE = 2u,
};

/* One (old type -> new type) pair, generated once per pair. */
typedef struct molt__xf_type {
  const char *name; /* for messages, e.g. "struct entry" */
  size_t old_size, new_size;
  molt__xf_fn fn; /* NULL: nothing to do beyond copying bytes */
  uint32_t flags; /* MOLT__XF_* */
} molt__xf_type;

typedef struct molt__program_info {
  uint32_t abi; /* MOLT__PROGRAM_ABI */
  uint32_t reserved;
  /* Hex build-id of the image this version was built from (--molt-from);
   * NULL for a first version, which cannot be an update target. */
  const char *from_build_id;
  /* Migrates the state from the old version; NULL for a first version. */
  void (*migrate)(molt__xf_ctx *cx);
} molt__program_info;

/* Address of variable or function `name` (tu: source file basename of a
 * static, NULL for a global) in the old / new image.  Aborts the migration
 * with a message naming the symbol if it does not exist. */
MOLT_EXTERN void *molt__xf_oldsym(molt__xf_ctx *cx, const char *name, const char *tu);
MOLT_EXTERN void *molt__xf_newsym(molt__xf_ctx *cx, const char *name, const char *tu);
/* Records that the old variable at `in` (count objects of t) lives at `out`
 * in the new version: later pointers into it are redirected (element-wise
 * when t changed).  Does not transform it. */
MOLT_EXTERN void molt__xf_map_var(molt__xf_ctx *cx, const void *in, void *out,
                                  const molt__xf_type *t, size_t count);
/* The rule body about to run (`what`, a literal of the generated code, e.g.
 * "variable rule stats_state -> stats_state (memcached.c)"), NULL when it
 * has run: a fault or the deadline in it is reported naming it. */
MOLT_EXTERN void molt__xf_rule(molt__xf_ctx *cx, const char *what);
/* molt__xf_map_var + queues the transformation: unchanged types are copied
 * byte for byte and then visited (TRAVERSE); changed types run t->fn per
 * element (the new variable keeps its initializer where fn writes nothing). */
MOLT_EXTERN void molt__xf_var(molt__xf_ctx *cx, const void *in, void *out,
                              const molt__xf_type *t, size_t count);
/* The new value of an old pointer to `count` objects of type t (t NULL: an
 * untyped pointer -- void *, char *, function pointer).  NULL stays NULL;
 * an already migrated object maps to its new address (sharing and cycles
 * are kept); a pointer into the old image is redirected to the new image
 * (functions and variables by name, string literals copied to memory the
 * runtime keeps); a heap object of a CHANGED type is replaced; one of an
 * unchanged TRAVERSE type is queued to be visited in place.  The transform
 * itself runs later from the work list (no deep recursion). */
MOLT_EXTERN void *molt__xf_ptr(molt__xf_ctx *cx, const void *old, const molt__xf_type *t,
                               size_t count);
/* molt__xf_ptr for the pointer in field `field` ("struct conn.next", a
 * string that lives as long as the image): a pointer that would be
 * followed but points to no readable memory (dangling, uninitialised,
 * non-canonical) is kept as it is, not followed, and logged with the field;
 * a fault in the object it reached names the field too. */
MOLT_EXTERN void *molt__xf_fptr(molt__xf_ctx *cx, const void *old, const molt__xf_type *t,
                                size_t count, const char *field);
/* Stores a pointer into an object being fixed in place (undone on abort).
 * Generated fixers for unchanged types store every pointer this way. */
MOLT_EXTERN void molt__xf_setp(molt__xf_ctx *cx, void *slot, void *value);
/* Stores a pointer for a rule body (MOLT_XF_STORE) into memory the old
 * version goes on using if the update aborts (an object kept in place,
 * reached by hand): always undo-logged, so an abort restores it. */
MOLT_EXTERN void molt__xf_store_old(molt__xf_ctx *cx, void *slot, void *value);
/* Runs queued transformations until none is left. */
MOLT_EXTERN void molt__xf_run(molt__xf_ctx *cx);
/* Migrates the saved copies of local `var` of function `func` (registered
 * with MOLT_MIGRATE_LOCAL by the old version) of every thread to type t. */
MOLT_EXTERN void molt__xf_local(molt__xf_ctx *cx, const char *func, const char *var,
                                const molt__xf_type *t);
/* Frees an old heap object after the update commits; never on abort (the
 * old version goes on with it).  Same safety rules as replaced objects:
 * only an object in the heap or an anonymous private mapping is freed, once
 * (also when it was replaced too, or asked for twice), and never one that
 * lies inside another freed or replaced object.  For rule bodies
 * (MOLT_XF_FREE_OLD) that drop old data the runtime does not replace. */
MOLT_EXTERN void molt__xf_free_old(molt__xf_ctx *cx, const void *old);
/* Memory for the new state, allocated by a rule body: the generated code
 * maps the rules' malloc, calloc, realloc, strdup, strndup and free to
 * these.  Blocks allocated here are freed if the update aborts and belong
 * to the new version once it commits.  free() of such a block frees it at
 * once; free() of any other pointer (old data) is molt__xf_free_old (freed
 * only once the update commits).  realloc() of old data aborts the
 * migration (it cannot be undone). */
MOLT_EXTERN void *molt__xf_malloc(molt__xf_ctx *cx, size_t size);
MOLT_EXTERN void *molt__xf_calloc(molt__xf_ctx *cx, size_t n, size_t size);
MOLT_EXTERN void *molt__xf_realloc(molt__xf_ctx *cx, void *p, size_t size);
MOLT_EXTERN char *molt__xf_strdup(molt__xf_ctx *cx, const char *s);
MOLT_EXTERN char *molt__xf_strndup(molt__xf_ctx *cx, const char *s, size_t n);
MOLT_EXTERN void molt__xf_free(molt__xf_ctx *cx, void *p);
/* Aborts the migration with a one-line message (never returns). */
MOLT_EXTERN void molt__xf_fail(molt__xf_ctx *cx, const char *fmt, ...)
    __attribute__((noreturn, format(printf, 2, 3)));

/* Program images are linked with --wrap=pthread_create: the threads they
 * start arrive here and become program threads, which take part in full
 * updates from their first instruction (a plain pthread_create otherwise). */
MOLT_EXTERN int __wrap_pthread_create(pthread_t *th, const pthread_attr_t *attr,
                                      void *(*fn)(void *), void *arg);

/* Program images are linked with --wrap for the calls a shadowed update
 * records in the leader and replays in the follower (docs/design.md §17);
 * outside a shadowed update each is the plain call. */
MOLT_EXTERN ssize_t __wrap_read(int fd, void *buf, size_t n);
MOLT_EXTERN ssize_t __wrap_write(int fd, const void *buf, size_t n);
MOLT_EXTERN ssize_t __wrap_recv(int fd, void *buf, size_t n, int flags);
MOLT_EXTERN ssize_t __wrap_send(int fd, const void *buf, size_t n, int flags);
MOLT_EXTERN ssize_t __wrap_readv(int fd, const struct iovec *iov, int iovcnt);
MOLT_EXTERN ssize_t __wrap_writev(int fd, const struct iovec *iov, int iovcnt);
MOLT_EXTERN ssize_t __wrap_recvfrom(int fd, void *buf, size_t n, int flags,
                                    struct sockaddr *addr, socklen_t *len);
MOLT_EXTERN ssize_t __wrap_sendto(int fd, const void *buf, size_t n, int flags,
                                  const struct sockaddr *addr, socklen_t len);
MOLT_EXTERN ssize_t __wrap_recvmsg(int fd, struct msghdr *msg, int flags);
MOLT_EXTERN ssize_t __wrap_sendmsg(int fd, const struct msghdr *msg, int flags);
MOLT_EXTERN int __wrap_accept(int fd, struct sockaddr *addr, socklen_t *len);
MOLT_EXTERN int __wrap_accept4(int fd, struct sockaddr *addr, socklen_t *len, int flags);
MOLT_EXTERN int __wrap_poll(struct pollfd *fds, nfds_t n, int timeout);
MOLT_EXTERN int __wrap_epoll_wait(int epfd, struct epoll_event *ev, int max, int timeout);
MOLT_EXTERN int __wrap_epoll_pwait(int epfd, struct epoll_event *ev, int max, int timeout,
                                   const sigset_t *mask);
MOLT_EXTERN int __wrap_epoll_pwait2(int epfd, struct epoll_event *ev, int max,
                                    const struct timespec *ts, const sigset_t *mask);
MOLT_EXTERN int __wrap_epoll_create(int size);
MOLT_EXTERN int __wrap_epoll_create1(int flags);
MOLT_EXTERN int __wrap_epoll_ctl(int epfd, int op, int fd, struct epoll_event *ev);
MOLT_EXTERN int __wrap_close(int fd);
MOLT_EXTERN int __wrap_socket(int domain, int type, int protocol);
MOLT_EXTERN int __wrap_open(const char *path, int flags, ...);
MOLT_EXTERN int __wrap_openat(int dirfd, const char *path, int flags, ...);
MOLT_EXTERN int __wrap_clock_gettime(clockid_t clock, struct timespec *ts);
MOLT_EXTERN int __wrap_gettimeofday(struct timeval *tv, void *tz);
MOLT_EXTERN time_t __wrap_time(time_t *t);
MOLT_EXTERN ssize_t __wrap_getrandom(void *buf, size_t n, unsigned flags);
/* Not followed: the follower makes them itself, past its backstop. */
MOLT_EXTERN int __wrap_sigprocmask(int how, const sigset_t *set, sigset_t *old);
MOLT_EXTERN int __wrap_pthread_sigmask(int how, const sigset_t *set, sigset_t *old);

/* The driver behind `molt run` (bin/molt-run): loads the program image at
 * `path` and runs its main(argc, argv, environ) as the main program thread
 * until it returns.  Returns 0 with main's return value in *status, or a
 * MOLT_E* code with a one-line reason in err if the image cannot be run
 * (the runtime logs it too; the driver, not the runtime, tells the user). */
MOLT_EXTERN int molt__program_run(const char *path, int argc, char **argv, int *status,
                                  char *err, size_t errlen);

#ifdef __cplusplus
}
#endif
#endif /* MOLT_PROGRAM_H */
