/* molt status <pid> [--json]: the state of a molt process -- generation,
 * modules, patches, live generations, functions, threads, and the program
 * image of a process started with `molt run`. */
#include "cli/cli.h"

#include <string.h>

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
               {"file", 9, CLI_STR}, {"sha256", 10, CLI_STR}),
    CLI_COLUMNS({"#", 1, CLI_AS_IS}, {"ID", 2, CLI_AS_IS}, {"GENERATION", 5, CLI_AS_IS},
                {"REPLACED", 7, CLI_AS_IS}, {"BUILT-FROM", 6, CLI_AS_IS},
                {"KEPT-LOADED", 8, CLI_AS_IS}, {"PATH", 4, CLI_AS_IS},
                {"FILE", 9, CLI_AS_IS}, {"SHA256", 10, CLI_AS_IS},
                {"DESCRIPTION", 3, CLI_AS_IS})};
static const cli_view objects = {
    "object", "objects", "loaded patch objects",
    CLI_FIELDS({"id", 1, CLI_STR}, {"path", 2, CLI_STR}, {"generation", 3, CLI_NUM},
               {"refs", 4, CLI_NUM}, {"kept_loaded", 5, CLI_OPT}),
    CLI_COLUMNS({"ID", 1, CLI_AS_IS}, {"LOADED-IN", 3, CLI_AS_IS}, {"REFS", 4, CLI_AS_IS},
                {"KEPT-LOADED", 5, CLI_AS_IS}, {"PATH", 2, CLI_AS_IS})};
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
/* The one "image" record, a JSON object of its own. */
static const cli_field image[] = {{"path", 1, CLI_STR},
                                  {"build_id", 2, CLI_STR},
                                  {"full_updates", 3, CLI_NUM},
                                  {"unloading", 4, CLI_OPT},
                                  {"file", 5, CLI_STR},
                                  {"sha256", 6, CLI_STR},
                                  {NULL, 0, 0}};

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
  const molt__record *im = molt__tsv_find(rs, "image");
  if (im != NULL) {
    const char *n = cli_field_of(im, 3), *old = cli_field_of(im, 4);
    char line[8192];
    snprintf(line, sizeof line, "%s (build-id %s, %s full update%s%s%s)",
             cli_field_of(im, 1), cli_field_of(im, 2), n, strcmp(n, "1") == 0 ? "" : "s",
             old[0] ? "; old image still loaded: " : "", old);
    cli_sanitize(line);
    printf("\nprogram image  %s\n", line);
    section(rs, &program_threads);
  }
}

int cli_cmd_status(const cli_args *a) {
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
