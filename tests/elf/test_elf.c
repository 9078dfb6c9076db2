/*
 * Tests of the ELF reader (src/runtime/elf.c) and of moltstamp, on files the
 * real toolchain built (see tests.cmake) and on corrupted copies of them.
 *
 *   test_elf unit    PATCH.so TARGET   (with SHA-256: sha256.c's two paths)
 *   test_elf corrupt PATCH.so
 *   test_elf stamp   MOLTSTAMP PATCH.so TARGET
 *
 * This executable also links fixtures/tu_one.c, tu_two.c, a/same.c and
 * b/same.c: the symbol-table tests read its own file and compare what they
 * find with the real addresses.
 */
#include "common/common.h"
#include "../harness/check.h"

#include <elf.h>
#include <errno.h>
#include <fcntl.h>
#include <gnu/libc-version.h>
#include <limits.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

extern char **environ;

/* fixtures */
extern int elf_fx_global;
extern int elf_fx_exported;
extern int elf_fx_weak;
int elf_fx_global_fn(int x);
void *elf_fx_one_counter(void);
void *elf_fx_one_helper(void);
void *elf_fx_two_counter(void);
void *elf_fx_two_helper(void);
void *elf_fx_same_a(void);
void *elf_fx_same_b(void);
int main(int argc, char **argv);

#define CHECK_RC(got, want, ctx)                                                         \
  do {                                                                                   \
    int got_ = (got), want_ = (want);                                                    \
    CHECK(got_ == want_, "%s: got %s, want %s", (ctx), molt_err_name(got_),              \
          molt_err_name(want_));                                                         \
  } while (0)

/* ---- helpers ------------------------------------------------------------ */

typedef struct bytes {
  unsigned char *p;
  size_t n;
} bytes;

static bytes read_file(const char *path) {
  bytes b = {0};
  int fd = open(path, O_RDONLY);
  struct stat st;
  if (fd < 0 || fstat(fd, &st) != 0) {
    fprintf(stderr, "cannot read %s: %s\n", path, strerror(errno));
    exit(2);
  }
  b.n = (size_t)st.st_size;
  b.p = malloc(b.n + 1);
  if (!b.p || pread(fd, b.p, b.n, 0) != (ssize_t)b.n) {
    fprintf(stderr, "cannot read %s\n", path);
    exit(2);
  }
  close(fd);
  return b;
}

static bytes dup_bytes(bytes b) {
  bytes c = {malloc(b.n + 1), b.n};
  if (!c.p)
    abort();
  memcpy(c.p, b.p, b.n);
  return c;
}

static int mem_fd(const void *p, size_t n) {
  int fd = memfd_create("elf-test", MFD_CLOEXEC);
  if (fd < 0) {
    perror("memfd_create");
    exit(2);
  }
  if (n && write(fd, p, n) != (ssize_t)n) {
    perror("write");
    exit(2);
  }
  return fd;
}

static void check_msg(const char *err, int rc, const char *ctx) {
  if (rc == 0)
    return;
  CHECK(err[0] != '\0', "%s: %s without a message", ctx, molt_err_name(rc));
  CHECK(strchr(err, '\n') == NULL, "%s: message is not one line: %s", ctx, err);
}

/* Reads the patch note of an in-memory file; err gets the message. */
static int note_of(const void *p, size_t n, molt__patch_note *note, char *err,
                   size_t errlen) {
  int fd = mem_fd(p, n);
  molt__patch_note tmp;
  err[0] = '\0';
  int rc = molt__elf_read_patch_note(fd, note ? note : &tmp, err, errlen);
  close(fd);
  return rc;
}

/* Exercises the other readers on a (possibly corrupt) file: they must return
 * an error or a consistent result, never crash. */
static void poke_other_readers(const void *p, size_t n) {
  int fd = mem_fd(p, n);
  char hex[MOLT__BUILD_ID_HEX_MAX + 1], err[256], path[64];
  int rc = molt__elf_file_build_id(fd, hex, sizeof hex, err, sizeof err);
  if (rc == 0)
    CHECK(strlen(hex) % 2 == 0 && hex[0], "odd build-id %s", hex);
  uint64_t off = 0;
  molt__patch_note note;
  rc = molt__elf_patch_note_offset(fd, &off, &note, err, sizeof err);
  if (rc == 0)
    CHECK(off + sizeof note <= n, "note offset %llu outside %zu bytes",
          (unsigned long long)off, n);
  snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
  molt__symtab *st;
  if (molt__symtab_open(path, &st) == 0) {
    uintptr_t v;
    molt__symtab_lookup(st, "molt_patch_header", NULL, &v);
    molt__symtab_lookup(st, "elf_fx_global_fn__molt_p", "patch.c", &v);
    molt__symtab_lookup(st, "", NULL, &v);
    molt__symtab_close(st);
  }
  close(fd);
}

/* Minimal views into a trusted ELF image built by the toolchain. */
static Elf64_Ehdr *ehdr(bytes b) { return (Elf64_Ehdr *)b.p; }
static Elf64_Shdr *shdr(bytes b, size_t i) {
  return (Elf64_Shdr *)(b.p + ehdr(b)->e_shoff) + i;
}
static Elf64_Phdr *phdr(bytes b, size_t i) {
  return (Elf64_Phdr *)(b.p + ehdr(b)->e_phoff) + i;
}
static const char *sname(bytes b, size_t i) {
  return (const char *)b.p + shdr(b, ehdr(b)->e_shstrndx)->sh_offset +
         shdr(b, i)->sh_name;
}
static size_t section_index(bytes b, const char *name) {
  for (size_t i = 1; i < ehdr(b)->e_shnum; i++)
    if (strcmp(sname(b, i), name) == 0)
      return i;
  fprintf(stderr, "fixture has no section %s\n", name);
  exit(2);
}
static Elf64_Phdr *segment(bytes b, uint32_t type) {
  for (size_t i = 0; i < ehdr(b)->e_phnum; i++)
    if (phdr(b, i)->p_type == type)
      return phdr(b, i);
  fprintf(stderr, "fixture has no segment of type %u\n", type);
  exit(2);
}
static Elf64_Dyn *dyn_entry(bytes b, int64_t tag) {
  Elf64_Phdr *d = segment(b, PT_DYNAMIC);
  Elf64_Dyn *e = (Elf64_Dyn *)(b.p + d->p_offset);
  for (size_t i = 0; i < d->p_filesz / sizeof *e; i++)
    if (e[i].d_tag == tag)
      return &e[i];
  return NULL;
}

/* File offset of the molt note's descriptor, found by the reader itself
 * (and cross-checked against the section in test_patch_note). */
static uint64_t note_desc_off(bytes b) {
  int fd = mem_fd(b.p, b.n);
  uint64_t off = 0;
  char err[256];
  int rc = molt__elf_patch_note_offset(fd, &off, NULL, err, sizeof err);
  close(fd);
  if (rc) {
    fprintf(stderr, "fixture patch has no note: %s\n", err);
    exit(2);
  }
  return off;
}

static void set_target_id(bytes b, const char *id, size_t len) {
  uint64_t off = note_desc_off(b) + offsetof(molt__patch_note, target_build_id);
  memset(b.p + off, 0, sizeof(((molt__patch_note *)0)->target_build_id));
  memcpy(b.p + off, id, len);
}

static const char *self_path(char *buf, size_t len) {
  ssize_t n = readlink("/proc/self/exe", buf, len - 1);
  if (n < 0)
    abort();
  buf[n] = '\0';
  return buf;
}

/* ---- unit: build-ids ---------------------------------------------------- */

static void test_loaded_build_id(void) {
  char hex[MOLT__BUILD_ID_HEX_MAX + 1], fhex[MOLT__BUILD_ID_HEX_MAX + 1];
  char path[PATH_MAX], self[PATH_MAX], err[256];
  uintptr_t base = 1;

  int rc = molt__elf_build_id_of_loaded((const void *)&test_loaded_build_id, hex,
                                        sizeof hex, &base, path, sizeof path);
  CHECK_RC(rc, 0, "build-id of the test executable");
  CHECK(strcmp(path, self_path(self, sizeof self)) == 0, "path %s, want %s", path, self);
  CHECK(strlen(hex) == 40, "sha1 build-id expected, got %s", hex);

  int fd = open(self, O_RDONLY);
  rc = molt__elf_file_build_id(fd, fhex, sizeof fhex, err, sizeof err);
  close(fd);
  CHECK_RC(rc, 0, err);
  CHECK(strcmp(hex, fhex) == 0, "loaded %s != file %s", hex, fhex);

  /* A data address of the executable is found too. */
  char hex2[MOLT__BUILD_ID_HEX_MAX + 1];
  uintptr_t base2 = 0;
  rc = molt__elf_build_id_of_loaded(&elf_fx_global, hex2, sizeof hex2, &base2, NULL, 0);
  CHECK_RC(rc, 0, "build-id from a data address");
  CHECK(strcmp(hex, hex2) == 0 && base == base2, "data address: %s", hex2);

  /* A shared library: libc, through a function nothing intercepts. */
  rc = molt__elf_build_id_of_loaded((const void *)&gnu_get_libc_version, hex, sizeof hex,
                                    &base, path, sizeof path);
  CHECK_RC(rc, 0, "build-id of libc");
  CHECK(strstr(path, "libc.so") != NULL, "libc path %s", path);
  fd = open(path, O_RDONLY);
  CHECK(fd >= 0, "open %s", path);
  rc = molt__elf_file_build_id(fd, fhex, sizeof fhex, err, sizeof err);
  close(fd);
  CHECK_RC(rc, 0, err);
  CHECK(strcmp(hex, fhex) == 0, "libc loaded %s != file %s", hex, fhex);

  /* Addresses outside every module. */
  void *heap = malloc(16);
  int local = 0;
  CHECK_RC(molt__elf_build_id_of_loaded(heap, hex, sizeof hex, NULL, NULL, 0),
           MOLT_ENOENT, "heap address");
  CHECK_RC(molt__elf_build_id_of_loaded(&local, hex, sizeof hex, NULL, NULL, 0),
           MOLT_ENOENT, "stack address");
  CHECK_RC(molt__elf_build_id_of_loaded((void *)16, hex, sizeof hex, NULL, NULL, 0),
           MOLT_ENOENT, "address 16");
  free(heap);

  CHECK_RC(molt__elf_build_id_of_loaded((const void *)&test_loaded_build_id, hex, 8, NULL,
                                        NULL, 0),
           MOLT_EINVAL, "hex buffer too small");
  CHECK_RC(molt__elf_build_id_of_loaded((const void *)&test_loaded_build_id, hex,
                                        sizeof hex, NULL, path, 3),
           MOLT_EINVAL, "path buffer too small");
}

/* ---- unit: patch note --------------------------------------------------- */

static void test_patch_note(const char *patch_path, const char *target_path) {
  bytes p = read_file(patch_path);
  char err[256];
  molt__patch_note note;

  /* As built: a valid patch, not stamped yet. */
  int rc = note_of(p.p, p.n, &note, err, sizeof err);
  CHECK_RC(rc, MOLT_ENOTPATCH, "unstamped patch");
  CHECK(strstr(err, "not stamped") != NULL, "message: %s", err);

  int fd = open(patch_path, O_RDONLY);
  uint64_t off = 0;
  rc = molt__elf_patch_note_offset(fd, &off, &note, err, sizeof err);
  close(fd);
  CHECK_RC(rc, 0, err);
  CHECK(note.abi == MOLT__ABI && note.target_build_id[0] == '\0',
        "abi %u, target '%.16s'", note.abi, note.target_build_id);

  /* The offset is inside .note.molt, right after the note's header. */
  size_t si = section_index(p, ".note.molt");
  Elf64_Shdr *s = shdr(p, si);
  CHECK(s->sh_type == SHT_NOTE, ".note.molt has type %u", s->sh_type);
  CHECK(off == s->sh_offset + 12 + 8, "descriptor at %llu, section at %llu",
        (unsigned long long)off, (unsigned long long)s->sh_offset);
  CHECK(memcmp(p.p + off, &note, sizeof note) == 0, "note bytes differ");
  uint32_t hdr[3];
  memcpy(hdr, p.p + s->sh_offset, sizeof hdr);
  CHECK(hdr[0] == 5 && hdr[1] == sizeof(molt__patch_note) && hdr[2] == MOLT__NOTE_TYPE &&
            memcmp(p.p + s->sh_offset + 12, "molt", 5) == 0,
        "note header %u %u %#x", hdr[0], hdr[1], hdr[2]);

  /* Stamped: accepted, and the id comes back. */
  bytes q = dup_bytes(p);
  set_target_id(q, "0123456789abcdef", 16);
  rc = note_of(q.p, q.n, &note, err, sizeof err);
  CHECK_RC(rc, 0, err);
  CHECK(strcmp(note.target_build_id, "0123456789abcdef") == 0, "id %s",
        note.target_build_id);

  /* A stamp of the longest allowed id. */
  char longid[MOLT__BUILD_ID_HEX_MAX + 1];
  memset(longid, 'a', MOLT__BUILD_ID_HEX_MAX);
  longid[MOLT__BUILD_ID_HEX_MAX] = '\0';
  set_target_id(q, longid, MOLT__BUILD_ID_HEX_MAX);
  CHECK_RC(note_of(q.p, q.n, NULL, err, sizeof err), 0, "128-digit id");

  static const struct {
    const char *id;
    size_t len;
    int want;
  } bad[] = {
      {"xyz0", 4, MOLT_ECORRUPT},                           /* not hex */
      {"ABCD", 4, MOLT_ECORRUPT},                           /* not lowercase */
      {"abc", 3, MOLT_ECORRUPT},                            /* odd length */
      {"ab cd", 5, MOLT_ECORRUPT}, {"", 0, MOLT_ENOTPATCH}, /* unstamped */
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    set_target_id(q, bad[i].id, bad[i].len);
    rc = note_of(q.p, q.n, NULL, err, sizeof err);
    CHECK_RC(rc, bad[i].want, bad[i].id);
    check_msg(err, rc, bad[i].id);
  }
  /* Too long: 130 digits and no NUL in the field at all. */
  char toolong[sizeof note.target_build_id];
  memset(toolong, 'a', sizeof toolong);
  set_target_id(q, toolong, MOLT__BUILD_ID_HEX_MAX + 2);
  CHECK_RC(note_of(q.p, q.n, NULL, err, sizeof err), MOLT_ECORRUPT, "130-digit id");
  set_target_id(q, toolong, sizeof toolong);
  rc = note_of(q.p, q.n, NULL, err, sizeof err);
  CHECK_RC(rc, MOLT_ECORRUPT, "unterminated id");
  CHECK(strstr(err, "NUL") != NULL, "message: %s", err);

  /* Another ABI. */
  set_target_id(q, "00", 2);
  uint32_t abi = MOLT__ABI + 1;
  memcpy(q.p + off, &abi, sizeof abi);
  rc = note_of(q.p, q.n, NULL, err, sizeof err);
  CHECK_RC(rc, MOLT_EABI, "abi + 1");
  check_msg(err, rc, "abi + 1");
  free(q.p);

  /* A program is a valid ELF file but not a patch. */
  bytes t = read_file(target_path);
  rc = note_of(t.p, t.n, NULL, err, sizeof err);
  CHECK_RC(rc, MOLT_ENOTPATCH, "target program");
  CHECK(strstr(err, "no molt patch note (.note.molt)") != NULL, "message: %s", err);

  /* NULL err buffer is allowed. */
  fd = mem_fd(t.p, t.n);
  CHECK_RC(molt__elf_read_patch_note(fd, &note, NULL, 0), MOLT_ENOTPATCH, "NULL err");
  close(fd);
  CHECK_RC(molt__elf_read_patch_note(-1, &note, err, sizeof err), MOLT_EINVAL, "fd -1");

  /* The patch's own build-id is readable from the file. */
  char hex[MOLT__BUILD_ID_HEX_MAX + 1];
  fd = mem_fd(p.p, p.n);
  CHECK_RC(molt__elf_file_build_id(fd, hex, sizeof hex, err, sizeof err), 0, err);
  CHECK_RC(molt__elf_file_build_id(fd, hex, 10, err, sizeof err), MOLT_EINVAL,
           "small hex buffer");
  close(fd);
  free(t.p);
  free(p.p);
}

/* ---- unit: symbol tables ------------------------------------------------ */

static void want_sym(const molt__symtab *st, uintptr_t base, const char *name,
                     const char *tu, const void *addr) {
  uintptr_t v = 0;
  char ctx[160];
  snprintf(ctx, sizeof ctx, "lookup %s in %s", name, tu ? tu : "(global)");
  int rc = molt__symtab_lookup(st, name, tu, &v);
  CHECK_RC(rc, 0, ctx);
  if (rc == 0)
    CHECK(v + base == (uintptr_t)addr, "%s: %#lx + %#lx != %p", ctx, (unsigned long)v,
          (unsigned long)base, addr);
}

static void want_rc(const molt__symtab *st, const char *name, const char *tu, int want) {
  uintptr_t v = 0;
  char ctx[160];
  snprintf(ctx, sizeof ctx, "lookup %s in %s", name, tu ? tu : "(global)");
  CHECK_RC(molt__symtab_lookup(st, name, tu, &v), want, ctx);
}

static void test_symtab_self(void) {
  char hex[MOLT__BUILD_ID_HEX_MAX + 1], path[PATH_MAX];
  uintptr_t base = 0;
  int rc = molt__elf_build_id_of_loaded((const void *)&test_symtab_self, hex, sizeof hex,
                                        &base, path, sizeof path);
  CHECK_RC(rc, 0, "locate self");
  molt__symtab *st = NULL;
  rc = molt__symtab_open(path, &st);
  CHECK_RC(rc, 0, "open own symbol table");
  if (rc)
    return;

  want_sym(st, base, "elf_fx_global", NULL, &elf_fx_global);
  want_sym(st, base, "elf_fx_exported", NULL, &elf_fx_exported);
  want_sym(st, base, "elf_fx_weak", NULL, &elf_fx_weak);
  want_sym(st, base, "elf_fx_global_fn", NULL, (void *)&elf_fx_global_fn);
  want_sym(st, base, "main", NULL, (void *)&main);
  /* GNU ld made these local (hidden, referenced from another TU) and put
   * them in its empty-named STT_FILE group. */
  want_sym(st, base, "elf_fx_one_helper", NULL, (void *)&elf_fx_one_helper);
  want_sym(st, base, "elf_fx_two_counter", NULL, (void *)&elf_fx_two_counter);
  want_sym(st, base, "elf_fx_counter", "tu_one.c", elf_fx_one_counter());
  want_sym(st, base, "elf_fx_counter", "tu_two.c", elf_fx_two_counter());
  want_sym(st, base, "elf_fx_counter", "/some/dir/tu_two.c", elf_fx_two_counter());
  want_sym(st, base, "elf_fx_helper", "tu_one.c", elf_fx_one_helper());
  want_sym(st, base, "elf_fx_helper", "tu_two.c", elf_fx_two_helper());

  want_rc(st, "elf_fx_counter", NULL, MOLT_ENOSYM); /* statics only */
  want_rc(st, "elf_fx_counter", "tu_three.c", MOLT_ENOSYM);
  want_rc(st, "elf_fx_counter", "", MOLT_ENOSYM);
  want_rc(st, "elf_fx_counter", "dir/", MOLT_ENOSYM);
  want_rc(st, "elf_fx_same", "same.c", MOLT_EAMBIGUOUS);
  want_rc(st, "elf_fx_same", "a/same.c", MOLT_EAMBIGUOUS); /* by basename */
  want_rc(st, "elf_fx_same", NULL, MOLT_ENOSYM);
  want_rc(st, "elf_fx_no_such_symbol", NULL, MOLT_ENOSYM);
  want_rc(st, "malloc", NULL, MOLT_ENOSYM); /* undefined here */
  want_rc(st, "", NULL, MOLT_ENOSYM);
  want_rc(st, "elf_fx_coun", NULL, MOLT_ENOSYM);
  want_rc(st, "elf_fx_counterx", "tu_one.c", MOLT_ENOSYM);
  CHECK_RC(molt__symtab_lookup(st, NULL, NULL, &base), MOLT_EINVAL, "NULL name");
  molt__symtab_close(st);

  CHECK_RC(molt__symtab_open("/nonexistent/file", &st), MOLT_ENOENT, "missing file");
  CHECK_RC(molt__symtab_open("/", &st), MOLT_ENOTSUP, "a directory");
  molt__symtab_close(NULL);
}

static void test_symtab_patch(const char *patch_path) {
  molt__symtab *st = NULL;
  uintptr_t v1 = 0, v2 = 0, v3 = 0;
  int rc = molt__symtab_open(patch_path, &st);
  CHECK_RC(rc, 0, "open patch symbols");
  if (rc)
    return;
  CHECK_RC(molt__symtab_lookup(st, "molt_patch_header", NULL, &v1), 0,
           "molt_patch_header");
  CHECK_RC(molt__symtab_lookup(st, "elf_fx_global_fn__molt_p", "patch.c", &v2), 0,
           "static patch function");
  molt__symtab_close(st);

  /* Without .symtab (a stripped file), globals come from .dynsym. */
  bytes p = read_file(patch_path);
  shdr(p, section_index(p, ".symtab"))->sh_type = SHT_NULL;
  int fd = mem_fd(p.p, p.n);
  char path[64];
  snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
  rc = molt__symtab_open(path, &st);
  CHECK_RC(rc, 0, "open stripped patch");
  if (rc == 0) {
    CHECK_RC(molt__symtab_lookup(st, "molt_patch_header", NULL, &v3), 0,
             "dynsym molt_patch_header");
    CHECK(v1 == v3, "symtab %#lx != dynsym %#lx", (unsigned long)v1, (unsigned long)v3);
    CHECK_RC(molt__symtab_lookup(st, "elf_fx_global_fn__molt_p", "patch.c", &v2),
             MOLT_ENOSYM, "static without .symtab");
    molt__symtab_close(st);
  }
  close(fd);
  free(p.p);
}

/* A synthetic ELF file with just a symbol table: edge cases the toolchain
 * does not produce on demand, and a table big enough to time lookups. */
typedef struct synth {
  Elf64_Sym *syms;
  size_t nsyms, cap;
  char *str;
  size_t strlen_, strcap;
} synth;

static uint32_t synth_str(synth *s, const char *name) {
  size_t n = strlen(name) + 1;
  while (s->strlen_ + n > s->strcap) {
    s->strcap = s->strcap ? 2 * s->strcap : 4096;
    s->str = realloc(s->str, s->strcap);
  }
  memcpy(s->str + s->strlen_, name, n);
  s->strlen_ += n;
  return (uint32_t)(s->strlen_ - n);
}

static void synth_sym(synth *s, const char *name, int bind, int type, int vis,
                      uint16_t shndx, uint64_t value) {
  if (s->nsyms == s->cap) {
    s->cap = s->cap ? 2 * s->cap : 1024;
    s->syms = realloc(s->syms, s->cap * sizeof *s->syms);
  }
  Elf64_Sym *y = &s->syms[s->nsyms++];
  memset(y, 0, sizeof *y);
  y->st_name = synth_str(s, name);
  y->st_info = ELF64_ST_INFO(bind, type);
  y->st_other = ELF64_ST_VISIBILITY(vis);
  y->st_shndx = shndx;
  y->st_value = value;
}

static void synth_init(synth *s) {
  memset(s, 0, sizeof *s);
  synth_str(s, "");
  synth_sym(s, "", STB_LOCAL, STT_NOTYPE, STV_DEFAULT, SHN_UNDEF, 0);
}

/* Layout: ehdr, symtab, strtab, shstrtab, section headers. */
static bytes synth_file(synth *s) {
  static const char shstr[] = "\0.symtab\0.strtab\0.shstrtab";
  size_t symoff = sizeof(Elf64_Ehdr), symsz = s->nsyms * sizeof(Elf64_Sym);
  size_t stroff = symoff + symsz, shstroff = stroff + s->strlen_;
  size_t shoff = (shstroff + sizeof shstr + 7) & ~(size_t)7;
  bytes b = {calloc(1, shoff + 4 * sizeof(Elf64_Shdr)), shoff + 4 * sizeof(Elf64_Shdr)};
  Elf64_Ehdr *e = (Elf64_Ehdr *)b.p;
  memcpy(e->e_ident, ELFMAG, SELFMAG);
  e->e_ident[EI_CLASS] = ELFCLASS64;
  e->e_ident[EI_DATA] = ELFDATA2LSB;
  e->e_ident[EI_VERSION] = EV_CURRENT;
  e->e_type = ET_DYN;
  e->e_machine = EM_X86_64;
  e->e_version = EV_CURRENT;
  e->e_ehsize = sizeof *e;
  e->e_shoff = shoff;
  e->e_shentsize = sizeof(Elf64_Shdr);
  e->e_shnum = 4;
  e->e_shstrndx = 3;
  memcpy(b.p + symoff, s->syms, symsz);
  memcpy(b.p + stroff, s->str, s->strlen_);
  memcpy(b.p + shstroff, shstr, sizeof shstr);
  Elf64_Shdr *sh = (Elf64_Shdr *)(b.p + shoff);
  sh[1] = (Elf64_Shdr){.sh_name = 1,
                       .sh_type = SHT_SYMTAB,
                       .sh_offset = symoff,
                       .sh_size = symsz,
                       .sh_link = 2,
                       .sh_entsize = sizeof(Elf64_Sym),
                       .sh_addralign = 8};
  sh[2] = (Elf64_Shdr){.sh_name = 9,
                       .sh_type = SHT_STRTAB,
                       .sh_offset = stroff,
                       .sh_size = s->strlen_,
                       .sh_addralign = 1};
  sh[3] = (Elf64_Shdr){.sh_name = 17,
                       .sh_type = SHT_STRTAB,
                       .sh_offset = shstroff,
                       .sh_size = sizeof shstr,
                       .sh_addralign = 1};
  free(s->syms);
  free(s->str);
  return b;
}

static molt__symtab *synth_open(bytes b, int *fdp) {
  int fd = mem_fd(b.p, b.n);
  char path[64];
  snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
  molt__symtab *st = NULL;
  int rc = molt__symtab_open(path, &st);
  CHECK_RC(rc, 0, "open synthetic symbol table");
  *fdp = fd;
  return st;
}

static void want_value(const molt__symtab *st, const char *name, const char *tu,
                       uint64_t want) {
  uintptr_t v = 0;
  char ctx[160];
  snprintf(ctx, sizeof ctx, "synthetic %s in %s", name, tu ? tu : "(global)");
  int rc = molt__symtab_lookup(st, name, tu, &v);
  CHECK_RC(rc, 0, ctx);
  CHECK(rc || v == want, "%s: %#lx, want %#lx", ctx, (unsigned long)v,
        (unsigned long)want);
}

static void test_symtab_synthetic(void) {
  synth s;
  synth_init(&s);
  /* Locals before any STT_FILE belong to no TU. */
  synth_sym(&s, "orphan", STB_LOCAL, STT_OBJECT, STV_DEFAULT, 5, 0x10);
  synth_sym(&s, "dir/x.c", STB_LOCAL, STT_FILE, STV_DEFAULT, SHN_ABS, 0);
  synth_sym(&s, "xs", STB_LOCAL, STT_OBJECT, STV_DEFAULT, 5, 0x20);
  synth_sym(&s, "xf", STB_LOCAL, STT_FUNC, STV_DEFAULT, 5, 0x30);
  synth_sym(&s, "xtls", STB_LOCAL, STT_TLS, STV_DEFAULT, 5, 0x40);
  synth_sym(&s, "xabs", STB_LOCAL, STT_OBJECT, STV_DEFAULT, SHN_ABS, 0x50);
  synth_sym(&s, "xhid", STB_LOCAL, STT_OBJECT, STV_HIDDEN, 5, 0x60);
  synth_sym(&s, "xnotype", STB_LOCAL, STT_NOTYPE, STV_DEFAULT, 5, 0x70);
  synth_sym(&s, "y.c", STB_LOCAL, STT_FILE, STV_DEFAULT, SHN_ABS, 0);
  synth_sym(&s, "xs", STB_LOCAL, STT_OBJECT, STV_DEFAULT, 5, 0x80);
  /* GNU ld's empty STT_FILE: symbols it made local, global in the source. */
  synth_sym(&s, "", STB_LOCAL, STT_FILE, STV_DEFAULT, SHN_ABS, 0);
  synth_sym(&s, "forced", STB_LOCAL, STT_FUNC, STV_DEFAULT, 5, 0x90);
  synth_sym(&s, "g", STB_GLOBAL, STT_OBJECT, STV_DEFAULT, 5, 0xa0);
  synth_sym(&s, "w", STB_WEAK, STT_FUNC, STV_DEFAULT, 5, 0xb0);
  synth_sym(&s, "und", STB_GLOBAL, STT_FUNC, STV_DEFAULT, SHN_UNDEF, 0);
  synth_sym(&s, "gtls", STB_GLOBAL, STT_TLS, STV_DEFAULT, 5, 0xc0);
  synth_sym(&s, "twice", STB_GLOBAL, STT_OBJECT, STV_DEFAULT, 5, 0xd0);
  synth_sym(&s, "twice", STB_GLOBAL, STT_OBJECT, STV_DEFAULT, 5, 0xe0);
  synth_sym(&s, "same", STB_GLOBAL, STT_OBJECT, STV_DEFAULT, 5, 0xf0);
  synth_sym(&s, "same", STB_WEAK, STT_OBJECT, STV_DEFAULT, 5, 0xf0);
  synth_sym(&s, "xhid", STB_GLOBAL, STT_OBJECT, STV_DEFAULT, SHN_UNDEF, 0);
  bytes b = synth_file(&s);
  int fd;
  molt__symtab *st = synth_open(b, &fd);
  if (st) {
    want_rc(st, "orphan", NULL, MOLT_ENOSYM);
    want_rc(st, "orphan", "x.c", MOLT_ENOSYM);
    want_value(st, "xs", "x.c", 0x20);
    want_value(st, "xs", "dir/x.c", 0x20);
    want_value(st, "xs", "other/x.c", 0x20);
    want_value(st, "xs", "y.c", 0x80);
    want_value(st, "xf", "x.c", 0x30);
    want_rc(st, "xs", NULL, MOLT_ENOSYM);
    want_rc(st, "xtls", "x.c", MOLT_ENOSYM);
    want_rc(st, "xabs", "x.c", MOLT_ENOSYM);
    want_rc(st, "xnotype", "x.c", MOLT_ENOSYM);
    want_value(st, "xhid", NULL, 0x60);
    want_value(st, "forced", NULL, 0x90);
    want_rc(st, "forced", "y.c", MOLT_ENOSYM);
    want_value(st, "g", NULL, 0xa0);
    want_rc(st, "g", "y.c", MOLT_ENOSYM);
    want_value(st, "w", NULL, 0xb0);
    want_rc(st, "und", NULL, MOLT_ENOSYM);
    want_rc(st, "gtls", NULL, MOLT_ENOSYM);
    want_rc(st, "twice", NULL, MOLT_EAMBIGUOUS);
    want_value(st, "same", NULL, 0xf0);
    molt__symtab_close(st);
  }
  close(fd);
  free(b.p);

  /* 100,000 globals and 50,000 statics in 1,000 TUs: lookups must be
   * indexed, not linear scans. */
  enum { NGLOBAL = 100000, NTU = 1000, NSTATIC = 50 };
  synth_init(&s);
  char name[64];
  for (int t = 0; t < NTU; t++) {
    snprintf(name, sizeof name, "src/tu%04d.c", t);
    synth_sym(&s, name, STB_LOCAL, STT_FILE, STV_DEFAULT, SHN_ABS, 0);
    for (int i = 0; i < NSTATIC; i++) {
      snprintf(name, sizeof name, "static_%02d", i);
      synth_sym(&s, name, STB_LOCAL, STT_OBJECT, STV_DEFAULT, 5,
                0x100000 + (uint64_t)t * NSTATIC + i);
    }
  }
  for (int i = 0; i < NGLOBAL; i++) {
    snprintf(name, sizeof name, "global_%06d", (i * 7919) % NGLOBAL);
    synth_sym(&s, name, STB_GLOBAL, STT_FUNC, STV_DEFAULT, 5,
              (uint64_t)((i * 7919) % NGLOBAL) * 16);
  }
  b = synth_file(&s);
  struct timespec t0, t1;
  /* CPU time of this thread, not wall time: a loaded machine (CI's two
   * cores shared with other tests) stretches the wall clock, not the work */
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t0);
  st = synth_open(b, &fd);
  if (st) {
    int bad = 0;
    for (int i = 0; i < NGLOBAL; i++) {
      uintptr_t v;
      snprintf(name, sizeof name, "global_%06d", i);
      if (molt__symtab_lookup(st, name, NULL, &v) != 0 || v != (uintptr_t)i * 16)
        bad++;
    }
    for (int t = 0; t < NTU; t += 7) {
      char tu[32];
      snprintf(tu, sizeof tu, "tu%04d.c", t);
      for (int i = 0; i < NSTATIC; i++) {
        uintptr_t v;
        snprintf(name, sizeof name, "static_%02d", i);
        if (molt__symtab_lookup(st, name, tu, &v) != 0 ||
            v != 0x100000 + (uintptr_t)t * NSTATIC + i)
          bad++;
      }
    }
    CHECK(bad == 0, "%d wrong lookups in the big table", bad);
    molt__symtab_close(st);
  }
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t1);
  double secs = (double)(t1.tv_sec - t0.tv_sec) + (t1.tv_nsec - t0.tv_nsec) / 1e9;
  /* Linear scans would take minutes of CPU; indexed lookups take well
   * under a second even under sanitizers. */
  CHECK(secs < 20.0, "big table: %.2f s", secs);
  printf("big symbol table: open + %d lookups in %.3f s of CPU\n",
         NGLOBAL + (NTU / 7 + 1) * NSTATIC, secs);
  close(fd);
  free(b.p);
}

/* ---- corrupt ------------------------------------------------------------ */

/* want: a MOLT_E* code, ANY_ERROR, or ACCEPTED (must still be read). */
#define ANY_ERROR 0
#define ACCEPTED 1

static char last_err[256];

static int try_bytes(bytes b, const char *what, int want) {
  char *err = last_err;
  int rc = note_of(b.p, b.n, NULL, err, sizeof last_err);
  if (want == ACCEPTED)
    CHECK_RC(rc, 0, what);
  else if (want == ANY_ERROR)
    CHECK(rc != 0, "%s: accepted", what);
  else
    CHECK_RC(rc, want, what);
  check_msg(err, rc, what);
  poke_other_readers(b.p, b.n);
  return rc;
}

/* Applies `mutate` to a fresh copy of the stamped patch and checks the
 * result code. */
#define MUTATE(base, what, want, stmt)                                                   \
  do {                                                                                   \
    bytes m = dup_bytes(base);                                                           \
    Elf64_Ehdr *E = ehdr(m);                                                             \
    (void)E;                                                                             \
    stmt;                                                                                \
    try_bytes(m, what, want);                                                            \
    free(m.p);                                                                           \
  } while (0)

static void test_corrupt(const char *patch_path) {
  bytes p = read_file(patch_path);
  set_target_id(p, "0123456789abcdef0123456789abcdef01234567", 40);
  char err[256], what[128];
  CHECK_RC(note_of(p.p, p.n, NULL, err, sizeof err), 0, err);

  /* Truncation everywhere: every 64 bytes, and the interesting places. */
  size_t cuts = 0;
  for (size_t len = 0; len < p.n; len = len < 80 ? len + 1 : len + 64) {
    bytes m = {p.p, len};
    snprintf(what, sizeof what, "truncated to %zu bytes", len);
    int rc = try_bytes(m, what, len < 4 ? MOLT_ENOTPATCH : MOLT_ECORRUPT);
    if (rc == MOLT_ECORRUPT)
      CHECK(strncmp(last_err, "file is truncated: ", 19) == 0, "%s: %s", what, last_err);
    cuts++;
  }
  bytes last = {p.p, p.n - 1};
  try_bytes(last, "truncated by one byte", MOLT_ECORRUPT);
  {
    bytes m = {p.p, 4096};
    note_of(m.p, m.n, NULL, err, sizeof err);
    CHECK(strstr(err, "file is truncated: section headers end at byte") == err,
          "message: %s", err);
  }
  printf("truncations: %zu\n", cuts);

  /* ELF header fields. */
  uint64_t N = p.n;
  MUTATE(p, "e_phoff huge", MOLT_ECORRUPT, E->e_phoff = ~(uint64_t)0 - 8);
  MUTATE(p, "e_phoff at EOF", MOLT_ECORRUPT, E->e_phoff = N);
  MUTATE(p, "e_phnum huge", MOLT_ECORRUPT, E->e_phnum = 0x7fff);
  MUTATE(p, "e_phnum PN_XNUM", MOLT_ECORRUPT, E->e_phnum = PN_XNUM);
  MUTATE(p, "e_phnum 0", MOLT_ECORRUPT, E->e_phnum = 0);
  MUTATE(p, "e_phentsize", MOLT_ECORRUPT, E->e_phentsize = 32);
  MUTATE(p, "e_shoff huge", MOLT_ECORRUPT, E->e_shoff = ~(uint64_t)0 - 8);
  MUTATE(p, "e_shoff at EOF", MOLT_ECORRUPT, E->e_shoff = N);
  MUTATE(p, "e_shoff 0", MOLT_ECORRUPT, E->e_shoff = 0);
  MUTATE(p, "e_shnum huge", MOLT_ECORRUPT, E->e_shnum = 0xfeff);
  MUTATE(p, "e_shnum extended huge", MOLT_ECORRUPT,
         (E->e_shnum = 0, shdr(m, 0)->sh_size = ~(uint64_t)0 / 2));
  MUTATE(p, "e_shentsize", MOLT_ECORRUPT, E->e_shentsize = 40);
  MUTATE(p, "e_shstrndx out of range", MOLT_ECORRUPT, E->e_shstrndx = 0xfeff);
  MUTATE(p, "e_shstrndx not a string table", MOLT_ECORRUPT,
         E->e_shstrndx = (uint16_t)section_index(m, ".note.molt"));
  MUTATE(p, "e_ehsize", MOLT_ECORRUPT, E->e_ehsize = 12);
  MUTATE(p, "e_version", MOLT_ECORRUPT, E->e_version = 7);
  MUTATE(p, "EI_VERSION", MOLT_ECORRUPT, E->e_ident[EI_VERSION] = 9);
  MUTATE(p, "EI_CLASS invalid", MOLT_ECORRUPT, E->e_ident[EI_CLASS] = 7);
  MUTATE(p, "EI_CLASS 32", MOLT_ENOTPATCH, E->e_ident[EI_CLASS] = ELFCLASS32);
  MUTATE(p, "EI_DATA big-endian", MOLT_ENOTPATCH, E->e_ident[EI_DATA] = ELFDATA2MSB);
  MUTATE(p, "EI_DATA invalid", MOLT_ECORRUPT, E->e_ident[EI_DATA] = 0);
  MUTATE(p, "e_machine aarch64", MOLT_ENOTPATCH, E->e_machine = EM_AARCH64);
  MUTATE(p, "e_type EXEC", MOLT_ENOTPATCH, E->e_type = ET_EXEC);
  MUTATE(p, "e_type REL", MOLT_ENOTPATCH, E->e_type = ET_REL);
  MUTATE(p, "magic", MOLT_ENOTPATCH, E->e_ident[EI_MAG3] = 'G');

  /* Every section's range. */
  for (size_t i = 1; i < ehdr(p)->e_shnum; i++) {
    uint32_t type = shdr(p, i)->sh_type;
    if (type == SHT_NOBITS || type == SHT_NULL)
      continue;
    snprintf(what, sizeof what, "section %zu (%s) sh_offset at EOF", i, sname(p, i));
    MUTATE(p, what, MOLT_ECORRUPT, shdr(m, i)->sh_offset = N);
    snprintf(what, sizeof what, "section %zu (%s) sh_size huge", i, sname(p, i));
    MUTATE(p, what, MOLT_ECORRUPT, shdr(m, i)->sh_size = ~(uint64_t)0 - 100);
    snprintf(what, sizeof what, "section %zu (%s) sh_size past EOF", i, sname(p, i));
    MUTATE(p, what, MOLT_ECORRUPT, shdr(m, i)->sh_size = N - shdr(m, i)->sh_offset + 1);
  }

  /* The note. */
  uint64_t d = note_desc_off(p);
  uint64_t h = d - 20; /* namesz, descsz, type, "molt\0\0\0\0" */
  uint32_t u32;
  MUTATE(p, "note namesz huge", MOLT_ECORRUPT,
         (u32 = 0xffffffffu, memcpy(m.p + h, &u32, 4)));
  MUTATE(p, "note namesz 0x10000", MOLT_ECORRUPT,
         (u32 = 0x10000u, memcpy(m.p + h, &u32, 4)));
  CHECK(strstr(last_err, "overruns") != NULL, "message: %s", last_err);
  MUTATE(p, "note descsz huge", MOLT_ECORRUPT,
         (u32 = 0xfffffff0u, memcpy(m.p + h + 4, &u32, 4)));
  CHECK(strstr(last_err, "overruns") != NULL, "message: %s", last_err);
  MUTATE(p, "note descsz 4", MOLT_ECORRUPT, (u32 = 4, memcpy(m.p + h + 4, &u32, 4)));
  MUTATE(p, "note descsz 0", MOLT_ECORRUPT, (u32 = 0, memcpy(m.p + h + 4, &u32, 4)));
  MUTATE(p, "note type", MOLT_ECORRUPT, (u32 = 0x1234, memcpy(m.p + h + 8, &u32, 4)));
  MUTATE(p, "note owner", MOLT_ECORRUPT, m.p[h + 12 + 3] = 'x');
  MUTATE(p, "note abi", MOLT_EABI, (u32 = 77, memcpy(m.p + d, &u32, 4)));
  MUTATE(p, "note section size past its note", MOLT_ECORRUPT,
         shdr(m, section_index(m, ".note.molt"))->sh_size += 8);
  /* Without the section, the note is still found through PT_NOTE. */
  size_t ni = section_index(p, ".note.molt");
  char *nname =
      (char *)p.p + shdr(p, ehdr(p)->e_shstrndx)->sh_offset + shdr(p, ni)->sh_name;
  MUTATE(p, "note only in PT_NOTE", ACCEPTED, ({
           shdr(m, ni)->sh_type = SHT_PROGBITS;
           memcpy(m.p + (nname - (char *)p.p), ".note.xxxx", 10);
         }));
  MUTATE(p, "no molt note anywhere", MOLT_ENOTPATCH, ({
           shdr(m, ni)->sh_type = SHT_PROGBITS;
           memcpy(m.p + (nname - (char *)p.p), ".note.xxxx", 10);
           segment(m, PT_NOTE)->p_type = PT_NULL;
         }));
  CHECK(strstr(last_err, "no molt patch note") == last_err, "message: %s", last_err);

  /* Program headers: what the dynamic loader relies on. */
  for (size_t i = 0; i < ehdr(p)->e_phnum; i++) {
    if (phdr(p, i)->p_type != PT_LOAD)
      continue;
    snprintf(what, sizeof what, "PT_LOAD %zu p_offset at EOF", i);
    MUTATE(p, what, MOLT_ECORRUPT, phdr(m, i)->p_offset = N);
    snprintf(what, sizeof what, "PT_LOAD %zu p_filesz huge", i);
    MUTATE(p, what, MOLT_ECORRUPT,
           (phdr(m, i)->p_filesz = ~(uint64_t)0 - 4096,
            phdr(m, i)->p_memsz = ~(uint64_t)0 - 4096));
    snprintf(what, sizeof what, "PT_LOAD %zu p_filesz > p_memsz", i);
    MUTATE(p, what, MOLT_ECORRUPT, phdr(m, i)->p_memsz = phdr(m, i)->p_filesz - 1);
  }
  MUTATE(p, "no PT_LOAD", MOLT_ECORRUPT, ({
           for (size_t i = 0; i < E->e_phnum; i++)
             if (phdr(m, i)->p_type == PT_LOAD)
               phdr(m, i)->p_type = PT_NULL;
         }));
  MUTATE(p, "no PT_DYNAMIC", MOLT_ECORRUPT, segment(m, PT_DYNAMIC)->p_type = PT_NULL);
  MUTATE(p, "PT_DYNAMIC outside the segments", MOLT_ECORRUPT,
         segment(m, PT_DYNAMIC)->p_vaddr = 0x7fff00000000);
  MUTATE(p, "PT_DYNAMIC past EOF", MOLT_ECORRUPT,
         segment(m, PT_DYNAMIC)->p_offset = N - 8);
  MUTATE(p, "PT_DYNAMIC without DT_NULL", MOLT_ECORRUPT, ({
           Elf64_Phdr *dp = segment(m, PT_DYNAMIC);
           Elf64_Dyn *e = (Elf64_Dyn *)(m.p + dp->p_offset);
           for (size_t i = 0; i < dp->p_filesz / sizeof *e; i++)
             if (e[i].d_tag == DT_NULL)
               e[i].d_tag = DT_DEBUG;
         }));
  MUTATE(p, "DT_STRTAB outside", MOLT_ECORRUPT,
         dyn_entry(m, DT_STRTAB)->d_un.d_ptr = 0x7fff00000000);
  MUTATE(p, "DT_STRSZ huge", MOLT_ECORRUPT,
         dyn_entry(m, DT_STRSZ)->d_un.d_val = ~(uint64_t)0 / 2);
  MUTATE(p, "DT_SYMTAB outside", MOLT_ECORRUPT,
         dyn_entry(m, DT_SYMTAB)->d_un.d_ptr = ~(uint64_t)0);
  MUTATE(p, "DT_SYMENT", MOLT_ECORRUPT, dyn_entry(m, DT_SYMENT)->d_un.d_val = 16);
  if (dyn_entry(p, DT_NEEDED))
    MUTATE(p, "DT_NEEDED outside strtab", MOLT_ECORRUPT,
           dyn_entry(m, DT_NEEDED)->d_un.d_val = 1u << 30);
  if (dyn_entry(p, DT_RELA))
    MUTATE(p, "DT_RELASZ past the segment", MOLT_ECORRUPT,
           dyn_entry(m, DT_RELASZ)->d_un.d_val = 1u << 30);

  /* Not a patch at all. */
  static const char text[] = "hello, world\n";
  bytes m = {(unsigned char *)text, sizeof text - 1};
  try_bytes(m, "text file", MOLT_ENOTPATCH);
  note_of(m.p, m.n, NULL, err, sizeof err);
  CHECK(strcmp(err, "not an ELF file") == 0, "message: %s", err);
  m.n = 0;
  try_bytes(m, "empty file", MOLT_ENOTPATCH);
  m = (bytes){(unsigned char *)"\177ELF", 4};
  try_bytes(m, "magic only", MOLT_ECORRUPT);

  /* A 32-bit ELF shared object header (52 bytes), as gcc -m32 makes. */
  Elf32_Ehdr e32;
  memset(&e32, 0, sizeof e32);
  memcpy(e32.e_ident, ELFMAG, SELFMAG);
  e32.e_ident[EI_CLASS] = ELFCLASS32;
  e32.e_ident[EI_DATA] = ELFDATA2LSB;
  e32.e_ident[EI_VERSION] = EV_CURRENT;
  e32.e_type = ET_DYN;
  e32.e_machine = EM_386;
  e32.e_version = EV_CURRENT;
  e32.e_ehsize = sizeof e32;
  m = (bytes){(unsigned char *)&e32, sizeof e32};
  try_bytes(m, "32-bit ELF", MOLT_ENOTPATCH);
  note_of(m.p, m.n, NULL, err, sizeof err);
  CHECK(strstr(err, "64-bit") != NULL, "message: %s", err);

  int dfd = open("/", O_RDONLY | O_DIRECTORY);
  CHECK_RC(molt__elf_read_patch_note(dfd, NULL, err, sizeof err), MOLT_ENOTPATCH,
           "a directory");
  close(dfd);

  /* Random single-byte damage in the first 4 KiB, deterministic: whatever
   * the code, no crash (ASan/UBSan watch the reads). */
  uint64_t x = 0x9e3779b97f4a7c15u;
  for (int i = 0; i < 400; i++) {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    bytes q = dup_bytes(p);
    size_t span = q.n < 4096 ? q.n : 4096;
    q.p[(x >> 8) % span] = (unsigned char)x;
    char e2[256];
    int rc = note_of(q.p, q.n, NULL, e2, sizeof e2);
    check_msg(e2, rc, "random byte");
    poke_other_readers(q.p, q.n);
    free(q.p);
  }
  free(p.p);
}

/* ---- stamp -------------------------------------------------------------- */

/* Runs argv with stdout and stderr to files; returns the exit status. */
static int run(char *const argv[], char *out, size_t outlen, char *errout,
               size_t errlen) {
  char opath[] = "/tmp/molt-elf-out-XXXXXX", epath[] = "/tmp/molt-elf-err-XXXXXX";
  int ofd = mkstemp(opath), efd = mkstemp(epath);
  if (ofd < 0 || efd < 0)
    abort();
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_adddup2(&fa, ofd, 1);
  posix_spawn_file_actions_adddup2(&fa, efd, 2);
  pid_t pid;
  int status = -1;
  if (posix_spawn(&pid, argv[0], &fa, NULL, argv, environ) == 0)
    waitpid(pid, &status, 0);
  posix_spawn_file_actions_destroy(&fa);
  ssize_t n = pread(ofd, out, outlen - 1, 0);
  out[n > 0 ? n : 0] = '\0';
  n = pread(efd, errout, errlen - 1, 0);
  errout[n > 0 ? n : 0] = '\0';
  close(ofd);
  close(efd);
  unlink(opath);
  unlink(epath);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128;
}

static void write_file(const char *path, bytes b) {
  int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
  if (fd < 0 || write(fd, b.p, b.n) != (ssize_t)b.n)
    abort();
  close(fd);
}

static void test_stamp(char *moltstamp, const char *patch_path, char *target_path) {
  bytes orig = read_file(patch_path);
  char copy[] = "/tmp/molt-elf-patch-XXXXXX";
  int cfd = mkstemp(copy);
  if (cfd < 0)
    abort();
  close(cfd);
  write_file(copy, orig);

  char out[4096], errout[4096], err[256];
  char target_hex[MOLT__BUILD_ID_HEX_MAX + 1], patch_hex[MOLT__BUILD_ID_HEX_MAX + 1];
  int fd = open(target_path, O_RDONLY);
  CHECK_RC(molt__elf_file_build_id(fd, target_hex, sizeof target_hex, err, sizeof err), 0,
           err);
  close(fd);
  fd = open(copy, O_RDONLY);
  CHECK_RC(molt__elf_file_build_id(fd, patch_hex, sizeof patch_hex, err, sizeof err), 0,
           err);
  close(fd);

  /* The st_info bytes of the import symbols: moltstamp makes them weak. */
  uint64_t info_off[16];
  size_t ninfo = 0;
  molt__dynrels dr;
  fd = open(copy, O_RDONLY);
  CHECK_RC(molt__elf_read_dynrels(fd, &dr, err, sizeof err), 0, err);
  close(fd);
  for (size_t i = 1; i < dr.nsyms && ninfo < 16; i++)
    if (!dr.syms[i].defined &&
        strncmp(dr.syms[i].name, MOLT__IMPORT_PREFIX, strlen(MOLT__IMPORT_PREFIX)) == 0)
      info_off[ninfo++] = dr.syms[i].file_off + offsetof(Elf64_Sym, st_info);
  molt__elf_free_dynrels(&dr);
  CHECK(ninfo == 2, "the fixture has %zu import symbols, want 2", ninfo);

  char *stamp_argv[] = {moltstamp, copy, target_path, NULL};
  int st = run(stamp_argv, out, sizeof out, errout, sizeof errout);
  CHECK(st == 0, "moltstamp exited %d: %s", st, errout);
  CHECK(out[0] == '\0' && errout[0] == '\0', "moltstamp printed: %s%s", out, errout);

  molt__patch_note note;
  fd = open(copy, O_RDONLY);
  int rc = molt__elf_read_patch_note(fd, &note, err, sizeof err);
  close(fd);
  CHECK_RC(rc, 0, err);
  CHECK(strcmp(note.target_build_id, target_hex) == 0, "stamped %s, want %s",
        note.target_build_id, target_hex);

  /* Only the target_build_id field, the import symbols' binding (now
   * weak) and the digest changed; the digest is the file's SHA-256 with
   * its own bytes as zeros, and the file passes the runtime's check. */
  bytes now = read_file(copy);
  uint64_t f0 = note_desc_off(orig) + offsetof(molt__patch_note, target_build_id);
  uint64_t f1 = f0 + sizeof note.target_build_id;
  uint64_t d0 = 0;
  unsigned char stored[32], computed[32];
  fd = open(copy, O_RDONLY);
  CHECK_RC(molt__elf_patch_digest(fd, &d0, stored, computed, err, sizeof err), 0, err);
  CHECK(memcmp(stored, computed, 32) == 0, "the stamped digest does not match");
  CHECK_RC(molt__elf_check_digest(fd, err, sizeof err), 0, err);
  close(fd);
  size_t diffs = 0;
  for (size_t i = 0; i < now.n && i < orig.n; i++) {
    bool info = false;
    for (size_t k = 0; k < ninfo; k++)
      info |= i == info_off[k];
    if (info)
      CHECK(ELF64_ST_BIND(now.p[i]) == STB_WEAK, "import symbol at %zu is not weak", i);
    else if (now.p[i] != orig.p[i] && (i < f0 || i >= f1) && (i < d0 || i >= d0 + 32))
      diffs++;
  }
  /* The digest against a SHA-256 of our own (this one reads the file
   * whole): the same bytes. */
  molt__sha256 sha;
  molt__sha256_init(&sha);
  unsigned char zero[32] = {0};
  molt__sha256_add(&sha, now.p, (size_t)d0);
  molt__sha256_add(&sha, zero, 32);
  molt__sha256_add(&sha, now.p + d0 + 32, now.n - (size_t)d0 - 32);
  unsigned char whole[32];
  molt__sha256_final(&sha, whole);
  CHECK(memcmp(whole, stored, 32) == 0, "digest differs from the SHA-256 of the file");
  /* One damaged byte anywhere is refused as damage. */
  now.p[now.n / 2] ^= 0x40;
  char damaged[4200];
  snprintf(damaged, sizeof damaged, "%s.damaged", copy);
  int dfd = open(damaged, O_RDWR | O_CREAT | O_TRUNC, 0600);
  CHECK(dfd >= 0 && write(dfd, now.p, now.n) == (ssize_t)now.n, "write %s", damaged);
  CHECK_RC(molt__elf_check_digest(dfd, err, sizeof err), MOLT_ECORRUPT, err);
  CHECK(strstr(err, "damaged") != NULL, "message: %s", err);
  close(dfd);
  unlink(damaged);
  now.p[now.n / 2] ^= 0x40;
  CHECK(now.n == orig.n && diffs == 0, "%zu bytes changed outside the field", diffs);
  free(now.p);

  /* --print shows both ids. */
  char *print_argv[] = {moltstamp, "--print", copy, NULL};
  st = run(print_argv, out, sizeof out, errout, sizeof errout);
  char want[512];
  snprintf(want, sizeof want, "build-id %s\ntarget-build-id %s\n", patch_hex, target_hex);
  CHECK(st == 0 && strcmp(out, want) == 0, "--print exited %d: %s", st, out);
  char *print_target[] = {moltstamp, "--print", target_path, NULL};
  st = run(print_target, out, sizeof out, errout, sizeof errout);
  snprintf(want, sizeof want, "build-id %s\n", target_hex);
  CHECK(st == 0 && strcmp(out, want) == 0, "--print target exited %d: %s", st, out);
  char *print_orig[] = {moltstamp, "--print", (char *)patch_path, NULL};
  st = run(print_orig, out, sizeof out, errout, sizeof errout);
  CHECK(st == 0 && strstr(out, "target-build-id (unstamped)\n"), "--print unstamped: %s",
        out);

  /* Restamping overwrites the whole field. */
  char *restamp[] = {moltstamp, copy, copy, NULL};
  st = run(restamp, out, sizeof out, errout, sizeof errout);
  CHECK(st == 0, "restamp exited %d: %s", st, errout);
  fd = open(copy, O_RDONLY);
  rc = molt__elf_read_patch_note(fd, &note, err, sizeof err);
  close(fd);
  CHECK(rc == 0 && strcmp(note.target_build_id, patch_hex) == 0, "restamped: %s",
        note.target_build_id);

  /* Errors: exit 1 with one line on stderr; usage: exit 2. */
  char text[] = "/tmp/molt-elf-text-XXXXXX";
  int tfd = mkstemp(text);
  if (tfd < 0 || write(tfd, "hello\n", 6) != 6)
    abort();
  close(tfd);
  char *const bad[][4] = {
      {moltstamp, copy, text, NULL},        /* target not ELF */
      {moltstamp, text, target_path, NULL}, /* patch not ELF */
      {moltstamp, target_path, copy, NULL}, /* patch is a program */
      {moltstamp, copy, "/nonexistent", NULL}, {moltstamp, "--print", text, NULL},
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    st = run(bad[i], out, sizeof out, errout, sizeof errout);
    size_t len = strlen(errout);
    CHECK(st == 1, "case %zu exited %d", i, st);
    CHECK(strncmp(errout, "moltstamp: ", 11) == 0 && len > 0 && errout[len - 1] == '\n' &&
              strchr(errout, '\n') == errout + len - 1,
          "case %zu: stderr %s", i, errout);
  }
  char *const usage[][5] = {
      {moltstamp, NULL},
      {moltstamp, copy, NULL},
      {moltstamp, copy, target_path, copy, NULL},
      {moltstamp, "--bogus", copy, NULL},
  };
  for (size_t i = 0; i < sizeof usage / sizeof usage[0]; i++) {
    st = run(usage[i], out, sizeof out, errout, sizeof errout);
    CHECK(st == 2 && strstr(errout, "usage:"), "usage case %zu exited %d", i, st);
  }
  unlink(text);
  unlink(copy);
  free(orig.p);
}

/* ---- SHA-256 (src/common/sha256.c) ------------------------------------------ */

static void sha_hex(molt__sha256 *s, char out[65]) { molt__sha256_hex(s, out); }

/* The digest of data[0..len) added in two pieces, split at `split`. */
static void sha_two(const unsigned char *data, size_t len, size_t split,
                    unsigned char d[32]) {
  molt__sha256 s;
  molt__sha256_init(&s);
  molt__sha256_add(&s, data, split);
  molt__sha256_add(&s, data + split, len - split);
  molt__sha256_final(&s, d);
}

/* FIPS 180-2's examples on both paths (the SHA extensions where the CPU
 * has them, the portable code), then both paths on pseudo-random data of
 * every length to a few blocks, cut in two at many places: the fast path
 * takes whole blocks straight from the caller's data and the buffer for
 * the rest, so lengths and splits around 64 are where it could differ. */
static void test_sha256(void) {
  static const char *const vec[][2] = {
      {"", "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"},
      {"abc", "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"},
      {"abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq",
       "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1"}};
  bool has_ext = false;
  for (int portable = 1; portable >= 0; portable--) {
    has_ext = molt__sha256_portable_only(portable);
    const char *path = portable ? "portable" : has_ext ? "SHA extensions" : "default";
    for (size_t i = 0; i < sizeof vec / sizeof vec[0]; i++) {
      molt__sha256 s;
      char hex[65];
      molt__sha256_init(&s);
      molt__sha256_add(&s, vec[i][0], strlen(vec[i][0]));
      sha_hex(&s, hex);
      CHECK(strcmp(hex, vec[i][1]) == 0, "%s: sha256(\"%s\") = %s", path, vec[i][0], hex);
    }
    /* A million 'a', 1000 at a time (not a multiple of 64). */
    char a[1000];
    memset(a, 'a', sizeof a);
    molt__sha256 s;
    char hex[65];
    molt__sha256_init(&s);
    for (int i = 0; i < 1000; i++)
      molt__sha256_add(&s, a, sizeof a);
    sha_hex(&s, hex);
    CHECK(strcmp(hex,
                 "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0") == 0,
          "%s: sha256 of a million 'a' = %s", path, hex);
  }
  enum { MAXLEN = 4 * 64 + 70 };
  static unsigned char data[MAXLEN + 8192];
  uint64_t x = 0x9e3779b97f4a7c15u;
  for (size_t i = 0; i < sizeof data; i++) {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    data[i] = (unsigned char)x;
  }
  size_t compared = 0, differ = 0;
  for (size_t len = 0; len <= MAXLEN; len++)
    for (size_t split = 0; split <= len; split += split < 3 || len - split < 3 ? 1 : 13) {
      unsigned char p[32], f[32];
      molt__sha256_portable_only(true);
      sha_two(data, len, split, p);
      molt__sha256_portable_only(false);
      sha_two(data, len, split, f);
      compared++;
      if (memcmp(p, f, 32) != 0 && differ++ == 0)
        CHECK(0, "the two SHA-256 paths differ on %zu bytes split at %zu", len, split);
    }
  /* Many blocks in one call, at an odd address. */
  unsigned char p[32], f[32];
  molt__sha256_portable_only(true);
  sha_two(data + 3, sizeof data - 3, 0, p);
  molt__sha256_portable_only(false);
  sha_two(data + 3, sizeof data - 3, 0, f);
  CHECK(memcmp(p, f, 32) == 0, "the two SHA-256 paths differ on %zu bytes",
        sizeof data - 3);
  printf("sha256: %zu inputs on both paths (%s), %zu differ\n", compared,
         has_ext ? "the CPU has the SHA extensions" : "no SHA extensions: both portable",
         differ);
}

int main(int argc, char **argv) {
  if (argc == 4 && strcmp(argv[1], "unit") == 0) {
    test_loaded_build_id();
    test_patch_note(argv[2], argv[3]);
    test_symtab_self();
    test_symtab_patch(argv[2]);
    test_symtab_synthetic();
    test_sha256();
  } else if (argc == 3 && strcmp(argv[1], "corrupt") == 0) {
    test_corrupt(argv[2]);
  } else if (argc == 5 && strcmp(argv[1], "stamp") == 0) {
    test_stamp(argv[2], argv[3], argv[4]);
  } else {
    fprintf(stderr, "usage: test_elf unit PATCH.so TARGET\n"
                    "       test_elf corrupt PATCH.so\n"
                    "       test_elf stamp MOLTSTAMP PATCH.so TARGET\n");
    return 2;
  }
  if (failures) {
    fprintf(stderr, "%d check(s) failed\n", failures);
    return 1;
  }
  printf("ok\n");
  return 0;
}
