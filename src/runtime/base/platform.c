/* Linux specifics behind a small interface (membarrier, tids, clocks). */
#include "base/base.h"

#include <errno.h>
#include <signal.h>
#include <linux/membarrier.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

static int barrier_cmd = -1;
static bool sync_core_ok;

bool molt__membarrier_init(void) {
  long mask = syscall(SYS_membarrier, MEMBARRIER_CMD_QUERY, 0, 0);
  if (mask < 0)
    return false;
  /* PRIVATE_EXPEDITED interrupts only the CPUs running our threads (IPI, not
   * a signal: application threads are neither stopped nor signalled, H10)
   * and costs microseconds.  It must be registered once per process. */
  /* SYNC_CORE (entry.c): after rewriting code, every running thread
   * executes a core-serializing instruction before it returns to user mode,
   * so none keeps running instructions it fetched before the write. */
  if ((mask & MEMBARRIER_CMD_PRIVATE_EXPEDITED_SYNC_CORE) &&
      syscall(SYS_membarrier, MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED_SYNC_CORE, 0,
              0) == 0)
    sync_core_ok = true;
  if ((mask & MEMBARRIER_CMD_PRIVATE_EXPEDITED) &&
      syscall(SYS_membarrier, MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED, 0, 0) == 0) {
    barrier_cmd = MEMBARRIER_CMD_PRIVATE_EXPEDITED;
    return true;
  }
  /* The global command waits for a scheduler pass on every CPU: slow but a
   * correct full barrier on all our threads. */
  if (mask & MEMBARRIER_CMD_GLOBAL) {
    barrier_cmd = MEMBARRIER_CMD_GLOBAL;
    return true;
  }
  return false;
}

int molt__membarrier(void) {
  if (barrier_cmd < 0)
    return MOLT_ENOTSUP;
  if (syscall(SYS_membarrier, barrier_cmd, 0, 0) != 0)
    return MOLT_EINTERNAL;
  return 0;
}

void molt__sync_core(void) {
  if (sync_core_ok &&
      syscall(SYS_membarrier, MEMBARRIER_CMD_PRIVATE_EXPEDITED_SYNC_CORE, 0, 0) == 0)
    return;
  /* Without SYNC_CORE: on x86 the expedited barrier interrupts every CPU
   * running one of our threads, and the return from that interrupt (iret)
   * serializes the core; a thread that is not running has no instructions
   * in flight. */
  (void)molt__membarrier();
}

pid_t molt__gettid(void) { return (pid_t)syscall(SYS_gettid); }

static uint64_t clock_ns(clockid_t id) {
  struct timespec ts;
  clock_gettime(id, &ts);
  return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

uint64_t molt__now_ns(void) { return clock_ns(CLOCK_MONOTONIC); }
uint64_t molt__realtime_ns(void) { return clock_ns(CLOCK_REALTIME); }

struct timespec molt__monotonic_after_ms(int ms) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  t.tv_sec += ms / 1000;
  t.tv_nsec += (long)(ms % 1000) * 1000000L;
  if (t.tv_nsec >= 1000000000L) {
    t.tv_sec++;
    t.tv_nsec -= 1000000000L;
  }
  return t;
}

void molt__block_async_signals(sigset_t *old) {
  sigset_t all;
  sigfillset(&all);
  sigdelset(&all, SIGSEGV);
  sigdelset(&all, SIGBUS);
  sigdelset(&all, SIGILL);
  sigdelset(&all, SIGFPE);
  sigdelset(&all, SIGTRAP);
  pthread_sigmask(SIG_SETMASK, &all, old);
}
