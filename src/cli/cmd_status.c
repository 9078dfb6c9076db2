/* molt status <pid> [--json]: the state of a molt process -- generation,
 * modules, patches, live generations, functions, threads, and the program
 * image of a process started with `molt run`. */
#include "cli/cli.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>

/* Each kind of record, once: its JSON members and its table columns. */
static const cli_view programs = {
    "program", "programs", "programs",
    CLI_FIELDS({"path", 1, CLI_STR}, {"build_id", 2, CLI_STR}),
    CLI_COLUMNS({"PATH", 1, CLI_AS_IS}, {"BUILD-ID", 2, CLI_AS_IS})};
static const cli_view patches = {
    "patch", "patches", "patches, bottom first",
    CLI_FIELDS({"position", 1, CLI_NUM}, {"id", 2, CLI_STR}, {"description", 3, CLI_STR},
               {"path", 4, CLI_STR}, {"generation", 5, CLI_NUM}, {"replaced", 7, CLI_STR},
               {"built_from", 6, CLI_STR}, {"kept_loaded", 8, CLI_OPT},
               {"file", 9, CLI_STR}, {"sha256", 10, CLI_STR}, {"callbacks", 11, CLI_OPT}),
    CLI_COLUMNS({"#", 1, CLI_AS_IS}, {"ID", 2, CLI_AS_IS}, {"GENERATION", 5, CLI_AS_IS},
                {"REPLACED", 7, CLI_AS_IS}, {"BUILT-FROM", 6, CLI_AS_IS},
                {"KEPT-LOADED", 8, CLI_AS_IS}, {"CALLBACKS", 11, CLI_AS_IS},
                {"PATH", 4, CLI_AS_IS}, {"FILE", 9, CLI_AS_IS}, {"SHA256", 10, CLI_AS_IS},
                {"DESCRIPTION", 3, CLI_AS_IS})};
static const cli_view objects = {
    "object", "objects", "loaded patch objects",
    CLI_FIELDS({"id", 1, CLI_STR}, {"path", 2, CLI_STR}, {"generation", 3, CLI_NUM},
               {"refs", 4, CLI_NUM}, {"kept_loaded", 5, CLI_OPT},
               {"callbacks", 6, CLI_OPT}),
    CLI_COLUMNS({"ID", 1, CLI_AS_IS}, {"LOADED-IN", 3, CLI_AS_IS}, {"REFS", 4, CLI_AS_IS},
                {"KEPT-LOADED", 5, CLI_AS_IS}, {"CALLBACKS", 6, CLI_AS_IS},
                {"PATH", 2, CLI_AS_IS})};
static const cli_view lives = {
    "live", "live_generations", "live generations",
    CLI_FIELDS({"generation", 1, CLI_NUM}, {"slot", 2, CLI_NUM}, {"state", 3, CLI_STR},
               {"active_calls", 4, CLI_NUM}),
    CLI_COLUMNS({"GENERATION", 1, CLI_AS_IS}, {"SLOT", 2, CLI_AS_IS},
                {"STATE", 3, CLI_AS_IS}, {"ACTIVE-CALLS", 4, CLI_AS_IS})};
static const cli_view functions = {
    "function", "functions", "updatable functions",
    CLI_FIELDS({"name", 1, CLI_STR}, {"tu", 2, CLI_STR}, {"static", 3, CLI_BOOL},
               {"version", 4, CLI_STR}, {"entry", 5, CLI_STR}),
    CLI_COLUMNS({"NAME", 1, CLI_AS_IS}, {"FILE", 2, CLI_AS_IS}, {"STATIC", 3, CLI_YESNO},
                {"VERSION", 4, CLI_AS_IS}, {"ENTRY", 5, CLI_AS_IS})};
static const cli_view threads = {
    "thread", "threads", "threads",
    CLI_FIELDS({"tid", 1, CLI_NUM}, {"name", 2, CLI_STR}, {"view", 3, CLI_VIEW},
               {"active_calls", 4, CLI_NUM}),
    CLI_COLUMNS({"TID", 1, CLI_AS_IS}, {"NAME", 2, CLI_AS_IS}, {"RUNS", 3, CLI_AS_IS},
                {"ACTIVE-CALLS", 4, CLI_AS_IS})};
static const cli_view program_threads = {
    "program_thread", "program_threads", "program threads",
    CLI_FIELDS({"tid", 1, CLI_NUM}, {"entry", 2, CLI_STR}, {"tu", 3, CLI_STR},
               {"updating", 4, CLI_BOOL}, {"from_point", 5, CLI_OPT}),
    CLI_COLUMNS({"TID", 1, CLI_AS_IS}, {"ENTRY", 2, CLI_AS_IS}, {"FILE", 3, CLI_AS_IS},
                {"UPDATING", 4, CLI_YESNO}, {"FROM-POINT", 5, CLI_AS_IS})};
/* Control connections refused for their uid (another user), per uid:
 * "other" counts the uids beyond the first 8, "unknown" clients whose
 * credentials were unavailable. */
static const cli_view refused = {
    "denied", "refused_connections", "control connections refused (other users)",
    CLI_FIELDS({"uid", 1, CLI_STR}, {"count", 2, CLI_NUM}, {"first", 3, CLI_NUM},
               {"last", 4, CLI_NUM}, {"last_pid", 5, CLI_NUM}),
    CLI_COLUMNS({"UID", 1, CLI_AS_IS}, {"REFUSED", 2, CLI_AS_IS},
                {"FIRST (UNIX TIME)", 3, CLI_AS_IS}, {"LAST", 4, CLI_AS_IS},
                {"LAST-PID", 5, CLI_AS_IS})};
/* The one "image" record, a JSON object of its own. */
static const cli_field image[] = {{"path", 1, CLI_STR},         {"build_id", 2, CLI_STR},
                                  {"full_updates", 3, CLI_NUM}, {"unloading", 4, CLI_OPT},
                                  {"last_abort", 5, CLI_OPT},   {"file", 6, CLI_STR},
                                  {"sha256", 7, CLI_STR},       {NULL, 0, 0}};

/* The one "shadow" record (a shadowed update, docs/design.md §17), a JSON
 * object of its own; null when the process never had one. */
static const cli_field shadow[] = {{"stage", 1, CLI_STR},
                                   {"follower", 2, CLI_NUM},
                                   {"image", 3, CLI_STR},
                                   {"recorded", 4, CLI_NUM},
                                   {"compared", 5, CLI_NUM},
                                   {"ring_use_pct", 6, CLI_NUM},
                                   {"divergences", 7, CLI_NUM},
                                   {"outcome", 8, CLI_OPT},
                                   {"rules", 9, CLI_NUM},
                                   {"rule_decided", 10, CLI_NUM},
                                   {"attempt", 11, CLI_NUM},
                                   {"attempts", 12, CLI_NUM},
                                   {NULL, 0, 0}};

static const char *field(const molt__records *rs, const char *key, size_t i,
                         const char *dflt);

/* Calls still running version 0 of a replaced function (the runtime's
 * `old` records: see status.c and core/oldcode.c).  One that has run it
 * longer than the threshold is flagged: a loop that never returns. */
#define OLD_CODE_SECONDS_DEFAULT 10
static const cli_field old_code[] = {{"function", 1, CLI_STR},
                                     {"tu", 2, CLI_STR},
                                     {"static", 3, CLI_BOOL},
                                     {"tid", 4, CLI_NUM},
                                     {"thread", 5, CLI_STR},
                                     {"version", 6, CLI_NUM},
                                     {NULL, 0, 0}};

/* $MOLT_OLD_CODE_SECONDS, else 10. */
static double old_code_threshold(void) {
  const char *e = getenv("MOLT_OLD_CODE_SECONDS");
  char *end;
  double v = e && *e ? strtod(e, &end) : -1;
  return v >= 0 && e && *end == '\0' ? v : OLD_CODE_SECONDS_DEFAULT;
}

/* Seconds since the record's `since` (CLOCK_REALTIME ns), -1 if unknown. */
static double running_for(const molt__record *r) {
  const char *s = cli_field_of(r, 7);
  if (!cli_is_number(s))
    return -1;
  struct timespec now;
  clock_gettime(CLOCK_REALTIME, &now);
  double d = (double)now.tv_sec + now.tv_nsec / 1e9 - strtod(s, NULL) / 1e9;
  return d < 0 ? 0 : d;
}

static void since_text(const molt__record *r, char *buf, size_t len) {
  time_t t = (time_t)(strtoull(cli_field_of(r, 7), NULL, 10) / 1000000000ull);
  struct tm tm;
  localtime_r(&t, &tm);
  strftime(buf, len, "%Y-%m-%d %H:%M:%S", &tm);
}

static void old_code_json(cli_json *j, const molt__records *rs) {
  double threshold = old_code_threshold();
  cli_json_key(j, "old_code");
  cli_json_array(j, false);
  for (size_t i = 0; i < rs->count; i++) {
    const molt__record *r = &rs->recs[i];
    if (strcmp(cli_field_of(r, 0), "old") != 0)
      continue;
    cli_json_object(j, true);
    for (const cli_field *f = old_code; f->json; f++)
      cli_json_field(j, r, f);
    char num[32];
    double d = running_for(r);
    snprintf(num, sizeof num, "%.3f",
             cli_field_of(r, 7)[0] ? strtod(cli_field_of(r, 7), NULL) / 1e9 : 0);
    cli_json_key(j, "since");
    cli_json_num(j, num);
    snprintf(num, sizeof num, "%.3f", d);
    cli_json_key(j, "seconds");
    cli_json_num(j, num);
    cli_json_key(j, "never_returns");
    cli_json_bool(j, d >= threshold);
    cli_json_end(j);
  }
  cli_json_end(j);
  cli_json_key(j, "old_code_uninspected");
  cli_json_num(j, field(rs, "oldscan", 1, ""));
}

static void old_code_human(const molt__records *rs) {
  size_t n = cli_count(rs, "old");
  printf("\nold versions still running");
  if (n == 0)
    printf(": none seen");
  else
    printf(" (%zu)", n);
  const char *un = field(rs, "oldscan", 1, "0");
  if (strcmp(un, "0") != 0)
    printf(" (%s thread%s running, not looked at)", un, strcmp(un, "1") == 0 ? "" : "s");
  printf("\n");
  double threshold = old_code_threshold();
  for (size_t i = 0; i < rs->count; i++) {
    const molt__record *r = &rs->recs[i];
    if (strcmp(cli_field_of(r, 0), "old") != 0)
      continue;
    char since[32], line[1024];
    double d = running_for(r);
    since_text(r, since, sizeof since);
    bool is_static = strcmp(cli_field_of(r, 3), "1") == 0;
    snprintf(line, sizeof line,
             "  %s%s%s%s: still running version %s on thread %s (%s) since %s (%.0f s)%s",
             cli_field_of(r, 1), is_static ? " (" : "",
             is_static ? cli_field_of(r, 2) : "", is_static ? ")" : "",
             cli_field_of(r, 6), cli_field_of(r, 4), cli_field_of(r, 5), since, d,
             d >= threshold ? ": a loop that never returns; a full update replaces it"
                            : "");
    cli_sanitize(line);
    puts(line);
  }
}

static const char *field(const molt__records *rs, const char *key, size_t i,
                         const char *dflt) {
  const molt__record *r = molt__tsv_find(rs, key);
  return r ? cli_field_of(r, i) : dflt;
}

static void status_json(pid_t pid, const molt__records *rs) {
  cli_json j = {0};
  cli_json_object(&j, false);
  cli_json_key(&j, "pid");
  char own[16];
  snprintf(own, sizeof own, "%ld", (long)pid);
  const char *p = field(rs, "pid", 1, own);
  cli_json_num(&j, cli_is_number(p) ? p : own);
  const char *state = field(rs, "state", 1, "unknown");
  cli_json_key(&j, "state");
  cli_json_str(&j, state);
  cli_json_key(&j, "refusing_reason");
  if (strcmp(state, "refusing") == 0)
    cli_json_str(&j, field(rs, "state", 2, ""));
  else
    cli_json_null(&j);
  cli_json_key(&j, "generation");
  cli_json_num(&j, field(rs, "generation", 1, ""));
  cli_json_key(&j, "reclaim");
  const char *rc = field(rs, "reclaim", 1, NULL);
  if (rc)
    cli_json_bool(&j, strcmp(rc, "enabled") == 0);
  else
    cli_json_null(&j);
  const cli_view *arrays[] = {&programs, &patches,   &objects,
                              &lives,    &functions, &threads};
  for (size_t i = 0; i < sizeof arrays / sizeof arrays[0]; i++)
    cli_json_records(&j, rs, arrays[i]);
  /* Full updates: the program image (null unless started by molt run). */
  cli_json_key(&j, "image");
  const molt__record *im = molt__tsv_find(rs, "image");
  if (im) {
    cli_json_object(&j, true);
    for (const cli_field *f = image; f->json; f++)
      cli_json_field(&j, im, f);
    cli_json_end(&j);
  } else {
    cli_json_null(&j);
  }
  cli_json_records(&j, rs, &program_threads);
  cli_json_key(&j, "shadow");
  const molt__record *sh = molt__tsv_find(rs, "shadow");
  if (sh) {
    cli_json_object(&j, true);
    for (const cli_field *f = shadow; f->json; f++)
      cli_json_field(&j, sh, f);
    cli_json_end(&j);
  } else {
    cli_json_null(&j);
  }
  cli_json_records(&j, rs, &refused);
  old_code_json(&j, rs);
  cli_json_end(&j);
  cli_json_done(&j);
}

/* One table of the human status: title, count, rows. */
static void section(const molt__records *rs, const cli_view *v) {
  size_t n = cli_count(rs, v->key);
  printf("\n%s", v->title);
  if (n == 0) {
    printf(": none\n");
    return;
  }
  printf(" (%zu)\n", n);
  cli_table_records(rs, v, "  ");
}

static void status_human(pid_t pid, const molt__records *rs) {
  const char *st = field(rs, "state", 1, "unknown");
  char comm[64];
  cli_comm(pid, comm, sizeof comm);
  cli_sanitize(comm);
  char state[1024];
  if (strcmp(st, "refusing") == 0)
    snprintf(state, sizeof state, "REFUSING updates: %s", field(rs, "state", 2, ""));
  else
    snprintf(state, sizeof state, "%s", st);
  cli_sanitize(state);
  char gen[32], recl[32];
  snprintf(gen, sizeof gen, "%s", field(rs, "generation", 1, "?"));
  snprintf(recl, sizeof recl, "%s", field(rs, "reclaim", 1, "?"));
  cli_sanitize(gen);
  cli_sanitize(recl);
  printf("process     %ld (%s)\n", (long)pid, comm);
  printf("state       %s\n", state);
  printf("generation  %s\n", gen);
  printf("reclaim     %s\n", recl);
  const cli_view *tables[] = {&programs, &patches,   &objects,
                              &lives,    &functions, &threads};
  for (size_t i = 0; i < sizeof tables / sizeof tables[0]; i++)
    section(rs, tables[i]);
  old_code_human(rs);
  const molt__record *im = molt__tsv_find(rs, "image");
  if (im != NULL) {
    const char *n = cli_field_of(im, 3), *old = cli_field_of(im, 4);
    char line[8192];
    snprintf(line, sizeof line, "%s (build-id %s, %s full update%s%s%s)",
             cli_field_of(im, 1), cli_field_of(im, 2), n, strcmp(n, "1") == 0 ? "" : "s",
             old[0] ? "; old image still loaded: " : "", old);
    cli_sanitize(line);
    printf("\nprogram image  %s\n", line);
    const char *abort = cli_field_of(im, 5);
    if (abort[0]) {
      snprintf(line, sizeof line, "%s", abort);
      cli_sanitize(line);
      printf("last abort     %s\n", line);
    }
    section(rs, &program_threads);
  }
  const molt__record *sh = molt__tsv_find(rs, "shadow");
  if (sh != NULL) {
    char line[8192];
    snprintf(line, sizeof line,
             "%s, follower %s, to %s: %s calls recorded, %s compared, ring use up to "
             "%s%%, %s divergence(s), %s rule(s) deciding %s call(s)",
             cli_field_of(sh, 1), cli_field_of(sh, 2), cli_field_of(sh, 3),
             cli_field_of(sh, 4), cli_field_of(sh, 5), cli_field_of(sh, 6),
             cli_field_of(sh, 7), cli_field_of(sh, 9)[0] ? cli_field_of(sh, 9) : "0",
             cli_field_of(sh, 10)[0] ? cli_field_of(sh, 10) : "0");
    /* With retries (--retries): which attempt this is, of how many. */
    const char *k = cli_field_of(sh, 11), *m = cli_field_of(sh, 12);
    if (k[0] && m[0] && strcmp(m, "1") != 0)
      snprintf(line + strlen(line), sizeof line - strlen(line), ", attempt %s of %s", k,
               m);
    cli_sanitize(line);
    printf("\nshadowed update  %s\n", line);
    if (cli_field_of(sh, 8)[0]) {
      snprintf(line, sizeof line, "%s", cli_field_of(sh, 8));
      cli_sanitize(line);
      printf("outcome          %s\n", line);
    }
  }
  /* Shown only when there were any: most processes never see one. */
  if (cli_count(rs, refused.key) > 0)
    section(rs, &refused);
}

int cli_cmd_status(const cli_args *a) {
  if (cli_attached(a->pid))
    return cli_attach_status(a);
  cli_reply r;
  int code = cli_report(a, MOLT__OP_STATUS, &r);
  if (code != 0)
    return code;
  if (a->json)
    status_json(a->pid, &r.recs);
  else
    status_human(a->pid, &r.recs);
  cli_reply_free(&r);
  return EXIT_OK;
}
