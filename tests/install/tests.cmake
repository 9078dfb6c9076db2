# molt installed like a library (tests/install/test_install.py): `cmake
# --install` of this build tree into a temporary prefix, then a program built
# with the installed moltcc and pkg-config, a CMake project with
# find_package(molt), hot patches applied with the installed molt, checked
# with nothing of the source or build tree in the environment.
# Plain build tree only: a sanitized libmolt is no library to install (every
# program linked against it must load the sanitizer runtime first), and the
# test builds nothing that a sanitizer would check.
#   by hand:  ctest --test-dir build -L install --output-on-failure
if(NOT MOLT_SANITIZE)
  molt_pytest(install ${CMAKE_CURRENT_LIST_DIR}/test_install.py
    TIMEOUT 600 LABELS install moltcc cli
    ENV MOLT_CMAKE=${CMAKE_COMMAND} MOLT_INSTALL_BINDIR=${CMAKE_INSTALL_BINDIR}
        MOLT_INSTALL_LIBDIR=${CMAKE_INSTALL_LIBDIR}
        MOLT_INSTALL_INCLUDEDIR=${CMAKE_INSTALL_INCLUDEDIR}
        MOLT_INSTALL_DATADIR=${CMAKE_INSTALL_DATADIR} MOLT_INSTALL_MANDIR=${CMAKE_INSTALL_MANDIR})
endif()
