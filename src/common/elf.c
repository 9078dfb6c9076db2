/*
 * ELF64 reading for the runtime and for moltstamp.
 *
 * Patch files are untrusted input that the runtime reads inside its host
 * process, so this is a small parser of our own rather than libelf: every
 * offset and size taken from a file is checked against the file's size with
 * overflow-safe arithmetic before it is used, nothing is mmapped (a file
 * truncated while mapped would raise SIGBUS in the host), and every
 * allocation is capped.  Nothing here prints.
 */
#include "common/common.h"

#include <elf.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <link.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#if __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "the ELF reader reads little-endian files with host loads"
#endif

#if defined(__x86_64__)
#define HOST_MACHINE EM_X86_64
#elif defined(__aarch64__)
#define HOST_MACHINE EM_AARCH64
#elif defined(__riscv) && __riscv_xlen == 64
#define HOST_MACHINE EM_RISCV
#elif defined(__powerpc64__)
#define HOST_MACHINE EM_PPC64
#else
#error "unsupported host machine"
#endif

/* Caps on what one file may make us allocate.  They are far above anything a
 * real program has and far below what would hurt the host process. */
#define MAX_HEADERS_BYTES ((uint64_t)64 << 20)
#define MAX_NOTES_BYTES ((uint64_t)16 << 20)
#define MAX_DYNAMIC_BYTES ((uint64_t)16 << 20)
#define MAX_STRTAB_BYTES ((uint64_t)1 << 30)
#define MAX_SYMTAB_BYTES ((uint64_t)1 << 30)
#define MAX_BUILD_ID_BYTES (MOLT__BUILD_ID_HEX_MAX / 2)

/* ------------------------------------------------------------------------ */
/* A validated view of an ELF64 file                                         */
/* ------------------------------------------------------------------------ */

enum {
  LOAD_PATCH = 1,  /* host machine, ET_DYN, loadable by ld.so */
  LOAD_NO_CODE = 2 /* and runs none of its code at dlopen or dlclose */
};

typedef struct elf_file {
  int fd;
  uint64_t size;
  Elf64_Ehdr eh;
  Elf64_Phdr *ph;
  size_t phnum;
  Elf64_Shdr *sh;
  size_t shnum;
  char *shstr; /* section name table, NUL-terminated; NULL if none */
  uint64_t shstr_size;
  char *err;
  size_t errlen;
  int flags;                               /* LOAD_* */
  bool (*needed_ok)(const char *, void *); /* DT_NEEDED filter, or NULL */
  uint64_t relacount;                      /* DT_RELACOUNT, 0 if none */
  void *needed_arg;
  uint64_t dyn_vaddr, dyn_size; /* PT_DYNAMIC, once check_loadable found it */
} elf_file;

static void elf_free(elf_file *f) {
  free(f->ph);
  free(f->sh);
  free(f->shstr);
  f->ph = NULL;
  f->sh = NULL;
  f->shstr = NULL;
}

/* end = off + len, false on overflow or past the end of the file. */
static bool range_ok(const elf_file *f, uint64_t off, uint64_t len, uint64_t *end) {
  uint64_t e;
  if (__builtin_add_overflow(off, len, &e) || e > f->size)
    return false;
  if (end)
    *end = e;
  return true;
}

/* The message for a range that range_ok() rejected.  `what` is the subject
 * with its verb ("section headers end"), so the message reads naturally. */
static int range_err(elf_file *f, const char *what, uint64_t off, uint64_t len) {
  uint64_t e;
  if (!__builtin_add_overflow(off, len, &e))
    molt__errmsg(f->err, f->errlen,
                 "file is truncated: %s at byte %" PRIu64 " of %" PRIu64, what, e,
                 f->size);
  else
    molt__errmsg(f->err, f->errlen,
                 "file is corrupt: %s past any possible file size (offset "
                 "%" PRIu64 ", size %" PRIu64 ")",
                 what, off, len);
  return MOLT_ECORRUPT;
}

static int read_exact(elf_file *f, void *dst, uint64_t off, uint64_t len) {
  unsigned char *p = dst;
  while (len > 0) {
    size_t chunk = len > ((size_t)1 << 30) ? ((size_t)1 << 30) : (size_t)len;
    ssize_t n = pread(f->fd, p, chunk, (off_t)off);
    if (n < 0) {
      if (errno == EINTR)
        continue;
      molt__errmsg(f->err, f->errlen, "cannot read the file: %s", strerror(errno));
      return MOLT_EIO;
    }
    if (n == 0) {
      /* Only possible if the file shrank after fstat(). */
      molt__errmsg(f->err, f->errlen, "file is truncated: it shrank while being read");
      return MOLT_ECORRUPT;
    }
    p += n;
    off += (uint64_t)n;
    len -= (uint64_t)n;
  }
  return 0;
}

/* Reads [off, off+len) of the file into a fresh buffer with a NUL after it,
 * so that string tables are always terminated. */
static int read_alloc(elf_file *f, uint64_t off, uint64_t len, uint64_t cap,
                      const char *what, void **out) {
  *out = NULL;
  if (!range_ok(f, off, len, NULL))
    return range_err(f, what, off, len);
  if (len > cap) {
    molt__errmsg(f->err, f->errlen,
                 "file is corrupt: %s after an implausible %" PRIu64 " bytes", what, len);
    return MOLT_ECORRUPT;
  }
  char *buf = malloc((size_t)len + 1);
  if (!buf) {
    molt__errmsg(f->err, f->errlen, "out of memory reading the file");
    return MOLT_ENOMEM;
  }
  buf[len] = '\0';
  int rc = read_exact(f, buf, off, len);
  if (rc) {
    free(buf);
    return rc;
  }
  *out = buf;
  return 0;
}

static const char *section_name(const elf_file *f, size_t i) {
  if (!f->shstr || i >= f->shnum || f->sh[i].sh_name >= f->shstr_size)
    return "";
  return f->shstr + f->sh[i].sh_name;
}

/* Names from the file go into one-line messages: only printable ASCII. */
static const char *printable(const char *s, char *buf, size_t len) {
  size_t i = 0;
  for (; s[i] && i + 1 < len; i++)
    buf[i] = (s[i] >= 0x20 && s[i] < 0x7f) ? s[i] : '?';
  buf[i] = '\0';
  return buf;
}

static const char *machine_name(unsigned m) {
  switch (m) {
  case EM_X86_64:
    return "x86-64";
  case EM_386:
    return "i386";
  case EM_AARCH64:
    return "aarch64";
  case EM_ARM:
    return "arm";
  case EM_RISCV:
    return "riscv";
  case EM_PPC64:
    return "ppc64";
  default:
    return "unknown";
  }
}

static int load_headers(elf_file *f);
static int check_loadable(elf_file *f);
static int check_loader_tables(elf_file *f, const Elf64_Dyn *d, size_t nd);
static int check_segments(elf_file *f);

/*
 * Opens the ELF view of fd: identification, program headers, section headers
 * and section name table, each checked to lie within the file.  `notelf` is
 * the code for "this is not a file of the kind we read" (not ELF, wrong
 * class, byte order or machine), which callers word differently.
 */
static int elf_open_filtered(elf_file *f, int fd, int flags, int notelf, char *err,
                             size_t errlen, bool (*needed_ok)(const char *, void *),
                             void *needed_arg) {
  memset(f, 0, sizeof *f);
  f->needed_ok = needed_ok;
  f->needed_arg = needed_arg;
  f->flags = flags;
  f->fd = fd;
  f->err = err;
  f->errlen = errlen;
  if (err && errlen)
    err[0] = '\0';
  if (fd < 0) {
    molt__errmsg(err, errlen, "invalid file descriptor");
    return MOLT_EINVAL;
  }

  struct stat st;
  if (fstat(fd, &st) != 0) {
    molt__errmsg(err, errlen, "cannot stat the file: %s", strerror(errno));
    return MOLT_EIO;
  }
  if (!S_ISREG(st.st_mode)) {
    molt__errmsg(err, errlen, "not an ELF file (not a regular file)");
    return notelf;
  }
  f->size = (uint64_t)st.st_size;
  if (f->size == 0) {
    molt__errmsg(err, errlen, "not an ELF file (the file is empty)");
    return notelf;
  }

  unsigned char ident[EI_NIDENT] = {0};
  uint64_t have = f->size < EI_NIDENT ? f->size : EI_NIDENT;
  int rc = read_exact(f, ident, 0, have);
  if (rc)
    return rc;
  if (have < SELFMAG || memcmp(ident, ELFMAG, SELFMAG) != 0) {
    molt__errmsg(err, errlen, "not an ELF file");
    return notelf;
  }
  if (f->size < sizeof(Elf64_Ehdr) && ident[EI_CLASS] != ELFCLASS32) {
    molt__errmsg(err, errlen,
                 "file is truncated: ELF header ends at byte %zu of %" PRIu64,
                 sizeof(Elf64_Ehdr), f->size);
    return MOLT_ECORRUPT;
  }
  if (ident[EI_CLASS] == ELFCLASS32) {
    molt__errmsg(err, errlen, "not a 64-bit ELF file (ELFCLASS32)");
    return notelf;
  }
  if (ident[EI_CLASS] != ELFCLASS64) {
    molt__errmsg(err, errlen, "file is corrupt: invalid ELF class %u", ident[EI_CLASS]);
    return MOLT_ECORRUPT;
  }
  if (ident[EI_DATA] == ELFDATA2MSB) {
    molt__errmsg(err, errlen, "not a little-endian ELF file (ELFDATA2MSB)");
    return notelf;
  }
  if (ident[EI_DATA] != ELFDATA2LSB) {
    molt__errmsg(err, errlen, "file is corrupt: invalid ELF data encoding %u",
                 ident[EI_DATA]);
    return MOLT_ECORRUPT;
  }
  if (ident[EI_VERSION] != EV_CURRENT) {
    molt__errmsg(err, errlen, "file is corrupt: invalid ELF version %u",
                 ident[EI_VERSION]);
    return MOLT_ECORRUPT;
  }

  if (flags & LOAD_PATCH) {
    /* ld.so refuses these too, but by then the file is open in the loader;
     * the message here names the byte. */
    if ((ident[EI_OSABI] != ELFOSABI_SYSV && ident[EI_OSABI] != ELFOSABI_GNU) ||
        ident[EI_ABIVERSION] != 0) {
      molt__errmsg(err, errlen, "file is corrupt: ELF OS ABI %u version %u",
                   ident[EI_OSABI], ident[EI_ABIVERSION]);
      return MOLT_ECORRUPT;
    }
    for (size_t i = EI_PAD; i < EI_NIDENT; i++)
      if (ident[i] != 0) {
        molt__errmsg(err, errlen, "file is corrupt: ELF identification byte %zu is not 0",
                     i);
        return MOLT_ECORRUPT;
      }
  }
  rc = read_exact(f, &f->eh, 0, sizeof f->eh);
  if (rc)
    return rc;
  if (f->eh.e_version != EV_CURRENT) {
    molt__errmsg(err, errlen, "file is corrupt: invalid ELF version %" PRIu32,
                 f->eh.e_version);
    return MOLT_ECORRUPT;
  }
  if (flags & LOAD_PATCH) {
    if (f->eh.e_machine != HOST_MACHINE) {
      molt__errmsg(
          err, errlen, "built for another machine (%s, e_machine %u); this is %s",
          machine_name(f->eh.e_machine), f->eh.e_machine, machine_name(HOST_MACHINE));
      return notelf;
    }
    if (f->eh.e_type != ET_DYN) {
      molt__errmsg(err, errlen,
                   "not a shared object (e_type %u): patches are built with "
                   "-shared",
                   f->eh.e_type);
      return notelf;
    }
  }
  rc = load_headers(f);
  if (rc == 0 && (flags & LOAD_PATCH))
    rc = check_segments(f);
  if (rc == 0 && (flags & LOAD_PATCH))
    rc = check_loadable(f);
  return rc;
}

static int elf_open(elf_file *f, int fd, int flags, int notelf, char *err,
                    size_t errlen) {
  return elf_open_filtered(f, fd, flags, notelf, err, errlen, NULL, NULL);
}

static int load_headers(elf_file *f) {
  const Elf64_Ehdr *eh = &f->eh;
  int rc;

  if (eh->e_ehsize < sizeof(Elf64_Ehdr)) {
    molt__errmsg(f->err, f->errlen,
                 "file is corrupt: ELF header size is %u, expected %zu", eh->e_ehsize,
                 sizeof(Elf64_Ehdr));
    return MOLT_ECORRUPT;
  }

  /* Program headers.  PN_XNUM (count stored in section 0) is not supported
   * by the dynamic loader either, so it is refused outright. */
  if (eh->e_phnum > 0) {
    if (eh->e_phentsize != sizeof(Elf64_Phdr)) {
      molt__errmsg(f->err, f->errlen,
                   "file is corrupt: program header entry size is %u, "
                   "expected %zu",
                   eh->e_phentsize, sizeof(Elf64_Phdr));
      return MOLT_ECORRUPT;
    }
    if (eh->e_phnum == PN_XNUM) {
      molt__errmsg(f->err, f->errlen,
                   "file is corrupt: too many program headers (PN_XNUM)");
      return MOLT_ECORRUPT;
    }
    f->phnum = eh->e_phnum;
    rc = read_alloc(f, eh->e_phoff, (uint64_t)f->phnum * sizeof(Elf64_Phdr),
                    MAX_HEADERS_BYTES, "program headers end", (void **)&f->ph);
    if (rc)
      return rc;
  }

  /* Section headers.  With more than SHN_LORESERVE sections the real count
   * and name-table index live in section 0 (sh_size, sh_link). */
  if (eh->e_shoff == 0) {
    if (eh->e_shnum != 0) {
      molt__errmsg(f->err, f->errlen, "file is corrupt: %u section headers at offset 0",
                   eh->e_shnum);
      return MOLT_ECORRUPT;
    }
    return 0;
  }
  if (eh->e_shentsize != sizeof(Elf64_Shdr)) {
    molt__errmsg(f->err, f->errlen,
                 "file is corrupt: section header entry size is %u, "
                 "expected %zu",
                 eh->e_shentsize, sizeof(Elf64_Shdr));
    return MOLT_ECORRUPT;
  }
  uint64_t shnum = eh->e_shnum;
  uint64_t shstrndx = eh->e_shstrndx;
  if (shnum == 0 || shstrndx == SHN_XINDEX) {
    Elf64_Shdr s0;
    if (!range_ok(f, eh->e_shoff, sizeof s0, NULL))
      return range_err(f, "section headers end", eh->e_shoff, sizeof s0);
    rc = read_exact(f, &s0, eh->e_shoff, sizeof s0);
    if (rc)
      return rc;
    if (shnum == 0)
      shnum = s0.sh_size;
    if (shstrndx == SHN_XINDEX)
      shstrndx = s0.sh_link;
  }
  if (shnum == 0)
    return 0;
  uint64_t shbytes;
  if (__builtin_mul_overflow(shnum, (uint64_t)sizeof(Elf64_Shdr), &shbytes)) {
    molt__errmsg(f->err, f->errlen, "file is corrupt: absurd section count %" PRIu64,
                 shnum);
    return MOLT_ECORRUPT;
  }
  rc = read_alloc(f, eh->e_shoff, shbytes, MAX_HEADERS_BYTES, "section headers end",
                  (void **)&f->sh);
  if (rc)
    return rc;
  f->shnum = (size_t)shnum;

  if (shstrndx != SHN_UNDEF) {
    if (shstrndx >= shnum || f->sh[shstrndx].sh_type != SHT_STRTAB) {
      molt__errmsg(f->err, f->errlen,
                   "file is corrupt: section name table index %" PRIu64
                   " is not a string table",
                   shstrndx);
      return MOLT_ECORRUPT;
    }
  }

  char what[96];
  for (size_t i = 1; i < f->shnum; i++) {
    const Elf64_Shdr *s = &f->sh[i];
    if (s->sh_type == SHT_NULL || s->sh_type == SHT_NOBITS)
      continue;
    if (!range_ok(f, s->sh_offset, s->sh_size, NULL)) {
      snprintf(what, sizeof what, "section %zu ends", i);
      return range_err(f, what, s->sh_offset, s->sh_size);
    }
  }

  if (shstrndx != SHN_UNDEF) {
    const Elf64_Shdr *s = &f->sh[shstrndx];
    rc = read_alloc(f, s->sh_offset, s->sh_size, MAX_STRTAB_BYTES,
                    "section name table ends", (void **)&f->shstr);
    if (rc)
      return rc;
    f->shstr_size = s->sh_size;
  }
  return 0;
}

/* The PT_LOAD segment whose mapped range holds [vaddr, vaddr+len), or NULL. */
static const Elf64_Phdr *segment_of(const elf_file *f, uint64_t vaddr, uint64_t len,
                                    bool file_backed) {
  uint64_t end;
  if (__builtin_add_overflow(vaddr, len, &end))
    return NULL;
  for (size_t i = 0; i < f->phnum; i++) {
    const Elf64_Phdr *p = &f->ph[i];
    if (p->p_type != PT_LOAD)
      continue;
    uint64_t sz = file_backed ? p->p_filesz : p->p_memsz;
    if (vaddr >= p->p_vaddr && end - p->p_vaddr <= sz)
      return p;
  }
  return NULL;
}

/* Whether [vaddr, vaddr + len) meets a writable PT_LOAD segment. */
static bool meets_writable(const elf_file *f, uint64_t vaddr, uint64_t len) {
  uint64_t end;
  if (__builtin_add_overflow(vaddr, len, &end))
    return true;
  for (size_t i = 0; i < f->phnum; i++) {
    const Elf64_Phdr *p = &f->ph[i];
    if (p->p_type == PT_LOAD && (p->p_flags & PF_W) && vaddr < p->p_vaddr + p->p_memsz &&
        end > p->p_vaddr)
      return true;
  }
  return false;
}

/*
 * What ld.so dereferences before it runs any code of the object: its
 * segments' file ranges, the dynamic section, and the tables that dynamic
 * entries point to.  A file that passes cannot make the loader read outside
 * its mappings through these; the contents of the tables (relocations, hash
 * chains, versions) are checked further down, for patches and images.
 */
static int check_loadable(elf_file *f) {
  const Elf64_Phdr *dyn = NULL;
  size_t nload = 0;
  char what[64];
  uint64_t prev_end = 0;

  for (size_t i = 0; i < f->phnum; i++) {
    const Elf64_Phdr *p = &f->ph[i];
    if (p->p_type == PT_LOAD) {
      nload++;
      if (!range_ok(f, p->p_offset, p->p_filesz, NULL)) {
        snprintf(what, sizeof what, "segment %zu (PT_LOAD) ends", i);
        return range_err(f, what, p->p_offset, p->p_filesz);
      }
      uint64_t vend;
      if (p->p_filesz > p->p_memsz ||
          __builtin_add_overflow(p->p_vaddr, p->p_memsz, &vend)) {
        molt__errmsg(f->err, f->errlen,
                     "file is corrupt: segment %zu (PT_LOAD) has inconsistent "
                     "sizes",
                     i);
        return MOLT_ECORRUPT;
      }
      /* The loader maps the segments as one reservation spanning first to
       * last and trusts their order and alignment: a huge or overlapping
       * segment makes it map over itself and fault inside dlopen.  A patch
       * is small; 1 GiB of address space is far beyond any real one. */
      uint64_t align = p->p_align ? p->p_align : 1;
      if ((align & (align - 1)) != 0 || p->p_offset % align != p->p_vaddr % align ||
          p->p_vaddr < prev_end || vend > (1ull << 30)) {
        molt__errmsg(f->err, f->errlen,
                     "file is corrupt: segment %zu (PT_LOAD) is misplaced, "
                     "misaligned or too large",
                     i);
        return MOLT_ECORRUPT;
      }
      prev_end = vend;
    } else if (p->p_type == PT_DYNAMIC) {
      if (dyn) {
        molt__errmsg(f->err, f->errlen,
                     "file is corrupt: more than one PT_DYNAMIC segment");
        return MOLT_ECORRUPT;
      }
      dyn = p;
    }
  }
  if (nload == 0) {
    molt__errmsg(f->err, f->errlen, "file is corrupt: no PT_LOAD segment");
    return MOLT_ECORRUPT;
  }
  if (!dyn) {
    molt__errmsg(f->err, f->errlen,
                 "file is corrupt: no PT_DYNAMIC segment (not a dynamically "
                 "loadable object)");
    return MOLT_ECORRUPT;
  }
  if (dyn->p_filesz < sizeof(Elf64_Dyn) ||
      !segment_of(f, dyn->p_vaddr, dyn->p_filesz, true)) {
    molt__errmsg(f->err, f->errlen,
                 "file is corrupt: PT_DYNAMIC is empty or outside the loaded "
                 "segments");
    return MOLT_ECORRUPT;
  }

  f->dyn_vaddr = dyn->p_vaddr;
  f->dyn_size = dyn->p_memsz > dyn->p_filesz ? dyn->p_memsz : dyn->p_filesz;

  Elf64_Dyn *d;
  int rc = read_alloc(f, dyn->p_offset, dyn->p_filesz, MAX_DYNAMIC_BYTES,
                      "dynamic segment ends", (void **)&d);
  if (rc)
    return rc;
  size_t nd = (size_t)(dyn->p_filesz / sizeof(Elf64_Dyn));
  uint64_t strsz = 0;
  bool have_strtab = false, have_strsz = false, terminated = false;
  size_t i;
  for (i = 0; i < nd; i++) {
    if (d[i].d_tag == DT_NULL) {
      terminated = true;
      break;
    }
    if (d[i].d_tag == DT_STRTAB)
      have_strtab = true;
    else if (d[i].d_tag == DT_STRSZ)
      strsz = d[i].d_un.d_val, have_strsz = true;
  }
  if (!terminated) {
    molt__errmsg(f->err, f->errlen,
                 "file is corrupt: the dynamic section has no DT_NULL end");
    free(d);
    return MOLT_ECORRUPT;
  }
  nd = i;

  /* Tables the loader reads through a pointer, with the entry that gives
   * each one's size (DT_NULL: unknown, only the first byte is checked). */
  static const struct {
    int64_t ptr, size;
  } tables[] = {
      {DT_STRTAB, DT_STRSZ},
      {DT_SYMTAB, DT_NULL},
      {DT_HASH, DT_NULL},
      {DT_GNU_HASH, DT_NULL},
      {DT_RELA, DT_RELASZ},
      {DT_REL, DT_RELSZ},
      {DT_JMPREL, DT_PLTRELSZ},
      {DT_INIT, DT_NULL},
      {DT_FINI, DT_NULL},
      {DT_INIT_ARRAY, DT_INIT_ARRAYSZ},
      {DT_FINI_ARRAY, DT_FINI_ARRAYSZ},
      {DT_PREINIT_ARRAY, DT_PREINIT_ARRAYSZ},
      {DT_VERSYM, DT_NULL},
      {DT_VERDEF, DT_NULL},
      {DT_VERNEED, DT_NULL},
  };
  const char *problem = NULL;
  for (i = 0; i < nd && !problem; i++) {
    int64_t tag = d[i].d_tag;
    for (size_t t = 0; t < sizeof tables / sizeof tables[0]; t++) {
      if (tables[t].ptr != tag)
        continue;
      uint64_t len = 1;
      if (tables[t].size != DT_NULL) {
        for (size_t j = 0; j < nd; j++)
          if (d[j].d_tag == tables[t].size)
            len = d[j].d_un.d_val;
      }
      if (len > 0 && !segment_of(f, d[i].d_un.d_ptr, len, false))
        problem = "points outside the loaded segments";
      break;
    }
    switch (tag) {
    case DT_NEEDED:
    case DT_SONAME:
    case DT_RPATH:
    case DT_RUNPATH:
    case DT_AUXILIARY:
    case DT_FILTER:
      if (!have_strtab || !have_strsz || d[i].d_un.d_val >= strsz)
        problem = "names a string outside the dynamic string table";
      break;
    case DT_SYMENT:
      if (d[i].d_un.d_val != sizeof(Elf64_Sym))
        problem = "has an invalid symbol entry size";
      break;
    case DT_RELAENT:
      if (d[i].d_un.d_val != sizeof(Elf64_Rela))
        problem = "has an invalid relocation entry size";
      break;
    default:
      break;
    }
    if (problem)
      molt__errmsg(f->err, f->errlen,
                   "file is corrupt: dynamic entry %zu (tag %" PRId64 ") %s", i, tag,
                   problem);
  }
  if (!problem)
    rc = check_loader_tables(f, d, nd);
  free(d);
  return problem ? MOLT_ECORRUPT : rc;
}

/* ------------------------------------------------------------------------ */
/* Notes                                                                     */
/* ------------------------------------------------------------------------ */

typedef struct note_hit {
  uint64_t desc_off; /* file offset of the descriptor */
  uint32_t descsz;
  size_t count; /* distinct notes found */
  /* If set, called on every matching note (then desc_off is the last). */
  int (*visit)(elf_file *f, uint64_t desc_off, uint32_t descsz, void *arg);
  void *arg;
  bool visit_failed; /* the error came from visit: the file, not a linker quirk */
} note_hit;

static uint64_t align_up(uint64_t v, uint64_t a) { return (v + a - 1) & ~(a - 1); }

/* Scans the notes in [off, off+size) of the file for (owner, type). */
static int scan_notes(elf_file *f, uint64_t off, uint64_t size, uint64_t align,
                      const char *where, const char *owner, uint32_t type,
                      note_hit *hit) {
  if (size == 0)
    return 0;
  /* Notes are 4-aligned, except in 8-aligned containers (gABI / gnu
   * property notes); any other alignment value is treated as 4. */
  uint64_t a = align == 8 ? 8 : 4;
  char what[96];
  snprintf(what, sizeof what, "notes of %s end", where);
  unsigned char *buf;
  int rc = read_alloc(f, off, size, MAX_NOTES_BYTES, what, (void **)&buf);
  if (rc)
    return rc;
  size_t olen = strlen(owner) + 1;
  uint64_t pos = 0;
  while (pos < size) {
    uint32_t hdr[3];
    if (size - pos < sizeof hdr) {
      molt__errmsg(f->err, f->errlen, "file is corrupt: truncated note header in %s",
                   where);
      rc = MOLT_ECORRUPT;
      break;
    }
    memcpy(hdr, buf + pos, sizeof hdr);
    uint64_t name_off = pos + sizeof hdr;
    uint64_t desc_off = align_up(name_off + hdr[0], a);
    uint64_t desc_end = desc_off + hdr[1];
    /* pos, namesz, descsz are all far below 2^62: no overflow above. */
    if (desc_end > size) {
      molt__errmsg(f->err, f->errlen,
                   "file is corrupt: note in %s overruns it (namesz %" PRIu32
                   ", descsz %" PRIu32 ", %" PRIu64 " bytes left)",
                   where, hdr[0], hdr[1], size - pos);
      rc = MOLT_ECORRUPT;
      break;
    }
    if (hdr[2] == type && hdr[0] == olen && memcmp(buf + name_off, owner, olen) == 0) {
      uint64_t abs = off + desc_off;
      if (hit->count == 0 || hit->desc_off != abs) {
        hit->count++;
        hit->desc_off = abs;
        hit->descsz = hdr[1];
        if (hit->visit && (rc = hit->visit(f, abs, hdr[1], hit->arg)) != 0) {
          hit->visit_failed = true;
          break;
        }
      }
    }
    pos = align_up(desc_end, a);
  }
  free(buf);
  return rc;
}

/* Finds the note (owner, type) in SHT_NOTE sections, and if none holds it,
 * in PT_NOTE segments (a file may lack section headers).  When the file has
 * sections, a segment that does not parse is skipped rather than fatal:
 * some linkers put notes of mixed alignment into one PT_NOTE, which cannot
 * be walked with a single alignment. */
static int find_note_visit(elf_file *f, const char *owner, uint32_t type, note_hit *hit);
static int find_note(elf_file *f, const char *owner, uint32_t type, note_hit *hit) {
  memset(hit, 0, sizeof *hit);
  return find_note_visit(f, owner, type, hit);
}

/* find_note with hit's visitor set (and the rest of *hit zero). */
static int find_note_visit(elf_file *f, const char *owner, uint32_t type, note_hit *hit) {
  char where[96], name[48];
  int rc;
  for (size_t i = 1; i < f->shnum; i++) {
    const Elf64_Shdr *s = &f->sh[i];
    if (s->sh_type != SHT_NOTE)
      continue;
    snprintf(where, sizeof where, "section %zu (%s)", i,
             printable(section_name(f, i), name, sizeof name));
    rc =
        scan_notes(f, s->sh_offset, s->sh_size, s->sh_addralign, where, owner, type, hit);
    if (rc)
      return rc;
  }
  if (hit->count)
    return 0;
  for (size_t i = 0; i < f->phnum; i++) {
    const Elf64_Phdr *p = &f->ph[i];
    if (p->p_type != PT_NOTE)
      continue;
    snprintf(where, sizeof where, "segment %zu (PT_NOTE)", i);
    rc = scan_notes(f, p->p_offset, p->p_filesz, p->p_align, where, owner, type, hit);
    if (rc == MOLT_ECORRUPT && f->shnum > 0 && !hit->visit_failed) {
      /* The sections parsed and are authoritative. */
      if (f->err && f->errlen)
        f->err[0] = '\0';
      continue;
    }
    if (rc)
      return rc;
  }
  return 0;
}

static void hex_encode(const unsigned char *p, size_t n, char *hex) {
  static const char digits[] = "0123456789abcdef";
  for (size_t i = 0; i < n; i++) {
    hex[2 * i] = digits[p[i] >> 4];
    hex[2 * i + 1] = digits[p[i] & 15];
  }
  hex[2 * n] = '\0';
}

/* ------------------------------------------------------------------------ */
/* Patch note                                                                */
/* ------------------------------------------------------------------------ */

/* Finds and checks the molt note without requiring a stamp. */
static int patch_note(elf_file *f, int fd, uint64_t *desc_off, molt__patch_note *note,
                      char *err, size_t errlen) {
  int rc = elf_open(f, fd, LOAD_PATCH, MOLT_ENOTPATCH, err, errlen);
  if (rc)
    return rc;
  note_hit hit;
  rc = find_note(f, MOLT__NOTE_NAME, MOLT__NOTE_TYPE, &hit);
  if (rc)
    return rc;
  if (hit.count == 0) {
    for (size_t i = 1; i < f->shnum; i++) {
      if (strcmp(section_name(f, i), ".note.molt") == 0) {
        molt__errmsg(err, errlen,
                     "file is corrupt: section .note.molt holds no molt patch "
                     "note");
        return MOLT_ECORRUPT;
      }
    }
    molt__errmsg(err, errlen,
                 "no molt patch note (.note.molt): was it built with moltcc "
                 "--molt-patch?");
    return MOLT_ENOTPATCH;
  }
  if (hit.count > 1) {
    molt__errmsg(err, errlen, "file is corrupt: more than one molt patch note");
    return MOLT_ECORRUPT;
  }
  uint32_t abi;
  if (hit.descsz < sizeof abi) {
    molt__errmsg(err, errlen,
                 "file is corrupt: molt patch note is %" PRIu32 " bytes, expected %zu",
                 hit.descsz, sizeof(molt__patch_note));
    return MOLT_ECORRUPT;
  }
  rc = read_exact(f, &abi, hit.desc_off, sizeof abi);
  if (rc)
    return rc;
  if (abi != MOLT__ABI) {
    molt__errmsg(err, errlen,
                 "patch was built for molt ABI %" PRIu32
                 ", this runtime implements ABI %u",
                 abi, MOLT__ABI);
    return MOLT_EABI;
  }
  if (hit.descsz != sizeof(molt__patch_note)) {
    molt__errmsg(err, errlen,
                 "file is corrupt: molt patch note is %" PRIu32 " bytes, expected %zu",
                 hit.descsz, sizeof(molt__patch_note));
    return MOLT_ECORRUPT;
  }
  rc = read_exact(f, note, hit.desc_off, sizeof *note);
  if (rc)
    return rc;
  *desc_off = hit.desc_off;
  return 0;
}

int molt__elf_patch_note_offset(int fd, uint64_t *desc_off, molt__patch_note *note,
                                char *err, size_t errlen) {
  elf_file f;
  molt__patch_note tmp;
  uint64_t off = 0;
  int rc = patch_note(&f, fd, &off, note ? note : &tmp, err, errlen);
  elf_free(&f);
  if (rc == 0 && desc_off)
    *desc_off = off;
  return rc;
}

/* ------------------------------------------------------------------------ */
/* Callback notes (MOLT_PATCH_PRE / MOLT_PATCH_POST)                         */
/* ------------------------------------------------------------------------ */

/* One callback note: well formed, the first of its kind, its target inside
 * an executable PT_LOAD segment.  The note itself must be loaded (its
 * target is relative to its own address). */
static int visit_callback(elf_file *f, uint64_t desc_off, uint32_t descsz, void *arg) {
  molt__patch_callbacks *cbs = arg;
  unsigned char buf[sizeof(molt__callback_note) + MOLT__CALLBACK_NAME_MAX];
  molt__callback_note n;
  if (descsz <= sizeof n || descsz > sizeof buf) {
    molt__errmsg(f->err, f->errlen,
                 "file is corrupt: callback note of %" PRIu32 " bytes (a callback "
                 "name is 1 to %d characters)",
                 descsz, MOLT__CALLBACK_NAME_MAX - 1);
    return MOLT_ECORRUPT;
  }
  int rc = read_exact(f, buf, desc_off, descsz);
  if (rc)
    return rc;
  memcpy(&n, buf, sizeof n);
  const char *name = (const char *)buf + sizeof n;
  size_t namemax = descsz - sizeof n;
  const char *nul = memchr(name, '\0', namemax);
  bool ident = nul && nul != name;
  for (const char *c = name; ident && c < nul; c++)
    ident = (*c >= 'a' && *c <= 'z') || (*c >= 'A' && *c <= 'Z') ||
            (*c >= '0' && *c <= '9') || *c == '_';
  if (!ident || (n.kind != MOLT__CALLBACK_PRE && n.kind != MOLT__CALLBACK_POST) ||
      n.reserved != 0) {
    molt__errmsg(f->err, f->errlen,
                 "file is corrupt: malformed callback note (kind %" PRIu32 ")", n.kind);
    return MOLT_ECORRUPT;
  }
  const char *what = n.kind == MOLT__CALLBACK_PRE ? "pre-update" : "post-update";
  molt__patch_callback *cb = n.kind == MOLT__CALLBACK_PRE ? &cbs->pre : &cbs->post;
  if (cb->present) {
    molt__errmsg(f->err, f->errlen,
                 "the patch declares two %s callbacks (%s and %s); a patch has at most "
                 "one",
                 what, cb->name, name);
    return MOLT_ECORRUPT;
  }
  /* The address of the target field: its file offset in a PT_LOAD. */
  uint64_t field_off = desc_off + offsetof(molt__callback_note, target), field = 0;
  bool loaded = false;
  for (size_t i = 0; i < f->phnum && !loaded; i++) {
    const Elf64_Phdr *p = &f->ph[i];
    if (p->p_type == PT_LOAD && field_off >= p->p_offset &&
        field_off - p->p_offset < p->p_filesz &&
        p->p_filesz - (field_off - p->p_offset) >= 8) {
      field = p->p_vaddr + (field_off - p->p_offset);
      loaded = true;
    }
  }
  uint64_t target = field + (uint64_t)n.target; /* wraps: checked below */
  const Elf64_Phdr *seg = loaded ? segment_of(f, target, 1, true) : NULL;
  if (!seg || !(seg->p_flags & PF_X)) {
    molt__errmsg(f->err, f->errlen, "file is corrupt: %s callback %s %s", what, name,
                 loaded ? "points outside the patch's code"
                        : "has a note that is not loaded");
    return MOLT_ECORRUPT;
  }
  cb->present = true;
  cb->vaddr = target;
  snprintf(cb->name, sizeof cb->name, "%s", name);
  return 0;
}

static int read_callbacks(elf_file *f, molt__patch_callbacks *out) {
  memset(out, 0, sizeof *out);
  note_hit hit = {.visit = visit_callback, .arg = out};
  return find_note_visit(f, MOLT__NOTE_NAME, MOLT__NOTE_CALLBACK_TYPE, &hit);
}

int molt__elf_read_callbacks(int fd, molt__patch_callbacks *out, char *err,
                             size_t errlen) {
  elf_file f;
  int rc = elf_open(&f, fd, LOAD_PATCH, MOLT_ENOTPATCH, err, errlen);
  if (rc == 0)
    rc = read_callbacks(&f, out);
  elf_free(&f);
  return rc;
}

int molt__elf_read_patch_note(int fd, molt__patch_note *note, char *err, size_t errlen) {
  molt__patch_note n;
  int rc = molt__elf_patch_note_offset(fd, NULL, &n, err, errlen);
  if (rc)
    return rc;
  const char *id = n.target_build_id;
  const char *nul = memchr(id, '\0', sizeof n.target_build_id);
  if (!nul) {
    molt__errmsg(err, errlen,
                 "file is corrupt: the target build-id in the molt note is "
                 "not NUL-terminated");
    return MOLT_ECORRUPT;
  }
  size_t len = (size_t)(nul - id);
  if (len == 0) {
    molt__errmsg(err, errlen,
                 "patch is not stamped with a target build-id (run moltstamp "
                 "PATCH.so PROGRAM)");
    return MOLT_ENOTPATCH;
  }
  for (size_t i = 0; i < len; i++) {
    char c = id[i];
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) {
      molt__errmsg(err, errlen,
                   "file is corrupt: the target build-id in the molt note is "
                   "not lowercase hex");
      return MOLT_ECORRUPT;
    }
  }
  if (len % 2 != 0 || len > MOLT__BUILD_ID_HEX_MAX) {
    molt__errmsg(err, errlen,
                 "file is corrupt: the target build-id in the molt note has "
                 "an invalid length (%zu hex digits)",
                 len);
    return MOLT_ECORRUPT;
  }
  if (note)
    *note = n;
  return 0;
}

/* ------------------------------------------------------------------------ */
/* Patch digest                                                              */
/* ------------------------------------------------------------------------ */

int molt__elf_patch_digest(int fd, uint64_t *off, unsigned char stored[32],
                           unsigned char computed[32], char *err, size_t errlen) {
  elf_file f;
  /* Headers only: the digest is checked before anything else of the file
   * is trusted, so that damage is reported as damage. */
  int rc = elf_open(&f, fd, 0, MOLT_ENOTPATCH, err, errlen);
  note_hit hit;
  if (rc == 0)
    rc = find_note(&f, MOLT__NOTE_NAME, MOLT__NOTE_DIGEST_TYPE, &hit);
  if (rc == 0 && hit.count == 0) {
    molt__errmsg(
        err, errlen,
        "the patch has no digest note: it was built by an older moltcc; rebuild it");
    rc = MOLT_ENOTPATCH;
  }
  if (rc == 0 && (hit.count > 1 || hit.descsz != MOLT__DIGEST_SIZE)) {
    molt__errmsg(err, errlen, "file is corrupt: malformed molt digest note");
    rc = MOLT_ECORRUPT;
  }
  unsigned char have[32];
  if (rc == 0)
    rc = read_exact(&f, have, hit.desc_off, sizeof have);
  if (rc == 0 && computed) {
    molt__sha256 sha;
    molt__sha256_init(&sha);
    unsigned char *buf = malloc(1 << 16);
    if (!buf) {
      molt__errmsg(err, errlen, "out of memory reading the file");
      rc = MOLT_ENOMEM;
    }
    for (uint64_t pos = 0; rc == 0 && pos < f.size;) {
      uint64_t n = f.size - pos < (1 << 16) ? f.size - pos : (1 << 16);
      rc = read_exact(&f, buf, pos, n);
      if (rc)
        break;
      /* The digest's own bytes count as zeros. */
      for (uint64_t i = 0; i < n; i++)
        if (pos + i >= hit.desc_off && pos + i < hit.desc_off + MOLT__DIGEST_SIZE)
          buf[i] = 0;
      molt__sha256_add(&sha, buf, (size_t)n);
      pos += n;
    }
    free(buf);
    if (rc == 0)
      molt__sha256_final(&sha, computed);
  }
  if (rc == 0) {
    if (off)
      *off = hit.desc_off;
    if (stored)
      memcpy(stored, have, sizeof have);
  }
  elf_free(&f);
  return rc;
}

int molt__elf_check_digest(int fd, char *err, size_t errlen) {
  unsigned char stored[32], computed[32];
  static const unsigned char zero[32];
  int rc = molt__elf_patch_digest(fd, NULL, stored, computed, err, errlen);
  if (rc)
    return rc;
  if (memcmp(stored, zero, sizeof zero) == 0) {
    molt__errmsg(err, errlen,
                 "the patch is not sealed with a digest (run moltstamp PATCH.so "
                 "PROGRAM)");
    return MOLT_ENOTPATCH;
  }
  if (memcmp(stored, computed, sizeof computed) != 0) {
    molt__errmsg(
        err, errlen,
        "the patch file is damaged: its contents do not match the digest moltstamp "
        "sealed it with");
    return MOLT_ECORRUPT;
  }
  return 0;
}

int molt__elf_check_shared_object(int fd, char *err, size_t errlen) {
  elf_file f;
  int rc = elf_open(&f, fd, LOAD_PATCH, MOLT_ENOTPROGRAM, err, errlen);
  elf_free(&f);
  return rc;
}

/* ------------------------------------------------------------------------ */
/* Dynamic relocations of a patch                                            */
/* ------------------------------------------------------------------------ */

#define MAX_RELOC_BYTES ((uint64_t)64 << 20)
#define MAX_SEGMENTS 64

/* The file offset of [vaddr, vaddr+len) of a file-backed part of a PT_LOAD
 * segment, false if there is none. */
static bool vaddr_to_off(const elf_file *f, uint64_t vaddr, uint64_t len, uint64_t *off) {
  const Elf64_Phdr *p = segment_of(f, vaddr, len, true);
  if (!p)
    return false;
  *off = p->p_offset + (vaddr - p->p_vaddr);
  return true;
}

/* The dynamic entry `tag` (its d_val / d_ptr), false if absent. */
static bool dyn_value(const Elf64_Dyn *d, size_t nd, int64_t tag, uint64_t *v) {
  for (size_t i = 0; i < nd && d[i].d_tag != DT_NULL; i++)
    if (d[i].d_tag == tag) {
      *v = d[i].d_un.d_val;
      return true;
    }
  return false;
}

/* Appends the Elf64_Rela table at [vaddr, vaddr+size) to dr->rels. */
static int read_relas(elf_file *f, molt__dynrels *dr, uint64_t vaddr, uint64_t size,
                      const char *what) {
  uint64_t off;
  if (size == 0)
    return 0;
  if (size % sizeof(Elf64_Rela) || !vaddr_to_off(f, vaddr, size, &off)) {
    molt__errmsg(f->err, f->errlen,
                 "file is corrupt: %s lies outside the file or has a partial entry",
                 what);
    return MOLT_ECORRUPT;
  }
  Elf64_Rela *r;
  int rc = read_alloc(f, off, size, MAX_RELOC_BYTES, what, (void **)&r);
  if (rc)
    return rc;
  size_t n = (size_t)(size / sizeof(Elf64_Rela));
  molt__dynrel *p = realloc(dr->rels, (dr->nrels + n) * sizeof *p);
  if (!p) {
    free(r);
    molt__errmsg(f->err, f->errlen, "out of memory reading the file");
    return MOLT_ENOMEM;
  }
  dr->rels = p;
  for (size_t i = 0; i < n; i++) {
    molt__dynrel *e = &dr->rels[dr->nrels++];
    e->offset = r[i].r_offset;
    e->addend = r[i].r_addend;
    e->type = (uint32_t)ELF64_R_TYPE(r[i].r_info);
    e->sym = (uint32_t)ELF64_R_SYM(r[i].r_info);
  }
  free(r);
  return 0;
}

static int dynrels_load(elf_file *f, molt__dynrels *dr) {
  const Elf64_Phdr *dyn = NULL;
  size_t nseg = 0;
  for (size_t i = 0; i < f->phnum; i++) {
    const Elf64_Phdr *p = &f->ph[i];
    if (p->p_type == PT_DYNAMIC)
      dyn = p;
    else if (p->p_type == PT_GNU_RELRO) {
      dr->relro_start = p->p_vaddr;
      dr->relro_end = p->p_vaddr + p->p_memsz; /* in a loadable segment: no overflow */
    } else if (p->p_type == PT_LOAD && nseg < MAX_SEGMENTS) {
      dr->segs[nseg].start = p->p_vaddr;
      dr->segs[nseg].end = p->p_vaddr + p->p_memsz;
      dr->segs[nseg].writable = (p->p_flags & PF_W) != 0;
      dr->segs[nseg].executable = (p->p_flags & PF_X) != 0;
      nseg++;
    }
  }
  dr->nsegs = nseg;
  f->dyn_vaddr = dyn->p_vaddr;
  f->dyn_size = dyn->p_memsz > dyn->p_filesz ? dyn->p_memsz : dyn->p_filesz;

  Elf64_Dyn *d;
  int rc = read_alloc(f, dyn->p_offset, dyn->p_filesz, MAX_DYNAMIC_BYTES,
                      "dynamic segment ends", (void **)&d);
  if (rc)
    return rc;
  size_t nd = (size_t)(dyn->p_filesz / sizeof(Elf64_Dyn));
  uint64_t rela = 0, relasz = 0, jmprel = 0, pltrelsz = 0, pltrel = DT_RELA, symtab = 0,
           strtab = 0, strsz = 0, v;
  bool has_rela = dyn_value(d, nd, DT_RELA, &rela);
  dyn_value(d, nd, DT_RELASZ, &relasz);
  bool has_jmprel = dyn_value(d, nd, DT_JMPREL, &jmprel);
  dyn_value(d, nd, DT_PLTRELSZ, &pltrelsz);
  dyn_value(d, nd, DT_PLTREL, &pltrel);
  bool has_symtab = dyn_value(d, nd, DT_SYMTAB, &symtab);
  bool has_strtab = dyn_value(d, nd, DT_STRTAB, &strtab);
  dyn_value(d, nd, DT_STRSZ, &strsz);
  bool has_rel = dyn_value(d, nd, DT_REL, &v);
  free(d);
  if (has_rel || (has_jmprel && pltrel != DT_RELA)) {
    molt__errmsg(f->err, f->errlen,
                 "file is corrupt: DT_REL relocations (this machine uses DT_RELA)");
    return MOLT_ECORRUPT;
  }
  if (has_rela && (rc = read_relas(f, dr, rela, relasz, "DT_RELA table")) != 0)
    return rc;
  /* Some linkers count the PLT relocations in DT_RELASZ too. */
  bool inside = has_rela && jmprel >= rela && jmprel - rela < relasz;
  if (has_jmprel && !inside &&
      (rc = read_relas(f, dr, jmprel, pltrelsz, "DT_JMPREL table")) != 0)
    return rc;

  uint32_t maxsym = 0;
  for (size_t i = 0; i < dr->nrels; i++)
    if (dr->rels[i].sym > maxsym)
      maxsym = dr->rels[i].sym;
  if (maxsym == 0)
    return 0;
  uint64_t off;
  if (!has_symtab || !has_strtab || !vaddr_to_off(f, strtab, strsz, &off)) {
    molt__errmsg(f->err, f->errlen,
                 "file is corrupt: relocations name symbols but the dynamic symbol "
                 "or string table is missing");
    return MOLT_ECORRUPT;
  }
  rc = read_alloc(f, off, strsz, MAX_STRTAB_BYTES, "dynamic string table ends",
                  (void **)&dr->strtab);
  if (rc)
    return rc;
  uint64_t nsyms = (uint64_t)maxsym + 1, bytes = nsyms * sizeof(Elf64_Sym);
  if (!vaddr_to_off(f, symtab, bytes, &off)) {
    molt__errmsg(f->err, f->errlen,
                 "file is corrupt: relocation symbol %" PRIu32
                 " lies outside the dynamic symbol table",
                 maxsym);
    return MOLT_ECORRUPT;
  }
  Elf64_Sym *syms;
  rc = read_alloc(f, off, bytes, MAX_SYMTAB_BYTES, "dynamic symbol table ends",
                  (void **)&syms);
  if (rc)
    return rc;
  dr->syms = calloc((size_t)nsyms, sizeof *dr->syms);
  if (!dr->syms) {
    free(syms);
    molt__errmsg(f->err, f->errlen, "out of memory reading the file");
    return MOLT_ENOMEM;
  }
  dr->nsyms = (size_t)nsyms;
  for (size_t i = 0; i < dr->nsyms; i++) {
    if (syms[i].st_name >= strsz) {
      free(syms);
      molt__errmsg(f->err, f->errlen,
                   "file is corrupt: dynamic symbol %zu has its name outside the "
                   "string table",
                   i);
      return MOLT_ECORRUPT;
    }
    dr->syms[i].name = dr->strtab + syms[i].st_name;
    dr->syms[i].file_off = off + i * sizeof(Elf64_Sym);
    dr->syms[i].bind = ELF64_ST_BIND(syms[i].st_info);
    dr->syms[i].type = ELF64_ST_TYPE(syms[i].st_info);
    dr->syms[i].defined = syms[i].st_shndx != SHN_UNDEF;
  }
  free(syms);
  return 0;
}

int molt__elf_read_dynrels(int fd, molt__dynrels *dr, char *err, size_t errlen) {
  memset(dr, 0, sizeof *dr);
  elf_file f;
  int rc = elf_open(&f, fd, LOAD_PATCH, MOLT_ENOTPATCH, err, errlen);
  if (rc == 0)
    rc = dynrels_load(&f, dr);
  elf_free(&f);
  if (rc)
    molt__elf_free_dynrels(dr);
  return rc;
}

void molt__elf_free_dynrels(molt__dynrels *dr) {
  free(dr->rels);
  free(dr->syms);
  free(dr->strtab);
  memset(dr, 0, sizeof *dr);
}

int molt__dynrels_place(const molt__dynrels *dr, uint64_t vaddr, uint64_t len) {
  uint64_t end;
  if (__builtin_add_overflow(vaddr, len, &end))
    return 0;
  for (size_t i = 0; i < dr->nsegs; i++) {
    if (vaddr < dr->segs[i].start || end > dr->segs[i].end)
      continue;
    if (vaddr >= dr->relro_start && end <= dr->relro_end)
      return 2;
    return dr->segs[i].writable ? 1 : 0;
  }
  return 0;
}

/* ------------------------------------------------------------------------ */
/* What the dynamic loader trusts                                            */
/* ------------------------------------------------------------------------ */

/*
 * ld.so validates little of an object before it uses it: a damaged hash
 * table makes it assert and _exit the process, a bad chain makes symbol
 * lookup loop or read outside the mapping, a relocation writes wherever its
 * offset says, a version entry names a library it then asserts is loaded.
 * These checks cover everything it reads or writes through an offset or
 * index taken from the file (glibc 2.36: dl-load.c, dl-setup_hash,
 * do-lookup.h, dl-version.c, dl-reloc.c, x86_64 dl-machine.h, the GNU
 * property notes), so that a file passing them can make dlopen fail at
 * worst, never crash or stop the host.  They read the same bytes the loader
 * maps: every table is located through the PT_LOAD segments (its virtual
 * address), as the loader locates it, never through section headers, and
 * each segment the loader reads in memory must sit at the file offset its
 * header claims.
 */

#define MAX_HASH_WORDS ((uint64_t)1 << 24)
#define MAX_DYN_SYMS ((uint64_t)1 << 22)

static int corrupt(elf_file *f, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
static int corrupt(elf_file *f, const char *fmt, ...) {
  char msg[400];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  molt__errmsg(f->err, f->errlen, "file is corrupt: %s", msg);
  return MOLT_ECORRUPT;
}

static const char *segment_type_name(uint32_t t) {
  switch (t) {
  case PT_NOTE:
    return "PT_NOTE";
  case PT_PHDR:
    return "PT_PHDR";
  case PT_TLS:
    return "PT_TLS";
  case PT_GNU_EH_FRAME:
    return "PT_GNU_EH_FRAME";
  case PT_GNU_PROPERTY:
    return "PT_GNU_PROPERTY";
  case PT_GNU_RELRO:
    return "PT_GNU_RELRO";
  case PT_DYNAMIC:
    return "PT_DYNAMIC";
  default:
    return "segment";
  }
}

/* Program headers beyond what check_loadable looks at: known types only,
 * no writable and executable segment, no executable stack, and every
 * segment the loader reads in memory (dynamic section, notes, TLS image,
 * program headers, unwind table, RELRO) inside a loaded segment at the file
 * offset its header says. */
static int check_segments(elf_file *f) {
  for (size_t i = 0; i < f->phnum; i++) {
    const Elf64_Phdr *p = &f->ph[i];
    switch (p->p_type) {
    case PT_NULL:
    case PT_INTERP:
      break;
    case PT_LOAD:
      if ((p->p_flags & (PF_W | PF_X)) == (PF_W | PF_X))
        return corrupt(f, "segment %zu (PT_LOAD) is both writable and executable", i);
      /* ld.so reads the program headers, notes and tables in the mapped
       * segments: an unreadable one faults it. */
      if (!(p->p_flags & PF_R) || (p->p_flags & ~(uint32_t)(PF_R | PF_W | PF_X)))
        return corrupt(f,
                       "segment %zu (PT_LOAD) has flags %#" PRIx32
                       " (loaded segments are readable)",
                       i, p->p_flags);
      break;
    case PT_GNU_STACK:
      if (p->p_flags & PF_X)
        return corrupt(f,
                       "segment %zu asks for an executable stack (PT_GNU_STACK "
                       "PF_X); loading it would make every thread's stack executable",
                       i);
      break;
    case PT_GNU_RELRO:
      if (!segment_of(f, p->p_vaddr, p->p_memsz, false))
        return corrupt(f, "segment %zu (PT_GNU_RELRO) is not inside a loaded segment", i);
      break;
    case PT_DYNAMIC:
    case PT_NOTE:
    case PT_PHDR:
    case PT_TLS:
    case PT_GNU_EH_FRAME:
    case PT_GNU_PROPERTY: {
      uint64_t off;
      uint64_t align = p->p_align ? p->p_align : 1;
      if (p->p_filesz > p->p_memsz || (align & (align - 1)) != 0)
        return corrupt(f, "segment %zu (%s) has inconsistent sizes or alignment", i,
                       segment_type_name(p->p_type));
      if (p->p_filesz == 0 && p->p_type != PT_TLS)
        return corrupt(f, "segment %zu (%s) is empty", i, segment_type_name(p->p_type));
      if (p->p_filesz > 0 &&
          (!vaddr_to_off(f, p->p_vaddr, p->p_filesz, &off) || off != p->p_offset))
        return corrupt(f, "segment %zu (%s) is not where its loaded segment maps it", i,
                       segment_type_name(p->p_type));
      if (p->p_type == PT_PHDR &&
          (p->p_offset != f->eh.e_phoff ||
           p->p_filesz != (uint64_t)f->phnum * sizeof(Elf64_Phdr)))
        return corrupt(f, "segment %zu (PT_PHDR) does not cover the program headers", i);
      if (p->p_type == PT_NOTE || p->p_type == PT_GNU_PROPERTY) {
        if (p->p_align != 4 && p->p_align != 8)
          return corrupt(f, "segment %zu (%s) has note alignment %" PRIu64, i,
                         segment_type_name(p->p_type), p->p_align);
        char where[48];
        snprintf(where, sizeof where, "segment %zu (%s)", i,
                 segment_type_name(p->p_type));
        note_hit hit;
        memset(&hit, 0, sizeof hit);
        int rc = scan_notes(f, p->p_offset, p->p_filesz, p->p_align, where, "", 0, &hit);
        if (rc)
          return rc;
      }
      break;
    }
    default:
      return corrupt(f, "segment %zu has unknown type %#" PRIx32, i, p->p_type);
    }
  }
  return 0;
}

/* [vaddr, vaddr+len) of a file-backed part of a segment, read into a fresh
 * buffer; `what` names the table in messages. */
static int read_table(elf_file *f, uint64_t vaddr, uint64_t len, uint64_t cap,
                      const char *what, void **out) {
  uint64_t off;
  *out = NULL;
  if (!vaddr_to_off(f, vaddr, len, &off))
    return corrupt(f,
                   "%s (%" PRIu64 " bytes at %#" PRIx64
                   ") is not inside a loaded part of the file",
                   what, len, vaddr);
  /* The loader reads these tables again after it relocated the object
   * (every dlsym walks the hash table, symbols and strings): checked here,
   * they must stay as checked, so no relocation may reach them.  Linkers
   * put them in the read-only segment; one in a writable segment is
   * damage. */
  if (meets_writable(f, vaddr, len))
    return corrupt(f,
                   "%s (%" PRIu64 " bytes at %#" PRIx64
                   ") lies in a writable segment, where relocations could change it",
                   what, len, vaddr);
  return read_alloc(f, off, len, cap, what, out);
}

/* The bytes of the file-backed segment part from vaddr on (at most cap). */
static int read_rest(elf_file *f, uint64_t vaddr, uint64_t cap, const char *what,
                     uint32_t **out, uint64_t *len) {
  const Elf64_Phdr *p = segment_of(f, vaddr, 1, true);
  if (!p)
    return corrupt(f, "%s at %#" PRIx64 " is not inside a loaded part of the file", what,
                   vaddr);
  uint64_t n = p->p_vaddr + p->p_filesz - vaddr;
  if (n > cap)
    n = cap;
  n &= ~(uint64_t)3;
  *len = n;
  return read_table(f, vaddr, n ? n : 4, cap + 4, what, (void **)out);
}

/* Checks DT_HASH and returns the number of symbols it covers (nchain). */
static int check_sysv_hash(elf_file *f, uint64_t vaddr, uint64_t *nsyms) {
  uint32_t *h;
  int rc = read_table(f, vaddr, 8, 8, "DT_HASH table", (void **)&h);
  if (rc)
    return rc;
  uint64_t nbucket = h[0], nchain = h[1];
  free(h);
  if (nbucket == 0 || nbucket > MAX_HASH_WORDS || nchain > MAX_DYN_SYMS)
    return corrupt(f, "DT_HASH has %" PRIu64 " buckets and %" PRIu64 " chain entries",
                   nbucket, nchain);
  rc = read_table(f, vaddr, (2 + nbucket + nchain) * 4, (2 + MAX_HASH_WORDS * 2) * 4,
                  "DT_HASH table", (void **)&h);
  if (rc)
    return rc;
  const uint32_t *bucket = h + 2, *chain = h + 2 + nbucket;
  /* Chains must end (STN_UNDEF) without a cycle: lookup walks them
   * unbounded.  seen[i] is the bucket+1 whose walk passed i first; meeting
   * our own mark is a cycle, an earlier walk's mark a checked tail. */
  uint32_t *seen = nchain ? calloc((size_t)nchain, sizeof *seen) : NULL;
  if (nchain && !seen) {
    free(h);
    molt__errmsg(f->err, f->errlen, "out of memory reading the file");
    return MOLT_ENOMEM;
  }
  rc = 0;
  for (uint64_t b = 0; b < nbucket && !rc; b++) {
    for (uint64_t i = bucket[b]; i != STN_UNDEF; i = chain[i]) {
      if (i >= nchain) {
        rc = corrupt(f, "DT_HASH names symbol %" PRIu64 " of %" PRIu64, i, nchain);
        break;
      }
      if (seen[i] == b + 1) {
        rc = corrupt(f, "DT_HASH chain of bucket %" PRIu64 " loops", b);
        break;
      }
      if (seen[i])
        break;
      seen[i] = (uint32_t)(b + 1);
    }
  }
  free(seen);
  free(h);
  *nsyms = nchain;
  return rc;
}

/* Checks DT_GNU_HASH and returns the number of symbols it covers. */
static int check_gnu_hash(elf_file *f, uint64_t vaddr, uint64_t *nsyms) {
  uint32_t *h;
  int rc = read_table(f, vaddr, 16, 16, "DT_GNU_HASH table", (void **)&h);
  if (rc)
    return rc;
  uint64_t nbuckets = h[0], symbias = h[1], nwords = h[2], shift = h[3];
  free(h);
  /* ld.so divides by nbuckets and masks with nwords - 1. */
  if (nbuckets == 0 || nbuckets > MAX_HASH_WORDS || nwords == 0 ||
      nwords > MAX_HASH_WORDS || (nwords & (nwords - 1)) != 0 || shift >= 64 ||
      symbias > MAX_DYN_SYMS)
    return corrupt(f,
                   "DT_GNU_HASH header (%" PRIu64 " buckets, symbol offset %" PRIu64
                   ", %" PRIu64 " bloom words, shift %" PRIu64 ")",
                   nbuckets, symbias, nwords, shift);
  uint64_t head = 16 + nwords * 8 + nbuckets * 4;
  uint32_t *buckets;
  rc = read_table(f, vaddr + 16 + nwords * 8, nbuckets * 4, MAX_HASH_WORDS * 4,
                  "DT_GNU_HASH buckets", (void **)&buckets);
  if (rc)
    return rc;
  /* The chains run from the end of the buckets up to the end of the
   * segment at most; each ends at a word with bit 0 set. */
  uint32_t *chain = NULL;
  uint64_t clen = 0;
  uint64_t n = symbias;
  bool any = false;
  for (uint64_t b = 0; b < nbuckets && !rc; b++)
    any |= buckets[b] != 0;
  if (any)
    rc =
        read_rest(f, vaddr + head, MAX_DYN_SYMS * 4, "DT_GNU_HASH chains", &chain, &clen);
  uint64_t cwords = clen / 4;
  for (uint64_t b = 0; b < nbuckets && !rc; b++) {
    uint64_t i = buckets[b];
    if (i == 0)
      continue;
    if (i < symbias) {
      rc = corrupt(f,
                   "DT_GNU_HASH bucket %" PRIu64 " names symbol %" PRIu64
                   " below the hashed ones (%" PRIu64 ")",
                   b, i, symbias);
      break;
    }
    for (;; i++) {
      if (i - symbias >= cwords || i >= MAX_DYN_SYMS) {
        rc = corrupt(f, "DT_GNU_HASH chain of bucket %" PRIu64 " does not end", b);
        break;
      }
      if (chain[i - symbias] & 1)
        break;
    }
    if (!rc && i + 1 > n)
      n = i + 1;
  }
  free(chain);
  free(buckets);
  *nsyms = n;
  return rc;
}

/* Version tables (dl-version.c): the loader walks verneed/verdef by their
 * next offsets, asserts that every verneed file is a loaded dependency,
 * and indexes its version array with versym values. */
static int check_versions(elf_file *f, const Elf64_Dyn *d, size_t nd, const char *str,
                          uint64_t strsz, uint64_t nsyms) {
  uint64_t vaddr, count = 0, max_ndx = 1;
  int rc;
  if (dyn_value(d, nd, DT_VERNEED, &vaddr)) {
    dyn_value(d, nd, DT_VERNEEDNUM, &count);
    if (count == 0 || count > 4096)
      return corrupt(f, "DT_VERNEEDNUM is %" PRIu64, count);
    for (uint64_t k = 0;; k++) {
      Elf64_Verneed *vn;
      if ((rc = read_table(f, vaddr, sizeof *vn, sizeof *vn, "DT_VERNEED entry",
                           (void **)&vn)))
        return rc;
      Elf64_Verneed e = *vn;
      free(vn);
      if (e.vn_version != 1 || e.vn_file >= strsz || e.vn_cnt == 0 || e.vn_cnt > 4096)
        return corrupt(f, "DT_VERNEED entry %" PRIu64 " is malformed", k);
      bool needed = false;
      for (size_t i = 0; i < nd; i++)
        needed |= d[i].d_tag == DT_NEEDED && d[i].d_un.d_val < strsz &&
                  strcmp(str + d[i].d_un.d_val, str + e.vn_file) == 0;
      if (!needed)
        return corrupt(f,
                       "DT_VERNEED entry %" PRIu64 " names a library that is not "
                       "DT_NEEDED",
                       k);
      uint64_t a = vaddr + e.vn_aux;
      for (uint64_t j = 0; j < e.vn_cnt; j++) {
        Elf64_Vernaux *ax;
        if (a < vaddr || (rc = read_table(f, a, sizeof *ax, sizeof *ax,
                                          "DT_VERNEED version", (void **)&ax)))
          return a < vaddr ? corrupt(f, "DT_VERNEED version out of range") : rc;
        Elf64_Vernaux x = *ax;
        free(ax);
        if (x.vna_name >= strsz)
          return corrupt(f, "DT_VERNEED version name outside the string table");
        if ((x.vna_other & 0x7fff) > max_ndx)
          max_ndx = x.vna_other & 0x7fff;
        if ((x.vna_next == 0) != (j + 1 == e.vn_cnt))
          return corrupt(f, "DT_VERNEED entry %" PRIu64 " has a wrong version count", k);
        a += x.vna_next;
      }
      if ((e.vn_next == 0) != (k + 1 == count))
        return corrupt(f, "DT_VERNEED has a wrong entry count");
      if (e.vn_next == 0)
        break;
      vaddr += e.vn_next;
    }
  }
  if (dyn_value(d, nd, DT_VERDEF, &vaddr)) {
    count = 0;
    dyn_value(d, nd, DT_VERDEFNUM, &count);
    if (count == 0 || count > 4096)
      return corrupt(f, "DT_VERDEFNUM is %" PRIu64, count);
    for (uint64_t k = 0;; k++) {
      Elf64_Verdef *vd;
      if ((rc = read_table(f, vaddr, sizeof *vd, sizeof *vd, "DT_VERDEF entry",
                           (void **)&vd)))
        return rc;
      Elf64_Verdef e = *vd;
      free(vd);
      Elf64_Verdaux *ax;
      if (e.vd_version != 1 || e.vd_cnt == 0 ||
          (rc = read_table(f, vaddr + e.vd_aux, sizeof *ax, sizeof *ax, "DT_VERDEF name",
                           (void **)&ax)))
        return rc ? rc : corrupt(f, "DT_VERDEF entry %" PRIu64 " is malformed", k);
      uint32_t name = ax->vda_name;
      free(ax);
      if (name >= strsz)
        return corrupt(f, "DT_VERDEF name outside the string table");
      if ((e.vd_ndx & 0x7fff) > max_ndx)
        max_ndx = e.vd_ndx & 0x7fff;
      if ((e.vd_next == 0) != (k + 1 == count))
        return corrupt(f, "DT_VERDEF has a wrong entry count");
      if (e.vd_next == 0)
        break;
      vaddr += e.vd_next;
    }
  }
  if (dyn_value(d, nd, DT_VERSYM, &vaddr)) {
    uint16_t *vs;
    if ((rc = read_table(f, vaddr, nsyms * 2, MAX_DYN_SYMS * 2, "DT_VERSYM table",
                         (void **)&vs)))
      return rc;
    for (uint64_t i = 0; i < nsyms && !rc; i++)
      if ((vs[i] & 0x7fff) > max_ndx)
        rc = corrupt(f, "DT_VERSYM entry %" PRIu64 " names version %u of %" PRIu64, i,
                     vs[i] & 0x7fff, max_ndx);
    free(vs);
    if (rc)
      return rc;
  }
  return 0;
}

/* Relocation types molt lets ld.so apply for an x86-64 object and how many
 * bytes each writes: not COPY (copies from another object by a size the
 * file gives); IRELATIVE (calls a resolver of the object) in program
 * images only, whose code is the program's own. */
static unsigned reloc_width(uint32_t type) {
#if defined(__x86_64__)
  switch (type) {
  case R_X86_64_NONE:
    return 0;
  case R_X86_64_64:
  case R_X86_64_GLOB_DAT:
  case R_X86_64_JUMP_SLOT:
  case R_X86_64_RELATIVE:
  case R_X86_64_DTPMOD64:
  case R_X86_64_DTPOFF64:
  case R_X86_64_TPOFF64:
    return 8;
  case R_X86_64_TLSDESC:
    return 16;
  case R_X86_64_IRELATIVE: /* calls a resolver: images only (check_relocs) */
    return 8;
  default:
    return ~0u;
  }
#else
  (void)type;
  return 8;
#endif
}

static bool in_writable_segment(const elf_file *f, uint64_t vaddr, uint64_t len) {
  const Elf64_Phdr *p = segment_of(f, vaddr, len, false);
  return p && (p->p_flags & PF_W);
}

/* With syms NULL only raises *nsyms to cover every symbol a relocation
 * names (the loader reads those too, hashed or not); then checks each
 * relocation against the symbols. */
static int check_relocs(elf_file *f, uint64_t vaddr, uint64_t size, const char *what,
                        const Elf64_Sym *syms, uint64_t *nsyms_io) {
  uint64_t nsyms = *nsyms_io;
  if (size == 0)
    return 0;
  if (size % sizeof(Elf64_Rela))
    return corrupt(f, "%s has a partial entry", what);
  Elf64_Rela *r;
  int rc = read_table(f, vaddr, size, MAX_RELOC_BYTES, what, (void **)&r);
  if (rc)
    return rc;
  size_t n = (size_t)(size / sizeof(Elf64_Rela));
  if (!syms) {
    for (size_t i = 0; i < n; i++)
      if (ELF64_R_SYM(r[i].r_info) >= *nsyms_io)
        *nsyms_io = ELF64_R_SYM(r[i].r_info) + 1;
    free(r);
    if (*nsyms_io > MAX_DYN_SYMS)
      return corrupt(f, "%s names symbol %" PRIu64, what, *nsyms_io - 1);
    return 0;
  }
  /* ld.so applies the first DT_RELACOUNT entries as RELATIVE ones and
   * asserts that they are. */
  uint64_t relative = 0;
  if (strcmp(what, "DT_RELA table") == 0 && f->relacount) {
    relative = f->relacount;
    if (relative > n) {
      free(r);
      return corrupt(f, "DT_RELACOUNT %" PRIu64 " exceeds the %zu relocations", relative,
                     n);
    }
  }
  for (size_t i = 0; i < n && !rc; i++) {
    uint32_t type = (uint32_t)ELF64_R_TYPE(r[i].r_info);
    uint64_t sym = ELF64_R_SYM(r[i].r_info);
    unsigned w = reloc_width(type);
#if defined(__x86_64__)
    if (i < relative && type != R_X86_64_RELATIVE) {
      rc = corrupt(f, "%s entry %zu is not RELATIVE, but DT_RELACOUNT says it is", what,
                   i);
      break;
    }
#endif
    if (w == ~0u)
      rc = corrupt(f,
                   "%s entry %zu has relocation type %" PRIu32
                   ", which molt does not let the loader apply",
                   what, i, type);
    else if (sym >= nsyms)
      rc = corrupt(f, "%s entry %zu names symbol %" PRIu64 " of %" PRIu64, what, i, sym,
                   nsyms);
    else if (w && !in_writable_segment(f, r[i].r_offset, w))
      rc =
          corrupt(f, "%s entry %zu writes at %#" PRIx64 ", outside the writable segments",
                  what, i, (uint64_t)r[i].r_offset);
    /* The dynamic section is writable (RELRO) but ld.so reads its table
     * pointers on every later symbol lookup: a relocation there would turn
     * them into whatever it writes. */
    else if (w && r[i].r_offset < f->dyn_vaddr + f->dyn_size &&
             r[i].r_offset + w > f->dyn_vaddr)
      rc = corrupt(f, "%s entry %zu writes at %#" PRIx64 ", into the dynamic section",
                   what, i, (uint64_t)r[i].r_offset);
#if defined(__x86_64__)
    else if ((f->flags & LOAD_NO_CODE) && type == R_X86_64_IRELATIVE)
      rc = corrupt(f,
                   "%s entry %zu is an IRELATIVE relocation (its resolver would run "
                   "inside dlopen)",
                   what, i);
#endif
    else if ((f->flags & LOAD_NO_CODE) && sym &&
             ELF64_ST_TYPE(syms[sym].st_info) == STT_GNU_IFUNC)
      rc = corrupt(f,
                   "%s entry %zu refers to an IFUNC symbol (its resolver would run "
                   "inside dlopen)",
                   what, i);
  }
  free(r);
  return rc;
}

/* Dynamic tags ld.so must not see in a patch or image: relocation kinds
 * this machine does not use, text relocations, and objects it would load
 * besides the file (auditors, filtees). */
static const char *forbidden_tag(int64_t tag) {
  switch (tag) {
  case DT_REL:
  case DT_RELSZ:
  case DT_RELENT:
    return "DT_REL relocations (this machine uses DT_RELA)";
  case DT_RELR:
  case DT_RELRSZ:
  case DT_RELRENT:
    return "packed relative relocations (DT_RELR; link without -z pack-relative-relocs)";
  case DT_TEXTREL:
    return "text relocations (DT_TEXTREL; compile with -fPIC)";
  case DT_AUXILIARY:
  case DT_FILTER:
    return "a filter entry (the loader would load another object)";
  case DT_AUDIT:
  case DT_DEPAUDIT:
    return "an audit entry (the loader would load an auditor)";
  default:
    return NULL;
  }
}

/* The tags a patch or image may have: those ld.so reads benignly once the
 * tables they name are checked.  Anything else -- a tag a damaged byte
 * made up, or one of the ranges ld.so indexes (DT_ADDRRNG, DT_VALRNG) that
 * molt does not check -- is refused. */
static bool known_tag(int64_t tag) {
  switch (tag) {
  case DT_NEEDED:
  case DT_PLTRELSZ:
  case DT_PLTGOT:
  case DT_HASH:
  case DT_STRTAB:
  case DT_SYMTAB:
  case DT_RELA:
  case DT_RELASZ:
  case DT_RELAENT:
  case DT_STRSZ:
  case DT_SYMENT:
  case DT_INIT:
  case DT_FINI:
  case DT_SONAME:
  case DT_RPATH:
  case DT_SYMBOLIC:
  case DT_DEBUG:
  case DT_JMPREL:
  case DT_BIND_NOW:
  case DT_INIT_ARRAY:
  case DT_FINI_ARRAY:
  case DT_INIT_ARRAYSZ:
  case DT_FINI_ARRAYSZ:
  case DT_RUNPATH:
  case DT_FLAGS:
  case DT_PREINIT_ARRAY:
  case DT_PREINIT_ARRAYSZ:
  case DT_PLTREL:
  case DT_GNU_HASH:
  case DT_VERSYM:
  case DT_RELACOUNT:
  case DT_FLAGS_1:
  case DT_VERDEF:
  case DT_VERDEFNUM:
  case DT_VERNEED:
  case DT_VERNEEDNUM:
    return true;
  default:
    return false;
  }
}

static const char *code_tag(int64_t tag) {
  switch (tag) {
  case DT_INIT:
    return "DT_INIT (an _init function)";
  case DT_INIT_ARRAY:
  case DT_INIT_ARRAYSZ:
    return "DT_INIT_ARRAY (constructors)";
  case DT_PREINIT_ARRAY:
  case DT_PREINIT_ARRAYSZ:
    return "DT_PREINIT_ARRAY (pre-initializers)";
  case DT_FINI:
    return "DT_FINI (an _fini function)";
  case DT_FINI_ARRAY:
  case DT_FINI_ARRAYSZ:
    return "DT_FINI_ARRAY (destructors)";
  default:
    return NULL;
  }
}

static int check_loader_tables(elf_file *f, const Elf64_Dyn *d, size_t nd) {
  /* One entry per tag: ld.so keeps the last of duplicates, molt's readers
   * the first, and the two must see the same table. */
  for (size_t i = 0; i < nd; i++) {
    int64_t tag = d[i].d_tag;
    const char *why = forbidden_tag(tag);
    if (why)
      return corrupt(f, "dynamic entry %zu: %s", i, why);
    if ((f->flags & LOAD_NO_CODE) && (why = code_tag(tag)) != NULL) {
      molt__errmsg(f->err, f->errlen,
                   "the patch has %s: a patch must not run code when it is loaded or "
                   "unloaded (remove constructors/destructors; build it with moltcc)",
                   why);
      return MOLT_ENOTPATCH;
    }
    if (!known_tag(tag))
      return corrupt(f,
                     "dynamic entry %zu has tag %#" PRIx64 ", which molt does not know",
                     i, (uint64_t)tag);
    if (tag == DT_NEEDED)
      continue;
    for (size_t j = i + 1; j < nd; j++)
      if (d[j].d_tag == tag)
        return corrupt(f, "dynamic entries %zu and %zu have the same tag %" PRId64, i, j,
                       tag);
  }
  uint64_t v, strtab, strsz = 0, symtab, nsyms = 0;
  if (dyn_value(d, nd, DT_PLTREL, &v) && v != DT_RELA)
    return corrupt(f, "DT_PLTREL is %" PRIu64 ", not DT_RELA", v);
  /* ld.so dereferences the companion entries without looking. */
  if (dyn_value(d, nd, DT_RELA, &v) &&
      (!dyn_value(d, nd, DT_RELAENT, &v) || v != sizeof(Elf64_Rela) ||
       !dyn_value(d, nd, DT_RELASZ, &v)))
    return corrupt(f, "DT_RELA without DT_RELASZ or a valid DT_RELAENT");
  int plt = dyn_value(d, nd, DT_JMPREL, &v) + dyn_value(d, nd, DT_PLTRELSZ, &v) +
            dyn_value(d, nd, DT_PLTREL, &v);
  if (plt != 0 && plt != 3)
    return corrupt(f, "DT_JMPREL, DT_PLTRELSZ and DT_PLTREL do not come together");
  if (dyn_value(d, nd, DT_RELACOUNT, &v) && !dyn_value(d, nd, DT_RELA, &v))
    return corrupt(f, "DT_RELACOUNT without DT_RELA");
  if ((dyn_value(d, nd, DT_INIT_ARRAY, &v) && !dyn_value(d, nd, DT_INIT_ARRAYSZ, &v)) ||
      (dyn_value(d, nd, DT_FINI_ARRAY, &v) && !dyn_value(d, nd, DT_FINI_ARRAYSZ, &v)) ||
      (dyn_value(d, nd, DT_PREINIT_ARRAY, &v) &&
       !dyn_value(d, nd, DT_PREINIT_ARRAYSZ, &v)))
    return corrupt(f, "a constructor or destructor array without its size");
  if (dyn_value(d, nd, DT_FLAGS, &v) && (v & DF_TEXTREL))
    return corrupt(f, "DT_FLAGS asks for text relocations");
  if (dyn_value(d, nd, DT_PLTGOT, &v) && !in_writable_segment(f, v, 3 * 8))
    return corrupt(f, "DT_PLTGOT is outside the writable segments");
  if (!dyn_value(d, nd, DT_STRTAB, &strtab) || !dyn_value(d, nd, DT_STRSZ, &strsz) ||
      strsz == 0 || !dyn_value(d, nd, DT_SYMTAB, &symtab))
    return corrupt(f, "no dynamic string or symbol table");
  char *str;
  int rc = read_table(f, strtab, strsz, MAX_STRTAB_BYTES, "dynamic string table",
                      (void **)&str);
  if (rc)
    return rc;
  Elf64_Sym *syms = NULL;
  /* Every string ends inside the table: the loader strcmp()s them. */
  if (str[strsz - 1] != '\0') {
    rc = corrupt(f, "the dynamic string table does not end with NUL");
    goto out;
  }
  uint64_t hash;
  bool have_gnu = dyn_value(d, nd, DT_GNU_HASH, &hash);
  if (have_gnu && (rc = check_gnu_hash(f, hash, &nsyms)))
    goto out;
  if (dyn_value(d, nd, DT_HASH, &hash)) {
    uint64_t n = 0;
    if ((rc = check_sysv_hash(f, hash, &n)))
      goto out;
    if (!have_gnu || n > nsyms)
      nsyms = n;
  } else if (!have_gnu) {
    rc = corrupt(f, "no symbol hash table (DT_GNU_HASH or DT_HASH)");
    goto out;
  }
  f->relacount = 0;
  dyn_value(d, nd, DT_RELACOUNT, &f->relacount);
  /* Symbols past the hashed ones can still be named by relocations. */
  uint64_t rela = 0, relasz = 0, jmprel = 0, pltrelsz = 0;
  bool has_rela = dyn_value(d, nd, DT_RELA, &rela);
  dyn_value(d, nd, DT_RELASZ, &relasz);
  bool has_jmprel = dyn_value(d, nd, DT_JMPREL, &jmprel);
  dyn_value(d, nd, DT_PLTRELSZ, &pltrelsz);
  if (has_rela && (rc = check_relocs(f, rela, relasz, "DT_RELA table", NULL, &nsyms)))
    goto out;
  if (has_jmprel &&
      (rc = check_relocs(f, jmprel, pltrelsz, "DT_JMPREL table", NULL, &nsyms)))
    goto out;
  if (nsyms == 0)
    nsyms = 1;
  if ((rc = read_table(f, symtab, nsyms * sizeof(Elf64_Sym), MAX_SYMTAB_BYTES,
                       "dynamic symbol table", (void **)&syms)))
    goto out;
  for (uint64_t i = 0; i < nsyms && !rc; i++) {
    const Elf64_Sym *s = &syms[i];
    if (s->st_name >= strsz)
      rc = corrupt(f, "dynamic symbol %" PRIu64 " has its name outside the string table",
                   i);
    else if ((f->flags & LOAD_NO_CODE) && ELF64_ST_TYPE(s->st_info) == STT_GNU_IFUNC &&
             s->st_shndx != SHN_UNDEF)
      rc = corrupt(f,
                   "dynamic symbol %" PRIu64 " is an IFUNC (its resolver would run "
                   "inside dlopen)",
                   i);
  }
  if (rc)
    goto out;
  if (has_rela && (rc = check_relocs(f, rela, relasz, "DT_RELA table", syms, &nsyms)))
    goto out;
  if (has_jmprel &&
      (rc = check_relocs(f, jmprel, pltrelsz, "DT_JMPREL table", syms, &nsyms)))
    goto out;
  if ((rc = check_versions(f, d, nd, str, strsz, nsyms)))
    goto out;
  if (f->needed_ok)
    for (size_t i = 0; i < nd && !rc; i++)
      if (d[i].d_tag == DT_NEEDED &&
          !f->needed_ok(str + d[i].d_un.d_val, f->needed_arg)) {
        char name[64];
        molt__errmsg(f->err, f->errlen,
                     "the patch needs library %s, which the process has not loaded (a "
                     "patch may only use libraries the program already uses)",
                     printable(str + d[i].d_un.d_val, name, sizeof name));
        rc = MOLT_ENOTPATCH;
      }
out:
  free(syms);
  free(str);
  return rc;
}

int molt__elf_check_load(int fd, bool patch, bool (*needed_ok)(const char *, void *),
                         void *arg, char *err, size_t errlen) {
  elf_file f;
  int rc = elf_open_filtered(&f, fd, LOAD_PATCH | (patch ? LOAD_NO_CODE : 0),
                             patch ? MOLT_ENOTPATCH : MOLT_ENOTPROGRAM, err, errlen,
                             needed_ok, arg);
  /* The only code of a patch the runtime runs on purpose: its declared
   * callbacks, whose notes must be sound before anything is loaded. */
  molt__patch_callbacks cbs;
  if (rc == 0 && patch)
    rc = read_callbacks(&f, &cbs);
  elf_free(&f);
  return rc;
}

static int by_offset(const void *a, const void *b) {
  uint64_t x = ((const molt__dynrel *)a)->offset, y = ((const molt__dynrel *)b)->offset;
  return x < y ? -1 : x > y;
}

int molt__elf_import_symbols(int fd, const molt__dynrels *dr, char ***out, size_t *n,
                             char *err, size_t errlen) {
  *out = NULL;
  *n = 0;
  elf_file f;
  int rc = elf_open(&f, fd, LOAD_PATCH, MOLT_ENOTPATCH, err, errlen);
  if (rc) {
    elf_free(&f);
    return rc;
  }
  const Elf64_Shdr *sec = NULL;
  for (size_t i = 1; i < f.shnum; i++)
    if (strcmp(section_name(&f, i), "molt_imports") == 0)
      sec = &f.sh[i];
  if (!sec || sec->sh_type == SHT_NOBITS || sec->sh_size == 0) {
    elf_free(&f);
    return 0;
  }
  enum { RECORD = 3 * sizeof(uint64_t) };
  if (sec->sh_size % RECORD) {
    molt__errmsg(err, errlen,
                 "file is corrupt: section molt_imports has a partial record");
    elf_free(&f);
    return MOLT_ECORRUPT;
  }
  /* The records hold pointers: each is a R_X86_64_RELATIVE relocation (its
   * addend is the address), or, when relative relocations are packed
   * (DT_RELR), the value stored in the file. */
  molt__dynrel *rel = NULL;
  size_t nrel = 0;
  for (size_t i = 0; i < dr->nrels; i++)
    if (dr->rels[i].type == R_X86_64_RELATIVE)
      nrel++;
  if (nrel && !(rel = malloc(nrel * sizeof *rel)))
    rc = MOLT_ENOMEM;
  nrel = 0;
  for (size_t i = 0; rc == 0 && i < dr->nrels; i++)
    if (dr->rels[i].type == R_X86_64_RELATIVE)
      rel[nrel++] = dr->rels[i];
  if (nrel)
    qsort(rel, nrel, sizeof *rel, by_offset);
  size_t count = (size_t)(sec->sh_size / RECORD);
  char **names = rc ? NULL : calloc(count ? count : 1, sizeof *names);
  if (!names && rc == 0)
    rc = MOLT_ENOMEM;
  if (rc == MOLT_ENOMEM)
    molt__errmsg(err, errlen, "out of memory");
  for (size_t i = 0; rc == 0 && i < count; i++) {
    molt__dynrel key = {.offset = sec->sh_addr + i * RECORD};
    const molt__dynrel *hit =
        nrel ? bsearch(&key, rel, nrel, sizeof *rel, by_offset) : NULL;
    uint64_t addr = 0, off;
    if (hit) {
      addr = (uint64_t)hit->addend;
    } else if (!vaddr_to_off(&f, key.offset, sizeof addr, &off) ||
               (rc = read_exact(&f, &addr, off, sizeof addr)) != 0) {
      if (rc == 0)
        molt__errmsg(err, errlen,
                     "file is corrupt: import record %zu lies outside the file", i);
      rc = rc ? rc : MOLT_ECORRUPT;
      break;
    }
    char buf[4096];
    const Elf64_Phdr *p = segment_of(&f, addr, 1, true);
    uint64_t avail = p ? p->p_filesz - (addr - p->p_vaddr) : 0;
    size_t len = avail < sizeof buf ? (size_t)avail : sizeof buf;
    if (!p || read_exact(&f, buf, p->p_offset + (addr - p->p_vaddr), len) != 0 ||
        !memchr(buf, '\0', len)) {
      molt__errmsg(err, errlen,
                   "file is corrupt: import record %zu names a symbol outside the file",
                   i);
      rc = MOLT_ECORRUPT;
      break;
    }
    if (!(names[i] = strdup(buf))) {
      molt__errmsg(err, errlen, "out of memory");
      rc = MOLT_ENOMEM;
    }
  }
  free(rel);
  elf_free(&f);
  if (rc) {
    for (size_t i = 0; names && i < count; i++)
      free(names[i]);
    free(names);
    return rc;
  }
  *out = names;
  *n = count;
  return 0;
}

/* ------------------------------------------------------------------------ */
/* Build-ids                                                                 */
/* ------------------------------------------------------------------------ */

static int check_hex_room(size_t n, size_t hexlen) {
  if (n == 0 || n > MAX_BUILD_ID_BYTES)
    return MOLT_ECORRUPT;
  if (hexlen < 2 * n + 1)
    return MOLT_EINVAL;
  return 0;
}

int molt__elf_file_build_id(int fd, char *hex, size_t hexlen, char *err, size_t errlen) {
  elf_file f;
  int rc = elf_open(&f, fd, 0, MOLT_ENOTSUP, err, errlen);
  note_hit hit;
  if (rc == 0)
    rc = find_note(&f, "GNU", NT_GNU_BUILD_ID, &hit);
  if (rc == 0 && hit.count == 0) {
    molt__errmsg(err, errlen,
                 "no build-id note (NT_GNU_BUILD_ID): link with "
                 "-Wl,--build-id");
    rc = MOLT_ENOSYM;
  }
  if (rc == 0 && hit.count > 1) {
    molt__errmsg(err, errlen, "file is corrupt: more than one build-id note");
    rc = MOLT_ECORRUPT;
  }
  if (rc == 0) {
    rc = check_hex_room(hit.descsz, hexlen);
    if (rc == MOLT_ECORRUPT)
      molt__errmsg(err, errlen, "file is corrupt: build-id of %" PRIu32 " bytes",
                   hit.descsz);
    else if (rc)
      molt__errmsg(err, errlen, "build-id buffer too small");
  }
  if (rc == 0) {
    unsigned char id[MAX_BUILD_ID_BYTES];
    rc = read_exact(&f, id, hit.desc_off, hit.descsz);
    if (rc == 0)
      hex_encode(id, hit.descsz, hex);
  }
  elf_free(&f);
  return rc;
}

/* Loaded modules are trusted to be laid out as the loader mapped them, but
 * their notes are still walked with bounds checks: nothing forces a PT_NOTE
 * to be well-formed. */
typedef struct loaded_ctx {
  uintptr_t addr;
  bool found;
  bool is_main;
  int rc;
  char *hex;
  size_t hexlen;
  uintptr_t base;
  char *path;
  size_t pathlen;
  unsigned index;
} loaded_ctx;

static int loaded_build_id(const struct dl_phdr_info *info, loaded_ctx *c) {
  for (size_t i = 0; i < info->dlpi_phnum; i++) {
    const ElfW(Phdr) *p = &info->dlpi_phdr[i];
    if (p->p_type != PT_NOTE)
      continue;
    const unsigned char *buf = (const unsigned char *)(info->dlpi_addr + p->p_vaddr);
    uint64_t size = p->p_memsz, a = p->p_align == 8 ? 8 : 4, pos = 0;
    while (size - pos >= 12) {
      uint32_t hdr[3];
      memcpy(hdr, buf + pos, sizeof hdr);
      uint64_t desc_off = align_up(pos + 12 + hdr[0], a);
      uint64_t desc_end = desc_off + hdr[1];
      if (desc_end > size)
        break;
      if (hdr[2] == NT_GNU_BUILD_ID && hdr[0] == 4 &&
          memcmp(buf + pos + 12, "GNU", 4) == 0) {
        int rc = check_hex_room(hdr[1], c->hexlen);
        if (rc == 0)
          hex_encode(buf + desc_off, hdr[1], c->hex);
        return rc;
      }
      pos = align_up(desc_end, a);
    }
  }
  return MOLT_ENOSYM;
}

static int loaded_cb(struct dl_phdr_info *info, size_t size, void *data) {
  loaded_ctx *c = data;
  unsigned index = c->index++;
  (void)size;
  bool hit = false;
  for (size_t i = 0; i < info->dlpi_phnum && !hit; i++) {
    const ElfW(Phdr) *p = &info->dlpi_phdr[i];
    if (p->p_type != PT_LOAD)
      continue;
    uintptr_t start = info->dlpi_addr + p->p_vaddr;
    hit = c->addr >= start && c->addr - start < p->p_memsz;
  }
  if (!hit)
    return 0;
  c->found = true;
  c->base = info->dlpi_addr;
  const char *name = info->dlpi_name ? info->dlpi_name : "";
  /* The loader names the executable "" and it always comes first. */
  c->is_main = index == 0 && name[0] == '\0';
  c->rc = loaded_build_id(info, c);
  if (c->path && !c->is_main) {
    size_t n = strlen(name);
    if (n >= c->pathlen) {
      if (c->rc == 0)
        c->rc = MOLT_EINVAL;
    } else {
      memcpy(c->path, name, n + 1);
    }
  }
  return 1;
}

int molt__elf_build_id_of_loaded(const void *addr, char *hex, size_t hexlen,
                                 uintptr_t *base, char *path, size_t pathlen) {
  if (!hex || hexlen == 0 || (path && pathlen == 0))
    return MOLT_EINVAL;
  hex[0] = '\0';
  if (path)
    path[0] = '\0';
  loaded_ctx c = {.addr = (uintptr_t)addr,
                  .hex = hex,
                  .hexlen = hexlen,
                  .path = path,
                  .pathlen = pathlen};
  dl_iterate_phdr(loaded_cb, &c);
  if (!c.found)
    return MOLT_ENOENT;
  if (base)
    *base = c.base;
  if (path && c.is_main) {
    ssize_t n = readlink("/proc/self/exe", path, pathlen);
    if (n < 0 || (size_t)n >= pathlen) {
      path[0] = '\0';
      if (c.rc == 0)
        c.rc = n < 0 ? MOLT_EIO : MOLT_EINVAL;
    } else {
      path[n] = '\0';
    }
  }
  return c.rc;
}

/* ------------------------------------------------------------------------ */
/* Symbol tables                                                             */
/* ------------------------------------------------------------------------ */

enum { SYM_LOCAL = 0, SYM_GLOBAL = 1 };

typedef struct sym_ent {
  const char *name;
  const char *file; /* basename of the STT_FILE group; NULL for globals */
  uint64_t value;
  int kind;
  uint64_t size; /* st_size (for address -> symbol lookups) */
  bool is_func;  /* STT_FUNC (else STT_OBJECT) */
} sym_ent;

struct molt__symtab {
  char *strtab[2]; /* .strtab, .dynstr: the names point into them */
  sym_ent *ents;   /* sorted by name */
  size_t n, cap;
  /* Address index for molt__symtab_at: entries sorted by value (one per
   * distinct symbol: .dynsym duplicates of .symtab entries are dropped),
   * and per position the largest value+size of that entry and all before
   * it, so that a backward scan knows when nothing earlier can contain an
   * address. */
  const sym_ent **by_addr;
  uint64_t *max_end;
  size_t naddr;
};

static const char *base_name(const char *p) {
  const char *s = strrchr(p, '/');
  return s ? s + 1 : p;
}

static int ent_cmp(const void *a, const void *b) {
  return strcmp(((const sym_ent *)a)->name, ((const sym_ent *)b)->name);
}

static int push_ent(molt__symtab *st, sym_ent e) {
  if (st->n == st->cap) {
    size_t cap = st->cap ? st->cap * 2 : 1024;
    sym_ent *p = realloc(st->ents, cap * sizeof *p);
    if (!p)
      return MOLT_ENOMEM;
    st->ents = p;
    st->cap = cap;
  }
  st->ents[st->n++] = e;
  return 0;
}

/*
 * Adds the defined objects and functions of one symbol table.  Local
 * symbols are attributed to the last STT_FILE before them.  Two kinds of
 * local symbols were global in the source and are indexed as globals: those
 * with hidden/internal visibility, and those in the group that GNU ld opens
 * with an empty-named STT_FILE, where it puts the symbols it turned local
 * (it also resets their visibility to default there).
 */
static int load_symbols(elf_file *f, molt__symtab *st, size_t secidx, int slot) {
  const Elf64_Shdr *s = &f->sh[secidx];
  if (s->sh_entsize != sizeof(Elf64_Sym) || s->sh_size % sizeof(Elf64_Sym) ||
      s->sh_link == 0 || s->sh_link >= f->shnum ||
      f->sh[s->sh_link].sh_type != SHT_STRTAB)
    return MOLT_ECORRUPT;
  if (s->sh_size > MAX_SYMTAB_BYTES)
    return MOLT_ECORRUPT;
  const Elf64_Shdr *ss = &f->sh[s->sh_link];
  char *str;
  int rc = read_alloc(f, ss->sh_offset, ss->sh_size, MAX_STRTAB_BYTES,
                      "string table ends", (void **)&str);
  if (rc)
    return rc;
  st->strtab[slot] = str;
  uint64_t strsz = ss->sh_size;
  bool dynamic = s->sh_type == SHT_DYNSYM;

  enum { CHUNK = 4096 };
  Elf64_Sym *chunk = malloc(CHUNK * sizeof *chunk);
  if (!chunk)
    return MOLT_ENOMEM;
  uint64_t nsyms = s->sh_size / sizeof(Elf64_Sym);
  const char *file = NULL;
  bool linker_group = false;
  for (uint64_t base = 0; base < nsyms && rc == 0; base += CHUNK) {
    size_t n = nsyms - base < CHUNK ? (size_t)(nsyms - base) : CHUNK;
    rc = read_exact(f, chunk, s->sh_offset + base * sizeof(Elf64_Sym),
                    n * sizeof(Elf64_Sym));
    for (size_t i = 0; i < n && rc == 0; i++) {
      const Elf64_Sym *sym = &chunk[i];
      if (base + i == 0)
        continue;
      if (sym->st_name >= strsz) {
        rc = MOLT_ECORRUPT;
        break;
      }
      const char *name = str + sym->st_name;
      unsigned type = ELF64_ST_TYPE(sym->st_info);
      unsigned bind = ELF64_ST_BIND(sym->st_info);
      if (type == STT_FILE) {
        file = base_name(name);
        linker_group = name[0] == '\0';
        continue;
      }
      if (type != STT_OBJECT && type != STT_FUNC)
        continue;
      /* ABS values are not addresses in the module, so adding the load base
       * to them would be wrong. */
      if (sym->st_shndx == SHN_UNDEF || sym->st_shndx == SHN_ABS ||
          sym->st_shndx == SHN_COMMON || name[0] == '\0')
        continue;
      sym_ent e = {name, NULL, sym->st_value, SYM_GLOBAL, sym->st_size, type == STT_FUNC};
      if (bind == STB_LOCAL) {
        if (dynamic)
          continue;
        unsigned vis = ELF64_ST_VISIBILITY(sym->st_other);
        if (!linker_group && vis != STV_HIDDEN && vis != STV_INTERNAL) {
          e.kind = SYM_LOCAL;
          e.file = file;
        }
      } else if (bind != STB_GLOBAL && bind != STB_WEAK && bind != STB_GNU_UNIQUE) {
        continue;
      }
      rc = push_ent(st, e);
    }
  }
  free(chunk);
  return rc;
}

/* By address; at one address globals first, then larger sizes first, then
 * by name (so that the choice among aliases is deterministic). */
static int addr_cmp(const void *a, const void *b) {
  const sym_ent *x = *(const sym_ent *const *)a, *y = *(const sym_ent *const *)b;
  if (x->value != y->value)
    return x->value < y->value ? -1 : 1;
  if (x->kind != y->kind)
    return x->kind == SYM_GLOBAL ? -1 : 1;
  if (x->size != y->size)
    return x->size > y->size ? -1 : 1;
  int c = strcmp(x->name, y->name);
  if (c)
    return c;
  /* Same name, kind and place: a .symtab/.dynsym pair; keep them adjacent. */
  return (x->file ? 1 : 0) - (y->file ? 1 : 0);
}

static uint64_t ent_end(const sym_ent *e) {
  uint64_t end;
  /* A zero-sized symbol (e.g. a label) covers its own address only. */
  if (__builtin_add_overflow(e->value, e->size ? e->size : 1, &end))
    end = UINT64_MAX;
  return end;
}

static int build_addr_index(molt__symtab *st) {
  if (st->n == 0)
    return 0;
  st->by_addr = malloc(st->n * sizeof *st->by_addr);
  st->max_end = malloc(st->n * sizeof *st->max_end);
  if (!st->by_addr || !st->max_end)
    return MOLT_ENOMEM;
  for (size_t i = 0; i < st->n; i++)
    st->by_addr[i] = &st->ents[i];
  qsort(st->by_addr, st->n, sizeof *st->by_addr, addr_cmp);
  size_t k = 0;
  uint64_t max_end = 0;
  for (size_t i = 0; i < st->n; i++) {
    const sym_ent *e = st->by_addr[i];
    if (k > 0) {
      const sym_ent *p = st->by_addr[k - 1];
      if (p->value == e->value && p->kind == e->kind && p->size == e->size &&
          strcmp(p->name, e->name) == 0)
        continue; /* the .dynsym copy of a .symtab symbol */
    }
    uint64_t end = ent_end(e);
    if (end > max_end)
      max_end = end;
    st->by_addr[k] = e;
    st->max_end[k] = max_end;
    k++;
  }
  st->naddr = k;
  return 0;
}

int molt__symtab_at(const molt__symtab *st, uintptr_t value, const char **name,
                    const char **tu, uintptr_t *start, size_t *size, bool *is_func) {
  if (!st)
    return MOLT_EINVAL;
  /* Last entry with by_addr[i]->value <= value. */
  size_t lo = 0, hi = st->naddr;
  while (lo < hi) {
    size_t mid = lo + (hi - lo) / 2;
    if (st->by_addr[mid]->value <= value)
      lo = mid + 1;
    else
      hi = mid;
  }
  /* Scan backwards: the first containing entry has the greatest start (the
   * innermost symbol if symbols nest); among entries with that start the
   * sort order prefers globals, then the largest.  max_end stops the scan as soon as nothing earlier can
   * reach value, so this is O(log n) for ordinary, disjoint symbols. */
  const sym_ent *hit = NULL;
  uint64_t best = 0;
  for (size_t i = lo; i-- > 0 && st->max_end[i] > value;) {
    const sym_ent *e = st->by_addr[i];
    if (hit && e->value != best)
      break;
    /* A lower index at the same start is preferred: it overrides. */
    if (ent_end(e) > value) {
      hit = e;
      best = e->value;
    }
  }
  if (!hit)
    return MOLT_ENOSYM;
  if (name)
    *name = hit->name;
  if (tu)
    *tu = hit->kind == SYM_LOCAL ? hit->file : NULL;
  if (start)
    *start = (uintptr_t)hit->value;
  if (size)
    *size = (size_t)hit->size;
  if (is_func)
    *is_func = hit->is_func;
  return 0;
}

int molt__symtab_open(const char *path, molt__symtab **out) {
  if (!path || !out)
    return MOLT_EINVAL;
  *out = NULL;
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0)
    return molt__from_errno(errno);
  elf_file f;
  int rc = elf_open(&f, fd, 0, MOLT_ENOTSUP, NULL, 0);
  molt__symtab *st = NULL;
  if (rc == 0) {
    st = calloc(1, sizeof *st);
    if (!st)
      rc = MOLT_ENOMEM;
  }
  /* .symtab first: it has everything .dynsym has plus the locals. */
  static const uint32_t types[2] = {SHT_SYMTAB, SHT_DYNSYM};
  for (int t = 0; t < 2 && rc == 0; t++) {
    for (size_t i = 1; i < f.shnum; i++) {
      if (f.sh[i].sh_type == types[t]) {
        rc = load_symbols(&f, st, i, t);
        break;
      }
    }
  }
  elf_free(&f);
  close(fd);
  if (rc) {
    molt__symtab_close(st);
    return rc;
  }
  if (st->n > 1)
    qsort(st->ents, st->n, sizeof *st->ents, ent_cmp);
  rc = build_addr_index(st);
  if (rc) {
    molt__symtab_close(st);
    return rc;
  }
  *out = st;
  return 0;
}

/* The index of the first entry named name in st's sorted entries (st->n if
 * none sorts at or after it). */
static size_t first_named(const molt__symtab *st, const char *name) {
  size_t lo = 0, hi = st->n;
  while (lo < hi) {
    size_t mid = lo + (hi - lo) / 2;
    if (strcmp(st->ents[mid].name, name) < 0)
      lo = mid + 1;
    else
      hi = mid;
  }
  return lo;
}

int molt__symtab_lookup(const molt__symtab *st, const char *name, const char *tu,
                        uintptr_t *value) {
  if (!st || !name || !value)
    return MOLT_EINVAL;
  const char *tub = tu ? base_name(tu) : NULL;
  if (tub && tub[0] == '\0')
    return MOLT_ENOSYM;
  size_t lo = first_named(st, name);
  bool found = false;
  uint64_t v = 0;
  for (size_t i = lo; i < st->n && strcmp(st->ents[i].name, name) == 0; i++) {
    const sym_ent *e = &st->ents[i];
    bool match = tub ? e->kind == SYM_LOCAL && e->file && strcmp(e->file, tub) == 0
                     : e->kind == SYM_GLOBAL;
    if (!match)
      continue;
    /* The same symbol appears in both .symtab and .dynsym. */
    if (found && e->value != v)
      return MOLT_EAMBIGUOUS;
    found = true;
    v = e->value;
  }
  if (!found)
    return MOLT_ENOSYM;
  *value = (uintptr_t)v;
  return 0;
}

int molt__symtab_lookup_any(const molt__symtab *st, const char *name, uintptr_t *value) {
  int rc = molt__symtab_lookup(st, name, NULL, value);
  if (rc != MOLT_ENOSYM)
    return rc;
  size_t lo = first_named(st, name);
  bool found = false;
  uint64_t v = 0;
  for (size_t i = lo; i < st->n && strcmp(st->ents[i].name, name) == 0; i++) {
    if (found && st->ents[i].value != v)
      return MOLT_EAMBIGUOUS;
    found = true;
    v = st->ents[i].value;
  }
  if (!found)
    return MOLT_ENOSYM;
  *value = (uintptr_t)v;
  return 0;
}

void molt__symtab_close(molt__symtab *st) {
  if (!st)
    return;
  free(st->strtab[0]);
  free(st->strtab[1]);
  free(st->ents);
  free(st->by_addr);
  free(st->max_end);
  free(st);
}
