/* mqttstep PORT CONNS COUNT [SECONDS] -- lock-step MQTT 3.1.1 load for P10 on
 * mosquitto (bench/shadowupd/p10_overhead.py --server mosquitto).  CONNS
 * threads, one connection each (clean session), each subscribed at QoS 1 to
 * its own topic `step/I`, publishing QoS 1 messages to it one at a time: a
 * PUBLISH, then both the broker's PUBACK of its packet id and the message
 * coming back (payload checked), then the next PUBLISH sent in the same
 * write as the PUBACK of the message that came back.  One message in flight
 * per connection and one write per message, so that the broker takes the
 * same path for every message (what an instruction count per message
 * needs): COUNT messages per connection, or, with SECONDS, as many as fit
 * in SECONDS.  At the end a PINGREQ waits until the broker handled the last
 * PUBACK.  Prints "messages N seconds S errors E" and exits 1 on errors (a
 * wrong or missing packet, a closed connection). */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

static int port;
static unsigned long count;
static double seconds;

struct conn {
  int id, fd;
  unsigned long messages, errors;
  unsigned char in[4096];
  size_t have;
};

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static int send_all(int fd, const unsigned char *p, size_t n) {
  while (n) {
    ssize_t w = send(fd, p, n, MSG_NOSIGNAL);
    if (w <= 0)
      return -1;
    p += w;
    n -= (size_t)w;
  }
  return 0;
}

/* The next packet: its first byte, its body (at most 256 bytes). */
static int read_packet(struct conn *c, unsigned char *head, unsigned char *body,
                       size_t *len) {
  for (;;) {
    if (c->have >= 2) {
      size_t n = 0, mult = 1, i = 1;
      while (i < c->have && i <= 4) {
        n += (c->in[i] & 0x7f) * mult;
        mult *= 128;
        if (!(c->in[i] & 0x80))
          break;
        i++;
      }
      if (i < c->have && i <= 4 && c->have >= i + 1 + n) {
        if (n > 256)
          return -1;
        *head = c->in[0];
        memcpy(body, c->in + i + 1, n);
        *len = n;
        c->have -= i + 1 + n;
        memmove(c->in, c->in + i + 1 + n, c->have);
        return 0;
      }
    }
    ssize_t r = recv(c->fd, c->in + c->have, sizeof c->in - c->have, 0);
    if (r <= 0)
      return -1;
    c->have += (size_t)r;
    /* The broker writes its PUBACK and the message in two writes without
     * TCP_NODELAY (mosquitto's default): the second waits for the ACK of
     * the first, which a delayed ACK holds for 40 ms.  Acked at once
     * (quick-ack mode lapses, so set again after each read). */
    int one = 1;
    setsockopt(c->fd, IPPROTO_TCP, TCP_QUICKACK, &one, sizeof one);
  }
}

static size_t put_str(unsigned char *p, const char *s) {
  size_t n = strlen(s);
  p[0] = (unsigned char)(n >> 8);
  p[1] = (unsigned char)n;
  memcpy(p + 2, s, n);
  return n + 2;
}

/* A packet of one type/flags byte and a body under 128 bytes. */
static size_t packet(unsigned char *p, unsigned char head, const unsigned char *body,
                     size_t n) {
  p[0] = head;
  p[1] = (unsigned char)n;
  memcpy(p + 2, body, n);
  return n + 2;
}

static void *run(void *p) {
  struct conn *c = p;
  unsigned char b[256], out[512], body[256], head;
  size_t n, len;
  char topic[32], id[48], payload[64];
  int one = 1;
  struct sockaddr_in s = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
  s.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  c->fd = socket(AF_INET, SOCK_STREAM, 0);
  if (connect(c->fd, (struct sockaddr *)&s, sizeof s) != 0)
    goto fail;
  setsockopt(c->fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  snprintf(topic, sizeof topic, "step/%d", c->id);
  snprintf(id, sizeof id, "mqttstep-%d-%d", (int)getpid(), c->id);
  /* CONNECT: "MQTT", level 4, clean session, keep-alive 60 s */
  n = put_str(b, "MQTT");
  b[n++] = 4;
  b[n++] = 0x02;
  b[n++] = 0;
  b[n++] = 60;
  n += put_str(b + n, id);
  if (send_all(c->fd, out, packet(out, 0x10, b, n)) ||
      read_packet(c, &head, body, &len) || head != 0x20 || len != 2 || body[1] != 0)
    goto fail;
  /* SUBSCRIBE packet id 1, QoS 1 */
  b[0] = 0;
  b[1] = 1;
  n = 2 + put_str(b + 2, topic);
  b[n++] = 1;
  if (send_all(c->fd, out, packet(out, 0x82, b, n)) ||
      read_packet(c, &head, body, &len) || head != 0x90 || len != 3 || body[2] != 1)
    goto fail;
  size_t pending = 0; /* bytes of the PUBACK owed for the message that came back */
  double end = seconds > 0 ? now() + seconds : 0;
  for (unsigned long i = 0; seconds > 0 ? now() < end : i < count; i++) {
    uint16_t pid = (uint16_t)(i % 65000 + 2);
    int pl = snprintf(payload, sizeof payload, "%d:%lu:step", c->id, i);
    n = put_str(b, topic);
    b[n++] = (unsigned char)(pid >> 8);
    b[n++] = (unsigned char)pid;
    memcpy(b + n, payload, (size_t)pl);
    n += (size_t)pl;
    size_t w = pending + packet(out + pending, 0x32, b, n);
    if (send_all(c->fd, out, w))
      goto fail;
    pending = 0;
    int acked = 0, back = 0;
    while (!acked || !back) {
      if (read_packet(c, &head, body, &len))
        goto fail;
      if (head == 0x40 && len == 2 && body[0] == (pid >> 8) && body[1] == (pid & 0xff) &&
          !acked) {
        acked = 1;
      } else if ((head & 0xf0) == 0x30 && !back) {
        size_t tl = (size_t)body[0] << 8 | body[1];
        if ((head & 0x06) != 0x02 || tl != strlen(topic) ||
            len != 2 + tl + 2 + (size_t)pl || memcmp(body + 2, topic, tl) ||
            memcmp(body + 4 + tl, payload, (size_t)pl))
          goto fail;
        unsigned char ack[2] = {body[2 + tl], body[3 + tl]};
        pending = packet(out, 0x40, ack, 2);
        back = 1;
      } else {
        goto fail;
      }
    }
    c->messages++;
  }
  /* the last PUBACK, then a PINGREQ answered after it */
  out[pending] = 0xc0;
  out[pending + 1] = 0;
  if (send_all(c->fd, out, pending + 2) || read_packet(c, &head, body, &len) ||
      head != 0xd0)
    goto fail;
  out[0] = 0xe0; /* DISCONNECT */
  out[1] = 0;
  send_all(c->fd, out, 2);
  close(c->fd);
  return NULL;
fail:
  c->errors++;
  close(c->fd);
  return NULL;
}

int main(int argc, char **argv) {
  if (argc < 4) {
    fprintf(stderr, "usage: mqttstep PORT CONNS COUNT [SECONDS]\n");
    return 2;
  }
  port = atoi(argv[1]);
  int conns = atoi(argv[2]);
  count = strtoul(argv[3], NULL, 10);
  seconds = argc > 4 ? atof(argv[4]) : 0;
  if (conns < 1 || conns > 64)
    return 2;
  struct conn *c = calloc((size_t)conns, sizeof *c);
  pthread_t t[64];
  double t0 = now();
  for (int i = 0; i < conns; i++) {
    c[i].id = i;
    pthread_create(&t[i], NULL, run, &c[i]);
  }
  unsigned long m = 0, e = 0;
  for (int i = 0; i < conns; i++) {
    pthread_join(t[i], NULL);
    m += c[i].messages;
    e += c[i].errors;
  }
  printf("messages %lu seconds %.3f errors %lu\n", m, now() - t0, e);
  return e ? 1 : 0;
}
