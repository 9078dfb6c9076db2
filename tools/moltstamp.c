/*
 * moltstamp — writes a program's build-id into a patch's molt note.
 *
 *   moltstamp PATCH.so TARGET   stamp PATCH.so as a patch for TARGET
 *   moltstamp --print FILE      print FILE's build-id (and its stamped target
 *                               if FILE is a patch)
 *
 * The runtime refuses a patch whose stamp is not the build-id of a module of
 * the running program, so the stamp must be written after the patch is
 * linked, from the very file the program runs.  Stamping also marks the
 * patch's import symbols (the `symbol` of its molt_imports records) weak in
 * .dynsym, so that dlopen(RTLD_NOW) accepts them unresolved: the runtime
 * binds them to the program's objects (molt/abi.h, molt__import).  The
 * writes are in place and touch only the note's target_build_id field and
 * the binding of those symbols: the patch's own build-id and everything
 * else stay as the linker made them.  Stamping twice is harmless.
 */
#include "common/common.h"

#include <elf.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static void usage(FILE *out) {
  fputs("usage: moltstamp PATCH.so TARGET\n"
        "       moltstamp --print FILE\n",
        out);
}

static int fail(const char *file, const char *msg) {
  fprintf(stderr, "moltstamp: %s: %s\n", file, msg);
  return 1;
}

static int open_file(const char *path, int flags) {
  int fd = open(path, flags | O_CLOEXEC);
  if (fd < 0)
    fprintf(stderr, "moltstamp: %s: %s\n", path, strerror(errno));
  return fd;
}

static int print_ids(const char *path) {
  int fd = open_file(path, O_RDONLY);
  if (fd < 0)
    return 1;
  char hex[MOLT__BUILD_ID_HEX_MAX + 1], err[256];
  int rc = molt__elf_file_build_id(fd, hex, sizeof hex, err, sizeof err);
  if (rc == MOLT_ENOSYM) {
    printf("build-id (none)\n");
  } else if (rc) {
    close(fd);
    return fail(path, err);
  } else {
    printf("build-id %s\n", hex);
  }
  molt__patch_note note;
  rc = molt__elf_patch_note_offset(fd, NULL, &note, err, sizeof err);
  close(fd);
  if (rc == MOLT_ENOTPATCH)
    return 0;
  if (rc)
    return fail(path, err);
  const char *id = note.target_build_id;
  if (!memchr(id, '\0', sizeof note.target_build_id))
    return fail(path, "the target build-id in the molt note is not "
                      "NUL-terminated");
  printf("target-build-id %s\n", id[0] ? id : "(unstamped)");
  return 0;
}

static int write_all(int fd, const void *p, size_t n, off_t off) {
  const char *c = p;
  while (n > 0) {
    ssize_t w = pwrite(fd, c, n, off);
    if (w < 0) {
      if (errno == EINTR)
        continue;
      return -1;
    }
    c += w;
    n -= (size_t)w;
    off += w;
  }
  return 0;
}

static int by_name(const void *a, const void *b) {
  return strcmp(*(char *const *)a, *(char *const *)b);
}

/* Marks every undefined symbol of pfd's dynamic relocations that an import
 * record names weak.  All symbols are checked before the first write, so a
 * refused patch is left as it was.  0, or 1 after a message. */
static int weaken_imports(const char *patch, int pfd) {
  char err[256];
  molt__dynrels dr;
  int rc = molt__elf_read_dynrels(pfd, &dr, err, sizeof err);
  if (rc)
    return fail(patch, err);
  char **names = NULL;
  size_t n = 0;
  rc = molt__elf_import_symbols(pfd, &dr, &names, &n, err, sizeof err);
  if (rc) {
    molt__elf_free_dynrels(&dr);
    return fail(patch, err);
  }
  if (n) /* (qsort of NULL, 0 is undefined) */
    qsort(names, n, sizeof *names, by_name);
  int status = 0;
  /* Only symbols that a relocation names: a patch's new version of an
   * extern f also has the defined dynamic symbol f@MOLT_PATCH (a hidden
   * version, for dladdr), which no reference binds to and which may share
   * its name with the import f of the program's entry. */
  bool *named = calloc(dr.nsyms ? dr.nsyms : 1, sizeof *named);
  if (!named) {
    status = fail(patch, "out of memory");
    dr.nsyms = 0;
  }
  for (size_t r = 0; named && r < dr.nrels; r++)
    if (dr.rels[r].sym < dr.nsyms)
      named[dr.rels[r].sym] = true;
  /* Pass 0 checks, pass 1 writes.  Each symbol is looked at once however
   * many relocations name it (dr.syms holds every symbol up to the highest
   * one a relocation names). */
  for (int pass = 0; pass < 2 && status == 0; pass++)
    for (size_t i = 1; i < dr.nsyms && status == 0; i++) {
      const molt__dynsym *s = &dr.syms[i];
      const char *key = s->name;
      if (!named[i] || !n || !bsearch(&key, names, n, sizeof *names, by_name))
        continue;
      if (pass == 0 && s->defined) {
        snprintf(err, sizeof err, "import symbol %s is defined in the patch itself",
                 s->name);
        status = fail(patch, err);
      } else if (pass == 1 && s->bind != STB_WEAK) {
        unsigned char info = (unsigned char)ELF64_ST_INFO(STB_WEAK, s->type);
        if (write_all(pfd, &info, 1,
                      (off_t)(s->file_off + offsetof(Elf64_Sym, st_info))) != 0)
          status = fail(patch, strerror(errno));
      }
    }
  free(named);
  for (size_t i = 0; i < n; i++)
    free(names[i]);
  free(names);
  molt__elf_free_dynrels(&dr);
  return status;
}

static int stamp(const char *patch, const char *target) {
  char hex[MOLT__BUILD_ID_HEX_MAX + 1], err[256];
  int tfd = open_file(target, O_RDONLY);
  if (tfd < 0)
    return 1;
  int rc = molt__elf_file_build_id(tfd, hex, sizeof hex, err, sizeof err);
  close(tfd);
  if (rc)
    return fail(target, err);

  int pfd = open_file(patch, O_RDWR);
  if (pfd < 0)
    return 1;
  uint64_t desc_off;
  rc = molt__elf_patch_note_offset(pfd, &desc_off, NULL, err, sizeof err);
  /* A callback declared twice or outside the code is refused here, where a
   * hand-written patch is made, as the runtime would refuse it. */
  molt__patch_callbacks cbs;
  if (rc == 0)
    rc = molt__elf_read_callbacks(pfd, &cbs, err, sizeof err);
  if (rc) {
    close(pfd);
    return fail(patch, err);
  }
  if (weaken_imports(patch, pfd) != 0) {
    close(pfd);
    return 1;
  }
  /* The whole field is rewritten so that a longer earlier stamp leaves no
   * trailing digits. */
  char field[sizeof(((molt__patch_note *)0)->target_build_id)];
  memset(field, 0, sizeof field);
  memcpy(field, hex, strlen(hex));
  off_t at = (off_t)(desc_off + offsetof(molt__patch_note, target_build_id));
  if (write_all(pfd, field, sizeof field, at) != 0) {
    int e = errno;
    close(pfd);
    return fail(patch, strerror(e));
  }
  /* Sealed last, over everything written above (issue 16): the runtime
   * refuses a file whose contents no longer match. */
  uint64_t digest_off;
  unsigned char digest[MOLT__DIGEST_SIZE];
  rc = molt__elf_patch_digest(pfd, &digest_off, NULL, digest, err, sizeof err);
  if (rc == 0 && write_all(pfd, digest, sizeof digest, (off_t)digest_off) != 0) {
    rc = MOLT_EIO;
    snprintf(err, sizeof err, "%s", strerror(errno));
  }
  if (rc) {
    close(pfd);
    return fail(patch, err);
  }
  molt__patch_note note;
  rc = molt__elf_read_patch_note(pfd, &note, err, sizeof err);
  if (rc == 0 && strcmp(note.target_build_id, hex) != 0) {
    rc = MOLT_EINTERNAL;
    snprintf(err, sizeof err, "the stamp did not read back");
  }
  if (rc == 0)
    rc = molt__elf_check_digest(pfd, err, sizeof err);
  if (close(pfd) != 0 && rc == 0) {
    rc = MOLT_EIO;
    snprintf(err, sizeof err, "%s", strerror(errno));
  }
  if (rc)
    return fail(patch, err);
  return 0;
}

int main(int argc, char **argv) {
  if (argc == 2 && (strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0)) {
    usage(stdout);
    return 0;
  }
  if (argc == 3 && strcmp(argv[1], "--print") == 0)
    return print_ids(argv[2]);
  if (argc == 3 && argv[1][0] != '-' && argv[2][0] != '-')
    return stamp(argv[1], argv[2]);
  usage(stderr);
  return 2;
}
