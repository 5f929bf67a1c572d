/* The persistent pthread pool: work split into home ranges with stealing, and pinning.
 *
 * Why pthreads and not OpenMP: torch ships its own libgomp; a second OpenMP runtime in the same process
 * oversubscribes the cores and its spin-waiting threads steal time from torch's.
 *
 * Scheduling. A job's units are split into one contiguous home range per participant (the static split
 * a first-touch pass places pages by). Each participant claims `grain` units at a time from its own range
 * with an atomic cursor, then, when its range is done, claims what is left of the others'. So a thread
 * that wakes late, or shares its core with another process's thread (a spinning OpenMP team, the training
 * thread), slows the job by the work it leaves undone, not by its whole share: with a static split the
 * slowest thread sets the time. Units are independent, so results do not depend on who ran what.
 *
 * Pinning (ga_set_affinity, Linux): worker k runs on cpus[(k-1) % n], and the calling thread only waits,
 * so the job's work stays on those CPUs (e.g. every CPU but the training thread's). */
#define _GNU_SOURCE
#include <errno.h>
#include <fenv.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "ga_internal.h"

/* One cursor per cache line: participants claiming from their own ranges never share a line. */
typedef struct {
    int64_t next;
    int64_t end;
    char pad[64 - 2 * sizeof(int64_t)];
} __attribute__((aligned(64))) home_range;

static home_range R[GA_MAX_THREADS];

static struct {
    pthread_mutex_t call_lock; /* one job at a time; concurrent API calls queue here */
    pthread_mutex_t mu;        /* guards everything below */
    pthread_cond_t start_cv, done_cv;
    int nworkers; /* threads with ids 1..nworkers */
    pthread_t threads[GA_MAX_THREADS];
    uint64_t gen;  /* bumped per job */
    uint64_t spawn_gen[GA_MAX_THREADS];  /* the generation a worker was created in (set before it runs) */
    ga_job job;    /* the current job; valid while !closed */
    int first;     /* worker id whose home range is 0: 1 when the caller only waits, else 0 (the caller) */
    int active;    /* workers inside the current job */
    int exhausted; /* some participant found every range claimed (stealing jobs) */
    int homes_left; /* home ranges not yet done (jobs without stealing) */
    int closed;    /* the job takes no more workers; a late wake-up goes back to sleep */
    int ncpus;     /* pinned to cpus[0..ncpus) when > 0 */
    int cpus[GA_MAX_THREADS];
} P = {.call_lock = PTHREAD_MUTEX_INITIALIZER, .mu = PTHREAD_MUTEX_INITIALIZER,
       .start_cv = PTHREAD_COND_INITIALIZER, .done_cv = PTHREAD_COND_INITIALIZER, .closed = 1};

#if defined(__linux__)
static cpu_set_t g_mask; /* the process's affinity mask at init: where unpinned workers may run */
static int g_mask_ok;
#endif

static void participate(const ga_job *j, int home) {
    for (int k = 0; k < j->nth; k++) {
        home_range *r = &R[(home + k) % j->nth];
        for (;;) {
            int64_t u = __atomic_fetch_add(&r->next, j->grain, __ATOMIC_RELAXED);
            if (u >= r->end) break;
            j->fn(j->ctx, u, u + j->grain < r->end ? u + j->grain : r->end);
        }
        if (!j->steal) break;
    }
}

/* Every participant runs in the default IEEE environment (round to nearest, no FTZ/DAZ) whatever the
 * caller set (e.g. torch.set_flush_denormal), so results cannot depend on which thread ran a chunk. */
static void participate_ieee(const ga_job *j, int home) {
    fenv_t saved;
    fegetenv(&saved);
    fesetenv(FE_DFL_ENV);
    participate(j, home);
    fesetenv(&saved);
}

static void *worker_main(void *arg) {
    int id = (int)(intptr_t)arg;
    uint64_t seen;
    pthread_mutex_lock(&P.mu);
    /* The generation current when this worker was created, not when it first runs: the job it was
     * created for may already have been published by then (gen bumped), and reading P.gen here would
     * make it wait for the next one while the caller waits for it (a deadlock seen when the pool first
     * grows under a pinned configuration, where the caller does not work itself). */
    seen = P.spawn_gen[id - 1];
    for (;;) {
        ga_job j;
        int home;
        while (P.gen == seen) pthread_cond_wait(&P.start_cv, &P.mu);
        seen = P.gen;
        home = id - P.first;
        if (P.closed || home < 0 || home >= P.job.nth) continue;
        j = P.job;
        P.active++;
        pthread_mutex_unlock(&P.mu);
        participate_ieee(&j, home);
        pthread_mutex_lock(&P.mu);
        P.exhausted = 1; /* participate() returns only when every range (its own, if !steal) is claimed */
        P.homes_left--;
        if (--P.active == 0) pthread_cond_signal(&P.done_cv);
    }
    return NULL;
}

#if defined(__linux__)
static void apply_affinity(int id) {
    cpu_set_t one;
    if (P.ncpus > 0) {
        CPU_ZERO(&one);
        CPU_SET(P.cpus[(id - 1) % P.ncpus], &one);
        pthread_setaffinity_np(P.threads[id - 1], sizeof(one), &one);
    } else if (g_mask_ok) {
        pthread_setaffinity_np(P.threads[id - 1], sizeof(g_mask), &g_mask);
    }
}
#endif

/* Called with call_lock held and no job in flight. Returns the worker count. */
static int ensure_workers(int want) {
    sigset_t all, old;
    if (want > GA_MAX_THREADS - 1) want = GA_MAX_THREADS - 1;
    sigfillset(&all);
    /* Workers block all signals so that SIGINT and friends keep going to Python's main thread. */
    pthread_sigmask(SIG_SETMASK, &all, &old);
    while (P.nworkers < want) {
        pthread_attr_t attr;
        int id = P.nworkers + 1, rc;
        pthread_attr_init(&attr);
        pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
        /* under mu: the generation the new worker starts from is recorded before any job is published */
        pthread_mutex_lock(&P.mu);
        P.spawn_gen[id - 1] = P.gen;
        rc = pthread_create(&P.threads[id - 1], &attr, worker_main, (void *)(intptr_t)id);
        pthread_mutex_unlock(&P.mu);
        pthread_attr_destroy(&attr);
        if (rc != 0) break;
        P.nworkers++;
#if defined(__linux__)
        if (P.ncpus > 0) apply_affinity(id);
#endif
    }
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    return P.nworkers;
}

static void set_ranges(const ga_job *j) {
    for (int h = 0; h < j->nth; h++) {
        R[h].next = j->nunits * h / j->nth;
        R[h].end = j->nunits * (h + 1) / j->nth;
    }
}

void ga_pool_run(const ga_job *job) {
    ga_job j = *job;
    int caller_works;
    if (j.nunits <= 0) return;
    if (j.nth > GA_MAX_THREADS) j.nth = GA_MAX_THREADS;
    if (j.nth < 1) j.nth = 1;
    if (j.grain < 1) j.grain = 1;
    if (j.nth == 1 && (j.inline_ok || __atomic_load_n(&P.ncpus, __ATOMIC_ACQUIRE) == 0)) {
        fenv_t saved; /* one participant, on this thread: no lock, no wake-up */
        fegetenv(&saved);
        fesetenv(FE_DFL_ENV);
        j.fn(j.ctx, 0, j.nunits);
        fesetenv(&saved);
        return;
    }
    pthread_mutex_lock(&P.call_lock);
    caller_works = P.ncpus == 0;
    {
        int have = ensure_workers(caller_works ? j.nth - 1 : j.nth);
        int most = caller_works ? have + 1 : have;
        if (most < 1) { /* no worker could be created: the caller does it all */
            caller_works = 1;
            most = 1;
        }
        if (j.nth > most) j.nth = most; /* thread creation failed: fewer threads, same results */
    }
    set_ranges(&j);
    pthread_mutex_lock(&P.mu);
    P.job = j;
    P.first = caller_works ? 0 : 1;
    P.active = 0;
    P.exhausted = 0;
    P.homes_left = j.nth;
    P.closed = 0;
    P.gen++;
    pthread_cond_broadcast(&P.start_cv);
    pthread_mutex_unlock(&P.mu);
    if (caller_works) participate_ieee(&j, 0);
    pthread_mutex_lock(&P.mu);
    if (caller_works) {
        P.exhausted = 1;
        P.homes_left--;
    }
    while ((j.steal ? !P.exhausted : P.homes_left > 0) || P.active > 0) pthread_cond_wait(&P.done_cv, &P.mu);
    P.closed = 1;
    pthread_mutex_unlock(&P.mu);
    pthread_mutex_unlock(&P.call_lock);
}

/* ------------------------------------------------------------------------------------------------ */
/* pinning                                                                                            */

int ga_set_affinity(const int32_t *cpus, int n) {
#if defined(__linux__)
    ga_pool_init();
    if (n < 0 || n > GA_MAX_THREADS || (n > 0 && !cpus)) return GA_EINVAL;
    for (int k = 0; k < n; k++)
        if (cpus[k] < 0 || cpus[k] >= CPU_SETSIZE || (g_mask_ok && !CPU_ISSET(cpus[k], &g_mask))) return GA_EINVAL;
    pthread_mutex_lock(&P.call_lock); /* no job in flight while workers move */
    for (int k = 0; k < n; k++) P.cpus[k] = cpus[k];
    __atomic_store_n(&P.ncpus, n, __ATOMIC_RELEASE);
    for (int id = 1; id <= P.nworkers; id++) apply_affinity(id);
    pthread_mutex_unlock(&P.call_lock);
    if (n > 0) ga_set_num_threads(n);
    return GA_OK;
#else
    (void)cpus;
    return n == 0 ? GA_OK : GA_EUNSUPPORTED;
#endif
}

int ga_get_affinity(int32_t *cpus, int cap) {
    int n;
    pthread_mutex_lock(&P.call_lock);
    n = P.ncpus;
    for (int k = 0; k < n && k < cap && cpus; k++) cpus[k] = P.cpus[k];
    pthread_mutex_unlock(&P.call_lock);
    return n;
}

/* After fork() only the forking thread exists in the child: forget the workers (they are respawned on
 * demand, pinned as before) and re-initialise the locks, which may have been held by threads that no
 * longer exist. */
static void atfork_child(void) {
    pthread_mutex_init(&P.call_lock, NULL);
    pthread_mutex_init(&P.mu, NULL);
    pthread_cond_init(&P.start_cv, NULL);
    pthread_cond_init(&P.done_cv, NULL);
    P.nworkers = 0;
    P.active = 0;
    P.closed = 1;
}

static pthread_once_t g_pool_once = PTHREAD_ONCE_INIT;

static void pool_init_once(void) {
#if defined(__linux__)
    g_mask_ok = sched_getaffinity(getpid(), sizeof(g_mask), &g_mask) == 0; /* the process's, not this thread's */
#endif
    pthread_atfork(NULL, NULL, atfork_child);
}

void ga_pool_init(void) { pthread_once(&g_pool_once, pool_init_once); }
