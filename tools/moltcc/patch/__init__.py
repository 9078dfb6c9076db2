"""Hot patches: `moltcc --molt-patch --molt-target PROG -o fix.so SOURCES`.

    build.py    the mode: check the command, plan, weave, compile, link, stamp
"""
