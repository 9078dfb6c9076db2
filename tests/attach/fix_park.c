/* The attach patch of --check-active's test: park_here() returns at once
 * (the server's version waits while a flag is set). */
long park_here(long n) { return n + 2; }
