"""Full updates: `moltcc --molt-program` builds program images and their
migration code (see docs/full-updates.md).

    build.py        the mode: compile, generate molt__program.c, link
    annotations.py  the molt annotations of the sources (libclang) -> JSON
    xf.py           the .xf parser (state transformers, Kitsune's notation)
    xfgen.py        old image + new image + rules -> migration C code
"""

# The TU moltcc generates into every image (molt__program, .molt_types, the
# migration code); no source of the image may have its name.
GEN_NAME = "molt__program.c"
