"""Symbol table of a linked program, read with readelf.

moltcc only needs names, types and binding, grouped the way the runtime
matches statics: every local symbol belongs to the STT_FILE symbol that
precedes it, keyed by that file's basename (what gcc writes in `.file`).
pyelftools is not a dependency: readelf (binutils) is always next to gcc.
"""
import os
import re
import subprocess

_LINE = re.compile(
    r"^\s*\d+:\s+([0-9a-fA-F]+)\s+(\S+)\s+(\w+)\s+(\w+)\s+(\w+)\s+(\S+)\s*(.*)$")


# Symbol types (readelf's spelling) that may be a variable or a function
# of the program.
VAR_SYMTYPES = {"OBJECT", "TLS", "COMMON", "NOTYPE"}
FUNC_SYMTYPES = {"FUNC", "IFUNC", "NOTYPE"}


class SymbolError(Exception):
    pass


class Symtab:
    def __init__(self):
        self.globals = {}   # name -> type   (defined GLOBAL/WEAK symbols)
        self.files = {}     # basename -> {name: type} (LOCAL symbols)
        self.has_symtab = False

    # -- queries ---------------------------------------------------------
    def has_global(self, name, types=None):
        t = self.globals.get(name)
        return t is not None and (types is None or t in types)

    def groups(self, tu):
        return [g for b, g in self._by_base.get(tu, [])]

    def static_count(self, tu, name, types=None):
        """How many STT_FILE groups named `tu` define local `name`."""
        n = 0
        for g in self.groups(tu):
            t = g.get(name)
            if t is not None and (types is None or t in types):
                n += 1
        return n

    def renamed_static(self, tu, name):
        """Local symbols of `tu` that are `name` renamed by the compiler
        (name.lto_priv.0, name.constprop.0, ...)."""
        out = []
        for g in self.groups(tu):
            # not name.N: that is how gcc names function-local statics
            out += [n for n in g if n.startswith(name + ".lto_priv.")]
        return out

    def has_local_anywhere(self, name, types=None):
        for groups in self._by_base.values():
            for _, g in groups:
                t = g.get(name)
                if t is not None and (types is None or t in types):
                    return True
        return False


def read_symtab(path):
    if not os.path.exists(path):
        raise SymbolError("target %s does not exist" % path)
    env = dict(os.environ, LC_ALL="C")
    try:
        p = subprocess.run(["readelf", "-sW", path], capture_output=True,
                           text=True, env=env)
    except FileNotFoundError:
        raise SymbolError("readelf not found (install binutils)")
    if p.returncode != 0:
        msg = p.stderr.strip().splitlines()
        raise SymbolError("cannot read the symbol table of %s: %s"
                          % (path, msg[-1] if msg else "readelf failed"))
    st = Symtab()
    st._by_base = {}
    section = None
    current = None
    for line in p.stdout.splitlines():
        if line.startswith("Symbol table"):
            section = ".symtab" if "'.symtab'" in line else "other"
            if section == ".symtab":
                st.has_symtab = True
            current = None
            continue
        if section != ".symtab":
            continue
        m = _LINE.match(line)
        if not m:
            continue
        _value, _size, typ, bind, _vis, ndx, name = m.groups()
        name = name.strip()
        if typ == "FILE":
            group = {}
            base = os.path.basename(name)
            st._by_base.setdefault(base, []).append((name, group))
            current = group
            continue
        if not name or ndx == "UND":
            continue
        if "@" in name:
            # Versioned names are copies of library symbols (copy
            # relocations, e.g. stdout@GLIBC_2.2.5): the program does not
            # own them, ordinary dynamic linking reaches them.
            continue
        if bind == "LOCAL":
            if current is not None:
                current[name] = typ
        elif bind in ("GLOBAL", "WEAK", "UNIQUE", "GNU_UNIQUE"):
            st.globals[name] = typ
    st.files = {b: [g for _, g in v] for b, v in st._by_base.items()}
    return st


def build_id(path):
    """The hex NT_GNU_BUILD_ID of the ELF file at path; SymbolError (one
    line) when it cannot be read, is not ELF, or has none."""
    try:
        from elftools.elf.elffile import ELFFile
    except ImportError:  # pragma: no cover - python3-pyelftools is a dependency
        raise SymbolError("reading build-ids needs python3-pyelftools")
    try:
        with open(path, "rb") as f:
            elf = ELFFile(f)
            for sec in elf.iter_sections():
                if sec.header.sh_type != "SHT_NOTE":
                    continue
                for note in sec.iter_notes():
                    if note["n_type"] == "NT_GNU_BUILD_ID":
                        return note["n_desc"]
    except OSError as e:
        raise SymbolError("cannot read %s: %s" % (path, e.strerror))
    except Exception as e:  # pyelftools' errors on a file that is not ELF
        raise SymbolError("%s is not an ELF program (%s)" % (path, e))
    raise SymbolError("%s has no build-id; relink it with -Wl,--build-id "
                      "(attach patches are matched by it)" % path)


# -- source names in debug info ------------------------------------------------

_SHF_COMPRESSED = 0x800


def _sections(data):
    """{name: (offset, size, flags)} of an ELF64 little-endian file's
    sections; {} for anything else."""
    import struct
    if len(data) < 64 or data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:
        return {}
    shoff, = struct.unpack_from("<Q", data, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", data, 0x3a)
    if shoff == 0 or shentsize < 64 or shoff + shnum * shentsize > len(data) or shstrndx >= shnum:
        return {}
    heads = []
    for i in range(shnum):
        name, _type, flags, _addr, off, size = struct.unpack_from("<IIQQQQ", data, shoff + i * shentsize)
        heads.append((name, flags, off, size))
    _, _, stroff, strsize = heads[shstrndx]
    out = {}
    for name, flags, off, size in heads:
        if name >= strsize or off + size > len(data):
            continue
        end = data.find(b"\0", stroff + name, stroff + strsize)
        if end >= 0:
            out[data[stroff + name:end].decode("latin-1")] = (off, size, flags)
    return out


def rename_debug_names(path, suffixes, sections=(".debug_str",)):
    """Gives generated functions their source names in the string tables
    of an object or linked file, in place: every string `f<suffix>` of the
    named sections (f not empty) becomes `f` by a NUL written after f.  The
    bytes after it stay, unreferenced.  Nothing moves, so every offset into
    the table stays valid; a string that a tail-merged table shares with a
    longer one (`o__molt_v0` inside `foo__molt_v0`) starts inside `foo` and
    reads `o` after the edit, its own source name.  DWARF names a C
    function by DW_AT_name only, which is such a string (clang's and gcc's
    names of this length are never inline in .debug_info).  Compressed
    sections are left alone.  Returns how many strings were renamed."""
    with open(path, "rb") as f:
        data = bytearray(f.read())
    secs = _sections(bytes(data))
    suffixes = [x.encode() for x in suffixes]
    n = 0
    for name in sections:
        if name not in secs:
            continue
        off, size, flags = secs[name]
        if flags & _SHF_COMPRESSED:
            continue
        pos, end = off, off + size
        while pos < end:
            z = data.find(b"\0", pos, end)
            if z < 0:
                break
            s = bytes(data[pos:z])
            for suf in suffixes:
                if len(s) > len(suf) and s.endswith(suf):
                    data[z - len(suf)] = 0
                    n += 1
                    break
            pos = z + 1
    if n:
        with open(path, "r+b") as f:
            f.write(data)
    return n
