/* An attach patch whose answer(4242) starts a thread that runs the patch's
 * code on a stack mapped just then: a rollback started while the request
 * runs must find that stack (mapped after it first read the target's
 * maps) and keep the patch's code until the thread is done with it.  The
 * program's "reap" joins the thread and unmaps its stack: until then the
 * stack keeps words pointing into the patch (the thread's start routine
 * in glibc's thread descriptor at its top, stale return addresses), which
 * keep the code mapped too. */
#include <pthread.h>
#include <sys/mman.h>
#include <time.h>

extern long multiplier; /* static in server.c */
extern pthread_t helper_thread;
extern void *helper_stack;
extern size_t helper_stack_size;

static void *helper(void *arg) {
  struct timespec ts = {0, 800 * 1000000};
  nanosleep(&ts, NULL); /* returns into this function: the patch's code */
  return arg;
}

long answer(long n) {
  if (n != 4242)
    return n * (multiplier + 1);
  struct timespec ts = {0, 300 * 1000000};
  nanosleep(&ts, NULL);
  size_t size = 1 << 20;
  void *stack = mmap(NULL, size, PROT_READ | PROT_WRITE,
                     MAP_PRIVATE | MAP_ANONYMOUS | MAP_STACK, -1, 0);
  pthread_attr_t attr;
  pthread_t t;
  if (stack == MAP_FAILED || pthread_attr_init(&attr) != 0 ||
      pthread_attr_setstack(&attr, stack, size) != 0 ||
      pthread_create(&t, &attr, helper, NULL) != 0)
    return -1;
  helper_thread = t;
  helper_stack_size = size;
  helper_stack = stack;
  return 1;
}
