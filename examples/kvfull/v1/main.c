/* kvfull v1: options, the listening socket, the acceptor (main thread)
 * and shutdown.  After a full update the new main runs again with
 * molt_is_updating() true: the socket, the connections and the workers
 * already exist (the workers restart by themselves), so it only
 * re-installs what lives outside the migrated state -- the signal
 * handlers and the update-pending callback point into this image's code. */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include "kv.h"

_Atomic int stopping;
int listen_fd = -1;
int accept_wakefd = -1;
int next_worker;

static void wake_all(void *arg) {
  (void)arg;
  uint64_t one = 1;
  for (int i = 0; i < nworkers; i++)
    wake_worker(i);
  if (write(accept_wakefd, &one, sizeof one) < 0) {
    /* EAGAIN: already awake */
  }
}

static void on_signal(int sig) {
  (void)sig;
  int saved = errno;
  atomic_store_explicit(&stopping, 1, memory_order_relaxed);
  wake_all(NULL);
  errno = saved;
}

static void install_handlers(void) {
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_signal;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, NULL);
  sigaction(SIGTERM, &sa, NULL);
  signal(SIGPIPE, SIG_IGN);
  molt_on_update_pending(wake_all, NULL);
}

static int start(int argc, char **argv) {
  int port = 7070;
  nworkers = 4;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--port") && i + 1 < argc)
      port = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--workers") && i + 1 < argc)
      nworkers = atoi(argv[++i]);
    else {
      fprintf(stderr, "usage: kvfull [--port N] [--workers N]\n");
      return -1;
    }
  }
  if (nworkers < 1 || nworkers > KV_WORKERS_MAX) {
    fprintf(stderr, "kvfull: --workers must be 1..%d\n", KV_WORKERS_MAX);
    return -1;
  }
  for (int i = 0; i < KV_CONNS_MAX; i++)
    conns[i].fd = -1;

  struct sockaddr_in a;
  memset(&a, 0, sizeof a);
  a.sin_family = AF_INET;
  a.sin_port = htons((uint16_t)port);
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  int one = 1;
  listen_fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  setsockopt(listen_fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  if (listen_fd < 0 || bind(listen_fd, (struct sockaddr *)&a, sizeof a) < 0 ||
      listen(listen_fd, 128) < 0) {
    perror("kvfull: listen");
    return -1;
  }
  socklen_t al = sizeof a;
  getsockname(listen_fd, (struct sockaddr *)&a, &al);
  accept_wakefd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  for (int i = 0; i < nworkers; i++) {
    workers[i].wakefd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (workers[i].wakefd < 0 || accept_wakefd < 0) {
      perror("kvfull: eventfd");
      return -1;
    }
  }
  for (int i = 0; i < nworkers; i++) {
    int e = pthread_create(&worker_threads[i], NULL, worker_main, (void *)(intptr_t)i);
    if (e) {
      fprintf(stderr, "kvfull: pthread_create: %s\n", strerror(e));
      return -1;
    }
  }
  printf("kvfull version %s listening on 127.0.0.1:%d pid %d workers %d\n", KV_VERSION,
         ntohs(a.sin_port), (int)getpid(), nworkers);
  fflush(stdout);
  return 0;
}

static void accept_one(void) {
  int fd = accept4(listen_fd, NULL, NULL, SOCK_CLOEXEC);
  if (fd < 0)
    return;
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  int w = -1;
  pthread_mutex_lock(&conn_lock);
  for (int i = 0; i < KV_CONNS_MAX; i++) {
    if (conns[i].fd < 0) {
      w = next_worker++ % nworkers;
      conns[i].fd = fd;
      conns[i].worker = w;
      conns[i].rlen = 0;
      conns[i].served = 0;
      break;
    }
  }
  pthread_mutex_unlock(&conn_lock);
  if (w < 0) {
    if (send(fd, "ERROR server full\n", 18, MSG_NOSIGNAL) < 0) {
      /* closing anyway */
    }
    close(fd);
    return;
  }
  wake_worker(w);
}

int main(int argc, char **argv) {
  install_handlers();
  if (molt_is_updating()) {
    fprintf(stderr,
            "kvfull: now running version %s (main restarted at "
            "update point '%s')\n",
            KV_VERSION, molt_is_updating_from("accept") ? "accept" : "?");
  } else if (start(argc, argv) < 0) {
    return 1;
  }

  while (!atomic_load_explicit(&stopping, memory_order_relaxed)) {
    molt_update_point("accept");
    struct pollfd p[2] = {{listen_fd, POLLIN, 0}, {accept_wakefd, POLLIN, 0}};
    if (poll(p, 2, 100) <= 0)
      continue;
    if (p[1].revents) {
      uint64_t v;
      if (read(accept_wakefd, &v, sizeof v) < 0) {
        /* EAGAIN */
      }
    }
    if (p[0].revents)
      accept_one();
  }

  for (int i = 0; i < nworkers; i++)
    pthread_join(worker_threads[i], NULL);
  for (int i = 0; i < KV_CONNS_MAX; i++)
    if (conns[i].fd >= 0)
      close(conns[i].fd);
  fprintf(stderr, "kvfull: version %s stopping; %lu requests served, %zu entries\n",
          KV_VERSION, total_served, store_count());
  return 0;
}
