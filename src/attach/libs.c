/* The libraries of the target in the dynamic loader's order, and the file
 * each one was loaded from.
 *
 * The order is the loader's link map (r_debug, found through the
 * program's DT_DEBUG entry, which ld.so fills in for debuggers): the
 * program, preloaded libraries, then the DT_NEEDED ones breadth first --
 * the order in which the loader binds a name.  The order of the mappings
 * is not it: the loader maps each library below the last one, so an
 * interposed malloc (LD_PRELOAD, jemalloc) comes after libc there.
 *
 * The files are opened through /proc/PID/map_files/START-END, which is
 * the very file mapped in the target even when it was replaced or
 * deleted since, or lives in another mount namespace (a container); a
 * caller without the right to open those (it needs CAP_SYS_ADMIN) goes
 * through /proc/PID/root, the target's own view of the file system.
 * Neither opens a path in molt's own namespace. */
#include "attach/internal.h"

#include <elf.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define MAX_LINKS 4096 /* link map entries followed, at most */

/* The address of the program's dynamic section in the target. */
static bool dynamic_of(pid_t pid, uint64_t bias, uint64_t *dyn) {
  char link[64];
  molt__os_path(pid, "exe", link, sizeof link);
  int fd = open(link, O_RDONLY | O_CLOEXEC);
  if (fd < 0)
    return false;
  Elf64_Ehdr eh;
  bool found = false;
  if (pread(fd, &eh, sizeof eh, 0) == (ssize_t)sizeof eh &&
      memcmp(eh.e_ident, ELFMAG, SELFMAG) == 0 && eh.e_phentsize == sizeof(Elf64_Phdr)) {
    for (unsigned i = 0; i < eh.e_phnum && !found; i++) {
      Elf64_Phdr ph;
      if (pread(fd, &ph, sizeof ph, (off_t)(eh.e_phoff + i * sizeof ph)) !=
          (ssize_t)sizeof ph)
        break;
      if (ph.p_type == PT_DYNAMIC) {
        *dyn = bias + ph.p_vaddr;
        found = true;
      }
    }
  }
  close(fd);
  return found;
}

/* r_debug.r_map: the first link map entry (the program's). */
static bool first_link(pid_t pid, uint64_t bias, uint64_t *link) {
  uint64_t dyn;
  if (!dynamic_of(pid, bias, &dyn))
    return false;
  for (int i = 0; i < 512; i++) {
    Elf64_Dyn d;
    if (molt__os_read(pid, dyn + i * sizeof d, &d, sizeof d) != 0 || d.d_tag == DT_NULL)
      return false;
    if (d.d_tag == DT_DEBUG) {
      /* struct r_debug { int r_version; struct link_map *r_map; ... } */
      uint64_t r_map;
      return d.d_un.d_ptr &&
             molt__os_read(pid, d.d_un.d_ptr + 8, &r_map, sizeof r_map) == 0 &&
             (*link = r_map) != 0;
    }
  }
  return false;
}

/* The mapping at file offset 0 of the file that holds addr (a library's
 * dynamic section): where map_files names it. */
static const attach_map *file_start(const attach_map *maps, size_t n, uint64_t addr) {
  const attach_map *hit = NULL;
  for (size_t i = 0; i < n && !hit; i++)
    if (addr >= maps[i].start && addr < maps[i].end && maps[i].path[0] == '/')
      hit = &maps[i];
  if (!hit)
    return NULL;
  const attach_map *best = NULL;
  for (size_t i = 0; i < n; i++)
    if (maps[i].offset == 0 && maps[i].start <= hit->start &&
        strcmp(maps[i].path, hit->path) == 0)
      best = &maps[i]; /* the nearest below */
  return best;
}

/* A path that opens the file of mapping m as the target sees it. */
static bool open_path(pid_t pid, const attach_map *m, char *path, size_t len) {
  /* per process only (there is no task/TID/map_files): a process whose
   * main thread has exited has none, and goes by its root below */
  snprintf(path, len, "/proc/%d/map_files/%llx-%llx", (int)pid,
           (unsigned long long)m->start, (unsigned long long)m->end);
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd >= 0) {
    close(fd);
    return true;
  }
  /* without CAP_SYS_ADMIN: by name, in the target's root (a file deleted
   * or replaced since it was mapped is not the one it runs: none) */
  if (strstr(m->path, " (deleted)"))
    return false;
  char root[64];
  molt__os_path(pid, "root", root, sizeof root);
  snprintf(path, len, "%s%s", root, m->path);
  return true;
}

/* A string of the target, read in small pieces (it may end close to the
 * end of its mapping). */
static void read_string(pid_t pid, uint64_t addr, char *buf, size_t len) {
  size_t got = 0;
  buf[0] = '\0';
  while (got + 1 < len) {
    char piece[64];
    size_t want = sizeof piece < len - 1 - got ? sizeof piece : len - 1 - got;
    if (molt__os_read(pid, addr + got, piece, want) != 0)
      break;
    memcpy(buf + got, piece, want);
    buf[got + want] = '\0';
    if (memchr(piece, '\0', want))
      return;
    got += want;
  }
}

static int add(attach_lib **libs, size_t *n, const char *name, const char *path,
               uint64_t bias) {
  for (size_t k = 0; k < *n; k++)
    if (strcmp((*libs)[k].path, path) == 0)
      return 0;
  attach_lib *nl = realloc(*libs, (*n + 1) * sizeof *nl);
  if (!nl)
    return MOLT_ENOMEM;
  *libs = nl;
  attach_lib *l = &nl[(*n)++];
  snprintf(l->name, sizeof l->name, "%s", name);
  snprintf(l->path, sizeof l->path, "%s", path);
  l->bias = bias;
  return 0;
}

int molt__libs_list(pid_t pid, uint64_t exe_bias, const char *exe, const attach_map *maps,
                    size_t n, attach_lib **libs, size_t *nlibs) {
  *libs = NULL;
  *nlibs = 0;
  uint64_t link;
  int rc = 0;
  if (first_link(pid, exe_bias, &link)) {
    /* struct link_map { l_addr; l_name; l_ld; l_next; l_prev; } */
    for (int i = 0; rc == 0 && link && i < MAX_LINKS; i++) {
      uint64_t lm[4];
      if (molt__os_read(pid, link, lm, sizeof lm) != 0)
        break;
      char name[512] = "";
      if (lm[1])
        read_string(pid, lm[1], name, sizeof name);
      const attach_map *m = i ? file_start(maps, n, lm[2]) : NULL;
      char path[600];
      if (m && strcmp(m->path, exe) != 0 && !strstr(m->path, "molt-attach") &&
          open_path(pid, m, path, sizeof path))
        rc = add(libs, nlibs, name[0] ? name : m->path, path, lm[0]);
      link = lm[3];
    }
    if (rc || *nlibs)
      return rc;
  }
  /* No link map (a static program, or DT_DEBUG not filled): the mapped
   * files in the order of their mappings. */
  for (size_t i = 0; rc == 0 && i < n; i++) {
    const attach_map *m = &maps[i];
    uint64_t bias;
    char path[600];
    if (m->path[0] != '/' || m->offset != 0 || strcmp(m->path, exe) == 0 ||
        strstr(m->path, "molt-attach") || !open_path(pid, m, path, sizeof path))
      continue;
    attach_map one = *m;
    snprintf(one.path, sizeof one.path, "%.511s", path); /* paths longer fail below */
    if (molt__os_bias_of(path, &one, 1, &bias))
      rc = add(libs, nlibs, m->path, path, bias);
  }
  return rc;
}
