# `cmake --install <build> [--prefix P]` (DESTDIR honoured): what a program
# author needs, in the GNUInstallDirs layout (lib/ here, lib/x86_64-linux-gnu
# for a Debian package configured with CMAKE_INSTALL_PREFIX=/usr).
# Included from the top-level CMakeLists.txt after every target is defined;
# moltcc's launcher and package are installed by tools/moltcc/moltcc.cmake.
#
#   <bindir>      molt, molt-run, moltstamp, moltcc
#   <libdir>      libmolt.so.<version>, libmolt.so.0 (SONAME), libmolt.so
#   <includedir>  molt.h, molt/*.h
#   <mandir>/man1 molt.1, moltcc.1
#   <libdir>/pkgconfig/molt.pc
#   <libdir>/cmake/molt/  moltConfig.cmake, moltConfigVersion.cmake,
#                 moltTargets*.cmake (the imported target molt::molt)
#   <datadir>/molt/moltcc/  moltcc's Python package
#
# molt-run stays in <bindir>: `molt run` executes the molt-run next to its
# own executable (else the one on PATH), and it can be run by hand.

include(CMakePackageConfigHelpers)

# ---- programs and the library ----------------------------------------------
# molt-run is the only installed program linked against libmolt.so (molt and
# moltstamp link the common code statically).  It finds the library through a
# RUNPATH relative to itself, so an installed tree runs wherever it is put
# (--prefix at install time, a moved tree) without LD_LIBRARY_PATH.  No
# RUNPATH when libdir is one the compiler and the dynamic linker search
# anyway (/usr/lib/x86_64-linux-gnu of a Debian package), as Debian's policy
# asks.  The build tree keeps CMake's absolute build RPATH; installing
# replaces it, so no installed file names the build tree.
set(_molt_sys_libdirs ${CMAKE_C_IMPLICIT_LINK_DIRECTORIES}
                      ${CMAKE_PLATFORM_IMPLICIT_LINK_DIRECTORIES})
if(NOT "${CMAKE_INSTALL_FULL_LIBDIR}" IN_LIST _molt_sys_libdirs)
  file(RELATIVE_PATH _molt_bin_to_lib "${CMAKE_INSTALL_FULL_BINDIR}" "${CMAKE_INSTALL_FULL_LIBDIR}")
  set_target_properties(molt-run PROPERTIES INSTALL_RPATH "$ORIGIN/${_molt_bin_to_lib}")
endif()

install(TARGETS molt EXPORT moltTargets
  LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
  INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(TARGETS molt-cli molt-run moltstamp RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})

# ---- headers and manual pages -----------------------------------------------
install(FILES ${PROJECT_SOURCE_DIR}/include/molt.h DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(DIRECTORY ${PROJECT_SOURCE_DIR}/include/molt DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}
  FILES_MATCHING PATTERN "*.h")
install(FILES ${PROJECT_SOURCE_DIR}/docs/man/molt.1 ${PROJECT_SOURCE_DIR}/docs/man/moltcc.1
  DESTINATION ${CMAKE_INSTALL_MANDIR}/man1)
# The gdb helper (`source <datadir>/molt/gdb/molt-gdb.py`, then molt-status).
install(FILES ${PROJECT_SOURCE_DIR}/tools/gdb/molt-gdb.py DESTINATION ${CMAKE_INSTALL_DATADIR}/molt/gdb)

# ---- pkg-config: molt.pc ------------------------------------------------------
# The prefix is the one of the install, which `cmake --install --prefix`
# may change after configuring: molt.pc is written in two steps.  Now
# everything but the prefix (directories relative to ${prefix} unless
# absolute); at install time the prefix (CMAKE_INSTALL_PREFIX as the
# install script sees it; DESTDIR, a staging directory, is not part of it).
foreach(_dir BINDIR INCLUDEDIR LIBDIR)
  if(IS_ABSOLUTE "${CMAKE_INSTALL_${_dir}}")
    set(MOLT_PC_${_dir} "${CMAKE_INSTALL_${_dir}}")
  else()
    set(MOLT_PC_${_dir} "\${prefix}/${CMAKE_INSTALL_${_dir}}")
  endif()
endforeach()
string(REPLACE "\${prefix}" "\${exec_prefix}" MOLT_PC_LIBDIR "${MOLT_PC_LIBDIR}")
string(REPLACE "\${prefix}" "\${exec_prefix}" MOLT_PC_BINDIR "${MOLT_PC_BINDIR}")
set(MOLT_PC_PREFIX "@CMAKE_INSTALL_PREFIX@")   # filled in by the second step
set(_molt_pc_dir ${PROJECT_BINARY_DIR}/install)
configure_file(${PROJECT_SOURCE_DIR}/cmake/molt.pc.in ${_molt_pc_dir}/molt.pc.in @ONLY)
install(CODE "configure_file(\"${_molt_pc_dir}/molt.pc.in\" \"${_molt_pc_dir}/molt.pc\" @ONLY)")
install(FILES ${_molt_pc_dir}/molt.pc DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig)

# ---- CMake package: find_package(molt) ---------------------------------------
# Relocatable: every path is computed from the place of moltConfig.cmake.
set(MOLT_CMAKE_DIR ${CMAKE_INSTALL_LIBDIR}/cmake/molt)
install(EXPORT moltTargets NAMESPACE molt:: DESTINATION ${MOLT_CMAKE_DIR})
set(MOLT_INSTALL_MOLTCC ${CMAKE_INSTALL_BINDIR}/moltcc)
set(MOLT_INSTALL_CLI ${CMAKE_INSTALL_BINDIR}/molt)
configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/moltConfig.cmake.in
  ${_molt_pc_dir}/moltConfig.cmake
  INSTALL_DESTINATION ${MOLT_CMAKE_DIR}
  PATH_VARS CMAKE_INSTALL_INCLUDEDIR MOLT_INSTALL_MOLTCC MOLT_INSTALL_CLI)
# 0.x: a new minor version may change the ABI of generated code (registration
# refuses a mismatch), so only the same major.minor is compatible.
write_basic_package_version_file(${_molt_pc_dir}/moltConfigVersion.cmake
  COMPATIBILITY SameMinorVersion)
install(FILES ${_molt_pc_dir}/moltConfig.cmake ${_molt_pc_dir}/moltConfigVersion.cmake
  DESTINATION ${MOLT_CMAKE_DIR})
