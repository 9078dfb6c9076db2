/*
 * Fuzzing of the ELF reader: every input goes through each reader of elf.c,
 * which must return a documented code (and consistent results) and never
 * crash or read out of bounds.
 *
 * With libFuzzer:
 *   clang -fsanitize=fuzzer,address,undefined -DMOLT_LIBFUZZER -D_GNU_SOURCE \
 *     -DMOLT__NO_AUTO_REGISTER -Iinclude -Isrc/runtime tests/elf/fuzz_elf.c \
 *     src/runtime/elf.c src/runtime/buf.c src/runtime/errors.c -o fuzz_elf
 *   ./fuzz_elf CORPUS_DIR        (seed it with a patch .so and a program)
 *
 * Without (any compiler, as CI runs it):
 *   fuzz_elf [-n ITERATIONS] [-s SEED] FILE...
 * applies deterministic random mutations, biased towards the header, note
 * and dynamic fields of the seed files, and feeds each result to the same
 * entry point.
 */
#include "common/common.h"

#include <elf.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

static unsigned long counts[2][64]; /* [reader][-code] */

static void fail(const char *what, int rc, const char *err) {
  fprintf(stderr, "fuzz_elf: %s: %s (%d): %s\n", what, molt_err_name(rc), rc,
          err ? err : "");
  abort();
}

/* err must be a terminated one-line message exactly when rc != 0. */
static void check_err(const char *what, int rc, const char *err, size_t len) {
  if (!memchr(err, '\0', len))
    fail(what, rc, "unterminated message");
  if (rc != 0 && (err[0] == '\0' || strchr(err, '\n')))
    fail(what, rc, err);
}

static void count(int reader, int rc) {
  if (rc <= 0 && rc > -64)
    counts[reader][-rc]++;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  int fd = memfd_create("molt-fuzz", MFD_CLOEXEC);
  if (fd < 0)
    return 0;
  for (size_t done = 0; done < size;) {
    ssize_t n = write(fd, data + done, size - done);
    if (n <= 0) {
      close(fd);
      return 0;
    }
    done += (size_t)n;
  }

  char err[256];
  molt__patch_note note;
  memset(err, 'x', sizeof err);
  err[sizeof err - 1] = '\0';
  int rc = molt__elf_read_patch_note(fd, &note, err, sizeof err);
  check_err("read_patch_note", rc, err, sizeof err);
  count(0, rc);
  switch (rc) {
  case 0:
    if (note.abi != MOLT__ABI ||
        !memchr(note.target_build_id, '\0', sizeof note.target_build_id) ||
        note.target_build_id[0] == '\0' || strlen(note.target_build_id) % 2 != 0)
      fail("read_patch_note accepted a bad note", rc, note.target_build_id);
    break;
  case MOLT_ENOTPATCH:
  case MOLT_ECORRUPT:
  case MOLT_EABI:
  case MOLT_ENOMEM:
    break;
  default:
    fail("read_patch_note", rc, err);
  }

  uint64_t off = 0;
  int rc2 = molt__elf_patch_note_offset(fd, &off, &note, err, sizeof err);
  check_err("patch_note_offset", rc2, err, sizeof err);
  if (rc2 == 0 && (off > size || size - off < sizeof note ||
                   memcmp(data + off, &note, sizeof note) != 0))
    fail("patch_note_offset: offset does not hold the note", rc2, NULL);
  if (rc == 0 && rc2 != 0)
    fail("patch_note_offset rejects what read_patch_note accepts", rc2, err);

  /* The loader check (issue 16): every table ld.so trusts, both ways it is
   * called (hot patch: no code at load; image).  Never a crash, a one-line
   * error; what it accepts, the note reader accepts too (a subset). */
  for (int patch = 0; patch < 2; patch++) {
    int rc3 = molt__elf_check_load(fd, patch, NULL, NULL, err, sizeof err);
    check_err("check_load", rc3, err, sizeof err);
    if (rc3 != 0 && rc3 != MOLT_ENOTPATCH && rc3 != MOLT_ENOTPROGRAM &&
        rc3 != MOLT_ECORRUPT && rc3 != MOLT_ENOMEM)
      fail("check_load", rc3, err);
  }

  char hex[MOLT__BUILD_ID_HEX_MAX + 1];
  rc = molt__elf_file_build_id(fd, hex, sizeof hex, err, sizeof err);
  check_err("file_build_id", rc, err, sizeof err);
  count(1, rc);
  if (rc == 0 && (hex[0] == '\0' || strlen(hex) % 2 != 0 ||
                  strspn(hex, "0123456789abcdef") != strlen(hex)))
    fail("file_build_id: bad hex", rc, hex);
  if (rc != 0 && rc != MOLT_ENOSYM && rc != MOLT_ECORRUPT && rc != MOLT_ENOTSUP &&
      rc != MOLT_ENOMEM)
    fail("file_build_id", rc, err);

  char path[64];
  snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
  molt__symtab *st = NULL;
  rc = molt__symtab_open(path, &st);
  if (rc == 0) {
    static const char *const names[][2] = {
        {"molt_patch_header", NULL},
        {"elf_fx_global_fn__molt_p", "patch.c"},
        {"main", NULL},
        {"elf_target_value", NULL},
        {"completed.0", "crtstuff.c"},
        {"", NULL},
        {"_DYNAMIC", NULL},
        {"x", "/"},
    };
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
      uintptr_t v;
      int lr = molt__symtab_lookup(st, names[i][0], names[i][1], &v);
      if (lr != 0 && lr != MOLT_ENOSYM && lr != MOLT_EAMBIGUOUS)
        fail("symtab_lookup", lr, names[i][0]);
    }
    molt__symtab_close(st);
  } else if (rc != MOLT_ECORRUPT && rc != MOLT_ENOTSUP && rc != MOLT_ENOMEM) {
    fail("symtab_open", rc, NULL);
  }
  close(fd);
  return 0;
}

#ifndef MOLT_LIBFUZZER

static uint64_t rng_state;

static uint64_t rnd(void) {
  /* xorshift64*: deterministic across runs and compilers. */
  rng_state ^= rng_state >> 12;
  rng_state ^= rng_state << 25;
  rng_state ^= rng_state >> 27;
  return rng_state * 0x2545f4914f6cdd1dull;
}

typedef struct field {
  uint64_t off;
  unsigned width;
} field;

typedef struct seed {
  unsigned char *p;
  size_t n;
  field *fields;
  size_t nfields, cap;
} seed;

static void add_field(seed *s, uint64_t off, unsigned width) {
  if (off > s->n || s->n - off < width)
    return;
  if (s->nfields == s->cap) {
    s->cap = s->cap ? 2 * s->cap : 256;
    s->fields = realloc(s->fields, s->cap * sizeof *s->fields);
    if (!s->fields)
      abort();
  }
  s->fields[s->nfields++] = (field){off, width};
}

static bool in_seed(const seed *s, uint64_t off, uint64_t len) {
  return off <= s->n && len <= s->n - off;
}

/* The structural fields of a (trusted, but still bounds-checked) seed:
 * where a mutation is most likely to reach a corner of the parser. */
static void find_fields(seed *s) {
  if (s->n < sizeof(Elf64_Ehdr))
    return;
  Elf64_Ehdr eh;
  memcpy(&eh, s->p, sizeof eh);
  static const struct {
    size_t off;
    unsigned width;
  } ef[] = {
      {EI_CLASS, 1},
      {EI_DATA, 1},
      {EI_VERSION, 1},
      {offsetof(Elf64_Ehdr, e_type), 2},
      {offsetof(Elf64_Ehdr, e_machine), 2},
      {offsetof(Elf64_Ehdr, e_version), 4},
      {offsetof(Elf64_Ehdr, e_phoff), 8},
      {offsetof(Elf64_Ehdr, e_shoff), 8},
      {offsetof(Elf64_Ehdr, e_ehsize), 2},
      {offsetof(Elf64_Ehdr, e_phentsize), 2},
      {offsetof(Elf64_Ehdr, e_phnum), 2},
      {offsetof(Elf64_Ehdr, e_shentsize), 2},
      {offsetof(Elf64_Ehdr, e_shnum), 2},
      {offsetof(Elf64_Ehdr, e_shstrndx), 2},
  };
  for (size_t i = 0; i < sizeof ef / sizeof ef[0]; i++)
    add_field(s, ef[i].off, ef[i].width);

  if (in_seed(s, eh.e_phoff, (uint64_t)eh.e_phnum * sizeof(Elf64_Phdr))) {
    for (size_t i = 0; i < eh.e_phnum; i++) {
      uint64_t o = eh.e_phoff + i * sizeof(Elf64_Phdr);
      Elf64_Phdr ph;
      memcpy(&ph, s->p + o, sizeof ph);
      add_field(s, o + offsetof(Elf64_Phdr, p_type), 4);
      add_field(s, o + offsetof(Elf64_Phdr, p_offset), 8);
      add_field(s, o + offsetof(Elf64_Phdr, p_vaddr), 8);
      add_field(s, o + offsetof(Elf64_Phdr, p_filesz), 8);
      add_field(s, o + offsetof(Elf64_Phdr, p_memsz), 8);
      add_field(s, o + offsetof(Elf64_Phdr, p_align), 8);
      if (ph.p_type == PT_DYNAMIC && in_seed(s, ph.p_offset, ph.p_filesz)) {
        for (uint64_t d = 0; d + sizeof(Elf64_Dyn) <= ph.p_filesz;
             d += sizeof(Elf64_Dyn)) {
          add_field(s, ph.p_offset + d, 8);
          add_field(s, ph.p_offset + d + 8, 8);
        }
      }
    }
  }
  if (in_seed(s, eh.e_shoff, (uint64_t)eh.e_shnum * sizeof(Elf64_Shdr))) {
    for (size_t i = 0; i < eh.e_shnum; i++) {
      uint64_t o = eh.e_shoff + i * sizeof(Elf64_Shdr);
      Elf64_Shdr sh;
      memcpy(&sh, s->p + o, sizeof sh);
      add_field(s, o + offsetof(Elf64_Shdr, sh_name), 4);
      add_field(s, o + offsetof(Elf64_Shdr, sh_type), 4);
      add_field(s, o + offsetof(Elf64_Shdr, sh_offset), 8);
      add_field(s, o + offsetof(Elf64_Shdr, sh_size), 8);
      add_field(s, o + offsetof(Elf64_Shdr, sh_link), 4);
      add_field(s, o + offsetof(Elf64_Shdr, sh_addralign), 8);
      add_field(s, o + offsetof(Elf64_Shdr, sh_entsize), 8);
      if (sh.sh_type == SHT_NOTE && in_seed(s, sh.sh_offset, sh.sh_size)) {
        /* note headers: namesz, descsz, type, and the descriptor start */
        uint64_t pos = 0;
        while (pos + 12 <= sh.sh_size) {
          uint32_t h[3];
          memcpy(h, s->p + sh.sh_offset + pos, sizeof h);
          for (int k = 0; k < 3; k++)
            add_field(s, sh.sh_offset + pos + 4 * k, 4);
          uint64_t desc = pos + 12 + ((h[0] + 3ull) & ~3ull);
          add_field(s, sh.sh_offset + desc, 4);
          add_field(s, sh.sh_offset + desc + 8, 1);
          pos = desc + ((h[1] + 3ull) & ~3ull);
        }
      }
      if ((sh.sh_type == SHT_SYMTAB || sh.sh_type == SHT_DYNSYM) &&
          in_seed(s, sh.sh_offset, sh.sh_size)) {
        /* a sample of symbols: name, info, shndx, value */
        for (uint64_t k = 0; k < 16 && (k + 1) * sizeof(Elf64_Sym) <= sh.sh_size; k++) {
          uint64_t y = sh.sh_offset +
                       (rnd() % (sh.sh_size / sizeof(Elf64_Sym))) * sizeof(Elf64_Sym);
          add_field(s, y + offsetof(Elf64_Sym, st_name), 4);
          add_field(s, y + offsetof(Elf64_Sym, st_info), 1);
          add_field(s, y + offsetof(Elf64_Sym, st_shndx), 2);
        }
      }
    }
  }
}

/* Stamps a patch seed so that unmutated it is accepted: then mutations
 * explore the paths past the stamp check too. */
static void stamp_seed(seed *s) {
  int fd = memfd_create("molt-fuzz-seed", MFD_CLOEXEC);
  if (fd < 0 || write(fd, s->p, s->n) != (ssize_t)s->n)
    abort();
  uint64_t off;
  if (molt__elf_patch_note_offset(fd, &off, NULL, NULL, 0) == 0) {
    static const char id[] = "00112233445566778899aabbccddeeff00112233";
    memcpy(s->p + off + offsetof(molt__patch_note, target_build_id), id, sizeof id);
  }
  close(fd);
}

static void put(unsigned char *p, unsigned width, uint64_t v) {
  memcpy(p, &v, width); /* little-endian host: low bytes first */
}

static void mutate(const seed *s, unsigned char *buf, size_t *n) {
  uint64_t interesting[] = {0,
                            1,
                            0x7f,
                            0x80,
                            0xff,
                            0x7fff,
                            0xffff,
                            0x7fffffff,
                            0x80000000,
                            0xffffffff,
                            (uint64_t)1 << 63,
                            ~(uint64_t)0,
                            ~(uint64_t)0 - 7,
                            s->n,
                            s->n - 1,
                            s->n + 1,
                            s->n / 2,
                            4096};
  unsigned rounds = 1 + (unsigned)(rnd() % 4);
  for (unsigned r = 0; r<rounds && * n> 0; r++) {
    unsigned kind = (unsigned)(rnd() % 10);
    const field *f = s->nfields ? &s->fields[rnd() % s->nfields] : NULL;
    if (f && f->off + f->width > *n)
      f = NULL;
    switch (kind) {
    case 0: /* bit flip anywhere */
      buf[rnd() % *n] ^= (unsigned char)(1u << (rnd() % 8));
      break;
    case 1: /* random byte anywhere */
      buf[rnd() % *n] = (unsigned char)rnd();
      break;
    case 2:
    case 3: /* interesting value in a field */
      if (f)
        put(buf + f->off, f->width,
            interesting[rnd() % (sizeof interesting / sizeof interesting[0])]);
      break;
    case 4: /* random value in a field */
      if (f)
        put(buf + f->off, f->width, rnd());
      break;
    case 5:
    case 6: /* small delta in a field */
      if (f) {
        uint64_t v = 0;
        memcpy(&v, buf + f->off, f->width);
        v += (uint64_t)((int64_t)(rnd() % 33) - 16);
        put(buf + f->off, f->width, v);
      }
      break;
    case 7: /* copy one field's value into another */
      if (f && s->nfields) {
        const field *g = &s->fields[rnd() % s->nfields];
        if (g->off + g->width <= *n) {
          uint64_t v = 0;
          memcpy(&v, buf + g->off, g->width);
          put(buf + f->off, f->width, v);
        }
      }
      break;
    case 8: /* truncate */
      if (rnd() % 4 == 0)
        *n = (size_t)(rnd() % *n);
      break;
    default: /* random bytes in the first 4 KiB */
      buf[rnd() % (*n < 4096 ? *n : 4096)] = (unsigned char)rnd();
      break;
    }
  }
}

static int usage(void) {
  fprintf(stderr, "usage: fuzz_elf [-n ITERATIONS] [-s SEED] FILE...\n");
  return 2;
}

int main(int argc, char **argv) {
  unsigned long iterations = 1000;
  rng_state = 0x6d6f6c74656c6621ull;
  int i = 1;
  for (; i < argc && argv[i][0] == '-'; i++) {
    if (strcmp(argv[i], "-n") == 0 && i + 1 < argc)
      iterations = strtoul(argv[++i], NULL, 0);
    else if (strcmp(argv[i], "-s") == 0 && i + 1 < argc)
      rng_state = strtoull(argv[++i], NULL, 0) | 1;
    else
      return usage();
  }
  if (i == argc)
    return usage();

  size_t nseeds = (size_t)(argc - i);
  seed *seeds = calloc(nseeds, sizeof *seeds);
  size_t maxn = 0;
  for (size_t k = 0; k < nseeds; k++) {
    const char *path = argv[i + (int)k];
    int fd = open(path, O_RDONLY);
    struct stat st;
    if (fd < 0 || fstat(fd, &st) != 0) {
      perror(path);
      return 2;
    }
    seeds[k].n = (size_t)st.st_size;
    seeds[k].p = malloc(seeds[k].n + 1);
    if (!seeds[k].p || read(fd, seeds[k].p, seeds[k].n) != (ssize_t)seeds[k].n) {
      perror(path);
      return 2;
    }
    close(fd);
    stamp_seed(&seeds[k]);
    find_fields(&seeds[k]);
    if (seeds[k].n > maxn)
      maxn = seeds[k].n;
    /* The unmutated seed goes through too. */
    LLVMFuzzerTestOneInput(seeds[k].p, seeds[k].n);
  }

  unsigned char *buf = malloc(maxn + 1);
  for (unsigned long it = 0; it < iterations; it++) {
    const seed *s = &seeds[it % nseeds];
    memcpy(buf, s->p, s->n);
    size_t n = s->n;
    mutate(s, buf, &n);
    LLVMFuzzerTestOneInput(buf, n);
  }

  printf("fuzz_elf: %lu iterations over %zu seed(s)\n", iterations, nseeds);
  static const char *const reader[2] = {"read_patch_note", "file_build_id"};
  for (int r = 0; r < 2; r++) {
    printf("  %s:", reader[r]);
    for (int c = 0; c < 64; c++)
      if (counts[r][c])
        printf(" %s=%lu", molt_err_name(-c), counts[r][c]);
    printf("\n");
  }
  for (size_t k = 0; k < nseeds; k++) {
    free(seeds[k].p);
    free(seeds[k].fields);
  }
  free(seeds);
  free(buf);
  return 0;
}

#endif /* MOLT_LIBFUZZER */
