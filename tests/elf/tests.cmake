# Tests of the ELF reader (src/common/elf.c) and moltstamp.
# Included from tests/CMakeLists.txt; needs the moltstamp target.
#
#   elf_unit     build-ids (loaded vs file), the patch note, symbol lookup,
#                SHA-256 (both paths of sha256.c: SHA extensions, portable)
#   elf_corrupt  truncated / damaged patch files: error codes, never a crash
#   elf_stamp    runs moltstamp on a copy of a patch and checks the result
#   elf_fuzz     deterministic random mutations of real files (fuzz_elf.c;
#                build it with -DMOLT_LIBFUZZER -fsanitize=fuzzer for libFuzzer)

get_filename_component(MOLT_ELF_ROOT ${CMAKE_CURRENT_LIST_DIR}/../.. ABSOLUTE)
set(MOLT_ELF_DIR ${CMAKE_CURRENT_LIST_DIR})
# elf.c's functions are hidden in libmolt: the tests link the common layer.

# Real files from the real toolchain: a hand-written patch (built like a
# user's: -shared, not linked with libmolt) and a program to stamp it for.
add_library(elf_fixture_patch SHARED ${MOLT_ELF_DIR}/fixtures/patch.c)
set_target_properties(elf_fixture_patch PROPERTIES PREFIX "")
target_link_options(elf_fixture_patch PRIVATE -Wl,--build-id)
add_executable(elf_fixture_target ${MOLT_ELF_DIR}/fixtures/target.c)
target_link_options(elf_fixture_target PRIVATE -Wl,--build-id)

# The test program reads its own symbol table: the fixture TUs hold globals
# and statics (same static names in tu_one.c / tu_two.c, and two files named
# same.c).
add_executable(elf_test
  ${MOLT_ELF_DIR}/test_elf.c
  ${MOLT_ELF_DIR}/fixtures/tu_one.c
  ${MOLT_ELF_DIR}/fixtures/tu_two.c
  ${MOLT_ELF_DIR}/fixtures/a/same.c
  ${MOLT_ELF_DIR}/fixtures/b/same.c)
target_link_libraries(elf_test PRIVATE molt_common)
target_link_options(elf_test PRIVATE -Wl,--build-id)
add_dependencies(elf_test elf_fixture_patch elf_fixture_target moltstamp)

add_executable(elf_fuzz ${MOLT_ELF_DIR}/fuzz_elf.c)
target_link_libraries(elf_fuzz PRIVATE molt_common)
add_dependencies(elf_fuzz elf_fixture_patch elf_fixture_target)

add_test(NAME elf_unit
  COMMAND elf_test unit $<TARGET_FILE:elf_fixture_patch> $<TARGET_FILE:elf_fixture_target>)
add_test(NAME elf_corrupt
  COMMAND elf_test corrupt $<TARGET_FILE:elf_fixture_patch>)
add_test(NAME elf_stamp
  COMMAND elf_test stamp $<TARGET_FILE:moltstamp> $<TARGET_FILE:elf_fixture_patch>
          $<TARGET_FILE:elf_fixture_target>)
add_test(NAME elf_fuzz
  COMMAND elf_fuzz -n 3000 $<TARGET_FILE:elf_fixture_patch> $<TARGET_FILE:elf_fixture_target>)
set_tests_properties(elf_unit elf_corrupt elf_stamp PROPERTIES LABELS "elf")
set_tests_properties(elf_fuzz PROPERTIES LABELS "elf;fuzz")
