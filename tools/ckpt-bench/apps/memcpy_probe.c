/* Whether the CUDA driver's checkpoint and restore copy host memory through
 * the C library's memcpy (issue 39: the driver's one CPU thread copies at
 * 5.6-5.8 GiB/s, half the time to free the GPU), and how fast the same
 * copies go split across several threads. A probe, not product code:
 * preloaded (LD_PRELOAD) into a CUDA process by ckpt_diag.py.
 *
 *   MEMCPY_PROBE_LOG=1       one line per large copy (the first 40) and a
 *                            summary every 64 large copies, on stderr
 *   MEMCPY_PROBE_THREADS=N   copies of at least 1 MiB are split across N
 *                            threads (the caller and N-1 helpers)
 *
 *   gcc -O2 -shared -fPIC -pthread -o memcpy_probe.so memcpy_probe.c -ldl
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#define LARGE (64u << 10)
#define SPLIT (1u << 20)
#define MAXT 32

typedef void *(*copy_fn)(void *, const void *, size_t);
static copy_fn real_memcpy, real_memmove;
static int log_on, threads = 1;
static atomic_ulong n_large, bytes_large, ns_large, n_printed;

static void *byte_copy(void *d, const void *s, size_t n) {
    unsigned char *dd = d;
    const unsigned char *ss = s;
    if (dd < ss)
        for (size_t i = 0; i < n; i++) dd[i] = ss[i];
    else
        for (size_t i = n; i > 0; i--) dd[i - 1] = ss[i - 1];
    return d;
}

static atomic_int resolving;
static void resolve(void) {
    if (real_memcpy) return;
    if (atomic_exchange(&resolving, 1)) return; /* dlsym may copy: byte_copy meanwhile */
    copy_fn m = (copy_fn)dlsym(RTLD_NEXT, "memmove");
    copy_fn c = (copy_fn)dlsym(RTLD_NEXT, "memcpy");
    const char *l = getenv("MEMCPY_PROBE_LOG"), *t = getenv("MEMCPY_PROBE_THREADS");
    log_on = l && *l == '1';
    if (t) { threads = atoi(t); if (threads < 1) threads = 1; if (threads > MAXT) threads = MAXT; }
    real_memmove = m;
    real_memcpy = c;
}

static uint64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + ts.tv_nsec;
}

/* The helpers: each waits for a generation number to change, copies its
 * share, and counts itself done. One split copy at a time (a trylock: a
 * second large copy meanwhile goes serially). */
static pthread_mutex_t split_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_mutex_t m = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t go = PTHREAD_COND_INITIALIZER, done = PTHREAD_COND_INITIALIZER;
static unsigned long gen;
static int pending, started;
static char *job_d;
static const char *job_s;
static size_t job_n, job_share;

static void share(int i, char **d, const char **s, size_t *n) {
    size_t off = job_share * i;
    *d = job_d + off;
    *s = job_s + off;
    *n = off >= job_n ? 0 : (job_n - off < job_share ? job_n - off : job_share);
}

static void *helper(void *arg) {
    int i = (int)(intptr_t)arg;
    unsigned long seen = 0;
    for (;;) {
        pthread_mutex_lock(&m);
        while (gen == seen) pthread_cond_wait(&go, &m);
        seen = gen;
        pthread_mutex_unlock(&m);
        char *d; const char *s; size_t n;
        share(i, &d, &s, &n);
        if (n) real_memcpy(d, s, n);
        pthread_mutex_lock(&m);
        if (--pending == 0) pthread_cond_signal(&done);
        pthread_mutex_unlock(&m);
    }
    return NULL;
}

static int split_copy(void *d, const void *s, size_t n) {
    if (threads < 2 || n < SPLIT) return 0;
    if ((char *)d < (const char *)s + n && (const char *)s < (char *)d + n) return 0;
    if (pthread_mutex_trylock(&split_lock)) return 0;
    if (!started) {
        for (int i = 1; i < threads; i++) {
            pthread_t t;
            if (pthread_create(&t, NULL, helper, (void *)(intptr_t)i)) { threads = i; break; }
            pthread_detach(t);
        }
        started = 1;
    }
    pthread_mutex_lock(&m);
    job_d = d; job_s = s; job_n = n;
    job_share = ((n + threads - 1) / threads + 63) & ~(size_t)63;
    pending = threads - 1;
    gen++;
    pthread_cond_broadcast(&go);
    pthread_mutex_unlock(&m);
    char *dd; const char *ss; size_t nn;
    share(0, &dd, &ss, &nn);
    real_memcpy(dd, ss, nn);
    pthread_mutex_lock(&m);
    while (pending) pthread_cond_wait(&done, &m);
    pthread_mutex_unlock(&m);
    pthread_mutex_unlock(&split_lock);
    return 1;
}

static void note(void *d, const void *s, size_t n, uint64_t ns, void *caller, const char *what) {
    unsigned long k = atomic_fetch_add(&n_large, 1) + 1;
    unsigned long b = atomic_fetch_add(&bytes_large, n) + n;
    unsigned long t = atomic_fetch_add(&ns_large, ns) + ns;
    if (!log_on) return;
    if (atomic_fetch_add(&n_printed, 1) < 40) {
        Dl_info info;
        const char *obj = dladdr(caller, &info) && info.dli_fname ? info.dli_fname : "?";
        fprintf(stderr, "memcpy-probe: %s %zu bytes %p <- %p in %lu us (%.2f GiB/s) tid %ld from %s threads %d\n",
                what, n, d, s, (unsigned long)(ns / 1000), n / (ns / 1e9) / (1 << 30),
                (long)syscall(SYS_gettid), obj, threads);
    }
    if (k % 64 == 0)
        fprintf(stderr, "memcpy-probe: %lu large copies, %.2f GiB in %.3f s (%.2f GiB/s), threads %d\n",
                k, b / (double)(1 << 30), t / 1e9, b / (t / 1e9) / (1 << 30), threads);
}

static void *copy(void *d, const void *s, size_t n, int move, void *caller) {
    resolve();
    copy_fn f = move ? real_memmove : real_memcpy;
    if (!f) return byte_copy(d, s, n);
    if (n < LARGE) return f(d, s, n);
    uint64_t t = now_ns();
    if (!split_copy(d, s, n)) f(d, s, n);
    note(d, s, n, now_ns() - t, caller, move ? "memmove" : "memcpy");
    return d;
}

void *memcpy(void *d, const void *s, size_t n) { return copy(d, s, n, 0, __builtin_return_address(0)); }
void *memmove(void *d, const void *s, size_t n) { return copy(d, s, n, 1, __builtin_return_address(0)); }
void *__memcpy_chk(void *d, const void *s, size_t n, size_t dn) {
    (void)dn;
    return copy(d, s, n, 0, __builtin_return_address(0));
}
