"""A small ELF64 little-endian reader for the tests: sections, symbols
(with their STT_FILE group), notes (the GNU build-id, molt's patch note) and
pointers as the dynamic loader would see them (RELATIVE / absolute
relocations applied), so the tests can decode molt_fns, molt_pfns and
molt_imports records exactly.

Run as a script it writes a C header defining a macro as a file's build-id
(hex): how tests/program's images learn the build-id of the image they are
built "from", as moltcc --molt-from records it for generated images.

usage: elf.py build-id-header ELF OUT.h MACRO
"""
import struct
import sys

SHT_SYMTAB, SHT_RELA, SHT_NOTE, SHT_NOBITS, SHT_DYNSYM = 2, 4, 7, 8, 11
NT_GNU_BUILD_ID = 3
R_X86_64_64, R_X86_64_RELATIVE = 1, 8
STT = {0: "NOTYPE", 1: "OBJECT", 2: "FUNC", 3: "SECTION", 4: "FILE", 6: "TLS"}
STB = {0: "LOCAL", 1: "GLOBAL", 2: "WEAK"}


class Symbol:
    def __init__(self, name, value, size, typ, bind, shndx, file):
        self.name, self.value, self.size = name, value, size
        self.type, self.bind, self.shndx, self.file = typ, bind, shndx, file

    def __repr__(self):
        return "<%s %s %s %#x %s>" % (self.name, self.type, self.bind, self.value, self.file)


class Elf:
    def __init__(self, path):
        with open(path, "rb") as f:
            self.data = d = f.read()
        assert d[:4] == b"\x7fELF" and d[4] == 2 and d[5] == 1, "%s: not ELF64 LE" % path
        self.type = struct.unpack_from("<H", d, 16)[0]
        shoff = struct.unpack_from("<Q", d, 0x28)[0]
        shentsize, shnum, shstrndx = struct.unpack_from("<HHH", d, 0x3A)
        self.sections = []
        for i in range(shnum):
            (name, typ, flags, addr, off, size, link, info, align,
             entsize) = struct.unpack_from("<IIQQQQIIQQ", d, shoff + i * shentsize)
            self.sections.append(dict(name_off=name, type=typ, flags=flags, addr=addr,
                                      offset=off, size=size, link=link, info=info,
                                      entsize=entsize, index=i))
        strtab = self.sections[shstrndx]
        for s in self.sections:
            s["name"] = self._cstr(strtab["offset"] + s["name_off"])
        self.relocatable = self.type == 1
        if self.relocatable:
            # Objects have no addresses: give every section its own range so
            # that pointers (symbol + addend) and strings resolve uniformly.
            for s in self.sections:
                s["addr"] = (s["index"] + 1) << 32
        self._relocs = None

    def _cstr(self, off):
        end = self.data.index(b"\0", off)
        return self.data[off:end].decode("utf-8", "replace")

    def section(self, name):
        for s in self.sections:
            if s["name"] == name:
                return s
        return None

    def section_bytes(self, name):
        s = self.section(name)
        if s is None or s["type"] == SHT_NOBITS:
            return None
        return self.data[s["offset"]:s["offset"] + s["size"]]

    def symbols(self, table=".symtab"):
        s = self.section(table)
        if s is None:
            return []
        strtab = self.sections[s["link"]]
        out = []
        current = None
        for i in range(s["size"] // 24):
            name, info, other, shndx, value, size = struct.unpack_from(
                "<IBBHQQ", self.data, s["offset"] + i * 24)
            nm = self._cstr(strtab["offset"] + name)
            typ = STT.get(info & 0xF, str(info & 0xF))
            bind = STB.get(info >> 4, str(info >> 4))
            if typ == "FILE":
                current = nm
                continue
            if self.relocatable and 0 < shndx < len(self.sections):
                value += self.sections[shndx]["addr"]
            out.append(Symbol(nm, value, size, typ, bind, shndx,
                              current if bind == "LOCAL" else None))
        return out

    def symbol(self, name, file=None):
        found = [s for s in self.symbols() if s.name == name and s.shndx != 0
                 and (file is None or s.file == file)]
        return found[0] if found else None

    def _raw_symbols(self):
        s = self.section(".symtab")
        out = []
        for i in range(s["size"] // 24):
            _, _, _, shndx, value, _ = struct.unpack_from("<IBBHQQ", self.data, s["offset"] + i * 24)
            out.append((shndx, value))
        return out

    def relocs(self):
        if self._relocs is None:
            self._relocs = {}
            syms = None
            for s in self.sections:
                if s["type"] != SHT_RELA:
                    continue
                base = self.sections[s["info"]]["addr"] if self.relocatable else 0
                for i in range(s["size"] // 24):
                    off, info, addend = struct.unpack_from("<QQq", self.data, s["offset"] + i * 24)
                    typ, sym = info & 0xFFFFFFFF, info >> 32
                    if self.relocatable and typ == R_X86_64_64:
                        if syms is None:
                            syms = self._raw_symbols()
                        shndx, value = syms[sym]
                        target = (self.sections[shndx]["addr"] + value) if 0 < shndx < len(self.sections) else 0
                        self._relocs[base + off] = (R_X86_64_RELATIVE, 0, target + addend)
                    else:
                        self._relocs[base + off] = (typ, sym, addend)
        return self._relocs

    def read(self, addr, n):
        for s in self.sections:
            if s["addr"] and s["addr"] <= addr < s["addr"] + s["size"]:
                if s["type"] == SHT_NOBITS:
                    return b"\0" * n
                o = s["offset"] + addr - s["addr"]
                return self.data[o:o + n]
        raise KeyError("address %#x not in any section" % addr)

    def pointer(self, addr):
        """The pointer stored at addr after relocation (None for NULL)."""
        r = self.relocs().get(addr)
        if r is not None:
            typ, sym, addend = r
            if typ == R_X86_64_RELATIVE:
                return addend
            if typ == R_X86_64_64 and sym:
                # a default-visibility symbol of a shared object
                dyn = self.section(".dynsym")
                _, _, _, _, value, _ = struct.unpack_from("<IBBHQQ", self.data, dyn["offset"] + sym * 24)
                return value + addend
        v = struct.unpack("<Q", self.read(addr, 8))[0]
        return v or None

    def string(self, addr):
        if addr is None:
            return None
        out = b""
        while True:
            b = self.read(addr + len(out), 64)
            i = b.find(b"\0")
            if i >= 0:
                return (out + b[:i]).decode("utf-8", "replace")
            out += b

    def records(self, section, fields):
        """Decodes an array of pointer-sized records: fields is a list of
        'str' / 'ptr' / 'u32pair' per 8-byte slot."""
        s = self.section(section)
        if s is None:
            return []
        size = 8 * len(fields)
        out = []
        for i in range(s["size"] // size):
            base = s["addr"] + i * size
            rec = []
            for j, kind in enumerate(fields):
                a = base + 8 * j
                if kind == "u32pair":
                    rec.append(struct.unpack("<II", self.read(a, 8)))
                elif kind == "str":
                    rec.append(self.string(self.pointer(a)))
                else:
                    rec.append(self.pointer(a))
            out.append(rec)
        return out

    def descriptors(self):
        """molt_fns: magic/index, name, tu, entry, body, dispatch, direct
        (None: always dispatch), is_static/reserved."""
        out = []
        for (magic, index), name, tu, entry, body, dispatch, direct, (is_static, _) in self.records(
                "molt_fns", ["u32pair", "str", "str", "ptr", "ptr", "ptr", "ptr", "u32pair"]):
            out.append(dict(magic=magic, index=index, name=name, tu=tu, entry=entry,
                            body=body, dispatch=dispatch, direct=direct, is_static=is_static))
        return out

    def entry_jump(self, addr):
        """Target of the `jmp rel32` (e9 + 4-byte displacement) at addr, or
        None when the bytes there are something else.  For linked files
        only: in an object the displacement is still a relocation."""
        code = self.read(addr, 5)
        if len(code) < 5 or code[0] != 0xE9:
            return None
        return addr + 5 + struct.unpack_from("<i", code, 1)[0]

    def patch_fns(self):
        return [dict(name=n, tu=t, impl=p) for n, t, p in
                self.records("molt_pfns", ["str", "str", "ptr"])]

    def imports(self):
        # molt/abi.h molt__import (ABI 4): {symbol, name, tu}
        return [dict(symbol=y, name=n, tu=t) for y, n, t in
                self.records("molt_imports", ["str", "str", "str"])]

    def notes(self):
        """(name, type, desc) of every note in the SHT_NOTE sections."""
        for sec in self.sections:
            if sec["type"] != SHT_NOTE:
                continue
            pos, end = sec["offset"], sec["offset"] + sec["size"]
            while pos + 12 <= end:
                namesz, descsz, typ = struct.unpack_from("<III", self.data, pos)
                name = self.data[pos + 12:pos + 12 + namesz].rstrip(b"\0").decode()
                desc_at = pos + 12 + ((namesz + 3) & ~3)
                yield name, typ, self.data[desc_at:desc_at + descsz]
                pos = desc_at + ((descsz + 3) & ~3)

    def build_id(self):
        """The GNU build-id (hex), or None."""
        for name, typ, desc in self.notes():
            if name == "GNU" and typ == NT_GNU_BUILD_ID:
                return desc.hex()
        return None

    def molt_note(self):
        d = self.section_bytes(".note.molt")
        if d is None:
            return None
        namesz, descsz, typ = struct.unpack_from("<III", d, 0)
        o = 12 + ((namesz + 3) & ~3)
        desc = d[o:o + descsz]
        abi = struct.unpack_from("<I", desc, 0)[0]
        bid = desc[8:].split(b"\0", 1)[0].decode()
        return dict(type=typ, abi=abi, target_build_id=bid)


def main(argv):
    if len(argv) != 5 or argv[1] != "build-id-header":
        raise SystemExit("usage: elf.py build-id-header ELF OUT.h MACRO")
    elf, out, macro = argv[2:5]
    bid = Elf(elf).build_id()
    if bid is None:
        raise SystemExit("%s: no GNU build-id note" % elf)
    with open(out, "w") as f:
        f.write("/* generated from %s */\n#define %s \"%s\"\n" % (elf, macro, bid))


if __name__ == "__main__":
    main(sys.argv)
