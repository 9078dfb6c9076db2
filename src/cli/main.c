/*
 * molt -- the command-line client of the molt control protocol.
 *
 *   molt ps | status | apply | rollback | log | update | shadow | promote |
 *   commit | attach | run |
 *   help | --version
 *
 * One command table: the commands of the operations come from the table of
 * operations (MOLT__OPS, common/protocol.h) -- name, what they send,
 * which options they take, their line in `molt help` -- and the local
 * commands are listed beside them.  Arguments are checked here against the
 * table; a command's handler (cmd_*.c) gets them checked.
 */
#include "cli/cli.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

typedef struct command {
  const char *name;
  unsigned op;          /* MOLT__OP_* it sends; 0: none (a local command) */
  unsigned flags;       /* MOLT__OPF_*: which options it takes */
  const char *file;     /* its second argument names a "patch", an "image" */
  bool pid;             /* its first argument is a process id */
  bool raw;             /* takes the rest of the command line as it is */
  const char *synopsis; /* NULL: built from the fields above */
  const char *summary;
  int (*handler)(const cli_args *a);
  const char *const *aliases;
} command;

static const command commands[] = {
    {"ps", 0, 0, NULL, false, false, NULL,
     "list molt processes: PID USER COMMAND GENERATION STATE", cli_cmd_ps, NULL},
#define MOLT__CLI_COMMAND(NAME, name, code, flags, modes, file, summary)                 \
  {#name, MOLT__OP_##NAME, (flags),        (file), true, false,                          \
   NULL,  (summary),       cli_cmd_##name, NULL},
    MOLT__OPS(MOLT__CLI_COMMAND)
#undef MOLT__CLI_COMMAND
        {"attach", 0, MOLT__OPF_TIMEOUT | MOLT__OPF_CALLBACKS, "patch", true, false,
         "molt attach <pid>|--all <program> <patch.so> [--timeout SEC] "
         "[--callback-timeout SEC] [--check-active]",
         "hot-patch a process not built with molt (patch built with 'moltcc "
         "--molt-attach'), on top of the patches it has; --all: every process of the "
         "program, all or none; rollback and status work on it too",
         cli_cmd_attach, NULL},
    {"run", 0, 0, NULL, false, true, "molt run <image.so> [args...]",
     "run a program image (built with 'moltcc --molt-program') in this process",
     cli_cmd_run, NULL},
    {"help", 0, 0, NULL, false, true, "molt help", "this text", cli_cmd_help,
     (const char *const[]){"--help", "-h", NULL}},
    {"--version", 0, 0, NULL, false, true, "molt --version",
     "version of molt and of its protocol", cli_cmd_version,
     (const char *const[]){"version", NULL}},
};
#define NCOMMANDS (sizeof commands / sizeof commands[0])

/* ---- usage ------------------------------------------------------------------- */

static void synopsis(const command *c, char *buf, size_t len) {
  if (c->synopsis) {
    snprintf(buf, len, "%s", c->synopsis);
    return;
  }
  snprintf(buf, len, "molt %s%s%s%s%s%s%s%s", c->name, c->pid ? " <pid>" : "",
           c->file ? " <" : "", c->file ? c->file : "", c->file ? ".so>" : "",
           c->flags & MOLT__OPF_REPORT ? " [--json]" : "",
           c->flags & MOLT__OPF_POLICY ? " [--policy P]" : "",
           c->flags & MOLT__OPF_TIMEOUT ? " [--timeout SEC]" : "");
  if (c->flags & MOLT__OPF_INTERIOR)
    snprintf(buf + strlen(buf), len - strlen(buf), " [--check-interior]");
  if (c->op == MOLT__OP_UPDATE)
    snprintf(buf + strlen(buf), len - strlen(buf),
             " [--shadow [--rules FILE] [--retries N]]");
  if (c->flags & MOLT__OPF_CALLBACKS)
    snprintf(buf + strlen(buf), len - strlen(buf), " [--callback-timeout SEC]");
  if (c->flags & MOLT__OPF_RULES)
    snprintf(buf + strlen(buf), len - strlen(buf), " [--rules FILE]");
  if (c->flags & MOLT__OPF_RETRIES)
    snprintf(buf + strlen(buf), len - strlen(buf), " [--retries N [--retry-delay SEC]]");
}

/* Words of text, wrapped before column 80, every line indented by col. */
static void wrapped(FILE *out, const char *text, int col, int at) {
  const char *p = text;
  while (*p) {
    size_t w = strcspn(p, " ");
    if (at + 1 + (int)w > 79 && at > col) {
      fprintf(out, "\n%*s", col, "");
      at = col;
    } else if (at > col) {
      fputc(' ', out);
      at++;
    }
    fwrite(p, 1, w, out);
    at += (int)w;
    p += w;
    while (*p == ' ')
      p++;
  }
  fputc('\n', out);
}

void cli_usage(FILE *out) {
  fputs("usage: molt <command> [arguments]\n\ncommands:\n", out);
  const int col = 35;
  for (size_t i = 0; i < NCOMMANDS; i++) {
    char syn[160];
    synopsis(&commands[i], syn, sizeof syn);
    int n = fprintf(out, "  %s", syn);
    if (n + 1 > col) {
      fprintf(out, "\n%*s", col, "");
      n = col;
    } else {
      fprintf(out, "%*s", col - n, "");
      n = col;
    }
    wrapped(out, commands[i].summary, col, n);
  }
  fputs("\noptions:\n"
        "  --policy immediate|local|global  when threads switch to the new generation\n"
        "                                   (default: immediate)\n"
        "  --timeout SEC                    how long to wait for threads to reach\n"
        "                                   update points (default: 10 s)\n"
        "  --callback-timeout SEC           how long apply waits for each callback of\n"
        "                                   the patch (default: 5 s)\n"
        "  --json                           the report as JSON\n"
        "  --check-interior                 refuse an update whose old state has\n"
        "                                   pointers into the interior of objects\n"
        "  --rules FILE                     update --shadow: the expected divergences\n"
        "                                   (docs/guide.md section 9)\n"
        "  --retries N                      update --shadow: a follower that diverges,\n"
        "                                   crashes or fails its update is replaced by\n"
        "                                   a new one forked at the next update points,\n"
        "                                   up to N times (0 to 100; default: 0)\n"
        "  --retry-delay SEC                how long after a follower ended the next\n"
        "                                   one forks (0 to 3600; default: 1 s)\n"
        "  --check-active                   attach: no thread may be inside, or return\n"
        "                                   into, a function being replaced\n"
        "  --scan-limit MIB                 rollback of an attached process: read at\n"
        "                                   most MIB of its memory with its threads\n"
        "                                   stopped, looking for pointers into the\n"
        "                                   patch (default: 64; more keeps the code\n"
        "                                   mapped)\n"
        "\n"
        "exit status:\n"
        "  0  success\n"
        "  1  the process refused or failed the operation (it keeps running\n"
        "     unchanged)\n"
        "  2  usage error (bad arguments, patch or image file not found)\n"
        "  3  no such molt process, cannot connect, not permitted, or no answer\n"
        "     in time\n"
        "  4  protocol error (malformed or incompatible messages)\n"
        "\n"
        "Only the process's owner and root may control it.  See molt(1).\n",
        out);
}

/* ---- arguments --------------------------------------------------------------- */

/* SEC as a positive decimal number of seconds (fractions allowed), at most
 * one day; returns milliseconds rounded up, or -1. */
static int parse_timeout(const char *s) {
  char *end;
  errno = 0;
  double v = strtod(s, &end);
  if (end == s || *end != '\0' || errno != 0 || !isfinite(v) || v <= 0 || v > 86400)
    return -1;
  double ms = v * 1000.0;
  int r = (int)ms; /* round up by hand: no libm for one ceil() */
  return r < ms ? r + 1 : r;
}

/* SEC as a decimal number of seconds from 0 to 3600 (fractions allowed);
 * returns milliseconds rounded up, or -1. */
static int parse_delay(const char *s) {
  char *end;
  errno = 0;
  double v = strtod(s, &end);
  if (end == s || *end != '\0' || errno != 0 || !isfinite(v) || v < 0 ||
      v > MOLT__MAX_RETRY_DELAY_MS / 1000)
    return -1;
  double ms = v * 1000.0;
  int r = (int)ms;
  return r < ms ? r + 1 : r;
}

/* The commands that take an option (flag), as "a, b and c". */
static void takers(unsigned flag, char *buf, size_t len) {
  size_t n = 0, k = 0;
  for (size_t i = 0; i < NCOMMANDS; i++)
    n += (commands[i].flags & flag) != 0;
  buf[0] = '\0';
  for (size_t i = 0; i < NCOMMANDS; i++) {
    if (!(commands[i].flags & flag))
      continue;
    k++;
    size_t used = strlen(buf);
    snprintf(buf + used, len - used, "%s%s",
             k == 1   ? ""
             : k == n ? " and "
                      : ", ",
             commands[i].name);
  }
}

/* Parses the words after the command.  Options may come anywhere; "--"
 * ends them.  Returns 0 or EXIT_USAGE (having printed why). */
static int parse_args(int argc, char **argv, cli_args *o) {
  bool more_opts = true;
  for (int i = 2; i < argc; i++) {
    const char *a = argv[i];
    if (more_opts && strcmp(a, "--") == 0) {
      more_opts = false;
      continue;
    }
    if (more_opts && a[0] == '-' && a[1] != '\0') {
      const char *val = NULL;
      size_t klen = strcspn(a, "=");
      bool want_val = strncmp(a, "--policy", klen) == 0 && klen == 8;
      want_val |= strncmp(a, "--timeout", klen) == 0 && klen == 9;
      want_val |= strncmp(a, "--callback-timeout", klen) == 0 && klen == 18;
      want_val |= strncmp(a, "--rules", klen) == 0 && klen == 7;
      want_val |= strncmp(a, "--scan-limit", klen) == 0 && klen == 12;
      want_val |= strncmp(a, "--retries", klen) == 0 && klen == 9;
      want_val |= strncmp(a, "--retry-delay", klen) == 0 && klen == 13;
      if (want_val) {
        if (a[klen] == '=')
          val = a + klen + 1;
        else if (i + 1 < argc)
          val = argv[++i];
        else
          return cli_fail(EXIT_USAGE, "%s: option %s needs a value; see 'molt help'",
                          o->cmd, a);
      }
      molt_policy_t p;
      if (strcmp(a, "--json") == 0) {
        o->json = true;
      } else if (strcmp(a, "--all") == 0) {
        o->all = true;
      } else if (strcmp(a, "--check-interior") == 0) {
        o->check_interior = true;
      } else if (strcmp(a, "--check-active") == 0) {
        o->check_active = true;
      } else if (strcmp(a, "--shadow") == 0) {
        o->shadow = true;
      } else if (klen == 7 && strncmp(a, "--rules", 7) == 0) {
        o->rules = val;
      } else if (klen == 9 && strncmp(a, "--retries", 9) == 0) {
        char *end;
        errno = 0;
        long n = strtol(val, &end, 10);
        if (errno || end == val || *end || n < 0 || n > MOLT__MAX_RETRIES)
          return cli_fail(
              EXIT_USAGE,
              "%s: invalid number of retries '%s'; give a whole number from 0 "
              "to %d",
              o->cmd, val, MOLT__MAX_RETRIES);
        o->retries = (int)n;
      } else if (klen == 13 && strncmp(a, "--retry-delay", 13) == 0) {
        o->retry_delay_ms = parse_delay(val);
        if (o->retry_delay_ms < 0)
          return cli_fail(EXIT_USAGE,
                          "%s: invalid retry delay '%s'; give a number of seconds from 0 "
                          "to %d",
                          o->cmd, val, MOLT__MAX_RETRY_DELAY_MS / 1000);
      } else if (klen == 12 && strncmp(a, "--scan-limit", 12) == 0) {
        char *end;
        errno = 0;
        long mib = strtol(val, &end, 10);
        if (errno || end == val || *end || mib < 1 || mib > (1l << 30))
          return cli_fail(EXIT_USAGE,
                          "%s: invalid scan limit '%s'; give a number of MiB greater "
                          "than 0",
                          o->cmd, val);
        o->scan_limit_mib = mib;
      } else if (klen == 8 && strncmp(a, "--policy", 8) == 0) {
        if (!molt__policy_parse(val, &p))
          return cli_fail(EXIT_USAGE,
                          "%s: unknown policy '%s'; use immediate, local or global",
                          o->cmd, val);
        o->policy = val;
      } else if (klen == 9 && strncmp(a, "--timeout", 9) == 0) {
        o->timeout_ms = parse_timeout(val);
        if (o->timeout_ms < 0)
          return cli_fail(
              EXIT_USAGE,
              "%s: invalid timeout '%s'; give a number of seconds greater than "
              "0 and at most 86400",
              o->cmd, val);
      } else if (klen == 18 && strncmp(a, "--callback-timeout", 18) == 0) {
        o->callback_timeout_ms = parse_timeout(val);
        if (o->callback_timeout_ms < 0)
          return cli_fail(
              EXIT_USAGE,
              "%s: invalid callback timeout '%s'; give a number of seconds greater "
              "than 0 and at most 86400",
              o->cmd, val);
      } else {
        return cli_fail(EXIT_USAGE, "%s: unknown option '%s'; see 'molt help'", o->cmd,
                        a);
      }
      continue;
    }
    if (o->npos == 3)
      return cli_fail(EXIT_USAGE, "%s: unexpected argument '%s'; see 'molt help'", o->cmd,
                      a);
    o->pos[o->npos++] = a;
  }
  return 0;
}

/* The options and arguments against what the command takes. */
static int check_args(const command *c, const cli_args *o) {
  char list[128], syn[160];
  if (o->json && !(c->flags & MOLT__OPF_REPORT))
    return cli_fail(EXIT_USAGE, "%s: --json is not supported here; see 'molt help'",
                    o->cmd);
  if ((o->policy || o->timeout_ms >= 0) &&
      !(c->flags & (MOLT__OPF_POLICY | MOLT__OPF_TIMEOUT))) {
    takers(MOLT__OPF_POLICY | MOLT__OPF_TIMEOUT, list, sizeof list);
    return cli_fail(EXIT_USAGE,
                    "%s: --policy and --timeout apply only to %s; see 'molt help'",
                    o->cmd, list);
  }
  if (o->policy && !(c->flags & MOLT__OPF_POLICY))
    return cli_fail(EXIT_USAGE,
                    "%s: --policy does not apply to %s (it always waits at the update "
                    "points); see 'molt help'",
                    o->cmd, o->cmd);
  if (o->callback_timeout_ms >= 0 && !(c->flags & MOLT__OPF_CALLBACKS)) {
    takers(MOLT__OPF_CALLBACKS, list, sizeof list);
    return cli_fail(EXIT_USAGE,
                    "%s: --callback-timeout applies only to %s; see 'molt help'", o->cmd,
                    list);
  }
  if (o->all && c->handler != cli_cmd_attach)
    return cli_fail(EXIT_USAGE, "%s: --all applies only to attach; see 'molt help'",
                    o->cmd);
  if (o->check_interior && !(c->flags & MOLT__OPF_INTERIOR)) {
    takers(MOLT__OPF_INTERIOR, list, sizeof list);
    return cli_fail(EXIT_USAGE,
                    "%s: --check-interior applies only to %s; see 'molt help'", o->cmd,
                    list);
  }
  if (o->check_active && strcmp(c->name, "attach") != 0)
    return cli_fail(EXIT_USAGE,
                    "%s: --check-active applies only to attach; see 'molt help'", o->cmd);
  if (o->scan_limit_mib >= 0 && c->op != MOLT__OP_ROLLBACK)
    return cli_fail(EXIT_USAGE,
                    "%s: --scan-limit applies only to rollback (of an attached process); "
                    "see 'molt help'",
                    o->cmd);
  if (o->shadow && c->op != MOLT__OP_UPDATE)
    return cli_fail(EXIT_USAGE, "%s: --shadow applies only to update; see 'molt help'",
                    o->cmd);
  if (o->rules && !o->shadow && c->op != MOLT__OP_SHADOW)
    return cli_fail(
        EXIT_USAGE,
        "%s: --rules applies only to a shadowed update (update --shadow); see "
        "'molt help'",
        o->cmd);
  if ((o->retries >= 0 || o->retry_delay_ms >= 0) && !o->shadow &&
      c->op != MOLT__OP_SHADOW)
    return cli_fail(EXIT_USAGE,
                    "%s: --%s applies only to a shadowed update (update --shadow); see "
                    "'molt help'",
                    o->cmd, o->retries >= 0 ? "retries" : "retry-delay");
  if (o->retry_delay_ms >= 0 && o->retries < 0)
    return cli_fail(EXIT_USAGE,
                    "%s: --retry-delay needs --retries N (how many times to try again); "
                    "see 'molt help'",
                    o->cmd);
  if (o->shadow && o->check_interior)
    return cli_fail(EXIT_USAGE,
                    "%s: --check-interior does not apply to a shadowed update yet; see "
                    "'molt help'",
                    o->cmd);
  int npos = (c->pid ? 1 : 0) + (c->file ? 1 : 0);
  if (o->npos != npos) {
    synopsis(c, syn, sizeof syn);
    return cli_fail(EXIT_USAGE, "%s: %s arguments; usage: %s", o->cmd,
                    o->npos < npos ? "missing" : "too many", syn);
  }
  return 0;
}

static const command *find(const char *name) {
  for (size_t i = 0; i < NCOMMANDS; i++) {
    if (strcmp(name, commands[i].name) == 0)
      return &commands[i];
    for (const char *const *a = commands[i].aliases; a && *a; a++)
      if (strcmp(name, *a) == 0)
        return &commands[i];
  }
  return NULL;
}

int main(int argc, char **argv) {
  if (argc < 2)
    return cli_fail(EXIT_USAGE, "no command given; run 'molt help' for usage");
  cli_args o = {.cmd = argv[1],
                .timeout_ms = -1,
                .callback_timeout_ms = -1,
                .scan_limit_mib = -1,
                .retries = -1,
                .retry_delay_ms = -1,
                .argc = argc,
                .argv = argv};
  const command *c = find(argv[1]);
  if (!c)
    return cli_fail(EXIT_USAGE, "unknown command '%s'; run 'molt help' for usage",
                    argv[1]);
  if (c->raw)
    return c->handler(&o);
  int code = parse_args(argc, argv, &o);
  if (code == 0)
    code = check_args(c, &o);
  if (code != 0)
    return code;
  if (c->pid && !o.all && !cli_parse_pid(o.pos[0], &o.pid))
    return cli_fail(
        EXIT_USAGE,
        "%s: '%s' is not a process id; give the numeric pid shown by 'molt ps'", o.cmd,
        o.pos[0]);
  return c->handler(&o);
}
