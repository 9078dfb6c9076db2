/* A static of the program named like a libc function: a patch that calls
 * the library's atol must not be bound to it. */
__attribute__((used, noinline)) static long atol(const char *s) {
  (void)s;
  return 7777;
}
long statics_marker(void) { return atol(""); }
