/* The updatable functions of the runtime test program (tests/runtime). */
#ifndef TARGET_H
#define TARGET_H
#include <stdint.h>

/* Tags each version returns: base 0, patch_a 1, patch_b 2. */
int version_tag(int x);        /* returns tag * 1000 + x      */
int rec(int n);                /* recursive; returns the tag  */
int block_call(void);          /* blocks while block_hold set */
int through_static(int x);     /* calls a static updatable fn */
extern int counter;            /* global the patches update   */
int hits_value(void);          /* reads a static of target.c  */
extern int (*stored_fp)(int);  /* &version_tag, taken at start */
extern const char *stored_msg; /* set by patch_pinned */
/* Reads one byte c of fd (a pipe): tag * 1000 + c. */
int pipe_call(int fd);
/* Calls version_tag in a loop while spin_hold is set, never blocking;
 * returns tag * 1000. */
int spin_call(void);
extern volatile int spin_hold, spin_entered;
extern volatile int block_hold;
extern volatile int block_entered;
/* patch_cb's callbacks: mode 0 returns 0, 2 loops while cb_hold is set,
 * any other is returned; each records version_tag(0) + 1 as it saw it. */
extern int cb_pre_mode, cb_post_mode;
extern int cb_pre_seen, cb_post_seen;
extern volatile int cb_hold;
#endif
