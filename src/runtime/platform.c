/* Linux specifics behind a small interface (membarrier, tids, clocks). */
#include "internal.h"

#include <errno.h>
#include <linux/membarrier.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

static int barrier_cmd = -1;

bool molt__membarrier_init(void) {
  long mask = syscall(SYS_membarrier, MEMBARRIER_CMD_QUERY, 0, 0);
  if (mask < 0)
    return false;
  /* PRIVATE_EXPEDITED interrupts only the CPUs running our threads (IPI, not
   * a signal: application threads are neither stopped nor signalled, H10)
   * and costs microseconds.  It must be registered once per process. */
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

pid_t molt__gettid(void) { return (pid_t)syscall(SYS_gettid); }

static uint64_t clock_ns(clockid_t id) {
  struct timespec ts;
  clock_gettime(id, &ts);
  return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

uint64_t molt__now_ns(void) { return clock_ns(CLOCK_MONOTONIC); }
uint64_t molt__realtime_ns(void) { return clock_ns(CLOCK_REALTIME); }
