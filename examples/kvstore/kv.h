/*
 * kv.h — interfaces between the files of the kvstore example.
 *
 *   kvstore.c      main: options, listening socket, accept loop, worker pool
 *   kv_net.c       connections: reading lines, buffering and writing replies
 *   kv_store.c     the store: a fixed-size hash table with striped locks
 *   kv_commands.c  the command layer: parsing, executing and formatting
 *                  replies.  Every function of it that runs per request is
 *                  MOLT_UPDATABLE, so the whole layer can be patched live
 *                  (patches/<name>/kv_commands.c are later versions of it).
 *
 * The split matters for live updates: the loops that never return (accept,
 * workers, the per-connection I/O) live outside the command layer, so no
 * thread ever sits inside an updatable function between two requests and a
 * patch reaches every connection at its very next request.
 */
#ifndef KV_H
#define KV_H

#include <stdatomic.h>
#include <stddef.h>
#include <sys/types.h>

/* Longest request line accepted (without its newline).  Values are bounded
 * by it, so a value always fits in a buffer of this size. */
#define KV_MAX_LINE 16384
#define KV_MAX_KEY 250

/* ---- kv_store.c ---------------------------------------------------------- */
struct kv_store;

/* nbuckets and nlocks are rounded up to powers of two. NULL on ENOMEM. */
struct kv_store *kv_store_new(size_t nbuckets, size_t nlocks);
void kv_store_free(struct kv_store *st);

/* Copies the value of `key` into buf (at most cap bytes) and returns its full
 * length, or -1 if the key is absent. */
ssize_t kv_store_get(struct kv_store *st, const char *key, size_t klen, char *buf,
                     size_t cap);
/* Inserts or replaces. Returns 1 if the key was new, 0 if it was replaced,
 * -1 when out of memory (the store is unchanged). */
int kv_store_set(struct kv_store *st, const char *key, size_t klen, const char *val,
                 size_t vlen);
/* Removes `key`. Returns 1 if it was removed, 0 if it was not there. */
int kv_store_del(struct kv_store *st, const char *key, size_t klen);
/* Number of keys (exact once concurrent writers have returned). */
size_t kv_store_count(struct kv_store *st);

/*
 * Atomic read-modify-write of one key: `fn` runs with the key's lock held and
 * sees the current value (found = 0: absent, old = NULL).  It writes the new
 * value into buf (cap = KV_MAX_LINE bytes) and returns its length, or returns
 * a negative number to leave the key unchanged.  kv_store_update returns what
 * fn returned, or -ENOMEM.  fn must not call back into the store.
 * The primitive exists so that new commands (INCR, APPEND, ...) can be added
 * by a patch of the command layer alone, without touching the store.
 */
typedef ssize_t (*kv_update_fn)(void *arg, const char *old, size_t oldlen, int found,
                                char *buf, size_t cap);
ssize_t kv_store_update(struct kv_store *st, const char *key, size_t klen,
                        kv_update_fn fn, void *arg);

/* ---- kv_net.c ------------------------------------------------------------ */
/* A growable output buffer: the replies of one connection not yet written. */
struct kv_out {
  char *data;
  size_t len, cap;
  int oom; /* an allocation failed: the connection is closed */
};
void kv_out_append(struct kv_out *out, const void *p, size_t n);

/* What the command layer knows about the connection it serves. */
struct kv_session {
  struct kv_store *store;
  unsigned long id; /* connection number, for logs */
};

struct kv_conn;
struct kv_conn *kv_conn_new(int fd, struct kv_store *store, unsigned long id);
/*
 * Called by the worker that got c's (EPOLLONESHOT) event from epfd: does all
 * the work possible without blocking (flush pending replies, read, execute
 * complete lines) and re-arms c in epfd for what it waits for next (input,
 * or output space).  Returns 0, or 1 when the connection is finished: then
 * it has been removed from epfd, closed and freed.
 */
int kv_conn_service(struct kv_conn *c, int epfd);
void kv_conn_free(struct kv_conn *c);

/* ---- kv_commands.c (the updatable command layer) ------------------------- */
/*
 * Executes one request line (no newline; NUL-terminated at line[len]; the
 * layer may modify it) and appends exactly one reply line to out.  Returns 0
 * to keep the connection open, 1 to close it after the reply is written.
 */
int kv_dispatch(struct kv_session *s, char *line, size_t len, struct kv_out *out);
/* Version of the command layer answering this call: "1.0", "1.1", ... */
const char *kv_version_string(void);
/* Appends "STATUS\n" or "STATUS payload\n". */
void kv_format_reply(struct kv_out *out, const char *status, const char *payload,
                     size_t plen);

/* ---- kvstore.c ------------------------------------------------------------ */
/* Open client connections; shown by STATS (conns=N). */
extern atomic_long kv_active_connections;

#endif /* KV_H */
