// Where the host has placed this VM's first two vCPUs, and what that does to
// a same-host shared-memory handoff. Run it next to any PG or store figure
// that moves data between two processes through shared memory.
//
//   gcc -O2 -pthread benchmarks/vcpu_placement.c -o /tmp/vcpu_placement
//   /tmp/vcpu_placement
//
// Two threads pinned to CPUs 0 and 1:
// - rtt: one cache line bounced between them (ns per round trip);
// - handoff: CPU 0 writes 1 MiB with plain stores, CPU 1 copies it out;
// - ring cached / ring streamed: 64 MiB through a ring of 16 x 128 KiB
//   slots (the PG shared-memory ring's shape), the producer copying each
//   piece in with plain stores or with non-temporal stores, the consumer
//   copying it out with plain stores.
// On this 2-vCPU VM the host moves the vCPUs around: most of the time they
// share a last-level cache (rtt 55-95 ns, handoff about 10 GB/s), but for
// seconds at a time they sit apart (rtt about 350 ns, handoff about 2 GB/s),
// and a plain-store ring then runs at less than half its speed while a
// streamed one does not slow down. `placement=apart` marks the second case.
#define _GNU_SOURCE
#include <emmintrin.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define PIECE (128 * 1024)
#define SLOTS 16
#define RING_TOTAL (64ul << 20)
#define HANDOFF (1ul << 20)
#define BOUNCES 200000
#define HANDOFFS 2000
#define RING_ROUNDS 4

static _Atomic unsigned long flag __attribute__((aligned(64)));
static _Atomic unsigned long head __attribute__((aligned(64)));
static _Atomic unsigned long tail __attribute__((aligned(64)));
static char *shared_buf, *ring, *src, *dst;

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

static void pin(int cpu) {
    cpu_set_t s;
    CPU_ZERO(&s);
    CPU_SET(cpu, &s);
    if (pthread_setaffinity_np(pthread_self(), sizeof s, &s) != 0) {
        fprintf(stderr, "cannot pin to CPU %d\n", cpu);
        exit(1);
    }
}

static void stream_copy(char *d, const char *s, size_t n) {
    for (size_t i = 0; i < n; i += 64) {
        __m128i a = _mm_loadu_si128((const __m128i *)(s + i));
        __m128i b = _mm_loadu_si128((const __m128i *)(s + i + 16));
        __m128i c = _mm_loadu_si128((const __m128i *)(s + i + 32));
        __m128i e = _mm_loadu_si128((const __m128i *)(s + i + 48));
        _mm_stream_si128((__m128i *)(d + i), a);
        _mm_stream_si128((__m128i *)(d + i + 16), b);
        _mm_stream_si128((__m128i *)(d + i + 32), c);
        _mm_stream_si128((__m128i *)(d + i + 48), e);
    }
    _mm_sfence();
}

// Phase numbers in `flag`: odd values are posted by CPU 0, even by CPU 1.
static void *peer(void *arg) {
    (void)arg;
    pin(1);
    unsigned long f = 0;
    for (int i = 0; i < BOUNCES; i++) {
        while (atomic_load(&flag) != f + 1) {
        }
        f += 2;
        atomic_store(&flag, f);
    }
    char *out = malloc(HANDOFF);
    for (int i = 0; i < HANDOFFS; i++) {
        while (atomic_load(&flag) != f + 1) {
        }
        memcpy(out, shared_buf, HANDOFF);
        f += 2;
        atomic_store(&flag, f);
    }
    free(out);
    for (int r = 0; r < 2 * RING_ROUNDS; r++) {
        while (atomic_load(&flag) != f + 1) {
        }
        for (unsigned long i = 0; i < RING_TOTAL / PIECE; i++) {
            while (atomic_load_explicit(&head, memory_order_acquire) <= i) {
            }
            memcpy(dst + i * PIECE, ring + (i % SLOTS) * PIECE, PIECE);
            atomic_store_explicit(&tail, i + 1, memory_order_release);
        }
        f += 2;
        atomic_store(&flag, f);
    }
    return NULL;
}

static unsigned long f0;

static void post_and_wait(void) {
    atomic_store(&flag, f0 + 1);
    while (atomic_load(&flag) != f0 + 2) {
    }
    f0 += 2;
}

static double ring_rate(int streamed) {
    double best = 1e9;
    for (int r = 0; r < RING_ROUNDS; r++) {
        memset(src, r + 1, RING_TOTAL);
        atomic_store(&head, 0);
        atomic_store(&tail, 0);
        double t0 = now();
        atomic_store(&flag, f0 + 1);
        for (unsigned long i = 0; i < RING_TOTAL / PIECE; i++) {
            while (i - atomic_load_explicit(&tail, memory_order_acquire) >= SLOTS) {
            }
            char *slot = ring + (i % SLOTS) * PIECE;
            if (streamed)
                stream_copy(slot, src + i * PIECE, PIECE);
            else
                memcpy(slot, src + i * PIECE, PIECE);
            atomic_store_explicit(&head, i + 1, memory_order_release);
        }
        while (atomic_load(&flag) != f0 + 2) {
        }
        f0 += 2;
        double dt = now() - t0;
        if (dt < best)
            best = dt;
    }
    return RING_TOTAL / best / 1e9;
}

int main(void) {
    shared_buf = aligned_alloc(4096, HANDOFF);
    ring = aligned_alloc(4096, (size_t)PIECE * SLOTS);
    src = aligned_alloc(4096, RING_TOTAL);
    dst = aligned_alloc(4096, RING_TOTAL);
    char *fill = malloc(HANDOFF);
    if (!shared_buf || !ring || !src || !dst || !fill) {
        fprintf(stderr, "out of memory\n");
        return 1;
    }
    memset(shared_buf, 1, HANDOFF);
    memset(ring, 0, (size_t)PIECE * SLOTS);
    memset(dst, 0, RING_TOTAL);
    memset(fill, 2, HANDOFF);
    pin(0);
    pthread_t t;
    pthread_create(&t, NULL, peer, NULL);

    double t0 = now();
    for (int i = 0; i < BOUNCES; i++)
        post_and_wait();
    double rtt = (now() - t0) / BOUNCES * 1e9;

    t0 = now();
    for (int i = 0; i < HANDOFFS; i++) {
        memcpy(shared_buf, fill, HANDOFF);
        post_and_wait();
    }
    double handoff = (double)HANDOFF * HANDOFFS / (now() - t0) / 1e9;

    double cached = ring_rate(0);
    double streamed = ring_rate(1);
    pthread_join(t, NULL);
    printf("rtt_ns=%.0f handoff_GBps=%.2f ring_cached_GBps=%.2f ring_streamed_GBps=%.2f "
           "placement=%s\n",
           rtt, handoff, cached, streamed, rtt > 200 ? "apart" : "near");
    return 0;
}
