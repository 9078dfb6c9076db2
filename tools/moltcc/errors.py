"""How moltcc fails: the errors every layer of the package may raise and the
driver turns into a message and exit status 1."""

PROG = "moltcc"


class Fatal(Exception):
    """A one-line error for the user: `moltcc: error: ...`, exit 1."""


class Diagnostic(Exception):
    """An error already formatted with its own position
    (FILE:LINE:COL: error: ...): printed as it is, exit 1."""
