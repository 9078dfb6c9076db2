"""libmolt exports exactly the public API (include/molt.h) and the ABI of
generated code (include/molt/*.h): the MOLT_EXTERN declarations of those
headers, the linker version script (src/runtime/libmolt.map) and the
dynamic symbol table of the built library name the same symbols.

Environment (set by tests/runtime/tests.cmake): LIBMOLT, the built library.
"""
import glob
import os
import re
import subprocess

from harness.tree import ROOT


def declared():
    """Names declared MOLT_EXTERN at file scope (not inside a macro body)."""
    names = set()
    headers = [os.path.join(ROOT, "include", "molt.h")] + \
        sorted(glob.glob(os.path.join(ROOT, "include", "molt", "*.h")))
    for h in headers:
        text = open(h).read()
        for m in re.finditer(r"^MOLT_EXTERN\b([^;]*);", text, re.M):
            decl = m.group(1)
            decl = re.sub(r"__attribute__\s*\(\((?:[^()]|\([^()]*\))*\)\)", "", decl)
            decl = re.sub(r"_Atomic\s*\([^()]*\)", "T", decl)
            decl = re.sub(r"MOLT__ATOMIC\s*\([^()]*\)", "T", decl)
            head = decl.split("(")[0].split("[")[0]
            names.add(re.findall(r"[A-Za-z_]\w*", head)[-1])
    return names


def in_map():
    text = open(os.path.join(ROOT, "src", "runtime", "libmolt.map")).read()
    text = re.sub(r"/\*.*?\*/", "", text, flags=re.S)
    glob_part = text.split("global:")[1].split("local:")[0]
    return {n.strip() for n in glob_part.split(";") if n.strip()}


def exported():
    out = subprocess.run(["nm", "-D", "--defined-only", os.environ["LIBMOLT"]],
                         capture_output=True, text=True, check=True).stdout
    return {line.split()[-1].split("@")[0] for line in out.splitlines() if line.strip()}


def test_headers_and_version_script_agree():
    d = declared()
    assert "molt_apply" in d and "molt__register_module" in d and "molt__xf_ptr" in d, d
    assert d == in_map(), (sorted(d - in_map()), sorted(in_map() - d))


def test_library_exports_exactly_the_declared_symbols():
    e = exported()
    assert e == declared(), ("exported, not declared: %s; declared, not exported: %s"
                             % (sorted(e - declared()), sorted(declared() - e)))
