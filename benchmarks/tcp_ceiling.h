// Helpers shared by the bare TCP ceiling programs (tcp_loopback_ceiling.c,
// tcp_cross_ceiling.c); included by relative path, so `gcc FILE.c` finds it
// next to the source.
#ifndef MC_TCP_CEILING_H
#define MC_TCP_CEILING_H

#include <stdio.h>
#include <stdlib.h>
#include <time.h>

// Monotonic seconds.
static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

// Report the failed call (errno) and exit with status 1.
static void die(const char *what) {
    perror(what);
    exit(1);
}

#endif
