/* Sessions, version 2 as a hot patch: a session is locked after
 * MAX_FAILURES wrong passwords.  Upstream added `int failures;` to struct
 * session; a hot patch cannot change the struct, so the field is shadow
 * data (guide section 6). */
#include <stdlib.h>

#include <molt.h>

#include "session.h"

#define MAX_FAILURES 3

/* The added field.  The id stays the same in every later patch that
 * carries this field. */
#define SESSION_FAILURES 0x5e5510f1ull
struct session_failures {
  int failures;
};

int session_password(int user) { return user * 7 + 1; }

MOLT_UPDATABLE struct session *session_open(uint64_t id, int user) {
  struct session *s = calloc(1, sizeof *s);
  if (!s)
    return NULL;
  s->id = id;
  s->user = user;
  /* The new session gets the field (zero failures).  attach, not alloc: a
   * session freed by the old session_close left its field behind, and this
   * one may have its address. */
  if (!molt_shadow_attach(s, SESSION_FAILURES, sizeof(struct session_failures), NULL,
                          NULL, NULL)) {
    free(s); /* out of memory: as when calloc fails */
    return NULL;
  }
  return s;
}

MOLT_UPDATABLE int session_login(struct session *s, int password) {
  /* NULL: the session was opened before the patch; it keeps the old
   * behaviour (its earlier failures were never counted). */
  struct session_failures *f = molt_shadow_get(s, SESSION_FAILURES);
  s->requests++;
  if (f && f->failures >= MAX_FAILURES)
    return LOGIN_LOCKED;
  if (password == session_password(s->user)) {
    s->authed = 1;
    return LOGIN_OK;
  }
  if (f)
    f->failures++;
  return LOGIN_BAD;
}

MOLT_UPDATABLE void session_close(struct session *s) {
  molt_shadow_free(s, SESSION_FAILURES, NULL);
  free(s);
}
