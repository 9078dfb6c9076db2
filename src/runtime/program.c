/* program.c: see internal.h (work in progress). */
#include "internal.h"
