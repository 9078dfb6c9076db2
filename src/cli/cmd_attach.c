/* molt attach <pid> <patch.so> [--timeout SEC]: a hot patch for a process
 * that was never built with molt (src/attach); and what `molt rollback`
 * and `molt status` do for such a process (an attach record exists). */
#include "cli/cli.h"

#include "attach/attach.h"

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
static int fail(const char *what, int rc, const char *err) {
  int code = rc == MOLT_ENOENT || rc == MOLT_EPERM ? EXIT_CONNECT : EXIT_FAILED;
  code = cli_fail(code, "%s: %s", what, err[0] ? err : molt_strerror(rc));
  int sig = molt__attach_interrupted();
  if (sig) {
    fflush(NULL);
    signal(sig, SIG_DFL);
    raise(sig);
  }
  return code;
}

static void names(const molt__attach_state *st, char *buf, size_t len) {
  buf[0] = '\0';
  for (size_t i = 0; i < st->nfuncs; i++) {
    size_t used = strlen(buf);
    snprintf(buf + used, len - used, "%s%s", i ? ", " : "", st->funcs[i].name);
  }
}

int cli_cmd_attach(const cli_args *a) {
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
    printf("attached %s to %ld: %zu function%s (%s); %d thread%s stopped for %.3f ms "
           "(%d attempt%s)\n",
           abs, (long)a->pid, st->nfuncs, st->nfuncs == 1 ? "" : "s", list, st->threads,
           st->threads == 1 ? "" : "s", st->stop_ms, st->attempts,
           st->attempts == 1 ? "" : "s");
  }
  free(st);
  free(abs);
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
  int rc = molt__attach_rollback(a->pid, a->timeout_ms, st, err, sizeof err);
  int code = EXIT_OK;
  if (rc) {
    code = fail(what, rc, err);
  } else {
    char list[1024];
    names(st, list, sizeof list);
    cli_sanitize(list);
    printf("rolled back %ld: %zu function%s restored (%s); %d thread%s stopped for %.3f "
           "ms\n",
           (long)a->pid, st->nfuncs, st->nfuncs == 1 ? "" : "s", list, st->threads,
           st->threads == 1 ? "" : "s", st->stop_ms);
    if (st->note[0]) {
      cli_sanitize(st->note);
      printf("note: %s\n", st->note);
    }
  }
  free(st);
  return code;
}

static const char *live_word(int live) {
  return live == 1 ? "patched" : live == 0 ? "original" : "changed";
}

int cli_attach_status(const cli_args *a) {
  molt__attach_state *st = cli_xmalloc(sizeof *st);
  char err[512] = "";
  int rc = molt__attach_state_load(a->pid, st, err, sizeof err);
  if (rc) {
    free(st);
    char what[64];
    snprintf(what, sizeof what, "status %ld", (long)a->pid);
    return fail(what, rc, err);
  }
  char comm[64], when[64], num[64];
  cli_comm(a->pid, comm, sizeof comm);
  time_t t = (time_t)st->time;
  struct tm tm;
  localtime_r(&t, &tm);
  strftime(when, sizeof when, "%Y-%m-%d %H:%M:%S", &tm);
  cli_sanitize(st->patch);
  cli_sanitize(st->note);
  if (a->json) {
    cli_json j = {0};
    cli_json_object(&j, false);
    cli_json_key(&j, "pid");
    snprintf(num, sizeof num, "%ld", (long)a->pid);
    cli_json_num(&j, num);
    cli_json_key(&j, "mode");
    cli_json_str(&j, "attach");
    cli_json_key(&j, "phase");
    cli_json_str(&j, st->phase);
    cli_json_key(&j, "patch");
    cli_json_str(&j, st->patch);
    cli_json_key(&j, "build_id");
    cli_json_str(&j, st->build_id);
    cli_json_key(&j, "time");
    snprintf(num, sizeof num, "%lld", st->time);
    cli_json_num(&j, num);
    cli_json_key(&j, "stop_ms");
    snprintf(num, sizeof num, "%.3f", st->stop_ms);
    cli_json_num(&j, num);
    cli_json_key(&j, "threads");
    snprintf(num, sizeof num, "%d", st->threads);
    cli_json_num(&j, num);
    cli_json_key(&j, "code");
    snprintf(num, sizeof num, "%#llx-%#llx", (unsigned long long)st->code_start,
             (unsigned long long)st->code_end);
    cli_json_str(&j, num);
    cli_json_key(&j, "note");
    cli_json_str(&j, st->note);
    cli_json_key(&j, "functions");
    cli_json_array(&j, false);
    for (size_t i = 0; i < st->nfuncs; i++) {
      const molt__attach_func *f = &st->funcs[i];
      cli_json_object(&j, true);
      cli_json_key(&j, "name");
      cli_json_str(&j, f->name);
      cli_json_key(&j, "address");
      snprintf(num, sizeof num, "%#llx", (unsigned long long)f->addr);
      cli_json_str(&j, num);
      cli_json_key(&j, "new_address");
      snprintf(num, sizeof num, "%#llx", (unsigned long long)f->new_addr);
      cli_json_str(&j, num);
      cli_json_key(&j, "state");
      cli_json_str(&j, live_word(molt__attach_func_live(a->pid, f)));
      cli_json_end(&j);
    }
    cli_json_end(&j);
    cli_json_end(&j);
    cli_json_done(&j);
  } else {
    printf("process %ld (%s): patched by molt attach (not a molt process)\n",
           (long)a->pid, comm);
    printf("  patch     %s\n  build-id  %s\n  state     %s since %s\n", st->patch,
           st->build_id, st->phase, when);
    printf("  stop      %.3f ms, %d threads, %d attempt%s\n", st->stop_ms, st->threads,
           st->attempts, st->attempts == 1 ? "" : "s");
    printf("  code      %#llx-%#llx\n", (unsigned long long)st->code_start,
           (unsigned long long)st->code_end);
    if (st->note[0])
      printf("  note      %s\n", st->note);
    printf("\nfunctions\n");
    cli_table tab;
    cli_table_init(&tab, 4, (const char *const[]){"NAME", "ADDRESS", "NEW", "STATE"});
    for (size_t i = 0; i < st->nfuncs; i++) {
      const molt__attach_func *f = &st->funcs[i];
      char ad[32], nw[32];
      snprintf(ad, sizeof ad, "%#llx", (unsigned long long)f->addr);
      snprintf(nw, sizeof nw, "%#llx", (unsigned long long)f->new_addr);
      cli_table_add(&tab,
                    (const char *const[]){f->name, ad, nw,
                                          live_word(molt__attach_func_live(a->pid, f))});
    }
    cli_table_print(&tab, "  ");
  }
  free(st);
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
