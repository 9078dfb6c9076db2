/* The architecture axis of attach, x86-64: decoding a function's entry
 * with capstone, the `jmp rel32` written there, and the registers of a
 * system call run on a stopped thread.
 *
 * The new version replaces the old function whole: the rewritten
 * instructions are never executed again (no trampoline back into the old
 * body), so they need no relocation, RIP-relative or not.  What must not
 * happen is that anything lands inside the jump: a thread stopped there
 * (attach.c checks every thread's ip), a return address there (a call
 * among the rewritten instructions, refused here), a branch into them
 * (every direct branch of the function is scanned; indirect branches --
 * jump tables -- cannot be seen and are presumed not to target a
 * function's first instructions). */
#include "attach/internal.h"

#include <capstone/capstone.h>
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#if !defined(__x86_64__)
#error "molt attach is implemented for x86-64 only"
#endif

static bool is_endbr64(const uint8_t *p, size_t n) {
  return n >= 4 && p[0] == 0xf3 && p[1] == 0x0f && p[2] == 0x1e && p[3] == 0xfa;
}

/* capstone is loaded at its first use (dlopen), not when molt starts: its
 * library (every architecture's tables) carries ~77,000 relocations that
 * the loader applied at every exec of molt -- ~1 ms of CPU and ~370 page
 * faults, half of what molt ran before main, at the normal priority, before
 * `molt attach` could raise its own (molt__attach_raise; measured: 2.3 ms
 * on a CPU from fork to the raise with capstone linked, 1.1 ms without).
 * Among a crowd of busy threads every extra slice molt needs there costs a
 * turn behind them.  Loaded here, the cost falls inside the run, at the
 * raised priority, and the commands that never decode never pay it. */
static struct {
  __typeof__(&cs_open) open_handle;
  __typeof__(&cs_option) set_option;
  __typeof__(&cs_close) close_handle;
  __typeof__(&cs_malloc) alloc_insn;
  __typeof__(&cs_free) free_insn;
  __typeof__(&cs_disasm_iter) decode;
  __typeof__(&cs_insn_group) in_group;
} cs;
static pthread_once_t cs_once = PTHREAD_ONCE_INIT;
static char cs_missing[300]; /* why it could not be loaded; "" loaded */

static void *cs_symbol(void *lib, const char *name) {
  void *f = dlsym(lib, name);
  if (!f && !cs_missing[0])
    snprintf(cs_missing, sizeof cs_missing, "%s has no %s", MOLT__CAPSTONE_SONAME, name);
  return f;
}

static void load_capstone(void) {
  void *lib = dlopen(MOLT__CAPSTONE_SONAME, RTLD_NOW | RTLD_LOCAL);
  if (!lib) {
    const char *why = dlerror();
    snprintf(cs_missing, sizeof cs_missing, "%s", why ? why : MOLT__CAPSTONE_SONAME);
    return;
  }
  cs.open_handle = (__typeof__(cs.open_handle))cs_symbol(lib, "cs_open");
  cs.set_option = (__typeof__(cs.set_option))cs_symbol(lib, "cs_option");
  cs.close_handle = (__typeof__(cs.close_handle))cs_symbol(lib, "cs_close");
  cs.alloc_insn = (__typeof__(cs.alloc_insn))cs_symbol(lib, "cs_malloc");
  cs.free_insn = (__typeof__(cs.free_insn))cs_symbol(lib, "cs_free");
  cs.decode = (__typeof__(cs.decode))cs_symbol(lib, "cs_disasm_iter");
  cs.in_group = (__typeof__(cs.in_group))cs_symbol(lib, "cs_insn_group");
  /* kept loaded for the rest of molt's run (a missing symbol: unusable) */
}

static int open_cs(csh *h, char *err, size_t errlen) {
  pthread_once(&cs_once, load_capstone);
  if (cs_missing[0]) {
    molt__errmsg(err, errlen, "cannot load the x86-64 decoder (capstone): %s",
                 cs_missing);
    return MOLT_EINTERNAL;
  }
  if (cs.open_handle(CS_ARCH_X86, CS_MODE_64, h) != CS_ERR_OK) {
    molt__errmsg(err, errlen, "cannot start the x86-64 decoder (capstone)");
    return MOLT_EINTERNAL;
  }
  cs.set_option(*h, CS_OPT_DETAIL, CS_OPT_ON);
  return 0;
}

/* The target of a direct branch (jmp, jcc, call, loop, jrcxz): true with
 * *target, false for anything else (indirect branches included). */
static bool direct_target(csh h, const cs_insn *in, uint64_t *target) {
  if (!cs.in_group(h, in, CS_GRP_JUMP) && !cs.in_group(h, in, CS_GRP_CALL))
    return false;
  const cs_x86 *x = &in->detail->x86;
  if (x->op_count != 1 || x->operands[0].type != X86_OP_IMM)
    return false;
  *target = (uint64_t)x->operands[0].imm;
  return true;
}

static int scan_branches(csh h, const uint8_t *code, size_t size, uint64_t addr,
                         uint64_t lo, uint64_t hi, char *err, size_t errlen) {
  cs_insn *in = cs.alloc_insn(h);
  if (!in)
    return MOLT_ENOMEM;
  const uint8_t *p = code;
  size_t left = size;
  uint64_t pc = addr;
  int rc = 0;
  while (left > 0) {
    if (!cs.decode(h, &p, &left, &pc, in)) {
      /* Data or padding the decoder does not know: skip one byte, as a
       * linear sweep does.  A branch hidden behind it is not seen; the
       * functions gcc emits have no data in their text. */
      p++;
      left--;
      pc++;
      continue;
    }
    uint64_t t;
    if (direct_target(h, in, &t) && t > lo && t < hi) {
      molt__errmsg(err, errlen,
                   "the %s at +0x%llx branches into the first bytes of the function "
                   "(+0x%llx), which the jump would overwrite",
                   in->mnemonic, (unsigned long long)(in->address - addr),
                   (unsigned long long)(t - lo));
      rc = MOLT_ENOFUNC;
      break;
    }
  }
  cs.free_insn(in, 1);
  return rc;
}

int molt__arch_plan(const uint8_t *code, size_t size, uint64_t addr, attach_site *site,
                    char *err, size_t errlen) {
  size_t skip = is_endbr64(code, size) ? 4 : 0;
  csh h;
  int rc = open_cs(&h, err, errlen);
  if (rc)
    return rc;
  cs_insn *in = cs.alloc_insn(h);
  if (!in) {
    cs.close_handle(&h);
    return MOLT_ENOMEM;
  }
  const uint8_t *p = code + skip;
  size_t left = size - skip;
  uint64_t pc = addr + skip;
  unsigned len = 0;
  while (rc == 0 && len < ATTACH_JUMP_LEN) {
    if (left == 0) {
      molt__errmsg(err, errlen,
                   "the function is too short for a jump (%zu bytes after its endbr64, "
                   "%d needed)",
                   size - skip, ATTACH_JUMP_LEN);
      rc = MOLT_ENOFUNC;
      break;
    }
    if (!cs.decode(h, &p, &left, &pc, in)) {
      molt__errmsg(err, errlen, "cannot decode the instruction at +0x%x",
                   (unsigned)(skip + len));
      rc = MOLT_ENOFUNC;
      break;
    }
    len += in->size;
    /* A return from the callee would land inside the jump. */
    if (cs.in_group(h, in, CS_GRP_CALL) && len < ATTACH_JUMP_LEN) {
      molt__errmsg(err, errlen,
                   "a call at +0x%x returns into the bytes the jump would overwrite",
                   (unsigned)(skip + len - in->size));
      rc = MOLT_ENOFUNC;
    }
    /* Code after an unconditional end of the function's first block is
     * another block, maybe a branch target: the function is too short. */
    if (rc == 0 && len < ATTACH_JUMP_LEN &&
        (cs.in_group(h, in, CS_GRP_RET) || in->id == X86_INS_JMP ||
         in->id == X86_INS_UD2 || in->id == X86_INS_HLT)) {
      molt__errmsg(err, errlen,
                   "the function is too short for a jump: it ends after %u bytes (%d "
                   "needed)",
                   len, ATTACH_JUMP_LEN);
      rc = MOLT_ENOFUNC;
    }
  }
  if (rc == 0 && len > MOLT__ATTACH_MAX_BYTES) {
    molt__errmsg(err, errlen, "the first instructions are too long (%u bytes)", len);
    rc = MOLT_ENOFUNC;
  }
  cs.free_insn(in, 1);
  if (rc == 0) {
    site->at = addr + skip;
    site->len = len;
    /* A branch to the entry itself (a loop back to the top) is fine: it
     * takes the jump, as a call does. */
    rc = scan_branches(h, code, size, addr, site->at, site->at + len, err, errlen);
  }
  cs.close_handle(&h);
  return rc;
}

int molt__arch_check_branches(const uint8_t *code, size_t size, uint64_t addr,
                              uint64_t lo, uint64_t hi, char *err, size_t errlen) {
  csh h;
  int rc = open_cs(&h, err, errlen);
  if (rc)
    return rc;
  rc = scan_branches(h, code, size, addr, lo, hi, err, errlen);
  cs.close_handle(&h);
  return rc;
}

bool molt__arch_jump(uint64_t from, uint64_t to, uint8_t *out, unsigned len) {
  int64_t d = (int64_t)(to - (from + ATTACH_JUMP_LEN));
  if (len < ATTACH_JUMP_LEN || d != (int64_t)(int32_t)d)
    return false;
  int32_t rel = (int32_t)d;
  out[0] = 0xe9;
  memcpy(out + 1, &rel, 4);
  memset(out + ATTACH_JUMP_LEN, 0xcc, len - ATTACH_JUMP_LEN);
  return true;
}

bool molt__arch_is_syscall(const uint8_t *p) { return p[0] == 0x0f && p[1] == 0x05; }

bool molt__arch_is_restorer(const uint8_t *p) {
  /* glibc's and musl's __restore_rt: mov $15, %rax; syscall.  x86-64 has
   * no kernel-provided restorer: every handler is installed with one. */
  static const uint8_t restorer[ATTACH_RESTORER_LEN] = {0x48, 0xc7, 0xc0, 0x0f, 0x00,
                                                        0x00, 0x00, 0x0f, 0x05};
  return memcmp(p, restorer, sizeof restorer) == 0;
}

uint64_t molt__arch_ip(const attach_regs *r) { return r->rip; }
uint64_t molt__arch_sp(const attach_regs *r) { return r->rsp; }

void molt__arch_set_syscall(attach_regs *r, uint64_t insn, long nr, const uint64_t a[6]) {
  r->rip = insn;
  r->rax = (uint64_t)nr;
  /* Not inside a system call: the kernel must not "restart" the one the
   * thread was stopped in over ours when it resumes. */
  r->orig_rax = (uint64_t)-1;
  r->rdi = a[0];
  r->rsi = a[1];
  r->rdx = a[2];
  r->r10 = a[3];
  r->r8 = a[4];
  r->r9 = a[5];
}

long molt__arch_syscall_result(const attach_regs *r) { return (long)r->rax; }
long molt__arch_syscall_nr(const attach_regs *r) { return (long)r->orig_rax; }
long molt__arch_syscall_ret(const attach_regs *r) { return (long)r->rax; }

void molt__arch_restart_syscall(attach_regs *r, long nr) {
  r->rax = (uint64_t)nr;
  r->rip -= ATTACH_SYSCALL_LEN;
}

/* A call of fn() on a thread whose registers are r: the stack pointer moves
 * below the 128-byte red zone (a leaf function, e.g. the system call
 * wrapper the thread is stopped in, may keep data there) and below
 * `below`, 16-byte aligned before the return address is pushed, as the
 * ABI wants at a function's entry; the direction flag clear.  Returns
 * where the return address goes (the caller writes it). */
uint64_t molt__arch_prepare_call(attach_regs *r, uint64_t fn, uint64_t below) {
  uint64_t sp = r->rsp - 128;
  if (below < sp)
    sp = below;
  sp = (sp & ~(uint64_t)15) - 8;
  r->rsp = sp;
  r->rip = fn;
  r->rax = 0;
  /* not inside a system call: nothing for the kernel to restart */
  r->orig_rax = (uint64_t)-1;
  r->eflags &= ~(uint64_t)0x400; /* DF */
  return sp;
}

int molt__arch_call_result(const attach_regs *r) { return (int)r->rax; }
