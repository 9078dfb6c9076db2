/* A molt program for test_abi.py: the functions of target.c are updatable
 * (patches are stamped for this program).  Commands on stdin, one per line:
 *   load PATH   dlopen PATH (an object of another molt ABI) and say "loaded"
 *   call        call the functions and print "tag T"
 * It exits when stdin closes. */
#include "molt.h"
#include "target.h"

#include <dlfcn.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

int main(void) {
  setvbuf(stdout, NULL, _IOLBF, 0);
  printf("ready %d\n", (int)getpid());
  char line[4200];
  while (fgets(line, sizeof line, stdin)) {
    line[strcspn(line, "\n")] = '\0';
    if (strncmp(line, "load ", 5) == 0) {
      void *h = dlopen(line + 5, RTLD_NOW | RTLD_LOCAL);
      printf(h ? "loaded\n" : "dlopen failed: %s\n", h ? "" : dlerror());
    } else if (strcmp(line, "call") == 0) {
      printf("tag %d\n", version_tag(0) / 1000);
    }
  }
  return 0;
}
