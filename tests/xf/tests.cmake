# Tests of full-update images and the state transformation engine
# (src/runtime/full/image.c, xf.c): real program images built here, a
# hand-written v2 migration in the shape moltcc generates, and the test
# program test_xf.c that loads and migrates them.
#
# image.c / xf.c functions are hidden in libmolt, so test_xf compiles the
# engine's sources in, with the layers below them (base, and common as a
# library), and exports them (ENABLE_EXPORTS): the images resolve molt__xf_*
# in the executable, the way a program image resolves them in libmolt.
# test_xf supplies molt__program_foreach_local itself (program.c's role) to
# hand the engine saved locals.
get_filename_component(MOLT_XF_ROOT ${CMAKE_CURRENT_LIST_DIR}/../.. ABSOLUTE)
set(XF ${CMAKE_CURRENT_LIST_DIR})
set(XF_OUT ${CMAKE_CURRENT_BINARY_DIR}/xf)
file(MAKE_DIRECTORY ${XF_OUT})

# molt_xf_image(NAME SRC [DEFS...]): ${XF_OUT}/NAME.so, built like moltcc
# builds program images.
function(molt_xf_image name src)
  add_library(${name} SHARED ${src})
  set_target_properties(${name} PROPERTIES PREFIX "" LIBRARY_OUTPUT_DIRECTORY ${XF_OUT}
    C_VISIBILITY_PRESET default)
  target_compile_options(${name} PRIVATE -g -fPIC -fno-omit-frame-pointer)
  target_compile_definitions(${name} PRIVATE MOLT__NO_AUTO_REGISTER ${ARGN})
  target_include_directories(${name} PRIVATE ${XF})
  target_link_options(${name} PRIVATE -Wl,-Bsymbolic -Wl,--build-id)
endfunction()

molt_xf_image(xf_v1 ${XF}/v1/prog.c)
molt_xf_image(xf_v2 ${XF}/v2/prog.c)
molt_xf_image(xf_noprog ${XF}/bad/prog.c BAD_NOPROG)
molt_xf_image(xf_badabi ${XF}/bad/prog.c BAD_ABI)

add_executable(test_xf ${XF}/test_xf.c
  ${MOLT_XF_ROOT}/src/runtime/full/xf.c
  ${MOLT_XF_ROOT}/src/runtime/full/image.c
  ${MOLT_BASE_SRCS})
target_link_libraries(test_xf PRIVATE molt_common)
target_include_directories(test_xf PRIVATE ${XF})
set_target_properties(test_xf PROPERTIES ENABLE_EXPORTS ON)
target_link_libraries(test_xf PRIVATE dl pthread)
add_dependencies(test_xf xf_v1 xf_v2 xf_noprog xf_badabi)

foreach(case image migrate locals abort_fail abort_null abort_fault abort_stack
             abort_fail_xf missing_fn interior big free_old)
  add_test(NAME xf_${case} COMMAND test_xf ${case} ${XF_OUT})
  # tcache off: heap_in_use() is then exact (freed chunks stop counting).
  set_tests_properties(xf_${case} PROPERTIES TIMEOUT 300 LABELS "xf"
    ENVIRONMENT "GLIBC_TUNABLES=glibc.malloc.tcache_count=0")
endforeach()
