"""Fixtures of the moltcc tests: real compiles with the real compiler, in
a work directory per test (harness.moltcc.Tool), with this build tree's
moltcc, libmolt, moltstamp and CLI (harness.tree).  Missing prerequisites
skip the tests that need them, except under MOLT_REQUIRE_ALL=1 (CI sets it):
then every skip is a failure, so nothing is skipped silently."""
import pytest

from harness.moltcc import Tool, require_moltcc
from harness.tree import need_built
from harness.tree import pytest_runtest_makereport  # noqa: F401 (the hook)


@pytest.fixture
def tool(tmp_path):
    require_moltcc()
    return Tool(tmp_path)


@pytest.fixture
def needs_lib():
    need_built("libmolt.so")


@pytest.fixture
def needs_stamp(needs_lib):
    need_built("bin/moltstamp")


@pytest.fixture
def needs_cli(needs_stamp):
    need_built("bin/molt")
