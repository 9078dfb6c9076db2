/* Sessions, version 1: any number of wrong passwords may be tried. */
#include <stdlib.h>

#include <molt.h>

#include "session.h"

int session_password(int user) { return user * 7 + 1; }

MOLT_UPDATABLE struct session *session_open(uint64_t id, int user) {
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
