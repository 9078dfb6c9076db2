/*
 * hiccup.c — a hiccup meter inside a server process (issue 14, item 4).
 *
 *   LD_PRELOAD=hiccup.so MOLT_HICCUP_FILE=/path/meter.bin kvstore ...
 *
 * What an update takes from the workers, measured where the workers are:
 * the library starts MOLT_HICCUP_THREADS threads (default 1) in the
 * server.  While the driver (hiccup.py) sets the `on` word of the shared
 * file, each reads CLOCK_MONOTONIC in a tight loop and records every gap
 * between two reads: a gap is time the thread did not run -- preempted by
 * the server's own threads, by the runtime thread, by `molt apply`, by
 * other jobs, or interrupted (membarrier's IPIs, TLB shootdowns of
 * mprotect and munmap, page faults).  While `on` is 0 the threads sleep
 * (10 ms), so only the server that has the load spins.
 *
 * Recorded in the file (struct meter, little endian, read by hiccup.py):
 *   - per 1 ms of metered time, the longest gap that overlaps it, in a
 *     log-linear histogram (16 steps per power of two: within 4.4%):
 *     its percentiles are "the longest stall in 99.9% of milliseconds";
 *   - every gap >= 1 us in a second histogram of the same shape;
 *   - the exact longest gap, the metered time, the number of reads;
 *   - the last BIG_MAX gaps >= 50 us with their start (CLOCK_MONOTONIC
 *     ns, the clock of the driver and of latclient), to place them
 *     against the patch requests.  65536 of them: on a busy machine a
 *     3 s segment has thousands (4096 kept only its last second or so;
 *     hiccup.py counts any that are lost).
 * Nothing is written to stdout or stderr; without MOLT_HICCUP_FILE the
 * library does nothing.
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#define SUB 16        /* buckets per power of two          */
#define BUCKETS 640   /* up to 2^40 ns                     */
#define BIG_MAX 65536 /* gaps >= BIG_NS kept with their time */
#define BIG_NS 50000
#define WINDOW_NS 1000000
#define STRETCH_NS 9000000 /* metered, then ...                  */
#define REST_NS 1000000    /* ... asleep, not metered            */
#define MAX_THREADS 8

struct big {
  uint64_t start_ns, gap_ns;
};

struct meter {
  char magic[8]; /* "HICCUP02" */
  _Atomic uint32_t on;
  uint32_t threads;
  uint64_t metered_ns, reads, max_gap_ns, windows;
  uint64_t window_max[BUCKETS]; /* per 1 ms window: its longest gap */
  uint64_t gaps[BUCKETS];       /* every gap >= 1 us                */
  uint64_t nbig;                /* total; the last BIG_MAX are kept */
  struct big big[BIG_MAX];
};

static struct meter *m;
static pthread_mutex_t merge = PTHREAD_MUTEX_INITIALIZER;

static inline uint64_t now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* Log-linear: values below SUB are their own bucket; above, 16 steps per
 * power of two. */
static unsigned bucket(uint64_t v) {
  if (v < SUB)
    return (unsigned)v;
  unsigned e = 63u - (unsigned)__builtin_clzll(v); /* >= 4 */
  unsigned b = (e - 3) * SUB + (unsigned)((v >> (e - 4)) - SUB);
  return b < BUCKETS ? b : BUCKETS - 1;
}

/* One metered stretch: STRETCH_NS of reading the clock (or until `on` is
 * seen clear), then the thread sleeps REST_NS, which is not metered: a
 * real-time thread that never sleeps would run into the kernel's RT
 * throttling (95% of each second), a 50 ms gap every second in every
 * server alike. */
static void meter_stretch(void) {
  static __thread uint64_t window_max[BUCKETS], gaps[BUCKETS];
  memset(window_max, 0, sizeof window_max);
  memset(gaps, 0, sizeof gaps);
  uint64_t reads = 0, windows = 0, maxgap = 0;
  uint64_t start = now_ns(), prev = start, wend = start + WINDOW_NS, wmax = 0;
  const uint64_t stretch_start = start;
  struct big local[64];
  unsigned nlocal = 0;
  for (;;) {
    uint64_t t = now_ns();
    uint64_t gap = t - prev;
    reads++;
    if (gap >= 1000) {
      gaps[bucket(gap)]++;
      if (gap > maxgap)
        maxgap = gap;
      if (gap >= BIG_NS && nlocal < 64)
        local[nlocal++] = (struct big){prev, gap};
    }
    /* A gap counts in every window it overlaps: a 5 ms stall is the
     * longest stall of 5 or 6 milliseconds. */
    if (gap > wmax)
      wmax = gap;
    while (t >= wend) {
      window_max[bucket(wmax)]++;
      windows++;
      wmax = gap;
      wend += WINDOW_NS;
    }
    prev = t;
    /* relaxed: a flag; a stretch that ends a little late costs nothing. */
    if ((reads & 1023) == 0 && (!atomic_load_explicit(&m->on, memory_order_relaxed) ||
                                nlocal == 64 || t - stretch_start >= STRETCH_NS)) {
      pthread_mutex_lock(&merge);
      for (unsigned i = 0; i < BUCKETS; i++) {
        m->window_max[i] += window_max[i];
        m->gaps[i] += gaps[i];
      }
      for (unsigned i = 0; i < nlocal; i++)
        m->big[m->nbig++ % BIG_MAX] = local[i];
      m->metered_ns += t - start;
      m->reads += reads;
      m->windows += windows;
      if (maxgap > m->max_gap_ns)
        m->max_gap_ns = maxgap;
      pthread_mutex_unlock(&merge);
      memset(window_max, 0, sizeof window_max);
      memset(gaps, 0, sizeof gaps);
      reads = windows = maxgap = 0;
      nlocal = 0;
      start = t;
      if (!atomic_load_explicit(&m->on, memory_order_relaxed) ||
          t - stretch_start >= STRETCH_NS)
        return;
    }
  }
}

static void *meter_main(void *arg) {
  (void)arg;
  /* Under SCHED_FIFO (the driver runs everything there, so that other
   * jobs on the machine cannot preempt the experiment), the meter runs
   * below the server's threads: they, its runtime thread and `molt apply`
   * preempt it -- exactly the time an update takes from a worker --,
   * other jobs do not. */
  int policy;
  struct sched_param sp;
  if (pthread_getschedparam(pthread_self(), &policy, &sp) == 0 && policy == SCHED_FIFO) {
    const char *p = getenv("MOLT_HICCUP_PRIO");
    sp.sched_priority = p ? atoi(p) : 1;
    pthread_setschedparam(pthread_self(), SCHED_FIFO, &sp);
  }
  for (;;) {
    if (atomic_load_explicit(&m->on, memory_order_relaxed)) {
      meter_stretch();
      struct timespec rest = {0, REST_NS};
      nanosleep(&rest, NULL);
      continue;
    }
    struct timespec ts = {0, 10000000};
    nanosleep(&ts, NULL);
  }
  return NULL;
}

__attribute__((constructor)) static void hiccup_start(void) {
  const char *path = getenv("MOLT_HICCUP_FILE");
  if (!path || !*path)
    return;
  const char *nt = getenv("MOLT_HICCUP_THREADS");
  int threads = nt ? atoi(nt) : 1;
  if (threads < 1 || threads > MAX_THREADS)
    threads = 1;
  int fd = open(path, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0)
    return;
  if (ftruncate(fd, sizeof(struct meter)) != 0) {
    close(fd);
    return;
  }
  m = mmap(NULL, sizeof(struct meter), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  if (m == MAP_FAILED) {
    m = NULL;
    return;
  }
  memcpy(m->magic, "HICCUP02", 8);
  m->threads = (uint32_t)threads;
  /* The meter threads must not inherit the program's state: they start
   * here, before main, and are not the program's (they never call its
   * functions, so molt never registers them). */
  for (int i = 0; i < threads; i++) {
    pthread_t t;
    if (pthread_create(&t, NULL, meter_main, NULL) == 0) {
      pthread_detach(t);
      pthread_setname_np(t, "hiccup");
    }
  }
}
