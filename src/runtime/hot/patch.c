/* Patch objects: checking a patch file, loading it, resolving its imports
 * against the running program (H6), and the object lifecycle.  An object
 * is a generation owner (core.h): generations count it, and reclamation
 * hands it back to object_release when none points into it any more.
 *
 * Locks: molt__patch_open/reload run with the operation lock held and take
 * molt__rt_lock only for short sections that do not call the dynamic loader
 * (base.h: dlopen/dlclose happen outside molt__rt_lock). */
#include "hot/hot.h"

#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <link.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#define MAX_RECORDS (1u << 20) /* sanity bound on a patch's record counts */
#define MAX_PATCH_BYTES (256 << 20)

static molt__link *objects;
static molt__symtab **symtabs; /* per module index, opened on first use */
static size_t nsymtabs;

static void object_release(molt__owner *o);

molt__object *molt__object_of(molt__owner *o) {
  return o && o->release == object_release ? MOLT__CONTAINER(o, molt__object, owner)
                                           : NULL;
}

static molt__object *object_at(molt__link *l) {
  return l ? MOLT__CONTAINER(l, molt__object, all) : NULL;
}

molt__object *molt__objects_first(void) { return object_at(objects); }
molt__object *molt__objects_next(molt__object *o) { return object_at(o->all.next); }

static const char *module_desc(size_t i) {
  molt__module *m = molt__module_at(i);
  return m && m->path && *m->path ? m->path : "?";
}

/* Which registered module has the build-id the patch was stamped with. */
static int find_target(const molt__patch_note *note, size_t *module, char *err,
                       size_t errlen) {
  molt__rt_lock_acquire();
  int rc = 0;
  if (!molt__module_by_build_id(note->target_build_id, module)) {
    rc = MOLT_EBUILDID;
    if (molt__modules_count() == 0)
      molt__errmsg(err, errlen, "this process has no updatable functions");
    else
      molt__errmsg(err, errlen,
                   "patch was built for build-id %.16s..., but this process runs "
                   "%s with build-id %.16s...; rebuild the patch with "
                   "--molt-target pointing at the running binary",
                   note->target_build_id, module_desc(0),
                   molt__module_at(0)->build_id[0] ? molt__module_at(0)->build_id
                                                   : "(none)");
  }
  molt__rt_lock_release();
  return rc;
}

static const molt__symtab *module_symtab(size_t module, int *rc) {
  if (module >= nsymtabs) {
    size_t n = molt__modules_count();
    molt__symtab **p = realloc(symtabs, n * sizeof *p);
    if (!p) {
      *rc = MOLT_ENOMEM;
      return NULL;
    }
    memset(p + nsymtabs, 0, (n - nsymtabs) * sizeof *p);
    symtabs = p;
    nsymtabs = n;
  }
  if (!symtabs[module]) {
    *rc = molt__symtab_open(molt__module_file(molt__module_at(module)), &symtabs[module]);
    if (*rc < 0)
      return NULL;
  }
  *rc = 0;
  return symtabs[module];
}

static bool bounded_string(const char *s) { return s && memchr(s, '\0', 4096) != NULL; }

/* Resolves every import of obj to the live objects of its module (H6).
 * Called with molt__rt_lock held. */
static int resolve_imports(molt__object *obj, char *err, size_t errlen) {
  int rc;
  const molt__symtab *st = NULL;
  molt__module *m = molt__module_at(obj->module);
  for (const molt__import *im = obj->hdr->imports; im < obj->hdr->imports_end; im++) {
    if (!bounded_string(im->name) || (im->tu && !bounded_string(im->tu)) || !im->slot) {
      molt__errmsg(err, errlen, "patch %s has a malformed import record", obj->path);
      return MOLT_ECORRUPT;
    }
    if (!st && !(st = module_symtab(obj->module, &rc))) {
      molt__errmsg(err, errlen, "cannot read the symbol table of %s: %s", m->path,
                   molt_strerror(rc));
      return rc;
    }
    uintptr_t value;
    rc = molt__symtab_lookup(st, im->name, im->tu, &value);
    if (rc < 0) {
      if (im->tu)
        molt__errmsg(
            err, errlen, "%s: static symbol %s of %s%s", molt_strerror(rc), im->name,
            im->tu,
            rc == MOLT_ENOSYM ? " is not in the running program (was it stripped?)" : "");
      else
        molt__errmsg(err, errlen, "%s: %s is not in the running program",
                     molt_strerror(rc), im->name);
      return rc;
    }
    /* Plain store into the patch's own data: no thread can run the patch
     * before its generation is published with a release store. */
    *im->slot = (void *)(m->base + value);
  }
  return 0;
}

/* dlopens obj->fd and validates the header.  No molt__rt_lock held. */
static int load_handle(molt__object *obj, char *err, size_t errlen) {
  char p[64];
  if (molt__fd_load_path(&obj->file, p, sizeof p) < 0) {
    molt__errmsg(err, errlen, "the process closed molt's copy of %s while it was loaded",
                 obj->path);
    return MOLT_EIO;
  }
  dlerror();
  void *h = dlopen(p, RTLD_NOW | RTLD_LOCAL);
  if (!h) {
    const char *e = dlerror();
    molt__errmsg(err, errlen, "the dynamic loader rejected %s: %s", obj->path,
                 e ? e : "unknown error");
    return MOLT_EDLOPEN;
  }
  const molt__patch_header *hdr = dlsym(h, "molt_patch_header");
  struct link_map *lm = NULL;
  Dl_info info;
  int rc = 0;
  if (!hdr || dlinfo(h, RTLD_DI_LINKMAP, &lm) != 0 || !dladdr(hdr, &info) ||
      (uintptr_t)info.dli_fbase != (uintptr_t)lm->l_addr) {
    molt__errmsg(err, errlen, "%s has no molt_patch_header of its own: not a molt patch",
                 obj->path);
    rc = MOLT_ENOTPATCH;
  } else if (hdr->magic != MOLT__PATCH_MAGIC) {
    molt__errmsg(err, errlen, "%s: bad patch header magic", obj->path);
    rc = MOLT_ENOTPATCH;
  } else if (hdr->abi != MOLT__ABI) {
    molt__errmsg(err, errlen, "%s was built for molt ABI %u, this runtime speaks %u",
                 obj->path, hdr->abi, MOLT__ABI);
    rc = MOLT_EABI;
  } else if (hdr->fns > hdr->fns_end || hdr->imports > hdr->imports_end ||
             (size_t)(hdr->fns_end - hdr->fns) > MAX_RECORDS ||
             (size_t)(hdr->imports_end - hdr->imports) > MAX_RECORDS ||
             (hdr->id && !bounded_string(hdr->id)) ||
             (hdr->description && !bounded_string(hdr->description))) {
    molt__errmsg(err, errlen, "%s: corrupt patch header", obj->path);
    rc = MOLT_ECORRUPT;
  } else if (hdr->fns == hdr->fns_end) {
    molt__errmsg(err, errlen, "%s replaces no function", obj->path);
    rc = MOLT_ENOTPATCH;
  }
  if (rc < 0) {
    dlclose(h);
    return rc;
  }
  for (const molt__patch_fn *f = hdr->fns; f < hdr->fns_end; f++)
    if (!bounded_string(f->name) || (f->tu && !bounded_string(f->tu)) || !f->impl) {
      molt__errmsg(err, errlen, "%s has a malformed function record", obj->path);
      dlclose(h);
      return MOLT_ECORRUPT;
    }
  obj->handle = h;
  obj->hdr = hdr;
  return 0;
}

static void unload_handle(molt__object *obj) {
  if (obj->handle) {
    dlclose(obj->handle);
    obj->handle = NULL;
    obj->hdr = NULL;
  }
}

int molt__patch_open(const char *path, molt__object **out, char *err, size_t errlen) {
  /* R7: opened once and checked; everything after this (note, dlopen,
   * rollback reloads) reads the sealed private copy (file.c). */
  molt__fd file;
  int rc = molt__file_open_checked(path, MAX_PATCH_BYTES, &file, err, errlen);
  if (rc < 0)
    return rc;
  molt__patch_note note;
  if (rc == 0)
    rc = molt__elf_read_patch_note(file.fd, &note, err, errlen);
  size_t module = 0;
  if (rc == 0)
    rc = find_target(&note, &module, err, errlen);
  molt__object *obj = NULL;
  if (rc == 0) {
    obj = calloc(1, sizeof *obj);
    char *p = obj ? strdup(path) : NULL;
    if (!p) {
      free(obj);
      obj = NULL;
      rc = MOLT_ENOMEM;
      molt__errmsg(err, errlen, "out of memory");
    } else {
      obj->path = p;
      obj->file = file;
      obj->module = module;
    }
  }
  if (rc == 0)
    rc = load_handle(obj, err, errlen);
  if (rc == 0) {
    obj->id = strdup(obj->hdr->id && *obj->hdr->id ? obj->hdr->id : "unnamed");
    obj->description = strdup(obj->hdr->description ? obj->hdr->description : "");
    if (!obj->id || !obj->description) {
      rc = MOLT_ENOMEM;
      molt__errmsg(err, errlen, "out of memory");
    }
    obj->owner.id = obj->id;
    obj->owner.release = object_release;
  }
  if (rc == 0) {
    molt__rt_lock_acquire();
    rc = resolve_imports(obj, err, errlen);
    molt__rt_lock_release();
  }
  if (rc < 0) {
    if (obj) {
      unload_handle(obj);
      free(obj->id);
      free(obj->description);
      free(obj->path);
      free(obj);
    }
    molt__fd_close(&file);
    return rc;
  }
  molt__rt_lock_acquire();
  molt__list_push(&objects, &obj->all);
  molt__rt_lock_release();
  *out = obj;
  return 0;
}

int molt__patch_reload(molt__object *obj, char *err, size_t errlen) {
  if (obj->handle)
    return 0;
  if (!molt__fd_ours(&obj->file)) {
    /* Its number may name another file now: never loaded, never closed. */
    molt__errmsg(err, errlen,
                 "the process closed molt's copy of patch %s (%s); rollback is not "
                 "possible",
                 obj->id, obj->path);
    return MOLT_EIO;
  }
  int rc = load_handle(obj, err, errlen);
  if (rc < 0)
    return rc;
  molt__rt_lock_acquire();
  rc = resolve_imports(obj, err, errlen);
  molt__rt_lock_release();
  if (rc < 0)
    unload_handle(obj);
  else
    molt__log(MOLT__EV_LOAD, molt__gen_number_now(), obj->id, "reloaded %s for rollback",
              obj->path);
  return rc;
}

static int by_index_cmp(const void *a, const void *b) {
  uint32_t x = ((const struct molt__by_index *)a)->index;
  uint32_t y = ((const struct molt__by_index *)b)->index;
  return x < y ? -1 : x > y;
}

/* Position in o->hdr->fns of o's version of table entry idx. */
static uint32_t rec_of(const molt__object *o, uint32_t idx) {
  struct molt__by_index key = {idx, 0};
  const struct molt__by_index *hit =
      bsearch(&key, o->by_index, o->nby_index, sizeof key, by_index_cmp);
  return hit ? hit->rec : 0; /* always found: o owns the entry */
}

int molt__patch_build_gen(molt__object *obj, const molt__gen *from, molt__gen **out,
                          char *err, size_t errlen) {
  molt__module *m = molt__module_at(obj->module);
  size_t n = (size_t)(obj->hdr->fns_end - obj->hdr->fns);
  molt__fn_desc **descs = calloc(n, sizeof *descs);
  if (!descs) {
    molt__errmsg(err, errlen, "out of memory");
    return MOLT_ENOMEM;
  }
  int rc = 0;
  for (size_t i = 0; i < n; i++) {
    const molt__patch_fn *f = &obj->hdr->fns[i];
    descs[i] = molt__module_find_fn(m, f->name, f->tu);
    if (!descs[i]) {
      molt__errmsg(err, errlen,
                   "patch %s replaces %s%s%s, which is not an updatable function "
                   "of %s",
                   obj->id, f->name, f->tu ? " in " : "", f->tu ? f->tu : "", m->path);
      rc = MOLT_ENOFUNC;
      break;
    }
  }
  if (rc == 0 && !obj->by_index) {
    obj->by_index = malloc(n * sizeof *obj->by_index);
    if (!obj->by_index) {
      molt__errmsg(err, errlen, "out of memory");
      rc = MOLT_ENOMEM;
    } else {
      for (size_t i = 0; i < n; i++)
        obj->by_index[i] = (struct molt__by_index){descs[i]->index, (uint32_t)i};
      qsort(obj->by_index, n, sizeof *obj->by_index, by_index_cmp);
      obj->nby_index = n;
    }
  }
  molt__gen *g = NULL;
  if (rc == 0 && (rc = molt__gen_new(from, true, &g)) < 0)
    molt__errmsg(err, errlen, "%s", molt_strerror(rc));
  if (rc == 0 && !obj->prev) {
    /* Remember what we replace, for rollback (only on the first apply of
     * this object; a reload for rollback does not come here). */
    obj->prev = calloc(n, sizeof *obj->prev);
    if (!obj->prev) {
      molt__gen_discard(g);
      molt__errmsg(err, errlen, "out of memory");
      rc = MOLT_ENOMEM;
    } else {
      molt__owner *const *owners = molt__gen_owners(from);
      for (size_t i = 0; i < n; i++) {
        uint32_t idx = descs[i]->index;
        obj->prev[i].index = idx;
        molt__object *o =
            molt__object_of(owners && idx < from->size ? owners[idx] : NULL);
        obj->prev[i].owner = o;
        obj->prev[i].rec = o ? rec_of(o, idx) : 0;
        if (o)
          o->prev_refs++;
      }
      obj->nprev = n;
    }
  }
  if (rc == 0) {
    for (size_t i = 0; i < n; i++)
      molt__gen_set(g, descs[i]->index, obj->hdr->fns[i].impl, &obj->owner);
    *out = g;
  }
  free(descs);
  return rc;
}

void molt__object_leave_history(molt__object *obj) {
  obj->in_history = false;
  /* Nobody can roll back over this object any more, so the objects that
   * supplied what it replaced need not stay reloadable on its account. */
  for (size_t i = 0; i < obj->nprev; i++) {
    molt__object *o = obj->prev[i].owner;
    if (o) {
      o->prev_refs--;
      molt__object_free_if_unused(o);
    }
  }
  free(obj->prev);
  obj->prev = NULL;
  obj->nprev = 0;
  molt__object_free_if_unused(obj);
}

void molt__object_free_if_unused(molt__object *obj) {
  if (obj->handle || obj->owner.gen_refs || obj->in_history || obj->prev_refs)
    return;
  molt__list_unlink(&objects, &obj->all);
  molt__fd_close(&obj->file); /* unless the host took the number */
  free(obj->by_index);
  free(obj->prev);
  free(obj->id);
  free(obj->description);
  free(obj->path);
  free(obj);
}

/* No live generation points into the object any more (reclamation, op_lock
 * held, molt__rt_lock not held): unload it; it stays known (and its file
 * kept) while the rollback history may need it again. */
static void object_release(molt__owner *owner) {
  molt__object *o = MOLT__CONTAINER(owner, molt__object, owner);
  if (!o->handle)
    return;
  char id[64];
  snprintf(id, sizeof id, "%s", o->id);
  uint64_t gen = o->gen;
  /* dlclose outside molt__rt_lock (lock order, base.h). */
  unload_handle(o);
  molt__rt_lock_acquire();
  molt__log(MOLT__EV_UNLOAD, gen, id, "unloaded %s: no thread can run its code", o->path);
  molt__object_free_if_unused(o);
  molt__rt_lock_release();
}

void molt__object_drop_unused(molt__object *obj) {
  molt__rt_lock_acquire();
  bool close_it = obj->handle && !obj->owner.gen_refs;
  molt__rt_lock_release();
  if (close_it) {
    object_release(&obj->owner);
  } else {
    molt__rt_lock_acquire();
    molt__object_free_if_unused(obj);
    molt__rt_lock_release();
  }
}
