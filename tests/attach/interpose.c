/* A library the attach tests preload into the server (LD_PRELOAD): its
 * atol comes before the C library's in the loader's order, so both the
 * program and an attach patch that call atol get this one.  Built twice:
 * the copy the server maps, and a different one (INTERPOSE_OTHER) that
 * replaces the file on disk afterwards -- molt must read the mapped one. */
#include <stdlib.h>

#ifdef INTERPOSE_OTHER
long interpose_padding(long n) { return n * 7 + labs(n - 3) + 11; }
#define ADDEND 2000
#else
#define ADDEND 1000
#endif

long atol(const char *s) { return strtol(s, NULL, 10) + ADDEND; }
