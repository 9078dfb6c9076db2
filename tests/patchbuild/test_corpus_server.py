"""Patches from a fix, corpus 1: a threaded server (a thread per
connection, one line per request on a unix socket), three files and a
header, built by make with CC="moltcc --molt-updatable=all", gcc -O2 and
-Wall -Wextra -Werror -Wredundant-decls -Wmissing-prototypes -pedantic.

One server runs for the whole module; every case makes its fix from the
pristine tree (git diff or diff -u), builds the patch from the diff in
another directory, applies it with `molt apply`, checks the behaviour the
fix changes and that `molt status` shows exactly the replaced functions;
each case changes functions of its own, so the patches stack.  The cases
that a hot patch cannot carry are refused with the type, fields or
function named, and nothing is written."""
import os

import pytest

from corpus import Project, SocketServer, need, ok_patch, refused, run

SERVER_H = r"""#ifndef SERVER_H
#define SERVER_H
#include <stddef.h>

#define GREETING "hello"

enum op { OP_NONE, OP_ECHO = 1, OP_ADD = 2, OP_OTHER = 3 };

struct stats {
    long requests;
    enum op last_op;
};

extern struct stats stats;
extern const char *last_note;
extern int patch_hits_seen;

int handle_line(const char *line, char *out, size_t outsz);
int util_scale(int x);
const char *util_greet(void);
#endif
"""

HANDLERS_C = r"""#include <stdio.h>
#include <string.h>
#include "server.h"

struct stats stats;
const char *last_note = "none";
int patch_hits_seen;
static int base = 10;

static int clamp(int x) { return x > 100 ? 100 : x; }

static inline int rate(void) { return 3; }

static int cmd_price(int n) { return n * rate(); }

static int twice(int x) { return 2 * x; }

static int counted(void)
{
    static int calls;
    calls++;
    return calls;
}

static int scale_by(int x, int k) { return x * k; }

static int cmd_scale(int a, int b) { return scale_by(a, b) + 1; }

static int cmd_add(int a, int b) { return clamp(a + b); }

static int cmd_echo(char *out, size_t n, int a) { return snprintf(out, n, "echo %d", a); }

static int cmd_square(int a) { return a * a; }

static int cmd_neg(int a) { return -a; }

static int cmd_inc(int a) { return a + 1; }

static int cmd_hits(void) { return patch_hits_seen; }

static const char *cmd_hello(void) { return GREETING; }

static const char *cmd_note(void) { return last_note; }

static int cmd_base(void) { return base++; }

static int cmd_line(void) { return __LINE__; }

int handle_line(const char *line, char *out, size_t n)
{
    int a = 0, b = 0;
    char cmd[16] = "";
    stats.requests++;
    if (sscanf(line, "%15s %d %d", cmd, &a, &b) < 1)
        return snprintf(out, n, "error");
    if (strcmp(cmd, "echo") == 0) {
        stats.last_op = OP_ECHO;
        return cmd_echo(out, n, a);
    }
    if (strcmp(cmd, "add") == 0) {
        stats.last_op = OP_ADD;
        return snprintf(out, n, "%d", cmd_add(a, b));
    }
    stats.last_op = OP_OTHER;
    if (strcmp(cmd, "twice") == 0)
        return snprintf(out, n, "%d", twice(a));
    if (strcmp(cmd, "count") == 0)
        return snprintf(out, n, "%d", counted());
    if (strcmp(cmd, "price") == 0)
        return snprintf(out, n, "%d", cmd_price(a));
    if (strcmp(cmd, "scale") == 0)
        return snprintf(out, n, "%d", cmd_scale(a, b));
    if (strcmp(cmd, "uscale") == 0)
        return snprintf(out, n, "%d", util_scale(a));
    if (strcmp(cmd, "square") == 0)
        return snprintf(out, n, "%d", cmd_square(a));
    if (strcmp(cmd, "neg") == 0)
        return snprintf(out, n, "%d", cmd_neg(a));
    if (strcmp(cmd, "inc") == 0)
        return snprintf(out, n, "%d", cmd_inc(a));
    if (strcmp(cmd, "hits") == 0)
        return snprintf(out, n, "%d", cmd_hits());
    if (strcmp(cmd, "hello") == 0)
        return snprintf(out, n, "%s %s", cmd_hello(), util_greet());
    if (strcmp(cmd, "note") == 0)
        return snprintf(out, n, "%s", cmd_note());
    if (strcmp(cmd, "base") == 0)
        return snprintf(out, n, "%d", cmd_base());
    if (strcmp(cmd, "line") == 0)
        return snprintf(out, n, "%d", cmd_line());
    if (strcmp(cmd, "requests") == 0)
        return snprintf(out, n, "%ld", stats.requests);
    return snprintf(out, n, "unknown");
}
"""

UTIL_C = r"""#include "server.h"

static int clamp(int x) { return x > 1000 ? 1000 : x; }

int util_scale(int x) { return clamp(x * 10); }

const char *util_greet(void) { return GREETING; }
"""

SERVER_C = r"""#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>
#include "server.h"

static void *serve(void *arg)
{
    int fd = (int)(long)arg;
    char line[256], out[256];
    size_t len = 0;
    ssize_t r;
    while (len < sizeof line - 1 && (r = read(fd, line + len, sizeof line - 1 - len)) > 0) {
        len += (size_t)r;
        if (memchr(line, '\n', len) != NULL)
            break;
    }
    line[len] = '\0';
    int n = handle_line(line, out, sizeof out - 1);
    if (n < 0)
        n = 0;
    if ((size_t)n > sizeof out - 2)
        n = (int)(sizeof out - 2);
    out[n] = '\n';
    if (write(fd, out, (size_t)n + 1) < 0)
        perror("write");
    close(fd);
    return NULL;
}

static void accept_loop(int s)
{
    for (;;) {
        pthread_t t;
        int c = accept(s, NULL, NULL);
        if (c < 0)
            continue;
        if (pthread_create(&t, NULL, serve, (void *)(long)c) != 0) {
            close(c);
            continue;
        }
        pthread_detach(t);
    }
}

int main(int argc, char **argv)
{
    struct sockaddr_un addr;
    int s = socket(AF_UNIX, SOCK_STREAM, 0);
    char tmp[sizeof addr.sun_path];
    char out[64];
    if (argc != 2 || s < 0 || strlen(argv[1]) + 5 >= sizeof addr.sun_path)
        return 2;
    handle_line("requests", out, sizeof out);    /* the runtime starts before the socket */
    memset(&addr, 0, sizeof addr);
    addr.sun_family = AF_UNIX;
    snprintf(tmp, sizeof tmp, "%s.tmp", argv[1]);
    memcpy(addr.sun_path, tmp, strlen(tmp) + 1);
    if (bind(s, (struct sockaddr *)&addr, sizeof addr) != 0 || listen(s, 16) != 0)
        return 3;
    if (rename(tmp, argv[1]) != 0)
        return 4;
    accept_loop(s);
    return 0;
}
"""

MAKEFILE = """CFLAGS = -std=c11 -D_GNU_SOURCE -O2 -g -Wall -Wextra -Werror -Wredundant-decls \\
         -Wmissing-prototypes -pedantic
all: prog
prog: server.o handlers.o util.o
\t$(CC) -pthread -o $@ server.o handlers.o util.o
%.o: %.c server.h
\t$(CC) $(CFLAGS) -c -o $@ $<
"""


@pytest.fixture(scope="module")
def srv(tmp_path_factory):
    need()
    top = tmp_path_factory.mktemp("corpus-server")
    p = Project(top / "proj", {"server.h": SERVER_H, "handlers.c": HANDLERS_C,
                               "util.c": UTIL_C, "server.c": SERVER_C, "Makefile": MAKEFILE,
                               ".gitignore": "*.o\nprog\n"})
    p.make()
    s = SocketServer([p.path("prog")], p.root, str(top / "sock"))
    p.server = s
    yield p
    out, err = s.stop()
    assert "AddressSanitizer" not in err and "runtime error" not in err, err


def applied(p, r, data, out, replaced, patch_id=None):
    """Applies the patch; molt status must show exactly `replaced`."""
    ok_patch(r, out)
    a = p.server.apply(out)
    assert a.rc == 0, a
    pid = patch_id or os.path.basename(out)[:-3]
    assert p.server.replaced_by(pid) == replaced, (p.server.replaced_by(pid), r.err)
    assert {(f["name"], f["tu"] if f["static"] else None) for f in data["replaced"]} == replaced
    return data


def test_body_change(srv):
    assert srv.server.request("echo 7") == "echo 7"
    d = srv.git_diff({"handlers.c": [('"echo %d"', '"echo: %d"')]})
    r, data, out = srv.patch([d])
    applied(srv, r, data, out, {("cmd_echo", "handlers.c")})
    assert srv.server.request("echo 7") == "echo: 7"
    assert "replaced (1): cmd_echo (handlers.c, static)" in r.err


def test_static_function(srv):
    assert srv.server.request("twice 5") == "10"
    r, data, out = srv.patch([srv.diff_u({"handlers.c": [("return 2 * x;", "return 3 * x;")]})])
    applied(srv, r, data, out, {("twice", "handlers.c")})
    assert srv.server.request("twice 5") == "15"


def test_static_local_keeps_its_value(srv):
    for want in ("1", "2", "3"):
        assert srv.server.request("count") == want
    d = srv.git_diff({"handlers.c": [("    calls++;\n    return calls;",
                                      "    calls++;\n    return calls + 1000;")]})
    r, data, out = srv.patch([d])
    applied(srv, r, data, out, {("counted", "handlers.c")})
    assert srv.server.request("count") == "1004"


def test_new_global_and_new_function(srv):
    d = srv.git_diff({"handlers.c": [
        ("static int cmd_hits(void) { return patch_hits_seen; }",
         "int patch_hits;\n"
         "static int bump_hits(void) { return ++patch_hits; }\n"
         "static int cmd_hits(void) { return bump_hits() + patch_hits_seen; }")]})
    r, data, out = srv.patch([d], extra=["--molt-patch-id", "hits"])
    applied(srv, r, data, out, {("cmd_hits", "handlers.c")}, patch_id="hits")
    assert [f["name"] for f in data["new_functions"]] == ["bump_hits"]
    assert "patch_hits" in [x["name"] for x in data["new_data"]]
    assert [srv.server.request("hits") for _ in range(3)] == ["1", "2", "3"]


def test_two_files_with_statics_of_the_same_name(srv):
    assert srv.server.request("uscale 70") == "700"
    assert srv.server.request("add 70 70") == "100"
    r, data, out = srv.patch([srv.git_diff({"util.c": [("x > 1000 ? 1000 : x",
                                                         "x > 500 ? 500 : x")]})])
    applied(srv, r, data, out, {("clamp", "util.c")})
    assert srv.server.request("uscale 70") == "500"
    assert srv.server.request("add 70 70") == "100"     # handlers.c's clamp is another one


def test_inlined_callee_ships_its_callers(srv):
    assert srv.server.request("price 5") == "15"
    r, data, out = srv.patch([srv.git_diff({"handlers.c": [("return 3; }", "return 4; }")]})])
    applied(srv, r, data, out, {("cmd_price", "handlers.c")})
    assert srv.server.request("price 5") == "20"


def test_series_of_two_diffs(srv):
    first, second = srv.series([{"handlers.c": [("return a * a;", "return a * a + 1;")]},
                                {"handlers.c": [("return a * a + 1;", "return a * a + 2;")]}])
    r, data, out = srv.patch([first, second])
    applied(srv, r, data, out, {("cmd_square", "handlers.c")})
    assert srv.server.request("square 3") == "11"
    assert data["provenance"].count("sha256:") == 2


def test_quilt_header(srv):
    header = ("Description: negate correctly\n Longer text of the fix.\n"
              "Author: Someone <someone@example.org>\nForwarded: no\n\n"
              "Index: proj/handlers.c\n===================================================================\n")
    d = srv.git_diff({"handlers.c": [("return -a;", "return 0 - a - 100;")]}, header=header)
    r, data, out = srv.patch([d])
    applied(srv, r, data, out, {("cmd_neg", "handlers.c")})
    assert srv.server.request("neg 1") == "-101"


def test_already_applied_tree(srv):
    d = srv.git_diff({"handlers.c": [("return a + 1;", "return a + 2;")]})
    run(["patch", "-s", "-p1", "-i", d], srv.root)
    try:
        r, data, out = srv.patch([d])
    finally:
        run(["git", "checkout", "-q", "--", "."], srv.root)
    applied(srv, r, data, out, {("cmd_inc", "handlers.c")})
    assert "already has the fix" in r.err
    assert srv.server.request("inc 1") == "3"


def test_header_change_in_two_files(srv):
    assert srv.server.request("hello") == "hello hello"
    r, data, out = srv.patch([srv.git_diff({"server.h": [('"hello"', '"hi"')]})])
    applied(srv, r, data, out, {("cmd_hello", "handlers.c"), ("util_greet", None)})
    assert srv.server.request("hello") == "hi hi"


def test_literal_stored_in_program_data_is_pinned(srv):
    d = srv.git_diff({"handlers.c": [
        ("static const char *cmd_note(void) { return last_note; }",
         "static const char *cmd_note(void)\n{\n    last_note = \"patched\";\n"
         "    return last_note;\n}")]})
    r, data, out = srv.patch([d])
    applied(srv, r, data, out, {("cmd_note", "handlers.c")})
    reasons = [x["reason"] for x in data["pinned_reasons"]]
    assert any(x.startswith("handlers.c:") and '"patched"' in x and "stored" in x
               for x in reasons), reasons
    assert "kept loaded (pinned): handlers.c:" in r.err
    assert srv.server.request("note") == "patched"


def test_static_signature_change_with_all_callers_in_the_file(srv):
    assert srv.server.request("scale 4 5") == "21"
    d = srv.git_diff({"handlers.c": [
        ("static int scale_by(int x, int k) { return x * k; }",
         "static int scale_by(long x, int k) { return (int)(x * k * 2); }")]})
    r, data, out = srv.patch([d])
    applied(srv, r, data, out, {("cmd_scale", "handlers.c")})
    assert [x["name"] for x in data["private_copies"]] == ["scale_by"]
    assert srv.server.request("scale 4 5") == "41"


def test_line_numbers_only(srv):
    d = srv.git_diff({"handlers.c": [("static int cmd_line(void)",
                                      "/* the line of this function */\nstatic int cmd_line(void)")]})
    r, data, out = srv.patch([d])
    assert r.rc == 1 and not os.path.exists(out), r
    assert "moltcc: error: nothing to patch" in r.err and "cmd_line" in r.err, r.err
    assert data["status"] == "nothing" and [f["name"] for f in data["line_only"]] == ["cmd_line"]


def test_endless_loop_is_noted(srv):
    # the accept loop never returns: the patch builds, and says that the
    # thread inside it keeps the old code
    r, data, out = srv.patch([srv.git_diff({"server.c": [("if (c < 0)\n            continue;",
                                                          "if (c < 0) {\n            usleep(1000);\n"
                                                          "            continue;\n        }")]})])
    ok_patch(r, out)
    assert [(f["name"], f["file"]) for f in data["replaced"]] == [("accept_loop", "server.c")]
    assert "note: server.c:%d: 'accept_loop' runs a loop that never exits" % (
        SERVER_C[:SERVER_C.index("static void accept_loop")].count("\n") + 1) in r.err, r.err


def test_changed_initializer_is_refused(srv):
    r, data, out = srv.patch([srv.git_diff({"handlers.c": [("static int base = 10;",
                                                             "static int base = 20;")]})])
    refused(r, out, "base", "initial value changed")


def test_struct_field_added_is_refused(srv):
    r, data, out = srv.patch([srv.git_diff({"server.h": [
        ("    long requests;\n", "    long requests;\n    int errors;\n")]})])
    refused(r, out, "server.h:9: struct stats", "field 'errors' (int) added at offset 8",
            "field 'last_op' moved from offset 8 to 12")
    # refused by the first two readers of server.h built: the third is not
    # compiled, and the message says their uses are not listed
    assert "moltcc: note: 1 more file reads the changed files (util.c)" in r.err, r.err
    assert "not compiled, since the fix is refused already" in r.err, r.err


def test_field_type_changed_is_refused(srv):
    r, data, out = srv.patch([srv.git_diff({"server.h": [("    enum op last_op;",
                                                          "    long last_op;")]})])
    refused(r, out, "struct stats", "field 'last_op' changed type enum op -> long")


def test_enum_value_changed_is_refused(srv):
    r, data, out = srv.patch([srv.git_diff({"server.h": [("OP_ADD = 2", "OP_ADD = 5")]})])
    refused(r, out, "enum op", "OP_ADD changed value 2 -> 5")


def test_signature_changed_is_refused(srv):
    r, data, out = srv.patch([srv.git_diff({
        "server.h": [("int util_scale(int x);", "int util_scale(int x, int y);")],
        "util.c": [("int util_scale(int x) { return clamp(x * 10); }",
                    "int util_scale(int x, int y) { return clamp(x * y); }")],
        "handlers.c": [("util_scale(a)", "util_scale(a, 10)")]})])
    refused(r, out, "function util_scale", "parameters changed (int) -> (int, int)")


def test_main_changed_is_refused(srv):
    r, data, out = srv.patch([srv.git_diff({"server.c": [("listen(s, 16)", "listen(s, 32)")]})])
    refused(r, out, "main", "never runs again")
    # the refusals did not disturb the server
    assert srv.server.request("echo 1") == "echo: 1"
