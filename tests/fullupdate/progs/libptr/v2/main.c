/* A library that keeps pointers into the program: libc's tsearch tree
 * holds the users as keys in nodes it allocated itself, which the typed
 * migration never sees.  v2 changes struct user, so the users are
 * replaced; its molt_on_migrated points the tree to the new ones. */
#include "fu.h"
#include <search.h>

struct user {
  int id;
  int level; /* new */
  int score;
};

static struct user *users[3]; /* read by "dump": kept */
static void *root;            /* the tree: libc's nodes, untyped */
int refuse_next;              /* "refuse": v2's hook is asked to refuse */

static int by_id(const void *a, const void *b) {
  return ((const struct user *)a)->id - ((const struct user *)b)->id;
}

static int fu_handle(char *cmd) {
  FU_COMMON(cmd)
  if (!strcmp(cmd, "refuse")) {
    refuse_next = 1;
    printf("ok\n");
  } else if (!strcmp(cmd, "dump")) {
    struct user key = {2, 0};
    struct user **u = tfind(&key, &root, by_id);
    printf("version=2 first=%d found=%d score=%d level=%d\n", users[0]->score,
           u ? (*u)->id : -1, u ? (*u)->score : -1, u ? (*u)->level : -1);
  } else {
    printf("error %s\n", cmd);
  }
  return 1;
}

/* The tree's nodes hold the old users: point them to the new ones. */
static void fix_key(const void *node, VISIT which, int depth) {
  (void)depth;
  if (which == preorder || which == leaf) {
    void **key = (void **)node;
    molt_migrated_store(key, molt_migrated(*key));
  }
}

int molt_on_migrated(char *why, size_t len) {
  if (refuse_next) {
    snprintf(why, len, "asked to refuse");
    twalk(root, fix_key); /* stores first: the abort undoes them */
    return 1;
  }
  twalk(root, fix_key);
  return 0;
}

int main(void) {
  if (!molt_is_updating()) {
    for (int i = 0; i < 3; i++) {
      users[i] = calloc(1, sizeof *users[i]);
      users[i]->id = i + 1;
      users[i]->score = 10 * (i + 1);
      tsearch(users[i], &root, by_id);
    }
  }
  fu_serve();
  return 0;
}
