/* Images that must be refused: BAD_NOPROG has a main but no molt__program;
 * BAD_ABI has a molt__program of another ABI version. */
#include "molt.h"
#include "molt/program.h" /* hand-written image: the ABI moltcc generates against */

int main(int argc, char **argv) {
  (void)argc;
  (void)argv;
  return 0;
}

#ifdef BAD_ABI
MOLT_EXTERN const molt__program_info molt__program = {MOLT__PROGRAM_ABI + 41, 0, NULL,
                                                      NULL};
#endif
