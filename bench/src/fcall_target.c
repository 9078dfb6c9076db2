/* The callee of the function-call benchmark (PSU 5.2.1): it dereferences a
 * pointer and returns the value.  It lives in its own translation unit so
 * that no compiler can inline it, prove it pure or hoist it out of the loop
 * (without LTO a call into another TU is opaque), at every -O level; the
 * noinline of the thesis is kept for the plain build as well.
 *
 * One file, one variant per build (-DVARIANT_...):
 *   PLAIN        a direct call (the baseline)
 *   MOLT         updatable through molt.h's manual interface (MOLT_FUNCTION)
 *   PROTO_LEAN, PROTO_HP, PROTO_TAIL, PROTO_SITE, PROTO_PTR, PROTO_JMP   fast-path
 *                prototypes (proto/molt_proto.h; PROTO_SITE and PROTO_PTR go with
 *                fcall_main.c -DCALLSITE / -DCALLPTR)
 * The moltcc build compiles fcall_target_cc.c instead (moltcc does the
 * rewriting itself). */
#if defined(VARIANT_PLAIN)
__attribute__((noinline)) int target(int *p) { return *p; }
#elif defined(VARIANT_MOLT)
#include "molt.h"
MOLT_FUNCTION(int, target, (int *p), (p)) { return *p; }
#elif defined(VARIANT_PROTO_LEAN)
#include "molt_proto.h"
MOLT_PROTO_LEAN_FUNCTION(int, target, (int *p), (p)) { return *p; }
#elif defined(VARIANT_PROTO_HP)
#include "molt_proto.h"
MOLT_PROTO_HP_FUNCTION(int, target, (int *p), (p)) { return *p; }
#elif defined(VARIANT_PROTO_TAIL)
#include "molt_proto.h"
MOLT_PROTO_TAIL_FUNCTION(int, target, (int *p), (p)) { return *p; }
#elif defined(VARIANT_PROTO_SITE)
/* The callee keeps a stable entry (for &target); the loop calls through
 * MOLT_PROTO_SITE_CALL (fcall_main.c -DCALLSITE). */
#include "molt_proto.h"
MOLT_PROTO_TAIL_FUNCTION(int, target, (int *p), (p)) { return *p; }
const uint32_t *const target__molt_indexp = &target__molt_desc.index;
#elif defined(VARIANT_PROTO_PTR)
/* The loop calls through one global pointer per function (fcall_main.c
 * -DCALLPTR); the stable entry stays for &target. */
#include "molt_proto.h"
MOLT_PROTO_TAIL_FUNCTION(int, target, (int *p), (p)) { return *p; }
int (*target__molt_ptr)(int *) = target__molt_v0;
#elif defined(VARIANT_PROTO_JMP)
/* The stable entry is one direct `jmp` to the current version, which an
 * update would rewrite (text patching, as POLUS/kpatch do at function
 * entries): the floor of a code-patching design.  Nothing is patched here. */
__attribute__((noinline, used)) static int target__molt_v0(int *p) { return *p; }
__asm__(".text\n.globl target\n.type target, @function\n.p2align 4\n"
        "target:\n\tjmp target__molt_v0\n.size target, .-target\n");
#else
#error "define VARIANT_PLAIN, VARIANT_MOLT or VARIANT_PROTO_*"
#endif
