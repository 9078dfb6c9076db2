/* The program that the runtime tests patch.  Its updatable functions are
 * declared with the manual interface of molt.h (moltcc is not needed). */
#include "molt.h"
#include "target.h"

#include <sched.h>
#include <unistd.h>

int counter;
static int hits; /* static: patches must reach this very object */
int (*stored_fp)(int);
const char *stored_msg; /* a pinned patch stores its literal here */
volatile int block_hold;
volatile int block_entered;
int cb_pre_mode, cb_post_mode; /* what patch_cb's callbacks do */
int cb_pre_seen, cb_post_seen; /* version_tag(0) + 1 as they saw it */
volatile int cb_hold;          /* mode 2 loops while set */
volatile int spin_hold, spin_entered;

MOLT_FUNCTION(int, version_tag, (int x), (x)) { return 0 * 1000 + x; }

MOLT_FUNCTION(int, rec, (int n), (n)) { return n == 0 ? 0 : rec(n - 1); }

MOLT_FUNCTION(int, block_call, (void), ()) {
  __atomic_store_n(&block_entered, 1, __ATOMIC_SEQ_CST);
  while (__atomic_load_n(&block_hold, __ATOMIC_SEQ_CST))
    sched_yield();
  return 0;
}

MOLT_STATIC_FUNCTION(int, doubler, (int x), (x)) {
  __atomic_add_fetch(&hits, 1, __ATOMIC_RELAXED);
  return 2 * x;
}

MOLT_FUNCTION(int, through_static, (int x), (x)) { return doubler(x); }

MOLT_FUNCTION(int, pipe_call, (int fd), (fd)) {
  unsigned char c;
  return read(fd, &c, 1) == 1 ? 0 * 1000 + c : -1;
}

MOLT_FUNCTION(int, spin_call, (void), ()) {
  int sum = 0;
  __atomic_store_n(&spin_entered, 1, __ATOMIC_SEQ_CST);
  while (__atomic_load_n(&spin_hold, __ATOMIC_SEQ_CST))
    sum += version_tag(0);
  return 0 * 1000 + sum % 1;
}

int hits_value(void) { return __atomic_load_n(&hits, __ATOMIC_RELAXED); }

__attribute__((constructor)) static void take_address(void) { stored_fp = &version_tag; }
