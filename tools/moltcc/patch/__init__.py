"""Hot patches: `moltcc --molt-patch --molt-target PROG -o fix.so SOURCES`.

    build.py    the mode: check the command, plan, weave, compile, link, stamp
    plan.py     what each function of the sources becomes, from PROG's symbols
    weave.py    one source rewritten into patch code (new versions, imports)
"""
