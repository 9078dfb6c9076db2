/* The attach patch of the recursion and stored-pointer tests: deep()
 * counts each of its levels as 1 + 2^20 (the server's as 1), napping as
 * the server's does; scale(), which the server calls only through its
 * table ops[], multiplies by seven (the server's by five). */
#include <stdatomic.h>
#include <time.h>

extern atomic_long deep_naps;      /* static in server.c */
extern volatile long scale_factor; /* static in server.c: 5 */

long deep(long n, long at, long ms) {
  volatile long mark = n ^ 0x5a5a;
  if (n == at && ms > 0) {
    atomic_fetch_add(&deep_naps, 1);
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000};
    nanosleep(&ts, NULL);
  }
  long below = n > 0 ? deep(n - 1, at, ms) : 0;
  if (mark != (n ^ 0x5a5a) || below < 0)
    return -1;
  return below + 1 + (1L << 20);
}

long scale(long n) { return n * (scale_factor + 2); }
