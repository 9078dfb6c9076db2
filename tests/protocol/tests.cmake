# Control protocol tests: codec unit tests, the control server against a
# fake runtime, a fuzz run.
# Included from tests/CMakeLists.txt.  The protocol helpers are hidden
# inside libmolt, so the tests link the common layer, as the CLI does (it
# also keeps molt.h's module constructor out: MOLT__NO_AUTO_REGISTER).
set(PROTO_T ${CMAKE_CURRENT_LIST_DIR})
set(PROTO_SRC ${PROJECT_SOURCE_DIR}/src/common)
set(PROTO_CODEC ${PROTO_SRC}/protocol.c ${PROTO_SRC}/buf.c ${PROTO_SRC}/errors.c
  ${PROTO_SRC}/proc.c ${PROTO_SRC}/elf.c)

add_executable(protocol_test_protocol ${PROTO_T}/test_protocol.c)
target_link_libraries(protocol_test_protocol PRIVATE molt_common)

# The real control server and what it needs of the runtime's base layer,
# linked into the tests that drive it against a scripted runtime.
set(PROTO_SERVER_SOURCES
  ${PROJECT_SOURCE_DIR}/src/runtime/service/control.c
  ${PROJECT_SOURCE_DIR}/src/runtime/base/fd.c
  ${PROJECT_SOURCE_DIR}/src/runtime/base/lock.c
  ${PROJECT_SOURCE_DIR}/src/runtime/base/platform.c)

add_executable(protocol_test_control ${PROTO_T}/test_control.c ${PROTO_SERVER_SOURCES})
target_link_libraries(protocol_test_control PRIVATE molt_common pthread)

# The mutation loop also runs the real control server with hostile clients.
add_executable(protocol_fuzz ${PROTO_T}/fuzz_protocol.c ${PROTO_SERVER_SOURCES})
target_link_libraries(protocol_fuzz PRIVATE molt_common pthread)

add_test(NAME protocol_codec COMMAND protocol_test_protocol)
add_test(NAME protocol_control COMMAND protocol_test_control)
# Deterministic mutation loop (no libFuzzer needed): ~2 s plain, longer
# under MOLT_SANITIZE=address; then 100 rounds of hostile clients against
# the control server (also as uid 65534 when run as root).  Raise the
# counts for a longer soak: protocol_fuzz ITERATIONS ROUNDS.
add_test(NAME protocol_fuzz COMMAND protocol_fuzz 300000 100)
set_tests_properties(protocol_codec protocol_control PROPERTIES TIMEOUT 300 LABELS "protocol")
set_tests_properties(protocol_fuzz PROPERTIES TIMEOUT 300 LABELS "protocol;fuzz")
# (The CLI against this fake process: tests/cli, cli_fake.)

# Coverage-guided fuzzing with libFuzzer needs clang, while the project is
# usually built with gcc: -DMOLT_LIBFUZZER=ON builds protocol_libfuzzer with
# the clang found on the PATH and runs it for 60 s as a test.  By hand:
#   build/tests/protocol_libfuzzer -max_len=4096 CORPUS_DIR
option(MOLT_LIBFUZZER "build and run the libFuzzer target with clang" OFF)
if(MOLT_LIBFUZZER)
  find_program(MOLT_CLANG NAMES clang clang-14 REQUIRED)
  set(PROTO_LF ${CMAKE_CURRENT_BINARY_DIR}/protocol_libfuzzer)
  add_custom_command(OUTPUT ${PROTO_LF}
    COMMAND ${MOLT_CLANG} -g -O1 -std=gnu11 -D_GNU_SOURCE -DMOLT__NO_AUTO_REGISTER
            -DMOLT_LIBFUZZER -fsanitize=fuzzer,address,undefined
            -I${PROJECT_SOURCE_DIR}/include -I${PROJECT_SOURCE_DIR}/src
            ${PROTO_T}/fuzz_protocol.c ${PROTO_CODEC} -o ${PROTO_LF}
    DEPENDS ${PROTO_T}/fuzz_protocol.c ${PROTO_CODEC} ${PROTO_SRC}/protocol.h
            ${PROTO_SRC}/common.h ${PROJECT_SOURCE_DIR}/include/molt.h
    COMMENT "building protocol_libfuzzer with ${MOLT_CLANG}")
  add_custom_target(protocol_libfuzzer_bin ALL DEPENDS ${PROTO_LF})
  add_test(NAME protocol_libfuzzer
    COMMAND ${PROTO_LF} -max_total_time=60 -max_len=4096 -print_final_stats=1)
  set_tests_properties(protocol_libfuzzer PROPERTIES TIMEOUT 300 LABELS "protocol;fuzz")
endif()
