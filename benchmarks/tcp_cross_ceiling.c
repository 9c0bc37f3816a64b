// TCP ceiling across hosts for benchmarks/cross_host_bench.py: the fastest a
// bare client/server pair (no protocol, no Python, no master) moves 16 MiB
// request/response transfers over one connection between two hosts (there:
// two network namespaces joined by a veth pair).
//
//   gcc -O2 -pthread benchmarks/tcp_cross_ceiling.c -o /tmp/tcp_cross_ceiling
//   /tmp/tcp_cross_ceiling server PORT [cc=NAME]
//   /tmp/tcp_cross_ceiling client HOST:PORT [cc=NAME] [secs=2] [size=16777216]
//
// The server answers each 16-byte request (offset, length) with the bytes
// from a 64 MiB buffer, by send(2). The client loops requests for `secs`
// seconds into one destination and prints one JSON line: overall GB/s
// (bytes over the summed request times) and p50, p99 and max per request in
// ms. `cc=NAME` sets the connection's congestion control on that end
// (TCP_CONGESTION); without it the system's default applies.
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "tcp_ceiling.h"

#define BUF (64UL << 20)

static const char *cc;

static void tune(int s) {
    int one = 1;
    setsockopt(s, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    if (cc && setsockopt(s, IPPROTO_TCP, TCP_CONGESTION, cc, strlen(cc)) != 0) perror("TCP_CONGESTION");
}

static int full(int s, char *p, size_t n, int sending) {
    while (n) {
        ssize_t r = sending ? send(s, p, n, MSG_NOSIGNAL) : recv(s, p, n, 0);
        if (r <= 0) return -1;
        p += r;
        n -= (size_t)r;
    }
    return 0;
}

static _Noreturn void serve(int port) {
    char *buf = malloc(BUF);
    if (!buf) die("malloc");
    memset(buf, 7, BUF);
    int l = socket(AF_INET, SOCK_STREAM, 0), one = 1;
    setsockopt(l, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(port)};
    if (bind(l, (void *)&a, sizeof a) || listen(l, 16)) die("listen");
    for (;;) {
        int c = accept(l, 0, 0);
        if (c < 0) continue;
        tune(c);
        uint64_t req[2];
        while (full(c, (char *)req, sizeof req, 0) == 0) {
            if (req[0] > BUF || req[1] > BUF - req[0]) break;
            if (full(c, buf + req[0], req[1], 1)) break;
        }
        close(c);
    }
}

static int cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static int client(const char *hostport, double secs, uint64_t size) {
    char host[64];
    const char *colon = strrchr(hostport, ':');
    if (!colon || (size_t)(colon - hostport) >= sizeof host) die("HOST:PORT");
    memcpy(host, hostport, colon - hostport);
    host[colon - hostport] = 0;
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(atoi(colon + 1))};
    inet_pton(AF_INET, host, &a.sin_addr);
    int s = socket(AF_INET, SOCK_STREAM, 0);
    tune(s);
    if (connect(s, (void *)&a, sizeof a)) die("connect");
    char *dst = malloc(size);
    if (!dst) die("malloc");
    memset(dst, 0, size);
    size_t cap = 1 << 16, n = 0;
    double *lat = malloc(cap * sizeof *lat), busy = 0, end = now() + secs;
    uint64_t req[2] = {0, size};
    for (int warm = 1; warm >= 0; warm--) {
        do {
            double t = now();
            if (full(s, (char *)req, sizeof req, 1) || full(s, dst, size, 0)) die("transfer");
            t = now() - t;
            if (!warm && n < cap) {
                lat[n++] = t;
                busy += t;
            }
        } while (!warm && now() < end);
    }
    qsort(lat, n, sizeof *lat, cmp);
    printf("{\"gbps\": %.4f, \"p50_ms\": %.4f, \"p99_ms\": %.4f, \"max_ms\": %.4f, \"calls\": %zu}\n",
           size * (double)n / busy / 1e9, lat[n / 2] * 1e3, lat[(size_t)(n * 0.99)] * 1e3,
           lat[n - 1] * 1e3, n);
    return 0;
}

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: %s server PORT | client HOST:PORT [cc=] [secs=] [size=]\n", argv[0]);
        return 2;
    }
    double secs = 2;
    uint64_t size = 16UL << 20;
    for (int i = 3; i < argc; i++) {
        if (!strncmp(argv[i], "cc=", 3)) cc = argv[i] + 3;
        else if (!strncmp(argv[i], "secs=", 5)) secs = atof(argv[i] + 5);
        else if (!strncmp(argv[i], "size=", 5)) size = strtoull(argv[i] + 5, 0, 10);
    }
    if (size == 0 || size > BUF) size = 16UL << 20;
    if (!strcmp(argv[1], "server")) serve(atoi(argv[2]));
    return client(argv[2], secs, size);
}
