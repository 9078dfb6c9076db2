"""The state of one moltcc run, handed to every mode as one object.

    s = Session(cmd, options, layout, tools, started)
    s.cmd        gccargs.Command: the compiler command line (no --molt-*)
    s.options    driver.MoltOptions: the --molt-* options
    s.layout     toolchain.Layout: molt.h, libmolt, moltstamp, sanitizers
    s.tools      toolchain.Toolchain: the real compiler, run() and exec_cc()
    s.work       Workdir: the private directory for generated files
    s.report     Report: warnings and notes, printed by s.flush_report()

A mode is a function build_*(s) -> exit status; it raises errors.Fatal for
a one-line error.  Nothing in the package keeps state elsewhere.
"""
import os
import shutil
import sys
import tempfile

from . import gccargs
from .errors import PROG, Fatal


class Report:
    """Warnings and notes for the user, collected while a unit is analysed
    and woven, printed by Session.flush_report()."""

    def __init__(self, verbose=False):
        self.verbose = verbose
        self.messages = []

    def warn(self, msg):
        self.messages.append("moltcc: warning: " + msg)

    def note(self, msg):
        if self.verbose:
            self.messages.append("moltcc: note: " + msg)


class Workdir:
    """The build-private temporary directory for generated sources."""

    def __init__(self, keep):
        self.keep = keep
        self.path = None
        self.n = 0

    def subdir(self):
        """A fresh directory of its own (a generated file keeps the user's
        basename there)."""
        if self.path is None:
            self.path = tempfile.mkdtemp(prefix="moltcc-")
        self.n += 1
        d = os.path.join(self.path, str(self.n))
        os.mkdir(d)
        return d

    def file(self, name):
        if self.path is None:
            self.path = tempfile.mkdtemp(prefix="moltcc-")
        return os.path.join(self.path, name)

    def finish(self, failed_internal=False):
        if self.path is None:
            return
        if self.keep or failed_internal:
            sys.stderr.write("%s: generated sources kept in %s\n" % (PROG, self.path))
        else:
            shutil.rmtree(self.path, ignore_errors=True)
        self.path = None            # finished once (a mode may finish on several paths)


class Session:
    def __init__(self, cmd, options, layout, tools, started):
        self.cmd = cmd
        self.options = options
        self.layout = layout
        self.tools = tools
        self.started = started      # a file newer than this was written by this run
        self.work = Workdir(options.keep)
        self.report = Report(tools.verbose)

    def clang_args(self):
        """The command's options for libclang (the same headers, macros and
        dialect as the compile, molt.h, the sanitizers' macros)."""
        return gccargs.libclang_args(self.cmd.args, self.layout.include, self.layout.sanitizers())

    def flush_report(self):
        for m in self.report.messages:
            sys.stderr.write(m + "\n")
        self.report.messages = []

    def compile_generated(self, cmd, original, what):
        """Runs the compile of a generated source.  If it fails, the user's
        own source is compiled as it is (original): when that fails too, the
        user sees the compiler's messages for their own code; when it
        succeeds, the failure is moltcc's, and says so (never a silently
        non-updatable build)."""
        rc, err = self.tools.run(cmd, capture=True)
        if rc == 0:
            sys.stderr.buffer.write(err)
            return 0
        rc2, err2 = self.tools.run(original, capture=True)
        if rc2 != 0:
            sys.stderr.buffer.write(err2)
            return rc2
        sys.stderr.buffer.write(err)
        self.work.keep = True
        raise Fatal("internal error: the generated source of %s does not compile, but the original "
                    "does; please report this (generated sources kept in %s)" % (what, self.work.path))

    def make_output(self, path, build):
        """Runs build() -> exit status, which writes `path` (a patch, an
        image).  Unless it succeeds, `path` is removed if this run wrote it:
        a half-made patch must not be taken for a good one.  The work
        directory is finished either way."""
        ok = False
        try:
            rc = build()
            ok = rc == 0
            return rc
        finally:
            if not ok and os.path.exists(path) and os.path.getmtime(path) >= self.started:
                try:
                    os.unlink(path)
                except OSError:
                    pass
            self.work.finish()
