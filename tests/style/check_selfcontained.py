#!/usr/bin/env python3
"""The repository explains itself: code, docs and benchmarks cite the
guarantees by their short names as written down in docs/guarantees.md, never
a specification or a papers folder that lives outside the repository, and
name no absolute path of the machine they were written on.

Run from anywhere; exits 1 and lists every offending line.  Measured data
(bench/**/results/) is exempt: it records where a run happened.
"""
import os
import re
import subprocess
import sys

ROOT = os.path.normpath(os.path.join(os.path.dirname(__file__), "..", ".."))

# Each rule: a pattern and why it is wrong.
RULES = [
    (re.compile(r"\bSPEC\b(?!IAL)"),
     "cites a specification outside the repository; cite the short name "
     "(H2, P4, R7) of docs/guarantees.md"),
    (re.compile(r"shared/papers|\.\./shared/|/work/shared"),
     "points at papers outside the repository; cite the publication as "
     "docs/guarantees.md does"),
    (re.compile(r"/work/(main|wt|rw|notes)\b"),
     "names a path of a developer's machine"),
]
EXEMPT = re.compile(r"^(bench/(.+/)?results/|tests/style/check_selfcontained\.py$)")


def tracked_files():
    out = subprocess.run(["git", "-C", ROOT, "ls-files", "-z"], check=True,
                         capture_output=True).stdout
    return [f for f in out.decode().split("\0") if f and not EXEMPT.match(f)]


def check(files):
    problems = []
    for rel in files:
        path = os.path.join(ROOT, rel)
        try:
            with open(path, encoding="utf-8") as fh:
                lines = fh.readlines()
        except (UnicodeDecodeError, FileNotFoundError, IsADirectoryError):
            continue  # binary or removed in the work tree
        for n, line in enumerate(lines, 1):
            for pattern, why in RULES:
                if pattern.search(line):
                    problems.append("%s:%d: %s: %s" % (rel, n, why, line.strip()[:100]))
    return problems


def main():
    problems = check(tracked_files())
    for p in problems:
        print(p)
    if problems:
        print("%d line(s) refer to things outside the repository" % len(problems))
        return 1
    print("docs and code are self-contained")
    return 0


if __name__ == "__main__":
    sys.exit(main())
