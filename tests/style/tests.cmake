# The C code follows .clang-format (tests/style/check_format.py).
find_package(Python3 COMPONENTS Interpreter REQUIRED)
add_test(NAME style_clang_format
  COMMAND ${Python3_EXECUTABLE} ${CMAKE_CURRENT_LIST_DIR}/check_format.py)
set_tests_properties(style_clang_format PROPERTIES TIMEOUT 300 LABELS "style")

# Docs and code cite docs/guarantees.md, never a path outside the repository.
add_test(NAME style_self_contained
  COMMAND ${Python3_EXECUTABLE} ${CMAKE_CURRENT_LIST_DIR}/check_selfcontained.py)
set_tests_properties(style_self_contained PROPERTIES TIMEOUT 60 LABELS "style")
