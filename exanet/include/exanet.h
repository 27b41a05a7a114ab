/*
 * exanet.h - C interface of the exanet client library.
 *
 * A workload process attaches to the exanetd daemon of its node (one daemon per emulated
 * ExaNeSt node) and drives that node's network interface (NI) through shared memory:
 *
 *   - packetizer: messages of up to 64 bytes to any address, typically another rank's
 *     mailbox; 4 channels per interface, one message in flight per channel;
 *   - mailbox: a queue of received messages;
 *   - registered memory: this rank's memory, which RDMA reads from and writes into;
 *   - RDMA page: RDMA writes (optionally with a completion notification at the
 *     destination) and reads; 32 write + 32 read channels, one transfer in flight each.
 *
 * Addresses (exanet_addr_t) name a node id, a rank (0..7) on that node and a VA in that
 * rank's memory. The protection domain (PDID) is not part of them: the daemon stamps the
 * workload's own PDID, which comes from its job (EXANET_JOB_KEY), on everything it sends.
 *
 * Conventions:
 *   - functions returning int return EXANET_OK (0), or a non-negative count where
 *     documented, on success and a negative EXANET_E* code on failure;
 *     exanet_strerror(code) describes a code, exanet_last_error() the last failure of the
 *     calling thread in detail;
 *   - handles are opaque; each *_open / exanet_attach / exanet_register has a matching
 *     release function (exanet_detach, exanet_region_free, exanet_*_close). A NULL handle
 *     or output pointer passed to any other function is EXANET_EINVAL;
 *   - timeouts are in microseconds: negative = wait forever, 0 = do not wait;
 *   - posting an operation (exanet_send, exanet_rdma_write, exanet_rdma_read) returns a
 *     tag; exanet_wait(tag) says how the operation ended. Results are kept until waited
 *     for (or exanet_forget);
 *   - all functions are thread-safe, releases included: an endpoint and its handles may be
 *     used by several threads, and any thread may release a handle while others are inside
 *     calls on it. A handle is an id, not an address (the library never dereferences it)
 *     and is never reused. After its release:
 *       - a call that passes it returns EXANET_EINVAL, and exanet_last_error() names the
 *         stale kind ("... stale mailbox handle ..."); exanet_region_va/len return 0;
 *       - releasing it again does nothing (it is not a double free);
 *       - calls already in progress on it finish safely: the object is freed when the last
 *         of them returns;
 *   - exanet_detach ends the attachment at once (the daemon frees the rank) even while other
 *     threads use the endpoint: a thread blocked on it (exanet_wait,
 *     exanet_wait_notification, exanet_recv, exanet_send waiting for a channel...) returns
 *     promptly with EXANET_EDISCONNECTED; the endpoint's regions, packetizers, mailboxes and
 *     RDMA pages stay valid handles, but every call on them returns EXANET_EDISCONNECTED:
 *     release them before or after exanet_detach, in any order. (exanet_detach itself
 *     waits for a request to the daemon in progress, e.g. exanet_register, to end.)
 *   - exanet_mailbox_close makes a thread blocked in exanet_recv on that mailbox return
 *     EXANET_EINVAL (within about 100 ms); the other releases take effect for calls in
 *     progress when these return (a copy into a region being freed completes first);
 *   - handles are valid in the process that made them (not across fork);
 *   - one process may attach several times, to the same node or to others: each
 *     exanet_attach is a workload of its own (its own rank, at most 8 per node, and its own
 *     handles). The handles of one endpoint cannot be used with another's (a region of
 *     another endpoint passed to exanet_rdma_write/read is EXANET_EINVAL).
 *
 * Link with -lexanet (libexanet.so, or libexanet.a plus -lpthread -ldl -lm).
 *
 * Environment: EXANET_RACK (rack directory, default ./exanet-rack), EXANET_NODE (node
 * name, e.g. M1QAF2), EXANET_JOB_KEY (job key, default: the rack's default job),
 * EXANET_SPIN_US (how long waits spin before sleeping, default 20).
 */
#ifndef EXANET_H
#define EXANET_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ---- error codes ---------------------------------------------------------------- */

#define EXANET_OK               0
#define EXANET_EINVAL          -1  /* invalid argument: NULL pointer, bad string, bad value */
#define EXANET_ENONODE         -2  /* no node given and EXANET_NODE not set */
#define EXANET_EUNKNOWNNODE    -3  /* node name or id not in this rack */
#define EXANET_EBADRANK        -4  /* rank outside 0..7 */
#define EXANET_EFOREIGNPDID    -5  /* address of another protection domain */
#define EXANET_EBADADDR        -6  /* VA outside the 39-bit space, bad mailbox index */
#define EXANET_ERACKFILE       -7  /* rack.toml unreadable (names cannot be resolved) */
#define EXANET_EUNREACHABLE    -8  /* cannot connect to the daemon's attach socket */
#define EXANET_EATTACH         -9  /* the daemon refused to attach (unknown job key, no rank free) */
#define EXANET_EDAEMON        -10  /* the daemon refused a request (no interface free...) */
#define EXANET_EPROTO         -11  /* attach protocol error */
#define EXANET_EDISCONNECTED  -12  /* the daemon closed the connection, or exanet_detach ran */
#define EXANET_ECORRUPT       -13  /* shared memory corrupt; the endpoint is unusable */
#define EXANET_ESYSTEM        -14  /* a system call failed */
#define EXANET_ETIMEDOUT      -15  /* a wait ran out of time (the operation may still end) */
#define EXANET_ENACKED        -16  /* the destination NACKed: see exanet_last_nack_reason() */
#define EXANET_ENETTIMEDOUT   -17  /* no answer from the destination after all retries */
#define EXANET_ELOCALFAULT    -18  /* the local source memory could not be read */
#define EXANET_EREFUSED       -19  /* the NI refused the command */
#define EXANET_EBUSY          -20  /* the channel has an operation in flight */
#define EXANET_EBADCHANNEL    -21  /* no such channel */
#define EXANET_ETOOLONG       -22  /* message longer than 64 bytes */
#define EXANET_EOUTOFBOUNDS   -23  /* access outside a memory region */
#define EXANET_EBADLENGTH     -24  /* zero or too large a length */
#define EXANET_EUNKNOWNTAG    -25  /* tag never posted, or already collected */
#define EXANET_EINTERNAL      -26  /* bug in the library */
#define EXANET_EABORTED       -27  /* a collective failed at another member, so everywhere */

/* NACK reasons (exanet_last_nack_reason after EXANET_ENACKED).
 *
 * The NI already retries the transient reasons (page_fault, no_context, crc) by itself,
 * up to the rack's [ni] max_attempts (default 8), a few milliseconds apart; an operation
 * ends with EXANET_ENACKED only when the last attempt was NACKed too. Which to retry:
 *   - transient (1, 2, 3): worth posting again, later: the condition may clear (memory
 *     gets registered, the receiver opens its mailbox, the link stops corrupting cells).
 *     So is EXANET_ENETTIMEDOUT (no answer at all: a lossy or cut link, a stopped node);
 *   - EXANET_NACK_QUEUE_FULL: worth posting again once the receiver has taken messages
 *     (the NI does not retry it: it is the receiver's pace, not a fault);
 *   - EXANET_NACK_BAD_ADDRESS, EXANET_NACK_PDID_MISMATCH: never to the same address
 *     (a wrong address, or a rank of another job); fix the address instead.
 * The NI uses other reason values among its nodes (e.g. for a block with cells missing,
 * resent at once); they concern one attempt, never end an operation and are never
 * returned by exanet_last_nack_reason. */
#define EXANET_NACK_PAGE_FAULT     1  /* destination memory not registered (transient) */
#define EXANET_NACK_NO_CONTEXT     2  /* no receiver there (yet), no receive context (transient) */
#define EXANET_NACK_CRC            3  /* corrupt cell (transient) */
#define EXANET_NACK_BAD_ADDRESS    4  /* the address makes no sense at the destination */
#define EXANET_NACK_PDID_MISMATCH  5  /* the destination belongs to another protection domain */
#define EXANET_NACK_QUEUE_FULL     6  /* the mailbox is full (retry after the receiver took some) */

/* Largest message of the packetizer, channels per interface. */
#define EXANET_MAX_MESSAGE        64
#define EXANET_PACKETIZER_CHANNELS 4
#define EXANET_RDMA_CHANNELS      32
/* Longest RDMA transfer, bytes (4 GiB); longer is EXANET_EBADLENGTH. */
#define EXANET_MAX_TRANSFER       4294967296ULL
/* Bytes of the record a completion notification writes at its VA (exanet_rdma_write). */
#define EXANET_NOTIFICATION_SIZE  16

/* ---- types ---------------------------------------------------------------------- */

typedef struct exanet_endpoint exanet_endpoint;
typedef struct exanet_region exanet_region;
typedef struct exanet_packetizer exanet_packetizer;
typedef struct exanet_mailbox exanet_mailbox;
typedef struct exanet_rdma_page exanet_rdma_page;
typedef struct exanet_collectives exanet_collectives;
typedef struct exanet_group exanet_group;

typedef struct exanet_info_t {
    uint32_t node_id;     /* this node's id */
    uint32_t nodes;       /* nodes in the rack */
    uint16_t pdid;        /* this workload's protection domain */
    uint8_t rank;         /* this workload's rank on its node (0..7) */
    char node_name[16];   /* e.g. "M1QAF2", NUL-terminated */
} exanet_info_t;

typedef struct exanet_addr_t {
    uint32_t node;        /* node id (exanet_node_by_name) */
    uint8_t rank;         /* 0..7 */
    uint64_t va;          /* byte address in that rank's memory (39 bits) */
} exanet_addr_t;

typedef struct exanet_message_t {
    uint32_t src_node;    /* sender's node id */
    uint8_t src_rank;     /* sender's rank */
    uint8_t vi;           /* the mailbox it arrived in */
    uint8_t len;          /* payload bytes, 0..64 */
    uint8_t payload[64];
    uint64_t at_ps;       /* when the reader could see it, modeled picoseconds */
} exanet_message_t;

typedef struct exanet_notification_t {
    uint64_t va;          /* where in this rank's memory it was written */
    uint64_t len;         /* length of the transfer it announces */
    uint32_t src_node;    /* the writer's node id */
    uint64_t at_ps;       /* when it was written, modeled picoseconds */
} exanet_notification_t;

/* ---- attachment ----------------------------------------------------------------- */

/* Attaches to `node` of the rack in directory `rack` with `job_key`. Each may be NULL:
 * EXANET_RACK (else ./exanet-rack), EXANET_NODE, EXANET_JOB_KEY (else the default job).
 * On success *out is the endpoint; on failure *out is NULL. */
int exanet_attach(const char *rack, const char *node, const char *job_key,
                  exanet_endpoint **out);

/* Detaches and frees the endpoint (as free(3) frees memory): the daemon frees this
 * workload's rank and everything it allocated, and the library frees the endpoint once
 * the calls already inside it have returned. Threads inside calls on `ep` return
 * (EXANET_EDISCONNECTED); afterwards `ep` is stale: passing it to any function is
 * EXANET_EINVAL (it never reaches freed memory, and the handle is never reused), and the
 * endpoint's other handles only return EXANET_EDISCONNECTED until released. NULL or an
 * already detached handle: nothing happens. See "Conventions". */
void exanet_detach(exanet_endpoint *ep);

/* This attachment's node, rank and PDID. */
int exanet_info(const exanet_endpoint *ep, exanet_info_t *info);

/* The id of the node called `name` (M<blade>Q<slot>F<fpga>, e.g. "M1QBF3"). */
int exanet_node_by_name(const exanet_endpoint *ep, const char *name, uint32_t *id);

/* How long waits spin before sleeping on the daemon's doorbell (0: sleep at once). */
int exanet_set_spin(const exanet_endpoint *ep, uint64_t spin_us);

/* The address of mailbox `vi` (0..63) of `rank` on `node` (checked when used). */
exanet_addr_t exanet_mailbox_addr(uint32_t node, uint8_t rank, uint8_t vi);

/* ---- memory --------------------------------------------------------------------- */

/* Registers `len` bytes of new, zeroed shared memory as this rank's memory. */
int exanet_register(const exanet_endpoint *ep, uint64_t len, exanet_region **out);
/* Unregisters it (copies in progress in other threads complete first). */
void exanet_region_free(exanet_region *r);
/* Its first byte's VA in this rank's memory, and its length (0 for NULL or a released
 * handle). */
uint64_t exanet_region_va(const exanet_region *r);
uint64_t exanet_region_len(const exanet_region *r);
/* Copy bytes into / out of the region (the NI may change them at any time: no pointers
 * into shared memory are handed out). */
int exanet_region_write(const exanet_region *r, uint64_t offset, const void *src, size_t len);
int exanet_region_read(const exanet_region *r, uint64_t offset, void *dst, size_t len);

/* ---- packetizer and mailboxes ------------------------------------------------- */

int exanet_packetizer_open(const exanet_endpoint *ep, exanet_packetizer **out);
void exanet_packetizer_close(exanet_packetizer *p);

/* Allocates a mailbox holding up to `capacity` (1..65536; more is taken as 65536) unread
 * messages: a message counts from its arrival until exanet_recv returns it (whether it
 * waits in the NI or already in this process), and once `capacity` messages are unread
 * the next one is NACKed EXANET_NACK_QUEUE_FULL. */
int exanet_mailbox_open(const exanet_endpoint *ep, uint32_t capacity, exanet_mailbox **out);
void exanet_mailbox_close(exanet_mailbox *m);
/* Its index (0..63): what senders put in exanet_mailbox_addr. Negative on error. */
int exanet_mailbox_vi(const exanet_mailbox *m);

/* Sends `len` (<= 64) bytes to `*dst` on channel `ch` (0..3; negative: the first free
 * channel, waiting for one). *tag receives the operation's tag; tag may be NULL to
 * discard the result. The operation ends when the destination ACKs or NACKs. */
int exanet_send(const exanet_packetizer *p, int ch, const exanet_addr_t *dst,
                const void *buf, size_t len, uint32_t *tag);

/* Takes the next message of mailbox `m`, waiting up to `timeout_us`: EXANET_OK and *msg
 * filled in, or EXANET_ETIMEDOUT if the mailbox is still empty when the time is up
 * (timeout_us = 0: at once if it is empty now; *msg is then left unchanged). EXANET_EINVAL
 * if the mailbox is closed meanwhile, EXANET_EDISCONNECTED if its endpoint is detached. */
int exanet_recv(const exanet_mailbox *m, int64_t timeout_us, exanet_message_t *msg);

/* exanet_send on a free channel without waiting: EXANET_EBUSY while all four are busy.
 * Of the free channels, the one freed earliest in modeled time (a channel is free once
 * its message's ACK came): taking the first free one, whose ACK may be later than the
 * clock while an earlier one's is not yet in from the host, would move the clock with
 * the host's timing. `tag` must not be NULL. */
int exanet_try_send(const exanet_packetizer *p, const exanet_addr_t *dst, const void *buf,
                    size_t len, uint32_t *tag);

/* Takes the next message of mailbox `m` if one is there (EXANET_ETIMEDOUT if not) without
 * moving the endpoint's clock to it: for a library that keeps messages until the program
 * asks for them (an MPI library's unexpected messages), and says when it takes one with
 * exanet_took_ps(ep, msg->at_ps). */
int exanet_recv_unclocked(const exanet_mailbox *m, exanet_message_t *msg);

/* ---- RDMA ----------------------------------------------------------------------- */

int exanet_rdma_page_open(const exanet_endpoint *ep, exanet_rdma_page **out);
void exanet_rdma_page_close(exanet_rdma_page *p);

/* RDMA-writes `len` (1..EXANET_MAX_TRANSFER) bytes at `offset` of `src` to `*dst` on write
 * channel `ch` (0..31). Ends when every block is acknowledged (and the notification, if
 * any).
 *
 * notify_va: NULL, or a VA in the memory of the destination rank (dst->node, dst->rank)
 * where, after every block of the data was acknowledged, the NI writes a completion
 * notification: a record of EXANET_NOTIFICATION_SIZE (16) bytes, multi-byte fields
 * big-endian, no alignment required:
 *     byte  0      kind: 1 (an RDMA write's notification)
 *     byte  1      status: 0
 *     bytes 2..3   0
 *     bytes 4..7   an id of the transfer at the writer's NI (not the writer's tag)
 *     bytes 8..15  the transfer's length in bytes (`len`)
 * The destination's exanet_wait_notification then returns {notify_va, len, writer's node}.
 * All 16 bytes must lie in one region the destination rank registered (exanet_register);
 * otherwise the destination NACKs the record with page_fault, the NI retries it, and the
 * write ends with EXANET_ENACKED (exanet_last_nack_reason() == EXANET_NACK_PAGE_FAULT)
 * although its data was written. */
int exanet_rdma_write(const exanet_rdma_page *p, uint8_t ch, const exanet_region *src,
                      uint64_t offset, const exanet_addr_t *dst, uint64_t len,
                      const uint64_t *notify_va, uint32_t *tag);

/* RDMA-reads `len` bytes at `*src` into `dst` at `offset`, on read channel `ch` (0..31).
 * Ends when the data is in `dst`. */
int exanet_rdma_read(const exanet_rdma_page *p, uint8_t ch, const exanet_addr_t *src,
                     const exanet_region *dst, uint64_t offset, uint64_t len, uint32_t *tag);

/* exanet_rdma_write and exanet_rdma_read on a free channel without waiting: EXANET_EBUSY
 * while all are busy. Of the free channels, the one freed earliest in modeled time (see
 * exanet_try_send). */
int exanet_rdma_try_write(const exanet_rdma_page *p, const exanet_region *src,
                          uint64_t offset, const exanet_addr_t *dst, uint64_t len,
                          const uint64_t *notify_va, uint32_t *tag);
int exanet_rdma_try_read(const exanet_rdma_page *p, const exanet_addr_t *src,
                         const exanet_region *dst, uint64_t offset, uint64_t len,
                         uint32_t *tag);

/* ---- completion ----------------------------------------------------------------- */

/* Waits up to `timeout_us` for operation `tag`: EXANET_OK if it succeeded, its failure
 * (EXANET_ENACKED, EXANET_ENETTIMEDOUT, EXANET_ELOCALFAULT, EXANET_EREFUSED), or
 * EXANET_ETIMEDOUT if it is still going (wait again later). A result is collected once.
 * EXANET_EDISCONNECTED if the endpoint is detached meanwhile (by another thread). */
int exanet_wait(const exanet_endpoint *ep, uint32_t tag, int64_t timeout_us);

/* exanet_wait, also storing at `*at_ps` (unless NULL) the modeled time the operation
 * completed at: what the ExaNeSt hardware would have taken (docs/modeled-time.md). */
int exanet_wait_modeled(const exanet_endpoint *ep, uint32_t tag, int64_t timeout_us,
                        uint64_t *at_ps);

/* The endpoint's modeled clock, picoseconds: operations are posted at it, and each
 * completion, message or notification the program takes moves it to that event's
 * modeled time. The CPU time the program spends between library calls counts as
 * compute, scaled by the rack's [model] compute_scale (EXANET_COMPUTE_SCALE overrides it;
 * 0 for network benchmarks). A process's clock starts at the wall clock (within a 100-day
 * cycle), after what earlier programs did on the rack. */
uint64_t exanet_clock_ps(const exanet_endpoint *ep);

/* The program waits, in modeled time, until `ps`: the clock moves there if it is behind,
 * never back (to start ranks that attached at different moments together). Returns the
 * clock (0 for NULL or a released handle). */
uint64_t exanet_advance_clock_ps(const exanet_endpoint *ep, uint64_t ps);

/* ---- for libraries built on this one (MPI transports, libfabric providers) -------- */

/* Operation `tag`'s result if it ended, without waiting and without moving the clock:
 * EXANET_OK or its failure, with the modeled time it ended at in `*at_ps` (unless NULL);
 * EXANET_ETIMEDOUT while it is still going. The result is collected. For operations the
 * program does not wait for (the deliveries of messages a library keeps to send again):
 * taking them as the host delivered them would move the clock, and every later post, by
 * the host's timing. Where the program does wait for one, exanet_took_ps(ep, *at_ps). */
int exanet_result(const exanet_endpoint *ep, uint32_t tag, uint64_t *at_ps);

/* The program took an event of modeled time `at_ps` that a library kept for it: the clock
 * moves there if later, plus the rack's software cost of taking a message, as
 * exanet_recv would have moved it. Returns the clock (0 for NULL or a released handle). */
uint64_t exanet_took_ps(const exanet_endpoint *ep, uint64_t at_ps);

/* The program has nothing to do but wait for this endpoint until its next call, as a
 * progress loop between polls that found nothing: that host time is waiting, not
 * compute, and does not move the clock. Said inside a hold, it holds from where the
 * outermost hold ends. exanet_busy takes it back (a poll found something after all). */
int exanet_idle(const exanet_endpoint *ep);
int exanet_busy(const exanet_endpoint *ep);

/* The calling thread is inside a library built on this one until it calls exanet_unhold:
 * that time is the library's (the rack's software cost per call), not the program's
 * compute. Holds nest; each ends on the thread that began it (exanet_unhold without one:
 * EXANET_EINVAL). */
int exanet_hold(const exanet_endpoint *ep);
int exanet_unhold(const exanet_endpoint *ep);

/* Discards the result of operation `tag`, now or when it ends. */
int exanet_forget(const exanet_endpoint *ep, uint32_t tag);

/* Processes pending completions without waiting; returns how many (>= 0). */
int exanet_poll(const exanet_endpoint *ep);

/* Waits up to `timeout_us` for a completion notification of an RDMA write into this
 * rank's memory (see exanet_rdma_write for the record written at its VA):
 * EXANET_ETIMEDOUT if none came. */
int exanet_wait_notification(const exanet_endpoint *ep, int64_t timeout_us,
                             exanet_notification_t *out);

/* ---- collectives ---------------------------------------------------------------- */

/* A member of a group: node id and rank. */
typedef struct exanet_member_t {
    uint32_t node;
    uint8_t rank;
} exanet_member_t;

#define EXANET_OP_SUM 0
#define EXANET_OP_MIN 1
#define EXANET_OP_MAX 2
/* Element types, little-endian. */
#define EXANET_TYPE_I32 0
#define EXANET_TYPE_I64 1
#define EXANET_TYPE_F32 2
#define EXANET_TYPE_F64 3
/* EXANET_PATH_AUTO: the NI's allreduce accelerator when the group is whole QFDBs (a power
 * of two of them, one rank per node), else software. */
#define EXANET_PATH_AUTO 0
#define EXANET_PATH_ACCELERATOR 1
#define EXANET_PATH_SOFTWARE 2

/* Opens the rank's collectives: its collective mailbox (interface 48 + rank), a
 * packetizer, an RDMA page if one is free, and scratch memory. Every member of a group calls the group's collectives in
 * the same order, as MPI requires. See docs/collectives.md. */
int exanet_collectives_open(const exanet_endpoint *ep, exanet_collectives **out);
void exanet_collectives_close(exanet_collectives *c);
/* Software collectives send a step of up to `bytes` (default 32, ExaNet-MPI's eager limit;
 * at most 65535) as packetizer messages, a longer one by rendezvous: RTS, the receiver's
 * CTS, an RDMA write with a completion notification. Members may differ. */
int exanet_collectives_set_eager_limit(const exanet_collectives *c, uint32_t bytes);
/* Group `id` of `count` members in rank order, this rank among them; every member makes it
 * with the same id and members. */
int exanet_group_create(const exanet_collectives *c, uint16_t id, const exanet_member_t *members,
                        uint32_t count, exanet_group **out);
void exanet_group_free(exanet_group *g);
/* Every member gets the reduction of all members' `len` bytes at `in` (bit-identical on
 * every member) at `out`, which may be `in`. EXANET_EABORTED: another member failed. */
int exanet_allreduce(const exanet_collectives *c, const exanet_group *g, int op, int type,
                     const void *in, void *out, uint32_t len, int path);
/* The reduction at member `root`'s `out` (others' `out` untouched). */
int exanet_reduce(const exanet_collectives *c, const exanet_group *g, uint32_t root, int op,
                  int type, const void *in, void *out, uint32_t len);
/* Member `root`'s `len` bytes at `buf` into every member's `buf` (binomial tree). */
int exanet_bcast(const exanet_collectives *c, const exanet_group *g, uint32_t root, void *buf,
                 uint32_t len);
/* Returns once every member has entered it. */
int exanet_barrier(const exanet_collectives *c, const exanet_group *g);

/* ---- errors --------------------------------------------------------------------- */

/* A static description of an error code (never NULL). */
const char *exanet_strerror(int code);
/* The detailed message of the calling thread's last failure (never NULL; valid until the
 * thread's next exanet call). */
const char *exanet_last_error(void);
/* The NACK reason (EXANET_NACK_*) of the calling thread's last EXANET_ENACKED, else 0. */
int exanet_last_nack_reason(void);

#ifdef __cplusplus
}
#endif

#endif /* EXANET_H */
