/* Sessions of the test server (tests/shadow/test_shadow_e2e.py). */
#ifndef SESSION_H
#define SESSION_H
#include <stdint.h>

struct session {
  uint64_t id;
  int user;
  int authed;
  int requests;
};

/* Login replies. */
#define LOGIN_BAD 0
#define LOGIN_OK 1
#define LOGIN_LOCKED (-1)

struct session *session_open(uint64_t id, int user);
int session_login(struct session *s, int password);
void session_close(struct session *s);
/* The password of `user` (what a client that knows it sends). */
int session_password(int user);

#endif
