#!/usr/bin/python3
"""Coverage sweep: can every source file of a real server be hot-patched?

For each C file compiled into the server (its compile record, `moltcc
--molt-show-build`), one function of that file gets a small change of its
body -- a new static counter that the function increments on every call --
written as a unified diff of the source tree, as a fix would be.  The patch
is built straight from that diff (moltcc --molt-patch --molt-diff, run
outside the source tree), applied with `molt apply` to the running server
under its checking load (examples/fixes/<server>/server.py), the server is
checked to answer and to have failed no reply, and the patch is rolled back
so that the next file starts from the program as built.

The function chosen is the first updatable function defined in the file
(in source order) whose body is written in the file itself (not made by a
macro), other than main; when the compiler removes it from the file (moltcc:
"nothing to patch"), the next one, up to three.  A file with no such function is reported as
"no function" and is not counted among the files that could be patched.

    run.sh sweep [--only tinyproxy,dnsmasq] [--files N] [--match REGEX] [--rebuild]
    sweep.py --work DIR --repo DIR --moltcc M --molt M [--only tinyproxy,dnsmasq]
             [--files N] [--match REGEX] [--rebuild]

Writes WORK/sweep-<server>.json and prints a line per file and
"<server>: P/T files patched" (P: built, applied under load with no failed
reply and rolled back; T: files with a function to change).  Exit status 0
only when P == T for every server and no reply failed.
"""
import argparse
import difflib
import json
import os
import re
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "common"))
sys.path.insert(0, HERE)
from harness import Failure, Harness, arguments  # noqa: E402
from fixes import build_server, load_server  # noqa: E402

# The change made to each chosen function, inserted right after the opening
# brace of its body.  Declarations only, so that it is valid wherever a block
# may start (C89 included) and triggers no warning of the usual sets: a new
# function-scope static (new data of the patch) and a use of it on each call.
CHANGE = ("static volatile unsigned long molt_sweep_calls; "
          "volatile unsigned long molt_sweep_seen __attribute__((unused)) = ++molt_sweep_calls;")
SETTLE_S = 0.3
MAX_TRIES = 3


def compile_record(h, binary):
    out = subprocess.run([h.moltcc, "--molt-show-build", binary], capture_output=True, text=True)
    if out.returncode != 0:
        raise Failure("moltcc --molt-show-build %s: %s" % (binary, out.stderr.strip()))
    return json.loads(out.stdout)


def updatable_functions(h, pid):
    out = subprocess.run([h.molt, "status", str(pid), "--json"], capture_output=True, text=True)
    if out.returncode != 0:
        raise Failure("molt status --json: %s" % out.stderr.strip())
    by_file = {}
    for fn in json.loads(out.stdout)["functions"]:
        by_file.setdefault(fn["tu"], set()).add(fn["name"])
    return by_file


def candidate_functions(repo, record, names):
    """(name, offset of the body's '{') of each function defined in the
    record's file whose name is in `names` and whose body is in the file's
    own text, in source order."""
    sys.path.insert(0, os.path.join(repo, "tools"))
    from moltcc import gccargs
    import clang.cindex as ci

    path = os.path.join(record["directory"], record["file"])
    args = gccargs.libclang_args(record["arguments"][1:], os.path.join(repo, "include"), [])
    args = [a for a in args if a != path and a != record["file"]]
    cwd = os.getcwd()
    os.chdir(record["directory"])       # the record's relative -I paths
    try:
        tu = ci.Index.create().parse(path, args=args)
    finally:
        os.chdir(cwd)
    with open(path, "rb") as f:
        text = f.read()
    real = os.path.realpath(path)
    for c in tu.cursor.get_children():
        if c.kind != ci.CursorKind.FUNCTION_DECL or not c.is_definition():
            continue
        if c.spelling == "main" or c.spelling not in names:
            continue
        if c.location.file is None or os.path.realpath(c.location.file.name) != real:
            continue
        body = [x for x in c.get_children() if x.kind == ci.CursorKind.COMPOUND_STMT]
        if not body:
            continue
        start = body[0].extent.start
        if (start.file is None or os.path.realpath(start.file.name) != real
                or text[start.offset:start.offset + 1] != b"{"):
            continue                     # the body comes from a macro
        yield c.spelling, start.offset


def write_diff(tree, path, offset, out):
    """The change as a unified diff with paths relative to the source tree
    (a/src/x.c, b/src/x.c), as a distribution's patch names them."""
    rel = os.path.relpath(os.path.realpath(path), os.path.realpath(tree))
    with open(path, encoding="utf-8", errors="surrogateescape") as f:
        old = f.read()
    # offset is in bytes; the text before it decides the character index
    with open(path, "rb") as f:
        head = f.read()[:offset + 1].decode("utf-8", errors="surrogateescape")
    new = old[:len(head)] + " " + CHANGE + old[len(head):]
    diff = difflib.unified_diff(old.splitlines(True), new.splitlines(True),
                                "a/" + rel, "b/" + rel)
    with open(out, "w", encoding="utf-8", errors="surrogateescape") as f:
        f.writelines(diff)
    return rel


def sweep_server(h, srv, args):
    # A build made with another moltcc or runtime is made again (as --quick
    # does for the fixes): the sweep's patches must match the program's ABI.
    build_server(h, srv, argparse.Namespace(rebuild=args.rebuild, quick=True))
    binary = srv.binary(h)
    tree = os.path.join(h.work, srv.NAME, "tree")
    records = compile_record(h, binary)
    outdir = os.path.join(h.work, srv.NAME, "sweep")
    os.makedirs(outdir, exist_ok=True)

    proc, port = srv.start(h, tag="sweep")
    rows = []
    load = None
    try:
        funcs = updatable_functions(h, proc.pid)
        if args.match:
            records = [r for r in records if re.search(args.match, r["file"])]
        if args.files:
            records = records[:args.files]
        # 1. every patch built first (the server idles meanwhile)
        for rec in records:
            base = os.path.basename(rec["file"])
            stem = os.path.splitext(base)[0]
            row = {"file": os.path.relpath(os.path.join(rec["directory"], rec["file"]), tree),
                   "function": None, "status": None, "reason": "", "replaced": []}
            rows.append(row)
            cands = candidate_functions(h.repo, rec, funcs.get(base, set()))
            row["status"] = "no function"
            # A function the compiler removes from the file (a static nobody
            # calls in this configuration) changes no code: moltcc says
            # "nothing to patch" and the next function is taken, up to three.
            for n, (name, offset) in enumerate(cands):
                if n == MAX_TRIES:
                    break
                row["function"] = name
                diff = os.path.join(outdir, stem + ".patch")
                write_diff(tree, os.path.join(rec["directory"], rec["file"]), offset, diff)
                so = os.path.join(outdir, stem + ".so")
                report = os.path.join(outdir, stem + ".json")
                for f in (so, report):
                    if os.path.exists(f):
                        os.unlink(f)
                log = "sweep-%s-%s.log" % (srv.NAME, stem)
                rc, wall, cpu = h.run([h.moltcc, "--molt-patch", "--molt-target", binary,
                                       "--molt-diff", diff, "-o", so, "--molt-report", report,
                                       "--molt-patch-id", "sweep-" + stem],
                                      log, cwd=h.work, check=False)
                row["build_s"] = round(wall, 2)
                if rc == 0:
                    row["status"] = "built"
                    break
                errors = [l for l in h.logtext(log).splitlines() if "error" in l]
                row["status"], row["reason"] = "build failed", " ".join(errors)[:400]
                if "nothing to patch" not in row["reason"]:
                    break
                row.setdefault("removed_by_compiler", []).append(name)
            if row["status"] != "built":
                continue
            row["reason"] = ""
            with open(report) as f:
                row["replaced"] = [x["name"] if isinstance(x, dict) else x
                                   for x in json.load(f).get("replaced", [])]
            row["so"] = so

        # 2. each applied under load, checked, rolled back
        load = srv.load(h)
        time.sleep(1.0)
        for row in rows:
            if row["status"] != "built":
                continue
            n0, f0 = load.counts()
            rc, ms, text = h.apply(proc.pid, row["so"])
            row["apply_ms"] = ms
            time.sleep(SETTLE_S)
            alive = proc.poll() is None
            n1, f1 = load.counts()
            back = subprocess.run([h.molt, "rollback", str(proc.pid)], capture_output=True,
                                  text=True) if rc == 0 and alive else None
            row["replies"], row["failed"] = n1 - n0, f1 - f0
            if rc != 0:
                row["status"], row["reason"] = "apply failed", text[:400]
            elif not alive:
                row["status"], row["reason"] = "server died", "exit %s" % proc.returncode
                break
            elif f1 != f0:
                row["status"], row["reason"] = "failed replies", "%d failed" % (f1 - f0)
            elif back.returncode != 0:
                row["status"], row["reason"] = "rollback failed", (back.stdout + back.stderr)[:400]
            else:
                row["status"] = "patched"
        final = load.finish()
        load = None
    finally:
        if load is not None:
            load.finish()
        alive = proc.poll() is None
        h.stop(proc)
    total = sum(1 for r in rows if r["status"] != "no function")
    patched = sum(1 for r in rows if r["status"] == "patched")
    return {"server": srv.NAME, "files": len(rows), "with_function": total, "patched": patched,
            "load": final, "alive": alive, "rows": rows}


def main():
    ap = arguments()
    ap.add_argument("--only", default="tinyproxy,dnsmasq")
    ap.add_argument("--files", type=int, default=0, help="only the first N files")
    ap.add_argument("--match", help="only the files whose path matches this regular expression")
    ap.add_argument("--rebuild", action="store_true")
    args = ap.parse_args()
    h = Harness(args.work, args.repo, args.moltcc, args.molt)
    ok = True
    try:
        for name in args.only.split(","):
            srv = load_server(name)
            res = sweep_server(h, srv, args)
            with open(os.path.join(args.work, "sweep-%s.json" % name), "w") as f:
                json.dump(res, f, indent=1)
            for r in res["rows"]:
                print("%-14s %-32s %-30s %s%s" % (
                    r["status"], r["file"], r["function"] or "-",
                    "%d replaced" % len(r["replaced"]) if r["replaced"] else "",
                    (" -- " + r["reason"]) if r["reason"] else ""))
            print("%s: %d/%d files patched (%d files, %d without a function to change); "
                  "load %d replies, %d failed; server %s" % (
                      name, res["patched"], res["with_function"], res["files"],
                      res["files"] - res["with_function"], res["load"]["requests"],
                      res["load"]["failed"], "alive" if res["alive"] else "DIED"))
            ok = ok and res["patched"] == res["with_function"] and not res["load"]["failed"] \
                and res["alive"]
    finally:
        h.cleanup()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
