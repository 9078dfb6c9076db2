# Full updates end to end: hand-written program images of a small server
# (tests/program/server.c, versions 1-3 and broken variants), run with
# `molt run` and replaced with `molt update` by test_program.py.
set(PROG_T ${CMAKE_CURRENT_LIST_DIR})
set(PROG_OUT ${CMAKE_CURRENT_BINARY_DIR}/program)
file(MAKE_DIRECTORY ${PROG_OUT})

# molt_test_image(NAME VERSION FROM_HEADER_TARGET DEFINES...): ${PROG_OUT}/NAME.so
# built from server.c the way moltcc --molt-program builds images.
# FROM: "" for a first version, else the image whose build-id it is "from".
function(molt_test_image name version from)
  set(srcs ${PROG_T}/server.c)
  set(gen ${PROG_OUT}/${name}.from)
  if(from)
    # The build-id of the image this one migrates from, read at build time
    # (what moltcc --molt-from records).
    add_custom_command(OUTPUT ${gen}/from_build_id.h
      COMMAND ${CMAKE_COMMAND} -E make_directory ${gen}
      COMMAND ${Python3_EXECUTABLE} ${PROJECT_SOURCE_DIR}/tests/harness/elf.py build-id-header
              $<TARGET_FILE:${from}> ${gen}/from_build_id.h FROM_BUILD_ID
      DEPENDS ${from} ${PROJECT_SOURCE_DIR}/tests/harness/elf.py
      COMMENT "build-id of ${from} for ${name}")
    list(APPEND srcs ${gen}/from_build_id.h)
  endif()
  add_library(${name} SHARED ${srcs})
  set_target_properties(${name} PROPERTIES PREFIX "" OUTPUT_NAME ${name}
    LIBRARY_OUTPUT_DIRECTORY ${PROG_OUT} C_VISIBILITY_PRESET default)
  target_include_directories(${name} PRIVATE ${gen})
  target_compile_definitions(${name} PRIVATE VERSION=${version} ${ARGN})
  target_compile_options(${name} PRIVATE -g -fno-omit-frame-pointer)
  target_link_options(${name} PRIVATE -Wl,--wrap=pthread_create -Wl,-Bsymbolic
    -Wl,--build-id)
  target_link_libraries(${name} PRIVATE molt)
endfunction()

molt_test_image(prog_v1 1 "")
molt_test_image(prog_v2 2 prog_v1)
molt_test_image(prog_v3 3 prog_v2)
molt_test_image(prog_v2_missing 2 prog_v1 MISSING_SYMBOL)
molt_test_image(prog_v2_fault 2 prog_v1 FAULT_IN_MIGRATE)
molt_test_image(prog_v2_wrongfrom 2 prog_v1 WRONG_FROM)
molt_test_image(prog_v2_noentry 2 prog_v1 NO_WORKER_ENTRY)
# A shared object that is not a program image.
add_library(prog_plain SHARED ${PROJECT_SOURCE_DIR}/tests/runtime/plain_lib.c)
set_target_properties(prog_plain PROPERTIES PREFIX "" OUTPUT_NAME prog_plain
  LIBRARY_OUTPUT_DIRECTORY ${PROG_OUT})
add_custom_target(program_test_files ALL DEPENDS prog_v1 prog_v2 prog_v3
  prog_v2_missing prog_v2_fault prog_v2_wrongfrom prog_v2_noentry prog_plain)

molt_pytest(program_full_update ${PROG_T}/test_program.py
  TIMEOUT 600 LABELS program fullupdate cli
  ENV PROG_DIR=${PROG_OUT} TEST_RUNTIME=$<TARGET_FILE:test_runtime>
      PATCH_DIR=${CMAKE_CURRENT_BINARY_DIR}/runtime)
