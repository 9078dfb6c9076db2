/* A small server built as a molt program image, by hand (what moltcc
 * --molt-program generates is the same shape): VERSION 1, 2 and 3 of it,
 * plus broken variants of version 2 for the refusal tests (see
 * tests.cmake).  Driven through stdin, one command per line; it answers on
 * stdout, one line per answer:
 *
 *   state          "state v=V requests=R total=T hits=H greeting=G c0=.. c1=.. gen=N"
 *   add N          total += N
 *   spawn-sleeper  starts a thread that blocks without update points
 *   wake-sleeper   lets it finish (and joins it)
 *   spawn-exiter   starts a thread that calls pthread_exit() and then
 *                  blocks in a key destructor of the image (still running
 *                  image code, past libmolt's own key destructor)
 *   release-exiter lets that destructor return (and joins the thread)
 *   quit           main returns 0
 *
 * Threads: main (update point "main-loop") and two workers started with
 * pthread_create, each with its own argument (&workers[i]) and a counter
 * migrated with MOLT_MIGRATE_LOCAL (update point "worker-loop").  Every
 * thread prints a line when it starts, saying whether it was restarted by
 * an update and from which point.
 *
 * Version 1 registers a molt_on_update_pending callback (a function of
 * its image); versions 2 and 3 do not.
 *
 * Version 2 changes the types: struct stats gets a field and a wider
 * counter, the workers' counter becomes a long; its hand-written migrate()
 * uses molt__xf_var / molt__xf_ptr / molt__xf_local.  Version 3 keeps
 * version 2's types. */
#define _GNU_SOURCE
#include "molt.h"
#include "molt/program.h" /* hand-written image: the ABI moltcc generates against */

#include <errno.h>
#include <poll.h>
#include <stdarg.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#ifndef VERSION
#define VERSION 1
#endif

#if VERSION == 1
struct stats {
  int requests;
  long total;
};
typedef int counter_t;
#else
struct stats {
  long requests;
  long total;
  int hits; /* new in version 2 */
};
typedef long counter_t;
#endif

struct worker {
  int id;
  int delay_ms;
};

/* The state that migrates. */
struct stats *stats;
#define STR2(x) #x
#define STR(x) STR2(x)
/* Migrated as a pointer: after an update it still points to the OLD
 * version's literal (a copy the runtime keeps once that image is gone). */
const char *greeting = "hello from version " STR(VERSION);
struct worker workers[2] = {{0, 2}, {1, 3}};
static _Atomic long progress[2]; /* published by the workers */
static int sleeper_pipe[2] = {-1, -1};
static pthread_t sleeper;
static int exiter_pipe[2] = {-1, -1};
static pthread_t exiter;
/* Created by a constructor, i.e. while the image is loaded and before
 * libmolt's per-program-thread key: its destructor runs after libmolt's
 * thread registry destructor and before the program thread's end. */
static pthread_key_t exiter_key;

static void say(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void say(const char *fmt, ...) {
  /* One stdio call per line: lines of different threads never mix. */
  char line[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(line, sizeof line, fmt, ap);
  va_end(ap);
  printf("%s\n", line);
  fflush(stdout);
}

#ifdef MISSING_SYMBOL
/* Defined nowhere: dlopen(RTLD_NOW) of this image must fail. */
extern int molt_test_no_such_function(int);
#endif

#ifdef NO_WORKER_ENTRY
#define worker_main worker_main_renamed
#endif

/* Registers a migrated local and returns.  The worker calls it right
 * before molt_update_point(), from the same frame, so molt_update_point's
 * frame has exactly the address probe's had: its registration must not be
 * taken for a live one at the update point (the new version would be
 * handed a stale value).  migrate() asks for it; it should never come. */
__attribute__((noinline)) static void probe(void) {
  long scratch = 12345;
  if (MOLT_MIGRATE_LOCAL(scratch))
    say("v%d probe restored a stale local scratch=%ld", VERSION, scratch);
}

static void *worker_main(void *arg) {
  struct worker *w = arg;
  counter_t count = 0;
  int restored = MOLT_MIGRATE_LOCAL(count);
  say("v%d worker id=%d tid=%d updating=%d from_worker_loop=%d restored=%d count=%ld",
      VERSION, w->id, (int)gettid(), molt_is_updating(),
      molt_is_updating_from("worker-loop"), restored, (long)count);
#ifdef MISSING_SYMBOL
  if (count < 0)
    molt_test_no_such_function(1);
#endif
  for (;;) {
    count++;
    progress[w->id] = (long)count;
    usleep((useconds_t)w->delay_ms * 1000);
    probe();
    molt_update_point("worker-loop");
  }
  return NULL;
}

static void *sleeper_main(void *arg) {
  (void)arg;
  char c;
  /* Blocks here, never at an update point, until woken. */
  ssize_t n = read(sleeper_pipe[0], &c, 1);
  (void)n;
  return NULL;
}

static void exiter_destructor(void *arg) {
  (void)arg;
  char c;
  ssize_t n = read(exiter_pipe[0], &c, 1); /* until release-exiter */
  (void)n;
}

__attribute__((constructor)) static void make_exiter_key(void) {
  pthread_key_create(&exiter_key, exiter_destructor);
}

static void *exiter_main(void *arg) {
  (void)arg;
  pthread_setspecific(exiter_key, &exiter_key);
  say("exiter tid=%d exiting", (int)gettid());
  pthread_exit(NULL);
}

#if VERSION == 1
static _Atomic int pending_calls;
static void on_pending(void *arg) {
  (void)arg;
  pending_calls++;
}
#endif

static void command(char *line) {
  if (strcmp(line, "state") == 0) {
    stats->requests++;
#if VERSION >= 2
    stats->hits++;
    int hits = stats->hits;
#else
    int hits = -1;
#endif
    say("state v=%d requests=%ld total=%ld hits=%d greeting=%s c0=%ld c1=%ld gen=%llu",
        VERSION, (long)stats->requests, stats->total, hits, greeting, (long)progress[0],
        (long)progress[1], (unsigned long long)molt_generation());
  } else if (strncmp(line, "add ", 4) == 0) {
    stats->requests++;
    stats->total += atol(line + 4);
    say("ok");
  } else if (strcmp(line, "spawn-sleeper") == 0) {
    if (pipe(sleeper_pipe) != 0 ||
        pthread_create(&sleeper, NULL, sleeper_main, NULL) != 0)
      say("error %s", strerror(errno));
    else
      say("sleeper started");
  } else if (strcmp(line, "wake-sleeper") == 0) {
    ssize_t n = write(sleeper_pipe[1], "x", 1);
    (void)n;
    pthread_join(sleeper, NULL);
    close(sleeper_pipe[0]);
    close(sleeper_pipe[1]);
    say("sleeper done");
  } else if (strcmp(line, "spawn-exiter") == 0) {
    if (pipe(exiter_pipe) != 0 || pthread_create(&exiter, NULL, exiter_main, NULL) != 0)
      say("error %s", strerror(errno));
  } else if (strcmp(line, "release-exiter") == 0) {
    ssize_t n = write(exiter_pipe[1], "x", 1);
    (void)n;
    pthread_join(exiter, NULL);
    close(exiter_pipe[0]);
    close(exiter_pipe[1]);
    say("exiter done");
  } else {
    say("error unknown command '%s'", line);
  }
}

int main(int argc, char **argv) {
  (void)argc;
  (void)argv;
  if (molt_is_updating()) {
    /* Restarted by a full update: the state is migrated, the workers are
     * restarted by the runtime.  Only this thread's own set-up is redone. */
    say("v%d main tid=%d updating=1 from_main_loop=%d", VERSION, (int)gettid(),
        molt_is_updating_from("main-loop"));
  } else {
    stats = calloc(1, sizeof *stats);
#if VERSION == 1
    molt_on_update_pending(on_pending, NULL);
#endif
    say("v%d main pid=%d tid=%d", VERSION, (int)getpid(), (int)gettid());
    for (int i = 0; i < 2; i++) {
      pthread_t t;
      if (pthread_create(&t, NULL, worker_main, &workers[i]) != 0)
        return 3;
      pthread_detach(t);
    }
  }
  char buf[256];
  size_t have = 0;
  for (;;) {
    molt_update_point("main-loop");
    struct pollfd p = {.fd = 0, .events = POLLIN};
    if (poll(&p, 1, 10) <= 0)
      continue;
    ssize_t n = read(0, buf + have, sizeof buf - 1 - have);
    if (n <= 0)
      return 0; /* stdin closed */
    have += (size_t)n;
    buf[have] = '\0';
    char *nl;
    while ((nl = strchr(buf, '\n')) != NULL) {
      *nl = '\0';
      if (strcmp(buf, "quit") == 0)
        return 0;
      command(buf);
      have -= (size_t)(nl + 1 - buf);
      memmove(buf, nl + 1, have + 1);
    }
    if (have == sizeof buf - 1)
      have = 0; /* an overlong line: dropped */
  }
}

/* ---- what moltcc generates for an image: molt__program and migrate ------- */

#if VERSION == 1
MOLT_EXTERN const molt__program_info molt__program = {MOLT__PROGRAM_ABI, 0, NULL, NULL};
#else
#include "from_build_id.h" /* FROM_BUILD_ID: the image this one is built from */
#ifdef WRONG_FROM
#undef FROM_BUILD_ID
#define FROM_BUILD_ID "00112233445566778899aabbccddeeff00112233"
#endif

#if VERSION == 2
/* Version 1's layouts, as the generator re-declares them. */
struct o_stats {
  int requests;
  long total;
};
typedef int o_counter_t;

static void xf_stats(molt__xf_ctx *cx, const void *in, void *out) {
  (void)cx;
  const struct o_stats *i = in;
  struct stats *o = out;
  o->requests = i->requests; /* int -> long: converted, not copied */
  o->total = i->total;
  o->hits = 0; /* INIT */
}
static void xf_counter(molt__xf_ctx *cx, const void *in, void *out) {
  (void)cx;
  *(counter_t *)out = *(const o_counter_t *)in;
}
#define STATS_FLAGS MOLT__XF_CHANGED
#else
struct o_stats {
  long requests;
  long total;
  int hits;
};
typedef long o_counter_t;
#define xf_stats NULL
#define xf_counter NULL
#define STATS_FLAGS 0u
#endif

static const molt__xf_type t_stats = {"struct stats", sizeof(struct o_stats),
                                      sizeof(struct stats), xf_stats, STATS_FLAGS};
static const molt__xf_type t_counter = {"counter_t", sizeof(o_counter_t),
                                        sizeof(counter_t), xf_counter, STATS_FLAGS};
static const molt__xf_type t_worker = {"struct worker", sizeof(struct worker),
                                       sizeof(struct worker), NULL, 0};
static const molt__xf_type t_long = {"long", sizeof(long), sizeof(long), NULL, 0};

/* struct stats * (the pointee may change): the pointer is fixed. */
static void xf_stats_ptr(molt__xf_ctx *cx, const void *in, void *out) {
  void *const *i = in;
  if (in == out)
    molt__xf_setp(cx, out, molt__xf_ptr(cx, *i, &t_stats, 1));
  else
    *(void **)out = molt__xf_ptr(cx, *i, &t_stats, 1);
}
static const molt__xf_type t_stats_ptr = {
    "struct stats *", sizeof(void *), sizeof(void *), xf_stats_ptr, MOLT__XF_TRAVERSE};
/* const char * to a literal of the old image: the engine pools it. */
static void xf_str(molt__xf_ctx *cx, const void *in, void *out) {
  void *const *i = in;
  molt__xf_setp(cx, out, molt__xf_ptr(cx, *i, NULL, 1));
}
static const molt__xf_type t_str = {"const char *", sizeof(void *), sizeof(void *),
                                    xf_str, MOLT__XF_TRAVERSE};

#ifdef FAULT_IN_MIGRATE
/* A real SIGSEGV, also in sanitizer builds (which would otherwise stop at
 * the null store themselves). */
__attribute__((noinline, no_sanitize("address", "undefined"))) static void fault(void) {
  static int *volatile nowhere; /* NULL */
  *nowhere = 1;
}
#endif

static void migrate(molt__xf_ctx *cx) {
  molt__xf_var(cx, molt__xf_oldsym(cx, "stats", NULL), &stats, &t_stats_ptr, 1);
  molt__xf_var(cx, molt__xf_oldsym(cx, "greeting", NULL), &greeting, &t_str, 1);
  molt__xf_var(cx, molt__xf_oldsym(cx, "workers", NULL), workers, &t_worker, 2);
  molt__xf_var(cx, molt__xf_oldsym(cx, "progress", "server.c"), (void *)progress, &t_long,
               2);
  molt__xf_run(cx);
#ifdef FAULT_IN_MIGRATE
  /* After real work (a new struct stats allocated, pointers written): the
   * abort must undo all of it. */
  fault();
#endif
  molt__xf_local(cx, "worker_main", "count", &t_counter);
  molt__xf_local(cx, "probe", "scratch", &t_long);
}

MOLT_EXTERN const molt__program_info molt__program = {MOLT__PROGRAM_ABI, 0, FROM_BUILD_ID,
                                                      migrate};
#endif
