/* kvfull v1 store: an open-addressing hash table in one array.
 * A slot holds a key and its value, both heap strings; a deleted slot
 * (a tombstone: no key, dead = 1) keeps probe paths intact.  The array is annotated so that a full update knows its
 * length (MOLT_PTRARRAY): a later version can walk it. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kv.h"

struct entry {
  char *key; /* NULL: empty or deleted */
  char *value;
  int dead; /* deleted: probing goes on past this slot */
};

struct store {
  size_t cap;   /* power of two */
  size_t used;  /* slots with a key (live + tombstones) */
  size_t count; /* live entries */
  struct entry *slots MOLT_PTRARRAY(cap);
};

struct store store;
static pthread_mutex_t store_lock = PTHREAD_MUTEX_INITIALIZER;

static unsigned long hash(const char *s) {
  unsigned long h = 1469598103934665603ul;
  while (*s)
    h = (h ^ (unsigned char)*s++) * 1099511628211ul;
  return h;
}

/* The slot of key, or the first free one on its probe path. */
static struct entry *probe(struct entry *slots, size_t cap, const char *key) {
  size_t i = hash(key) & (cap - 1);
  struct entry *grave = NULL;
  for (;;) {
    struct entry *e = &slots[i];
    if (e->key == NULL) {
      if (!e->dead)
        return grave ? grave : e;
      if (!grave)
        grave = e;
    } else if (strcmp(e->key, key) == 0) {
      return e;
    }
    i = (i + 1) & (cap - 1);
  }
}

static void grow(void) {
  size_t ncap = store.cap ? store.cap * 2 : 1024;
  struct entry *ns = calloc(ncap, sizeof *ns);
  if (!ns) {
    perror("kvfull: calloc");
    abort();
  }
  for (size_t i = 0; i < store.cap; i++) {
    struct entry *e = &store.slots[i];
    if (e->key)
      *probe(ns, ncap, e->key) = *e;
  }
  free(store.slots);
  store.slots = ns;
  store.cap = ncap;
  store.used = store.count;
}

static int set_locked(const char *key, const char *value, size_t vlen) {
  if ((store.used + 1) * 4 >= store.cap * 3)
    grow();
  struct entry *e = probe(store.slots, store.cap, key);
  char *v = malloc(vlen + 1);
  if (!v)
    abort();
  memcpy(v, value, vlen);
  v[vlen] = 0;
  if (e->key) { /* existing */
    free(e->value);
    e->value = v;
    return 0;
  }
  if (e->dead)
    e->dead = 0; /* reusing a tombstone */
  else
    store.used++;
  e->key = strdup(key);
  e->value = v;
  store.count++;
  return 1;
}

int store_set(const char *key, const char *value) {
  pthread_mutex_lock(&store_lock);
  int r = set_locked(key, value, strlen(value));
  pthread_mutex_unlock(&store_lock);
  return r;
}

long store_get(const char *key, char *out, size_t outlen) {
  long n = -1;
  pthread_mutex_lock(&store_lock);
  if (store.cap) {
    struct entry *e = probe(store.slots, store.cap, key);
    if (e->key) {
      n = (long)strlen(e->value);
      snprintf(out, outlen, "%s", e->value);
    }
  }
  pthread_mutex_unlock(&store_lock);
  return n;
}

int store_del(const char *key) {
  int r = 0;
  pthread_mutex_lock(&store_lock);
  if (store.cap) {
    struct entry *e = probe(store.slots, store.cap, key);
    if (e->key) {
      free(e->key);
      free(e->value);
      e->key = e->value = NULL;
      e->dead = 1;
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
    int kl = snprintf(key, sizeof key, "fill:%zu", i);
    int vl = snprintf(val, sizeof val, "value-%zu", i);
    (void)kl;
    set_locked(key, val, (size_t)vl);
  }
  size_t c = store.count;
  pthread_mutex_unlock(&store_lock);
  return c;
}
