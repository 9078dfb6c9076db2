# The C code follows .clang-format (tests/style/check_format.py).
find_package(Python3 COMPONENTS Interpreter REQUIRED)
add_test(NAME style_clang_format
  COMMAND ${Python3_EXECUTABLE} ${CMAKE_CURRENT_LIST_DIR}/check_format.py)
set_tests_properties(style_clang_format PROPERTIES TIMEOUT 300 LABELS "style")
