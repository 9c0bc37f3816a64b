// Loopback TCP ceiling for the store benchmark's "xproc-tcp get_into 16 MiB"
// row: the fastest a bare client/server pair (no protocol, no Python, no
// master) moves 16 MiB request/response transfers over 127.0.0.1 on this
// machine. It bounds what any TCP data path can reach here.
//
//   gcc -O2 -pthread benchmarks/tcp_loopback_ceiling.c -o /tmp/tcp_ceiling
//   /tmp/tcp_ceiling [streams=1] [objs=12] [send|sendfile] [block|busy] [iters=240] [cc=NAME]
//
// The server (a forked process) owns a memfd of `objs` x 16 MiB and answers
// each 16-byte request (offset, length) with a 4-byte status and the bytes,
// by sendfile(2) from the memfd or send(2) from its mapping. The client
// splits each 16 MiB read over `streams` connections, receives with blocking
// recv(2) or a MSG_DONTWAIT polling loop, and walks `objs` objects and
// destinations in turn, as the store benchmark does (192 MiB working set).
// Prints the overall GB/s (all bytes over all time, as the store benchmark
// counts) and the median, 90th percentile and best GB/s of single transfers.
// `cc=NAME` sets both ends' congestion control (TCP_CONGESTION), as the
// store's data connections do on one host (`cc=reno`); without it the
// system's default applies (bbr on the reference VM, which paces loopback).
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/sendfile.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "tcp_ceiling.h"

#define OBJ (16UL << 20)
static int streams = 1, objs = 12, use_sendfile = 1, busy = 0, iters = 240, port;
static int memfd;
static const char *cc;

static void set_cc(int s) {
    if (cc && setsockopt(s, IPPROTO_TCP, TCP_CONGESTION, cc, strlen(cc)) != 0) perror("TCP_CONGESTION");
}
static char *seg, *dst;
static int socks[16];
static pthread_barrier_t start_b, done_b;

static void *serve(void *arg) {
    int c = (int)(long)arg, one = 1;
    setsockopt(c, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    set_cc(c);
    for (;;) {
        unsigned long long req[2];
        if (recv(c, req, sizeof req, MSG_WAITALL) != sizeof req) return NULL;
        int status = 0;
        send(c, &status, sizeof status, MSG_MORE);
        off_t off = (off_t)req[0];
        size_t left = req[1];
        while (left) {
            ssize_t n = use_sendfile ? sendfile(c, memfd, &off, left)
                                     : send(c, seg + off, left, 0);
            if (n <= 0) return NULL;
            if (!use_sendfile) off += n;
            left -= (size_t)n;
        }
    }
}

static void server(void) {
    int l = socket(AF_INET, SOCK_STREAM, 0), one = 1;
    setsockopt(l, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(port),
                            .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    if (bind(l, (void *)&a, sizeof a) || listen(l, 64)) die("bind");
    for (;;) {
        int c = accept(l, NULL, NULL);
        pthread_t t;
        if (c >= 0) pthread_create(&t, NULL, serve, (void *)(long)c);
    }
}

static int dial(void) {
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(port),
                            .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    for (int tries = 0; tries < 200; tries++) {
        int s = socket(AF_INET, SOCK_STREAM, 0), one = 1;
        setsockopt(s, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        set_cc(s);
        if (connect(s, (void *)&a, sizeof a) == 0) return s;
        close(s);
        usleep(10000);
    }
    die("connect");
    return -1;
}

static void fetch(int s, size_t off, size_t len) {
    unsigned long long req[2] = {off, len};
    int status;
    if (send(s, req, sizeof req, 0) != sizeof req) die("send");
    if (recv(s, &status, sizeof status, MSG_WAITALL) != sizeof status) die("status");
    char *p = dst + off;
    while (len) {
        ssize_t n = recv(s, p, len, busy ? MSG_DONTWAIT : 0);
        if (n < 0 && errno == EAGAIN) continue;
        if (n <= 0) die("recv");
        p += n;
        len -= (size_t)n;
    }
}

static void part(int i, int it) {
    size_t per = OBJ / streams, base = (size_t)(it % objs) * OBJ;
    fetch(socks[i], base + i * per, per);
}

static void *worker(void *arg) {
    int i = (int)(long)arg;
    for (int it = 0; it < iters; it++) {
        pthread_barrier_wait(&start_b);
        part(i, it);
        pthread_barrier_wait(&done_b);
    }
    return NULL;
}

static int cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

int main(int argc, char **argv) {
    for (int i = 1; i < argc; i++) {
        if (!strncmp(argv[i], "streams=", 8)) streams = atoi(argv[i] + 8);
        else if (!strncmp(argv[i], "objs=", 5)) objs = atoi(argv[i] + 5);
        else if (!strncmp(argv[i], "iters=", 6)) iters = atoi(argv[i] + 6);
        else if (!strcmp(argv[i], "send")) use_sendfile = 0;
        else if (!strcmp(argv[i], "sendfile")) use_sendfile = 1;
        else if (!strcmp(argv[i], "busy")) busy = 1;
        else if (!strcmp(argv[i], "block")) busy = 0;
        else if (!strncmp(argv[i], "cc=", 3)) cc = argv[i] + 3;
        else { fprintf(stderr, "unknown argument %s\n", argv[i]); return 2; }
    }
    if (streams < 1 || streams > 16 || objs < 1 || iters < 1) return 2;
    srand((unsigned)getpid());
    port = 40000 + rand() % 20000;
    size_t total = (size_t)objs * OBJ;
    memfd = memfd_create("ceiling", 0);
    if (memfd < 0 || ftruncate(memfd, (off_t)total)) die("memfd");
    seg = mmap(NULL, total, PROT_READ | PROT_WRITE, MAP_SHARED, memfd, 0);
    if (seg == MAP_FAILED) die("mmap");
    memset(seg, 7, total);
    pid_t pid = fork();
    if (pid == 0) {
        server();
        return 0;
    }
    dst = aligned_alloc(4096, total);
    memset(dst, 1, total);
    for (int i = 0; i < streams; i++) socks[i] = dial();
    pthread_barrier_init(&start_b, NULL, streams);
    pthread_barrier_init(&done_b, NULL, streams);
    pthread_t th[16];
    for (int i = 1; i < streams; i++) pthread_create(&th[i], NULL, worker, (void *)(long)i);
    double *gbs = malloc(sizeof(double) * iters);
    double all0 = now();
    for (int it = 0; it < iters; it++) {
        double t0 = now();
        pthread_barrier_wait(&start_b);
        part(0, it);
        pthread_barrier_wait(&done_b);
        gbs[it] = OBJ / (now() - t0) / 1e9;
    }
    double overall = (double)OBJ * iters / (now() - all0) / 1e9;
    kill(pid, SIGKILL);
    for (size_t i = 0; i < total; i += 4096)
        if (dst[i] != 7) { fprintf(stderr, "wrong bytes at %zu\n", i); return 1; }
    qsort(gbs, iters, sizeof(double), cmp);
    printf("streams=%d objs=%d %s %s cc=%s: overall %.2f GB/s; per transfer median %.2f, p90 %.2f, "
           "best %.2f\n",
           streams, objs, use_sendfile ? "sendfile" : "send", busy ? "busy" : "block",
           cc ? cc : "system", overall,
           gbs[iters / 2], gbs[iters * 9 / 10], gbs[iters - 1]);
    return 0;
}
