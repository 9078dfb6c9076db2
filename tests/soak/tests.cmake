# The soak (bench/soak/soak.py) in its short form: hot patches and
# rollbacks of examples/kvstore and full updates of examples/kvfull under
# checked load, with the hostile client (garbage frames, half frames and
# connect/close floods, as root and as nobody) and a forking thread; fails
# on a failed update, a wrong or lost reply, a stuck fork, or fd count,
# mappings or RSS grown past their bounds (--bounds: +2 fds, +4 mappings,
# +2 MiB RSS from the end of the warm-up to the end; under ASan only named
# mappings and no RSS bound, since its allocator grows both).  Its work directory
# is in this build tree.  The full run: bench/soak/soak.py (README there).
add_test(NAME soak_short
  COMMAND ${Python3_EXECUTABLE} ${PROJECT_SOURCE_DIR}/bench/soak/soak.py --short --bounds
          --molt-build ${CMAKE_BINARY_DIR} --work ${CMAKE_CURRENT_BINARY_DIR}/soak)
# ~40 s in the plain build; a sanitizer makes it ~3x slower (57-85 s alone
# on 2 loaded CPUs, and it timed out at 120 s next to another test).
if(MOLT_SANITIZE)
  set(soak_timeout 360)
else()
  set(soak_timeout 120)
endif()
set_tests_properties(soak_short PROPERTIES TIMEOUT ${soak_timeout} LABELS "soak;cli;moltcc;demo")
