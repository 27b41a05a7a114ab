//! The client library against a fake daemon (tests/common: the daemon's I/O shell around
//! the core's workload service and NI, on a simulated rack): attach, name resolution,
//! messages and RDMA through the rings, completion status mapping, client-side checks, and
//! a daemon that corrupts the rings or goes away. No rack needed.

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{Behavior, Fake, GOOD_KEY, NODE, NODE_ID, PDID, RANK};
use exanet::error::codes;
use exanet::{Endpoint, Error, Gvas, NackReason, NodeId, OpError, Pdid};

const T: Option<Duration> = Some(Duration::from_secs(5));

fn attach(f: &Fake) -> Endpoint {
    Endpoint::attach_to(&f.dir, NODE, None).expect("attach to the fake daemon")
}

#[test]
fn attach_reports_what_the_daemon_gave_and_resolves_names() {
    let f = Fake::start("attach", Behavior::Serve);
    // Lower case is fine: the socket is named after the canonical spelling.
    let ep = Endpoint::attach_to(&f.dir, "m1qaf2", Some(GOOD_KEY)).unwrap();
    assert_eq!(ep.node(), NODE);
    assert_eq!(ep.node_id(), NodeId(NODE_ID));
    assert_eq!(ep.rank(), RANK);
    assert_eq!(ep.pdid(), Pdid(PDID));
    assert_eq!(ep.nodes(), 8);
    assert_eq!(ep.shape().unwrap().to_string(), "2x1x1");
    assert_eq!(ep.node_by_name("M1QBF3").unwrap(), NodeId(6));
    assert_eq!(ep.node_by_name("m1qaf1").unwrap(), NodeId(0));
    assert_eq!(ep.node_name(NodeId(6)).unwrap(), "M1QBF3");
    for bad in ["M2QAF1", "M1QCF1", "M1QAF5", "nonsense", ""] {
        let e = ep.node_by_name(bad).unwrap_err();
        assert!(matches!(e, Error::UnknownNode { .. }), "{bad}: {e:?}");
        assert_eq!(e.code(), codes::UNKNOWN_NODE);
    }
    assert!(matches!(
        ep.addr(NodeId(8), 0, 0),
        Err(Error::BadNode { id: 8, nodes: 8 })
    ));
    assert!(matches!(ep.addr(NodeId(1), 8, 0), Err(Error::BadRank(8))));
    assert_eq!(
        ep.addr(NodeId(1), 8, 0).unwrap_err().code(),
        codes::BAD_RANK
    );
    assert!(matches!(
        ep.addr(NodeId(1), 0, 1 << 39),
        Err(Error::BadAddress(_))
    ));
    assert!(matches!(
        ep.mailbox_addr(NodeId(1), 0, 64),
        Err(Error::BadAddress(_))
    ));
    let g = ep.mailbox_addr(NodeId(6), 2, 5).unwrap();
    assert_eq!(
        (g.pdid(), g.node(), g.rank(), g.va()),
        (Pdid(PDID), NodeId(6), 2, exanet::MAILBOX_WINDOW | 5)
    );
}

#[test]
fn unknown_job_key_and_missing_daemon_are_typed_errors() {
    let f = Fake::start("key", Behavior::Serve);
    let e = Endpoint::attach_to(&f.dir, NODE, Some("not-a-job")).unwrap_err();
    assert!(
        matches!(&e, Error::AttachRefused(m) if m.contains("unknown job key")),
        "{e:?}"
    );
    assert_eq!(e.code(), codes::ATTACH_REFUSED);
    let e = Endpoint::attach_to(&f.dir, "M1QBF3", None).unwrap_err();
    assert!(matches!(e, Error::Unreachable { .. }), "{e:?}");
    assert_eq!(e.code(), codes::UNREACHABLE);
    let e = Endpoint::attach_to(&f.dir, "Q1", None).unwrap_err();
    assert!(matches!(e, Error::UnknownNode { .. }), "{e:?}");
}

#[test]
fn messages_reach_their_own_mailbox_in_order() {
    let f = Fake::start("mbox", Behavior::Serve);
    let ep = attach(&f);
    let a = ep.mailbox(16).unwrap();
    let b = ep.mailbox(16).unwrap();
    assert_ne!(a.vi(), b.vi());
    let tx = ep.packetizer().unwrap();
    let mut tags = Vec::new();
    for i in 0..20u8 {
        let (mb, ch) = if i % 2 == 0 { (&a, 0) } else { (&b, 1) };
        // Wait for the channel's previous message before reusing it.
        if tags.len() >= 2 {
            let t = tags.remove(0);
            ep.wait(t, T).unwrap();
        }
        tags.push(tx.send(ch, mb.addr(), &[i; 3]).unwrap());
    }
    for t in tags {
        ep.wait(t, T).unwrap();
    }
    for (mb, first) in [(&a, 0u8), (&b, 1u8)] {
        for k in 0..10u8 {
            let m = mb.recv(T).unwrap();
            assert_eq!(m.payload, vec![first + 2 * k; 3]);
            assert_eq!(
                (m.src_node, m.src_rank, m.vi),
                (NodeId(NODE_ID), ep.rank(), mb.vi())
            );
        }
        assert!(mb.try_recv().unwrap().is_none());
    }
    // Empty and full-size payloads; send_any picks a free channel.
    for n in [0usize, 1, 64] {
        let t = tx.send_any(a.addr(), &vec![9; n]).unwrap();
        ep.wait(t, T).unwrap();
        assert_eq!(a.recv(T).unwrap().payload.len(), n);
    }
    assert!(matches!(
        a.recv(Some(Duration::from_millis(30))),
        Err(Error::Timeout)
    ));
    // A collected tag is gone.
    let t = tx.send(2, a.addr(), b"x").unwrap();
    ep.wait(t, T).unwrap();
    assert!(matches!(ep.wait(t, T), Err(Error::UnknownTag(_))));
    assert_eq!(ep.in_flight(), 0);
}

#[test]
fn completion_statuses_map_to_op_errors() {
    let f = Fake::start("status", Behavior::Serve);
    let ep = attach(&f);
    let tx = ep.packetizer().unwrap();
    // A rank of another node that nobody attached: NACK no_context (transient), after the
    // NI's retries.
    let t = tx
        .send(0, ep.mailbox_addr(NodeId(0), 0, 0).unwrap(), b"hi")
        .unwrap();
    let e = ep.wait(t, T).unwrap_err();
    let op = e.op_error().expect("an operation failure");
    assert_eq!(
        op,
        OpError::Nacked {
            reason: Some(NackReason::NoContext),
            code: 2
        }
    );
    assert!(op.transient());
    assert_eq!(e.code(), codes::NACKED);
    // A mailbox index past the NI's: bad address.
    let t = tx
        .send(
            1,
            ep.addr(NodeId(NODE_ID), ep.rank(), exanet::MAILBOX_WINDOW | 200)
                .unwrap(),
            b"",
        )
        .unwrap();
    let op = ep.wait(t, T).unwrap_err().op_error().unwrap();
    assert!(matches!(
        op,
        OpError::Nacked {
            reason: Some(NackReason::BadAddress),
            ..
        }
    ));
    assert!(!op.transient());
    // A node whose links lose every cell: network timeout, after every retransmission.
    f.isolate(5);
    let t = tx
        .send(2, ep.mailbox_addr(NodeId(5), 0, 0).unwrap(), b"")
        .unwrap();
    let e = ep.wait(t, T).unwrap_err();
    assert_eq!(e.op_error(), Some(OpError::TimedOut));
    assert_eq!(e.code(), codes::NET_TIMEOUT);
    // The raw mapping, including codes this library does not know.
    assert_eq!(OpError::from_status(0, 0), Ok(()));
    assert_eq!(OpError::from_status(3, 0), Err(OpError::LocalFault));
    assert_eq!(
        OpError::from_status(4, 9),
        Err(OpError::Refused { code: 9 })
    );
    assert_eq!(
        OpError::from_status(1, 200),
        Err(OpError::Nacked {
            reason: None,
            code: 200
        })
    );
    assert_eq!(
        OpError::from_status(77, 1),
        Err(OpError::Unknown {
            status: 77,
            reason: 1
        })
    );
}

#[test]
fn bad_requests_are_refused_client_side() {
    let f = Fake::start("client-side", Behavior::Silent);
    let ep = attach(&f);
    let tx = ep.packetizer().unwrap();
    let me = ep.mailbox_addr(NodeId(NODE_ID), ep.rank(), 0).unwrap();
    let e = tx.send(0, me, &[0; 65]).unwrap_err();
    assert!(matches!(e, Error::PayloadTooLong { len: 65, max: 64 }));
    assert_eq!(e.code(), codes::TOO_LONG);
    let e = tx.send(4, me, b"").unwrap_err();
    assert!(matches!(e, Error::BadChannel { ch: 4, count: 4 }), "{e:?}");
    // The range as exanet.h writes it: channels 0 to 3.
    assert_eq!(e.to_string(), "channel 4 does not exist (0..3)");
    assert_eq!(e.code(), codes::BAD_CHANNEL);
    // A GVAS of another protection domain.
    let foreign = Gvas::new(Pdid(PDID + 1), NodeId(0), 0, exanet::MAILBOX_WINDOW).unwrap();
    let e = tx.send(0, foreign, b"").unwrap_err();
    assert!(matches!(e, Error::ForeignPdid { pdid, own } if pdid == PDID + 1 && own == PDID));
    assert_eq!(e.code(), codes::FOREIGN_PDID);
    let outside = Gvas::new(Pdid(PDID), NodeId(100), 0, 0).unwrap();
    assert!(matches!(
        tx.send(0, outside, b""),
        Err(Error::BadNode { .. })
    ));
    // The daemon never answers: the channel stays busy, waits time out.
    let t = tx.send(0, me, b"1").unwrap();
    let e = tx.send(0, me, b"2").unwrap_err();
    assert!(matches!(e, Error::ChannelBusy { ch: 0, tag, .. } if tag == t.raw()));
    assert_eq!(e.code(), codes::BUSY);
    let start = Instant::now();
    assert!(matches!(
        ep.wait(t, Some(Duration::from_millis(50))),
        Err(Error::Timeout)
    ));
    assert!(start.elapsed() < Duration::from_secs(2));
    assert_eq!(ep.in_flight(), 1);
    ep.forget(t).unwrap();
    assert!(matches!(
        ep.wait(Tag::from_raw(999_999), T),
        Err(Error::UnknownTag(999_999))
    ));
    // RDMA checks.
    let mem = ep.register(8192).unwrap();
    let page = ep.rdma_page().unwrap();
    let dst = ep.addr(NodeId(NODE_ID), ep.rank(), mem.va()).unwrap();
    let e = page.write(32, &mem, 0, dst, 1, None).unwrap_err();
    assert!(
        matches!(e, Error::BadChannel { ch: 32, count: 32 }),
        "{e:?}"
    );
    assert_eq!(e.to_string(), "channel 32 does not exist (0..31)");
    let e = page.read(40, dst, &mem, 0, 1).unwrap_err();
    assert_eq!(e.to_string(), "channel 40 does not exist (0..31)");
    assert!(matches!(
        page.write(0, &mem, 0, dst, 0, None),
        Err(Error::BadLength { .. })
    ));
    assert!(matches!(
        page.write(0, &mem, 4096, dst, 4097, None),
        Err(Error::OutOfBounds { .. })
    ));
    assert!(matches!(
        page.read(0, dst, &mem, 8192, 1),
        Err(Error::OutOfBounds { .. })
    ));
    assert!(matches!(
        page.write(0, &mem, 0, dst, 1, Some(1 << 39)),
        Err(Error::BadAddress(_))
    ));
    let far = ep.addr(NodeId(NODE_ID), ep.rank(), (1 << 39) - 10).unwrap();
    assert!(matches!(
        page.write(0, &mem, 0, far, 100, None),
        Err(Error::BadAddress(_))
    ));
    // A region of another endpoint.
    let other = attach(&f);
    let theirs = other.register(4096).unwrap();
    assert!(matches!(
        page.write(0, &theirs, 0, dst, 1, None),
        Err(Error::ForeignRegion)
    ));
    assert!(matches!(ep.register(0), Err(Error::BadLength { .. })));
    assert!(matches!(ep.mailbox(0), Err(Error::BadLength { .. })));
    // Local accessors are bounds-checked.
    assert!(matches!(
        mem.write(8190, &[1, 2, 3]),
        Err(Error::OutOfBounds { .. })
    ));
    assert!(matches!(
        mem.to_vec(u64::MAX, 2),
        Err(Error::OutOfBounds { .. })
    ));
}

use exanet::Tag;

#[test]
fn rdma_write_and_read_move_every_byte() {
    let f = Fake::start("rdma", Behavior::Serve);
    let ep = attach(&f);
    let len = 256 * 1024 + 13;
    let a = ep.register(len).unwrap();
    let b = ep.register(len).unwrap();
    // The NI writes the notification into the destination rank's memory.
    let flag = ep.register(16).unwrap();
    assert!(a.va() != b.va());
    let data: Vec<u8> = (0..len).map(|i| (i * 7 % 251) as u8).collect();
    a.write(0, &data).unwrap();
    let page = ep.rdma_page().unwrap();
    let dst = b.gvas(0).unwrap();
    let t = page.write(3, &a, 0, dst, len, Some(flag.va())).unwrap();
    ep.wait(t, T).unwrap();
    assert_eq!(b.to_vec(0, len).unwrap(), data);
    let n = ep.wait_notification(T).unwrap();
    assert_eq!((n.va, n.len, n.src_node), (flag.va(), len, NodeId(NODE_ID)));
    assert!(ep.try_notification().unwrap().is_none());
    // As Endpoint::write says: kind 1, status 0, the transfer id, the length (big-endian).
    let note = flag.to_vec(0, 16).unwrap();
    assert_eq!(note[..4], [1, 0, 0, 0]);
    assert_eq!(note[8..], len.to_be_bytes());
    // Read it back into a, shifted by one byte.
    a.write(0, &vec![0; len as usize]).unwrap();
    let t = page.read(3, b.gvas(1).unwrap(), &a, 0, len - 1).unwrap();
    ep.wait(t, T).unwrap();
    assert_eq!(a.to_vec(0, len - 1).unwrap(), data[1..]);
    // Unregistered destination memory (regions follow each other from the first, 2 MiB
    // aligned; nothing is registered 1 GiB past the last): page fault NACK, after the NI's
    // retries.
    let hole = ep
        .addr(NodeId(NODE_ID), ep.rank(), flag.va() + (1 << 30))
        .unwrap();
    let t = page.write(0, &a, 0, hole, 10, None).unwrap();
    let op = ep.wait(t, T).unwrap_err().op_error().unwrap();
    assert!(matches!(
        op,
        OpError::Nacked {
            reason: Some(NackReason::PageFault),
            ..
        }
    ));
}

#[test]
fn threads_share_an_endpoint() {
    let f = Fake::start("threads", Behavior::Serve);
    let ep = Arc::new(attach(&f));
    let inbox = Arc::new(ep.mailbox(1024).unwrap());
    let tx = Arc::new(ep.packetizer().unwrap());
    // A receiver blocked in recv must not stop senders from making progress.
    let receiver = {
        let inbox = inbox.clone();
        std::thread::spawn(move || {
            let mut got = Vec::new();
            while got.len() < 400 {
                got.push(inbox.recv(T).unwrap().payload);
            }
            got
        })
    };
    let senders: Vec<_> = (0..4u8)
        .map(|k| {
            let (ep, tx, addr) = (ep.clone(), tx.clone(), inbox.addr());
            std::thread::spawn(move || {
                for i in 0..100u8 {
                    let t = tx.send_any(addr, &[k, i]).unwrap();
                    ep.wait(t, T).unwrap();
                }
            })
        })
        .collect();
    for s in senders {
        s.join().unwrap();
    }
    let got = receiver.join().unwrap();
    assert_eq!(got.len(), 400);
    // Per sender, in order.
    for k in 0..4u8 {
        let mine: Vec<u8> = got.iter().filter(|p| p[0] == k).map(|p| p[1]).collect();
        assert_eq!(mine, (0..100).collect::<Vec<u8>>());
    }
}

fn broken_ring(behavior: Behavior) -> Error {
    let f = Fake::start("corrupt", behavior);
    let ep = attach(&f);
    let mb = ep.mailbox(4).unwrap();
    let tx = ep.packetizer().unwrap();
    let t = tx.send(0, mb.addr(), b"x").unwrap();
    let e = ep.wait(t, T).unwrap_err();
    // The endpoint stays unusable, and says why.
    let again = tx.send(1, mb.addr(), b"y").unwrap_err();
    assert!(matches!(again, Error::Broken(_)), "{again:?}");
    assert_eq!(again.code(), codes::CORRUPT);
    assert!(matches!(mb.recv(T), Err(Error::Broken(_))));
    e
}

#[test]
fn corrupt_completion_rings_are_errors_not_panics() {
    for b in [
        Behavior::ShortSlot,
        Behavior::UnknownKind,
        Behavior::RunawayTail,
    ] {
        let e = broken_ring(b);
        assert!(matches!(e, Error::Corrupt(_)), "{b:?}: {e:?}");
        assert_eq!(e.code(), codes::CORRUPT);
    }
}

#[test]
fn a_daemon_that_goes_away_is_noticed() {
    let f = Fake::start("die", Behavior::Die);
    let ep = attach(&f);
    let mb = ep.mailbox(4).unwrap();
    let tx = ep.packetizer().unwrap();
    let t = tx.send(0, mb.addr(), b"x").unwrap();
    let start = Instant::now();
    let e = ep.wait(t, Some(Duration::from_secs(10))).unwrap_err();
    assert!(matches!(e, Error::Disconnected), "{e:?}");
    assert!(
        start.elapsed() < Duration::from_secs(3),
        "{:?}",
        start.elapsed()
    );
    assert_eq!(e.code(), codes::DISCONNECTED);
    assert!(matches!(ep.packetizer(), Err(Error::Broken(_))));
}

#[test]
fn dropping_the_endpoint_detaches() {
    let f = Fake::start("detach", Behavior::Serve);
    let ep = attach(&f);
    let mb = ep.mailbox(4).unwrap();
    drop(ep);
    assert!(matches!(mb.try_recv(), Err(Error::Broken(_))));
    // The daemon sees the connection close and frees the rank.
    let deadline = Instant::now() + Duration::from_secs(5);
    while f.attached() > 0 {
        assert!(Instant::now() < deadline, "the rank was never freed");
        std::thread::sleep(Duration::from_millis(5));
    }
    // The node can be attached again, on the same rank.
    let ep = attach(&f);
    assert_eq!(ep.rank(), RANK);
    ep.packetizer().unwrap();
    assert_eq!(f.attaches.load(std::sync::atomic::Ordering::Relaxed), 2);
}

#[test]
fn spin_budget_is_a_setting() {
    let f = Fake::start("spin", Behavior::Serve);
    let ep = attach(&f);
    // EXANET_SPIN_US is not set by the test harness; the default applies.
    if std::env::var_os("EXANET_SPIN_US").is_none() {
        assert_eq!(ep.spin(), exanet::config::DEFAULT_SPIN);
    }
    ep.set_spin(Duration::ZERO);
    assert_eq!(ep.spin(), Duration::ZERO);
    // Sleeping right away still works.
    let mb = ep.mailbox(4).unwrap();
    let tx = ep.packetizer().unwrap();
    for _ in 0..10 {
        let t = tx.send(0, mb.addr(), b"z").unwrap();
        ep.wait(t, T).unwrap();
        mb.recv(T).unwrap();
    }
    assert!(ep.stats().completions >= 20);
    let ep2 = Endpoint::attach_with(&exanet::Config {
        rack_dir: Some(f.dir.clone()),
        node: Some(NODE.into()),
        spin: Some(Duration::from_micros(500)),
        ..Default::default()
    })
    .unwrap();
    assert_eq!(ep2.spin(), Duration::from_micros(500));
}

fn attach_scaled(f: &Fake, ppm: u64) -> Endpoint {
    Endpoint::attach_with(&exanet::Config {
        rack_dir: Some(f.dir.clone()),
        node: Some(NODE.into()),
        compute_scale_ppm: Some(ppm),
        ..exanet::Config::default()
    })
    .expect("attach to the fake daemon")
}

/// The endpoint's modeled clock: a post costs the daemon's software cost per call, what
/// the program takes moves the clock to the event's modeled time, and host time between
/// calls counts as the CPU time the program spent, as far as the compute scale says.
#[test]
fn the_modeled_clock_follows_what_the_program_takes() {
    use common::FAKE_SOFTWARE_PS;
    let f = Fake::start("clock", Behavior::Serve);
    let ep = attach_scaled(&f, 0);
    assert_eq!(ep.clock().ps(), 0);
    let mb = ep.mailbox(4).unwrap();
    let tx = ep.packetizer().unwrap();
    let t = tx.send(0, mb.addr(), b"tick").unwrap();
    let acked = ep.wait_modeled(t, T).unwrap();
    // Posted after one call's software; the NI, the loopback and the answer follow.
    assert!(acked.ps() > FAKE_SOFTWARE_PS, "{acked}");
    assert!(acked.ps() < FAKE_SOFTWARE_PS + 2_000_000, "{acked}");
    assert_eq!(ep.clock(), acked);
    let m = mb.recv(T).unwrap();
    assert!(m.at.ps() > FAKE_SOFTWARE_PS && m.at.ps() < acked.ps() + 2_000_000);
    assert_eq!(ep.clock(), acked.max(m.at) + FAKE_SOFTWARE_PS);
    // Host time between calls: none of it counts at scale 0 ...
    let before = ep.clock();
    std::thread::sleep(Duration::from_millis(30));
    let t = tx.send(0, mb.addr(), b"tock").unwrap();
    let at = ep.wait_modeled(t, T).unwrap();
    assert!(
        at.ps() - before.ps() < 2_000_000 + FAKE_SOFTWARE_PS,
        "{at} after {before}"
    );
    mb.recv(T).unwrap();
    // ... and at scale 1, the CPU time the program spent between calls: not the time it
    // slept, nor what the host gave to other programs.
    let ep1 = attach_scaled(&f, 1_000_000);
    let mb1 = ep1.mailbox(4).unwrap();
    let tx1 = ep1.packetizer().unwrap();
    let t = tx1.send(0, mb1.addr(), b"a").unwrap();
    ep1.wait_modeled(t, T).unwrap();
    let before = ep1.clock();
    std::thread::sleep(Duration::from_millis(30));
    let t = tx1.send(0, mb1.addr(), b"b").unwrap();
    let at = ep1.wait_modeled(t, T).unwrap();
    // The CPU of a sleep call and its return: well under a millisecond.
    assert!(
        at.ps() - before.ps() < 1_000_000_000 + 2_000_000 + FAKE_SOFTWARE_PS,
        "slept: {at} after {before}"
    );
    let before = ep1.clock();
    let left = std::time::Instant::now();
    let cpu = || {
        let t = nix::time::clock_gettime(nix::time::ClockId::CLOCK_THREAD_CPUTIME_ID).unwrap();
        Duration::from(t)
    };
    // Computes for `ms` of host time; what it spent on a CPU.
    let spin = |ms: u64| {
        let t0 = std::time::Instant::now();
        let cpu0 = cpu();
        let mut x = 0u64;
        while t0.elapsed() < Duration::from_millis(ms) {
            x = std::hint::black_box(x.wrapping_mul(6364136223846793005).wrapping_add(1));
        }
        cpu() - cpu0
    };
    let spun = spin(30);
    let t = tx1.send(0, mb1.addr(), b"c").unwrap();
    let wall = left.elapsed();
    let at = ep1.wait_modeled(t, T).unwrap();
    let ps = |d: Duration| d.as_nanos() as u64 * 1000;
    assert!(
        at.ps() - before.ps() >= ps(spun),
        "spun {spun:?}: {at} after {before}"
    );
    assert!(
        at.ps() - before.ps() <= ps(wall) + 2_000_000 + FAKE_SOFTWARE_PS,
        "spun {spun:?} in {wall:?}: {at} after {before}"
    );
    // A thread that uses two endpoints: what it computed between its calls of one counts
    // for that one, whatever it called in between.
    let ep2 = attach_scaled(&f, 1_000_000);
    let before2 = ep2.advance_clock(exanet::ModelTime(0));
    let before = ep1.advance_clock(exanet::ModelTime(0));
    let spun = spin(20);
    // Each endpoint is a rank of the program: both computed it.
    let in_between = ep2.advance_clock(exanet::ModelTime(0));
    assert!(
        in_between.ps() - before2.ps() >= ps(spun),
        "{in_between} after {before2}"
    );
    let after = ep1.advance_clock(exanet::ModelTime(0));
    assert!(
        after.ps() - before.ps() >= ps(spun),
        "spun {spun:?}: {after} after {before}"
    );
    // Inside a library built on this one (a hold), with calls nested in it, the CPU is
    // that library's, not compute: nothing moves the clock but what follows the hold.
    let before = ep1.advance_clock(exanet::ModelTime(0));
    {
        let _held = ep1.hold();
        for _ in 0..2 {
            spin(15);
            ep1.advance_clock(exanet::ModelTime(0));
        }
    }
    let after = ep1.advance_clock(exanet::ModelTime(0));
    assert!(
        after.ps() - before.ps() < 2_000_000_000,
        "30 ms inside a hold: {after} after {before}"
    );
    // Idle said inside a hold (a provider's poll that found nothing) holds from where the
    // hold ends: the program's CPU until its next call is waiting, not compute ...
    let before = ep1.advance_clock(exanet::ModelTime(0));
    {
        let _held = ep1.hold();
        ep1.advance_clock(exanet::ModelTime(0));
        ep1.idle();
        // A call nested after it ends before the hold does: still idle.
        ep1.advance_clock(exanet::ModelTime(0));
    }
    let spun = spin(20);
    let after = ep1.advance_clock(exanet::ModelTime(0));
    assert!(
        after.ps() - before.ps() < 2_000_000_000,
        "spun {spun:?} after an idle hold: {after} after {before}"
    );
    // ... and only until that call: the same after a hold without it is compute.
    {
        let _held = ep1.hold();
        ep1.advance_clock(exanet::ModelTime(0));
    }
    let before = ep1.advance_clock(exanet::ModelTime(0));
    let spun = spin(20);
    let after = ep1.advance_clock(exanet::ModelTime(0));
    assert!(
        after.ps() - before.ps() >= ps(spun),
        "spun {spun:?} after a hold: {after} after {before}"
    );
}

/// Members start when they start: one sends before the others have opened their
/// collective mailboxes, and the collective still completes (the refused messages go again
/// while the sender waits, since a peer may need them before it sends what it waits for).
#[test]
fn a_member_that_opens_its_collectives_late_is_waited_for() {
    use exanet::collective::{DataType, Path, ReduceOp};
    let f = Fake::start("latecoll", Behavior::Serve);
    let eps: Vec<Endpoint> = (0..4).map(|_| attach(&f)).collect();
    let members: Vec<_> = eps.iter().map(|e| (e.node_id(), e.rank())).collect();
    let one = 1.5f64.to_le_bytes();
    let want = 6.0f64.to_le_bytes().to_vec();
    std::thread::scope(|s| {
        let runs: Vec<_> = eps
            .iter()
            .enumerate()
            .map(|(i, ep)| {
                let members = &members;
                s.spawn(move || {
                    if i > 0 {
                        std::thread::sleep(Duration::from_millis(300));
                    }
                    let c = ep.collectives().unwrap();
                    let g = c.group(3, members).unwrap();
                    c.allreduce(&g, ReduceOp::Sum, DataType::F64, &one, Path::Software)
                })
            })
            .collect();
        for (i, r) in runs.into_iter().enumerate() {
            assert_eq!(r.join().unwrap().unwrap(), want, "member {i}");
        }
    });
    // Each member's library told the daemon, for the node's metrics, when its
    // collectives closed.
    assert_eq!(
        f.collective_counts().get(&("allreduce", "software")),
        Some(&(4, 4, 0)),
        "{:?}",
        f.collective_counts()
    );
}

/// What a library on top (the libfabric provider) takes for its own bookkeeping does not
/// move the modeled clock, and of the free channels a send takes the one freed earliest
/// in modeled time: otherwise which ACKs the host happened to have delivered before the
/// next post would move that post, and every figure after it (a ping-pong's one-way
/// varied run to run under load).
#[test]
fn bookkeeping_and_the_choice_of_channel_leave_the_clock_to_the_program() {
    use common::FAKE_SOFTWARE_PS;
    let f = Fake::start("unclocked", Behavior::Serve);
    let ep = attach_scaled(&f, 0);
    let tx = ep.packetizer().unwrap();
    // A mailbox across the torus, with nobody there: each message is answered (NACKed)
    // later in modeled time than the next post. Channels 2, 1, 0 in turn: their answers
    // come in that order, channel 0's the latest.
    let far = ep.mailbox_addr(NodeId(6), 0, 0).unwrap();
    let tags: Vec<_> = [2u8, 1, 0]
        .iter()
        .map(|&ch| tx.send(ch, far, &[ch]).unwrap())
        .collect();
    let posted = ep.clock();
    assert_eq!(posted.ps(), 3 * FAKE_SOFTWARE_PS);
    let deadline = Instant::now() + Duration::from_secs(5);
    let mut acked = Vec::new();
    for t in tags {
        loop {
            match ep.try_result(t).unwrap() {
                Some((_, at)) => {
                    acked.push(at);
                    break;
                }
                None => {
                    assert!(Instant::now() < deadline, "no ACK for {t:?}");
                    std::thread::sleep(Duration::from_millis(1));
                }
            }
        }
    }
    assert!(acked[0] > posted, "{acked:?} {posted}");
    assert!(acked[0] < acked[2], "{acked:?}");
    assert_eq!(ep.clock(), posted, "results taken for bookkeeping");
    assert!(
        matches!(
            ep.try_result(Tag::from_raw(999_999)),
            Err(Error::UnknownTag(_))
        ),
        "an unknown tag"
    );
    // Channel 3, never used, is free since ever: taken, and only the call's software
    // moves the clock.
    tx.try_send_any(far, b"3").unwrap();
    assert_eq!(ep.clock().ps(), posted.ps() + FAKE_SOFTWARE_PS);
    // Then channel 2, freed first (the first free channel, 0, was freed last): the post
    // waits for that answer in modeled time, as a program with all four busy would.
    let before = ep.clock();
    tx.try_send_any(far, b"2").unwrap();
    assert_eq!(
        ep.clock().ps(),
        before.max(acked[0]).ps() + FAKE_SOFTWARE_PS,
        "posted after channel 2's ACK ({acked:?}), not channel 0's"
    );
    // A message a library keeps for the program: taken without moving the clock, which
    // moves to it (plus the cost of taking it) when the library says the program took it.
    let mb = ep.mailbox(4).unwrap();
    let t = tx.send_any(mb.addr(), b"kept").unwrap();
    ep.wait(t, T).unwrap();
    let before = ep.clock();
    let deadline = Instant::now() + Duration::from_secs(5);
    let m = loop {
        if let Some(m) = mb.try_recv_unclocked().unwrap() {
            break m;
        }
        assert!(Instant::now() < deadline, "the message never came");
        std::thread::sleep(Duration::from_millis(1));
    };
    assert_eq!(m.payload, b"kept");
    assert_eq!(ep.clock(), before, "kept, not taken by the program");
    assert_eq!(ep.took(m.at), before.max(m.at) + FAKE_SOFTWARE_PS);
    assert_eq!(mb.queued(), 0);

    // With nothing ever answered, each free channel is taken once, then none is free:
    // busy, without waiting.
    let f = Fake::start("unclocked-busy", Behavior::Silent);
    let ep = attach_scaled(&f, 0);
    let tx = ep.packetizer().unwrap();
    let dst = ep.mailbox_addr(NodeId(NODE_ID), 0, 0).unwrap();
    for _ in 0..exanet::PACKETIZER_CHANNELS {
        tx.try_send_any(dst, b"x").unwrap();
    }
    let started = Instant::now();
    let e = tx.try_send_any(dst, b"x").unwrap_err();
    assert!(matches!(e, Error::ChannelBusy { .. }), "{e:?}");
    assert!(started.elapsed() < Duration::from_secs(1), "did not wait");
    let mem = ep.register(4096).unwrap();
    let page = ep.rdma_page().unwrap();
    let remote = ep.addr(NodeId(NODE_ID), ep.rank(), mem.va()).unwrap();
    for _ in 0..exanet::RDMA_READ_CHANNELS {
        page.try_read_any(remote, &mem, 0, 64).unwrap();
    }
    assert!(matches!(
        page.try_read_any(remote, &mem, 0, 64),
        Err(Error::ChannelBusy { .. })
    ));
    for _ in 0..exanet::RDMA_WRITE_CHANNELS {
        page.try_write_any(&mem, 0, remote, 64, None).unwrap();
    }
    assert!(matches!(
        page.try_write_any(&mem, 0, remote, 64, None),
        Err(Error::ChannelBusy { .. })
    ));
    // Their arguments are checked as the fixed-channel calls check them.
    assert!(matches!(
        page.try_read_any(remote, &mem, 4096, 1),
        Err(Error::OutOfBounds { .. })
    ));
}
