/* The callee of the function-call benchmark as a user writes it: moltcc
 * --molt-updatable=all makes it updatable (see fcall_target.c). */
__attribute__((noinline)) int target(int *p) { return *p; }
