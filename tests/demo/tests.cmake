# The kvstore demo end to end (short): built with this tree's moltcc, three
# patches applied live under checked load, once per update policy.
set(KV ${PROJECT_SOURCE_DIR}/examples/kvstore)

# A clean build first: the demo builds inside examples/kvstore, and a
# server left from another build tree (e.g. a sanitizer build) must not be
# reused.
add_test(NAME demo_build
  COMMAND sh -c "make -s -C '${KV}' clean && make -s -C '${KV}' MOLT_BUILD='${CMAKE_BINARY_DIR}'")
set_tests_properties(demo_build PROPERTIES FIXTURES_SETUP kvstore_built
  RESOURCE_LOCK kvstore TIMEOUT 600 LABELS "demo;moltcc")

foreach(policy immediate local global)
  add_test(NAME demo_${policy}
    COMMAND ${Python3_EXECUTABLE} ${KV}/demo.py --short --no-build --policy ${policy}
            --molt-build ${CMAKE_BINARY_DIR} --out ${CMAKE_BINARY_DIR}/demo-${policy})
  set_tests_properties(demo_${policy} PROPERTIES FIXTURES_REQUIRED kvstore_built
    RESOURCE_LOCK kvstore TIMEOUT 600 LABELS "demo;moltcc;cli")
endforeach()
