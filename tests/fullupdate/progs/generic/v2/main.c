/* Generic annotations: struct user gains a field; struct tag does not. */
#include "fu.h"

struct user {
  int id;
  char name[12];
  int level;
};

struct tag {
  int n;
};

struct list {
  void *val MOLT_VAR(t);
  struct list *next MOLT_INST(t);
} MOLT_FORALL(t);

struct list *users MOLT_INST(struct user);
struct list *tags MOLT_INST(struct tag);

static int fu_handle(char *cmd) {
  FU_COMMON(cmd)
  if (!strcmp(cmd, "dump")) {
    printf("version=2 users=");
    for (struct list *l = users; l; l = l->next) {
      struct user *u = l->val;
      printf("%d:%s:%d,", u->id, u->name, u->level);
    }
    printf(" tags=");
    for (struct list *l = tags; l; l = l->next)
      printf("%d,", ((struct tag *)l->val)->n);
    printf("\n");
  } else {
    printf("error %s\n", cmd);
  }
  return 1;
}

int main(void) {
  fu_serve();
  return 0;
}
