"""molt-gdb.py -- the molt state of a live process or of a core file, in gdb.

    (gdb) source /usr/share/molt/gdb/molt-gdb.py      (or: gdb -x molt-gdb.py)
    (gdb) molt-status

prints the generation, the live generations, the loaded patches, which
version each updatable function's entry reaches, and the calls each thread
still runs in an older generation -- read from the process's memory alone,
so it works on a core file (gcore, a crash dump) as on a live process.

Where it reads (docs/guide.md, "Debugging a patched process"):
- molt__current, molt__gens (libmolt's exported generation slots: the
  molt/abi.h layout, versioned by MOLT__ABI);
- the descriptors of the program's updatable functions (section molt_fns,
  between __start_molt_fns and __stop_molt_fns of the executable);
- each loaded patch: the objects that define molt_patch_header (the link
  map names a patch by its file, so gdb has its symbols);
- each thread's molt__self (static TLS of libmolt: its active[] counters);
- the runtime's last scan for threads inside a replaced version 0
  (oldcode.c; needs libmolt's debug info).
Nothing here writes to the process.
"""
import gdb

SLOTS = 128          # MOLT__SLOTS
GEN_SIZE = 64        # sizeof(molt__gen): table, number, size, slot, pad
DESC_SIZE = 64       # sizeof(molt__fn_desc)
DESC_MAGIC = 0x6d6f6c74
PATCH_MAGIC = 0x4d4f4c54


def _inferior():
    return gdb.selected_inferior()


def _read(addr, n):
    return bytes(_inferior().read_memory(addr, n))


def _u64(addr):
    return int.from_bytes(_read(addr, 8), "little")


def _u32(addr):
    return int.from_bytes(_read(addr, 4), "little")


def _cstr(addr, limit=256):
    if not addr:
        return ""
    out = b""
    while len(out) < limit:
        chunk = _read(addr + len(out), 32)
        z = chunk.find(b"\0")
        if z >= 0:
            return (out + chunk[:z]).decode("utf-8", "replace")
        out += chunk
    return out.decode("utf-8", "replace")


def _addr_of(expr):
    """The address of a (minimal) symbol, or None."""
    try:
        return int(gdb.parse_and_eval("(unsigned long)&%s" % expr))
    except gdb.error:
        return None


def _where(addr):
    """(function name, object file) of a code address."""
    name = None
    try:
        block = gdb.block_for_pc(addr)
        while block is not None and block.function is None:
            block = block.superblock
        if block is not None and block.function is not None:
            name = block.function.name
    except RuntimeError:
        pass
    if name is None:
        try:
            text = gdb.execute("info symbol %#x" % addr, to_string=True).strip()
            name = text.split(" in section")[0]
        except gdb.error:
            name = "?"
    return name, gdb.solib_name(addr)


def _patches():
    """{object file: (id, description, [(name, tu)])} of the loaded patches."""
    out = {}
    # every loaded object that defines its own molt_patch_header
    for lib in _shared_libraries():
        path, lo, hi = lib
        addr = _symbol_in(path, lo, "molt_patch_header")
        if addr is None:
            continue
        try:
            if _u32(addr) != PATCH_MAGIC:
                continue
            pid_, desc = _u64(addr + 8), _u64(addr + 16)
            fns, fns_end = _u64(addr + 24), _u64(addr + 32)
            funcs = []
            for f in range(fns, min(fns_end, fns + 24 * 4096), 24):
                funcs.append((_cstr(_u64(f)), _cstr(_u64(f + 8)), _u64(f + 16)))
            out[path] = (_cstr(pid_), _cstr(desc), funcs)
        except gdb.MemoryError:
            continue
    return out


def _shared_libraries():
    libs = []
    text = gdb.execute("info sharedlibrary", to_string=True)
    for line in text.splitlines():
        parts = line.split()
        if len(parts) >= 3 and parts[0].startswith("0x") and parts[1].startswith("0x"):
            libs.append((parts[-1], int(parts[0], 16), int(parts[1], 16)))
    return libs


def _elf_symbol(path, name):
    """(st_value, .text sh_addr) of dynamic symbol `name` in the ELF file
    at path, or None: a patch's header has no debug info, and gdb's Python
    has no minimal-symbol lookup by object."""
    import struct
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError:
        return None
    if data[:4] != b"\x7fELF" or data[4] != 2:
        return None
    shoff, = struct.unpack_from("<Q", data, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", data, 0x3a)
    secs = []
    for i in range(shnum):
        secs.append(struct.unpack_from("<IIQQQQII", data, shoff + i * shentsize))
    shstr = secs[shstrndx][4]

    def sname(sec):
        o = shstr + sec[0]
        return data[o:data.index(b"\0", o)].decode()
    text = [sec[3] for sec in secs if sname(sec) == ".text"]
    for sec in secs:
        if sec[1] != 11:            # SHT_DYNSYM
            continue
        strtab = secs[sec[6]][4]
        for off in range(sec[4], sec[4] + sec[5], 24):
            st_name, _info, _other, _shndx, value, _size = struct.unpack_from("<IBBHQQ", data, off)
            o = strtab + st_name
            if data[o:data.index(b"\0", o)].decode("latin-1") == name and value:
                return value, text[0] if text else None
    return None


def _symbol_in(path, low, name):
    """Run-time address of dynamic symbol `name` of the object loaded from
    path, whose .text starts at `low` (gdb's info sharedlibrary)."""
    found = _elf_symbol(path, name)
    if not found or found[1] is None:
        return None
    value, text = found
    return low - text + value


def _descriptors():
    start, stop = _addr_of("__start_molt_fns"), _addr_of("__stop_molt_fns")
    if start is None or stop is None:
        return []
    out = []
    for d in range(start, stop, DESC_SIZE):
        if _u32(d) != DESC_MAGIC:
            continue
        out.append({"index": _u32(d + 4), "name": _cstr(_u64(d + 8)), "tu": _cstr(_u64(d + 16)),
                    "entry": _u64(d + 24), "body": _u64(d + 32), "dispatch": _u64(d + 40),
                    "static": _u32(d + 56) != 0})
    return out


def _entry_target(entry):
    code = _read(entry, 5)
    if code[0] != 0xE9:
        return None
    rel = int.from_bytes(code[1:5], "little", signed=True)
    return (entry + 5 + rel) & 0xFFFFFFFFFFFFFFFF


class MoltStatus(gdb.Command):
    """Print the molt state of this process (live or core): generation,
    patches, the version each updatable function's entry reaches, threads
    still running older generations."""

    def __init__(self):
        super().__init__("molt-status", gdb.COMMAND_STATUS)

    def invoke(self, arg, from_tty):
        gens = _addr_of("molt__gens")
        cur_p = _addr_of("molt__current")
        if gens is None or cur_p is None:
            print("molt: this process has no libmolt (molt__current not found)")
            return
        cur = _u64(cur_p)
        slot_of = {}
        print("molt generation %d" % _u64(cur + 8))
        for s in range(SLOTS):
            g = gens + s * GEN_SIZE
            if _u64(g) or g == cur:
                slot_of[s] = _u64(g + 8)
        patches = _patches()
        print("patches loaded (%d)" % len(patches))
        by_impl = {}
        for path, (pid_, desc, funcs) in patches.items():
            print("  %s  %s  %s" % (pid_, path, desc))
            for name, tu, impl in funcs:
                by_impl[impl] = (pid_, path)
        table, size = _u64(cur), _u32(cur + 16)
        print("functions")
        for d in _descriptors():
            target = _entry_target(d["entry"])
            entry = "direct" if target == d["body"] else \
                "dispatch" if target == d["dispatch"] else "patch"
            version = "?"
            if d["index"] < size:
                v = _u64(table + 8 * d["index"])
                if v == d["body"]:
                    version = "0"
                elif v in by_impl:
                    version = "patch %s (%s)" % by_impl[v]
                else:
                    name, lib = _where(v)
                    version = "%s in %s" % (name, lib or "the program")
            label = d["name"] + (" (%s)" % d["tu"] if d["static"] else "")
            print("  %-24s entry %-8s version %s" % (label, entry, version))
        self.threads(gens, cur)
        self.old_code()

    def threads(self, gens, cur):
        print("threads")
        current_slot = (cur - gens) // GEN_SIZE
        for t in _inferior().threads():
            t.switch()
            try:
                self_addr = int(gdb.parse_and_eval("(unsigned long)&molt__self"))
            except gdb.error:
                print("  %d: molt__self not readable (libmolt without debug info?)" % t.ptid[1])
                continue
            older = []
            for s in range(SLOTS):
                n = _u32(self_addr + 16 + 4 * s)
                if n and s != current_slot:
                    older.append("%d call%s in generation %d" % (
                        n, "" if n == 1 else "s", _u64(gens + s * GEN_SIZE + 8)))
            print("  %d (%s): %s" % (t.ptid[1], t.name or "?",
                                     ", ".join(older) if older else "no calls in older generations"))

    def old_code(self):
        """The runtime's last scan (core/oldcode.c): threads seen inside a
        replaced version 0, which the counters cannot show."""
        try:
            n = int(gdb.parse_and_eval("'oldcode.c'::nseen"))
            seen = int(gdb.parse_and_eval("(unsigned long)'oldcode.c'::seen"))
        except gdb.error:
            print("old versions: not readable (libmolt without debug info)")
            return
        print("old versions still running, at the runtime's last scan (%d; `molt status` "
              "scans again)" % n)
        descs = {d["index"]: d for d in _descriptors()}
        for i in range(n):
            o = seen + 24 * i
            tid, index = _u32(o), _u32(o + 4)
            d = descs.get(index, {"name": "#%d" % index})
            print("  thread %d: version 0 of %s" % (tid, d["name"]))


MoltStatus()
