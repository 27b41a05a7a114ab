//! The provider keeps libfabric's contract as the man pages state it (issue 53), checked
//! with programs written to libfabric alone, as libfabric's own test suite (fabtests,
//! which CI cannot fetch) checks providers:
//!
//! - fi_getinfo(3): with a node (a node name, its IP over ExaNet address, `localhost`)
//!   and a service, `dest_addr` names the endpoint that service names there; with
//!   `FI_SOURCE`, `src_addr` is this node's, and without a node or service too; what the
//!   provider cannot do is `-FI_ENODATA`, never another error; `FI_MR_BASIC` and
//!   `FI_MR_SCALABLE` are given as asked, and a v1.0 application gets one of them;
//!   every capability asked for that the provider has is in the answer, in `caps` and
//!   in the transmit or receive attributes, with nothing there that is not theirs.
//! - fi_endpoint(3): an endpoint opened from a server's `fi_info` has, by `fi_getname`,
//!   the address a client's `fi_getinfo` gave as `dest_addr`.
//! - fi_av(3): that address inserts, messages cross in both directions, removal and
//!   re-insertion work (at the freed index), `fi_av_insertsvc` and `fi_av_insertsym`
//!   insert by node and service, `fi_av_straddr` prints it.
//! - fi_cq(3): `fi_cq_signal` wakes a blocked `fi_cq_sread`, from another thread or
//!   before it.
//!
//! Needs `fi_info` (libfabric-bin) and libfabric's headers (libfabric-dev); without them
//! it says it skipped, unless `EXANET_REQUIRE_LIBFABRIC` is set (CI sets it).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use exanet_tests::{compile_fabric_c, run_with_timeout, TestRack};

const LIMIT: Duration = Duration::from_secs(90);

fn provider_dir(tmp: &Path) -> Option<PathBuf> {
    exanet_tests::provider_dir(tmp, "the libfabric contract test")
}

fn on(exe: &Path, args: &[&str], prov: &Path, rack: &Path, node: &str) -> Command {
    let mut c = Command::new(exe);
    c.args(args)
        .env("FI_PROVIDER_PATH", prov)
        .env("EXANET_RACK", rack)
        .env("EXANET_NODE", node)
        .env("FI_PROVIDER", "exanet")
        .env_remove("EXANET_JOB_KEY");
    c
}

fn compile(tmp: &Path, name: &str, src: &str) -> PathBuf {
    compile_fabric_c(tmp, name, src, &["-lpthread"])
}

const COMMON: &str = r#"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <pthread.h>
#include <time.h>
#include <rdma/fabric.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_cm.h>
#include <rdma/fi_errno.h>

#define CHECK(what, expr) do { long r_ = (long)(expr); if (r_ < 0) { \
    fprintf(stderr, "%s: %ld (%s)\n", what, r_, fi_strerror((int)-r_)); exit(1); } } while (0)
#define EXPECT(cond) do { if (!(cond)) { fprintf(stderr, "line %d: %s\n", __LINE__, #cond); exit(1); } } while (0)

static struct fi_info *hints_rdm(void) {
    struct fi_info *h = fi_allocinfo();
    h->ep_attr->type = FI_EP_RDM;
    h->caps = FI_MSG;
    h->fabric_attr->prov_name = strdup("exanet");
    return h;
}
"#;

/// fi_getinfo(3)'s answers in one process on M1QAF2: addresses by node and service,
/// declines, memory registration modes, capabilities; fi_cq(3)'s signal.
const GETINFO: &str = r#"
static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + t.tv_nsec / 1e9; }

static struct fid_cq *cq;
static void *signaller(void *arg) {
    (void)arg;
    struct timespec d = { 0, 200 * 1000 * 1000 };
    nanosleep(&d, NULL);
    fi_cq_signal(cq);
    return NULL;
}

int main(int argc, char **argv) {
    EXPECT(argc == 3); /* the peer's node name and IP over ExaNet address */
    struct fi_info *h = hints_rdm(), *info;
    /* The source: FI_SOURCE with a service, with a node naming this node, and none. */
    CHECK("getinfo source", fi_getinfo(FI_VERSION(1, 17), NULL, "9228", FI_SOURCE, h, &info));
    EXPECT(info->src_addr && info->src_addrlen == 8 && !info->dest_addr);
    unsigned char src[8]; memcpy(src, info->src_addr, 8);
    fi_freeinfo(info);
    CHECK("getinfo localhost", fi_getinfo(FI_VERSION(1, 17), "localhost", "9228", FI_SOURCE, h, &info));
    EXPECT(info->src_addrlen == 8 && memcmp(info->src_addr, src, 8) == 0);
    fi_freeinfo(info);
    CHECK("getinfo none", fi_getinfo(FI_VERSION(1, 17), NULL, NULL, 0, h, &info));
    EXPECT(info->src_addr && info->src_addrlen == 8 && !info->dest_addr);
    /* Same node as the service's source, any rank and mailbox. */
    EXPECT(memcmp(info->src_addr, src, 4) == 0);
    fi_freeinfo(info);
    /* The peer by name and by address: the same destination, the service's. */
    CHECK("getinfo by name", fi_getinfo(FI_VERSION(1, 17), argv[1], "9228", 0, h, &info));
    EXPECT(info->dest_addr && info->dest_addrlen == 8 && info->src_addrlen == 8);
    unsigned char dest[8]; memcpy(dest, info->dest_addr, 8);
    EXPECT(memcmp(dest, src, 4) != 0 && memcmp(dest + 4, src + 4, 4) == 0);
    printf("dest %02x%02x%02x%02x/%d/%d\n", dest[0], dest[1], dest[2], dest[3], dest[4], dest[5]);
    fi_freeinfo(info);
    CHECK("getinfo by address", fi_getinfo(FI_VERSION(1, 17), argv[2], "9228", 0, h, &info));
    EXPECT(memcmp(info->dest_addr, dest, 8) == 0);
    fi_freeinfo(info);
    /* Another service is another endpoint of the node. */
    CHECK("getinfo service 1", fi_getinfo(FI_VERSION(1, 17), argv[1], "1", 0, h, &info));
    EXPECT(memcmp(info->dest_addr, dest, 4) == 0 && memcmp(info->dest_addr, dest, 8) != 0);
    fi_freeinfo(info);
    /* What names nothing, and what is not offered: -FI_ENODATA, nothing else. */
    EXPECT(fi_getinfo(FI_VERSION(1, 17), "no-such-node.invalid", "9228", 0, h, &info) == -FI_ENODATA);
    EXPECT(fi_getinfo(FI_VERSION(1, 17), argv[1], "not-a-port", 0, h, &info) == -FI_ENODATA);
    EXPECT(fi_getinfo(FI_VERSION(1, 17), argv[1], "9228", FI_SOURCE, h, &info) == -FI_ENODATA);
    struct fi_info *d = fi_dupinfo(h);
    d->domain_attr->caps = FI_SHARED_AV;
    EXPECT(fi_getinfo(FI_VERSION(1, 17), NULL, NULL, 0, d, &info) == -FI_ENODATA);
    fi_freeinfo(d);
    d = fi_dupinfo(h); d->caps |= FI_ATOMIC;
    EXPECT(fi_getinfo(FI_VERSION(1, 17), NULL, NULL, 0, d, &info) == -FI_ENODATA);
    fi_freeinfo(d);
    d = fi_dupinfo(h); d->addr_format = FI_SOCKADDR_IN;
    EXPECT(fi_getinfo(FI_VERSION(1, 17), NULL, NULL, 0, d, &info) == -FI_ENODATA);
    fi_freeinfo(d);
    printf("addresses ok\n");
    /* Memory registration modes: the old ones as asked; v1.0 gets one of them. */
    int modes[] = { FI_MR_BASIC, FI_MR_SCALABLE };
    for (int k = 0; k < 2; k++) {
        d = fi_dupinfo(h); d->caps |= FI_RMA; d->domain_attr->mr_mode = modes[k];
        CHECK("getinfo mr", fi_getinfo(FI_VERSION(1, 17), NULL, NULL, 0, d, &info));
        EXPECT(info->domain_attr->mr_mode == modes[k]);
        fi_freeinfo(info);
        CHECK("getinfo mr v1.0", fi_getinfo(FI_VERSION(1, 0), NULL, NULL, 0, d, &info));
        EXPECT(info->domain_attr->mr_mode == modes[k]);
        fi_freeinfo(info); fi_freeinfo(d);
    }
    d = fi_dupinfo(h); d->caps |= FI_RMA; d->domain_attr->mr_mode = FI_MR_UNSPEC;
    CHECK("getinfo mr unspec v1.0", fi_getinfo(FI_VERSION(1, 0), NULL, NULL, 0, d, &info));
    EXPECT(info->domain_attr->mr_mode == FI_MR_BASIC || info->domain_attr->mr_mode == FI_MR_SCALABLE);
    fi_freeinfo(info); fi_freeinfo(d);
    printf("mr modes ok\n");
    /* Capabilities: each asked for is given, on the side it belongs to; domain-wide
     * ones only in the domain's attributes; multi-receive to hints that ask for it. */
    uint64_t asks[] = { FI_MSG, FI_TAGGED, FI_RMA, FI_DIRECTED_RECV, FI_MSG | FI_MULTI_RECV,
                        FI_TAGGED | FI_RMA | FI_DIRECTED_RECV };
    for (int k = 0; k < 6; k++) {
        d = fi_dupinfo(h); d->caps = asks[k];
        CHECK("getinfo caps", fi_getinfo(FI_VERSION(1, 17), NULL, NULL, 0, d, &info));
        EXPECT((info->caps & asks[k]) == asks[k]);
        uint64_t side = FI_LOCAL_COMM | FI_REMOTE_COMM | FI_SHARED_AV;
        EXPECT(!(info->tx_attr->caps & side) && !(info->rx_attr->caps & side));
        EXPECT(!(info->tx_attr->caps & ~info->caps) && !(info->rx_attr->caps & ~info->caps));
        EXPECT((info->rx_attr->caps & asks[k]) == asks[k]);
        uint64_t tx = asks[k] & (FI_MSG | FI_TAGGED | FI_RMA);
        EXPECT((info->tx_attr->caps & tx) == tx);
        EXPECT(!(info->caps & FI_DIRECTED_RECV) || (asks[k] & FI_DIRECTED_RECV));
        if (asks[k] & FI_RMA) EXPECT((info->caps & (FI_READ | FI_WRITE)) == (FI_READ | FI_WRITE));
        fi_freeinfo(info); fi_freeinfo(d);
    }
    d = fi_dupinfo(h); d->caps = FI_MSG | FI_MULTI_RECV; d->rx_attr->op_flags = FI_MULTI_RECV;
    CHECK("getinfo multi-recv flag", fi_getinfo(FI_VERSION(1, 17), NULL, NULL, 0, d, &info));
    EXPECT(info->rx_attr->op_flags & FI_MULTI_RECV);
    fi_freeinfo(info); fi_freeinfo(d);
    printf("caps ok\n");

    /* fi_cq_signal: before the read, and from another thread while it blocks. */
    CHECK("getinfo", fi_getinfo(FI_VERSION(1, 17), NULL, NULL, 0, h, &info));
    struct fid_fabric *fabric; struct fid_domain *domain;
    CHECK("fi_fabric", fi_fabric(info->fabric_attr, &fabric, NULL));
    CHECK("fi_domain", fi_domain(fabric, info, &domain, NULL));
    struct fi_cq_attr attr = { .format = FI_CQ_FORMAT_CONTEXT, .wait_obj = FI_WAIT_UNSPEC };
    CHECK("fi_cq_open", fi_cq_open(domain, &attr, &cq, NULL));
    struct fi_cq_entry e;
    CHECK("fi_cq_signal", fi_cq_signal(cq));
    double t = now();
    long n = fi_cq_sread(cq, &e, 1, NULL, 5000);
    EXPECT((n == -FI_EAGAIN || n == -FI_ECANCELED) && now() - t < 1.0);
    /* The signal was taken: a read now waits out its timeout. */
    t = now();
    EXPECT(fi_cq_sread(cq, &e, 1, NULL, 300) == -FI_EAGAIN && now() - t >= 0.29);
    pthread_t th;
    EXPECT(pthread_create(&th, NULL, signaller, NULL) == 0);
    t = now();
    n = fi_cq_sread(cq, &e, 1, NULL, -1);
    double waited = now() - t;
    pthread_join(th, NULL);
    EXPECT((n == -FI_EAGAIN || n == -FI_ECANCELED) && waited > 0.15 && waited < 2.0);
    printf("signal ok\n");
    CHECK("close cq", fi_close(&cq->fid));
    CHECK("close domain", fi_close(&domain->fid));
    CHECK("close fabric", fi_close(&fabric->fid));
    fi_freeinfo(info); fi_freeinfo(h);
    printf("ok\n");
    return 0;
}
"#;

/// A server and a client as libfabric's programs pair: the server opens the endpoint
/// its service names (`fi_getinfo(NULL, service, FI_SOURCE)`), the client finds it by
/// `fi_getinfo(node, service)` alone. Usage: `server SERVICE` or `client NODE SERVICE`.
const PAIR: &str = r#"
static struct fid_cq *cq;
static struct fid_ep *ep;
static struct fid_av *av;

static void wait_one(void *ctx) {
    struct fi_cq_entry e;
    for (;;) {
        long n = fi_cq_sread(cq, &e, 1, NULL, 30000);
        if (n == 1) { EXPECT(e.op_context == ctx); return; }
        if (n == -FI_EAVAIL) {
            struct fi_cq_err_entry err = {0};
            fi_cq_readerr(cq, &err, 0);
            fprintf(stderr, "completion failed: %d (%s)\n", err.err, fi_strerror(err.err));
            exit(1);
        }
        CHECK("fi_cq_sread", n);
    }
}
static void send_to(fi_addr_t to, const char *text) {
    int ctx;
    CHECK("fi_send", fi_send(ep, text, strlen(text) + 1, NULL, to, &ctx));
    wait_one(&ctx);
}
static void recv_expect(const char *text) {
    char buf[256]; int ctx;
    CHECK("fi_recv", fi_recv(ep, buf, sizeof buf, NULL, FI_ADDR_UNSPEC, &ctx));
    wait_one(&ctx);
    if (strcmp(buf, text)) { fprintf(stderr, "got %s, expected %s\n", buf, text); exit(1); }
}

int main(int argc, char **argv) {
    int server = !strcmp(argv[1], "server");
    struct fi_info *h = hints_rdm(), *info;
    h->domain_attr->av_type = FI_AV_TABLE;
    if (server)
        CHECK("fi_getinfo", fi_getinfo(FI_VERSION(1, 17), NULL, argv[2], FI_SOURCE, h, &info));
    else
        CHECK("fi_getinfo", fi_getinfo(FI_VERSION(1, 17), argv[2], argv[3], 0, h, &info));
    struct fid_fabric *fabric; struct fid_domain *domain;
    CHECK("fi_fabric", fi_fabric(info->fabric_attr, &fabric, NULL));
    CHECK("fi_domain", fi_domain(fabric, info, &domain, NULL));
    struct fi_cq_attr cq_attr = { .format = FI_CQ_FORMAT_CONTEXT, .wait_obj = FI_WAIT_UNSPEC };
    CHECK("fi_cq_open", fi_cq_open(domain, &cq_attr, &cq, NULL));
    struct fi_av_attr av_attr = { .type = FI_AV_TABLE };
    CHECK("fi_av_open", fi_av_open(domain, &av_attr, &av, NULL));
    CHECK("fi_endpoint", fi_endpoint(domain, info, &ep, NULL));
    CHECK("bind av", fi_ep_bind(ep, &av->fid, 0));
    CHECK("bind cq", fi_ep_bind(ep, &cq->fid, FI_TRANSMIT | FI_RECV));
    CHECK("fi_enable", fi_enable(ep));
    char name[64]; size_t len = sizeof name;
    CHECK("fi_getname", fi_getname(&ep->fid, name, &len));
    EXPECT(len == info->src_addrlen);
    char text[128]; size_t tlen = sizeof text;
    fi_av_straddr(av, name, text, &tlen);
    printf("name %s\n", text);
    fflush(stdout);
    if (server) {
        /* The endpoint is where the service said. */
        EXPECT(memcmp(name, info->src_addr, 8) == 0);
        /* A second endpoint cannot have the same address. */
        struct fid_ep *twin;
        EXPECT(fi_endpoint(domain, info, &twin, NULL) == -FI_EADDRINUSE);
        char peer[256]; int ctx;
        CHECK("fi_recv", fi_recv(ep, peer, sizeof peer, NULL, FI_ADDR_UNSPEC, &ctx));
        wait_one(&ctx);
        fi_addr_t client;
        EXPECT(fi_av_insert(av, peer, 1, &client, 0, NULL) == 1);
        send_to(client, "hello client");
        recv_expect("again");
        /* Removed and inserted again: the same index, and it still reaches the peer. */
        CHECK("fi_av_remove", fi_av_remove(av, &client, 1, 0));
        fi_addr_t again;
        EXPECT(fi_av_insert(av, peer, 1, &again, 0, NULL) == 1 && again == client);
        send_to(again, "reinserted");
        recv_expect("bye");
    } else {
        EXPECT(info->dest_addr && info->dest_addrlen == 8);
        fi_addr_t srv, by_svc, sym[4];
        EXPECT(fi_av_insert(av, info->dest_addr, 1, &srv, 0, NULL) == 1);
        tlen = sizeof text;
        fi_av_straddr(av, info->dest_addr, text, &tlen);
        printf("server %s\n", text);
        /* The same endpoint by node and service; and four services from it. */
        EXPECT(fi_av_insertsvc(av, argv[2], argv[3], &by_svc, 0, NULL) == 1);
        EXPECT(fi_av_insertsym(av, argv[2], 2, argv[3], 2, sym, 0, NULL) == 4);
        char a[8], b[8]; size_t la = 8, lb = 8;
        CHECK("lookup", fi_av_lookup(av, srv, a, &la));
        CHECK("lookup", fi_av_lookup(av, by_svc, b, &lb));
        EXPECT(memcmp(a, b, 8) == 0 && memcmp(a, info->dest_addr, 8) == 0);
        CHECK("lookup", fi_av_lookup(av, sym[0], b, &lb));
        EXPECT(memcmp(a, b, 8) == 0);
        CHECK("lookup", fi_av_lookup(av, sym[1], b, &lb));
        EXPECT(memcmp(a, b, 5) == 0 && b[5] == a[5] + 1);
        CHECK("lookup", fi_av_lookup(av, sym[2], b, &lb));
        EXPECT(memcmp(a, b, 3) == 0 && b[3] == a[3] + 1 && memcmp(a + 4, b + 4, 4) == 0);
        /* An address of a node with no endpoint in it does not insert. */
        fi_addr_t none = 0;
        EXPECT(fi_av_insert(av, info->src_addr, 1, &none, 0, NULL) == 0 && none == FI_ADDR_NOTAVAIL);
        /* Our own name, so that the server can answer. */
        int ctx;
        CHECK("fi_send name", fi_send(ep, name, len, NULL, srv, &ctx));
        wait_one(&ctx);
        recv_expect("hello client");
        send_to(by_svc, "again");
        recv_expect("reinserted");
        send_to(srv, "bye");
    }
    printf("ok\n");
    fi_close(&ep->fid); fi_close(&av->fid); fi_close(&cq->fid);
    fi_close(&domain->fid); fi_close(&fabric->fid);
    fi_freeinfo(info); fi_freeinfo(h);
    return 0;
}
"#;

#[test]
fn getinfo_answers_hints_and_addresses_as_the_man_pages_say() {
    let tmp = tempfile::tempdir().unwrap();
    let Some(prov) = provider_dir(tmp.path()) else {
        return;
    };
    let rack = TestRack::new("fi-contract");
    rack.up("2x1x1", 60);
    let exe = compile(tmp.path(), "getinfo", &format!("{COMMON}{GETINFO}"));
    // M1QBF3 is node 6: its IP over ExaNet address is the rack subnet's seventh.
    let r = run_with_timeout(
        on(&exe, &["M1QBF3", "10.200.0.7"], &prov, &rack.dir, "M1QAF2"),
        LIMIT,
    )
    .unwrap();
    assert!(r.success(), "{}", r.describe());
    // Node 6, service 9228: rank 3, mailbox 11 (see exanet-fi/src/av.rs).
    assert!(r.stdout.contains("dest 00000006/3/11"), "{}", r.stdout);
    for line in ["addresses ok", "mr modes ok", "caps ok", "signal ok"] {
        assert!(r.stdout.contains(line), "{line}: {}", r.describe());
    }
    rack.down().unwrap();
}

#[test]
fn a_client_finds_its_server_by_node_and_service() {
    let tmp = tempfile::tempdir().unwrap();
    let Some(prov) = provider_dir(tmp.path()) else {
        return;
    };
    let rack = TestRack::new("fi-pair");
    rack.up("2x1x1", 60);
    let exe = compile(tmp.path(), "pair", &format!("{COMMON}{PAIR}"));
    // By node name, and by IP over ExaNet address, each on a service of its own.
    for (target, service) in [("M1QBF3", "9228"), ("10.200.0.7", "40")] {
        let server = on(&exe, &["server", service], &prov, &rack.dir, "M1QBF3");
        let server = std::thread::spawn(move || run_with_timeout(server, LIMIT).unwrap());
        std::thread::sleep(Duration::from_millis(500));
        let client = run_with_timeout(
            on(
                &exe,
                &["client", target, service],
                &prov,
                &rack.dir,
                "M1QAF2",
            ),
            LIMIT,
        )
        .unwrap();
        let server = server.join().unwrap();
        assert!(
            client.success() && client.stdout.ends_with("ok\n"),
            "client of {target}: {}\nserver: {}",
            client.describe(),
            server.describe()
        );
        assert!(
            server.success() && server.stdout.ends_with("ok\n"),
            "server: {}",
            server.describe()
        );
        let svc: u32 = service.parse().unwrap();
        let (rank, vi) = (((svc - 1) % 336) / 48, (svc - 1) % 48);
        let want = format!("exanet://M1QBF3:{}/{rank}/{vi}", (svc - 1) % 336 + 1);
        assert!(
            server.stdout.contains(&format!("name {want}")),
            "{want} in {}",
            server.stdout
        );
        assert!(
            client.stdout.contains(&format!("server {want}")),
            "{want} in {}",
            client.stdout
        );
    }
    rack.down().unwrap();
}
