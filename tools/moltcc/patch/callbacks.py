"""A patch's pre- and post-update callbacks (molt.h MOLT_PATCH_PRE and
MOLT_PATCH_POST) for a patch built from a fix: `--molt-callbacks FILE.c`.

The callbacks belong to the fix, not to the program, so they live in a file
of their own: put into the program's source, they would be declared again
by every later patch of that file (molt.h makes them a compile-time error
outside a patch source).  FILE.c is written as a hand-written patch is
(molt.h's manual interface: MOLT_IMPORT and MOLT_REF reach the program's
objects; a global can also simply be declared extern) and is compiled
with the compile of the first file the fix changes (its flags, includes
and directory) plus the flags of a patch compile.  It must not declare a
patch header (MOLT_PATCH): moltcc writes that.

Each callback is an ELF note (owner "molt", type 0x4d43) whose target is
relative to the note.  check_linked() reads them from the linked patch as
the runtime will (src/common/elf.c): at most one of each kind, each target
inside an executable PT_LOAD segment.  The runtime and moltstamp check the
same; this is the early error that names the file.
"""
import os
import struct

from elftools.elf.elffile import ELFFile

from ..errors import Fatal

NOTE_TYPE = 0x4d43
KINDS = {1: "pre-update", 2: "post-update"}


def compile_callbacks(s, comp, path, output, argv_of, run, cflags):
    """Compiles the callbacks file `path` to `output` with the recorded
    compile `comp` (argv_of/run: the pipeline's _argv/_run)."""
    argv = argv_of(comp, path, output, ["-iquote", os.path.dirname(path)], cflags)
    rc, err = run(s, argv, comp)
    if rc != 0:
        raise Fatal("%s: the callbacks file does not compile:\n%s" % (path, err.rstrip()))
    if err:
        s.report.messages.append(err.rstrip())
    return output


def _notes(elf):
    """(descriptor bytes, file offset of the descriptor) of every callback
    note in the sections of type SHT_NOTE."""
    for sec in elf.iter_sections():
        if sec["sh_type"] != "SHT_NOTE":
            continue
        data, pos = sec.data(), 0
        while pos + 12 <= len(data):
            namesz, descsz, typ = struct.unpack_from("<III", data, pos)
            name_off = pos + 12
            desc_off = name_off + ((namesz + 3) & ~3)
            if data[name_off:name_off + namesz] == b"molt\0" and typ == NOTE_TYPE:
                yield data[desc_off:desc_off + descsz], sec["sh_offset"] + desc_off
            pos = desc_off + ((descsz + 3) & ~3)


def check_linked(path, source):
    """The callbacks of the linked patch at `path` as [(kind, name)]; Fatal
    for two of a kind or one outside the patch's code."""
    found = {}
    with open(path, "rb") as f:
        elf = ELFFile(f)
        loads = [seg for seg in elf.iter_segments() if seg["p_type"] == "PT_LOAD"]
        for desc, off in _notes(elf):
            if len(desc) < 17:
                raise Fatal("%s: malformed callback note" % path)
            kind, _, delta = struct.unpack_from("<IIq", desc)
            name = desc[16:].split(b"\0")[0].decode("ascii", "replace")
            what = KINDS.get(kind)
            if what is None:
                raise Fatal("%s: callback note of unknown kind %d" % (path, kind))
            if kind in found:
                raise Fatal("%s declares two %s callbacks (%s and %s); a patch has at most one"
                            % (source, what, found[kind], name))
            field = off + 8
            seg = next((p for p in loads if p["p_offset"] <= field < p["p_offset"] + p["p_filesz"]),
                       None)
            target = seg["p_vaddr"] + (field - seg["p_offset"]) + delta if seg else None
            code = target is not None and any(
                p["p_flags"] & 1 and p["p_vaddr"] <= target < p["p_vaddr"] + p["p_filesz"]
                for p in loads)
            if not code:
                raise Fatal("%s: the %s callback %s does not point into the patch's code"
                            % (source, what, name))
            found[kind] = name
    return [(KINDS[k], found[k]) for k in sorted(found)]
