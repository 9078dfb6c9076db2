"""No code of a patch runs when it is loaded or unloaded (issue 16, deliver 3).

The runtime dlopens a patch on its own thread, holding the operation lock:
a constructor there could print into the host, exit it, fault or block it,
before molt has bound the patch's imports.  So a patch has no constructors
or destructors, no _init/_fini, no .init_array/.preinit_array/.fini_array:

- the patch is linked with -nostartfiles (no crti/crtbeginS: their _init,
  frame_dummy and __do_global_dtors_aux are the compiler's, not needed by a
  patch, which has no C++ statics and registers no EH frames by hand);
- link_inputs() looks at every object going into the link: a constructor or
  destructor of the user's is an error naming the function and the object;
  the ones sanitizers add to every object (gcc's _sub_I_00099_0, clang's
  asan.module_ctor: they register the object's globals with the sanitizer
  runtime) are dropped from a private copy of the object -- the patch's
  globals then go unchecked by ASan, its code stays instrumented;
- check_linked() refuses a linked patch whose dynamic section still has an
  entry that makes ld.so run code (an `_init` symbol defined by hand, an
  archive member with a constructor).

The runtime refuses such a patch too (src/common/elf.c, LOAD_NO_CODE);
this is the early, clearer error.
"""
import os
import re
import subprocess

from elftools.elf.elffile import ELFFile
from elftools.elf.relocation import RelocationSection
from elftools.elf.dynamic import DynamicSection

from ..errors import Fatal

# the same pattern objdiff uses for instrumentation constructors
_INSTRUMENTATION_RE = re.compile(r"^(_sub_[ID]_\d+_\d+|[a-z]+\.module_[cd]tor)$")
_CTOR_PREFIXES = (".init_array", ".preinit_array", ".ctors")
_DTOR_PREFIXES = (".fini_array", ".dtors")
_CODE_TAGS = {"DT_INIT": "an _init function", "DT_INIT_ARRAY": "constructors",
              "DT_PREINIT_ARRAY": "pre-initializers", "DT_FINI": "an _fini function",
              "DT_FINI_ARRAY": "destructors"}


def _kind(name):
    if name.startswith(_CTOR_PREFIXES):
        return "constructor"
    if name.startswith(_DTOR_PREFIXES):
        return "destructor"
    return None


def _function_at(elf, symtab, sym, addend):
    """The name of the function a constructor-table entry points to: the
    symbol itself, or for a section symbol the function at the addend."""
    if sym["st_info"]["type"] != "STT_SECTION":
        return sym.name
    for s in symtab.iter_symbols():
        if (s["st_shndx"] == sym["st_shndx"] and s["st_info"]["type"] == "STT_FUNC"
                and s["st_value"] == addend):
            return s.name
    return "%s+%#x" % (elf.get_section(sym["st_shndx"]).name, addend)


def code_sections(path):
    """The constructor/destructor sections of the object at `path`, checked:
    Fatal for one that holds a function of the user's."""
    out = []
    with open(path, "rb") as f:
        elf = ELFFile(f)
        symtab = elf.get_section_by_name(".symtab")
        for idx, sec in enumerate(elf.iter_sections()):
            kind = _kind(sec.name)
            if kind is None:
                continue
            out.append(sec.name)
            relocated = False
            for rs in elf.iter_sections():
                if not isinstance(rs, RelocationSection) or rs["sh_info"] != idx:
                    continue
                relocated = True
                out.append(rs.name)
                for r in rs.iter_relocations():
                    sym = symtab.get_symbol(r["r_info_sym"])
                    fn = _function_at(elf, symtab, sym, r["r_addend"] if r.is_RELA() else 0)
                    if not _INSTRUMENTATION_RE.match(fn):
                        raise Fatal("%s: function %s is a %s (section %s): a patch must not run "
                                    "code when it is loaded or unloaded; move that work into "
                                    "the patched functions" % (path, fn, kind, sec.name))
            if sec["sh_size"] and not relocated:
                raise Fatal("%s: section %s holds %ss that cannot be identified: a patch must "
                            "not run code when it is loaded or unloaded" % (path, sec.name, kind))
    return out


def link_inputs(objects, workdir, objcopy="objcopy"):
    """The objects to link: each checked; one with instrumentation
    constructors replaced by a copy without them (in workdir)."""
    out = []
    for i, path in enumerate(objects):
        if not path.endswith(".o") or not os.path.isfile(path):
            out.append(path)    # archives: check_linked() sees what they bring
            continue
        secs = code_sections(path)
        if not secs:
            out.append(path)
            continue
        copy = os.path.join(workdir, "noctor.%d.%s" % (i, os.path.basename(path)))
        cmd = [objcopy] + ["--remove-section=" + s for s in secs] + [path, copy]
        p = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        if p.returncode != 0:
            raise Fatal("cannot drop the sanitizer constructors of %s: %s"
                        % (path, p.stderr.decode(errors="replace").strip()))
        out.append(copy)
    return out


def check_linked(path):
    """Fatal if the linked patch would make ld.so run any of its code."""
    with open(path, "rb") as f:
        elf = ELFFile(f)
        for sec in elf.iter_sections():
            if not isinstance(sec, DynamicSection):
                continue
            for tag in sec.iter_tags():
                what = _CODE_TAGS.get(tag.entry.d_tag)
                if what:
                    raise Fatal("%s has %s (%s): a patch must not run code when it is loaded "
                                "or unloaded (an object or archive member of the link defines "
                                "it)" % (path, tag.entry.d_tag, what))
