/* kvfull v1 -- a small threaded TCP key-value server built as a molt
 * program image (moltcc --molt-program) and updated whole with
 * `molt update`.  See ../README.md. */
#ifndef KV_H
#define KV_H

#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>

#include <molt.h>

#define KV_WORKERS_MAX 16
#define KV_CONNS_MAX 256
#define KV_LINE_MAX 1024

/* One client connection.  Owned by one worker, which alone reads and
 * writes rbuf/rlen; the acceptor fills a free slot (fd == -1) under
 * conn_lock, the owner frees it under conn_lock.  A half-received request
 * stays in rbuf across an update: the array is a global and migrates. */
struct conn {
  int fd;               /* -1: free slot */
  int worker;           /* owning worker */
  size_t rlen;          /* bytes in rbuf */
  unsigned long served; /* requests answered on this connection */
  char rbuf[KV_LINE_MAX];
};

struct worker {
  int wakefd;   /* eventfd: new connection, update pending, stop */
  int restarts; /* times this worker was relaunched by an update */
  unsigned long served;
};

extern struct conn conns[KV_CONNS_MAX];
extern struct worker workers[KV_WORKERS_MAX];
extern pthread_t worker_threads[KV_WORKERS_MAX];
extern int nworkers;
extern pthread_mutex_t conn_lock;
extern unsigned long total_served; /* every request, all workers */
/* Set by the SIGINT/SIGTERM handler, polled by the acceptor and the
 * workers: relaxed, it publishes nothing (the acceptor joins the workers
 * before it reads what they wrote). */
extern _Atomic int stopping;

/* worker.c */
void *worker_main(void *arg);
void wake_worker(int id);

/* store.c: the key-value table.  Values are copied out under the lock. */
int store_set(const char *key, const char *value);         /* 1: new key */
long store_get(const char *key, char *out, size_t outlen); /* -1: missing */
int store_del(const char *key);                            /* 1: deleted */
size_t store_count(void);
size_t store_fill(size_t n); /* bench: n keys fill:<i> */

#define KV_VERSION "1"

#endif
