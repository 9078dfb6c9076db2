/*
 * hot -- the mode of hot patches (policy immediate, local or global), on
 * switch/: a process linked with libmolt, updated one patch object at a
 * time, with rollback.  It plugs into the layers below as a molt__mode
 * (hot.c): operations apply and rollback, records in status, patch objects
 * as generation owners.  Nothing outside this folder includes this header.
 *
 *   patch.c  patch objects: checking a patch file, loading it, resolving its
 *            imports (H6), building its generation, the object lifecycle
 *   hot.c    the operations, the rollback history, status, the mode
 *   debug.c  a loaded patch's name in the link map, for debuggers
 *   callback.c  a patch's pre/post-update callbacks, each on a thread of
 *            its own with a deadline
 */
#ifndef MOLT_HOT_H
#define MOLT_HOT_H

#include "switch/switch.h"

/* A loaded patch.  Everything here is protected by molt__rt_lock, except
 * what only the runtime thread touches under op_lock (loading). */
typedef struct molt__object molt__object;
typedef struct molt__callback_thread molt__callback_thread;
struct molt__object {
  molt__owner owner;             /* generations point into it (owner.id == id) */
  void *handle;                  /* dlopen handle; NULL while not loaded */
  const molt__patch_header *hdr; /* inside the loaded object */
  char *id, *description, *path;
  char *provenance;          /* what it was built from ("" if not known) */
  char *replaced;            /* "f, g (a.c)": what it replaces (status) */
  bool pinned;               /* never unloaded once published (patch header flag) */
  bool kept_logged;          /* the log said why it stays */
  char *pinned_reasons;      /* first reason after molt__object_kept_reason */
  molt__fd file;             /* its sealed copy, made once (R7); kept for reload */
  molt__file_identity ident; /* the file it was copied from, and the copy's hash */
  size_t module;             /* index of the program module it patches */
  uint64_t gen;              /* generation its apply created */
  bool in_history;           /* on the rollback stack */
  /* What this patch replaced, for rollback: entry index and the object that
   * supplied the previous version (NULL = the program's version 0).  Each
   * named object has prev_refs counted, so it outlives this record. */
  struct molt__prev {
    uint32_t index;
    uint32_t rec;
    molt__object *owner;
  } * prev;
  size_t nprev;
  size_t prev_refs;
  /* (table index, position in hdr->fns) of each function it brings, sorted
   * by table index: finds "this object's version of entry i" in O(log n)
   * (rec is stable across reloads: the file does not change). */
  struct molt__by_index {
    uint32_t index, rec;
  } * by_index;
  size_t nby_index;
  molt__link all; /* every object not yet freed */
  /* While loaded: the name its link map shows debuggers (the file's
   * absolute path) and the loader's own name, put back before dlclose
   * (debug.c).  NULL when the loader's name stays. */
  char *debug_name;
  char *loader_name;
  /* Its callbacks (MOLT_PATCH_PRE/POST), from the file's notes: names ("" =
   * none), link-time addresses, and while loaded the callable address. */
  struct molt__object_callback {
    char name[MOLT__CALLBACK_NAME_MAX];
    uint64_t vaddr;
    int (*fn)(void);
  } pre, post;
  /* A callback that did not return in time is still running code of the
   * patch: it is never unloaded.  stuck names why (status, log); run is the
   * callback's record (finished or not).  NULL: none. */
  const char *stuck;
  molt__callback_thread *stuck_run;
};

/* callback.c: runs fn on a new thread and waits at most timeout_ms.
 * 0: it returned *result after *elapsed_ms.  MOLT_ETIMEDOUT: it is still
 * running; *still_running is a reference to its record (release it with
 * molt__callback_release).  Else the thread could not be started.  No
 * lock held or taken. */
MOLT__HIDDEN int molt__callback_run(int (*fn)(void), int timeout_ms, int *result,
                                    unsigned *elapsed_ms,
                                    molt__callback_thread **still_running, char *err,
                                    size_t errlen);
/* Whether a callback that timed out has returned since. */
MOLT__HIDDEN bool molt__callback_finished(molt__callback_thread *r);
MOLT__HIDDEN void molt__callback_release(molt__callback_thread *r);
/* "pre=f post=g", "pre=f", "" (status). */
MOLT__HIDDEN void molt__object_callbacks(const molt__object *obj, char *buf, size_t len);

/* debug.c: after obj's file was loaded as `handle`, debuggers and
 * dladdr see it under its file's path; before it is closed, the loader's
 * name is restored (runtime thread, op_lock, no molt__rt_lock). */
MOLT__HIDDEN void molt__debug_patch_loaded(molt__object *obj, void *handle);
MOLT__HIDDEN void molt__debug_patch_unloading(molt__object *obj, void *handle);

/* The object behind a generation owner, or NULL if o is not a patch
 * object (an owner of another mode). */
MOLT__HIDDEN molt__object *molt__object_of(molt__owner *o);
/* Checks the patch file open on fd (the request's: not closed here), loads
 * a sealed copy of it (op_lock held, no molt__rt_lock).  path names it in
 * messages and status only.  On failure nothing is loaded. */
MOLT__HIDDEN int molt__patch_open(const char *path, int fd, molt__object **out, char *err,
                                  size_t errlen);
/* dlopens obj's file again (rollback to an unloaded object). */
MOLT__HIDDEN int molt__patch_reload(molt__object *obj, char *err, size_t errlen);
/* With molt__rt_lock: fills a new numbered generation = from + obj's
 * functions (and records what they replace, for rollback). */
MOLT__HIDDEN int molt__patch_build_gen(molt__object *obj, const molt__gen *from,
                                       molt__gen **out, char *err, size_t errlen);
/* A failed operation leaves nothing behind: obj, loaded for it but never
 * published, is closed again (op_lock held, no molt__rt_lock). */
MOLT__HIDDEN void molt__object_drop_unused(molt__object *obj);
/* Why a pinned object stays loaded: the first of its reasons. */
MOLT__HIDDEN const char *molt__object_kept_reason(molt__object *obj);
/* Frees an object that is neither loaded, referenced nor in history
 * (molt__rt_lock). */
MOLT__HIDDEN void molt__object_free_if_unused(molt__object *obj);
/* obj leaves the rollback stack (popped or beyond its depth; rt_lock). */
MOLT__HIDDEN void molt__object_leave_history(molt__object *obj);
/* Every object not yet freed, newest first (rt_lock). */
MOLT__HIDDEN molt__object *molt__objects_first(void);
MOLT__HIDDEN molt__object *molt__objects_next(molt__object *o);

#endif /* MOLT_HOT_H */
