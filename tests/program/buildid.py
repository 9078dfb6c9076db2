"""Writes a C header defining a macro as the GNU build-id (hex) of an ELF
file: how the test images v2/v3 learn the build-id of the image they are
built "from" (what moltcc --molt-from does for generated images).

usage: buildid.py ELF OUT.h MACRO
"""
import struct
import sys


def build_id(path):
    data = open(path, "rb").read()
    if data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:
        raise SystemExit("%s: not a little-endian ELF64 file" % path)
    shoff, = struct.unpack_from("<Q", data, 0x28)
    shentsize, shnum = struct.unpack_from("<HH", data, 0x3A)
    for i in range(shnum):
        off = shoff + i * shentsize
        sh_type, = struct.unpack_from("<I", data, off + 4)
        if sh_type != 7:  # SHT_NOTE
            continue
        sec_off, sec_size = struct.unpack_from("<QQ", data, off + 0x18)
        pos, end = sec_off, sec_off + sec_size
        while pos + 12 <= end:
            namesz, descsz, ntype = struct.unpack_from("<III", data, pos)
            name = data[pos + 12:pos + 12 + namesz]
            desc_at = pos + 12 + ((namesz + 3) & ~3)
            if ntype == 3 and name.rstrip(b"\0") == b"GNU":  # NT_GNU_BUILD_ID
                return data[desc_at:desc_at + descsz].hex()
            pos = desc_at + ((descsz + 3) & ~3)
    raise SystemExit("%s: no GNU build-id note" % path)


def main():
    elf, out, macro = sys.argv[1:4]
    text = "/* generated from %s */\n#define %s \"%s\"\n" % (elf, macro, build_id(elf))
    with open(out, "w") as f:
        f.write(text)


if __name__ == "__main__":
    main()
