/* molt attach <pid> <patch.so> [--timeout SEC]: a hot patch for a process
 * that was never built with molt (src/attach); and what `molt rollback`
 * and `molt status` do for such a process (an attach record exists). */
#include "cli/cli.h"

#include "attach/attach.h"

#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* The exit code of an attach failure: "no such process / not permitted"
 * as for a molt process, else the operation failed.  A run that SIGINT or
 * SIGTERM interrupted (at a safe point: the target is consistent) says
 * so, then ends with that signal, as molt would have without the run. */
static void end_if_interrupted(void) {
  int sig = molt__attach_interrupted();
  if (sig) {
    fflush(NULL);
    signal(sig, SIG_DFL);
    raise(sig);
  }
}

static int fail(const char *what, int rc, const char *err) {
  int code = rc == MOLT_ENOENT || rc == MOLT_EPERM ? EXIT_CONNECT : EXIT_FAILED;
  code = cli_fail(code, "%s: %s", what, err[0] ? err : molt_strerror(rc));
  end_if_interrupted();
  return code;
}

static void names(const molt__attach_state *st, char *buf, size_t len) {
  buf[0] = '\0';
  for (size_t i = 0; i < st->nfuncs; i++) {
    size_t used = strlen(buf);
    snprintf(buf + used, len - used, "%s%s", i ? ", " : "", st->funcs[i].name);
  }
}

/* molt's priority for this run: raised by cli_attach_raise, first thing. */
static molt__attach_priority priority;
static bool raised;

void cli_attach_raise(void) {
  molt__attach_raise(&priority);
  raised = true;
}

void cli_attach_lower(void) {
  if (raised)
    molt__attach_lower();
  raised = false;
}

/* "took T ms (start s, prepare a, staging b, ...)": where the run's time
 * went, from the creation of molt's process (start: up to the priority's
 * raise); then the priority it ran at, and how long it waited for a CPU
 * before it could raise it. */
static void print_phases(const molt__attach_state *st) {
  double total = priority.start_ms > 0 ? priority.start_ms : 0;
  for (size_t i = 0; i < st->nphases; i++)
    total += st->phases[i].ms;
  printf("took %.1f ms (", total);
  if (priority.start_ms >= 0)
    printf("start %.1f, ", priority.start_ms);
  for (size_t i = 0; i < st->nphases; i++)
    printf("%s%s %.1f", i ? ", " : "", st->phases[i].name, st->phases[i].ms);
  printf(")\n");
}

static void print_priority(void) {
  if (!raised)
    return;
  printf("priority %s", priority.how);
  if (priority.waited_ms >= 0)
    printf("; before its first step molt waited %.1f ms for a CPU", priority.waited_ms);
  printf("\n");
}

static const char *outcome_word(molt__attach_outcome o) {
  switch (o) {
  case MOLT__ATTACH_DONE:
    return "attached";
  case MOLT__ATTACH_FAILED:
    return "failed";
  case MOLT__ATTACH_ROLLED_BACK:
    return "rolled back";
  case MOLT__ATTACH_ROLLBACK_FAILED:
    return "ROLLBACK FAILED, still patched";
  case MOLT__ATTACH_GONE:
    return "exited";
  case MOLT__ATTACH_NOT_TRIED:
    break;
  }
  return "not touched";
}

/* molt attach --all PROGRAM patch.so: one line per process, then the
 * verdict (all patched, or none: the failure on stderr). */
static int attach_all(const cli_args *a) {
  cli_attach_raise(); /* kept until molt exits */
  char what[PATH_MAX + 32];
  snprintf(what, sizeof what, "attach --all %s", a->pos[0]);
  cli_sanitize(what);
  char *abs = NULL;
  int fd = -1;
  int code = cli_file_arg(what, a->pos[1], "patch", "moltcc --molt-attach", &abs, &fd);
  if (code)
    return code;
  close(fd);
  molt__attach_opts o = {.patch = abs,
                         .timeout_ms = a->timeout_ms,
                         .callback_timeout_ms = a->callback_timeout_ms,
                         .check_active = a->check_active};
  molt__attach_one *v = NULL;
  size_t n = 0, done = 0;
  char err[768] = "";
  int rc = molt__attach_all(a->pos[0], &o, &v, &n, err, sizeof err);
  for (size_t i = 0; i < n; i++) {
    const molt__attach_one *p = &v[i];
    char line[700];
    cli_sanitize(v[i].err);
    if (p->outcome == MOLT__ATTACH_DONE || p->outcome == MOLT__ATTACH_ROLLED_BACK)
      snprintf(line, sizeof line,
               " (patch %d of its stack, %d threads stopped for %.3f ms)", p->st.level,
               p->st.threads, p->st.stop_ms);
    else if (p->err[0])
      snprintf(line, sizeof line, ": %s", p->err);
    else
      line[0] = '\0';
    printf("  process %ld: %s%s\n", (long)p->pid, outcome_word(p->outcome), line);
    done += p->outcome == MOLT__ATTACH_DONE;
  }
  if (rc == 0) {
    printf("attached %s to all %zu processes of %s\n", abs, done, a->pos[0]);
    print_priority();
  } else if (n) {
    size_t kept = 0;
    for (size_t i = 0; i < n; i++)
      kept += v[i].outcome == MOLT__ATTACH_ROLLBACK_FAILED;
    fflush(stdout);
    cli_sanitize(err);
    code = cli_fail(rc == MOLT_EPERM || rc == MOLT_ENOENT ? EXIT_CONNECT : EXIT_FAILED,
                    "%s: %s; %s", what, err,
                    kept ? "and some processes patched before it could not be rolled "
                           "back (listed above)"
                         : "no process is left patched by it");
  } else {
    code = fail(what, rc, err);
  }
  free(v);
  free(abs);
  end_if_interrupted(); /* after the report: the run is whole */
  return code;
}

int cli_cmd_attach(const cli_args *a) {
  if (a->all)
    return attach_all(a);
  cli_attach_raise(); /* kept until molt exits */
  char what[64];
  snprintf(what, sizeof what, "attach %ld", (long)a->pid);
  char *abs = NULL;
  int fd = -1;
  int code = cli_file_arg(what, a->pos[1], "patch", "moltcc --molt-attach", &abs, &fd);
  if (code)
    return code;
  close(fd);
  molt__attach_opts o = {.pid = a->pid,
                         .patch = abs,
                         .timeout_ms = a->timeout_ms,
                         .callback_timeout_ms = a->callback_timeout_ms,
                         .check_active = a->check_active};
  molt__attach_state *st = cli_xmalloc(sizeof *st);
  char err[512] = "";
  int rc = molt__attach(&o, st, err, sizeof err);
  if (rc) {
    code = fail(what, rc, err);
  } else {
    char list[1024];
    names(st, list, sizeof list);
    cli_sanitize(list);
    char stepped[80] = "";
    if (st->stepped)
      snprintf(stepped, sizeof stepped,
               "; %d thread%s stepped out of the rewritten bytes", st->stepped,
               st->stepped == 1 ? "" : "s");
    printf("attached %s to %ld as patch %d of its stack: %zu function%s (%s); %d "
           "thread%s stopped for %.3f ms (%d attempt%s%s)\n",
           abs, (long)a->pid, st->level, st->nfuncs, st->nfuncs == 1 ? "" : "s", list,
           st->threads, st->threads == 1 ? "" : "s", st->stop_ms, st->attempts,
           st->attempts == 1 ? "" : "s", stepped);
    print_phases(st);
    print_priority();
    if (st->callbacks[0]) {
      cli_sanitize(st->callbacks);
      printf("callbacks: %s\n", st->callbacks);
    }
    if (st->note[0]) {
      cli_sanitize(st->note);
      printf("warning: %s\n", st->note);
    }
  }
  free(st);
  free(abs);
  end_if_interrupted(); /* after the report: the run is whole */
  return code;
}

bool cli_attached(pid_t pid) {
  molt__attach_state *st = cli_xmalloc(sizeof *st);
  char err[256];
  bool yes = molt__attach_state_load(pid, st, err, sizeof err) == 0;
  free(st);
  return yes;
}

int cli_attach_rollback(const cli_args *a) {
  char what[64];
  snprintf(what, sizeof what, "rollback %ld", (long)a->pid);
  if (a->policy)
    return cli_fail(EXIT_USAGE,
                    "%s: --policy does not apply to a process patched by molt attach",
                    what);
  molt__attach_state *st = cli_xmalloc(sizeof *st);
  char err[512] = "";
  if (a->scan_limit_mib > 0)
    molt__attach_scan_limit((uint64_t)a->scan_limit_mib << 20);
  int rc = molt__attach_rollback(a->pid, a->timeout_ms, st, err, sizeof err);
  int code = EXIT_OK;
  if (rc) {
    code = fail(what, rc, err);
  } else {
    char list[1024];
    names(st, list, sizeof list);
    cli_sanitize(list);
    cli_sanitize(st->patch);
    printf("rolled back %ld: patch %d (%s) popped, %zu function%s restored (%s); %d "
           "thread%s stopped for %.3f ms\n",
           (long)a->pid, st->level, st->patch, st->nfuncs, st->nfuncs == 1 ? "" : "s",
           list, st->threads, st->threads == 1 ? "" : "s", st->stop_ms);
    print_phases(st);
    print_priority();
    if (st->note[0]) {
      cli_sanitize(st->note);
      printf("note: %s\n", st->note);
    }
  }
  free(st);
  end_if_interrupted(); /* after the report: the run is whole */
  return code;
}

/* One function of patch s->levels[i] as JSON. */
static void json_function(cli_json *j, pid_t pid, const molt__attach_stack *s, size_t i,
                          const molt__attach_func *f) {
  char num[64], state[32];
  cli_json_object(j, true);
  cli_json_key(j, "name");
  cli_json_str(j, f->name);
  cli_json_key(j, "address");
  snprintf(num, sizeof num, "%#llx", (unsigned long long)f->addr);
  cli_json_str(j, num);
  cli_json_key(j, "new_address");
  snprintf(num, sizeof num, "%#llx", (unsigned long long)f->new_addr);
  cli_json_str(j, num);
  cli_json_key(j, "state");
  molt__attach_stack_func_state(pid, s, i, f, state, sizeof state);
  cli_json_str(j, state);
  cli_json_end(j);
}

/* The fields of one patch of the stack (the newest applied one is also
 * the top-level object, as before patches stacked). */
static void json_level(cli_json *j, pid_t pid, const molt__attach_stack *s, size_t i) {
  const molt__attach_state *st = &s->levels[i];
  char num[64];
  cli_json_key(j, "level");
  snprintf(num, sizeof num, "%d", st->level);
  cli_json_num(j, num);
  cli_json_key(j, "phase");
  cli_json_str(j, st->phase);
  cli_json_key(j, "patch");
  cli_json_str(j, st->patch);
  cli_json_key(j, "build_id");
  cli_json_str(j, st->build_id);
  cli_json_key(j, "time");
  snprintf(num, sizeof num, "%lld", st->time);
  cli_json_num(j, num);
  cli_json_key(j, "stop_ms");
  snprintf(num, sizeof num, "%.3f", st->stop_ms);
  cli_json_num(j, num);
  cli_json_key(j, "threads");
  snprintf(num, sizeof num, "%d", st->threads);
  cli_json_num(j, num);
  cli_json_key(j, "code");
  snprintf(num, sizeof num, "%#llx-%#llx", (unsigned long long)st->code_start,
           (unsigned long long)st->code_end);
  cli_json_str(j, num);
  cli_json_key(j, "note");
  cli_json_str(j, st->note);
  cli_json_key(j, "callbacks");
  cli_json_str(j, st->callbacks);
  cli_json_key(j, "functions");
  cli_json_array(j, false);
  for (size_t k = 0; k < st->nfuncs; k++)
    json_function(j, pid, s, i, &st->funcs[k]);
  cli_json_end(j);
}

int cli_attach_status(const cli_args *a) {
  molt__attach_stack s;
  char err[512] = "";
  int rc = molt__attach_stack_load(a->pid, &s, err, sizeof err);
  if (rc) {
    char what[64];
    snprintf(what, sizeof what, "status %ld", (long)a->pid);
    return fail(what, rc, err);
  }
  /* the top: the newest patch still applied, else the newest */
  size_t top = s.n - 1;
  for (size_t i = s.n; i-- > 0;) {
    if (strcmp(s.levels[i].phase, "rolled-back") != 0) {
      top = i;
      break;
    }
  }
  for (size_t i = 0; i < s.n; i++) {
    cli_sanitize(s.levels[i].patch);
    cli_sanitize(s.levels[i].note);
    cli_sanitize(s.levels[i].callbacks);
  }
  const molt__attach_state *st = &s.levels[top];
  char comm[64], when[64], num[64];
  cli_comm(a->pid, comm, sizeof comm);
  if (a->json) {
    cli_json j = {0};
    cli_json_object(&j, false);
    cli_json_key(&j, "pid");
    snprintf(num, sizeof num, "%ld", (long)a->pid);
    cli_json_num(&j, num);
    cli_json_key(&j, "mode");
    cli_json_str(&j, "attach");
    json_level(&j, a->pid, &s, top);
    cli_json_key(&j, "stack");
    cli_json_array(&j, false);
    for (size_t i = 0; i < s.n; i++) {
      cli_json_object(&j, true);
      json_level(&j, a->pid, &s, i);
      cli_json_end(&j);
    }
    cli_json_end(&j);
    cli_json_end(&j);
    cli_json_done(&j);
  } else {
    time_t t = (time_t)st->time;
    struct tm tm;
    localtime_r(&t, &tm);
    strftime(when, sizeof when, "%Y-%m-%d %H:%M:%S", &tm);
    printf("process %ld (%s): patched by molt attach (not a molt process)\n",
           (long)a->pid, comm);
    printf("  patch     %s\n  build-id  %s\n  state     %s since %s\n", st->patch,
           st->build_id, st->phase, when);
    printf("  stop      %.3f ms, %d threads, %d attempt%s\n", st->stop_ms, st->threads,
           st->attempts, st->attempts == 1 ? "" : "s");
    printf("  code      %#llx-%#llx\n", (unsigned long long)st->code_start,
           (unsigned long long)st->code_end);
    if (st->callbacks[0])
      printf("  callbacks %s\n", st->callbacks);
    if (st->note[0])
      printf("  note      %s\n", st->note);
    printf("\nstack (newest first)\n");
    cli_table tab;
    cli_table_init(&tab, 4, (const char *const[]){"LEVEL", "STATE", "STOP", "PATCH"});
    for (size_t i = s.n; i-- > 0;) {
      char lv[16], stop[32];
      snprintf(lv, sizeof lv, "%d", s.levels[i].level);
      snprintf(stop, sizeof stop, "%.3f ms", s.levels[i].stop_ms);
      cli_table_add(
          &tab, (const char *const[]){lv, s.levels[i].phase, stop, s.levels[i].patch});
    }
    cli_table_print(&tab, "  ");
    printf("\nfunctions\n");
    cli_table_init(&tab, 5,
                   (const char *const[]){"LEVEL", "NAME", "ADDRESS", "NEW", "STATE"});
    for (size_t i = s.n; i-- > 0;) {
      for (size_t k = 0; k < s.levels[i].nfuncs; k++) {
        const molt__attach_func *f = &s.levels[i].funcs[k];
        char lv[16], ad[32], nw[32], state[32];
        snprintf(lv, sizeof lv, "%d", s.levels[i].level);
        snprintf(ad, sizeof ad, "%#llx", (unsigned long long)f->addr);
        snprintf(nw, sizeof nw, "%#llx", (unsigned long long)f->new_addr);
        molt__attach_stack_func_state(a->pid, &s, i, f, state, sizeof state);
        cli_table_add(&tab, (const char *const[]){lv, f->name, ad, nw, state});
      }
    }
    cli_table_print(&tab, "  ");
  }
  molt__attach_stack_free(&s);
  return EXIT_OK;
}

bool cli_attach_logged(pid_t pid) {
  molt__attach_event *ev = NULL;
  size_t n = 0;
  bool yes = molt__attach_log_read(pid, &ev, &n) == 0;
  free(ev);
  return yes;
}

/* molt log PID of a process patched by molt attach: its attach log. */
int cli_attach_log(const cli_args *a) {
  molt__attach_event *ev = NULL;
  size_t n = 0;
  int rc = molt__attach_log_read(a->pid, &ev, &n);
  if (rc) {
    char what[64], err[128];
    snprintf(what, sizeof what, "log %ld", (long)a->pid);
    snprintf(err, sizeof err, "process %ld has no log of molt attach", (long)a->pid);
    return fail(what, rc, rc == MOLT_ENOHISTORY ? err : "");
  }
  char num[64];
  if (a->json) {
    cli_json j = {0};
    cli_json_array(&j, false);
    for (size_t i = 0; i < n; i++) {
      molt__attach_event *e = &ev[i];
      cli_json_object(&j, true);
      cli_json_key(&j, "seq");
      snprintf(num, sizeof num, "%lu", e->seq);
      cli_json_num(&j, num);
      cli_json_key(&j, "time");
      snprintf(num, sizeof num, "%lld", e->time);
      cli_json_num(&j, num);
      cli_json_key(&j, "event");
      cli_json_str(&j, e->event);
      cli_json_key(&j, "patch");
      cli_json_str(&j, e->patch);
      cli_json_key(&j, "functions");
      cli_json_array(&j, true);
      for (char *save = NULL, *f = strtok_r(e->functions, ",", &save); f;
           f = strtok_r(NULL, ",", &save))
        cli_json_str(&j, f);
      cli_json_end(&j);
      cli_json_key(&j, "stop_ms");
      snprintf(num, sizeof num, "%.3f", e->stop_ms);
      cli_json_num(&j, num);
      cli_json_key(&j, "threads");
      snprintf(num, sizeof num, "%d", e->threads);
      cli_json_num(&j, num);
      cli_json_key(&j, "message");
      cli_json_str(&j, e->message);
      cli_json_end(&j);
    }
    cli_json_end(&j);
    cli_json_done(&j);
  } else {
    cli_table tab;
    cli_table_init(&tab, 7,
                   (const char *const[]){"SEQ", "TIME", "EVENT", "PATCH", "FUNCTIONS",
                                         "STOP_MS", "MESSAGE"});
    for (size_t i = 0; i < n; i++) {
      molt__attach_event *e = &ev[i];
      char seq[32], when[64], stop[32];
      snprintf(seq, sizeof seq, "%lu", e->seq);
      time_t t = (time_t)e->time;
      struct tm tm;
      localtime_r(&t, &tm);
      strftime(when, sizeof when, "%Y-%m-%d %H:%M:%S", &tm);
      snprintf(stop, sizeof stop, "%.3f", e->stop_ms);
      cli_sanitize(e->patch);
      cli_sanitize(e->functions);
      cli_sanitize(e->message);
      cli_table_add(&tab, (const char *const[]){seq, when, e->event, e->patch,
                                                e->functions[0] ? e->functions : "-",
                                                stop, e->message[0] ? e->message : "-"});
    }
    cli_table_print(&tab, "");
  }
  free(ev);
  return EXIT_OK;
}
