"""molt installed like a library: `cmake --install` into a temporary prefix,
then programs built and patched with nothing but the installed tree.

After the install, every command runs in a clean environment: PATH is
<prefix>/bin then the system's, no variable names the source or the build
tree (checked), no LD_LIBRARY_PATH, the working directory is a temporary
one.  Checked:
  - the layout (programs, libmolt and its SONAME links, headers, man pages,
    moltcc's package, molt.pc, the CMake package);
  - a program built with `moltcc` and `pkg-config --cflags --libs molt`
    runs, takes a hot patch built by the installed moltcc and applied with
    the installed `molt apply`, and shows the new behaviour;
  - the same with a CMake project: find_package(molt), molt::molt, CC=moltcc
    (MOLT_MOLTCC and MOLT_COMPILER_IS_MOLTCC from the package);
  - `molt run` of a program image: the installed molt-run finds libmolt
    through its RUNPATH;
  - moltcc reached through a symbolic link still finds the installation;
  - no installed file refers to the source or the build tree (text files,
    RUNPATHs, the non-debug bytes of the binaries);
  - DESTDIR staging: molt.pc names the prefix, never the staging directory.

Environment (tests/install/tests.cmake): MOLT_CMAKE, MOLT_BUILD_DIR
(harness.tree), MOLT_INSTALL_{BINDIR,LIBDIR,INCLUDEDIR,DATADIR,MANDIR}.
"""
import os
import shutil
import subprocess
import tempfile

import pytest

from harness import tree
from harness.proc import Program, run

CMAKE = os.environ["MOLT_CMAKE"]
BUILD = os.path.realpath(tree.BUILD)
SOURCE = os.path.realpath(tree.ROOT)
DIRS = {d: os.environ["MOLT_INSTALL_" + d] for d in ("BINDIR", "LIBDIR", "INCLUDEDIR",
                                                      "DATADIR", "MANDIR")}
# the library's file names: libmolt.so -> SONAME -> the real file
SONAME = "libmolt.so.0"

GREETER_C = r"""
#include <stdio.h>
#include <unistd.h>
#include <molt.h>

MOLT_UPDATABLE const char *greeting(void) { return "hello v1"; }

/* One line in, one greeting out: the test decides when calls happen. */
int main(void)
{
    char line[64];
    printf("ready %ld\n", (long)getpid());
    fflush(stdout);
    while (fgets(line, sizeof line, stdin)) {
        printf("%s\n", greeting());
        fflush(stdout);
    }
    return 0;
}
"""
GREETER_V2 = GREETER_C.replace('"hello v1"', '"hello v2"')

CMAKE_PROJECT = r"""
cmake_minimum_required(VERSION 3.20)
project(greeter LANGUAGES C)
find_package(molt 0.1 REQUIRED)
if(NOT MOLT_COMPILER_IS_MOLTCC)
  message(FATAL_ERROR "greeter has updatable functions: configure with CC=${MOLT_MOLTCC}")
endif()
file(WRITE ${CMAKE_BINARY_DIR}/found.txt "${MOLT_MOLTCC}\n${MOLT_EXECUTABLE}\n${MOLT_INCLUDE_DIR}\n")
add_executable(greeter greeter.c)
target_link_libraries(greeter PRIVATE molt::molt)
"""

IMAGE_C = r"""
#include <stdio.h>
int main(int argc, char **argv)
{
    printf("image says %s\n", argc > 1 ? argv[1] : "nothing");
    return 7;
}
"""


def lib_path(prefix, *names):
    return os.path.join(prefix, DIRS["LIBDIR"], *names)


class Installed:
    """A molt tree installed under a temporary directory, and a clean
    environment that sees only it."""

    def __init__(self, top):
        self.top = top
        self.prefix = os.path.join(top, "prefix")
        self.work = os.path.join(top, "work")
        home, tmp = os.path.join(top, "home"), os.path.join(top, "tmp")
        for d in (self.work, home, tmp):
            os.makedirs(d)
        r = run([CMAKE, "--install", BUILD, "--prefix", self.prefix], timeout=300)
        assert r.returncode == 0, r.stdout + r.stderr
        self.bin = os.path.join(self.prefix, DIRS["BINDIR"])
        self.env = {
            "PATH": self.bin + ":/usr/bin:/bin",
            "HOME": home,
            "TMPDIR": tmp,
            "LC_ALL": "C.UTF-8",
            "PKG_CONFIG_PATH": lib_path(self.prefix, "pkgconfig"),
        }

    def run(self, cmd, cwd=None, env=None, check=True, timeout=300):
        """Runs cmd (a list, or a string for sh -c) in the clean environment."""
        e = dict(self.env, **(env or {}))
        for k, v in e.items():
            assert BUILD not in v and SOURCE not in v, (k, v)
        argv = ["sh", "-c", cmd] if isinstance(cmd, str) else cmd
        return run(argv, cwd=cwd or self.work, env=e, timeout=timeout, check=0 if check else None)

    def write(self, rel, text):
        return tree.write_file(self.work, rel, text)


@pytest.fixture(scope="module")
def inst():
    top = tempfile.mkdtemp(prefix="molt-install-")
    try:
        yield Installed(top)
    finally:
        shutil.rmtree(top, ignore_errors=True)


# ---------------------------------------------------------------------------
# A running greeter, patched from outside
# ---------------------------------------------------------------------------

class Greeter(Program):
    """The greeter running in the clean environment; ask() sends one line
    and returns the greeting it prints."""

    def __init__(self, inst, exe):
        Program.__init__(self, [exe], cwd=os.path.dirname(exe), env=inst.env, name="greeter")
        ready = self.line(20)
        assert ready.startswith("ready "), ready
        self.pid = int(ready.split()[1])

    def ask(self):
        self.send("x")
        return self.line(20)

    def close(self):
        self.finish(rc=0, timeout=20, quiet=True)


def run_and_patch(inst, exe, patch):
    """exe answers v1; after `molt apply` of patch it answers v2."""
    g = Greeter(inst, exe)
    try:
        assert g.ask() == "hello v1"
        r = inst.run(["molt", "apply", str(g.pid), patch])
        assert g.ask() == "hello v2", r.stdout
        st = inst.run(["molt", "status", str(g.pid)]).stdout
        assert "greeting" in st, st
    finally:
        g.close()


def check_runpath(path, expected):
    """The binary's RUNPATH/RPATH entries (list), compared with expected."""
    d = subprocess.run(["readelf", "-dW", path], capture_output=True, text=True,
                       env=dict(os.environ, LC_ALL="C")).stdout
    found = []
    for line in d.splitlines():
        if "(RUNPATH)" in line or "(RPATH)" in line:
            found += line.split("[", 1)[1].rstrip("]").split(":")
    assert found == expected, (path, found)


# ---------------------------------------------------------------------------
# Tests
# ---------------------------------------------------------------------------

def test_layout(inst):
    p = inst.prefix
    for name in ("molt", "moltcc", "moltstamp", "molt-run"):
        assert os.access(os.path.join(inst.bin, name), os.X_OK), name
    # libmolt.so -> libmolt.so.0 (the SONAME) -> libmolt.so.<version>
    assert os.readlink(lib_path(p, "libmolt.so")) == SONAME
    real = os.readlink(lib_path(p, SONAME))
    assert real.startswith(SONAME + ".") and os.path.isfile(lib_path(p, real))
    d = subprocess.run(["readelf", "-dW", lib_path(p, real)], capture_output=True,
                       text=True).stdout
    assert "Library soname: [%s]" % SONAME in d
    inc = os.path.join(p, DIRS["INCLUDEDIR"])
    for h in ("molt.h", "molt/abi.h", "molt/program.h"):
        with open(os.path.join(inc, h), "rb") as a, \
                open(os.path.join(SOURCE, "include", h), "rb") as b:
            assert a.read() == b.read(), h
    for m in ("molt.1", "moltcc.1"):
        assert os.path.isfile(os.path.join(p, DIRS["MANDIR"], "man1", m)), m
    pkg = os.path.join(p, DIRS["DATADIR"], "molt", "moltcc")
    for f in ("__main__.py", "driver.py", "toolchain.py", "patch/build.py", "image/xf.py"):
        assert os.path.isfile(os.path.join(pkg, f)), f
    helper = os.path.join(p, DIRS["DATADIR"], "molt", "gdb", "molt-gdb.py")
    with open(helper, "rb") as a, open(os.path.join(SOURCE, "tools", "gdb", "molt-gdb.py"), "rb") as b:
        assert a.read() == b.read()
    assert os.path.isfile(lib_path(p, "pkgconfig", "molt.pc"))
    for f in ("moltConfig.cmake", "moltConfigVersion.cmake", "moltTargets.cmake"):
        assert os.path.isfile(lib_path(p, "cmake", "molt", f)), f


def test_pkg_config_build_and_hot_patch(inst):
    flags = inst.run("pkg-config --cflags --libs molt").stdout.split()
    assert flags == ["-I" + os.path.join(inst.prefix, DIRS["INCLUDEDIR"]),
                     "-L" + lib_path(inst.prefix), "-lmolt"], flags
    moltcc = inst.run("pkg-config --variable=moltcc molt").stdout.strip()
    assert moltcc == os.path.join(inst.bin, "moltcc")
    inst.write("pc/greeter.c", GREETER_C)
    inst.write("pc/v2/greeter.c", GREETER_V2)
    pc = os.path.join(inst.work, "pc")
    inst.run("moltcc $(pkg-config --cflags molt) -O2 -g -o greeter greeter.c "
             "$(pkg-config --libs molt)", cwd=pc)
    # moltcc links with the installed libmolt's directory as RUNPATH
    check_runpath(os.path.join(pc, "greeter"), [lib_path(inst.prefix)])
    inst.run("moltcc --molt-patch --molt-target ./greeter -o fix.so v2/greeter.c -O2 -g "
             "$(pkg-config --cflags molt)", cwd=pc)
    run_and_patch(inst, os.path.join(pc, "greeter"), os.path.join(pc, "fix.so"))


def test_cmake_find_package_build_and_hot_patch(inst):
    inst.write("cm/CMakeLists.txt", CMAKE_PROJECT)
    inst.write("cm/greeter.c", GREETER_C)
    inst.write("cm/v2/greeter.c", GREETER_V2)
    cm = os.path.join(inst.work, "cm")
    env = {"CC": "moltcc", "CMAKE_PREFIX_PATH": inst.prefix}
    inst.run(["cmake", "-S", cm, "-B", os.path.join(cm, "build"), "-G", "Ninja",
              "-DCMAKE_BUILD_TYPE=RelWithDebInfo"], env=env)
    with open(os.path.join(cm, "build", "found.txt")) as f:
        moltcc, cli, include = f.read().split("\n")[:3]
    assert os.path.realpath(moltcc) == os.path.realpath(os.path.join(inst.bin, "moltcc"))
    assert os.path.realpath(cli) == os.path.realpath(os.path.join(inst.bin, "molt"))
    assert os.path.isfile(os.path.join(include, "molt.h"))
    inst.run(["cmake", "--build", os.path.join(cm, "build")], env=env)
    exe = os.path.join(cm, "build", "greeter")
    inst.run(["moltcc", "--molt-patch", "--molt-target", exe, "-o", "fix.so",
              "v2/greeter.c", "-O2", "-g"], cwd=cm)
    run_and_patch(inst, exe, os.path.join(cm, "fix.so"))
    # the package tells a plain compiler apart: this project refuses it
    r = inst.run(["cmake", "-S", cm, "-B", os.path.join(cm, "build-cc"), "-G", "Ninja"],
                 env=dict(env, CC="cc"), check=False)
    said = " ".join(r.stderr.split())       # CMake wraps its messages
    assert r.returncode != 0, r.stdout + r.stderr
    assert "configure with CC=" + os.path.join(inst.bin, "moltcc") in said, said


def test_molt_run_image(inst):
    inst.write("img/app.c", IMAGE_C)
    d = os.path.join(inst.work, "img")
    inst.run(["moltcc", "--molt-program", "-O2", "-g", "-o", "app.so", "app.c"], cwd=d)
    r = inst.run(["molt", "run", "app.so", "installed"], cwd=d, check=False)
    assert (r.returncode, r.stdout, r.stderr) == (7, "image says installed\n", ""), r


def test_moltcc_through_a_symlink(inst):
    links = os.path.join(inst.top, "links")
    os.makedirs(links, exist_ok=True)
    os.symlink(os.path.join(inst.bin, "moltcc"), os.path.join(links, "moltcc"))
    inst.write("ln/greeter.c", GREETER_C)
    d = os.path.join(inst.work, "ln")
    r = inst.run([os.path.join(links, "moltcc"), "--molt-verbose", "-c", "greeter.c"], cwd=d)
    assert "'greeting' is updatable" in r.stderr, r.stderr
    assert "-I" + os.path.realpath(os.path.join(inst.prefix, DIRS["INCLUDEDIR"])) in r.stderr


def installed_files(root):
    for dirpath, _, files in os.walk(root):
        for f in files:
            path = os.path.join(dirpath, f)
            if not os.path.islink(path):
                yield path


def test_no_reference_to_source_or_build_tree(inst):
    elves = 0
    scratch = os.path.join(inst.top, "stripped")
    for path in installed_files(inst.prefix):
        with open(path, "rb") as f:
            data = f.read()
        if data.startswith(b"\x7fELF"):
            elves += 1
            # debug information names the sources, as any unstripped
            # binary's does; nothing else may
            subprocess.run(["objcopy", "--strip-debug", path, scratch], check=True)
            with open(scratch, "rb") as f:
                data = f.read()
        for tree in (BUILD, SOURCE):
            assert tree.encode() not in data, (path, tree)
    assert elves == 4          # molt, molt-run, moltstamp, libmolt.so.<version>
    bindir_to_lib = os.path.relpath(lib_path(inst.prefix), inst.bin)
    check_runpath(os.path.join(inst.bin, "molt-run"), ["$ORIGIN/" + bindir_to_lib])
    for name in ("molt", "moltstamp"):
        check_runpath(os.path.join(inst.bin, name), [])
    check_runpath(lib_path(inst.prefix, SONAME), [])


def test_destdir_staging(inst):
    stage = os.path.join(inst.top, "stage")
    r = run([CMAKE, "--install", BUILD, "--prefix", "/opt/molt-staged"],
            env=dict(os.environ, DESTDIR=stage), timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    root = os.path.join(stage, "opt", "molt-staged")
    with open(lib_path(root, "pkgconfig", "molt.pc")) as f:
        pc = f.read()
    assert "\nprefix=/opt/molt-staged\n" in pc, pc
    for path in installed_files(root):
        with open(path, "rb") as f:
            assert stage.encode() not in f.read(), path
