/*
 * kv_store.c — the key-value store: a fixed-size chained hash table whose
 * buckets are protected by a smaller array of striped mutexes.
 *
 * Why fixed size and striped locks: the demo needs many threads to hit the
 * store concurrently while the command layer is being patched, and a table
 * that never resizes needs no global lock at all.  Bucket b is protected by
 * lock (b & (nlocks - 1)); every access to a chain or an entry of it holds
 * that lock.  The key count is a separate atomic counter, updated inside the
 * lock by the thread that changed the chain.
 *
 * This file is deliberately not updatable: it holds the long-lived state,
 * and the live-update demo patches only the command layer above it.
 */
#include "kv.h"

#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

struct kv_entry {
  struct kv_entry *next;
  uint64_t hash;
  char *val;
  size_t vlen, klen;
  char key[]; /* klen bytes, not NUL-terminated */
};

/* One lock per cache line, so threads that hit neighbouring stripes do not
 * bounce the same line between cores. */
struct kv_lock {
  pthread_mutex_t m;
  char pad[64 - sizeof(pthread_mutex_t) % 64];
};

struct kv_store {
  size_t nbuckets, nlocks; /* powers of two */
  struct kv_entry **buckets;
  struct kv_lock *locks;
  /* relaxed: a statistic, read without synchronising with the chains. */
  atomic_size_t count;
};

static size_t pow2_at_least(size_t n) {
  size_t p = 1;
  while (p < n)
    p <<= 1;
  return p;
}

/* FNV-1a: simple, good enough spread for short keys. */
static uint64_t hash_key(const char *k, size_t n) {
  uint64_t h = 1469598103934665603ull;
  for (size_t i = 0; i < n; i++) {
    h ^= (unsigned char)k[i];
    h *= 1099511628211ull;
  }
  return h;
}

struct kv_store *kv_store_new(size_t nbuckets, size_t nlocks) {
  struct kv_store *st = calloc(1, sizeof *st);
  if (!st)
    return NULL;
  st->nbuckets = pow2_at_least(nbuckets ? nbuckets : 1);
  st->nlocks = pow2_at_least(nlocks ? nlocks : 1);
  if (st->nlocks > st->nbuckets)
    st->nlocks = st->nbuckets;
  st->buckets = calloc(st->nbuckets, sizeof *st->buckets);
  st->locks = aligned_alloc(64, st->nlocks * sizeof *st->locks);
  if (!st->buckets || !st->locks) {
    free(st->buckets);
    free(st->locks);
    free(st);
    return NULL;
  }
  for (size_t i = 0; i < st->nlocks; i++)
    pthread_mutex_init(&st->locks[i].m, NULL);
  atomic_init(&st->count, 0);
  return st;
}

void kv_store_free(struct kv_store *st) {
  if (!st)
    return;
  for (size_t b = 0; b < st->nbuckets; b++) {
    struct kv_entry *e = st->buckets[b], *n;
    for (; e; e = n) {
      n = e->next;
      free(e->val);
      free(e);
    }
  }
  for (size_t i = 0; i < st->nlocks; i++)
    pthread_mutex_destroy(&st->locks[i].m);
  free(st->locks);
  free(st->buckets);
  free(st);
}

/* Locks the stripe of `h` and returns the head pointer of its bucket. */
static struct kv_entry **lock_bucket(struct kv_store *st, uint64_t h,
                                     pthread_mutex_t **lock) {
  size_t b = (size_t)h & (st->nbuckets - 1);
  *lock = &st->locks[b & (st->nlocks - 1)].m;
  pthread_mutex_lock(*lock);
  return &st->buckets[b];
}

/* Finds the link that points at the entry for key (or the final NULL link).
 * Caller holds the bucket's lock. */
static struct kv_entry **find_link(struct kv_entry **head, uint64_t h, const char *key,
                                   size_t klen) {
  struct kv_entry **pp = head;
  for (; *pp; pp = &(*pp)->next) {
    struct kv_entry *e = *pp;
    if (e->hash == h && e->klen == klen && memcmp(e->key, key, klen) == 0)
      break;
  }
  return pp;
}

ssize_t kv_store_get(struct kv_store *st, const char *key, size_t klen, char *buf,
                     size_t cap) {
  uint64_t h = hash_key(key, klen);
  pthread_mutex_t *lock;
  struct kv_entry **pp = find_link(lock_bucket(st, h, &lock), h, key, klen);
  ssize_t n = -1;
  if (*pp) {
    /* Copy under the lock: a concurrent SET frees the old value. */
    n = (ssize_t)(*pp)->vlen;
    memcpy(buf, (*pp)->val, (*pp)->vlen < cap ? (*pp)->vlen : cap);
  }
  pthread_mutex_unlock(lock);
  return n;
}

int kv_store_set(struct kv_store *st, const char *key, size_t klen, const char *val,
                 size_t vlen) {
  uint64_t h = hash_key(key, klen);
  /* Allocate before locking: keeps the critical section short. */
  char *v = malloc(vlen ? vlen : 1);
  struct kv_entry *fresh = malloc(sizeof *fresh + klen);
  if (!v || !fresh) {
    free(v);
    free(fresh);
    return -1;
  }
  memcpy(v, val, vlen);
  pthread_mutex_t *lock;
  struct kv_entry **pp = find_link(lock_bucket(st, h, &lock), h, key, klen);
  char *old = NULL;
  int created = 0;
  if (*pp) {
    old = (*pp)->val;
    (*pp)->val = v;
    (*pp)->vlen = vlen;
  } else {
    fresh->next = NULL;
    fresh->hash = h;
    fresh->val = v;
    fresh->vlen = vlen;
    fresh->klen = klen;
    memcpy(fresh->key, key, klen);
    *pp = fresh;
    fresh = NULL;
    created = 1;
    atomic_fetch_add_explicit(&st->count, 1, memory_order_relaxed);
  }
  pthread_mutex_unlock(lock);
  free(old);
  free(fresh);
  return created;
}

int kv_store_del(struct kv_store *st, const char *key, size_t klen) {
  uint64_t h = hash_key(key, klen);
  pthread_mutex_t *lock;
  struct kv_entry **pp = find_link(lock_bucket(st, h, &lock), h, key, klen);
  struct kv_entry *e = *pp;
  if (e) {
    *pp = e->next;
    atomic_fetch_sub_explicit(&st->count, 1, memory_order_relaxed);
  }
  pthread_mutex_unlock(lock);
  if (!e)
    return 0;
  free(e->val);
  free(e);
  return 1;
}

size_t kv_store_count(struct kv_store *st) {
  return atomic_load_explicit(&st->count, memory_order_relaxed);
}

ssize_t kv_store_update(struct kv_store *st, const char *key, size_t klen,
                        kv_update_fn fn, void *arg) {
  uint64_t h = hash_key(key, klen);
  /* The callback writes into a private buffer; the stored copy is made with
   * the exact length afterwards.  Heap, not stack: worker stacks are small
   * and KV_MAX_LINE is not. */
  char *buf = malloc(KV_MAX_LINE);
  struct kv_entry *fresh = malloc(sizeof *fresh + klen);
  if (!buf || !fresh) {
    free(buf);
    free(fresh);
    return -ENOMEM;
  }
  pthread_mutex_t *lock;
  struct kv_entry **pp = find_link(lock_bucket(st, h, &lock), h, key, klen);
  struct kv_entry *e = *pp;
  ssize_t n = e ? fn(arg, e->val, e->vlen, 1, buf, KV_MAX_LINE)
                : fn(arg, NULL, 0, 0, buf, KV_MAX_LINE);
  char *old = NULL;
  if (n >= 0) {
    char *v = malloc(n ? (size_t)n : 1);
    if (!v) {
      n = -ENOMEM;
    } else {
      memcpy(v, buf, (size_t)n);
      if (e) {
        old = e->val;
        e->val = v;
        e->vlen = (size_t)n;
      } else {
        fresh->next = NULL;
        fresh->hash = h;
        fresh->val = v;
        fresh->vlen = (size_t)n;
        fresh->klen = klen;
        memcpy(fresh->key, key, klen);
        *pp = fresh;
        fresh = NULL;
        atomic_fetch_add_explicit(&st->count, 1, memory_order_relaxed);
      }
    }
  }
  pthread_mutex_unlock(lock);
  free(old);
  free(fresh);
  free(buf);
  return n;
}
