"""The C code follows .clang-format: every .c and .h file of the repository
(outside build trees) is unchanged by clang-format.  Exits 1 and lists the
files that are not, with the first place clang-format would change."""
import os
import shutil
import subprocess
import sys

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
SKIP_DIRS = {".git", "__pycache__"}


def c_files(root):
    for dp, dirs, files in os.walk(root):
        # build trees (build, build-asan, ...) hold generated code
        dirs[:] = sorted(d for d in dirs if d not in SKIP_DIRS and not d.startswith("build")
                         and not os.path.exists(os.path.join(dp, d, "CMakeCache.txt")))
        for f in sorted(files):
            if f.endswith((".c", ".h")):
                yield os.path.join(dp, f)


def main():
    exe = shutil.which("clang-format-14") or shutil.which("clang-format")
    if not exe:
        print("check_format: clang-format-14 is not installed (scripts/setup-debian.sh installs it)")
        return 1
    files = list(c_files(ROOT))
    bad = []
    for i in range(0, len(files), 64):
        chunk = files[i:i + 64]
        p = subprocess.run([exe, "--style=file", "--dry-run", "-Werror"] + chunk,
                           cwd=ROOT, capture_output=True, text=True)
        if p.returncode != 0:
            seen = set()
            for line in p.stderr.splitlines():
                if "-Wclang-format-violations" in line:
                    f = line.split(":", 1)[0]
                    if f not in seen:
                        seen.add(f)
                        bad.append(line.split(": error")[0])
            if not seen:
                print(p.stderr)
                return 1
    print("check_format: %d C files, %d not formatted" % (len(files), len(bad)))
    for b in bad:
        print("  %s  (run clang-format-14 -i on it)" % b)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
