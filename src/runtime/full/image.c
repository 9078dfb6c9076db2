/* Program images (full updates): opening and checking an image file,
 * loading it, and looking at it -- its own symbols (statics included), the
 * address ranges of its segments, and its innermost call in progress on a
 * thread's stack.
 *
 * An image is found through its OWN file symbol table, never through
 * dlsym: both versions of a program are loaded at once, RTLD_LOCAL, and a
 * name looked up through the loader could resolve in the other version or
 * in any library either one depends on. */
#include "full/full.h"

#include <dlfcn.h>
#include <elf.h>
#include <link.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/uio.h>
#include <unistd.h>

/* A program image is a whole program; 1 GiB is far beyond a real one and
 * bounds what a bad file can make us copy. */
#define MAX_IMAGE_BYTES ((size_t)1 << 30)

typedef struct phdr_ctx {
  uintptr_t base;
  const char *name;
  molt__image *im;
  int rc;
  bool found;
} phdr_ctx;

static int range_cmp(const void *a, const void *b) {
  const struct molt__range *x = a, *y = b;
  return x->lo < y->lo ? -1 : x->lo > y->lo;
}

/* Collects the PT_LOAD segments of the module loaded at ctx->base under
 * ctx->name (both must match: the load bias alone is not unique if the
 * executable is not position-independent). */
static int phdr_cb(struct dl_phdr_info *info, size_t size, void *data) {
  phdr_ctx *c = data;
  (void)size;
  if (info->dlpi_addr != c->base || !info->dlpi_name ||
      strcmp(info->dlpi_name, c->name) != 0)
    return 0;
  c->found = true;
  size_t n = 0;
  for (size_t i = 0; i < info->dlpi_phnum; i++)
    if (info->dlpi_phdr[i].p_type == PT_LOAD && info->dlpi_phdr[i].p_memsz)
      n++;
  struct molt__range *r = calloc(n ? n : 1, sizeof *r);
  if (!r) {
    c->rc = MOLT_ENOMEM;
    return 1;
  }
  size_t k = 0;
  for (size_t i = 0; i < info->dlpi_phnum; i++) {
    const ElfW(Phdr) *p = &info->dlpi_phdr[i];
    if (p->p_type != PT_LOAD || !p->p_memsz)
      continue;
    r[k].lo = info->dlpi_addr + p->p_vaddr;
    r[k].hi = r[k].lo + p->p_memsz;
    r[k].prot = p->p_flags & (PF_R | PF_W | PF_X);
    k++;
  }
  qsort(r, k, sizeof *r, range_cmp);
  /* The part the loader made read-only after relocating it (PT_GNU_RELRO,
   * mprotect'ed from its page-aligned start up to its last whole page, as
   * glibc's _dl_protect_relro does). */
  long pg = sysconf(_SC_PAGESIZE);
  uintptr_t mask = pg > 0 ? ~((uintptr_t)pg - 1) : ~(uintptr_t)4095;
  for (size_t i = 0; i < info->dlpi_phnum; i++) {
    const ElfW(Phdr) *p = &info->dlpi_phdr[i];
    if (p->p_type == PT_GNU_RELRO && p->p_memsz) {
      c->im->relro_lo = (info->dlpi_addr + p->p_vaddr) & mask;
      c->im->relro_hi = (info->dlpi_addr + p->p_vaddr + p->p_memsz) & mask;
    }
  }
  c->im->ranges = r;
  c->im->nranges = k;
  return 1;
}

void molt__image_close(molt__image *im) {
  if (!im)
    return;
  if (im->handle)
    dlclose(im->handle);
  molt__symtab_close(im->symtab);
  free(im->ranges);
  free(im->path);
  free(im);
}

/* The absolute address of a global symbol of the image itself, and
 * whether it is a function; NULL if the image does not define it. */
static void *own_global(const molt__image *im, const char *name, bool *is_func) {
  uintptr_t v;
  if (molt__symtab_lookup(im->symtab, name, NULL, &v) != 0)
    return NULL;
  bool f = false;
  uintptr_t start = 0;
  if (molt__symtab_at(im->symtab, v, NULL, NULL, &start, NULL, &f) != 0 || start != v)
    f = false;
  *is_func = f;
  return (void *)(im->base + v);
}

/* Loads the checked copy `file` into im (everything but the program info). */
static int load_copy(molt__image *im, molt__fd *file, char *err, size_t errlen) {
  const char *path = im->path;
  char e2[400] = "";
  /* The copy is ours for the length of this function only, but the host
   * may close it meanwhile (base.h): checked before each use. */
  static const char lost[] = "the process closed molt's copy of %s while it was loaded";
  if (!molt__fd_ours(file)) {
    molt__errmsg(err, errlen, lost, path);
    return MOLT_EIO;
  }
  /* Everything ld.so trusts (headers, segments, dynamic, hash, symbol,
   * version and relocation tables, notes) is checked on this sealed copy
   * before ld.so sees it, so a malformed one is refused instead of faulting
   * or asserting in dlopen.  An image is a whole program: its constructors
   * (libmolt's module registration among them) are its own to run. */
  int rc = molt__elf_check_load(file->fd, false, NULL, NULL, e2, sizeof e2);
  if (rc < 0) {
    molt__errmsg(err, errlen, "%s: %s%s", path, e2,
                 rc == MOLT_ENOTPROGRAM ? " (a program image is a shared object built "
                                          "with moltcc --molt-program)"
                                        : "");
    return rc;
  }
  rc =
      molt__elf_file_build_id(file->fd, im->build_id, sizeof im->build_id, e2, sizeof e2);
  if (rc == MOLT_ENOSYM) {
    im->build_id[0] = '\0'; /* no build-id: cannot be an update's source */
    rc = 0;
  } else if (rc < 0) {
    molt__errmsg(err, errlen, "%s: %s", path, e2);
    return rc;
  }

  char p[64];
  if (molt__fd_path(file, p, sizeof p) < 0) {
    molt__errmsg(err, errlen, lost, path);
    return MOLT_EIO;
  }
  rc = molt__symtab_open(p, &im->symtab);
  if (rc < 0) {
    molt__errmsg(err, errlen, "cannot read the symbol table of %s: %s", path,
                 molt_strerror(rc));
    return rc;
  }

  if (molt__fd_load_path(file, p, sizeof p) < 0) {
    molt__errmsg(err, errlen, lost, path);
    return MOLT_EIO;
  }
  dlerror();
  im->handle = dlopen(p, RTLD_NOW | RTLD_LOCAL);
  if (!im->handle) {
    const char *e = dlerror();
    molt__errmsg(err, errlen, "the dynamic loader rejected %s: %s", path,
                 e ? e : "unknown error");
    rc = MOLT_EDLOPEN;
    return rc;
  }
  struct link_map *lm = NULL;
  if (dlinfo(im->handle, RTLD_DI_LINKMAP, &lm) != 0 || !lm) {
    molt__errmsg(err, errlen, "cannot find the load address of %s", path);
    rc = MOLT_EINTERNAL;
    return rc;
  }
  im->base = (uintptr_t)lm->l_addr;
  phdr_ctx pc = {.base = im->base, .name = lm->l_name ? lm->l_name : p, .im = im};
  dl_iterate_phdr(phdr_cb, &pc);
  if (pc.rc < 0 || !pc.found || im->nranges == 0) {
    molt__errmsg(err, errlen, "cannot find the segments of %s%s", path,
                 pc.rc < 0 ? ": out of memory" : "");
    rc = pc.rc < 0 ? pc.rc : MOLT_EINTERNAL;
    return rc;
  }

  bool is_func = false;
  const molt__program_info *info = own_global(im, "molt__program", &is_func);
  if (!info || is_func) {
    molt__errmsg(err, errlen,
                 "%s defines no molt__program of its own: not a molt program "
                 "image (build it with moltcc --molt-program)",
                 path);
    rc = MOLT_ENOTPROGRAM;
    return rc;
  }
  unsigned prot = molt__image_prot_at(im, (uintptr_t)info);
  if (!(prot & PF_R) || molt__image_prot_at(im, (uintptr_t)(info + 1) - 1) != prot) {
    molt__errmsg(err, errlen, "%s: molt__program lies outside the loaded segments", path);
    rc = MOLT_ECORRUPT;
    return rc;
  }
  if (info->abi != MOLT__PROGRAM_ABI) {
    molt__errmsg(err, errlen,
                 "%s was built for molt program ABI %u, this runtime speaks %u", path,
                 info->abi, MOLT__PROGRAM_ABI);
    rc = MOLT_EABI;
    return rc;
  }
  void *m = own_global(im, "main", &is_func);
  if (!m || !is_func || !(molt__image_prot_at(im, (uintptr_t)m) & PF_X)) {
    molt__errmsg(err, errlen,
                 "%s defines no function main of its own: not a molt program "
                 "image (build it with moltcc --molt-program)",
                 path);
    rc = MOLT_ENOTPROGRAM;
    return rc;
  }
  im->info = info;
  im->main = (int (*)(int, char **, char **))m;
  return 0;
}

int molt__image_open(const char *path, int fd, molt__image **out, char *err,
                     size_t errlen) {
  if (!out)
    return MOLT_EINVAL;
  *out = NULL;
  molt__fd file;
  molt__file_identity ident;
  int own = -1;
  int rc = fd >= 0 ? 0 : molt__file_open_path(path, &own, err, errlen);
  if (rc < 0)
    return rc;
  rc = molt__file_copy_checked(fd >= 0 ? fd : own, path, MAX_IMAGE_BYTES, &file, &ident,
                               err, errlen);
  if (own >= 0)
    close(own);
  if (rc < 0)
    return rc;
  molt__image *im = calloc(1, sizeof *im);
  if (!im || !(im->path = strdup(path))) {
    free(im);
    molt__fd_close(&file);
    molt__errmsg(err, errlen, "out of memory");
    return MOLT_ENOMEM;
  }
  im->ident = ident;
  rc = load_copy(im, &file, err, errlen);
  /* Not kept: the loader mapped what it needs, nothing reads the copy
   * again, and a descriptor the runtime does not hold cannot be lost. */
  molt__fd_close(&file);
  if (rc < 0) {
    /* molt__image_close handles a partly built image (NULL handle, symtab). */
    molt__image_close(im);
    return rc;
  }
  *out = im;
  return 0;
}

void *molt__image_sym(const molt__image *im, const char *name, const char *tu) {
  uintptr_t v;
  if (!im || !name || molt__symtab_lookup(im->symtab, name, tu, &v) != 0)
    return NULL;
  return (void *)(im->base + v);
}

bool molt__image_sym_at(const molt__image *im, uintptr_t a, const char **name,
                        const char **tu, uintptr_t *start, size_t *size, bool *is_func) {
  if (!im || a < im->base)
    return false;
  uintptr_t s;
  if (molt__symtab_at(im->symtab, a - im->base, name, tu, &s, size, is_func) != 0)
    return false;
  if (start)
    *start = s + im->base;
  return true;
}

unsigned molt__image_prot_at(const molt__image *im, uintptr_t a) {
  /* A handful of segments: a linear scan beats anything cleverer. */
  for (size_t i = 0; i < im->nranges; i++)
    if (a >= im->ranges[i].lo && a < im->ranges[i].hi)
      return im->ranges[i].prot;
  return 0;
}

bool molt__image_writable(const molt__image *im, uintptr_t a, size_t size) {
  uintptr_t end = a + (size ? size : 1);
  if (end < a)
    return false;
  for (size_t i = 0; i < im->nranges; i++)
    if (a >= im->ranges[i].lo && end <= im->ranges[i].hi)
      return (im->ranges[i].prot & PF_W) && (end <= im->relro_lo || a >= im->relro_hi);
  return false;
}

/* Whether the instruction that ends right before ret, in the image's code,
 * is a call: then ret is the return address of a call in progress. */
static bool after_call(const molt__image *im, uintptr_t ret) {
#if defined(__x86_64__)
  /* call rel32 (E8, 5 bytes), call *disp32(%rip) (FF 15, 6 bytes),
   * call *%reg (FF D0+r, 2 bytes, 3 with a REX prefix), call *off(%reg)
   * (FF /2 with an 8-bit offset: 3 bytes) */
  if (ret < 6 || !(molt__image_prot_at(im, ret - 6) & PF_X))
    return false;
  const unsigned char *c = (const unsigned char *)ret;
  return c[-5] == 0xe8 || (c[-6] == 0xff && c[-5] == 0x15) ||
         (c[-2] == 0xff && (c[-1] & 0xf8) == 0xd0) ||
         (c[-3] == 0xff && (c[-2] & 0x38) == 0x10 && (c[-2] & 0xc0) == 0x40);
#elif defined(__aarch64__)
  if (ret < 4 || !(molt__image_prot_at(im, ret - 4) & PF_X))
    return false;
  uint32_t insn;
  memcpy(&insn, (const void *)(ret - 4), sizeof insn);
  return (insn & 0xfc000000u) == 0x94000000u /* bl */ ||
         (insn & 0xfffffc1fu) == 0xd63f0000u /* blr */;
#else
  (void)im;
  (void)ret;
  return false;
#endif
}

bool molt__image_caller_on_stack(const molt__image *im, uintptr_t sp, uintptr_t hi,
                                 const char **name, const char **tu) {
  /* The first 16 KiB above the stack pointer: the frames of the C library
   * (or whatever the thread blocks in) below the image's are short. */
  uintptr_t words[2048];
  if (!im || sp == 0 || hi <= sp || (sp & (sizeof(uintptr_t) - 1)))
    return false;
  size_t len = hi - sp < sizeof words ? hi - sp : sizeof words;
  struct iovec local = {words, len}, remote = {(void *)sp, len};
  /* Another thread's stack, which it may be writing (it is blocked, but a
   * signal handler may run): read by the kernel, so a word that changes
   * underneath gives a wrong answer at worst, never a data race. */
  ssize_t got = process_vm_readv(getpid(), &local, 1, &remote, 1, 0);
  if (got <= 0)
    return false;
  for (size_t i = 0; i < (size_t)got / sizeof words[0]; i++) {
    uintptr_t w = words[i], start = 0;
    size_t size = 0;
    bool is_func = false;
    if (!(molt__image_prot_at(im, w) & PF_X) ||
        !molt__image_sym_at(im, w, name, tu, &start, &size, &is_func) || !is_func ||
        w <= start || w > start + size || !after_call(im, w))
      continue;
    return true;
  }
  return false;
}
