"""Entry point: `python3 -m moltcc` (tools/ on the path) and
`python3 <this folder>`, which is what the launchers run."""
import os
import sys

if __package__:
    from .driver import main
else:
    # Run as a folder: Python put the package's own folder first on the
    # path.  Import the package by its name from the folder above instead,
    # so that its modules (elf, unit, ...) never stand in for top-level
    # modules of the same name.
    sys.path[0] = os.path.dirname(os.path.dirname(os.path.realpath(__file__)))
    from moltcc.driver import main

sys.exit(main(sys.argv[1:]))
