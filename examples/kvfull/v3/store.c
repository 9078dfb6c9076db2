/* kvfull v3 store: v2's chained hash table; the revision is a long now
 * (v3.xf), and INCR adds one to a numeric value. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kv.h"

struct entry {
  char *key;
  char *value;
  long rev;           /* int in v2; converted by the generated code */
  struct entry *next; /* new in v2: the bucket's chain */
};

struct store {
  size_t nbuckets; /* power of two */
  size_t count;
  struct entry **buckets MOLT_PTRARRAY(nbuckets);
};

struct store store;
static pthread_mutex_t store_lock = PTHREAD_MUTEX_INITIALIZER;

/* FNV-1a; v2.xf computes the same function while it builds the chains. */
static unsigned long hash(const char *s) {
  unsigned long h = 1469598103934665603ul;
  while (*s)
    h = (h ^ (unsigned char)*s++) * 1099511628211ul;
  return h;
}

static struct entry **find(const char *key) {
  struct entry **p = &store.buckets[hash(key) & (store.nbuckets - 1)];
  while (*p && strcmp((*p)->key, key) != 0)
    p = &(*p)->next;
  return p;
}

static void grow(void) {
  size_t nb = store.nbuckets ? store.nbuckets * 2 : 1024;
  struct entry **nbk = calloc(nb, sizeof *nbk);
  if (!nbk) {
    perror("kvfull: calloc");
    abort();
  }
  for (size_t i = 0; i < store.nbuckets; i++) {
    struct entry *e = store.buckets[i], *next;
    for (; e; e = next) {
      next = e->next;
      size_t b = hash(e->key) & (nb - 1);
      e->next = nbk[b];
      nbk[b] = e;
    }
  }
  free(store.buckets);
  store.buckets = nbk;
  store.nbuckets = nb;
}

static long set_locked(const char *key, const char *value, size_t vlen) {
  if (store.count >= store.nbuckets)
    grow();
  char *v = malloc(vlen + 1);
  if (!v)
    abort();
  memcpy(v, value, vlen);
  v[vlen] = 0;
  struct entry **p = find(key);
  if (*p) {
    free((*p)->value);
    (*p)->value = v;
    return ++(*p)->rev;
  }
  struct entry *e = calloc(1, sizeof *e);
  if (!e)
    abort();
  e->key = strdup(key);
  e->value = v;
  e->rev = 1;
  *p = e;
  store.count++;
  return e->rev;
}

long store_set(const char *key, const char *value) {
  pthread_mutex_lock(&store_lock);
  long r = set_locked(key, value, strlen(value));
  pthread_mutex_unlock(&store_lock);
  return r;
}

int store_incr(const char *key, long *result) {
  char buf[32];
  int r = 0;
  pthread_mutex_lock(&store_lock);
  struct entry *e = store.nbuckets ? *find(key) : NULL;
  long v = 0;
  if (e) {
    char *end;
    v = strtol(e->value, &end, 10);
    if (end == e->value || *end)
      r = -1;
  }
  if (r == 0) {
    *result = ++v;
    set_locked(key, buf, (size_t)snprintf(buf, sizeof buf, "%ld", v));
  }
  pthread_mutex_unlock(&store_lock);
  return r;
}

long store_get(const char *key, char *out, size_t outlen) {
  long n = -1;
  pthread_mutex_lock(&store_lock);
  if (store.nbuckets) {
    struct entry *e = *find(key);
    if (e) {
      n = (long)strlen(e->value);
      snprintf(out, outlen, "%s", e->value);
    }
  }
  pthread_mutex_unlock(&store_lock);
  return n;
}

long store_rev(const char *key) {
  long r = -1;
  pthread_mutex_lock(&store_lock);
  if (store.nbuckets) {
    struct entry *e = *find(key);
    if (e)
      r = e->rev;
  }
  pthread_mutex_unlock(&store_lock);
  return r;
}

int store_del(const char *key) {
  int r = 0;
  pthread_mutex_lock(&store_lock);
  if (store.nbuckets) {
    struct entry **p = find(key);
    struct entry *e = *p;
    if (e) {
      *p = e->next;
      free(e->key);
      free(e->value);
      free(e);
      store.count--;
      r = 1;
    }
  }
  pthread_mutex_unlock(&store_lock);
  return r;
}

size_t store_count(void) {
  pthread_mutex_lock(&store_lock);
  size_t n = store.count;
  pthread_mutex_unlock(&store_lock);
  return n;
}

size_t store_fill(size_t n) {
  char key[32], val[32];
  pthread_mutex_lock(&store_lock);
  for (size_t i = 0; i < n; i++) {
    snprintf(key, sizeof key, "fill:%zu", i);
    int vl = snprintf(val, sizeof val, "value-%zu", i);
    set_locked(key, val, (size_t)vl);
  }
  size_t c = store.count;
  pthread_mutex_unlock(&store_lock);
  return c;
}
