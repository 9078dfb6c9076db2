"""moltcc: the drop-in compiler wrapper that makes C programs updatable with
molt, and builds hot patches and full-update images for them.

Run it as `moltcc` (the launchers from moltcc.cmake), as
`python3 tools/moltcc` or, with tools/ on the path, as `python3 -m moltcc`.
The module map is in README.md beside this file.
"""
