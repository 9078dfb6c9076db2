/* The attach patch file: a shared object built by
 * `moltcc --molt-attach --molt-target PROG -o fix.so fix.c` (position
 * independent, no start files) with a `.molt_attach` section:
 *
 *     molt-attach 1
 *     build-id <hex of PROG's NT_GNU_BUILD_ID>
 *
 * Every function the patch defines with external linkage replaces the
 * target's function of that name (static or not); helpers are static.
 * Its undefined symbols are the target's functions and variables (statics
 * included) and the libraries' symbols: attach.c resolves them through the
 * target's symbol tables.  The file is never handed to a dynamic loader:
 * this file reads it (every offset bounds-checked), lays out its memory
 * image and applies its dynamic relocations for the address the image
 * will have in the target.  No constructor of the patch runs.
 */
#include "attach/internal.h"

#include <elf.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#define MAX_PATCH_FILE (64u << 20)
#define MAX_IMAGE (256u << 20)

typedef struct patch_file {
  uint8_t *data;
  size_t size;
  const Elf64_Ehdr *eh;
  const Elf64_Shdr *sh;
  const Elf64_Sym *dynsym;
  size_t ndynsym;
  const char *dynstr;
  size_t dynstr_size;
  const uint16_t *versym; /* .gnu.version: per dynamic symbol; NULL if none */
  size_t nversym;
} patch_file;

static bool in_file(const patch_file *f, uint64_t off, uint64_t len) {
  return off <= f->size && len <= f->size - off;
}

static const char *sym_name(const patch_file *f, const Elf64_Sym *s) {
  if (s->st_name >= f->dynstr_size)
    return NULL;
  const char *n = f->dynstr + s->st_name;
  return memchr(n, '\0', f->dynstr_size - s->st_name) ? n : NULL;
}

static int corrupt(char *err, size_t errlen, const char *what) {
  molt__errmsg(err, errlen, "corrupt attach patch: %s", what);
  return MOLT_ECORRUPT;
}

static int read_file(const char *path, patch_file *f, char *err, size_t errlen) {
  int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) {
    molt__errmsg(err, errlen, "cannot open %s: %s", path, strerror(errno));
    return errno == ENOENT ? MOLT_ENOENT : molt__from_errno(errno);
  }
  struct stat stt;
  if (fstat(fd, &stt) != 0 || !S_ISREG(stt.st_mode) || stt.st_size <= 0 ||
      (uint64_t)stt.st_size > MAX_PATCH_FILE) {
    close(fd);
    molt__errmsg(err, errlen, "%s is not a regular file of at most 64 MiB", path);
    return MOLT_ENOTPATCH;
  }
  f->size = (size_t)stt.st_size;
  f->data = malloc(f->size);
  if (!f->data) {
    close(fd);
    return MOLT_ENOMEM;
  }
  size_t got = 0;
  while (got < f->size) {
    ssize_t k = pread(fd, f->data + got, f->size - got, (off_t)got);
    if (k <= 0)
      break;
    got += (size_t)k;
  }
  close(fd);
  if (got != f->size) {
    molt__errmsg(err, errlen, "cannot read %s", path);
    return MOLT_EIO;
  }
  return 0;
}

/* The .molt_attach section: "molt-attach 1", "build-id HEX", then (from a
 * patch built from a fix, moltcc's two-version builder) one line per
 * replaced function and per resolved reference:
 *
 *     replace NAME TARGET_HEX PATCH_HEX   the new version at PATCH_HEX in the
 *                                         patch replaces the function at
 *                                         TARGET_HEX (link-time) in the target
 *     import SYMBOL TARGET_HEX            the patch's undefined SYMBOL is the
 *                                         target's object at TARGET_HEX
 *
 * moltcc resolved both through the target's symbol table and DWARF (a
 * static by its file, a static local by its function), so nothing here is
 * looked up by a name that several statics may share. */
#define MAX_MARKS (1u << 20)

static int read_marks(const uint8_t *data, size_t size, attach_patch *p, char *err,
                      size_t errlen) {
  if (size > MAX_MARKS)
    return corrupt(err, errlen, "the .molt_attach section is larger than 1 MiB");
  char *text = malloc(size + 1);
  if (!text)
    return MOLT_ENOMEM;
  memcpy(text, data, size);
  text[size] = '\0';
  int rc = 0;
  if (sscanf(text, "molt-attach 1\nbuild-id %80[0-9a-f]", p->build_id) != 1)
    rc = corrupt(err, errlen, "unreadable .molt_attach section");
  char *save = NULL;
  for (char *line = strtok_r(text, "\n", &save); rc == 0 && line;
       line = strtok_r(NULL, "\n", &save)) {
    char name[128];
    unsigned long long target, offset;
    int used = 0;
    if (sscanf(line, "replace %127s %llx %llx%n", name, &target, &offset, &used) == 3 &&
        line[used] == '\0') {
      if (p->nfuncs == MOLT__ATTACH_MAX_FUNCS) {
        molt__errmsg(err, errlen, "the patch replaces more than %d functions",
                     MOLT__ATTACH_MAX_FUNCS);
        rc = MOLT_ENOTSUP;
        break;
      }
      if (target == 0) {
        rc = corrupt(err, errlen, "a replaced function at address 0");
        break;
      }
      snprintf(p->funcs[p->nfuncs].name, sizeof p->funcs[0].name, "%s", name);
      p->funcs[p->nfuncs].target = target;
      p->funcs[p->nfuncs].offset = offset; /* checked against the image later */
      p->nfuncs++;
    } else if (sscanf(line, "import %127s %llx%n", name, &target, &used) == 2 &&
               line[used] == '\0') {
      attach_import *ni = realloc(p->imports, (p->nimports + 1) * sizeof *ni);
      if (!ni) {
        rc = MOLT_ENOMEM;
        break;
      }
      p->imports = ni;
      snprintf(ni[p->nimports].name, sizeof ni[0].name, "%s", name);
      ni[p->nimports].target = target;
      p->nimports++;
    } else if (strncmp(line, "molt-attach ", 12) != 0 &&
               strncmp(line, "build-id ", 9) != 0) {
      rc = corrupt(err, errlen, "an unknown line in the .molt_attach section");
    }
  }
  free(text);
  return rc;
}

static int parse(patch_file *f, attach_patch *p, char *err, size_t errlen) {
  if (f->size < sizeof(Elf64_Ehdr) || memcmp(f->data, ELFMAG, SELFMAG) != 0) {
    molt__errmsg(err, errlen, "not an ELF file");
    return MOLT_ENOTPATCH;
  }
  f->eh = (const Elf64_Ehdr *)f->data;
  const Elf64_Ehdr *eh = f->eh;
  if (eh->e_ident[EI_CLASS] != ELFCLASS64 || eh->e_ident[EI_DATA] != ELFDATA2LSB ||
      eh->e_machine != EM_X86_64 || eh->e_type != ET_DYN) {
    molt__errmsg(err, errlen, "not an x86-64 shared object");
    return MOLT_ENOTPATCH;
  }
  if (eh->e_shentsize != sizeof(Elf64_Shdr) || eh->e_phentsize != sizeof(Elf64_Phdr) ||
      !in_file(f, eh->e_shoff, (uint64_t)eh->e_shnum * sizeof(Elf64_Shdr)) ||
      !in_file(f, eh->e_phoff, (uint64_t)eh->e_phnum * sizeof(Elf64_Phdr)) ||
      eh->e_shstrndx >= eh->e_shnum || eh->e_shoff % 8 || eh->e_phoff % 8)
    return corrupt(err, errlen, "headers out of the file");
  f->sh = (const Elf64_Shdr *)(f->data + eh->e_shoff);
  const Elf64_Shdr *shstr = &f->sh[eh->e_shstrndx];
  if (!in_file(f, shstr->sh_offset, shstr->sh_size) || shstr->sh_size == 0)
    return corrupt(err, errlen, "section names out of the file");
  const char *names = (const char *)f->data + shstr->sh_offset;
  bool marked = false;
  for (unsigned i = 0; i < eh->e_shnum; i++) {
    const Elf64_Shdr *s = &f->sh[i];
    if (s->sh_name >= shstr->sh_size ||
        !memchr(names + s->sh_name, '\0', shstr->sh_size - s->sh_name))
      return corrupt(err, errlen, "a section name out of its table");
    const char *name = names + s->sh_name;
    if (s->sh_type != SHT_NOBITS && s->sh_type != SHT_NULL &&
        !in_file(f, s->sh_offset, s->sh_size))
      return corrupt(err, errlen, "a section out of the file");
    if (strcmp(name, ".molt_attach") == 0) {
      if (s->sh_type != SHT_PROGBITS)
        return corrupt(err, errlen,
                       "the .molt_attach section holds no bytes of the file");
      int rc = read_marks(f->data + s->sh_offset, s->sh_size, p, err, errlen);
      if (rc)
        return rc;
      marked = true;
    } else if (s->sh_type == SHT_DYNSYM) {
      if (s->sh_entsize != sizeof(Elf64_Sym) || s->sh_offset % 8 ||
          s->sh_link >= eh->e_shnum)
        return corrupt(err, errlen, "bad .dynsym");
      const Elf64_Shdr *str = &f->sh[s->sh_link];
      if (!in_file(f, str->sh_offset, str->sh_size) || str->sh_size == 0)
        return corrupt(err, errlen, "bad .dynstr");
      f->dynsym = (const Elf64_Sym *)(f->data + s->sh_offset);
      f->ndynsym = s->sh_size / sizeof(Elf64_Sym);
      f->dynstr = (const char *)f->data + str->sh_offset;
      f->dynstr_size = str->sh_size;
    } else if (s->sh_type == SHT_GNU_versym) {
      if (s->sh_entsize != sizeof(uint16_t) || s->sh_offset % 2)
        return corrupt(err, errlen, "bad .gnu.version");
      f->versym = (const uint16_t *)(f->data + s->sh_offset);
      f->nversym = s->sh_size / sizeof(uint16_t);
    }
  }
  if (!marked) {
    molt__errmsg(err, errlen,
                 "not an attach patch (no .molt_attach section); build it with "
                 "'moltcc --molt-attach --molt-target PROG'");
    return MOLT_ENOTPATCH;
  }
  if (!f->dynsym)
    return corrupt(err, errlen, "no dynamic symbol table");
  return 0;
}

/* The memory image: every PT_LOAD at its address, protections per page. */
static int lay_out(patch_file *f, attach_patch *p, char *err, size_t errlen) {
  const Elf64_Phdr *ph = (const Elf64_Phdr *)(f->data + f->eh->e_phoff);
  uint64_t end = 0;
  for (unsigned i = 0; i < f->eh->e_phnum; i++) {
    if (ph[i].p_type == PT_TLS) {
      molt__errmsg(err, errlen,
                   "the patch defines thread-local variables; attach "
                   "patches cannot (the target's TLS blocks are fixed)");
      return MOLT_ENOTPATCH;
    }
    if (ph[i].p_type == PT_INTERP) {
      molt__errmsg(err, errlen, "the patch is a program, not a shared object");
      return MOLT_ENOTPATCH;
    }
    if (ph[i].p_type != PT_LOAD)
      continue;
    if (ph[i].p_filesz > ph[i].p_memsz || !in_file(f, ph[i].p_offset, ph[i].p_filesz) ||
        ph[i].p_vaddr > MAX_IMAGE || ph[i].p_memsz > MAX_IMAGE - ph[i].p_vaddr)
      return corrupt(err, errlen, "a loadable segment out of bounds");
    if (ph[i].p_vaddr + ph[i].p_memsz > end)
      end = ph[i].p_vaddr + ph[i].p_memsz;
  }
  if (end == 0)
    return corrupt(err, errlen, "no loadable segment");
  p->size = (end + ATTACH_PAGE - 1) & ~(uint64_t)(ATTACH_PAGE - 1);
  p->image = calloc(1, p->size);
  p->prot = calloc(p->size / ATTACH_PAGE, 1);
  if (!p->image || !p->prot)
    return MOLT_ENOMEM;
  for (unsigned i = 0; i < f->eh->e_phnum; i++) {
    if (ph[i].p_type != PT_LOAD)
      continue;
    memcpy(p->image + ph[i].p_vaddr, f->data + ph[i].p_offset, ph[i].p_filesz);
    int prot = ((ph[i].p_flags & PF_R) ? PROT_READ : 0) |
               ((ph[i].p_flags & PF_W) ? PROT_WRITE : 0) |
               ((ph[i].p_flags & PF_X) ? PROT_EXEC : 0);
    for (uint64_t a = ph[i].p_vaddr & ~(uint64_t)(ATTACH_PAGE - 1);
         a < ph[i].p_vaddr + ph[i].p_memsz; a += ATTACH_PAGE)
      p->prot[a / ATTACH_PAGE] |= (uint8_t)prot;
  }
  /* RELRO: read-only once relocated -- here, from the start. */
  for (unsigned i = 0; i < f->eh->e_phnum; i++) {
    if (ph[i].p_type != PT_GNU_RELRO)
      continue;
    /* as ld.so does: from the page of its start to the page its end
     * rounds down to */
    uint64_t a = ph[i].p_vaddr & ~(uint64_t)(ATTACH_PAGE - 1);
    uint64_t e = (ph[i].p_vaddr + ph[i].p_memsz) & ~(uint64_t)(ATTACH_PAGE - 1);
    for (; a < e && a < p->size; a += ATTACH_PAGE)
      p->prot[a / ATTACH_PAGE] &= (uint8_t)~PROT_WRITE;
  }
  for (size_t k = 0; k < p->size / ATTACH_PAGE; k++) {
    if ((p->prot[k] & PROT_WRITE) && (p->prot[k] & PROT_EXEC)) {
      molt__errmsg(err, errlen, "the patch has a page both writable and executable");
      return MOLT_ENOTPATCH;
    }
  }
  return 0;
}

static int list_functions(patch_file *f, attach_patch *p, char *err, size_t errlen) {
  if (p->nfuncs) {
    /* replace lines: each new version must lie in executable code */
    for (size_t i = 0; i < p->nfuncs; i++) {
      uint64_t off = p->funcs[i].offset;
      if (off >= p->size || !(p->prot[off / ATTACH_PAGE] & PROT_EXEC))
        return corrupt(err, errlen, "a new version outside the patch's code");
    }
    return 0;
  }
  for (size_t i = 1; i < f->ndynsym; i++) {
    const Elf64_Sym *s = &f->dynsym[i];
    unsigned bind = ELF64_ST_BIND(s->st_info);
    if (s->st_shndx == SHN_UNDEF || ELF64_ST_TYPE(s->st_info) != STT_FUNC ||
        (bind != STB_GLOBAL && bind != STB_WEAK))
      continue;
    const char *name = sym_name(f, s);
    if (!name)
      return corrupt(err, errlen, "a symbol name out of its table");
    if (strcmp(name, "_init") == 0 || strcmp(name, "_fini") == 0)
      continue;
    if (s->st_value >= p->size || strlen(name) >= sizeof p->funcs[0].name)
      return corrupt(err, errlen, "a function out of the image");
    if (p->nfuncs == MOLT__ATTACH_MAX_FUNCS) {
      molt__errmsg(err, errlen, "the patch replaces more than %d functions",
                   MOLT__ATTACH_MAX_FUNCS);
      return MOLT_ENOTSUP;
    }
    snprintf(p->funcs[p->nfuncs].name, sizeof p->funcs[0].name, "%s", name);
    p->funcs[p->nfuncs].offset = s->st_value;
    p->nfuncs++;
  }
  if (p->nfuncs == 0) {
    molt__errmsg(err, errlen,
                 "the patch replaces no function (it defines none with "
                 "external linkage)");
    return MOLT_ENOTPATCH;
  }
  return 0;
}

int molt__patch_open(const char *path, attach_patch *p, char *err, size_t errlen) {
  memset(p, 0, sizeof *p);
  patch_file *f = calloc(1, sizeof *f);
  if (!f)
    return MOLT_ENOMEM;
  p->priv = f;
  int rc = read_file(path, f, err, errlen);
  if (rc == 0)
    rc = parse(f, p, err, errlen);
  if (rc == 0)
    rc = lay_out(f, p, err, errlen);
  if (rc == 0)
    rc = list_functions(f, p, err, errlen);
  if (rc)
    molt__patch_close(p);
  return rc;
}

int molt__patch_relocate(attach_patch *p, uint64_t base, attach_resolver resolve,
                         void *arg, char *err, size_t errlen) {
  patch_file *f = p->priv;
  for (unsigned i = 0; i < f->eh->e_shnum; i++) {
    const Elf64_Shdr *s = &f->sh[i];
    if (s->sh_type == SHT_REL) {
      molt__errmsg(err, errlen, "the patch has REL relocations (x86-64 uses RELA)");
      return MOLT_ENOTPATCH;
    }
    if (s->sh_type != SHT_RELA)
      continue;
    if (s->sh_entsize != sizeof(Elf64_Rela) || s->sh_offset % 8)
      return corrupt(err, errlen, "bad relocation section");
    const Elf64_Rela *r = (const Elf64_Rela *)(f->data + s->sh_offset);
    size_t n = s->sh_size / sizeof *r;
    for (size_t k = 0; k < n; k++) {
      uint32_t type = ELF64_R_TYPE(r[k].r_info), si = ELF64_R_SYM(r[k].r_info);
      if (type == R_X86_64_NONE)
        continue;
      if (r[k].r_offset > p->size - 8 || si >= f->ndynsym)
        return corrupt(err, errlen, "a relocation out of the image");
      uint64_t value = 0;
      const Elf64_Sym *sym = &f->dynsym[si];
      if (si != 0) {
        const char *name = sym_name(f, sym);
        if (!name)
          return corrupt(err, errlen, "a symbol name out of its table");
        const attach_import *imp = NULL;
        for (size_t k = 0; sym->st_shndx == SHN_UNDEF && k < p->nimports && !imp; k++)
          if (strcmp(p->imports[k].name, name) == 0)
            imp = &p->imports[k];
        if (sym->st_shndx != SHN_UNDEF) {
          value = base + sym->st_value; /* the patch's own */
        } else if (imp) {
          value = p->target_bias + imp->target; /* resolved by moltcc */
        } else {
          /* A version needed from a library (index 2 and up): the patch's
           * own link found the name in a library, so it names the
           * library's, never a static of the program. */
          bool library = f->versym && si < f->nversym && (f->versym[si] & 0x7fff) >= 2;
          int rc = resolve(name, ELF64_ST_BIND(sym->st_info) == STB_WEAK, library, &value,
                           arg, err, errlen);
          if (rc)
            return rc;
        }
      }
      uint64_t word;
      switch (type) {
      case R_X86_64_RELATIVE:
        word = base + (uint64_t)r[k].r_addend;
        break;
      case R_X86_64_64:
        word = value + (uint64_t)r[k].r_addend;
        break;
      case R_X86_64_GLOB_DAT:
      case R_X86_64_JUMP_SLOT:
        word = value;
        break;
      default:
        molt__errmsg(err, errlen,
                     "the patch needs relocation type %u, which attach does not apply "
                     "(thread-local or indirect symbols?)",
                     type);
        return MOLT_ENOTPATCH;
      }
      memcpy(p->image + r[k].r_offset, &word, 8);
    }
  }
  return 0;
}

void molt__patch_close(attach_patch *p) {
  patch_file *f = p->priv;
  if (f)
    free(f->data);
  free(f);
  free(p->image);
  free(p->prot);
  free(p->imports);
  memset(p, 0, sizeof *p);
}

int molt__elf_got_slots(const char *path, attach_got_visit visit, void *arg) {
  patch_file f;
  memset(&f, 0, sizeof f);
  char err[128];
  int rc = read_file(path, &f, err, sizeof err);
  if (rc == 0 && (f.size < sizeof(Elf64_Ehdr) || memcmp(f.data, ELFMAG, SELFMAG) != 0))
    rc = MOLT_ENOTSUP;
  if (rc == 0) {
    f.eh = (const Elf64_Ehdr *)f.data;
    if (f.eh->e_shentsize != sizeof(Elf64_Shdr) || f.eh->e_shoff % 8 ||
        !in_file(&f, f.eh->e_shoff, (uint64_t)f.eh->e_shnum * sizeof(Elf64_Shdr)))
      rc = MOLT_ECORRUPT;
  }
  for (unsigned i = 0; rc == 0 && i < f.eh->e_shnum; i++) {
    f.sh = (const Elf64_Shdr *)(f.data + f.eh->e_shoff);
    const Elf64_Shdr *s = &f.sh[i];
    if (s->sh_type != SHT_RELA || s->sh_entsize != sizeof(Elf64_Rela) ||
        s->sh_offset % 8 || !in_file(&f, s->sh_offset, s->sh_size) ||
        s->sh_link >= f.eh->e_shnum)
      continue;
    const Elf64_Shdr *sym = &f.sh[s->sh_link], *str;
    if (sym->sh_type != SHT_DYNSYM || sym->sh_entsize != sizeof(Elf64_Sym) ||
        sym->sh_offset % 8 || !in_file(&f, sym->sh_offset, sym->sh_size) ||
        sym->sh_link >= f.eh->e_shnum)
      continue;
    str = &f.sh[sym->sh_link];
    if (!in_file(&f, str->sh_offset, str->sh_size) || str->sh_size == 0)
      continue;
    f.dynsym = (const Elf64_Sym *)(f.data + sym->sh_offset);
    f.ndynsym = sym->sh_size / sizeof(Elf64_Sym);
    f.dynstr = (const char *)f.data + str->sh_offset;
    f.dynstr_size = str->sh_size;
    const Elf64_Rela *r = (const Elf64_Rela *)(f.data + s->sh_offset);
    for (size_t k = 0; k < s->sh_size / sizeof *r; k++) {
      uint32_t type = ELF64_R_TYPE(r[k].r_info), si = ELF64_R_SYM(r[k].r_info);
      if ((type != R_X86_64_JUMP_SLOT && type != R_X86_64_GLOB_DAT) || si == 0 ||
          si >= f.ndynsym)
        continue;
      const char *name = sym_name(&f, &f.dynsym[si]);
      if (name && visit(name, r[k].r_offset, arg))
        break;
    }
  }
  free(f.data);
  return rc;
}
