"""include/molt.h compiles, with the manual interface of a program and of a
patch, as C89, C99 and C11 with -pedantic -Wall -Wextra -Werror, and as
C++ (gcc and clang where installed)."""
import os
import shutil
import subprocess

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
INCLUDE = os.path.join(os.path.dirname(os.path.dirname(HERE)), "include")
WARN = ["-Wall", "-Wextra", "-Werror"]
COMPILERS = [c for c in ("gcc", "clang-14", "clang") if shutil.which(c)]
CXX = [c for c in ("g++", "clang++-14", "clang++") if shutil.which(c)]


def compile_ok(argv, src, tmp_path):
    r = subprocess.run(argv + ["-I", INCLUDE, "-c", src, "-o", str(tmp_path / "o.o")],
                       capture_output=True, text=True)
    assert r.returncode == 0, (argv, r.stderr)


@pytest.mark.parametrize("src", ["header_program.c", "header_patch.c"])
@pytest.mark.parametrize("std", ["c89", "c99", "c11"])
@pytest.mark.parametrize("cc", COMPILERS)
def test_c_dialects(cc, std, src, tmp_path):
    compile_ok([cc, "-std=" + std, "-pedantic", "-Wmissing-prototypes", "-Wredundant-decls"]
               + WARN, os.path.join(HERE, src), tmp_path)


@pytest.mark.parametrize("src", ["header_program.c", "header_patch.c"])
@pytest.mark.parametrize("cxx", CXX)
def test_cxx(cxx, src, tmp_path):
    copy = tmp_path / (src + "c")   # .cc
    shutil.copy(os.path.join(HERE, src), copy)
    compile_ok([cxx, "-std=c++17"] + WARN, str(copy), tmp_path)


def test_compilers_found():
    assert COMPILERS and CXX
