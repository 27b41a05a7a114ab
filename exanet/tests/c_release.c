/*
 * Releasing handles while other threads use them (built and run by c_release.rs).
 *
 *   c_release race LOOPBACK_RACK SILENT_RACK NODE ITERATIONS
 *       Thread 1 blocks in (or loops on) a call on a handle; the main thread releases that
 *       handle (or its endpoint) meanwhile. Thread 1 must return an error within
 *       EXANET_TEST_STUCK_S seconds (default 10); afterwards the released handles are stale
 *       (EXANET_EINVAL), the handles of a detached endpoint fail with EXANET_EDISCONNECTED,
 *       double releases are harmless, and the process holds as many descriptors as before
 *       the iteration (everything was really freed). Prints one "mode ..." line per mode.
 *   c_release ranks RACK NODE ITERATIONS
 *       The same detach-while-waiting against a real daemon, more times than a node has
 *       ranks: the daemon must free the rank of each detached endpoint. Prints "ranks ok".
 *
 * Any failed check prints "FAIL ..." and exits with 1; a thread that does not return exits
 * with 3.
 */
#include <dirent.h>
#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "exanet.h"

static int stuck_s = 10;

/* Bytes of each registered region (what the writer thread copies at once). */
#define REGION (1 << 20)

static void fail(int line, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fprintf(stdout, "FAIL line %d: ", line);
    vfprintf(stdout, fmt, ap);
    fprintf(stdout, " (last error: %s)\n", exanet_last_error());
    va_end(ap);
    fflush(stdout);
    exit(1);
}

#define CHECK(cond, ...)                         \
    do {                                         \
        if (!(cond)) fail(__LINE__, __VA_ARGS__); \
    } while (0)

/* Whether the calling thread's last error contains `text` (NULL: anything does). */
static int last_error_has(const char *text) {
    return text == NULL || strstr(exanet_last_error(), text) != NULL;
}

/* rc == want, and the calling thread's last error contains `text` (NULL: anything). */
#define EXPECT(call, want, text)                                                          \
    do {                                                                                  \
        int rc_ = (call);                                                                 \
        CHECK(rc_ == (want), "%s returned %d, expected %d", #call, rc_, (int)(want));     \
        CHECK(last_error_has(text), "%s: last error lacks \"%s\"", #call,                \
              (text) ? (text) : "");                                                      \
    } while (0)

static int fd_count(void) {
    DIR *d = opendir("/proc/self/fd");
    if (!d) return -1;
    int n = 0;
    while (readdir(d)) n++;
    closedir(d);
    return n;
}

static void sleep_us(long us) {
    struct timespec ts = {us / 1000000, (us % 1000000) * 1000};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
}

enum mode {
    WAIT_NOTIFICATION, /* exanet_wait_notification forever; exanet_detach */
    WAIT_TAG,          /* exanet_wait forever on a send nobody answers; exanet_detach */
    RECV_DETACH,       /* exanet_recv forever; exanet_detach */
    RECV_CLOSE,        /* exanet_recv forever; exanet_mailbox_close */
    WRITE_FREE,        /* exanet_region_write of 1 MiB in a loop; exanet_region_free */
    POLL_DETACH,       /* exanet_poll in a loop; exanet_detach */
    MODES
};

static const char *mode_name[MODES] = {"wait_notification", "wait_tag",   "recv_detach",
                                       "recv_close",        "write_free", "poll_detach"};

struct job {
    enum mode mode;
    exanet_endpoint *ep;
    exanet_mailbox *mb;
    exanet_region *rg;
    uint32_t tag;
    const void *buf;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int started, done, rc;
    char err[512];
};

static void *worker(void *arg) {
    struct job *j = arg;
    pthread_mutex_lock(&j->mu);
    j->started = 1;
    pthread_cond_broadcast(&j->cv);
    pthread_mutex_unlock(&j->mu);
    int rc = 0;
    exanet_notification_t n;
    exanet_message_t m;
    switch (j->mode) {
    case WAIT_NOTIFICATION:
        rc = exanet_wait_notification(j->ep, -1, &n);
        break;
    case WAIT_TAG:
        rc = exanet_wait(j->ep, j->tag, -1);
        break;
    case RECV_DETACH:
    case RECV_CLOSE:
        rc = exanet_recv(j->mb, -1, &m);
        break;
    case WRITE_FREE:
        while ((rc = exanet_region_write(j->rg, 0, j->buf, REGION)) == EXANET_OK) {
        }
        break;
    case POLL_DETACH:
        while ((rc = exanet_poll(j->ep)) >= 0) {
        }
        break;
    default:
        break;
    }
    pthread_mutex_lock(&j->mu);
    j->rc = rc;
    snprintf(j->err, sizeof j->err, "%s", exanet_last_error());
    j->done = 1;
    pthread_cond_broadcast(&j->cv);
    pthread_mutex_unlock(&j->mu);
    return NULL;
}

/* Starts the worker and returns once it is about to make its call. */
static pthread_t start(struct job *j) {
    pthread_t t;
    pthread_mutex_init(&j->mu, NULL);
    pthread_cond_init(&j->cv, NULL);
    j->started = j->done = 0;
    CHECK(pthread_create(&t, NULL, worker, j) == 0, "pthread_create");
    pthread_mutex_lock(&j->mu);
    while (!j->started) pthread_cond_wait(&j->cv, &j->mu);
    pthread_mutex_unlock(&j->mu);
    return t;
}

/* Waits for the worker to return, at most stuck_s seconds. */
static void finish(struct job *j, pthread_t t, const char *what) {
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_sec += stuck_s;
    pthread_mutex_lock(&j->mu);
    while (!j->done) {
        if (pthread_cond_timedwait(&j->cv, &j->mu, &until) == ETIMEDOUT && !j->done) {
            printf("STUCK: %s did not return within %d s of the release\n", what, stuck_s);
            fflush(stdout);
            _exit(3);
        }
    }
    pthread_mutex_unlock(&j->mu);
    pthread_join(t, NULL);
    pthread_mutex_destroy(&j->mu);
    pthread_cond_destroy(&j->cv);
}

static exanet_endpoint *attach(const char *rack, const char *node) {
    exanet_endpoint *ep = NULL;
    /* A daemon frees a detached rank asynchronously: retry a refusal for a while. */
    for (int i = 0;; i++) {
        int rc = exanet_attach(rack, node, NULL, &ep);
        if (rc == EXANET_OK) return ep;
        CHECK(rc == EXANET_EATTACH && i < 200, "exanet_attach(%s, %s) = %d", rack, node, rc);
        sleep_us(50 * 1000);
    }
}

/* Checks that every handle of a detached endpoint fails with EXANET_EDISCONNECTED, then
 * releases them (twice) and checks they are stale. NULL handles (released already) are
 * skipped. */
static void orphans(exanet_packetizer *pk, exanet_mailbox *mb, exanet_region *rg,
                    exanet_rdma_page *pg, exanet_addr_t self) {
    uint32_t tag;
    exanet_message_t m;
    EXPECT(exanet_send(pk, 0, &self, "x", 1, &tag), EXANET_EDISCONNECTED,
           "endpoint of this packetizer was detached");
    if (mb) {
        EXPECT(exanet_mailbox_vi(mb), EXANET_EDISCONNECTED, "detached");
        EXPECT(exanet_recv(mb, 0, &m), EXANET_EDISCONNECTED,
               "endpoint of this mailbox was detached");
    }
    if (rg) {
        EXPECT(exanet_region_write(rg, 0, "abc", 3), EXANET_EDISCONNECTED,
               "endpoint of this region was detached");
        EXPECT(exanet_rdma_write(pg, 0, rg, 0, &self, 8, NULL, &tag), EXANET_EDISCONNECTED,
               "detached");
        CHECK(exanet_region_len(rg) == REGION, "len of a live region of a detached endpoint");
    }
    exanet_region_free(rg);
    exanet_region_free(rg);
    exanet_mailbox_close(mb);
    exanet_mailbox_close(mb);
    exanet_packetizer_close(pk);
    exanet_packetizer_close(pk);
    exanet_rdma_page_close(pg);
    exanet_rdma_page_close(pg);
    EXPECT(exanet_send(pk, 0, &self, "x", 1, &tag), EXANET_EINVAL, "stale packetizer handle");
    if (mb) EXPECT(exanet_mailbox_vi(mb), EXANET_EINVAL, "stale mailbox handle");
    if (rg) {
        EXPECT(exanet_region_write(rg, 0, "abc", 3), EXANET_EINVAL, "stale region handle");
        EXPECT(exanet_rdma_write(pg, 0, rg, 0, &self, 8, NULL, &tag), EXANET_EINVAL, "stale");
        CHECK(exanet_region_va(rg) == 0 && exanet_region_len(rg) == 0, "va/len, freed region");
    }
}

/* The checks on an endpoint handle after exanet_detach. */
static void detached(exanet_endpoint *ep) {
    exanet_info_t info;
    exanet_region *r = NULL;
    EXPECT(exanet_poll(ep), EXANET_EINVAL, "stale endpoint handle");
    EXPECT(exanet_wait(ep, 1, 0), EXANET_EINVAL, "stale endpoint handle");
    EXPECT(exanet_info(ep, &info), EXANET_EINVAL, "stale endpoint handle");
    EXPECT(exanet_register(ep, 4096, &r), EXANET_EINVAL, "stale endpoint handle");
    CHECK(r == NULL, "exanet_register on a stale endpoint stored a handle");
    exanet_detach(ep); /* again: nothing happens */
    CHECK(strstr(exanet_last_error(), "stale endpoint handle") != NULL,
          "a second exanet_detach does not say the handle is stale");
    EXPECT(exanet_poll(ep), EXANET_EINVAL, "stale endpoint handle");
}

static int race(const char *loop_rack, const char *silent_rack, const char *node, int iters) {
    static char buf[REGION];
    memset(buf, 0x5a, sizeof buf);
    static const long delays_us[] = {0, 200, 2000, 20000};
    int disconnected[MODES] = {0}, einval[MODES] = {0}, runs[MODES] = {0};
    int fds = fd_count();
    CHECK(fds > 0, "cannot count descriptors");
    for (int i = 0; i < iters; i++) {
        enum mode mode = (enum mode)(i % MODES);
        long delay = delays_us[(i / MODES) % 4];
        exanet_endpoint *ep = attach(mode == WAIT_TAG ? silent_rack : loop_rack, node);
        exanet_info_t info;
        EXPECT(exanet_info(ep, &info), EXANET_OK, NULL);
        exanet_packetizer *pk = NULL;
        exanet_mailbox *mb = NULL;
        exanet_region *rg = NULL;
        exanet_rdma_page *pg = NULL;
        EXPECT(exanet_packetizer_open(ep, &pk), EXANET_OK, NULL);
        EXPECT(exanet_mailbox_open(ep, 4, &mb), EXANET_OK, NULL);
        EXPECT(exanet_register(ep, REGION, &rg), EXANET_OK, NULL);
        EXPECT(exanet_rdma_page_open(ep, &pg), EXANET_OK, NULL);
        /* Handles of one kind are not accepted as another. */
        EXPECT(exanet_mailbox_vi((const exanet_mailbox *)ep), EXANET_EINVAL, "stale mailbox");
        exanet_addr_t self = exanet_mailbox_addr(info.node_id, info.rank, 63);
        struct job j = {.mode = mode, .ep = ep, .mb = mb, .rg = rg, .buf = buf};
        if (mode == WAIT_TAG) /* the silent daemon never completes it */
            EXPECT(exanet_send(pk, 0, &self, "x", 1, &j.tag), EXANET_OK, NULL);
        pthread_t t = start(&j);
        sleep_us(delay);
        switch (mode) {
        case RECV_CLOSE:
            exanet_mailbox_close(mb);
            break;
        case WRITE_FREE:
            exanet_region_free(rg);
            break;
        default:
            exanet_detach(ep);
            break;
        }
        finish(&j, t, mode_name[mode]);
        runs[mode]++;
        if (j.rc == EXANET_EDISCONNECTED) {
            disconnected[mode]++;
            CHECK(strstr(j.err, "detached") != NULL, "%s: %s", mode_name[mode], j.err);
        } else if (j.rc == EXANET_EINVAL) {
            einval[mode]++;
            CHECK(strstr(j.err, "stale") != NULL || strstr(j.err, "closed") != NULL, "%s: %s",
                  mode_name[mode], j.err);
        } else {
            fail(__LINE__, "%s returned %d (%s)", mode_name[mode], j.rc, j.err);
        }
        switch (mode) {
        case RECV_CLOSE: {
            exanet_message_t m;
            CHECK(j.rc == EXANET_EINVAL, "recv on a closed mailbox returned %d", j.rc);
            EXPECT(exanet_recv(mb, 0, &m), EXANET_EINVAL, "stale mailbox handle");
            exanet_mailbox_close(mb);
            /* The endpoint is still fine. */
            CHECK(exanet_poll(ep) >= 0, "poll after a mailbox close");
            exanet_detach(ep);
            detached(ep);
            orphans(pk, NULL, rg, pg, self);
            break;
        }
        case WRITE_FREE:
            CHECK(j.rc == EXANET_EINVAL, "write into a freed region returned %d", j.rc);
            EXPECT(exanet_region_write(rg, 0, buf, 16), EXANET_EINVAL, "stale region handle");
            CHECK(exanet_region_va(rg) == 0, "va of a freed region");
            exanet_region_free(rg);
            CHECK(exanet_poll(ep) >= 0, "poll after a region free");
            exanet_detach(ep);
            detached(ep);
            orphans(pk, mb, NULL, pg, self);
            break;
        default:
            if (mode == RECV_DETACH)
                CHECK(j.rc == EXANET_EDISCONNECTED, "recv on a detached endpoint returned %d",
                      j.rc);
            detached(ep);
            orphans(pk, mb, rg, pg, self);
            break;
        }
        int now = fd_count();
        CHECK(now == fds, "iteration %d (%s): %d descriptors open, %d before: not everything "
              "was freed", i, mode_name[mode], now, fds);
    }
    for (int m = 0; m < MODES; m++)
        printf("mode %s runs=%d disconnected=%d einval=%d\n", mode_name[m], runs[m],
               disconnected[m], einval[m]);
    return 0;
}

static int ranks(const char *rack, const char *node, int iters) {
    for (int i = 0; i < iters; i++) {
        exanet_endpoint *ep = attach(rack, node);
        exanet_mailbox *mb = NULL;
        EXPECT(exanet_mailbox_open(ep, 4, &mb), EXANET_OK, NULL);
        struct job j = {.mode = i % 2 ? RECV_DETACH : WAIT_NOTIFICATION, .ep = ep, .mb = mb};
        pthread_t t = start(&j);
        sleep_us(5000);
        exanet_detach(ep);
        finish(&j, t, mode_name[j.mode]);
        CHECK(j.rc == EXANET_EDISCONNECTED || j.rc == EXANET_EINVAL, "%s returned %d (%s)",
              mode_name[j.mode], j.rc, j.err);
        detached(ep);
        EXPECT(exanet_mailbox_vi(mb), EXANET_EDISCONNECTED, "detached");
        exanet_mailbox_close(mb);
    }
    /* Every rank a job may hold is free again (rank 7 is kept for the IP service). */
    exanet_endpoint *all[7];
    for (int i = 0; i < 7; i++) all[i] = attach(rack, node);
    for (int i = 0; i < 7; i++) exanet_detach(all[i]);
    printf("ranks ok\n");
    return 0;
}

int main(int argc, char **argv) {
    const char *s = getenv("EXANET_TEST_STUCK_S");
    if (s && atoi(s) > 0) stuck_s = atoi(s);
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (argc == 6 && strcmp(argv[1], "race") == 0)
        return race(argv[2], argv[3], argv[4], atoi(argv[5]));
    if (argc == 5 && strcmp(argv[1], "ranks") == 0)
        return ranks(argv[2], argv[3], atoi(argv[4]));
    fprintf(stderr, "usage: %s race LOOPBACK_RACK SILENT_RACK NODE N | ranks RACK NODE N\n",
            argv[0]);
    return 2;
}
