/* Generic annotations: one list type instantiated with two element types. */
#include "fu.h"

struct user {
  int id;
  char name[12];
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

static void *cons(struct list **l, void *val) {
  struct list *c = malloc(sizeof *c);
  c->val = val;
  c->next = *l;
  *l = c;
  return c;
}

static int fu_handle(char *cmd) {
  FU_COMMON(cmd)
  if (!strcmp(cmd, "dump")) {
    printf("version=1 users=");
    for (struct list *l = users; l; l = l->next) {
      struct user *u = l->val;
      printf("%d:%s,", u->id, u->name);
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
  const char *names[] = {"ann", "bob", "cy"};
  for (int i = 0; i < 3; i++) {
    struct user *u = malloc(sizeof *u);
    u->id = 10 + i;
    snprintf(u->name, sizeof u->name, "%s", names[i]);
    cons(&users, u);
    struct tag *t = malloc(sizeof *t);
    t->n = 100 + i;
    cons(&tags, t);
  }
  fu_serve();
  return 0;
}
