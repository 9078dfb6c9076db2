# The layering of the sources (scripts/check_layers.py) and a test of the
# check itself on copies of the tree.
molt_pytest(layers ${CMAKE_CURRENT_LIST_DIR}/test_check_layers.py TIMEOUT 120 LABELS layers)
