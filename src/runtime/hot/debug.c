/*
 * hot/debug.c -- debuggers and crash reports see a loaded patch under the
 * name of its file.
 *
 * A patch is dlopened through its sealed copy, "/proc/self/fd/N" (patch.c,
 * R7), and the dynamic loader keeps that string as the object's name in
 * its link map: dladdr and backtrace_symbols print it, and gdb -- which
 * reads the link map (r_debug) of a live process or of a core file and
 * opens each object by that name -- opens "/proc/self/fd/N" of *its own*
 * process and finds no symbols: frames in patched code read "?? ()".  So
 * once a patch is loaded, its link map entry names the patch file by its
 * absolute path, which gdb opens for symbols and DWARF, in a live process
 * and in a core dump alike; before the object is closed the loader's own
 * name is put back (glibc frees that string at dlclose).
 *
 * Why not gdb's JIT interface (__jit_debug_register_code): gdb reads a JIT
 * symbol file as an object already placed at its final addresses, and a
 * shared object's DWARF (its addresses, line table, frame info) is linked
 * at 0 and moved by the loader's bias -- the runtime would have to relocate
 * the debug info itself.  The link map is how gdb finds every other shared
 * object, with its bias, and it is in every core file.  The path may name
 * other bytes than those loaded if the file is replaced after the apply
 * (gdb then reads the wrong symbols, as for any library rebuilt under a
 * running process); docs/guide.md says so.
 */
#include "hot/hot.h"

#include <dlfcn.h>
#include <limits.h>
#include <link.h>
#include <stdlib.h>
#include <string.h>

/* The store of one link map name, made from inside dl_iterate_phdr: the
 * loader holds its lock for the callback, so no other dl_iterate_phdr
 * (the unwinder, sanitizers) and no dlopen/dlclose reads or changes the
 * list meanwhile.  dladdr reads names under another of the loader's locks:
 * it sees the old or the new pointer (one aligned word), each a complete
 * string that stays allocated until this object is closed. */
struct rename {
  struct link_map *lm;
  char *name;
};

static int rename_locked(struct dl_phdr_info *info, size_t size, void *arg) {
  (void)info;
  (void)size;
  struct rename *r = arg;
  /* release: a reader that sees the new pointer sees the string written
   * before it (plain loads in glibc and gdb; on x86-64 every store is a
   * release store, this keeps the compiler from reordering). */
  __atomic_store_n(&r->lm->l_name, r->name, __ATOMIC_RELEASE);
  return 1; /* one call is enough: the lock was held for it */
}

static void set_name(struct link_map *lm, char *name) {
  struct rename r = {lm, name};
  dl_iterate_phdr(rename_locked, &r);
}

void molt__debug_patch_loaded(molt__object *obj, void *handle) {
  struct link_map *lm = NULL;
  if (obj->debug_name || !obj->path || dlinfo(handle, RTLD_DI_LINKMAP, &lm) != 0 || !lm)
    return;
  /* The absolute path of the file as the apply named it: the runtime's
   * working directory is the host's, which is where a relative path was
   * opened.  Without one (deleted, out of memory) the loader's name stays. */
  char *abs = realpath(obj->path, NULL);
  if (!abs)
    return;
  /* The loader still matches the name it opened the object under: the
   * next load must not use it (base/fd.c). */
  if (molt__fd_load_name_hidden(lm->l_name) < 0) {
    free(abs);
    return;
  }
  obj->debug_name = abs;
  obj->loader_name = lm->l_name;
  set_name(lm, abs);
}

void molt__debug_patch_unloading(molt__object *obj, void *handle) {
  struct link_map *lm = NULL;
  if (!obj->debug_name)
    return;
  if (dlinfo(handle, RTLD_DI_LINKMAP, &lm) == 0 && lm)
    set_name(lm, obj->loader_name);
  /* (Shown again: the object is about to be closed; until then the name
   * is in the loader's list as before.) */
  molt__fd_load_name_shown(obj->loader_name);
  free(obj->debug_name);
  obj->debug_name = NULL;
  obj->loader_name = NULL;
}
