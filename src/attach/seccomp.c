/* Whether the target's seccomp filters let molt run its system calls in
 * it.  A thread under a filter that refuses one of them would see it fail
 * (SECCOMP_RET_ERRNO), receive SIGSYS (TRAP), or be killed with its
 * process (KILL) -- so the answer must be known before the call is run,
 * not learnt from it.  molt reads the thread's filters
 * (PTRACE_SECCOMP_GET_FILTER: the thread stopped by molt, molt with
 * CAP_SYS_ADMIN) and runs each one, classic BPF, on the seccomp_data the
 * kernel would build for each planned call; any answer but ALLOW or LOG
 * refuses the attach with nothing done.  A thread in strict mode, or
 * under filters molt may not read, is refused as well.
 *
 * Memory-deny-write-execute, as systemd's filter or the kernel's
 * PR_SET_MDWE, refuses mappings both writable and executable and making
 * a mapping executable later; the staged code is mapped readable and
 * executable from the start, never writable in the target (molt writes it
 * through the memfd from outside), so both let the attach through -- the
 * filter's verdict on the actual calls is what counts. */
#include "attach/internal.h"

#include <errno.h>
#include <linux/audit.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/ptrace.h>
#include <sys/syscall.h>

#ifndef PTRACE_SECCOMP_GET_FILTER
#define PTRACE_SECCOMP_GET_FILTER 0x420c
#endif

#define VERDICT_BAD 0u /* what a filter that cannot be run counts as: KILL */

/* Runs one classic BPF program (the kernel checked it when it was
 * installed: every jump lands inside, it ends with a return) on d. */
static uint32_t run(const struct sock_filter *f, size_t n, const struct seccomp_data *d) {
  uint32_t a = 0, x = 0, mem[BPF_MEMWORDS] = {0};
  for (size_t pc = 0; pc < n; pc++) {
    const struct sock_filter *in = &f[pc];
    uint32_t k = in->k;
    uint32_t src = BPF_SRC(in->code) == BPF_X ? x : k;
    switch (BPF_CLASS(in->code)) {
    case BPF_LD:
      if (BPF_MODE(in->code) == BPF_ABS) {
        if (k % 4 || k > sizeof *d - 4)
          return VERDICT_BAD;
        memcpy(&a, (const char *)d + k, 4);
      } else if (BPF_MODE(in->code) == BPF_LEN) {
        a = sizeof *d;
      } else if (BPF_MODE(in->code) == BPF_IMM) {
        a = k;
      } else if (BPF_MODE(in->code) == BPF_MEM && k < BPF_MEMWORDS) {
        a = mem[k];
      } else {
        return VERDICT_BAD;
      }
      break;
    case BPF_LDX:
      if (BPF_MODE(in->code) == BPF_IMM)
        x = k;
      else if (BPF_MODE(in->code) == BPF_LEN)
        x = sizeof *d;
      else if (BPF_MODE(in->code) == BPF_MEM && k < BPF_MEMWORDS)
        x = mem[k];
      else
        return VERDICT_BAD;
      break;
    case BPF_ST:
    case BPF_STX:
      if (k >= BPF_MEMWORDS)
        return VERDICT_BAD;
      mem[k] = BPF_CLASS(in->code) == BPF_ST ? a : x;
      break;
    case BPF_ALU:
      switch (BPF_OP(in->code)) {
      case BPF_ADD:
        a += src;
        break;
      case BPF_SUB:
        a -= src;
        break;
      case BPF_MUL:
        a *= src;
        break;
      case BPF_DIV:
        if (!src)
          return VERDICT_BAD;
        a /= src;
        break;
      case BPF_MOD:
        if (!src)
          return VERDICT_BAD;
        a %= src;
        break;
      case BPF_OR:
        a |= src;
        break;
      case BPF_AND:
        a &= src;
        break;
      case BPF_XOR:
        a ^= src;
        break;
      case BPF_LSH:
        a = src < 32 ? a << src : 0;
        break;
      case BPF_RSH:
        a = src < 32 ? a >> src : 0;
        break;
      case BPF_NEG:
        a = -a;
        break;
      default:
        return VERDICT_BAD;
      }
      break;
    case BPF_JMP: {
      bool taken;
      switch (BPF_OP(in->code)) {
      case BPF_JA:
        pc += k;
        continue;
      case BPF_JEQ:
        taken = a == src;
        break;
      case BPF_JGT:
        taken = a > src;
        break;
      case BPF_JGE:
        taken = a >= src;
        break;
      case BPF_JSET:
        taken = (a & src) != 0;
        break;
      default:
        return VERDICT_BAD;
      }
      pc += taken ? in->jt : in->jf;
      break;
    }
    case BPF_RET:
      return BPF_RVAL(in->code) == BPF_K ? k : a;
    case BPF_MISC:
      if (BPF_MISCOP(in->code) == BPF_TAX)
        x = a;
      else
        a = x;
      break;
    default:
      return VERDICT_BAD;
    }
  }
  return VERDICT_BAD;
}

static const char *call_name(const attach_call *c, char *buf, size_t len) {
  switch (c->nr) {
  case SYS_memfd_create:
    return "memfd_create";
  case SYS_mmap:
    snprintf(buf, len, "mmap of a shared file mapping with PROT_%s",
             c->args[2] & PROT_EXEC    ? "READ|PROT_EXEC"
             : c->args[2] & PROT_WRITE ? "READ|PROT_WRITE"
             : c->args[2] & PROT_READ  ? "READ"
                                       : "NONE");
    return buf;
  case SYS_munmap:
    return "munmap";
  case SYS_close:
    return "close";
  default:
    snprintf(buf, len, "system call %ld", c->nr);
    return buf;
  }
}

/* What the filter's verdict v does to `call`, in words. */
static void describe(uint32_t v, const char *call, char *buf, size_t len) {
  const char *e = strerrorname_np((int)(v & SECCOMP_RET_DATA));
  switch (v & SECCOMP_RET_ACTION_FULL) {
  case SECCOMP_RET_ERRNO:
    snprintf(buf, len, "refuses %s (%s)", call, e ? e : "an error");
    break;
  case SECCOMP_RET_TRAP:
    snprintf(buf, len, "answers %s with SIGSYS", call);
    break;
  case SECCOMP_RET_TRACE:
    snprintf(buf, len, "hands %s to a seccomp tracer", call);
    break;
  case SECCOMP_RET_USER_NOTIF:
    snprintf(buf, len, "hands %s to a user-space supervisor", call);
    break;
  default:
    snprintf(buf, len, "kills the process on %s", call);
    break;
  }
}

int molt__seccomp_check(pid_t pid, pid_t tid, uint64_t insn, const attach_call *calls,
                        size_t n, char *err, size_t errlen) {
  char path[96], line[256];
  snprintf(path, sizeof path, "/proc/%d/task/%d/status", (int)pid, (int)tid);
  FILE *f = fopen(path, "re");
  int mode = 0;
  while (f && fgets(line, sizeof line, f))
    sscanf(line, "Seccomp: %d", &mode);
  if (f)
    fclose(f);
  if (mode == 0)
    return 0;
  if (mode == SECCOMP_MODE_STRICT) {
    molt__errmsg(
        err, errlen,
        "thread %d of process %d runs in seccomp strict mode (only read, write, "
        "exit and sigreturn): molt attach cannot run the system calls that stage "
        "a patch there; nothing was changed",
        (int)tid, (int)pid);
    return MOLT_ENOTSUP;
  }
  int rc = 0;
  for (unsigned long index = 0; rc == 0; index++) {
    long count = ptrace(PTRACE_SECCOMP_GET_FILTER, tid, (void *)index, NULL);
    if (count < 0 && errno == ENOENT)
      break; /* past the oldest filter */
    if (count <= 0) {
      molt__errmsg(
          err, errlen,
          "process %d runs under a seccomp filter molt cannot read (%s; it needs "
          "CAP_SYS_ADMIN): it cannot tell whether the filter lets it stage the "
          "patch (a refused call may kill the process); nothing was changed",
          (int)pid, strerror(errno));
      return MOLT_EPERM;
    }
    struct sock_filter *prog = calloc((size_t)count, sizeof *prog);
    if (!prog)
      return MOLT_ENOMEM;
    if (ptrace(PTRACE_SECCOMP_GET_FILTER, tid, (void *)index, prog) != count) {
      free(prog);
      molt__errmsg(err, errlen, "cannot read the seccomp filter of thread %d: %s",
                   (int)tid, strerror(errno));
      return MOLT_EIO;
    }
    for (size_t i = 0; i < n && rc == 0; i++) {
      struct seccomp_data d;
      memset(&d, 0, sizeof d);
      d.nr = (int)calls[i].nr;
      d.arch = AUDIT_ARCH_X86_64;
      /* the kernel reports the ip after the system call instruction */
      d.instruction_pointer = insn + ATTACH_SYSCALL_LEN;
      memcpy(d.args, calls[i].args, sizeof d.args);
      uint32_t v = run(prog, (size_t)count, &d);
      uint32_t action = v & SECCOMP_RET_ACTION_FULL;
      if (action == SECCOMP_RET_ALLOW || action == SECCOMP_RET_LOG)
        continue;
      char name[96], what[200];
      describe(v, call_name(&calls[i], name, sizeof name), what, sizeof what);
      bool exec = calls[i].nr == SYS_memfd_create ||
                  (calls[i].nr == SYS_mmap && (calls[i].args[2] & PROT_EXEC));
      molt__errmsg(err, errlen,
                   "process %d runs under a seccomp filter that %s, which molt attach "
                   "runs in it to stage the patch; nothing was changed: %s",
                   (int)pid, what,
                   exec ? "the process may not gain new code (a filter such as "
                          "SystemCallFilter= or a container profile); restart it with "
                          "memfd_create and executable mappings allowed, or update it "
                          "by a full update"
                        : "restart it with that call allowed");
      rc = MOLT_ENOTSUP;
    }
    free(prog);
  }
  return rc;
}
