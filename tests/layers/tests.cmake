# The layering of the sources (scripts/check_layers.py) and a test of the
# check itself on copies of the tree.
find_package(Python3 COMPONENTS Interpreter REQUIRED)
add_test(NAME layers
  COMMAND ${Python3_EXECUTABLE} -m pytest --noconftest -q -p no:cacheprovider
          ${CMAKE_CURRENT_LIST_DIR}/test_check_layers.py)
set_tests_properties(layers PROPERTIES TIMEOUT 120 LABELS "layers")
