/*
 * kv_commands.c — the command layer of kvstore, version 1.0.
 *
 * One request line in, one reply line out:
 *   GET key          VALUE <value>          | NOT_FOUND
 *   SET key value    OK                     (value: rest of the line)
 *   DEL key          DELETED                | NOT_FOUND
 *   STATS            STATS keys=N gets=N sets=N dels=N hits=N misses=N
 *                          cmds=N conns=N version=V
 *   VERSION          VERSION <version of the command layer>
 *   QUIT             BYE, then the server closes the connection
 *   anything else    ERROR unknown command
 *   bad arguments    ERROR wrong number of arguments | ERROR key too long
 *
 * Every function that runs per request is MOLT_UPDATABLE: the dispatcher,
 * each command handler, the reply formatter and kv_version_string().  A live
 * patch is this file, changed, rebuilt with `moltcc --molt-patch`; see
 * patches/<name>/kv_commands.c for the versions 1.1, 1.2 and 1.3.
 *
 * The small helpers (count, next_word, word_is) are static and not
 * updatable on purpose: they exercise the other half of molt's contract,
 * that a patch's non-updatable callees and its references to this file's
 * static data reach the running program's objects, not copies.
 */
#include "kv.h"

#include <molt.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>

/*
 * The counters reported by STATS.  A static object of this file: a patch of
 * this file must keep counting into this very object (molt resolves the
 * patch's reference to the running instance).  The load generator checks it:
 * counters never go backwards and are never below what one client alone has
 * sent.  relaxed: pure statistics, no other data is published through them.
 */
static struct { atomic_ulong cmds, gets, hits, misses, sets, dels; } stats;

static void count(atomic_ulong *c) {
  atomic_fetch_add_explicit(c, 1, memory_order_relaxed);
}

static unsigned long counted(atomic_ulong *c) {
  return atomic_load_explicit(c, memory_order_relaxed);
}

/* Splits the next space-separated word off [*p, end): returns its length
 * (0 when there is none) and its start in *word; *p moves past it. */
static size_t next_word(char **p, char *end, char **word) {
  char *s = *p;
  while (s < end && *s == ' ')
    s++;
  char *e = s;
  while (e < end && *e != ' ')
    e++;
  *word = s;
  *p = e;
  return (size_t)(e - s);
}

/* Command names are case-insensitive. */
static int word_is(const char *w, size_t n, const char *name) {
  return strlen(name) == n && strncasecmp(w, name, n) == 0;
}

MOLT_UPDATABLE const char *kv_version_string(void) { return "1.0"; }

MOLT_UPDATABLE void kv_format_reply(struct kv_out *out, const char *status,
                                    const char *payload, size_t plen) {
  kv_out_append(out, status, strlen(status));
  if (payload) {
    kv_out_append(out, " ", 1);
    kv_out_append(out, payload, plen);
  }
  kv_out_append(out, "\n", 1);
}

MOLT_UPDATABLE static int reply_error(struct kv_out *out, const char *msg) {
  kv_format_reply(out, "ERROR", msg, strlen(msg));
  return 0;
}

/* Reads the single key argument of GET/DEL; replies with the error and
 * returns 0 when the arguments are wrong. */
MOLT_UPDATABLE static size_t one_key(char *p, char *end, char **key, struct kv_out *out) {
  char *extra;
  size_t klen = next_word(&p, end, key);
  if (klen == 0 || next_word(&p, end, &extra) != 0) {
    reply_error(out, "wrong number of arguments");
    return 0;
  }
  if (klen > KV_MAX_KEY) {
    reply_error(out, "key too long");
    return 0;
  }
  return klen;
}

MOLT_UPDATABLE static int cmd_get(struct kv_session *s, char *p, char *end,
                                  struct kv_out *out) {
  char *key;
  size_t klen = one_key(p, end, &key, out);
  if (!klen)
    return 0;
  count(&stats.gets);
  char val[KV_MAX_LINE];
  ssize_t n = kv_store_get(s->store, key, klen, val, sizeof val);
  if (n < 0) {
    count(&stats.misses);
    kv_format_reply(out, "NOT_FOUND", NULL, 0);
    return 0;
  }
  count(&stats.hits);
  kv_format_reply(out, "VALUE", val, (size_t)n);
  return 0;
}

MOLT_UPDATABLE static int cmd_set(struct kv_session *s, char *p, char *end,
                                  struct kv_out *out) {
  char *key;
  size_t klen = next_word(&p, end, &key);
  /* The value is the rest of the line after the key and its separating
   * spaces; it may contain spaces itself. */
  while (p < end && *p == ' ')
    p++;
  if (klen == 0 || p == end)
    return reply_error(out, "wrong number of arguments");
  if (klen > KV_MAX_KEY)
    return reply_error(out, "key too long");
  count(&stats.sets);
  if (kv_store_set(s->store, key, klen, p, (size_t)(end - p)) < 0)
    return reply_error(out, "out of memory");
  kv_format_reply(out, "OK", NULL, 0);
  return 0;
}

MOLT_UPDATABLE static int cmd_del(struct kv_session *s, char *p, char *end,
                                  struct kv_out *out) {
  char *key;
  size_t klen = one_key(p, end, &key, out);
  if (!klen)
    return 0;
  /*
   * BUG in 1.0 (fixed live by patches/fix-del): kv_store_del() returns 0
   * for a missing key, not -1 like kv_store_get(), so this test never
   * fires: DEL of a missing key answers DELETED and counts a delete.
   */
  if (kv_store_del(s->store, key, klen) < 0) {
    kv_format_reply(out, "NOT_FOUND", NULL, 0);
    return 0;
  }
  count(&stats.dels);
  kv_format_reply(out, "DELETED", NULL, 0);
  return 0;
}

MOLT_UPDATABLE static int cmd_stats(struct kv_session *s, char *p, char *end,
                                    struct kv_out *out) {
  char *extra;
  if (next_word(&p, end, &extra))
    return reply_error(out, "wrong number of arguments");
  char buf[512];
  int n = snprintf(buf, sizeof buf,
                   "keys=%zu gets=%lu sets=%lu dels=%lu hits=%lu misses=%lu "
                   "cmds=%lu conns=%ld version=%s",
                   kv_store_count(s->store), counted(&stats.gets), counted(&stats.sets),
                   counted(&stats.dels), counted(&stats.hits), counted(&stats.misses),
                   counted(&stats.cmds),
                   atomic_load_explicit(&kv_active_connections, memory_order_relaxed),
                   kv_version_string());
  kv_format_reply(out, "STATS", buf, (size_t)n);
  return 0;
}

MOLT_UPDATABLE static int cmd_version(struct kv_session *s, char *p, char *end,
                                      struct kv_out *out) {
  char *extra;
  if (next_word(&p, end, &extra))
    return reply_error(out, "wrong number of arguments");
  /* Copied into the reply at once: the string is a literal of whichever
   * patch answered, and a patch is unloaded once no thread runs its code,
   * so the pointer must not be kept beyond this request. */
  const char *v = kv_version_string();
  kv_format_reply(out, "VERSION", v, strlen(v));
  return 0;
}

MOLT_UPDATABLE static int cmd_quit(struct kv_session *s, char *p, char *end,
                                   struct kv_out *out) {
  kv_format_reply(out, "BYE", NULL, 0);
  return 1;
}

MOLT_UPDATABLE int kv_dispatch(struct kv_session *s, char *line, size_t len,
                               struct kv_out *out) {
  char *p = line, *end = line + len, *cmd;
  size_t clen = next_word(&p, end, &cmd);
  count(&stats.cmds);
  if (word_is(cmd, clen, "GET"))
    return cmd_get(s, p, end, out);
  if (word_is(cmd, clen, "SET"))
    return cmd_set(s, p, end, out);
  if (word_is(cmd, clen, "DEL"))
    return cmd_del(s, p, end, out);
  if (word_is(cmd, clen, "STATS"))
    return cmd_stats(s, p, end, out);
  if (word_is(cmd, clen, "VERSION"))
    return cmd_version(s, p, end, out);
  if (word_is(cmd, clen, "QUIT"))
    return cmd_quit(s, p, end, out);
  return reply_error(out, "unknown command");
}
