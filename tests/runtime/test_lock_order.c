/*
 * The lock-order check (src/runtime/base/lock.c): with MOLT_LOCK_CHECK,
 * taking a lock whose rank in the lock table (base.h) is not above every
 * lock the thread holds is reported -- refusing state with a reason naming
 * both locks, a `fail` log entry, molt__lock_violations() -- and the program
 * goes on.  Built from the base layer's sources with the check on, whatever
 * the build's MOLT_LOCK_CHECK.
 */
#include "../harness/check.h"
#include "base/base.h"

#include <pthread.h>
#include <stdio.h>
#include <string.h>

/* Locks of the table's ranks (not the runtime's own instances, which are
 * static in their files: the check is by rank). */
static molt__lock op = MOLT__LOCK_INIT(op), bar = MOLT__LOCK_INIT(bar),
                  rt = MOLT__LOCK_INIT(rt), reg = MOLT__LOCK_INIT(reg),
                  req = MOLT__LOCK_INIT(req), log_l = MOLT__LOCK_INIT(log);
/* Two shard locks of shadow data (one rank for all 32), and its reclaim. */
static molt__lock shard_a = MOLT__LOCK_INIT(shadow), shard_b = MOLT__LOCK_INIT(shadow),
                  reclaim = MOLT__LOCK_INIT(shadow_reclaim);

static bool log_has(const char *event, const char *text) {
  molt__buf b;
  molt__buf_init(&b);
  molt__log_dump(&b);
  bool found = false;
  for (char *line = b.data; line && *line;) {
    char *end = strchr(line, '\n');
    if (end)
      *end = '\0';
    char ev[32];
    /* log <seq> <time> <event> ... */
    if (sscanf(line, "log\t%*s\t%*s\t%31[^\t]", ev) == 1 && strcmp(ev, event) == 0 &&
        strstr(line, text))
      found = true;
    line = end ? end + 1 : NULL;
  }
  molt__buf_free(&b);
  return found;
}

/* Another thread holds rt while the main thread takes op. */
static pthread_barrier_t both;

static void *hold_rt(void *arg) {
  (void)arg;
  molt__lock_acquire(&rt);
  pthread_barrier_wait(&both); /* rt is held */
  pthread_barrier_wait(&both); /* the main thread took and released op */
  molt__lock_release(&rt);
  return NULL;
}

int main(void) {
  CHECK(!strcmp(molt__lock_name(MOLT__LOCK_RANK_op), "op_lock") &&
            !strcmp(molt__lock_name(MOLT__LOCK_RANK_log), "log_lock"),
        "lock names from the table");
  CHECK(
      !strcmp(molt__lock_name(MOLT__LOCK_RANK_shadow), "shadow_lock") &&
          !strcmp(molt__lock_name(MOLT__LOCK_RANK_shadow_reclaim), "shadow_reclaim_lock"),
      "names of the shadow-data locks");
  CHECK(MOLT__LOCK_RANK_shadow == 0 &&
            MOLT__LOCK_RANK_shadow < MOLT__LOCK_RANK_shadow_reclaim &&
            MOLT__LOCK_RANK_shadow_reclaim < MOLT__LOCK_RANK_op &&
            MOLT__LOCK_RANK_op < MOLT__LOCK_RANK_bar &&
            MOLT__LOCK_RANK_bar < MOLT__LOCK_RANK_prog &&
            MOLT__LOCK_RANK_prog < MOLT__LOCK_RANK_rt &&
            MOLT__LOCK_RANK_rt < MOLT__LOCK_RANK_reg &&
            MOLT__LOCK_RANK_reg < MOLT__LOCK_RANK_req &&
            MOLT__LOCK_RANK_req < MOLT__LOCK_RANK_log,
        "the order of the table");

  /* In order, outermost first: nothing to report. */
  molt__lock_acquire(&op);
  molt__lock_acquire(&bar);
  molt__lock_acquire(&rt);
  molt__lock_acquire(&reg);
  molt__lock_acquire(&log_l);
  molt__lock_release(&log_l);
  molt__lock_release(&reg);
  molt__lock_release(&rt);
  molt__lock_release(&bar);
  molt__lock_release(&op);
  /* A shadow constructor runs under its shard lock and may do what any
   * application thread does: register (reg), molt_apply (req, and in a
   * forked child the lazy start under op), an update point (bar), log. */
  molt__lock_acquire(&shard_a);
  molt__lock_acquire(&op);
  molt__lock_release(&op);
  molt__lock_acquire(&bar);
  molt__lock_release(&bar);
  molt__lock_acquire(&reg);
  molt__lock_release(&reg);
  molt__lock_acquire(&req);
  molt__lock_acquire(&log_l);
  molt__lock_release(&log_l);
  molt__lock_release(&req);
  molt__lock_release(&shard_a);
  /* A reclamation pass after the shard was released; the fork handler's
   * order: a shard, the reclaim lock, then the runtime's. */
  molt__lock_acquire(&reclaim);
  molt__lock_release(&reclaim);
  molt__lock_acquire(&shard_b);
  molt__lock_acquire(&reclaim);
  molt__lock_acquire(&op);
  molt__lock_acquire(&rt);
  molt__lock_release(&rt);
  molt__lock_release(&op);
  molt__lock_release(&reclaim);
  molt__lock_release(&shard_b);
  /* Released locks are forgotten: any single lock, in any sequence. */
  molt__lock_acquire(&rt);
  molt__lock_release(&rt);
  molt__lock_acquire(&op);
  molt__lock_release(&op);
  /* Another thread's locks are not ours. */
  pthread_t t;
  pthread_barrier_init(&both, NULL, 2);
  pthread_create(&t, NULL, hold_rt, NULL);
  pthread_barrier_wait(&both);
  molt__lock_acquire(&op);
  molt__lock_release(&op);
  pthread_barrier_wait(&both);
  pthread_join(t, NULL);
  CHECK(molt__lock_violations() == 0, "%u violations in order", molt__lock_violations());
  CHECK(!molt__refusing(NULL, 0), "not refusing");

  /* The deliberate inversion: op (outermost) taken while holding rt. */
  molt__lock_acquire(&rt);
  molt__lock_acquire(&op);
  molt__lock_release(&op);
  molt__lock_release(&rt);
  CHECK(molt__lock_violations() == 1, "the inversion is counted: %u",
        molt__lock_violations());
  char reason[256] = "";
  CHECK(molt__refusing(reason, sizeof reason), "the runtime refuses updates");
  CHECK(strstr(reason, "op_lock taken while holding rt_lock") != NULL, "reason: %s",
        reason);
  CHECK(log_has("fail", "op_lock taken while holding rt_lock"), "a fail entry is logged");

  /* Under the log lock the report cannot log (it would take that lock
   * again): it is still counted, and nothing deadlocks. */
  molt__lock_acquire(&log_l);
  molt__lock_acquire(&reg);
  molt__lock_release(&reg);
  molt__lock_release(&log_l);
  CHECK(molt__lock_violations() == 2, "the inversion under log_lock is counted: %u",
        molt__lock_violations());

  /* The runtime thread must take no shadow lock: a patch's constructor
   * that calls a shadow writer under op is reported. */
  molt__lock_acquire(&op);
  molt__lock_acquire(&shard_a);
  molt__lock_release(&shard_a);
  molt__lock_release(&op);
  CHECK(molt__lock_violations() == 3, "a shard lock under op is counted: %u",
        molt__lock_violations());
  CHECK(log_has("fail", "shadow_lock taken while holding op_lock"),
        "a fail entry names both");
  /* Two shards at once (same rank) are reported: they could deadlock
   * against a thread that takes them the other way round. */
  molt__lock_acquire(&shard_a);
  molt__lock_acquire(&shard_b);
  molt__lock_release(&shard_b);
  molt__lock_release(&shard_a);
  CHECK(molt__lock_violations() == 4, "two shard locks at once are counted: %u",
        molt__lock_violations());
  /* A shard lock is not taken under the reclaim lock. */
  molt__lock_acquire(&reclaim);
  molt__lock_acquire(&shard_a);
  molt__lock_release(&shard_a);
  molt__lock_release(&reclaim);
  CHECK(molt__lock_violations() == 5, "a shard under the reclaim lock is counted: %u",
        molt__lock_violations());

  /* In a forked child a lock is initialized anew and no longer held. */
  molt__lock_acquire(&rt);
  molt__lock_reinit(&rt);
  molt__lock_acquire(&op);
  molt__lock_release(&op);
  CHECK(molt__lock_violations() == 5, "a reinitialized lock is not held: %u",
        molt__lock_violations());

  if (failures)
    fprintf(stderr, "lock order: %d check(s) failed\n", failures);
  else
    printf("lock order: ok (the inversion was reported: %s)\n", reason);
  return failures ? 1 : 0;
}
