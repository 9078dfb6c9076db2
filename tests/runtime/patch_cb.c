/* A patch with a pre- and a post-update callback (molt.h MOLT_PATCH_PRE /
 * MOLT_PATCH_POST), tag 4.  What the callbacks do is the program's choice
 * (target.h: cb_pre_mode, cb_post_mode); each records the version of
 * version_tag it saw, which tells whether the patch was published yet. */
#include "molt.h"
#include <sched.h>

MOLT_PATCH("patch-cb", "callbacks (tag 4)");
MOLT_IMPORT(int, cb_pre_mode);
MOLT_IMPORT(int, cb_post_mode);
MOLT_IMPORT(int, cb_pre_seen);
MOLT_IMPORT(int, cb_post_seen);
MOLT_IMPORT(volatile int, cb_hold);
MOLT_IMPORT_FUNCTION(int, version_tag, (int), NULL);

static int behave(int mode) {
  if (mode == 2) {
    while (__atomic_load_n(&MOLT_REF(cb_hold), __ATOMIC_SEQ_CST))
      sched_yield();
    return 0;
  }
  return mode;
}

static int pre_check(void) {
  __atomic_store_n(&MOLT_REF(cb_pre_seen), MOLT_REF(version_tag)(0) + 1,
                   __ATOMIC_SEQ_CST);
  return behave(__atomic_load_n(&MOLT_REF(cb_pre_mode), __ATOMIC_SEQ_CST));
}
MOLT_PATCH_PRE(pre_check);

static int post_announce(void) {
  __atomic_store_n(&MOLT_REF(cb_post_seen), MOLT_REF(version_tag)(0) + 1,
                   __ATOMIC_SEQ_CST);
  return behave(__atomic_load_n(&MOLT_REF(cb_post_mode), __ATOMIC_SEQ_CST));
}
MOLT_PATCH_POST(post_announce);

MOLT_PATCH_FUNCTION(int, version_tag, (int x)) { return 4 * 1000 + x; }
