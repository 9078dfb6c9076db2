/* A plainly built multi-threaded server for the attach patch builder's
 * tests (gcc -O2 -g, no molt): one line per request on loopback TCP.
 *
 *   get N   the name of record N (lookup)
 *   first   the name of record 0 (lookup_first)
 *   id      a fresh id (next_id)
 *   stats   "<lookups served by store.c> <requests served here>"
 *
 * Prints "port N" once listening; argv[1] worker threads (default 8). */
#include "store.h"

#include <netinet/in.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

static atomic_long served; /* a namesake of store.c's */
static int listen_fd;

static void answer(FILE *out, const char *line) {
  long n;
  atomic_fetch_add(&served, 1);
  if (sscanf(line, "get %ld", &n) == 1)
    fprintf(out, "%s\n", lookup(n));
  else if (strncmp(line, "first", 5) == 0)
    fprintf(out, "%s\n", lookup_first());
  else if (strncmp(line, "id", 2) == 0)
    fprintf(out, "%ld\n", next_id());
  else if (strncmp(line, "stats", 5) == 0)
    fprintf(out, "%ld %ld\n", store_served(), atomic_load(&served));
  else
    fprintf(out, "error\n");
  fflush(out);
}

static void *worker(void *arg) {
  (void)arg;
  for (;;) {
    int c = accept(listen_fd, NULL, NULL);
    if (c < 0)
      continue;
    FILE *in = fdopen(c, "r"), *out = fdopen(dup(c), "w");
    char line[128];
    while (in && out && fgets(line, sizeof line, in))
      answer(out, line);
    if (in)
      fclose(in);
    if (out)
      fclose(out);
  }
  return NULL;
}

int main(int argc, char **argv) {
  int workers = argc > 1 ? atoi(argv[1]) : 8;
  store_init();
  listen_fd = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in a = {.sin_family = AF_INET,
                          .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  socklen_t len = sizeof a;
  if (bind(listen_fd, (struct sockaddr *)&a, sizeof a) != 0 ||
      listen(listen_fd, 128) != 0 ||
      getsockname(listen_fd, (struct sockaddr *)&a, &len) != 0)
    return 1;
  printf("port %d\n", ntohs(a.sin_port));
  fflush(stdout);
  for (int i = 0; i < workers; i++) {
    pthread_t t;
    pthread_create(&t, NULL, worker, NULL);
  }
  pause();
  return 0;
}
