/*
 * pingpong.c - packetizer -> mailbox ping-pong between two nodes, in C.
 *
 *   EXANET_NODE=M1QBF3 ./pingpong serve [COUNT]
 *       opens a mailbox, prints "ready node=NODE rank=R mailbox=VI", then echoes COUNT
 *       messages (default 1000) back to their sender and exits.
 *   EXANET_NODE=M1QAF2 ./pingpong run PEER[:RANK] VI [COUNT]
 *       sends COUNT messages (1..64 bytes) to mailbox VI of rank RANK (default 0) on node
 *       PEER, waits for each echo, checks it, prints the one-way latency.
 *
 * Each message's first byte is the sender's mailbox index: where the echo goes.
 * The rack directory comes from EXANET_RACK (default ./exanet-rack).
 *
 * Build: cc -Iexanet/include pingpong.c target/release/libexanet.a -lpthread -ldl -lm
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "exanet.h"

static int fail(const char *what, int rc) {
    fprintf(stderr, "pingpong: %s: %s (%s)\n", what, exanet_strerror(rc), exanet_last_error());
    return 1;
}

static double now_us(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e6 + ts.tv_nsec / 1e3;
}

static int serve(exanet_endpoint *ep, long count) {
    exanet_mailbox *mb = NULL;
    exanet_packetizer *tx = NULL;
    exanet_info_t info;
    int rc;
    if ((rc = exanet_info(ep, &info)) != EXANET_OK) return fail("info", rc);
    if ((rc = exanet_mailbox_open(ep, 64, &mb)) != EXANET_OK) return fail("mailbox", rc);
    if ((rc = exanet_packetizer_open(ep, &tx)) != EXANET_OK) return fail("packetizer", rc);
    printf("ready node=%s rank=%u mailbox=%d\n", info.node_name, info.rank, exanet_mailbox_vi(mb));
    fflush(stdout);
    for (long i = 0; i < count; i++) {
        exanet_message_t m;
        if ((rc = exanet_recv(mb, 30 * 1000000LL, &m)) != EXANET_OK) return fail("recv", rc);
        if (m.len < 1) {
            fprintf(stderr, "pingpong: empty message from %u:%u ignored\n", m.src_node, m.src_rank);
            i--;
            continue;
        }
        exanet_addr_t back = exanet_mailbox_addr(m.src_node, m.src_rank, m.payload[0]);
        uint32_t tag;
        if ((rc = exanet_send(tx, -1, &back, m.payload, m.len, &tag)) != EXANET_OK)
            return fail("send", rc);
        if ((rc = exanet_wait(ep, tag, 5 * 1000000LL)) != EXANET_OK) return fail("echo", rc);
    }
    exanet_packetizer_close(tx);
    exanet_mailbox_close(mb);
    printf("served %ld messages\n", count);
    return 0;
}

static int run(exanet_endpoint *ep, const char *peer, int vi, long count) {
    char name[32];
    unsigned rank = 0;
    const char *colon = strchr(peer, ':');
    size_t n = colon ? (size_t)(colon - peer) : strlen(peer);
    if (n >= sizeof name) return fail("peer", EXANET_EINVAL);
    memcpy(name, peer, n);
    name[n] = 0;
    if (colon) rank = (unsigned)atoi(colon + 1);

    uint32_t node;
    int rc;
    if ((rc = exanet_node_by_name(ep, name, &node)) != EXANET_OK) return fail(name, rc);
    exanet_mailbox *mb = NULL;
    exanet_packetizer *tx = NULL;
    if ((rc = exanet_mailbox_open(ep, 64, &mb)) != EXANET_OK) return fail("mailbox", rc);
    if ((rc = exanet_packetizer_open(ep, &tx)) != EXANET_OK) return fail("packetizer", rc);
    exanet_addr_t dst = exanet_mailbox_addr(node, (uint8_t)rank, (uint8_t)vi);
    uint8_t buf[EXANET_MAX_MESSAGE];
    double total = 0, best = 1e30;
    for (long i = 0; i < count; i++) {
        size_t len = 1 + (size_t)(i % EXANET_MAX_MESSAGE);
        buf[0] = (uint8_t)exanet_mailbox_vi(mb);
        for (size_t k = 1; k < len; k++) buf[k] = (uint8_t)(i * 31 + k);
        uint32_t tag;
        double t0 = now_us();
        /* The server may not be there yet: retry while the NI says "no receiver". */
        for (;;) {
            if ((rc = exanet_send(tx, 0, &dst, buf, len, &tag)) != EXANET_OK) return fail("send", rc);
            rc = exanet_wait(ep, tag, 5 * 1000000LL);
            if (rc == EXANET_ENACKED && exanet_last_nack_reason() == EXANET_NACK_NO_CONTEXT && i == 0) {
                struct timespec pause = {0, 50 * 1000000L};
                nanosleep(&pause, NULL);
                t0 = now_us();
                continue;
            }
            if (rc != EXANET_OK) return fail("ping", rc);
            break;
        }
        exanet_message_t m;
        if ((rc = exanet_recv(mb, 5 * 1000000LL, &m)) != EXANET_OK) return fail("recv", rc);
        double rtt = now_us() - t0;
        if (m.len != len || memcmp(m.payload, buf, len) != 0 || m.src_node != node || m.src_rank != rank) {
            fprintf(stderr, "pingpong: bad echo %ld (%u bytes from %u:%u)\n", i, m.len, m.src_node, m.src_rank);
            return 1;
        }
        total += rtt / 2;
        if (rtt / 2 < best) best = rtt / 2;
    }
    printf("pingpong: %ld messages to %s, one-way min %.1f us, mean %.1f us\n", count, peer, best,
           total / (double)count);
    exanet_packetizer_close(tx);
    exanet_mailbox_close(mb);
    return 0;
}

int main(int argc, char **argv) {
    if (argc < 2 || (strcmp(argv[1], "serve") != 0 && strcmp(argv[1], "run") != 0) ||
        (strcmp(argv[1], "run") == 0 && argc < 4)) {
        fprintf(stderr, "usage: %s serve [COUNT] | %s run PEER[:RANK] VI [COUNT]\n", argv[0], argv[0]);
        return 2;
    }
    exanet_endpoint *ep = NULL;
    int rc = exanet_attach(NULL, NULL, NULL, &ep);
    if (rc != EXANET_OK) return fail("attach", rc);
    int status;
    if (strcmp(argv[1], "serve") == 0)
        status = serve(ep, argc > 2 ? atol(argv[2]) : 1000);
    else
        status = run(ep, argv[2], atoi(argv[3]), argc > 4 ? atol(argv[4]) : 1000);
    exanet_detach(ep);
    return status;
}
