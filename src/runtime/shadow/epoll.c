/* epoll under a shadowed update (shadow.h; docs/design.md §17, "epoll").
 *
 * fork() shares an epoll instance between the leader and the follower: one
 * kernel object, one interest list.  So the follower never touches an
 * instance: its epoll_ctl is compared with the leader's and emulated on a
 * table of its own, and its epoll_wait is given the leader's events.  An
 * event's data is the program's own value (often a pointer, which differs
 * between the versions), so the leader records each event by descriptor,
 * and the follower gives its program its own data for that descriptor.
 *
 * Each process keeps, per epoll instance, the registrations its program
 * made (fd -> events, data) and the way back (data -> fd):
 *  - the original process builds them at the barrier from the kernel's own
 *    list (/proc/self/fdinfo of each instance, every program thread
 *    parked), and from then on from its followed epoll_ctl calls;
 *  - the follower inherits that table with the fork -- the registrations
 *    and data the new version has after an in-place full update too -- and
 *    changes it with its own (emulated) epoll_ctl calls.
 * Two descriptors of one instance with the same data cannot be told apart
 * in an event: refused at the barrier; the leader drops the shadow and the
 * follower ends if its program makes such a pair later.
 *
 * The kernel's instances hold the data of one side at a time (owner_ok):
 * the original process's at the start, and whichever side leads once its
 * first real epoll call after a change of lead (molt promote, the lead
 * handed back, the other side gone) has rewritten every registration of
 * its table (EPOLL_CTL_MOD; ADD if the kernel has none).  A process learns
 * that the other side rewrote them when it replays one of that side's
 * epoll calls (every real one is recorded; the follower starts without).  A one-shot
 * registration that fired and was not armed again is deleted from the
 * kernel instead (a MOD would arm it) and added back at its program's next
 * EPOLL_CTL_MOD.  After a takeover, the calls a thread still replays from
 * the dead side's ring are applied to the kernel too once it was rewritten.
 *
 * close(): the kernel drops a registration when the last descriptor of its
 * file is closed, and after the fork the other process holds a copy of
 * every descriptor (until it replays the close).  So the leading side
 * deletes a descriptor's registrations itself before it closes it: else
 * the leader's epoll_wait could report, with a stale pointer, a connection
 * its program has closed and freed. */
#include "shadow/shadow.h"

#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <time.h>
#include <unistd.h>

#include "molt/program.h"

/* Epoll instances a process follows at most. */
#define MAX_INST 64
/* Descriptor numbers a table holds (registrations of higher ones drop the
 * shadow). */
#define FD_LIMIT (1 << 20)
/* Events one followed wait returns at most (a program asking for more gets
 * at most these, as though fewer were ready). */
#define WAIT_MAX 4096
/* The flags the kernel keeps on a one-shot registration that fired (its
 * EP_PRIVATE_BITS): /proc shows only these then. */
#define PRIVATE_BITS (EPOLLWAKEUP | EPOLLONESHOT | EPOLLET | EPOLLEXCLUSIVE)

typedef struct ent {
  uint64_t data;
  uint32_t events;
  uint32_t gen;  /* the registered descriptor's generation (fds.c) */
  bool on;       /* registered by this process's program */
  bool disarmed; /* EPOLLONESHOT that fired, not armed again */
  bool absent;   /* not in the kernel's instance (a disarmed one deleted) */
} ent;

typedef struct inst {
  int epfd;     /* -1: a free slot */
  uint32_t gen; /* its descriptor's generation (fds.c) */
  ent *e;       /* by descriptor number, cap of them */
  uint32_t cap;
  /* data -> fd, open addressing (linear probing; val -1: empty) */
  uint64_t *key;
  int32_t *val;
  uint32_t hcap, hn;
} inst;

/* One event of a followed wait as recorded: by descriptor, not data. */
typedef struct ev_rec {
  int32_t fd; /* -1: its data matched no registration the leader knew */
  uint32_t events;
  uint32_t gen; /* the registered descriptor's generation */
} ev_rec;

/* shep_lock (the lock table, base.h) protects insts: program threads in the
 * epoll wrappers and close(); nothing is taken under it. */
static molt__lock shep_lock = MOLT__LOCK_INIT(shep);
static inst insts[MAX_INST];
static bool insts_ready;
/* Instances tracked (written under shep_lock): 0 lets close() skip the lock.
 * Relaxed: a close racing with the creation of an instance that holds its
 * descriptor is a race in the program itself; a close ordered after the
 * registration (by the program's own synchronization) sees it. */
static _Atomic unsigned ninst;
/* The kernel's instances hold this process's data.  Stored true with
 * release after a rewrite's system calls (under shep_lock); a thread whose
 * acquire load sees it true waits on instances already rewritten. */
static _Atomic bool owner_ok = true;

/* The follower's wait being replayed (set by its wrapper, read by
 * molt__shadow_epoll_fits on the same thread). */
static __thread struct epoll_event *cur_ev __attribute__((tls_model("initial-exec")));
static __thread int cur_cap __attribute__((tls_model("initial-exec")));
static __thread char why_buf[256] __attribute__((tls_model("initial-exec")));

/* ---- the tables (shep_lock held) -------------------------------------------------*/

static uint32_t hslot(uint64_t k, uint32_t cap) {
  k *= 0x9e3779b97f4a7c15ull;
  return (uint32_t)(k >> 32) & (cap - 1);
}

static int32_t h_get(const inst *in, uint64_t k) {
  if (!in->hcap)
    return -1;
  for (uint32_t i = hslot(k, in->hcap);; i = (i + 1) & (in->hcap - 1)) {
    if (in->val[i] < 0)
      return -1;
    if (in->key[i] == k)
      return in->val[i];
  }
}

static bool h_put(inst *in, uint64_t k, int32_t v);

static bool h_grow(inst *in) {
  uint32_t ncap = in->hcap ? in->hcap * 2 : 64;
  uint64_t *ok = in->key;
  int32_t *ov = in->val;
  uint32_t ocap = in->hcap;
  in->key = malloc(ncap * sizeof *in->key);
  in->val = malloc(ncap * sizeof *in->val);
  if (!in->key || !in->val) {
    free(in->key);
    free(in->val);
    in->key = ok;
    in->val = ov;
    return false;
  }
  for (uint32_t i = 0; i < ncap; i++)
    in->val[i] = -1;
  in->hcap = ncap;
  in->hn = 0;
  for (uint32_t i = 0; i < ocap; i++)
    if (ov[i] >= 0)
      h_put(in, ok[i], ov[i]);
  free(ok);
  free(ov);
  return true;
}

static bool h_put(inst *in, uint64_t k, int32_t v) {
  if ((in->hn + 1) * 2 > in->hcap && !h_grow(in))
    return false;
  uint32_t i = hslot(k, in->hcap);
  while (in->val[i] >= 0 && in->key[i] != k)
    i = (i + 1) & (in->hcap - 1);
  if (in->val[i] < 0)
    in->hn++;
  in->key[i] = k;
  in->val[i] = v;
  return true;
}

/* Removes k if it maps to v (backward-shift deletion: no tombstones). */
static void h_del(inst *in, uint64_t k, int32_t v) {
  if (!in->hcap)
    return;
  uint32_t m = in->hcap - 1, i = hslot(k, in->hcap);
  while (in->val[i] >= 0 && in->key[i] != k)
    i = (i + 1) & m;
  if (in->val[i] != v)
    return;
  for (uint32_t j = i;;) {
    j = (j + 1) & m;
    if (in->val[j] < 0)
      break;
    uint32_t h = hslot(in->key[j], in->hcap);
    /* j's home slot h lies cyclically in (i, j]: it stays */
    if (i <= j ? (i < h && h <= j) : (i < h || h <= j))
      continue;
    in->key[i] = in->key[j];
    in->val[i] = in->val[j];
    i = j;
  }
  in->val[i] = -1;
  in->hn--;
}

static void tables_init(void) {
  if (insts_ready)
    return;
  for (int i = 0; i < MAX_INST; i++)
    insts[i].epfd = -1;
  insts_ready = true;
}

static inst *inst_of(int64_t epfd) {
  tables_init();
  for (int i = 0; i < MAX_INST; i++)
    if (insts[i].epfd >= 0 && insts[i].epfd == epfd)
      return &insts[i];
  return NULL;
}

static void inst_free(inst *in) {
  free(in->e);
  free(in->key);
  free(in->val);
  *in = (inst){.epfd = -1};
  atomic_fetch_sub_explicit(&ninst, 1, memory_order_relaxed);
}

/* A new, empty table for the instance at epfd (an older one there is
 * gone: its number was reused); NULL if MAX_INST are tracked. */
static inst *inst_new(int epfd, uint32_t gen) {
  inst *in = inst_of(epfd);
  if (in)
    inst_free(in);
  for (int i = 0; i < MAX_INST; i++)
    if (insts[i].epfd < 0) {
      insts[i] = (inst){.epfd = epfd, .gen = gen};
      atomic_fetch_add_explicit(&ninst, 1, memory_order_relaxed);
      return &insts[i];
    }
  return NULL;
}

static ent *ent_at(inst *in, int64_t fd, bool grow) {
  if (fd < 0 || fd >= FD_LIMIT)
    return NULL;
  if ((uint32_t)fd >= in->cap) {
    if (!grow)
      return NULL;
    uint32_t ncap = in->cap ? in->cap : 64;
    while (ncap <= (uint32_t)fd)
      ncap *= 2;
    ent *ne = realloc(in->e, ncap * sizeof *ne);
    if (!ne)
      return NULL;
    memset(ne + in->cap, 0, (ncap - in->cap) * sizeof *ne);
    in->e = ne;
    in->cap = ncap;
  }
  return &in->e[fd];
}

static void reg_del(inst *in, int fd) {
  ent *e = ent_at(in, fd, false);
  if (!e || !e->on)
    return;
  h_del(in, e->data, fd);
  *e = (ent){0};
}

/* fd registered (or modified) with events and data: -1; the other
 * descriptor of the instance that has the same data (the registration is
 * kept, the way back still names the other); -2 out of room. */
static int reg_put(inst *in, int fd, uint32_t events, uint64_t data, uint32_t gen) {
  ent *e = ent_at(in, fd, true);
  if (!e)
    return -2;
  int32_t other = h_get(in, data);
  if (e->on && e->data != data)
    h_del(in, e->data, fd);
  *e = (ent){.data = data, .events = events, .gen = gen, .on = true};
  if (other >= 0 && other != fd)
    return other;
  return h_put(in, data, fd) ? -1 : -2;
}

/* A program's epoll_ctl that succeeded, into the table of epfd (gen: the
 * generation of fd, as the leader counted it): as reg_put (-1 fine, >= 0
 * a duplicate's descriptor, -2 out of room). */
static int table_ctl(int epfd, int op, int fd, const struct epoll_event *ev,
                     uint32_t gen) {
  inst *in = inst_of(epfd);
  if (!in && op != EPOLL_CTL_DEL)
    in = inst_new(epfd, 0); /* an instance made outside the followed calls */
  if (!in)
    return op == EPOLL_CTL_DEL ? -1 : -2;
  if (op == EPOLL_CTL_DEL || !ev) {
    reg_del(in, fd);
    return -1;
  }
  return reg_put(in, fd, ev->events, ev->data.u64, gen);
}

/* ---- the kernel's instances ----------------------------------------------------*/

/* Each registration the kernel holds in the instance at epfd, as
 * /proc/self/fdinfo shows it ("tfd: N events: HEX data: HEX"), to fn until
 * it returns non-zero (that value is returned).  -errno: fdinfo could not
 * be read. */
typedef int (*each_reg_fn)(void *arg, int fd, unsigned events, unsigned long long data);
static int each_kernel_registration(int epfd, each_reg_fn fn, void *arg) {
  char path[64], line[256];
  snprintf(path, sizeof path, "/proc/self/fdinfo/%d", epfd);
  FILE *f = fopen(path, "re");
  if (!f)
    return -errno;
  int rc = 0;
  while (rc == 0 && fgets(line, sizeof line, f)) {
    int fd;
    unsigned events;
    unsigned long long data;
    if (sscanf(line, "tfd: %d events: %x data: %llx", &fd, &events, &data) == 3)
      rc = fn(arg, fd, events, data);
  }
  fclose(f);
  return rc;
}

/* A registration the kernel holds and this process's table does not: the
 * other side's, made for real and never recorded (the process died after
 * the call and before its record -- an acceptor's EPOLL_CTL_ADD of the
 * connection it had just handed over, say).  Deleted while this side runs
 * alone: the table is the program's only truth then, and a registration
 * left with the dead side's data would report events with a pointer into
 * the other version's heap, and make the program's own EPOLL_CTL_ADD of
 * that descriptor fail with EEXIST (its acceptor then closed the
 * connection).  A descriptor this process holds under another file, or not
 * at all, is not the registration's: the call fails and changes nothing. */
static int delete_if_not_in_table(void *arg, int fd, unsigned events,
                                  unsigned long long data) {
  (void)events;
  (void)data;
  inst *in = arg;
  ent *e = fd >= 0 ? ent_at(in, fd, false) : NULL;
  if (!e || !e->on)
    epoll_ctl(in->epfd, EPOLL_CTL_DEL, fd, NULL);
  return 0;
}

/* The kernel's instances get this process's data: every registration of
 * its tables written (shep_lock held), and, while this side runs alone,
 * every registration the tables do not hold deleted.  Errors are passed
 * over: a descriptor the table still names may have been closed by a
 * thread that runs alone already. */
static void rewrite_locked(void) {
  tables_init();
  bool alone = molt__shadow_alone();
  for (int i = 0; i < MAX_INST; i++) {
    inst *in = &insts[i];
    if (in->epfd < 0)
      continue;
    if (alone)
      each_kernel_registration(in->epfd, delete_if_not_in_table, in);
    for (uint32_t fd = 0; fd < in->cap; fd++) {
      ent *e = &in->e[fd];
      if (!e->on)
        continue;
      if (e->disarmed) {
        epoll_ctl(in->epfd, EPOLL_CTL_DEL, (int)fd, NULL);
        e->absent = true;
        continue;
      }
      struct epoll_event ev = {.events = e->events, .data.u64 = e->data};
      /* an exclusive registration cannot be modified: made again */
      if (e->events & EPOLLEXCLUSIVE)
        epoll_ctl(in->epfd, EPOLL_CTL_DEL, (int)fd, NULL);
      if ((e->events & EPOLLEXCLUSIVE) ||
          epoll_ctl(in->epfd, EPOLL_CTL_MOD, (int)fd, &ev) < 0)
        epoll_ctl(in->epfd, EPOLL_CTL_ADD, (int)fd, &ev);
      e->absent = false;
    }
  }
  /* release: the rewrite's calls before a thread that sees owner_ok waits */
  atomic_store_explicit(&owner_ok, true, memory_order_release);
}

/* Before a real epoll call: the instances hold this process's data. */
static void own_kernel(void) {
  if (atomic_load_explicit(&owner_ok, memory_order_acquire))
    return;
  int e = errno;
  molt__lock_acquire(&shep_lock);
  if (!atomic_load_explicit(&owner_ok, memory_order_relaxed))
    rewrite_locked();
  molt__lock_release(&shep_lock);
  errno = e;
}

void molt__shadow_epoll_disown(void) {
  /* release: pairs with own_kernel's acquire (a later rewrite sees it) */
  atomic_store_explicit(&owner_ok, false, memory_order_release);
}

/* A follower's thread replayed an epoll call the other side made for real
 * (it leads): that side's first real epoll call rewrote the instances with
 * its data, so this process's next real one (when the lead comes back)
 * rewrites them again.  Not while the other side is gone: this process
 * rewrites them itself then, and what is replayed after its rewrite is
 * applied (apply_replayed). */
static void replayed_other_side(void) {
  if (atomic_load_explicit(&owner_ok, memory_order_relaxed) && !molt__shadow_alone())
    molt__shadow_epoll_disown();
}

/* After a takeover, a call the dead side made and this thread replays
 * once the kernel holds this side's data: applied to the kernel too
 * (shep_lock held). */
static bool apply_replayed(void) {
  return molt__shadow_alone() && atomic_load_explicit(&owner_ok, memory_order_relaxed);
}

/* ---- the barrier ----------------------------------------------------------------*/

/* read_instance's registration: into the new table (in), refusing what a
 * follower could not tell apart. */
struct read_ctx {
  inst *in;
  int epfd;
  char *err;
  size_t errlen;
  int rc; /* a refusal (MOLT_ENOTSUP) */
};

static int read_registration(void *arg, int fd, unsigned events,
                             unsigned long long data) {
  struct read_ctx *c = arg;
  int other = reg_put(c->in, fd, events, data, molt__shadow_fd_gen(fd));
  if (other == -2) {
    molt__errmsg(c->err, c->errlen,
                 "epoll instance %d: descriptor %d cannot be followed (out of memory or "
                 "above %d)",
                 c->epfd, fd, FD_LIMIT);
    c->rc = MOLT_ENOTSUP;
    return 1;
  }
  if (other >= 0) {
    molt__errmsg(c->err, c->errlen,
                 "epoll instance %d has descriptors %d and %d registered with the same "
                 "data (%#llx): a follower could not tell their events apart; use a "
                 "plain full update (molt update)",
                 c->epfd, other, fd, data);
    c->rc = MOLT_ENOTSUP;
    return 1;
  }
  if ((events & EPOLLONESHOT) && !(events & ~(unsigned)PRIVATE_BITS))
    ent_at(c->in, fd, false)->disarmed = true; /* fired, not armed again */
  return 0;
}

/* The registrations of the instance at epfd, from /proc/self/fdinfo.  old:
 * the table an earlier session left for it (kept aside), whose one-shot
 * registrations that a rewrite deleted from the kernel (absent) are
 * registrations still. */
static int read_instance(int epfd, const inst *old, char *err, size_t errlen) {
  inst *in = inst_new(epfd, molt__shadow_fd_gen(epfd));
  if (!in) {
    molt__errmsg(err, errlen,
                 "the program holds more than %d epoll instances; a shadowed update "
                 "follows at most %d",
                 MAX_INST, MAX_INST);
    return MOLT_ENOTSUP;
  }
  struct read_ctx ctx = {in, epfd, err, errlen, 0};
  int rc = each_kernel_registration(epfd, read_registration, &ctx);
  if (rc < 0) {
    molt__errmsg(err, errlen, "cannot read the registrations of epoll instance %d: %s",
                 epfd, strerror(-rc));
    return molt__from_errno(-rc);
  }
  rc = ctx.rc;
  for (uint32_t fd = 0; rc == 0 && old && fd < old->cap; fd++) {
    const ent *o = &old->e[fd];
    ent *x = ent_at(in, fd, false);
    if (!o->on || !o->absent || (x && x->on))
      continue;
    if (reg_put(in, (int)fd, o->events, o->data, o->gen) != -1) {
      molt__errmsg(
          err, errlen,
          "epoll instance %d: descriptor %u, disarmed by an earlier shadowed "
          "update, cannot be followed (its data is used twice, or out of memory)",
          epfd, fd);
      rc = MOLT_ENOTSUP;
      break;
    }
    x = ent_at(in, fd, false);
    x->disarmed = x->absent = true;
  }
  return rc;
}

/* Each epoll instance the program holds at the barrier, read into a table
 * (old: the tables of an earlier session, for their absent registrations). */
struct begin_ctx {
  const inst *old;
  char *err;
  size_t errlen;
};

static int begin_instance(void *arg, int fd) {
  struct begin_ctx *c = arg;
  const inst *o = NULL;
  for (int i = 0; i < MAX_INST; i++)
    if (c->old[i].epfd == fd)
      o = &c->old[i];
  return read_instance(fd, o, c->err, c->errlen);
}

int molt__shadow_epoll_begin(char *err, size_t errlen) {
  molt__lock_acquire(&shep_lock);
  tables_init();
  /* The tables of an earlier session, kept aside for their absent
   * registrations (read_instance), then freed. */
  static inst old[MAX_INST];
  for (int i = 0; i < MAX_INST; i++) {
    old[i] = insts[i];
    if (insts[i].epfd >= 0)
      atomic_fetch_sub_explicit(&ninst, 1, memory_order_relaxed);
    insts[i] = (inst){.epfd = -1};
  }
  struct begin_ctx ctx = {old, err, errlen};
  int rc = molt__shadow_each_fd_of("anon_inode:[eventpoll]", begin_instance, &ctx, err,
                                   errlen);
  for (int i = 0; i < MAX_INST; i++) {
    free(old[i].e);
    free(old[i].key);
    free(old[i].val);
  }
  atomic_store_explicit(&owner_ok, true, memory_order_release);
  molt__lock_release(&shep_lock);
  return rc;
}

void molt__shadow_epoll_closing(int fd, bool leading, uint32_t gen) {
  if (!atomic_load_explicit(&ninst, memory_order_relaxed))
    return;
  int e = errno;
  molt__lock_acquire(&shep_lock);
  for (int i = 0; i < MAX_INST; i++) {
    inst *in = &insts[i];
    if (in->epfd < 0)
      continue;
    /* Following, the close of generation gen: a newer descriptor at the
     * same number (another thread's replay got there first) stays.
     * Generation 0: one the other side did not create (after a promotion:
     * one both processes hold). */
    if (in->epfd == fd) {
      if (leading || gen == 0 || in->gen == gen)
        inst_free(in);
      continue;
    }
    ent *x = ent_at(in, fd, false);
    if (!x || !x->on || (!leading && gen != 0 && x->gen != gen))
      continue;
    if (leading && !x->absent)
      epoll_ctl(in->epfd, EPOLL_CTL_DEL, fd, NULL);
    reg_del(in, fd);
  }
  molt__lock_release(&shep_lock);
  errno = e;
}

/* The fork handlers (the shadow mode's hooks, after shd_lock). */
void molt__shadow_epoll_fork_prepare(void) { molt__lock_acquire(&shep_lock); }
void molt__shadow_epoll_fork_parent(void) { molt__lock_release(&shep_lock); }
void molt__shadow_epoll_fork_child(void) { molt__lock_reinit(&shep_lock); }

/* ---- the follower's waits ---------------------------------------------------------*/

const char *molt__shadow_epoll_fits(const molt__sc *c, const void *out, size_t len) {
  const ev_rec *l = out;
  size_t k = len / sizeof *l;
  if (k == 0)
    return NULL;
  if (!cur_ev || k > (size_t)cur_cap) {
    snprintf(why_buf, sizeof why_buf,
             "the leader's %s(%" PRId64 ") returned %zu events, more than the follower "
             "asked for",
             molt__sc_name(c->kind), c->a[0], k);
    return why_buf;
  }
  const char *why = NULL;
  molt__lock_acquire(&shep_lock);
  inst *in = inst_of(c->a[0]);
  for (size_t i = 0; i < k && !why; i++) {
    ent *e = in && l[i].fd >= 0 ? ent_at(in, l[i].fd, false) : NULL;
    if (!e || !e->on || e->gen != l[i].gen) {
      if (l[i].fd < 0)
        snprintf(why_buf, sizeof why_buf,
                 "the leader's %s(%" PRId64 ") returned an event (%#x) whose data "
                 "matches no registration made through a followed epoll_ctl",
                 molt__sc_name(c->kind), c->a[0], l[i].events);
      else
        snprintf(why_buf, sizeof why_buf,
                 "the leader's %s(%" PRId64 ") reported descriptor %d (generation %u, "
                 "events %#x), which the follower has not registered in that instance%s",
                 molt__sc_name(c->kind), c->a[0], l[i].fd, l[i].gen, l[i].events,
                 e && e->on ? " (it registered another descriptor at that number)" : "");
      why = why_buf;
      break;
    }
    cur_ev[i].events = l[i].events;
    cur_ev[i].data.u64 = e->data;
  }
  /* Accepted: one-shot registrations that fired are disarmed, as the
   * kernel disarmed them in the leader's instance. */
  for (size_t i = 0; i < k && !why; i++) {
    ent *e = ent_at(in, l[i].fd, false);
    if (!(e->events & EPOLLONESHOT) || e->disarmed)
      continue;
    e->disarmed = true;
    if (apply_replayed() && !e->absent) {
      epoll_ctl(in->epfd, EPOLL_CTL_DEL, l[i].fd, NULL);
      e->absent = true;
    }
  }
  molt__lock_release(&shep_lock);
  return why;
}

/* ---- the wrappers ------------------------------------------------------------------*/

/* Follower, before it replays an epoll_ctl of descriptor fd of generation
 * gen (shep_lock held; released while it waits): the registration of an
 * older descriptor at the same number is still in the table when the
 * thread that closes it lags behind this one (the leader closed it, the
 * number was reused, and this thread replays the new one's registration
 * first).  That thread may still replay events of the old one, so this
 * one waits for its close (it comes: the leader made it before this call,
 * and that thread needs nothing this one does later), at most
 * MOLT__SHADOW_RETRY_MS. */
static void wait_for_older(int epfd, int fd, uint32_t gen) {
  uint64_t t0 = 0;
  for (;;) {
    inst *in = inst_of(epfd);
    ent *x = in ? ent_at(in, fd, false) : NULL;
    if (!x || !x->on || gen == 0 || x->gen == 0 || x->gen >= gen)
      return;
    uint64_t now = molt__now_ns();
    if (!t0)
      t0 = now;
    else if (now - t0 > (uint64_t)MOLT__SHADOW_RETRY_MS * 1000000u) {
      molt__lock_release(&shep_lock);
      molt__shadow_follower_fail(
          MOLT__SHADOW_END_DIVERGED,
          "epoll instance %d: the follower's registration of descriptor %d (generation "
          "%u) waited %d ms for the close of the one before it (generation %u)",
          epfd, fd, gen, MOLT__SHADOW_RETRY_MS, x->gen);
    }
    molt__lock_release(&shep_lock);
    molt__shadow_nudge(); /* the closing thread may nap with the close waiting */
    struct timespec ts = {0, 100000};
    nanosleep(&ts, NULL);
    molt__lock_acquire(&shep_lock);
  }
}

/* epoll_create (which 0, arg its size) and epoll_create1 (which 1, arg
 * its flags): a new instance, passed to the follower at the same number
 * (fds.c), with an empty table on both sides. */
static int create_common(int which, int arg) {
  molt__shadow_role role = molt__shadow_role_now();
  if (role == MOLT__SHADOW_NONE)
    return which ? epoll_create1(arg) : epoll_create(arg);
  molt__sc c = {.kind = MOLT__SC_EPOLL_CREATE, .a = {which, arg, 0}};
  int64_t rr;
  bool followed = role == MOLT__SHADOW_FOLLOWER && molt__shadow_call_replay(&c, &rr);
  if (followed)
    replayed_other_side();
  int r = followed ? (int)rr : which ? epoll_create1(arg) : epoll_create(arg);
  if (!followed)
    molt__shadow_call_record(&c, r,
                             0); /* passes the instance (fds.c), counts its generation */
  if (r >= 0) {
    int e = errno;
    uint32_t gen = followed ? molt__shadow_replayed_fd_gen() : molt__shadow_fd_gen(r);
    molt__lock_acquire(&shep_lock);
    tables_init();
    bool ok = inst_new(r, gen) != NULL;
    molt__lock_release(&shep_lock);
    errno = e;
    if (!ok && followed)
      molt__shadow_follower_fail(MOLT__SHADOW_END_FAILED,
                                 "epoll instance %d: more than %d are followed", r,
                                 MAX_INST);
    if (!ok)
      molt__shadow_drop("epoll instance %d: more than %d are followed; the shadow was "
                        "dropped",
                        r, MAX_INST);
  }
  return r;
}

int __wrap_epoll_create(int size) { return create_common(0, size); }
int __wrap_epoll_create1(int flags) { return create_common(1, flags); }

/* The leader's epoll_ctl, made on the kernel's instance (shep_lock held): a
 * one-shot registration the rewrite deleted (absent) is added back by
 * EPOLL_CTL_MOD, deleted by nothing, and exists for EPOLL_CTL_ADD. */
static int ctl_real(int epfd, int op, int fd, struct epoll_event *ev) {
  inst *in = inst_of(epfd);
  ent *e = in ? ent_at(in, fd, false) : NULL;
  if (e && e->on && e->absent) {
    if (op == EPOLL_CTL_MOD)
      return epoll_ctl(epfd, EPOLL_CTL_ADD, fd, ev);
    if (op == EPOLL_CTL_DEL)
      return 0;
    if (op == EPOLL_CTL_ADD) {
      errno = EEXIST;
      return -1;
    }
  }
  return epoll_ctl(epfd, op, fd, ev);
}

/* epoll_ctl: compared on (epfd, op, fd) and the events, never the data;
 * the follower's registration goes into its table only.  Out of line: the
 * wrapper's fast path (below) sets up none of this frame. */
static __attribute__((noinline)) int shadowed_epoll_ctl(int epfd, int op, int fd,
                                                        struct epoll_event *ev) {
  molt__shadow_role role = molt__shadow_role_now();
  if (role == MOLT__SHADOW_NONE && !atomic_load_explicit(&ninst, memory_order_relaxed))
    return epoll_ctl(epfd, op, fd, ev);
  if (role == MOLT__SHADOW_NONE) {
    /* Not followed (no session, or this side runs alone), but the tables
     * still say which one-shot registrations a rewrite deleted. */
    molt__lock_acquire(&shep_lock);
    if (!atomic_load_explicit(&owner_ok, memory_order_relaxed))
      rewrite_locked();
    int r = ctl_real(epfd, op, fd, ev);
    int e = errno;
    if (r == 0)
      table_ctl(epfd, op, fd, ev, molt__shadow_fd_table_gen(fd));
    molt__lock_release(&shep_lock);
    errno = e;
    return r;
  }
  uint32_t events = ev ? ev->events : 0;
  molt__sc c = {.kind = MOLT__SC_EPOLL_CTL,
                .a = {epfd, op, fd},
                .in = ev && op != EPOLL_CTL_DEL ? &events : NULL,
                .in_len = ev && op != EPOLL_CTL_DEL ? sizeof events : 0,
                /* the leader's generation of fd (fds.c), which a close
                 * the follower replays out of order is told apart by */
                .fd_gen = role == MOLT__SHADOW_LEADER ? molt__shadow_fd_gen(fd) : 0};
  int64_t rr;
  if (role == MOLT__SHADOW_FOLLOWER && molt__shadow_call_replay(&c, &rr)) {
    replayed_other_side();
    if (rr == 0) {
      int e = errno;
      uint32_t gen = molt__shadow_replayed_fd_gen();
      molt__lock_acquire(&shep_lock);
      wait_for_older(epfd, fd, gen);
      int dup = table_ctl(epfd, op, fd, ev, gen);
      if (apply_replayed()) { /* the dead side made it with its data */
        /* Real calls of a thread that still replays the dead side's ring
         * (its replay blocked the backstop again): let through, then
         * blocked again while it follows.  (Seen once the follower's
         * threads lagged a few ms behind at the leader's death: the MOD
         * was trapped and the follower ended.) */
        molt__shadow_trap_allow();
        if (op == EPOLL_CTL_DEL || !ev) {
          /* the dead side's call deleted it, but this side's rewrite,
           * from a table that still held it, may have added it back */
          epoll_ctl(epfd, EPOLL_CTL_DEL, fd, NULL);
        } else if (epoll_ctl(epfd, EPOLL_CTL_MOD, fd, ev) < 0) {
          epoll_ctl(epfd, EPOLL_CTL_ADD, fd, ev);
        }
        if (molt__shadow_follows())
          molt__shadow_trap_block();
      }
      molt__lock_release(&shep_lock);
      if (dup != -1 && !molt__shadow_alone())
        molt__shadow_follower_fail(
            MOLT__SHADOW_END_DIVERGED,
            dup >= 0 ? "the follower registered descriptors %d and %d in epoll instance "
                       "%d with the same data: their events could not be told apart"
                     : "the follower's registration of descriptor %d (%d) in epoll "
                       "instance %d cannot be kept (out of memory or too many)",
            dup, fd, epfd);
      errno = e;
    }
    return (int)rr;
  }
  molt__lock_acquire(&shep_lock);
  if (!atomic_load_explicit(&owner_ok, memory_order_relaxed))
    rewrite_locked();
  int r = ctl_real(epfd, op, fd, ev);
  int e = errno, dup = -1;
  /* A follower's thread whose replay found its ring drained after the
   * leader's death makes the call for real (it runs alone from here): its
   * table keeps the generation its lagging threads' replays name. */
  if (r == 0)
    dup =
        table_ctl(epfd, op, fd, ev,
                  role == MOLT__SHADOW_LEADER ? c.fd_gen : molt__shadow_fd_table_gen(fd));
  molt__lock_release(&shep_lock);
  errno = e;
  if (dup != -1)
    molt__shadow_drop(dup >= 0
                          ? "epoll instance %d: descriptors %d and %d registered with "
                            "the same data, whose events a follower could not tell "
                            "apart; the shadow was dropped"
                          : "epoll instance %d: the registration of descriptor %d "
                            "(%d) cannot be followed; the shadow was dropped",
                      epfd, dup, fd);
  molt__shadow_call_record(&c, r, 0);
  return r;
}

/* The wrappers' fast path (calls.c, FRONT): no session in this process and
 * no table kept from an earlier one (a process never shadowed: mosquitto
 * makes 8 epoll_ctl a message, adding and removing EPOLLOUT around each
 * reply) -- the plain call after two loads, as shadowed_epoll_ctl would
 * make it (its role is NONE when no session runs).  ninst relaxed, as in
 * shadowed_epoll_ctl: see its declaration. */
int __wrap_epoll_ctl(int epfd, int op, int fd, struct epoll_event *ev) {
  if (molt__shadow_off() && !atomic_load_explicit(&ninst, memory_order_relaxed))
    return epoll_ctl(epfd, op, fd, ev);
  return shadowed_epoll_ctl(epfd, op, fd, ev);
}

/* The three waits.  Compared on the instance, maxevents, the timeout's
 * class (-1 infinite, 0 none, 1 finite: the value a program computes from
 * its timers may differ by a few ms), and epoll_pwait's signal mask; the
 * leader's events recorded by descriptor (ev_rec), the follower's data
 * given back from its own table (molt__shadow_epoll_fits). */
typedef enum { W_WAIT, W_PWAIT, W_PWAIT2 } wait_kind;

static int real_wait(wait_kind w, int epfd, struct epoll_event *ev, int max, int timeout,
                     const struct timespec *ts, const sigset_t *mask) {
  switch (w) {
  case W_PWAIT:
    return epoll_pwait(epfd, ev, max, timeout, mask);
  case W_PWAIT2:
    return epoll_pwait2(epfd, ev, max, ts, mask);
  default:
    return epoll_wait(epfd, ev, max, timeout);
  }
}

static __attribute__((noinline)) int wait_common(wait_kind w, int epfd,
                                                 struct epoll_event *ev, int max,
                                                 int timeout, const struct timespec *ts,
                                                 const sigset_t *mask) {
  molt__shadow_role role = molt__shadow_role_now();
  if (role == MOLT__SHADOW_NONE) {
    own_kernel();
    return real_wait(w, epfd, ev, max, timeout, ts, mask);
  }
  int cap = max > WAIT_MAX ? WAIT_MAX : max;
  int64_t cls;
  if (w == W_PWAIT2)
    cls = !ts ? -1 : (ts->tv_sec == 0 && ts->tv_nsec == 0) ? 0 : 1;
  else
    cls = timeout < 0 ? -1 : timeout == 0 ? 0 : 1;
  /* as many as the program asked for (a thread's stack may be small) */
  ev_rec out[cap > 0 ? cap : 1];
  /* the signal mask's first 8 bytes: the kernel's sigset_t */
  molt__sc c = {.kind = w == W_WAIT    ? MOLT__SC_EPOLL_WAIT
                        : w == W_PWAIT ? MOLT__SC_EPOLL_PWAIT
                                       : MOLT__SC_EPOLL_PWAIT2,
                .a = {epfd, max, cls},
                .in = mask,
                .in_len = mask ? 8 : 0,
                .out = out,
                .out_cap = cap > 0 ? (size_t)cap * sizeof out[0] : 0};
  int64_t rr;
  if (role == MOLT__SHADOW_FOLLOWER) {
    cur_ev = ev;
    cur_cap = cap;
    bool followed = molt__shadow_call_replay(&c, &rr);
    cur_ev = NULL;
    if (followed) {
      replayed_other_side();
      return (int)rr; /* events translated by molt__shadow_epoll_fits */
    }
  }
  own_kernel();
  int r = real_wait(w, epfd, ev, cap, timeout, ts, mask);
  if (r > 0) {
    int e = errno;
    molt__lock_acquire(&shep_lock);
    inst *in = inst_of(epfd);
    for (int i = 0; i < r; i++) {
      int32_t fd = in ? h_get(in, ev[i].data.u64) : -1;
      ent *x = fd >= 0 ? ent_at(in, fd, false) : NULL;
      out[i] = (ev_rec){fd, ev[i].events, x ? x->gen : 0};
      if (x && (x->events & EPOLLONESHOT))
        x->disarmed = true;
    }
    molt__lock_release(&shep_lock);
    errno = e;
  }
  molt__shadow_call_record(&c, r, r > 0 ? (size_t)r * sizeof out[0] : 0);
  return r;
}

/* The waits' fast path: no session in this process and the kernel's
 * instances hold its data (always so in a process never shadowed) -- the
 * plain call, as wait_common makes it then (role NONE, own_kernel with
 * nothing to do).  The acquire load of owner_ok is own_kernel's: it pairs
 * with the release store after a rewrite, so that this wait comes after
 * the rewrite's system calls. */
static inline bool wait_plain(void) {
  return molt__shadow_off() && atomic_load_explicit(&owner_ok, memory_order_acquire);
}

int __wrap_epoll_wait(int epfd, struct epoll_event *ev, int max, int timeout) {
  if (wait_plain())
    return epoll_wait(epfd, ev, max, timeout);
  return wait_common(W_WAIT, epfd, ev, max, timeout, NULL, NULL);
}

int __wrap_epoll_pwait(int epfd, struct epoll_event *ev, int max, int timeout,
                       const sigset_t *mask) {
  if (wait_plain())
    return epoll_pwait(epfd, ev, max, timeout, mask);
  return wait_common(W_PWAIT, epfd, ev, max, timeout, NULL, mask);
}

int __wrap_epoll_pwait2(int epfd, struct epoll_event *ev, int max,
                        const struct timespec *ts, const sigset_t *mask) {
  if (wait_plain())
    return epoll_pwait2(epfd, ev, max, ts, mask);
  return wait_common(W_PWAIT2, epfd, ev, max, 0, ts, mask);
}
