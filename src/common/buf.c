/* A growable byte buffer.  Allocation failures are remembered (oom) instead
 * of reported at every call, so callers build a response in straight-line
 * code and check once; the runtime must never abort on ENOMEM. */
#include "common/common.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void molt__buf_init(molt__buf *b) { memset(b, 0, sizeof *b); }

void molt__buf_free(molt__buf *b) {
  free(b->data);
  molt__buf_init(b);
}

static bool reserve(molt__buf *b, size_t extra) {
  if (b->oom)
    return false;
  if (extra > SIZE_MAX / 2 - b->len) {
    b->oom = true;
    return false;
  }
  size_t need = b->len + extra + 1; /* keep room for a terminating NUL */
  if (need <= b->cap)
    return true;
  size_t cap = b->cap ? b->cap : 256;
  while (cap < need)
    cap *= 2;
  char *p = realloc(b->data, cap);
  if (!p) {
    b->oom = true;
    return false;
  }
  b->data = p;
  b->cap = cap;
  return true;
}

void molt__buf_add(molt__buf *b, const void *p, size_t n) {
  if (!reserve(b, n))
    return;
  if (n)
    memcpy(b->data + b->len, p, n);
  b->len += n;
  b->data[b->len] = '\0';
}

void molt__buf_printf(molt__buf *b, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  char small[256];
  va_list ap2;
  va_copy(ap2, ap);
  int n = vsnprintf(small, sizeof small, fmt, ap);
  va_end(ap);
  if (n < 0) {
    va_end(ap2);
    return;
  }
  if ((size_t)n < sizeof small) {
    molt__buf_add(b, small, (size_t)n);
  } else if (reserve(b, (size_t)n)) {
    vsnprintf(b->data + b->len, (size_t)n + 1, fmt, ap2);
    b->len += (size_t)n;
  }
  va_end(ap2);
}

void molt__buf_record(molt__buf *b, int nfields, const char *const *fields) {
  for (int i = 0; i < nfields; i++) {
    if (i)
      molt__buf_add(b, "\t", 1);
    const char *f = fields[i] ? fields[i] : "";
    for (const char *p = f; *p; p++) {
      switch (*p) {
      case '\t':
        molt__buf_add(b, "\\t", 2);
        break;
      case '\n':
        molt__buf_add(b, "\\n", 2);
        break;
      case '\\':
        molt__buf_add(b, "\\\\", 2);
        break;
      default:
        molt__buf_add(b, p, 1);
      }
    }
  }
  molt__buf_add(b, "\n", 1);
}

void molt__buf_pair(molt__buf *b, const char *key, const char *value) {
  const char *f[] = {key, value};
  molt__buf_record(b, 2, f);
}

void molt__errmsg(char *dst, size_t len, const char *fmt, ...) {
  if (!dst || !len)
    return;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(dst, len, fmt, ap);
  va_end(ap);
}
