/* Program modules (the executable and molt-built shared objects) and their
 * updatable functions.  All state here is protected by molt__rt_lock. */
#include "core/core.h"

#include <link.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static molt__module *mods;
static size_t nmods, capmods;
static uint32_t nfns;

size_t molt__modules_count(void) { return nmods; }
molt__module *molt__module_at(size_t i) { return i < nmods ? &mods[i] : NULL; }
uint32_t molt__fn_count(void) { return nfns; }

molt__fn_desc *molt__fn_at(uint32_t index) {
  for (size_t i = 0; i < nmods; i++) {
    molt__module *m = &mods[i];
    uint32_t n = (uint32_t)(m->stop - m->start);
    if (index >= m->first_index && index < m->first_index + n)
      return &m->start[index - m->first_index];
  }
  return NULL;
}

molt__module *molt__module_by_build_id(const char *hex, size_t *i) {
  if (!hex || !*hex)
    return NULL;
  for (size_t k = 0; k < nmods; k++)
    if (mods[k].build_id[0] && strcmp(mods[k].build_id, hex) == 0) {
      *i = k;
      return &mods[k];
    }
  return NULL;
}

static const char *base_name(const char *p) {
  const char *s = strrchr(p, '/');
  return s ? s + 1 : p;
}

/* FNV-1a over the name and, for statics, the basename of their file. */
static uint64_t key_hash(const char *name, const char *tu_base) {
  uint64_t h = 1469598103934665603ull;
  for (const char *p = name; *p; p++)
    h = (h ^ (unsigned char)*p) * 1099511628211ull;
  h = (h ^ 0xff) * 1099511628211ull; /* separator: "ab"+"c" != "a"+"bc" */
  if (tu_base)
    for (const char *p = tu_base; *p; p++)
      h = (h ^ (unsigned char)*p) * 1099511628211ull;
  return h;
}

static bool desc_matches(const molt__fn_desc *d, const char *name, const char *tu_base) {
  if (d->magic != MOLT__DESC_MAGIC || strcmp(d->name, name) != 0)
    return false;
  if (d->is_static)
    return tu_base && strcmp(base_name(d->tu), tu_base) == 0;
  return !tu_base;
}

static bool build_index(molt__module *m) {
  size_t n = (size_t)(m->stop - m->start), cap = 16;
  while (cap < 2 * n)
    cap *= 2;
  molt__fn_desc **t = calloc(cap, sizeof *t);
  if (!t)
    return false;
  for (molt__fn_desc *d = m->start; d < m->stop; d++) {
    if (d->magic != MOLT__DESC_MAGIC)
      continue;
    size_t i = key_hash(d->name, d->is_static ? base_name(d->tu) : NULL) & (cap - 1);
    while (t[i])
      i = (i + 1) & (cap - 1);
    t[i] = d;
  }
  m->index = t;
  m->index_mask = cap - 1;
  return true;
}

molt__fn_desc *molt__module_find_fn(molt__module *m, const char *name, const char *tu) {
  const char *tu_base = tu ? base_name(tu) : NULL;
  if (!m->index && !build_index(m)) {
    /* Out of memory: a linear scan still gives the right answer. */
    for (molt__fn_desc *d = m->start; d < m->stop; d++)
      if (desc_matches(d, name, tu_base))
        return d;
    return NULL;
  }
  for (size_t i = key_hash(name, tu_base) & m->index_mask; m->index[i];
       i = (i + 1) & m->index_mask)
    if (desc_matches(m->index[i], name, tu_base))
      return m->index[i];
  return NULL;
}

/* Called from a constructor of every TU that includes molt.h (priority
 * 101, so before user constructors): the module's descriptors get their
 * table indices and the current generation is extended with their version
 * 0 bodies.  The only possible failure is running out of memory during
 * start-up; it cannot be reported to anyone, so it puts the runtime into the
 * refusing state (calls into such a module would then fault: there is no
 * table to dispatch through). */
void molt__register_module(uint32_t abi, molt__fn_desc *start, molt__fn_desc *stop) {
  if (abi != MOLT__ABI) {
    /* Built against another molt/abi.h: its descriptors and entries may
     * not have the layout read below, so nothing of it is touched (its
     * functions keep running version 0) and no update is accepted any
     * more, since a patch could not reach its functions. */
    char path[4096] = "", hex[MOLT__BUILD_ID_HEX_MAX + 1];
    uintptr_t base;
    if (molt__elf_build_id_of_loaded((const void *)start, hex, sizeof hex, &base, path,
                                     sizeof path) < 0 ||
        !path[0])
      snprintf(path, sizeof path, "the module at %p", (void *)start);
    molt__fail(
        "cannot register the updatable functions of %s: it was built for molt ABI %u, "
        "this runtime speaks %u (rebuild it with this release's moltcc or molt.h)",
        path, (unsigned)abi, MOLT__ABI);
    return;
  }
  if (!start || stop <= start)
    return;
  molt__rt_lock_acquire();
  for (size_t i = 0; i < nmods; i++)
    if (mods[i].start == start) {
      molt__rt_lock_release();
      return;
    }
  if (nmods == capmods) {
    size_t cap = capmods ? capmods * 2 : 8;
    molt__module *p = realloc(mods, cap * sizeof *p);
    if (!p)
      goto fail;
    mods = p;
    capmods = cap;
  }
  molt__module *m = &mods[nmods];
  memset(m, 0, sizeof *m);
  m->start = start;
  m->stop = stop;
  m->first_index = nfns;
  char path[4096] = "";
  int rc = molt__elf_build_id_of_loaded(start, m->build_id, sizeof m->build_id, &m->base,
                                        path, sizeof path);
  if (rc < 0)
    m->build_id[0] = '\0'; /* no build-id: patches cannot target it (H9) */
  m->path = strdup(path);
  uint32_t n = (uint32_t)(stop - start);
  char why[512];
  rc = molt__entries_add(start, nfns, n, why, sizeof why);
  if (rc < 0) {
    /* Without a usable entry a patch could not reach the function: refuse
     * every update rather than apply one that silently misses it. */
    free(m->path);
    molt__rt_lock_release();
    molt__fail("cannot register the updatable functions of %s: %s", path[0] ? path : "?",
               why);
    return;
  }
  rc = molt__gen_add_functions(start, nfns, n);
  if (rc < 0) {
    free(m->path);
    molt__rt_lock_release();
    molt__fail("cannot register %u updatable functions of %s: %s", n,
               path[0] ? path : "?", molt_strerror(rc));
    return;
  }
  for (uint32_t i = 0; i < n; i++)
    start[i].index = nfns + i;
  nfns += n;
  nmods++;
  rc = molt__gen_extend_current();
  if (rc < 0) {
    molt__rt_lock_release();
    molt__fail("cannot register %u updatable functions of %s: %s", n,
               path[0] ? path : "?", molt_strerror(rc));
    return;
  }
  molt__rt_lock_release();
  return;
fail:
  molt__rt_lock_release();
  molt__fail("out of memory while registering a module");
}

static int first_object(struct dl_phdr_info *info, size_t size, void *data) {
  (void)size;
  *(uintptr_t *)data = (uintptr_t)info->dlpi_addr;
  return 1; /* the first object dl_iterate_phdr reports is the executable */
}

const char *molt__module_file(const molt__module *m) {
  uintptr_t main_base = 0;
  dl_iterate_phdr(first_object, &main_base);
  /* The executable is read through /proc/self/exe, which stays the file
   * that was executed even if the path has been rebuilt since. */
  return m == &mods[0] && m->start && m->base == main_base ? "/proc/self/exe" : m->path;
}
