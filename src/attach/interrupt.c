/* SIGINT, SIGTERM, SIGHUP and SIGQUIT of molt itself during an attach or a
 * rollback.  Their default action ends molt at once, which is SIGKILL's
 * effect: in the middle of the system calls run on a hijacked thread it
 * leaves that thread with the registers of the call, and the staged code
 * half made.  So they are blocked for the whole run and honoured at safe
 * points only: before the jumps are written, an attach undoes what it did
 * and stops; after, it finishes.  The signal taken is kept for the CLI,
 * which reports the interruption and then ends with that signal as it
 * would have. */
#include "attach/internal.h"

#include <signal.h>
#include <stddef.h>
#include <time.h>

/* The first signal a run of molt took (at a safe point, or pending at the
 * end of an attach or rollback); kept across runs, so `attach --all`
 * stops at the next process and the CLI ends with it. */
static int taken;

static void term_set(sigset_t *set) {
  sigemptyset(set);
  sigaddset(set, SIGINT);
  sigaddset(set, SIGTERM);
  sigaddset(set, SIGHUP);
  sigaddset(set, SIGQUIT);
}

void molt__interrupt_block(sigset_t *old) {
  sigset_t set;
  term_set(&set);
  sigprocmask(SIG_BLOCK, &set, old);
}

void molt__interrupt_restore(const sigset_t *old) { sigprocmask(SIG_SETMASK, old, NULL); }

bool molt__interrupt_pending(void) {
  sigset_t set, pending;
  term_set(&set);
  if (sigpending(&pending) != 0)
    return false;
  for (int sig = 1; sig < NSIG; sig++)
    if (sigismember(&set, sig) && sigismember(&pending, sig))
      return true;
  return false;
}

int molt__interrupt_take(void) {
  if (!molt__interrupt_pending())
    return 0;
  sigset_t set;
  term_set(&set);
  struct timespec zero = {0, 0};
  int sig = sigtimedwait(&set, NULL, &zero);
  if (sig > 0 && !taken)
    taken = sig;
  return sig > 0 ? sig : 0;
}

int molt__attach_interrupted(void) { return taken; }
