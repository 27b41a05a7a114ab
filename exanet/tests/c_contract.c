/*
 * What exanet.h promises, checked from C against a real rack (run by c_contract.rs):
 *   c_contract RACK NODE_A NODE_B
 * Prints "ok <check>" per check passed, "FAIL <check>: ..." and exits 1 at the first that
 * does not hold.
 */
#define _POSIX_C_SOURCE 200809L /* clock_gettime */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "exanet.h"

#define T_US 20000000 /* 20 s: waits that must succeed, on a loaded machine */

static void fail(const char *check, const char *fmt, long a, long b) {
    printf("FAIL %s: ", check);
    printf(fmt, a, b);
    printf(" (last error: %s)\n", exanet_last_error());
    fflush(stdout);
    exit(1);
}

#define CHECK(check, cond)                                                                   \
    do {                                                                                     \
        if (!(cond)) fail(check, "%ld %ld: " #cond, 0, 0);                                   \
    } while (0)
#define EXPECT(check, got, want)                                                             \
    do {                                                                                     \
        long g_ = (long)(got), w_ = (long)(want);                                            \
        if (g_ != w_) fail(check, "got %ld, want %ld: " #got, g_, w_);                       \
    } while (0)

static void ok(const char *check) {
    printf("ok %s\n", check);
    fflush(stdout);
}

static uint64_t be(const uint8_t *p, int n) {
    uint64_t v = 0;
    for (int i = 0; i < n; i++) v = (v << 8) | p[i];
    return v;
}

static double seconds(clockid_t c) {
    struct timespec t;
    clock_gettime(c, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

/* Burns `s` seconds of this thread's CPU time. */
static void compute(double s) {
    volatile uint64_t x = 0;
    double end = seconds(CLOCK_THREAD_CPUTIME_ID) + s;
    while (seconds(CLOCK_THREAD_CPUTIME_ID) < end)
        for (int i = 0; i < 10000; i++) x += (uint64_t)i;
}

int main(int argc, char **argv) {
    if (argc != 4) {
        fprintf(stderr, "usage: %s RACK NODE_A NODE_B\n", argv[0]);
        return 2;
    }
    const char *rack = argv[1];
    exanet_endpoint *a = NULL, *a2 = NULL, *b = NULL;

    /* One process attaches several times: to the same node (another rank) and another. */
    EXPECT("attach", exanet_attach(rack, argv[2], NULL, &a), EXANET_OK);
    EXPECT("attach", exanet_attach(rack, argv[2], NULL, &a2), EXANET_OK);
    EXPECT("attach", exanet_attach(rack, argv[3], NULL, &b), EXANET_OK);
    exanet_info_t ia, ia2, ib;
    EXPECT("attach", exanet_info(a, &ia), EXANET_OK);
    EXPECT("attach", exanet_info(a2, &ia2), EXANET_OK);
    EXPECT("attach", exanet_info(b, &ib), EXANET_OK);
    EXPECT("attach", ia.node_id, ia2.node_id);
    CHECK("attach", ia.rank != ia2.rank);
    CHECK("attach", ia.node_id != ib.node_id);
    ok("attach_several_times");

    /* Both attachments of the process work: a2 sends to a's mailbox. */
    exanet_mailbox *mb = NULL;
    exanet_packetizer *tx = NULL;
    EXPECT("messages", exanet_mailbox_open(a, 4, &mb), EXANET_OK);
    EXPECT("messages", exanet_packetizer_open(a2, &tx), EXANET_OK);

    /* exanet_recv on an empty mailbox: EXANET_ETIMEDOUT, at once with 0, and *msg kept. */
    exanet_message_t msg;
    memset(&msg, 0xAB, sizeof msg);
    EXPECT("recv_empty", exanet_recv(mb, 0, &msg), EXANET_ETIMEDOUT);
    EXPECT("recv_empty", exanet_recv(mb, 1000, &msg), EXANET_ETIMEDOUT);
    for (size_t i = 0; i < sizeof msg; i++) EXPECT("recv_empty", ((uint8_t *)&msg)[i], 0xAB);
    ok("recv_empty_mailbox_times_out");

    exanet_addr_t to_a = exanet_mailbox_addr(ia.node_id, ia.rank, (uint8_t)exanet_mailbox_vi(mb));
    uint32_t tag = 0;
    EXPECT("messages", exanet_send(tx, 0, &to_a, "two", 3, &tag), EXANET_OK);
    EXPECT("messages", exanet_wait(a2, tag, T_US), EXANET_OK);
    EXPECT("messages", exanet_recv(mb, T_US, &msg), EXANET_OK);
    EXPECT("messages", msg.len, 3);
    CHECK("messages", memcmp(msg.payload, "two", 3) == 0);
    EXPECT("messages", msg.src_rank, ia2.rank);
    ok("two_attachments_of_one_process_talk");

    /* Modeled time: a completion's and a message's, and the clocks they move. */
    uint64_t acked_ps = 0;
    EXPECT("modeled", exanet_send(tx, 1, &to_a, "m", 1, &tag), EXANET_OK);
    EXPECT("modeled", exanet_wait_modeled(a2, tag, T_US, &acked_ps), EXANET_OK);
    CHECK("modeled", acked_ps > 0);
    CHECK("modeled", exanet_clock_ps(a2) >= acked_ps);
    EXPECT("modeled", exanet_recv(mb, T_US, &msg), EXANET_OK);
    CHECK("modeled", msg.at_ps > 0);
    CHECK("modeled", exanet_clock_ps(a) >= msg.at_ps);
    EXPECT("modeled", exanet_clock_ps(NULL), 0);
    /* A wait in modeled time moves the clock forward (a second here), never back; each
     * call also counts the CPU time since the last one (well under a millisecond). */
    uint64_t later = exanet_clock_ps(a) + 1000000000000ull;
    uint64_t moved = exanet_advance_clock_ps(a, later);
    CHECK("modeled", moved >= later && moved - later < 1000000000ull);
    uint64_t kept = exanet_advance_clock_ps(a, 0);
    CHECK("modeled", kept >= moved && kept - moved < 1000000000ull);
    CHECK("modeled", exanet_clock_ps(a) == kept);
    EXPECT("modeled", exanet_advance_clock_ps(NULL, 5), 0);
    ok("modeled_times_reach_c");

    /* A channel that does not exist: the message says which do. */
    EXPECT("bad_channel", exanet_send(tx, 7, &to_a, "x", 1, &tag), EXANET_EBADCHANNEL);
    CHECK("bad_channel", strstr(exanet_last_error(), "channel 7 does not exist (0..3)") != NULL);
    ok("bad_channel_names_0..3");

    /* RDMA write with a completion notification into registered memory. */
    const uint64_t len = 100000, data_len = 1 << 20;
    exanet_region *src = NULL, *dst = NULL;
    exanet_rdma_page *page = NULL;
    EXPECT("notify", exanet_register(a, data_len, &src), EXANET_OK);
    EXPECT("notify", exanet_register(b, data_len + 4096, &dst), EXANET_OK);
    EXPECT("notify", exanet_rdma_page_open(a, &page), EXANET_OK);
    uint8_t *buf = malloc(len);
    CHECK("notify", buf != NULL);
    for (uint64_t i = 0; i < len; i++) buf[i] = (uint8_t)(i * 7 + 3);
    EXPECT("notify", exanet_region_write(src, 0, buf, len), EXANET_OK);
    exanet_addr_t to_b = {ib.node_id, ib.rank, exanet_region_va(dst)};
    /* Not aligned: the record needs none. */
    uint64_t note_va = exanet_region_va(dst) + data_len + 5;
    EXPECT("notify", exanet_rdma_write(page, 0, src, 0, &to_b, len, &note_va, &tag), EXANET_OK);
    EXPECT("notify", exanet_wait(a, tag, T_US), EXANET_OK);
    uint8_t *back = malloc(len);
    CHECK("notify", back != NULL);
    EXPECT("notify", exanet_region_read(dst, 0, back, len), EXANET_OK);
    CHECK("notify", memcmp(buf, back, len) == 0);
    exanet_notification_t note;
    EXPECT("notify", exanet_wait_notification(b, T_US, &note), EXANET_OK);
    EXPECT("notify", note.va, note_va);
    EXPECT("notify", note.len, len);
    EXPECT("notify", note.src_node, ia.node_id);
    ok("notification_delivered");
    /* The record at its VA: EXANET_NOTIFICATION_SIZE bytes, as exanet_rdma_write says. */
    uint8_t rec[EXANET_NOTIFICATION_SIZE + 2];
    EXPECT("record", exanet_region_read(dst, data_len + 4, rec, sizeof rec), EXANET_OK);
    EXPECT("record", rec[0], 0);                            /* the byte before: untouched */
    EXPECT("record", rec[1], 1);                            /* kind: an RDMA write's */
    EXPECT("record", rec[2], 0);                            /* status */
    EXPECT("record", be(rec + 3, 2), 0);                    /* zero */
    CHECK("record", be(rec + 5, 4) != 0);                   /* the transfer's id */
    EXPECT("record", be(rec + 9, 8), len);                  /* length, big-endian */
    EXPECT("record", rec[EXANET_NOTIFICATION_SIZE + 1], 0); /* the byte after: untouched */
    ok("notification_record_layout");

    /* A notification VA outside registered memory: the write ends NACKed page_fault. */
    uint64_t hole = exanet_region_va(dst) + data_len + 4096 - 8; /* 8 of 16 bytes inside */
    memset(back, 0, len);
    EXPECT("notify_unregistered", exanet_region_write(dst, 0, back, len), EXANET_OK);
    EXPECT("notify_unregistered",
           exanet_rdma_write(page, 1, src, 0, &to_b, len, &hole, &tag), EXANET_OK);
    EXPECT("notify_unregistered", exanet_wait(a, tag, T_US), EXANET_ENACKED);
    EXPECT("notify_unregistered", exanet_last_nack_reason(), EXANET_NACK_PAGE_FAULT);
    /* ...although its data was written. */
    EXPECT("notify_unregistered", exanet_region_read(dst, 0, back, len), EXANET_OK);
    CHECK("notify_unregistered", memcmp(buf, back, len) == 0);
    EXPECT("notify_unregistered", exanet_wait_notification(b, 0, &note), EXANET_ETIMEDOUT);
    ok("notification_outside_registered_memory_nacked_page_fault");

    /* The longest transfer: 4 GiB; one byte more is EXANET_EBADLENGTH. */
    EXPECT("max_transfer",
           exanet_rdma_write(page, 2, src, 0, &to_b, EXANET_MAX_TRANSFER + 1, NULL, &tag),
           EXANET_EBADLENGTH);
    EXPECT("max_transfer",
           exanet_rdma_read(page, 2, &to_b, src, 0, EXANET_MAX_TRANSFER + 1, &tag),
           EXANET_EBADLENGTH);
    ok("longer_than_max_transfer_is_ebadlength");

    /* A region of another endpoint (of the same process) is refused. */
    EXPECT("foreign_region", exanet_rdma_write(page, 3, dst, 0, &to_b, 1, NULL, &tag),
           EXANET_EINVAL);
    ok("region_of_another_endpoint_einval");

    EXPECT("poll", exanet_poll(a) >= 0, 1);
    ok("poll");

    /* For libraries built on this one (docs/modeled-time.md). A result collected without
     * waiting, once; a message kept without moving the clock, until the program takes it
     * (a2 is a second of modeled time ahead of a, so its message is too). */
    exanet_advance_clock_ps(a2, exanet_clock_ps(a) + 1000000000000ull);
    EXPECT("library", exanet_try_send(tx, &to_a, "kept", 4, &tag), EXANET_OK);
    EXPECT("library", exanet_try_send(tx, &to_a, "kept", 4, NULL), EXANET_EINVAL);
    uint64_t done_ps = 0;
    int rc;
    double deadline = seconds(CLOCK_MONOTONIC) + T_US / 1e6;
    while ((rc = exanet_result(a2, tag, &done_ps)) == EXANET_ETIMEDOUT &&
           seconds(CLOCK_MONOTONIC) < deadline)
        exanet_idle(a2);
    EXPECT("library", rc, EXANET_OK);
    CHECK("library", done_ps > 0);
    EXPECT("library", exanet_result(a2, tag, &done_ps), EXANET_EUNKNOWNTAG);
    while ((rc = exanet_recv_unclocked(mb, &msg)) == EXANET_ETIMEDOUT &&
           seconds(CLOCK_MONOTONIC) < deadline)
        exanet_idle(a);
    EXPECT("library", rc, EXANET_OK);
    EXPECT("library", msg.len, 4);
    CHECK("library", memcmp(msg.payload, "kept", 4) == 0);
    CHECK("library", exanet_clock_ps(a) + 500000000000ull < msg.at_ps);
    uint64_t took = exanet_took_ps(a, msg.at_ps);
    CHECK("library", took >= msg.at_ps && took - msg.at_ps < 1000000000ull);
    EXPECT("library", exanet_recv_unclocked(mb, &msg), EXANET_ETIMEDOUT);
    /* RDMA on any free channel. */
    EXPECT("library", exanet_rdma_try_write(page, src, 0, &to_b, 4096, NULL, &tag), EXANET_OK);
    EXPECT("library", exanet_wait(a, tag, T_US), EXANET_OK);
    EXPECT("library", exanet_rdma_try_read(page, &to_b, src, 8192, 4096, &tag), EXANET_OK);
    EXPECT("library", exanet_wait(a, tag, T_US), EXANET_OK);
    EXPECT("library", exanet_region_read(src, 8192, back, 4096), EXANET_OK);
    CHECK("library", memcmp(buf, back, 4096) == 0);
    /* CPU time between calls is compute (the rack's compute_scale is 1; a call, here
     * exanet_advance_clock_ps, counts it); inside a hold it is the library's. */
    uint64_t c0 = exanet_advance_clock_ps(a, 0);
    compute(0.05);
    uint64_t c1 = exanet_advance_clock_ps(a, 0);
    CHECK("library", c1 - c0 >= 45000000000ull);
    EXPECT("library", exanet_unhold(a), EXANET_EINVAL);
    EXPECT("library", exanet_hold(a), EXANET_OK);
    EXPECT("library", exanet_hold(a), EXANET_OK);
    uint64_t c2 = exanet_advance_clock_ps(a, 0);
    compute(0.05);
    EXPECT("library", exanet_unhold(a), EXANET_OK);
    uint64_t c3 = exanet_advance_clock_ps(a, 0);
    EXPECT("library", exanet_unhold(a), EXANET_OK);
    EXPECT("library", exanet_unhold(a), EXANET_EINVAL);
    CHECK("library", c3 - c2 < 5000000000ull);
    EXPECT("library", exanet_busy(a), EXANET_OK);
    EXPECT("library", exanet_idle(NULL), EXANET_EINVAL);
    ok("calls_for_libraries_on_top");

    /* Collectives: two members of one process in turns is not possible (they block), so a
     * group of b alone runs every collective through the whole library, and a group that
     * is not whole QFDBs is refused by the accelerator with the reason. */
    exanet_collectives *coll = NULL;
    exanet_group *grp = NULL;
    EXPECT("collectives", exanet_collectives_open(b, &coll), EXANET_OK);
    exanet_member_t me_only = {ib.node_id, ib.rank};
    EXPECT("collectives", exanet_group_create(coll, 9, &me_only, 1, &grp), EXANET_OK);
    double v[4] = {1.5, -2.0, 3.25, 0.0}, r[4] = {0};
    EXPECT("collectives", exanet_allreduce(coll, grp, EXANET_OP_SUM, EXANET_TYPE_F64, v, r,
                                           sizeof v, EXANET_PATH_AUTO), EXANET_OK);
    CHECK("collectives", memcmp(v, r, sizeof v) == 0);
    EXPECT("collectives", exanet_allreduce(coll, grp, EXANET_OP_SUM, EXANET_TYPE_F64, v, r,
                                           sizeof v, EXANET_PATH_ACCELERATOR), EXANET_EINVAL);
    CHECK("collectives", strstr(exanet_last_error(), "whole QFDBs") != NULL);
    EXPECT("collectives", exanet_allreduce(coll, grp, 7, EXANET_TYPE_F64, v, r, sizeof v,
                                           EXANET_PATH_AUTO), EXANET_EINVAL);
    EXPECT("collectives", exanet_allreduce(coll, grp, EXANET_OP_SUM, EXANET_TYPE_F64, v, r, 5,
                                           EXANET_PATH_AUTO), EXANET_EINVAL);
    EXPECT("collectives", exanet_collectives_set_eager_limit(coll, 0), EXANET_OK);
    EXPECT("collectives", exanet_collectives_set_eager_limit(NULL, 0), EXANET_EINVAL);
    EXPECT("collectives", exanet_bcast(coll, grp, 0, v, sizeof v), EXANET_OK);
    EXPECT("collectives", exanet_reduce(coll, grp, 0, EXANET_OP_MAX, EXANET_TYPE_F64, v, r,
                                        sizeof v), EXANET_OK);
    EXPECT("collectives", exanet_barrier(coll, grp), EXANET_OK);
    EXPECT("collectives", exanet_barrier(coll, NULL), EXANET_EINVAL);
    exanet_member_t stranger = {ia.node_id, ia.rank};
    exanet_group *bad = NULL;
    EXPECT("collectives", exanet_group_create(coll, 9, &stranger, 1, &bad), EXANET_EINVAL);
    exanet_group_free(grp);
    exanet_collectives_close(coll);
    ok("collectives_of_a_group_of_one");

    /* exanet_detach frees the endpoint: its handle is stale afterwards, never reused, and
     * its other handles report the detach until released. */
    exanet_detach(a);
    EXPECT("detach", exanet_poll(a), EXANET_EINVAL);
    CHECK("detach", strstr(exanet_last_error(), "stale endpoint handle") != NULL);
    EXPECT("detach", exanet_info(a, &ia), EXANET_EINVAL);
    EXPECT("detach", exanet_recv(mb, 0, &msg), EXANET_EDISCONNECTED);
    EXPECT("detach", exanet_rdma_write(page, 0, src, 0, &to_b, 1, NULL, &tag),
           EXANET_EDISCONNECTED);
    exanet_detach(a); /* again: nothing happens */
    exanet_endpoint *a3 = NULL;
    EXPECT("detach", exanet_attach(rack, argv[2], NULL, &a3), EXANET_OK);
    CHECK("detach", a3 != a);
    EXPECT("detach", exanet_poll(a), EXANET_EINVAL);
    EXPECT("detach", exanet_poll(a3) >= 0, 1);
    ok("detach_frees_the_endpoint");

    exanet_mailbox_close(mb);
    exanet_rdma_page_close(page);
    exanet_region_free(src);
    exanet_packetizer_close(tx);
    exanet_region_free(dst);
    exanet_detach(a3);
    exanet_detach(a2);
    exanet_detach(b);
    free(buf);
    free(back);
    printf("done\n");
    return 0;
}
