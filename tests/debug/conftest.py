"""Fixtures of the debuggability tests: a work directory per test with this
build tree's moltcc (harness.moltcc.Tool), libmolt, moltstamp and CLI."""
import pytest

from harness.moltcc import Tool, require_moltcc
from harness.tree import need_built
from harness.tree import pytest_runtest_makereport  # noqa: F401 (the hook)


@pytest.fixture
def tool(tmp_path):
    require_moltcc()
    need_built("libmolt.so", "bin/moltstamp", "bin/molt")
    return Tool(tmp_path)
