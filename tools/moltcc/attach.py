"""--molt-attach: a patch for `molt attach`, for a program that was never
built with molt (issue 13, first milestone).

    moltcc --molt-attach --molt-target PROG -o fix.so fix.c [cflags]

fix.c holds the new versions of the functions to replace, each with the
name it has in PROG and external linkage; helpers are static; everything
else of PROG -- functions and variables, statics included -- is declared
`extern` and used by name (molt attach resolves the references through
PROG's symbol table; a static name must be unique in PROG).

The patch is an ordinary shared object, compiled position independent and
without start files (no constructor of it ever runs), with a
`.molt_attach` section that records PROG's build-id; molt attach refuses
it for any other program.  The two-version builder (--molt-patch with
--molt-diff) does not produce attach patches yet.

    moltcc --molt-attach --molt-target PROG --molt-callbacks CB.c -o fix.so fix.c

adds the pre- and post-update callbacks of CB.c, declared as for a hot
patch (molt.h MOLT_PATCH_PRE/MOLT_PATCH_POST, the callback functions
themselves static); molt attach runs them inside the target.  CB.c is
compiled with the patch's flags, molt.h on the include path and
-DMOLT__NO_AUTO_REGISTER (as every patch source is); the linked patch's
notes are checked as for a hot patch (patch/callbacks.py).
"""
import os
import subprocess
import tempfile

from .elf import SymbolError, build_id
from .errors import Fatal

SECTION = ".molt_attach"


def target_build_id(path):
    try:
        return build_id(path)
    except SymbolError as e:
        raise Fatal(str(e))


def build_attach(s):
    opts, cmd = s.options, s.cmd
    if not opts.target:
        raise Fatal("--molt-attach needs --molt-target PROG (the running program's file)")
    if not cmd.output:
        raise Fatal("--molt-attach needs -o FILE")
    if not cmd.inputs:
        raise Fatal("--molt-attach needs the patch's source file(s)")
    for bad in ("-c", "-S", "-E"):
        if bad in cmd.flags:
            raise Fatal("%s is not meaningful with --molt-attach (it links a patch)" % bad)
    build_id = target_build_id(opts.target)
    out = cmd.output
    args = [a for a in cmd.args]
    callbacks = None
    if opts.callbacks:
        callbacks = os.path.abspath(opts.callbacks)
        if not os.path.isfile(callbacks):
            raise Fatal("--molt-callbacks %s: no such file" % opts.callbacks)
        s.layout.check_include()
        # after the patch's own sources: the same flags; molt.h's patch
        # macros (MOLT_PATCH_PRE/POST) need MOLT__NO_AUTO_REGISTER
        args = args + ["-I", s.layout.include, "-DMOLT__NO_AUTO_REGISTER", callbacks]
    with tempfile.TemporaryDirectory(prefix="moltcc-attach-") as d:
        tmp = os.path.join(d, "patch.so")
        oi = cmd.output_index
        args[oi] = tmp
        link = s.tools.cc + ["-fPIC", "-shared", "-nostartfiles", "-Wl,-z,now",
                             "-Wl,--build-id"] + args
        rc, _ = s.tools.run(link)
        if rc != 0:
            raise Fatal("compiling the attach patch failed")
        if callbacks:
            from .patch.callbacks import check_linked
            check_linked(tmp, callbacks)
        note = os.path.join(d, "molt_attach.txt")
        with open(note, "w") as f:
            f.write("molt-attach 1\nbuild-id %s\n" % build_id)
        objcopy = os.environ.get("OBJCOPY", "objcopy")
        cp = [objcopy, "--add-section", "%s=%s" % (SECTION, note), tmp]
        s.tools.show(cp)
        p = subprocess.run(cp, stderr=subprocess.PIPE)
        if p.returncode != 0:
            raise Fatal("objcopy failed: %s" % p.stderr.decode(errors="replace").strip())
        _copy(tmp, out)
    return 0


def _copy(src, dst):
    with open(src, "rb") as f:
        data = f.read()
    tmp = dst + ".tmp"
    with open(tmp, "wb") as f:
        f.write(data)
    os.chmod(tmp, 0o755)
    os.replace(tmp, dst)
