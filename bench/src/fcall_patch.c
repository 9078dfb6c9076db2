/* The patch of the molt-patched variant of the function-call benchmark
 * (fcall_main.c PATCH): it replaces target with the same body, so the loop
 * computes the same sum and only the way the call is dispatched changes.
 * Built -fPIC -shared and stamped with the program's build-id (moltstamp). */
#include "molt.h"

MOLT_PATCH("bench-fcall", "target, same body: calls take the dispatch path");

MOLT_PATCH_FUNCTION(int, target, (int *p)) { return *p; }
