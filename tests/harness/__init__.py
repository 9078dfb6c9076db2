"""Shared helpers of the Python tests (tests/README.md lists the groups).

  harness.tree    where the source and build trees are, what the build tree
                  has, skipping (a failure under MOLT_REQUIRE_ALL=1)
  harness.proc    running programs: output read by threads, the molt CLI
                  (--json parsed), waiting for a control socket, stopping
                  with the exit status checked, sanitizer reports, waiting
  harness.moltcc  building with this tree's moltcc: its command and
                  environment, a work directory, failures that show the
                  compiler's output
  harness.elf     a small ELF64 reader (sections, symbols, molt's records,
                  the build-id); as a script it writes a build-id header

pytest finds this package through tests/pytest.ini (pythonpath).
"""
