# Shadow data (molt_shadow_*, src/runtime/core/shadow.c).
#   test_shadow: every call and error case, the get-or-alloc race, a
#     constructor that calls into the runtime (the rank of the shadow
#     locks), growth under lock-free readers, fork, signals, memory,
#     and a stress run of concurrent creation and destruction (labelled
#     concurrency: the TSan build of scripts/test.sh runs them).
#   test_shadow_e2e.py: a server built with moltcc gets a field added to its
#     struct by a hot patch (shadow data) under load, then rolled back.
set(SHADOW_T ${CMAKE_CURRENT_LIST_DIR})

add_executable(test_shadow ${SHADOW_T}/test_shadow.c)
target_link_libraries(test_shadow PRIVATE molt pthread)

foreach(case api memory)
  add_test(NAME shadow_${case} COMMAND test_shadow ${case})
  set_tests_properties(shadow_${case} PROPERTIES TIMEOUT 300 LABELS "shadow")
endforeach()
foreach(case ctor_race ctor_calls grow fork signal stress)
  add_test(NAME shadow_${case} COMMAND test_shadow ${case} 3)
  set_tests_properties(shadow_${case} PROPERTIES TIMEOUT 300 LABELS "shadow;concurrency")
endforeach()
# The same stress run on the path of kernels without the expedited
# membarrier(): readers and reclaimer fence themselves.
add_test(NAME shadow_stress_fences COMMAND test_shadow stress 2)
set_tests_properties(shadow_stress_fences PROPERTIES TIMEOUT 300 LABELS "shadow;concurrency"
  ENVIRONMENT "MOLT__SHADOW_FENCES=1")

molt_pytest(shadow_e2e ${SHADOW_T}/test_shadow_e2e.py ARGS -s
  TIMEOUT 600 LABELS shadow concurrency moltcc cli)
