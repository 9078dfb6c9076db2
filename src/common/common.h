/*
 * common -- the bottom layer: code shared by libmolt, the molt CLI and
 * moltstamp, built once as a static library (libmolt_common.a, position
 * independent).  It rests on the public and ABI headers only (include/).
 * Nothing here prints, exits or aborts: the same code runs inside a host
 * process.  Failures are 0 or a negative MOLT_E* code, with a one-line
 * message where the caller passes an err buffer.
 *
 *   errors.c           the error table (MOLT_ERRNO_MAP) -> names, messages;
 *                      errno -> MOLT_E* (the one mapping)
 *   buf.c              growable text buffer, TSV records, error messages
 *   proc.c             names of processes and threads (/proc/.../comm), where
 *                      a thread is blocked (/proc/self/task/TID/syscall)
 *   sha256.c           SHA-256 (the identity of a loaded file)
 *   elf.c              bounds-checked ELF reader: build-ids, notes, symbols
 *   protocol.c/.h      the control protocol: the table of operations, requests,
 *                      framing, the TSV codec
 *   rules.c            the rule language of shadowed updates (expected
 *                      divergences): parser, patterns
 *   arch/x86_64/jump.h the `jmp rel32` of the stable entries
 *
 * The layers above (src/runtime/base, core, switch, the modes, service, and
 * src/cli) include this header; it includes protocol.h, so this one header
 * is the layer's whole offer.
 */
#ifndef MOLT_COMMON_H
#define MOLT_COMMON_H

/* Code of this layer runs in the CLI and the tools too: molt.h must not
 * emit its module constructor there, which calls into libmolt. */
#ifndef MOLT__NO_AUTO_REGISTER
#define MOLT__NO_AUTO_REGISTER 1
#endif

#include "molt.h"

#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#define MOLT__HIDDEN __attribute__((visibility("hidden")))

/* The object of type `type` whose member `member` is at p. */
#define MOLT__CONTAINER(p, type, member)                                                 \
  ((type *)(void *)((char *)(p)-offsetof(type, member)))

/* ---- errors.c ------------------------------------------------------------*/
/* The MOLT_E* code for a failed system call's errno: ENOENT/ENOTDIR ->
 * ENOENT, EACCES/EPERM -> EPERM, ENOMEM/ENOBUFS -> ENOMEM, else EIO. */
MOLT__HIDDEN int molt__from_errno(int e);

/* ---- buf.c ---------------------------------------------------------------*/
typedef struct molt__buf {
  char *data;
  size_t len, cap;
  bool oom; /* an allocation failed: contents are truncated */
} molt__buf;

MOLT__HIDDEN void molt__buf_init(molt__buf *b);
MOLT__HIDDEN void molt__buf_free(molt__buf *b);
MOLT__HIDDEN void molt__buf_add(molt__buf *b, const void *p, size_t n);
MOLT__HIDDEN void molt__buf_printf(molt__buf *b, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
/* One TSV record: fields separated by tabs, a newline at the end.  Tabs,
 * newlines and backslashes inside a field are escaped as \t \n \\. */
MOLT__HIDDEN void molt__buf_record(molt__buf *b, int nfields, const char *const *fields);
/* The record "key <tab> value". */
MOLT__HIDDEN void molt__buf_pair(molt__buf *b, const char *key, const char *value);
/* snprintf into a fixed buffer of an error message; never overflows. */
MOLT__HIDDEN void molt__errmsg(char *dst, size_t len, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* ---- sha256.c ------------------------------------------------------------*/
/* SHA-256 of a byte stream: init, add any number of times, hex (once). */
typedef struct molt__sha256 {
  uint32_t h[8];
  uint64_t len;
  unsigned char buf[64];
  size_t used;
} molt__sha256;
MOLT__HIDDEN void molt__sha256_init(molt__sha256 *s);
MOLT__HIDDEN void molt__sha256_add(molt__sha256 *s, const void *data, size_t n);
MOLT__HIDDEN void molt__sha256_final(molt__sha256 *s, unsigned char out[32]);
MOLT__HIDDEN void molt__sha256_hex(molt__sha256 *s, char hex[65]);
/* Tests: on = true makes every hash use the portable code, false gives the
 * SHA extensions back where the CPU has them.  Returns whether it has. */
MOLT__HIDDEN bool molt__sha256_portable_only(bool on);

/* ---- lists ---------------------------------------------------------------*/
/* An intrusive doubly linked list: the head is a pointer to the first link
 * (NULL: empty), links are NULL-terminated both ways.  Callers hold the
 * lock that protects the list. */
typedef struct molt__link {
  struct molt__link *next, *prev;
} molt__link;

static inline void molt__list_push(molt__link **head, molt__link *l) {
  l->prev = NULL;
  l->next = *head;
  if (*head)
    (*head)->prev = l;
  *head = l;
}

/* Takes l out of the list (a link that is in no list, both pointers NULL
 * and not the head, is left alone). */
static inline void molt__list_unlink(molt__link **head, molt__link *l) {
  if (l->prev)
    l->prev->next = l->next;
  else if (*head == l)
    *head = l->next;
  if (l->next)
    l->next->prev = l->prev;
  l->next = l->prev = NULL;
}

/* ---- proc.c --------------------------------------------------------------*/
/* The name (comm) of thread `tid` of this process if tid > 0, else of
 * process `pid`, without its newline.  false, and name "", if it cannot be
 * read (the thread or process is gone, or /proc is not mounted). */
MOLT__HIDDEN bool molt__proc_name(pid_t pid, pid_t tid, char *name, size_t len);
/* Where thread tid of this process is blocked: the system call's number
 * (-1: blocked outside one), its stack pointer and instruction pointer.
 * false if it is running or /proc cannot tell. */
MOLT__HIDDEN bool molt__proc_blocked_at(pid_t tid, long *nr, uintptr_t *sp,
                                        uintptr_t *pc);

/* ---- elf.c ---------------------------------------------------------------*/
/* Build-id (hex) of the loaded module that contains addr. 0 or MOLT_E*. */
MOLT__HIDDEN int molt__elf_build_id_of_loaded(const void *addr, char *hex, size_t hexlen,
                                              uintptr_t *base, char *path,
                                              size_t pathlen);
/* Validates the ELF file behind fd (bounds-checks headers), reads its molt
 * patch note.  0, MOLT_ENOTPATCH, MOLT_ECORRUPT, MOLT_EABI. */
MOLT__HIDDEN int molt__elf_read_patch_note(int fd, molt__patch_note *note, char *err,
                                           size_t errlen);
/* Symbol lookup in a module's file symbol table (.symtab, then .dynsym):
 * name with tu == NULL finds a global symbol, with tu a local symbol of
 * that source file (STT_FILE grouping, matched by basename).  Returns the
 * link-time value (add the module base).  0, MOLT_ENOSYM, MOLT_EAMBIGUOUS. */
typedef struct molt__symtab molt__symtab;
MOLT__HIDDEN int molt__symtab_open(const char *path, molt__symtab **out);
MOLT__HIDDEN int molt__symtab_lookup(const molt__symtab *st, const char *name,
                                     const char *tu, uintptr_t *value);
/* The global symbol `name`, else the one local symbol of that name in any
 * source file (a static of a program that has no two of that name).  0,
 * MOLT_ENOSYM, MOLT_EAMBIGUOUS. */
MOLT__HIDDEN int molt__symtab_lookup_any(const molt__symtab *st, const char *name,
                                         uintptr_t *value);
MOLT__HIDDEN void molt__symtab_close(molt__symtab *st);
/* Reverse lookup: the function or object symbol whose [start, start+size)
 * holds link-time address `value` (a zero-sized symbol holds its own
 * address only).  name and tu point into st (tu: basename of the source
 * file of a local symbol, NULL for a global); at one address a global is
 * preferred.  Any out pointer may be NULL.  0 or MOLT_ENOSYM. */
MOLT__HIDDEN int molt__symtab_at(const molt__symtab *st, uintptr_t value,
                                 const char **name, const char **tu, uintptr_t *start,
                                 size_t *size, bool *is_func);
/* Validates the ELF file behind fd as loadable by ld.so on this machine: a
 * 64-bit shared object (ET_DYN) whose headers, segments and dynamic tables
 * lie within the file.  0, MOLT_ENOTPROGRAM (not ELF / not a shared object
 * of this machine), MOLT_ECORRUPT, MOLT_EIO. */
MOLT__HIDDEN int molt__elf_check_shared_object(int fd, char *err, size_t errlen);
/* Validates everything the dynamic loader trusts in the file behind fd
 * before it is dlopened (elf.c, "What the dynamic loader trusts"): the
 * checks of molt__elf_check_shared_object, plus segment types and
 * placement, hash tables and their chains, the symbol and string tables,
 * every relocation's type, symbol and target, version tables, notes.
 * patch: also refuses anything that runs code of the file at dlopen or
 * dlclose (DT_INIT, DT_INIT_ARRAY, DT_PREINIT_ARRAY, DT_FINI,
 * DT_FINI_ARRAY; IFUNCs always).  needed_ok (may be NULL) is asked about
 * each DT_NEEDED name.  0, MOLT_ENOTPATCH/MOLT_ENOTPROGRAM (not loadable
 * here, or refused), MOLT_ECORRUPT, MOLT_ENOMEM, MOLT_EIO. */
MOLT__HIDDEN int molt__elf_check_load(int fd, bool patch,
                                      bool (*needed_ok)(const char *name, void *arg),
                                      void *arg, char *err, size_t errlen);
/* The pre- and post-update callbacks a patch declares (its callback
 * notes, molt/abi.h): link-time addresses (add the load base) and names.
 * Refused (MOLT_ECORRUPT, one line): a malformed note, two of a kind, a
 * target outside the executable PT_LOAD segments.  Also MOLT_ENOTPATCH,
 * MOLT_EIO, MOLT_ENOMEM.  molt__elf_check_load(patch) checks the same. */
typedef struct molt__patch_callback {
  bool present;
  uint64_t vaddr;
  char name[MOLT__CALLBACK_NAME_MAX];
} molt__patch_callback;
typedef struct molt__patch_callbacks {
  molt__patch_callback pre, post;
} molt__patch_callbacks;
MOLT__HIDDEN int molt__elf_read_callbacks(int fd, molt__patch_callbacks *out, char *err,
                                          size_t errlen);
/* Build-id (hex) of the ELF64 file behind fd, read from its notes (SHT_NOTE
 * sections, else PT_NOTE segments).  0, MOLT_ENOSYM (no build-id),
 * MOLT_ECORRUPT, MOLT_ENOTSUP (not an ELF64 little-endian file), MOLT_EIO,
 * MOLT_EINVAL (hexlen too small). */
MOLT__HIDDEN int molt__elf_file_build_id(int fd, char *hex, size_t hexlen, char *err,
                                         size_t errlen);
/* Like molt__elf_read_patch_note, but does not require the note to be
 * stamped: returns the note as it is and the file offset of its descriptor
 * (where moltstamp writes).  desc_off and note may be NULL. */
MOLT__HIDDEN int molt__elf_patch_note_offset(int fd, uint64_t *desc_off,
                                             molt__patch_note *note, char *err,
                                             size_t errlen);

/* The patch's digest note (MOLT__NOTE_DIGEST_TYPE): *off the file offset
 * of its 32 bytes, stored what they hold, computed the SHA-256 of the file
 * with them read as zeros.  0, MOLT_ENOTPATCH (no digest note: built
 * without one), MOLT_ECORRUPT, MOLT_EIO, MOLT_ENOMEM.  Any out pointer may
 * be NULL. */
MOLT__HIDDEN int molt__elf_patch_digest(int fd, uint64_t *off, unsigned char stored[32],
                                        unsigned char computed[32], char *err,
                                        size_t errlen);
/* Checks it: the runtime's refusal of a damaged or unsealed patch.  0,
 * MOLT_ECORRUPT (contents do not match), MOLT_ENOTPATCH (not sealed),
 * MOLT_EIO, MOLT_ENOMEM. */
MOLT__HIDDEN int molt__elf_check_digest(int fd, char *err, size_t errlen);

/* The dynamic relocations of a patch (DT_RELA and DT_JMPREL) and the
 * dynamic symbols they name, read from the file behind fd with every
 * offset checked: the runtime binds a patch's imports with them, moltstamp
 * marks the import symbols weak.  Addresses are link-time ones (add the
 * load base).  0, MOLT_ENOTPATCH, MOLT_ECORRUPT, MOLT_ENOMEM, MOLT_EIO. */
typedef struct molt__dynrel {
  uint64_t offset; /* r_offset: where the relocated word is */
  int64_t addend;
  uint32_t type; /* R_X86_64_* */
  uint32_t sym;  /* index into syms, 0: none */
} molt__dynrel;
typedef struct molt__dynsym {
  const char *name;  /* into the dynamic string table */
  uint64_t file_off; /* of the symbol's Elf64_Sym in the file */
  unsigned char bind, type;
  bool defined; /* st_shndx != SHN_UNDEF */
} molt__dynsym;
typedef struct molt__dynrels {
  molt__dynrel *rels;
  size_t nrels;
  molt__dynsym *syms; /* the symbols up to the highest one a relocation names */
  size_t nsyms;
  char *strtab;
  uint64_t relro_start, relro_end; /* PT_GNU_RELRO, [0, 0) if none */
  struct {
    uint64_t start, end;
    bool writable, executable;
  } segs[64]; /* PT_LOAD, as mapped */
  size_t nsegs;
} molt__dynrels;
MOLT__HIDDEN int molt__elf_read_dynrels(int fd, molt__dynrels *dr, char *err,
                                        size_t errlen);
MOLT__HIDDEN void molt__elf_free_dynrels(molt__dynrels *dr);
/* Where [vaddr, vaddr+len) lies: 0 not in a writable segment, 1 in one, 2 in
 * the RELRO part (read-only after loading). */
MOLT__HIDDEN int molt__dynrels_place(const molt__dynrels *dr, uint64_t vaddr,
                                     uint64_t len);
/* The `symbol` strings of the patch's import records (section molt_imports),
 * read from the file with the relocations dr; *out is malloc'ed (each
 * string too), NULL with *n == 0 if there are none. */
MOLT__HIDDEN int molt__elf_import_symbols(int fd, const molt__dynrels *dr, char ***out,
                                          size_t *n, char *err, size_t errlen);

#include "common/protocol.h"

/* ---- rules.c: expected divergences of a shadowed update ---------------------
 * docs/design.md §17 and docs/guide.md §9 give the grammar.  The CLI parses a
 * rule file to refuse a bad one with file:line:col; the runtime parses the
 * same text again (it trusts no client) into a fixed-size table without
 * allocating, so a hostile file can cost it no more than these bounds. */

/* The calls a shadowed update covers (src/runtime/shadow/calls.c wraps
 * them): XX(NAME, name, has_buffer) -- has_buffer: 1 the call reads bytes
 * into a buffer, 2 it passes bytes out, 0 neither. */
#define MOLT__SHADOW_CALLS(XX)                                                           \
  XX(READ, read, 1)                                                                      \
  XX(WRITE, write, 2)                                                                    \
  XX(RECV, recv, 1)                                                                      \
  XX(SEND, send, 2)                                                                      \
  XX(READV, readv, 1)                                                                    \
  XX(WRITEV, writev, 2)                                                                  \
  XX(RECVFROM, recvfrom, 1)                                                              \
  XX(SENDTO, sendto, 2)                                                                  \
  XX(RECVMSG, recvmsg, 1)                                                                \
  XX(SENDMSG, sendmsg, 2)                                                                \
  XX(ACCEPT, accept, 0)                                                                  \
  XX(ACCEPT4, accept4, 0)                                                                \
  XX(POLL, poll, 0)                                                                      \
  XX(EPOLL_WAIT, epoll_wait, 0)                                                          \
  XX(CLOSE, close, 0)                                                                    \
  XX(SOCKET, socket, 0)                                                                  \
  XX(OPEN, open, 0)                                                                      \
  XX(OPENAT, openat, 0)                                                                  \
  XX(CLOCK_GETTIME, clock_gettime, 0)                                                    \
  XX(GETTIMEOFDAY, gettimeofday, 0)                                                      \
  XX(TIME, time, 0)                                                                      \
  XX(GETRANDOM, getrandom, 1)                                                            \
  XX(EPOLL_CREATE, epoll_create, 0)                                                      \
  XX(EPOLL_CTL, epoll_ctl, 0)                                                            \
  XX(EPOLL_PWAIT, epoll_pwait, 0)                                                        \
  XX(EPOLL_PWAIT2, epoll_pwait2, 0)

typedef enum {
  MOLT__SC_SKIP = 0, /* ring filler; in a rule: any call */
#define MOLT__SC_ENUM(NAME, name, buffer) MOLT__SC_##NAME,
  MOLT__SHADOW_CALLS(MOLT__SC_ENUM)
#undef MOLT__SC_ENUM
      MOLT__SC_END
} molt__sc_kind;

/* The name of a call kind ("read"; "any" for MOLT__SC_SKIP). */
MOLT__HIDDEN const char *molt__sc_name(unsigned kind);
/* 1: the call reads bytes in, 2: it passes bytes out, 0: neither. */
MOLT__HIDDEN int molt__sc_buffer(unsigned kind);

/* What a descriptor is, as a rule names it. */
typedef enum {
  MOLT__FDK_ANY = 0, /* in a rule: not constrained; of a descriptor: other */
  MOLT__FDK_SOCKET,
  MOLT__FDK_FILE,
  MOLT__FDK_PIPE
} molt__fd_kind;

typedef enum { MOLT__RULE_FORWARD, MOLT__RULE_REVERSE } molt__rule_dir;

typedef enum {
  MOLT__RULE_TOLERATE, /* a differing call taken as the leader's */
  MOLT__RULE_DROP,     /* a call only the follower makes: not compared, not made */
  MOLT__RULE_INSERT,   /* a call only the leader made: taken as the follower's */
  MOLT__RULE_REWRITE   /* the matched bytes replaced before they are used */
} molt__rule_action;

/* Bounds: the rule file, the rules in it, a pattern's or a text's bytes. */
#define MOLT__RULES_MAX_TEXT 8192
#define MOLT__RULES_MAX 64
#define MOLT__RULE_MAX_BYTES 256
/* A pattern element: a byte, or one of these. */
#define MOLT__PAT_STAR 256 /* any bytes, none included */
#define MOLT__PAT_ONE 257  /* any one byte */

typedef struct molt__rule {
  uint8_t dir;     /* molt__rule_dir */
  uint8_t call;    /* molt__sc_kind; MOLT__SC_SKIP: any */
  uint8_t fd_kind; /* molt__fd_kind; MOLT__FDK_ANY: any */
  uint8_t action;  /* molt__rule_action */
  bool has_pattern;
  uint16_t line; /* in the rule file, for messages */
  uint16_t pat_len, text_len;
  uint16_t pat[MOLT__RULE_MAX_BYTES]; /* matches the whole buffer */
  char text[MOLT__RULE_MAX_BYTES];    /* rewrite's replacement */
} molt__rule;

typedef struct molt__rules {
  uint32_t n;
  molt__rule r[MOLT__RULES_MAX];
} molt__rules;

/* Parses len bytes of text (named `name` in messages) into *out.  0, or
 * MOLT_EINVAL with "name:line:col: what is wrong" in err. */
MOLT__HIDDEN int molt__rules_parse(const char *name, const char *text, size_t len,
                                   molt__rules *out, char *err, size_t errlen);
/* Whether rule r's pattern matches all n bytes of buf (true without one). */
MOLT__HIDDEN bool molt__rule_matches(const molt__rule *r, const void *buf, size_t n);
/* "socket", "file", "pipe", "any". */
MOLT__HIDDEN const char *molt__fd_kind_name(unsigned k);

#endif /* MOLT_COMMON_H */
