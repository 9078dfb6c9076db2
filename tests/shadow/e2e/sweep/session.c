/* Sessions, version 1 again, plus the clean-up of the rolled-back fix:
 * applied once `molt status` shows that the fix is unloaded (no thread can
 * run its code, so nothing uses its shadow data any more), the first
 * session_open frees every SESSION_FAILURES shadow that sessions closed by
 * the old session_close left behind (guide section 6). */
#include <stdatomic.h>
#include <stdlib.h>

#include <molt.h>

#include "session.h"

#define SESSION_FAILURES 0x5e5510f1ull

static atomic_flag swept = ATOMIC_FLAG_INIT;

int session_password(int user) { return user * 7 + 1; }

MOLT_UPDATABLE struct session *session_open(uint64_t id, int user) {
  if (!atomic_flag_test_and_set(&swept))
    molt_shadow_free_all(SESSION_FAILURES, NULL);
  struct session *s = calloc(1, sizeof *s);
  if (!s)
    return NULL;
  s->id = id;
  s->user = user;
  return s;
}

MOLT_UPDATABLE int session_login(struct session *s, int password) {
  s->requests++;
  if (password == session_password(s->user)) {
    s->authed = 1;
    return LOGIN_OK;
  }
  return LOGIN_BAD;
}

MOLT_UPDATABLE void session_close(struct session *s) { free(s); }
