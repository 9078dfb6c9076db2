"""Where molt is, and the compiler moltcc runs.

Layout: molt.h's directory, libmolt's directory and moltstamp, found
through $MOLT_PREFIX, the paths the CMake-generated launchers pass
(--molt-internal-*: the build tree's, or the installed one's, relative to
itself), or this package's own place (installed tree, source tree +
build/); and the sanitizers libmolt was built with, whose flags
every compile and link must carry.

Toolchain: the real compiler ($MOLT_CC, default cc) and how moltcc runs it
and the other tools (every command shown under --molt-verbose), plus the
flags that make the compile of a generated source behave like the compile
of the user's own file.
"""
import os
import re
import shlex
import subprocess
import sys
import sysconfig

from .errors import PROG, Fatal

SANITIZERS = ("address", "undefined", "thread", "leak")
# DT_NEEDED of a sanitized libmolt -> the -fsanitize= name it needs
_SAN_RUNTIMES = (("libasan.", "address"), ("libubsan.", "undefined"),
                 ("libtsan.", "thread"), ("liblsan.", "leak"))


class Layout:
    def __init__(self, include, libdir, moltstamp, sanitize=None):
        self.include, self.libdir, self.moltstamp = include, libdir, moltstamp
        # list of -fsanitize= names libmolt was built with; None: not known
        # yet (read from libmolt when first needed)
        self._sanitize = sanitize

    def sanitizers(self):
        """The sanitizers libmolt was built with.  A program or shared
        object linked against a sanitized libmolt must be linked with the
        same -fsanitize= flags (the sanitizer runtime has to come first in
        the initial library list), and its code is instrumented too."""
        if self._sanitize is None:
            self._sanitize = detect_sanitizers(self.libdir)
        return self._sanitize

    def san_flags(self):
        """Flags for every compile and link (empty without sanitizers).
        The same as the top-level CMakeLists.txt gives libmolt."""
        san = self.sanitizers()
        if not san:
            return []
        out = ["-fsanitize=" + ",".join(san), "-fno-omit-frame-pointer"]
        if "undefined" in san:
            out.append("-fno-sanitize-recover=undefined")
        return out

    def check_include(self):
        if not os.path.isfile(os.path.join(self.include, "molt.h")):
            raise Fatal("cannot find molt.h in %s (set MOLT_PREFIX to a molt installation)" % self.include)

    def check_lib(self):
        if not any(os.path.exists(os.path.join(self.libdir, n)) for n in ("libmolt.so", "libmolt.a")):
            raise Fatal("cannot find libmolt.so in %s (build the 'molt' target or set MOLT_PREFIX)" % self.libdir)

    def check_moltstamp(self):
        stamp = self.moltstamp
        if not stamp or not os.path.isfile(stamp):
            raise Fatal("cannot find moltstamp (%s); build the 'moltstamp' target or set MOLT_PREFIX"
                        % (stamp or "not configured"))
        return stamp


def parse_sanitize(value):
    names = [n for n in value.replace(" ", "").split(",") if n]
    bad = [n for n in names if n not in SANITIZERS]
    if bad:
        raise Fatal("--molt-internal-sanitize: unknown sanitizer %s (known: %s)"
                    % (bad[0], ", ".join(SANITIZERS)))
    return names


def detect_sanitizers(libdir):
    """Sanitizers of the libmolt in libdir, from its DT_NEEDED entries
    (gcc links a sanitized shared library against libasan/libubsan/libtsan).
    Used when no launcher says it (MOLT_PREFIX, installed tree)."""
    lib = os.path.join(libdir or ".", "libmolt.so")
    if not os.path.exists(lib):
        return []
    try:
        p = subprocess.run(["readelf", "-dW", lib], capture_output=True, text=True,
                           env=dict(os.environ, LC_ALL="C"))
    except OSError:
        return []
    found = []
    for m in re.finditer(r"\(NEEDED\)\s+Shared library: \[([^\]]+)\]", p.stdout):
        for prefix, name in _SAN_RUNTIMES:
            if m.group(1).startswith(prefix) and name not in found:
                found.append(name)
    return found


def prefix_layout(prefix):
    """The Layout of a molt installation: <prefix>/include, <prefix>/bin/moltstamp
    and libmolt in lib/, lib64/ or Debian's lib/<multiarch>/ (GNUInstallDirs)."""
    multiarch = sysconfig.get_config_var("MULTIARCH") or "x86_64-linux-gnu"
    libdir = os.path.join(prefix, "lib")
    for cand in ("lib", "lib64", os.path.join("lib", multiarch)):
        if os.path.exists(os.path.join(prefix, cand, "libmolt.so")):
            libdir = os.path.join(prefix, cand)
            break
    return Layout(os.path.join(prefix, "include"), libdir, os.path.join(prefix, "bin", "moltstamp"))


def locate(internal):
    """The Layout.  internal: the launcher's --molt-internal-* options
    ({"include": ..., "libdir": ..., "moltstamp": ..., "sanitize": ...})."""
    prefix = os.environ.get("MOLT_PREFIX")
    if prefix:
        return prefix_layout(prefix)
    if "include" in internal:
        san = internal.get("sanitize")
        return Layout(internal["include"], internal.get("libdir", ""), internal.get("moltstamp", ""),
                      parse_sanitize(san) if san is not None else None)
    here = os.path.dirname(os.path.realpath(__file__))
    # installed without its launcher: <prefix>/share/molt/moltcc/ (this package)
    pfx = os.path.normpath(os.path.join(here, "..", "..", ".."))
    if os.path.isfile(os.path.join(pfx, "include", "molt.h")) and \
            os.path.basename(os.path.dirname(here)) == "molt":
        return prefix_layout(pfx)
    # source tree: <src>/tools/moltcc/, build tree in $MOLT_BUILD_DIR or <src>/build
    src = os.path.normpath(os.path.join(here, "..", ".."))
    build = os.environ.get("MOLT_BUILD_DIR") or os.path.join(src, "build")
    return Layout(os.path.join(src, "include"), os.path.abspath(build),
                  os.path.join(os.path.abspath(build), "bin", "moltstamp"))


# ---------------------------------------------------------------------------
# Running things
# ---------------------------------------------------------------------------

class Toolchain:
    """The real compiler, and how commands are run."""

    def __init__(self, verbose):
        self.verbose = verbose
        # $MOLT_CC is split like a shell word list ("ccache gcc")
        self.cc = shlex.split(os.environ.get("MOLT_CC") or "cc")

    def show(self, cmd):
        if self.verbose:
            sys.stderr.write("%s: run: %s\n" % (PROG, " ".join(shlex.quote(c) for c in cmd)))

    def run(self, cmd, capture=False):
        """(exit status, stderr bytes when captured, else b"")."""
        self.show(cmd)
        try:
            if capture:
                p = subprocess.run(cmd, stdout=None, stderr=subprocess.PIPE)
                return p.returncode, p.stderr
            return subprocess.call(cmd), b""
        except FileNotFoundError:
            raise Fatal("cannot run %s" % cmd[0])

    def exec_cc(self, args):
        """Replaces moltcc with the real compiler on these arguments."""
        cmd = self.cc + args
        self.show(cmd)
        sys.stdout.flush()
        sys.stderr.flush()
        try:
            os.execvp(cmd[0], cmd)
        except OSError as e:
            raise Fatal("cannot run %s: %s" % (cmd[0], e.strerror))


# ---------------------------------------------------------------------------
# Compiling generated sources
# ---------------------------------------------------------------------------

def strip_lto(args, path):
    """LTO merges files and drops their STT_FILE symbols, so the runtime
    could no longer find a file's statics by file name: files with
    updatable functions are compiled without it."""
    out = [a for a in args if not (a == "-flto" or a.startswith("-flto=") or a == "-ffat-lto-objects")]
    if len(out) != len(args):
        sys.stderr.write("%s: warning: %s: -flto is not used for files with updatable functions "
                         "(patches find statics by file name)\n" % (PROG, path))
    return out


def generated_flags(user_path, generated_path):
    """Flags that make a generated file behave like the user's: quoted
    includes resolve from the user's directory first, and debug info names
    the user's directory.  (flags before the user's, flags after them)"""
    d = os.path.dirname(user_path) or "."
    return ["-iquote", d], ["-fdebug-prefix-map=%s=%s" % (os.path.dirname(generated_path), d)]


def color_flags(cmd):
    """The compiler's messages keep their colours although moltcc captures
    them (unless the user chose)."""
    if sys.stderr.isatty() and not any(f.startswith("-fdiagnostics-color") or
                                       f.startswith("-fno-diagnostics-color") for f in cmd.flags):
        return ["-fdiagnostics-color=always"]
    return []
