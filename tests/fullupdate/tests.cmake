# Full updates end to end (docs/full-updates.md): test programs in
# tests/fullupdate/progs built with this tree's moltcc --molt-program,
# started with `molt run`, replaced with `molt update`.  One ctest test per
# pytest file, each with its own work directory so they can run in
# parallel; plus the kvfull demo (examples/kvfull) in its short form.
foreach(area values heap control failures abort real)
  molt_pytest(fullupdate_${area} ${CMAKE_CURRENT_LIST_DIR}/test_${area}.py
    TIMEOUT 300 LABELS fullupdate moltcc cli
    ENV FU_WORK=${CMAKE_CURRENT_BINARY_DIR}/fullupdate/${area})
endforeach()

# The demo, with its images in this build tree (not examples/kvfull/obj,
# which another build tree may be using).
add_test(NAME fullupdate_kvfull_demo
  COMMAND ${Python3_EXECUTABLE} ${PROJECT_SOURCE_DIR}/examples/kvfull/demo.py --short
          --molt-build ${CMAKE_BINARY_DIR} --obj ${CMAKE_CURRENT_BINARY_DIR}/fullupdate/kvfull)
set_tests_properties(fullupdate_kvfull_demo PROPERTIES TIMEOUT 300
  LABELS "fullupdate;demo;moltcc;cli")
