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
#include <elf.h>
#include <errno.h>
#include <inttypes.h>
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
/* Provenance and pinned reasons may be longer (file lists); NULL is "". */
static bool bounded_text(const char *s) { return !s || memchr(s, '\0', 1 << 16) != NULL; }

static bool is_import_name(const char *s) {
  return strncmp(s, MOLT__IMPORT_PREFIX, sizeof MOLT__IMPORT_PREFIX - 1) == 0;
}

static int import_by_symbol(const void *a, const void *b) {
  const molt__import *x = *(const molt__import *const *)a,
                     *y = *(const molt__import *const *)b;
  return strcmp(x->symbol, y->symbol);
}

static bool tls_reloc(uint32_t type) {
  switch (type) {
  case R_X86_64_DTPMOD64:
  case R_X86_64_DTPOFF64:
  case R_X86_64_TPOFF64:
  case R_X86_64_TLSDESC:
    return true;
  default:
    return false;
  }
}

typedef struct import_write {
  uintptr_t addr, value;
} import_write;

/* The import record `sym` names, the message for a refusal otherwise. */
static const char *describe(const molt__import *im, char *buf, size_t len) {
  if (im->tu)
    snprintf(buf, len, "%s (static of %s)", im->name, im->tu);
  else
    snprintf(buf, len, "%s", im->name);
  return buf;
}

/*
 * Binds obj's imports to the live objects of its module (H6), after dlopen
 * and before anything of the patch can run.  The dynamic relocations of
 * the patch file (the sealed copy the loader mapped, read bounds-checked:
 * common/elf.c) that name an import symbol get the address of the
 * program's object: S for GLOB_DAT and JUMP_SLOT, S + A for a data word
 * (R_X86_64_64).  moltstamp made the import symbols weak, so the loader
 * left these words 0.  Refused, with nothing written: a name the program
 * does not have, a molt.imp. symbol the table does not list, an import the
 * patch defines itself, a thread-local import, any other relocation type
 * against an import, a word outside the patch's writable segments.
 * Called with molt__rt_lock held (module table, symbol tables).
 */
static int resolve_imports(molt__object *obj, char *err, size_t errlen) {
  const molt__import *imports = obj->hdr->imports;
  size_t nimp = (size_t)(obj->hdr->imports_end - imports);
  molt__module *m = molt__module_at(obj->module);
  for (size_t i = 0; i < nimp; i++) {
    const molt__import *im = &imports[i];
    if (!bounded_string(im->symbol) || !bounded_string(im->name) ||
        (im->tu && !bounded_string(im->tu))) {
      molt__errmsg(err, errlen, "patch %s has a malformed import record", obj->path);
      return MOLT_ECORRUPT;
    }
  }
  struct link_map *lm = NULL;
  if (dlinfo(obj->handle, RTLD_DI_LINKMAP, &lm) != 0 || !lm) {
    molt__errmsg(err, errlen, "the dynamic loader has no link map for %s", obj->path);
    return MOLT_EINTERNAL;
  }
  molt__dynrels dr;
  /* The sealed copy is read where it is kept; a number the host took over
   * since is not ours to read (base/fd.c). */
  if (!molt__fd_ours(&obj->file)) {
    molt__errmsg(err, errlen, "the process closed molt's copy of %s while it was loaded",
                 obj->path);
    return MOLT_EIO;
  }
  int rc = molt__elf_read_dynrels(obj->file.fd, &dr, err, errlen);
  if (rc < 0)
    return rc;
  const molt__import **sorted = calloc(nimp ? nimp : 1, sizeof *sorted);
  uintptr_t *value = calloc(nimp ? nimp : 1, sizeof *value); /* 0: not resolved yet */
  import_write *writes = calloc(dr.nrels ? dr.nrels : 1, sizeof *writes);
  size_t nwrites = 0;
  bool relro = false;
  const molt__symtab *st = NULL;
  char what[512];
  if (!sorted || !value || !writes) {
    rc = MOLT_ENOMEM;
    molt__errmsg(err, errlen, "out of memory");
    goto out;
  }
  for (size_t i = 0; i < nimp; i++)
    sorted[i] = &imports[i];
  qsort(sorted, nimp, sizeof *sorted, import_by_symbol);
  for (size_t i = 1; i < nimp; i++) {
    const molt__import *a = sorted[i - 1], *b = sorted[i];
    if (strcmp(a->symbol, b->symbol) == 0 &&
        (strcmp(a->name, b->name) != 0 || !a->tu != !b->tu ||
         (a->tu && strcmp(a->tu, b->tu) != 0))) {
      molt__errmsg(err, errlen, "patch %s lists import symbol %s for two objects",
                   obj->id, a->symbol);
      rc = MOLT_ECORRUPT;
      goto out;
    }
  }
  for (size_t r = 0; r < dr.nrels; r++) {
    const molt__dynrel *rel = &dr.rels[r];
    if (rel->sym == 0)
      continue;
    const molt__dynsym *sym = &dr.syms[rel->sym];
    molt__import key = {.symbol = sym->name};
    const molt__import *kp = &key, **hit = nimp
                                               ? bsearch(&kp, sorted, nimp,
                                                         sizeof *sorted, import_by_symbol)
                                               : NULL;
    if (!hit) {
      if (is_import_name(sym->name)) {
        molt__errmsg(err, errlen,
                     "patch %s refers to import symbol %s, which its import table does "
                     "not list",
                     obj->id, sym->name);
        rc = MOLT_ECORRUPT;
        goto out;
      }
      continue; /* an ordinary symbol: the dynamic loader bound it */
    }
    size_t idx = (size_t)(hit - sorted);
    const molt__import *im = *hit;
    describe(im, what, sizeof what);
    if (sym->defined) {
      molt__errmsg(err, errlen, "patch %s defines its import %s itself", obj->id, what);
      rc = MOLT_ECORRUPT;
      goto out;
    }
    if (sym->type == STT_TLS || tls_reloc(rel->type)) {
      molt__errmsg(err, errlen,
                   "patch %s imports thread-local variable %s; a patch cannot reach the "
                   "program's thread-local variables",
                   obj->id, what);
      rc = MOLT_ECORRUPT;
      goto out;
    }
    if (rel->type != R_X86_64_GLOB_DAT && rel->type != R_X86_64_JUMP_SLOT &&
        rel->type != R_X86_64_64) {
      molt__errmsg(err, errlen,
                   "patch %s refers to its import %s with relocation type %" PRIu32
                   " (only GOT entries and data words can be bound; compile patches "
                   "with -fPIC)",
                   obj->id, what, rel->type);
      rc = MOLT_ECORRUPT;
      goto out;
    }
    int place = molt__dynrels_place(&dr, rel->offset, sizeof(uintptr_t));
    if (place == 0) {
      molt__errmsg(err, errlen,
                   "patch %s: the relocation of its import %s is outside its writable "
                   "segments",
                   obj->id, what);
      rc = MOLT_ECORRUPT;
      goto out;
    }
    relro |= place == 2;
    if (!value[idx]) {
      uintptr_t v;
      if (!st && !(st = module_symtab(obj->module, &rc))) {
        molt__errmsg(err, errlen, "cannot read the symbol table of %s: %s", m->path,
                     molt_strerror(rc));
        goto out;
      }
      rc = molt__symtab_lookup(st, im->name, im->tu, &v);
      if (rc < 0) {
        if (im->tu)
          molt__errmsg(err, errlen, "%s: static symbol %s of %s%s", molt_strerror(rc),
                       im->name, im->tu,
                       rc == MOLT_ENOSYM
                           ? " is not in the running program (was it stripped?)"
                           : "");
        else
          molt__errmsg(err, errlen, "%s: %s is not in the running program",
                       molt_strerror(rc), im->name);
        goto out;
      }
      value[idx] = m->base + v;
    }
    writes[nwrites].addr = lm->l_addr + rel->offset;
    writes[nwrites].value =
        value[idx] + (rel->type == R_X86_64_64 ? (uintptr_t)rel->addend : 0);
    nwrites++;
  }
  /* The RELRO part is read-only once the loader is done: writable only for
   * these writes.  The loader protected [start, end) rounded inwards to
   * pages (the last partial page stays writable with the data after it).
   * Plain stores into the patch's own memory: no thread can run the patch
   * before its generation is published with a release store. */
  uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE);
  uintptr_t rs = (lm->l_addr + dr.relro_start) & ~(page - 1);
  uintptr_t re = (lm->l_addr + dr.relro_end) & ~(page - 1);
  bool unprotected = false;
  if (relro && re > rs) {
    if (mprotect((void *)rs, re - rs, PROT_READ | PROT_WRITE) != 0) {
      rc = molt__from_errno(errno);
      molt__errmsg(err, errlen, "cannot make the relocated data of %s writable: %s",
                   obj->path, strerror(errno));
      goto out;
    }
    unprotected = true;
  }
  for (size_t i = 0; i < nwrites; i++)
    memcpy((void *)writes[i].addr, &writes[i].value, sizeof writes[i].value);
  if (unprotected && mprotect((void *)rs, re - rs, PROT_READ) != 0) {
    rc = molt__from_errno(errno);
    molt__errmsg(err, errlen, "cannot protect the relocated data of %s again: %s",
                 obj->path, strerror(errno));
    goto out;
  }
  rc = 0;
out:
  free(sorted);
  free(value);
  free(writes);
  molt__elf_free_dynrels(&dr);
  return rc;
}

/* Frees an object's record and what it owns (not its handle or file). */
static void free_record(molt__object *obj) {
  molt__callback_release(obj->stuck_run);
  free(obj->by_index);
  free(obj->prev);
  free(obj->id);
  free(obj->description);
  free(obj->provenance);
  free(obj->pinned_reasons);
  free(obj->replaced);
  free(obj->path);
  free(obj);
}

/* Whether the process has already loaded the library a patch names in
 * DT_NEEDED: RTLD_NOLOAD maps nothing and runs nothing, it only finds an
 * object that is there (by name or soname).  A patch may not bring a new
 * library, whose constructors would run inside the host. */
static bool needed_is_loaded(const char *name, void *arg) {
  (void)arg;
  void *h = dlopen(name, RTLD_LAZY | RTLD_NOLOAD);
  if (!h)
    return false;
  dlclose(h); /* drops the reference RTLD_NOLOAD took, unloads nothing */
  return true;
}

/* The patch's own memory as the loader mapped it (its PT_LOAD segments at
 * the load base): every pointer in its header and records must point
 * there, since a damaged relocation or data word can make one point
 * anywhere (issue 16).  Strings must end inside their segment. */
typedef struct object_map {
  uintptr_t base;
  molt__dynrels dr;
} object_map;

static bool in_object(const object_map *m, const void *p, size_t len, bool code) {
  uintptr_t a = (uintptr_t)p, end;
  if (a < m->base || __builtin_add_overflow(a, len, &end))
    return false;
  for (size_t i = 0; i < m->dr.nsegs; i++) {
    uintptr_t s = m->base + m->dr.segs[i].start, e = m->base + m->dr.segs[i].end;
    if (a >= s && end <= e && (!code || m->dr.segs[i].executable))
      return true;
  }
  return false;
}

/* A NUL-terminated string of at most `max` bytes inside the object. */
static bool object_string(const object_map *m, const char *s, size_t max) {
  if (!in_object(m, s, 1, false))
    return false;
  for (size_t i = 0; i < m->dr.nsegs; i++) {
    uintptr_t st = m->base + m->dr.segs[i].start, e = m->base + m->dr.segs[i].end;
    if ((uintptr_t)s >= st && (uintptr_t)s < e) {
      size_t room = e - (uintptr_t)s;
      return memchr(s, '\0', room < max ? room : max) != NULL;
    }
  }
  return false;
}

/* Every pointer of hdr (and of its function and import records) points
 * into the object; strings end there.  The records are only read after
 * their own range is known to be inside. */
static bool header_inside(const object_map *m, const molt__patch_header *hdr) {
  if (!in_object(m, hdr, sizeof *hdr, false))
    return false;
  if ((hdr->id && !object_string(m, hdr->id, 4096)) ||
      (hdr->description && !object_string(m, hdr->description, 4096)) ||
      (hdr->provenance && !object_string(m, hdr->provenance, 1 << 16)) ||
      (hdr->pinned_reasons && !object_string(m, hdr->pinned_reasons, 1 << 16)))
    return false;
  if (hdr->fns > hdr->fns_end || hdr->imports > hdr->imports_end)
    return false;
  size_t nf = (size_t)(hdr->fns_end - hdr->fns),
         ni = (size_t)(hdr->imports_end - hdr->imports);
  if (nf > MAX_RECORDS || ni > MAX_RECORDS ||
      (nf && !in_object(m, hdr->fns, nf * sizeof *hdr->fns, false)) ||
      (ni && !in_object(m, hdr->imports, ni * sizeof *hdr->imports, false)))
    return false;
  for (size_t i = 0; i < nf; i++) {
    const molt__patch_fn *f = &hdr->fns[i];
    if (!object_string(m, f->name, 4096) || (f->tu && !object_string(m, f->tu, 4096)) ||
        !in_object(m, (const void *)f->impl, 1, true))
      return false;
  }
  for (size_t i = 0; i < ni; i++) {
    const molt__import *im = &hdr->imports[i];
    if (!object_string(m, im->symbol, 4096) || !object_string(m, im->name, 4096) ||
        (im->tu && !object_string(m, im->tu, 4096)))
      return false;
  }
  return true;
}

/* Sets the callable addresses of obj's callbacks at the load base: each in
 * an executable segment as mapped (elf.c checked the file's headers; this
 * is the same check against what the loader did). */
static bool callbacks_inside(const object_map *m, molt__object *obj) {
  struct molt__object_callback *cbs[] = {&obj->pre, &obj->post};
  for (size_t i = 0; i < 2; i++) {
    struct molt__object_callback *cb = cbs[i];
    cb->fn = NULL;
    if (!cb->name[0])
      continue;
    uintptr_t a = m->base + (uintptr_t)cb->vaddr;
    if (!in_object(m, (const void *)a, 1, true))
      return false;
    cb->fn = (int (*)(void))a;
  }
  return true;
}

void molt__object_callbacks(const molt__object *obj, char *buf, size_t len) {
  snprintf(buf, len, "%s%s%s%s%s", obj->pre.name[0] ? "pre=" : "", obj->pre.name,
           obj->pre.name[0] && obj->post.name[0] ? " " : "",
           obj->post.name[0] ? "post=" : "", obj->post.name);
}

/* dlopens obj->file and validates the header.  No molt__rt_lock held. */
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
  object_map map = {0};
  char e2[256] = "";
  int map_rc = MOLT_EIO; /* the copy was lost (the host closed it) */
  if (hdr && dlinfo(h, RTLD_DI_LINKMAP, &lm) == 0 && molt__fd_ours(&obj->file)) {
    map.base = lm->l_addr;
    map_rc = molt__elf_read_dynrels(obj->file.fd, &map.dr, e2, sizeof e2);
  }
  bool have_map = map_rc == 0;
  if (!hdr || !lm || !dladdr(hdr, &info) ||
      (uintptr_t)info.dli_fbase != (uintptr_t)lm->l_addr) {
    molt__errmsg(err, errlen, "%s has no molt_patch_header of its own: not a molt patch",
                 obj->path);
    rc = MOLT_ENOTPATCH;
  } else if (!have_map) {
    molt__errmsg(err, errlen, "%s: %s", obj->path,
                 e2[0] ? e2 : "the process closed molt's copy while it was loaded");
    rc = map_rc;
  } else if (!in_object(&map, hdr, sizeof *hdr, false)) {
    molt__errmsg(err, errlen, "%s: corrupt patch header (outside the patch)", obj->path);
    rc = MOLT_ECORRUPT;
  } else if (hdr->magic == MOLT__PATCH_MAGIC && hdr->abi == MOLT__ABI &&
             hdr->version == MOLT__PATCH_HEADER_VERSION && !header_inside(&map, hdr)) {
    molt__errmsg(err, errlen,
                 "%s: corrupt patch header (a pointer or string outside the patch)",
                 obj->path);
    rc = MOLT_ECORRUPT;
  } else if (hdr->magic != MOLT__PATCH_MAGIC) {
    molt__errmsg(err, errlen, "%s: bad patch header magic", obj->path);
    rc = MOLT_ENOTPATCH;
  } else if (hdr->abi != MOLT__ABI) {
    molt__errmsg(err, errlen, "%s was built for molt ABI %u, this runtime speaks %u",
                 obj->path, hdr->abi, MOLT__ABI);
    rc = MOLT_EABI;
  } else if (hdr->version != MOLT__PATCH_HEADER_VERSION) {
    molt__errmsg(
        err, errlen,
        "%s has patch header version %u, this runtime reads version %u (rebuild the "
        "patch with this molt)",
        obj->path, hdr->version, MOLT__PATCH_HEADER_VERSION);
    rc = MOLT_EABI;
  } else if ((hdr->flags & ~(uint32_t)MOLT__PATCH_PINNED) != 0 ||
             !bounded_text(hdr->provenance) || !bounded_text(hdr->pinned_reasons)) {
    molt__errmsg(err, errlen, "%s: corrupt patch header (flags %#x)", obj->path,
                 hdr->flags);
    rc = MOLT_ECORRUPT;
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
  } else if (!callbacks_inside(&map, obj)) {
    molt__errmsg(err, errlen, "%s: corrupt patch (a callback outside its code)",
                 obj->path);
    rc = MOLT_ECORRUPT;
  }
  molt__elf_free_dynrels(&map.dr);
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
  molt__debug_patch_loaded(obj, h);
  return 0;
}

static void unload_handle(molt__object *obj) {
  if (obj->handle) {
    molt__debug_patch_unloading(obj, obj->handle);
    dlclose(obj->handle);
    obj->handle = NULL;
    obj->hdr = NULL;
  }
}

/* "f, g (a.c)": the functions a patch replaces, statics with their file,
 * for status (malloc'ed; NULL when out of memory). */
static char *replaced_list(const molt__patch_header *h) {
  molt__buf b;
  molt__buf_init(&b);
  for (const molt__patch_fn *f = h->fns; f < h->fns_end; f++)
    molt__buf_printf(&b, "%s%s%s%s%s", f == h->fns ? "" : ", ", f->name,
                     f->tu ? " (" : "", f->tu ? f->tu : "", f->tu ? ")" : "");
  molt__buf_add(&b, "", 1);
  if (b.oom) {
    molt__buf_free(&b);
    return NULL;
  }
  return b.data;
}

/* A pinned patch stays mapped after it left the rollback stack
 * (object_release).  Applying a file with the same contents again takes
 * that object up again instead of loading a second copy: a copy per round
 * would cost a descriptor and its mappings each time (the soak ran out of
 * descriptors), and would give the program two instances of the patch's
 * data, one of them still reached through the pointers that pinned it.
 * The patch's own variables therefore keep their values (design §6).
 * molt__rt_lock held; op_lock keeps the list and the history stable. */
static molt__object *kept_copy(const molt__file_identity *ident) {
  for (molt__object *o = object_at(objects); o; o = object_at(o->all.next))
    if (o->handle && o->pinned && o->gen != 0 && !o->in_history && !o->stuck &&
        molt__fd_ours(&o->file) && strcmp(o->ident.sha256, ident->sha256) == 0)
      return o;
  return NULL;
}

/* Takes up the kept object o for a new apply of the file at path. */
static int take_up(molt__object *o, const char *path, const molt__file_identity *ident,
                   molt__object **out, char *err, size_t errlen) {
  char *p = strdup(path);
  if (p == NULL) {
    molt__errmsg(err, errlen, "out of memory");
    return MOLT_ENOMEM;
  }
  uint64_t now = molt__gen_number_now(); /* takes molt__rt_lock itself */
  molt__rt_lock_acquire();
  free(o->path);
  o->path = p;
  o->ident = *ident;
  molt__log(MOLT__EV_LOAD, now, o->id,
            "took up %s again (file %ju:%ju, sha256 %s): the same patch, kept loaded "
            "since its rollback (%s); its variables keep their values",
            o->path, (uintmax_t)ident->dev, (uintmax_t)ident->ino, ident->sha256,
            molt__object_kept_reason(o));
  molt__rt_lock_release();
  *out = o;
  return 0;
}

int molt__patch_open(const char *path, int fd, molt__object **out, char *err,
                     size_t errlen) {
  /* R7: the descriptor the request brought is checked; everything after
   * this (note, loader checks, dlopen, rollback reloads) reads the sealed
   * private copy (file.c).  No path is opened here (issue 16). */
  molt__fd file;
  molt__file_identity ident;
  int rc = molt__file_copy_checked(fd, path, MAX_PATCH_BYTES, &file, &ident, err, errlen);
  if (rc < 0)
    return rc;
  molt__rt_lock_acquire();
  molt__object *kept = kept_copy(&ident);
  molt__rt_lock_release();
  if (kept != NULL) {
    molt__fd_close(&file); /* the kept object has its own sealed copy */
    return take_up(kept, path, &ident, out, err, errlen);
  }
  molt__patch_note note;
  /* Damage first (the digest moltstamp sealed the file with): a damaged
   * byte anywhere, in code too, is refused as what it is.  A file without
   * a digest or not sealed is first asked what it is (not ELF, not a
   * patch, not stamped: the note reader's words), then refused for that. */
  char e2[400] = "";
  int digest_rc = molt__elf_check_digest(file.fd, e2, sizeof e2);
  if (digest_rc == MOLT_ECORRUPT || digest_rc == MOLT_EIO || digest_rc == MOLT_ENOMEM) {
    molt__errmsg(err, errlen, "%s: %s", path, e2);
    rc = digest_rc;
  }
  if (rc == 0)
    rc = molt__elf_read_patch_note(file.fd, &note, err, errlen);
  if (rc == 0 && digest_rc < 0) {
    molt__errmsg(err, errlen, "%s: %s", path, e2);
    rc = digest_rc;
  }
  /* Deliver 2 and 3 of issue 16: nothing in the file reaches ld.so
   * unchecked, and nothing of it runs inside dlopen or dlclose.  Checked on
   * the sealed copy that is dlopened below: it cannot change in between. */
  molt__patch_callbacks cbs;
  if (rc == 0) {
    char e2[400] = "";
    rc = molt__elf_check_load(file.fd, true, needed_is_loaded, NULL, e2, sizeof e2);
    if (rc == 0)
      rc = molt__elf_read_callbacks(file.fd, &cbs, e2, sizeof e2);
    if (rc < 0)
      molt__errmsg(err, errlen, "%s: %s", path, e2);
  }
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
      obj->ident = ident;
      obj->module = module;
      if (cbs.pre.present) {
        snprintf(obj->pre.name, sizeof obj->pre.name, "%s", cbs.pre.name);
        obj->pre.vaddr = cbs.pre.vaddr;
      }
      if (cbs.post.present) {
        snprintf(obj->post.name, sizeof obj->post.name, "%s", cbs.post.name);
        obj->post.vaddr = cbs.post.vaddr;
      }
    }
  }
  if (rc == 0)
    rc = load_handle(obj, err, errlen);
  if (rc == 0) {
    const molt__patch_header *h = obj->hdr;
    obj->id = strdup(h->id && *h->id ? h->id : "unnamed");
    obj->description = strdup(h->description ? h->description : "");
    obj->provenance = strdup(h->provenance ? h->provenance : "");
    obj->pinned = (h->flags & MOLT__PATCH_PINNED) != 0;
    obj->pinned_reasons =
        strdup(h->pinned_reasons && *h->pinned_reasons ? h->pinned_reasons
               : obj->pinned                           ? "pinned by its author"
                                                       : "");
    obj->replaced = replaced_list(h);
    if (!obj->id || !obj->description || !obj->provenance || !obj->pinned_reasons ||
        !obj->replaced) {
      rc = MOLT_ENOMEM;
      molt__errmsg(err, errlen, "out of memory");
    }
    obj->owner.id = obj->id;
    obj->owner.release = object_release;
    /* Once published, a pinned patch is never unmapped (object_release):
     * no thread needs proving out of it (core/proof.c).  (Not published
     * yet, no entry has jumped into it.) */
    obj->owner.keeps_code = obj->pinned;
  }
  if (rc == 0) {
    molt__rt_lock_acquire();
    rc = resolve_imports(obj, err, errlen);
    molt__rt_lock_release();
  }
  if (rc < 0) {
    if (obj) {
      unload_handle(obj);
      free_record(obj);
    }
    molt__fd_close(&file);
    return rc;
  }
  uint64_t now = molt__gen_number_now(); /* takes molt__rt_lock itself */
  molt__rt_lock_acquire();
  molt__list_push(&objects, &obj->all);
  size_t nfns = (size_t)(obj->hdr->fns_end - obj->hdr->fns);
  char cbs_text[2 * MOLT__CALLBACK_NAME_MAX + 16];
  molt__object_callbacks(obj, cbs_text, sizeof cbs_text);
  molt__log(MOLT__EV_LOAD, now, obj->id,
            "loaded %s (file %ju:%ju, sha256 %s; %zu function%s%s%s%s%s%s%s)", obj->path,
            (uintmax_t)obj->ident.dev, (uintmax_t)obj->ident.ino, obj->ident.sha256, nfns,
            nfns == 1 ? "" : "s", obj->provenance[0] ? "; built from " : "",
            obj->provenance, obj->pinned ? "; kept loaded: " : "",
            obj->pinned ? molt__object_kept_reason(obj) : "",
            cbs_text[0] ? "; callbacks " : "", cbs_text);
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

const char *molt__object_kept_reason(molt__object *obj) {
  if (obj->stuck) {
    bool pre = strncmp(obj->stuck, "pre", 3) == 0;
    if (obj->stuck_run && molt__callback_finished(obj->stuck_run))
      return pre ? "pre-update callback returned after its timeout"
                 : "post-update callback returned after its timeout";
    return obj->stuck;
  }
  if (obj->stuck)
    return obj->stuck;
  /* The first line of the reasons (the status shows one), cut in place
   * once: the full text is in the patch header. */
  char *nl = strchr(obj->pinned_reasons, '\n');
  if (nl)
    *nl = '\0';
  return obj->pinned_reasons;
}

void molt__object_free_if_unused(molt__object *obj) {
  if (obj->handle || obj->owner.gen_refs || obj->in_history || obj->prev_refs)
    return;
  molt__list_unlink(&objects, &obj->all);
  molt__fd_close(&obj->file); /* unless the host took the number */
  free_record(obj);
}

/* No live generation points into the object any more (reclamation, op_lock
 * held, molt__rt_lock not held): unload it; it stays known (and its file
 * kept) while the rollback history may need it again. */
static void object_release(molt__owner *owner) {
  molt__object *o = MOLT__CONTAINER(owner, molt__object, owner);
  if (!o->handle)
    return;
  if (o->stuck) {
    /* A callback of it is (or was, past its deadline) running its code:
     * nobody can tell when that code is left for good. */
    if (!o->kept_logged) {
      o->kept_logged = true;
      molt__rt_lock_acquire();
      molt__log(MOLT__EV_INFO, o->gen, o->id, "kept %s loaded: %s", o->path, o->stuck);
      molt__rt_lock_release();
    }
    return;
  }
  if (o->pinned && o->gen != 0) {
    /* Once published (gen != 0), the program may hold pointers into it
     * (pinned_reasons): it stays mapped, and known, for the life of the
     * process.  A pinned patch whose apply failed never ran: it goes. */
    if (!o->kept_logged) {
      o->kept_logged = true;
      molt__rt_lock_acquire();
      molt__log(MOLT__EV_INFO, o->gen, o->id, "kept %s loaded: %s", o->path,
                molt__object_kept_reason(o));
      molt__rt_lock_release();
    }
    return;
  }
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
