/* A machine whose wall clock is ahead: CLOCK_REALTIME (and gettimeofday, time) plus SKEWED_CLOCK_NS nanoseconds.
 *
 * Preloaded (LD_PRELOAD) into one simulated machine's processes by test_multi_node.py. Only the wall
 * clock moves, as between two real machines; CLOCK_MONOTONIC stays the kernel's, so every timed wait
 * of the process still works (libfaketime moves the monotonic clock too, or, told not to, makes
 * clock_nanosleep fail: Python 3.11's timed waits and sleeps then hang or raise).
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdlib.h>
#include <sys/time.h>
#include <time.h>

static long long skew_ns(void) {
    static long long skew = -1;
    if (skew == -1) {
        const char *text = getenv("SKEWED_CLOCK_NS");
        skew = text ? atoll(text) : 0;
    }
    return skew;
}

static void shift(struct timespec *ts) {
    long long ns = (long long)ts->tv_sec * 1000000000LL + ts->tv_nsec + skew_ns();
    ts->tv_sec = ns / 1000000000LL;
    ts->tv_nsec = ns % 1000000000LL;
}

int clock_gettime(clockid_t clock, struct timespec *ts) {
    static int (*real)(clockid_t, struct timespec *) = NULL;
    if (!real) real = (int (*)(clockid_t, struct timespec *))dlsym(RTLD_NEXT, "clock_gettime");
    int result = real(clock, ts);
    if (result == 0 && (clock == CLOCK_REALTIME || clock == CLOCK_REALTIME_COARSE)) shift(ts);
    return result;
}

int gettimeofday(struct timeval *tv, void *tz) {
    struct timespec ts;
    int result = clock_gettime(CLOCK_REALTIME, &ts);
    if (result == 0 && tv) {
        tv->tv_sec = ts.tv_sec;
        tv->tv_usec = ts.tv_nsec / 1000;
    }
    (void)tz;
    return result;
}

time_t time(time_t *out) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    if (out) *out = ts.tv_sec;
    return ts.tv_sec;
}
