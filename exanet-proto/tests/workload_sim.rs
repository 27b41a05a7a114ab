//! Two workloads on a simulated rack, attached through the same service a daemon runs
//! (`exanet_proto::workload`): their commands go through the attach protocol's slot
//! encoding, their completions come back through a completion ring, and the link between
//! their QFDBs loses cells. RDMA writes with notifications, reads and mailbox messages
//! must all complete correctly, and the same seed must give the same run.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use exanet_proto::attach::{self, status, Command, Completion, Resource};
use exanet_proto::fault::{FaultKind, LinkFaults};
use exanet_proto::ni::mailbox::ConsumedCount;
use exanet_proto::ni::op::{RdmaRead, RdmaWrite, SendMessage};
use exanet_proto::ni::{mailbox_gvas, MemFault, Memory, VecMemory};
use exanet_proto::sim::{Sim, SimConfig};
use exanet_proto::workload::{CompletionRing, Joining, OpKind, Placed};
use exanet_proto::{Gvas, Instant, NodeId, Pdid, Shape};

const PDID: Pdid = Pdid(42);
const RING: usize = 64;
const REGION: u64 = 1 << 20;
const LEN: u64 = 300_000;

/// A completion ring as a workload's library sees it: a bounded queue, and the counters
/// through which it says how many messages it took from each mailbox.
#[derive(Clone)]
struct Ring {
    slots: Arc<Mutex<VecDeque<[u8; attach::SLOT]>>>,
    consumed: Arc<[AtomicU64; 64]>,
}

impl Default for Ring {
    fn default() -> Ring {
        Ring {
            slots: Arc::default(),
            consumed: Arc::new(std::array::from_fn(|_| AtomicU64::new(0))),
        }
    }
}

impl Ring {
    /// Takes every completion in the ring, counting the messages taken.
    fn take(&self) -> Vec<Completion> {
        let slots: Vec<_> = self.slots.lock().unwrap().drain(..).collect();
        slots
            .iter()
            .map(|s| {
                let c = Completion::decode(s).expect("the service writes decodable slots");
                if let Completion::Message { vi, .. } = c {
                    self.consumed[usize::from(vi)].fetch_add(1, Ordering::Release);
                }
                c
            })
            .collect()
    }
}

impl CompletionRing for Ring {
    fn push(&mut self, slot: &[u8; attach::SLOT]) -> bool {
        let mut q = self.slots.lock().unwrap();
        if q.len() >= RING {
            return false;
        }
        q.push_back(*slot);
        true
    }

    fn has_room(&mut self) -> bool {
        self.slots.lock().unwrap().len() < RING
    }

    fn wake(&mut self) {}

    fn consumed(&self, vi: u8) -> Box<dyn ConsumedCount> {
        let c = Arc::clone(&self.consumed);
        Box::new(move || c[usize::from(vi)].load(Ordering::Acquire))
    }
}

/// A node's memory shared with the test, which registers what the service places.
#[derive(Clone, Default)]
struct Shared(Arc<Mutex<VecMemory>>);

impl Memory for Shared {
    fn contains(&self, rank: u8, va: u64, len: u64) -> bool {
        self.0.lock().unwrap().contains(rank, va, len)
    }
    fn read(&self, rank: u8, va: u64, buf: &mut [u8]) -> Result<(), MemFault> {
        self.0.lock().unwrap().read(rank, va, buf)
    }
    fn write(&mut self, rank: u8, va: u64, data: &[u8]) -> Result<(), MemFault> {
        self.0.lock().unwrap().write(rank, va, data)
    }
}

struct Workload {
    node: NodeId,
    rank: u8,
    ring: Ring,
    mem: Shared,
    region: Placed,
    page: u8,
}

impl Workload {
    fn attach(sim: &mut Sim, node: NodeId, mem: &Shared) -> Workload {
        Workload::attach_job(sim, node, mem, PDID)
    }

    /// A workload of job `pdid`.
    fn attach_job(sim: &mut Sim, node: NodeId, mem: &Shared, pdid: Pdid) -> Workload {
        let ring = Ring::default();
        let (svc, ni, _) = sim.workloads(node);
        let rank = svc
            .attach(
                ni,
                Joining::new(&format!("job{}", pdid.0), pdid),
                Box::new(ring.clone()),
            )
            .unwrap();
        let region = svc.register(rank, REGION).unwrap();
        assert_eq!(region.va % (2 << 20), 0, "regions are 2 MiB aligned");
        let (page, _) = svc.alloc(ni, rank, Resource::RdmaPage, None, None).unwrap();
        mem.0
            .lock()
            .unwrap()
            .register(rank, region.va, REGION as usize);
        Workload {
            node,
            rank,
            ring,
            mem: mem.clone(),
            region,
            page,
        }
    }

    fn gvas(&self, va: u64) -> Gvas {
        Gvas::new(PDID, self.node, self.rank, va).unwrap()
    }

    /// Posts a command as a workload does: through its slot encoding.
    fn post(&self, sim: &mut Sim, cmd: &Command) {
        let now = sim.now();
        let (svc, ni, mem) = sim.workloads(self.node);
        let _ = svc.execute(ni, mem, self.rank, Command::decode(&cmd.encode()), now);
        sim.kick(self.node);
    }

    fn bytes(&self, va: u64, len: u64) -> Vec<u8> {
        let mut b = vec![0; len as usize];
        self.mem.read(self.rank, va, &mut b).unwrap();
        b
    }
}

fn run(sim: &mut Sim) {
    let until = sim.now() + 30_000_000_000;
    assert!(sim.run_until(until), "the rack did not go quiet");
}

/// Runs the whole scenario; returns every completion each workload saw, in order.
fn scenario(seed: u64) -> (Vec<Completion>, Vec<Completion>, u64) {
    let shape: Shape = "2x1x1".parse().unwrap();
    let mut sim = Sim::new(
        shape,
        SimConfig {
            seed,
            ..SimConfig::default()
        },
    )
    .unwrap();
    let (na, nb) = (
        shape.parse_node("M1QAF2").unwrap(),
        shape.parse_node("M1QBF3").unwrap(),
    );
    let (ma, mb) = (Shared::default(), Shared::default());
    sim.node_mut(na).set_memory(Box::new(ma.clone()));
    sim.node_mut(nb).set_memory(Box::new(mb.clone()));
    // Loss on the torus link between the two QFDBs, both ways: every cell of the path
    // crosses it.
    let (f1a, f1b) = (
        shape.parse_node("M1QAF1").unwrap(),
        shape.parse_node("M1QBF1").unwrap(),
    );
    let loss = LinkFaults {
        loss: 0.01,
        ..LinkFaults::default()
    };
    sim.set_link_faults(f1a, f1b, loss, seed).unwrap();
    sim.set_link_faults(f1b, f1a, loss, seed ^ 1).unwrap();

    let a = Workload::attach(&mut sim, na, &ma);
    let b = Workload::attach(&mut sim, nb, &mb);
    let (mut seen_a, mut seen_b) = (Vec::new(), Vec::new());

    // An RDMA write with a notification, from a pattern in A's memory into B's.
    let pattern: Vec<u8> = (0..LEN).map(|i| (i * 7 + i / 251) as u8).collect();
    a.mem.clone().write(a.rank, a.region.va, &pattern).unwrap();
    let notify = b.region.va + REGION - 64;
    a.post(
        &mut sim,
        &Command::Write {
            tag: 11,
            op: RdmaWrite {
                page: a.page,
                ch: 0,
                src_va: a.region.va,
                dst: b.gvas(b.region.va),
                len: LEN,
                notify: Some(notify),
            },
            at: exanet_proto::model::ModelTime::ZERO,
        },
    );
    run(&mut sim);
    let got_a = a.ring.take();
    assert!(
        matches!(
            got_a[..],
            [Completion::Rdma {
                tag: 11,
                read: false,
                status: status::OK,
                ..
            }]
        ),
        "{got_a:?}"
    );
    let got_b = b.ring.take();
    assert!(
        matches!(got_b[..], [Completion::Notified { va, src_node, len, .. }]
            if va == notify && src_node == na.0 && len == LEN),
        "{got_b:?}"
    );
    assert!(
        b.bytes(b.region.va, LEN) == pattern,
        "the write landed intact"
    );
    seen_a.extend(got_a);
    seen_b.extend(got_b);

    // An RDMA read of it back into another part of A's memory.
    let back = a.region.va + REGION / 2;
    a.post(
        &mut sim,
        &Command::Read {
            tag: 12,
            op: RdmaRead {
                page: a.page,
                ch: 1,
                src: b.gvas(b.region.va),
                dst_va: back,
                len: LEN,
            },
            at: exanet_proto::model::ModelTime::ZERO,
        },
    );
    run(&mut sim);
    let got_a = a.ring.take();
    assert!(
        matches!(
            got_a[..],
            [Completion::Rdma {
                tag: 12,
                read: true,
                status: status::OK,
                ..
            }]
        ),
        "{got_a:?}"
    );
    assert!(
        a.bytes(back, LEN) == pattern,
        "the read brought it back intact"
    );
    seen_a.extend(got_a);

    // Mailbox messages: more than the ring holds, so the service must keep the rest in
    // the NI's mailbox and move them as B makes room; each delivered once, in order.
    let (vi, generation) = {
        let (svc, ni, _) = sim.workloads(nb);
        svc.alloc(ni, b.rank, Resource::Mailbox, Some(256), None)
            .unwrap()
    };
    let (avi, _) = {
        let (svc, ni, _) = sim.workloads(na);
        svc.alloc(ni, a.rank, Resource::Packetizer, None, None)
            .unwrap()
    };
    let to = mailbox_gvas(PDID, nb, b.rank, vi).unwrap();
    let total = RING as u32 * 2;
    let mut delivered = Vec::new();
    let mut sent = Vec::new();
    for n in 0..total {
        a.post(
            &mut sim,
            &Command::Send {
                tag: 100 + n,
                op: SendMessage {
                    vi: avi,
                    ch: (n % 4) as u8,
                    dst: to,
                    payload: n.to_le_bytes().to_vec(),
                },
                at: exanet_proto::model::ModelTime::ZERO,
            },
        );
        if n % 4 == 3 {
            run(&mut sim);
            // A reads its ring as it goes, as a workload must: the service holds what
            // does not fit (in order) until then.
            sent.extend(a.ring.take());
            let (svc, ni, _) = sim.workloads(na);
            svc.drain(ni, a.rank);
        }
    }
    run(&mut sim);
    sent.extend(a.ring.take());
    assert_eq!(sent.len(), total as usize, "one completion per send");
    for c in &sent {
        assert!(
            matches!(c, Completion::Sent { status: status::OK, tag, .. } if (100..100 + total).contains(tag)),
            "{c:?}"
        );
    }
    seen_a.extend(sent);
    while delivered.len() < total as usize {
        let got = b.ring.take();
        assert!(
            !got.is_empty(),
            "messages stopped after {}",
            delivered.len()
        );
        for c in &got {
            match c {
                Completion::Message {
                    vi: v,
                    generation: g,
                    src_node,
                    src_rank,
                    payload,
                    ..
                } => {
                    assert_eq!(
                        (*v, *g, *src_node, *src_rank),
                        (vi, generation, na.0, a.rank)
                    );
                    delivered.push(u32::from_le_bytes(payload[..4].try_into().unwrap()));
                }
                other => panic!("unexpected {other:?}"),
            }
        }
        seen_b.extend(got);
        // B read its ring: room for more.
        let (svc, ni, _) = sim.workloads(nb);
        svc.drain(ni, b.rank);
    }
    let mut sorted = delivered.clone();
    sorted.sort_unstable();
    assert_eq!(sorted, (0..total).collect::<Vec<_>>(), "each message once");

    // What a workload gets wrong completes with the reason, and harms nobody.
    let now = sim.now();
    let (svc, ni, mem) = sim.workloads(na);
    let mut junk = [0xffu8; attach::SLOT];
    junk[1..5].copy_from_slice(&77u32.to_le_bytes());
    assert!(svc
        .execute(ni, mem, a.rank, Command::decode(&junk), now)
        .is_err());
    let bad_page = Command::Write {
        tag: 78,
        op: RdmaWrite {
            page: a.page + 1,
            ch: 0,
            src_va: a.region.va,
            dst: b.gvas(b.region.va),
            len: 8,
            notify: None,
        },
        at: exanet_proto::model::ModelTime::ZERO,
    };
    assert!(svc.execute(ni, mem, a.rank, Ok(bad_page), now).is_err());
    let refused = a.ring.take();
    assert!(
        matches!(
            refused[..],
            [
                Completion::Refused {
                    status: status::MALFORMED,
                    ..
                },
                Completion::Refused {
                    tag: 78,
                    status: status::REFUSED,
                    ..
                }
            ]
        ),
        "{refused:?}"
    );
    seen_a.extend(refused);

    let finished = sim.take_finished();
    assert_eq!(
        finished
            .iter()
            .filter(|(_, f)| f.op == OpKind::Send)
            .count(),
        total as usize
    );
    assert!(finished.iter().all(|(_, f)| f.ok));
    let dropped = sim.link_fault_stats(f1a, f1b).cells(FaultKind::Loss)
        + sim.link_fault_stats(f1b, f1a).cells(FaultKind::Loss);
    (seen_a, seen_b, dropped)
}

#[test]
fn two_workloads_through_the_attach_service_over_a_lossy_link() {
    let (a, b, dropped) = scenario(3);
    assert!(
        dropped > 0,
        "the link lost nothing: the test proves no recovery"
    );
    let again = scenario(3);
    assert_eq!((a, b, dropped), again, "same seed, same run");
}

#[test]
fn a_detached_rank_is_free_for_the_next_workload_whose_memory_goes_elsewhere() {
    let shape: Shape = "1x1x1".parse().unwrap();
    let mut sim = Sim::new(shape, SimConfig::default()).unwrap();
    let node = NodeId(0);
    let mem = Shared::default();
    sim.node_mut(node).set_memory(Box::new(mem.clone()));
    let first = Workload::attach(&mut sim, node, &mem);
    let (svc, ni, _) = sim.workloads(node);
    let first_va = first.region.va;
    assert!(svc.detach(ni, first.rank, Instant::ZERO));
    assert!(!svc.detach(ni, first.rank, Instant::ZERO), "detached once");
    assert!(svc.register(first.rank, 4096).is_err());
    let second = Workload::attach(&mut sim, node, &mem);
    assert_eq!(second.rank, first.rank, "the rank is free again");
    // Its memory goes elsewhere, so what was meant for the first workload faults.
    assert_ne!(second.region.va, first_va);
    // A rank's next regions follow its first, each on a 2 MiB boundary.
    let (svc, _, _) = sim.workloads(node);
    let next = svc.register(second.rank, 4096).unwrap();
    let after = svc.register(second.rank, 1).unwrap();
    assert_eq!(
        next.va,
        second.region.va + REGION.div_ceil(2 << 20) * (2 << 20)
    );
    assert_eq!(after.va, next.va + (2 << 20));
    assert_eq!(
        (next.id, after.id),
        (second.region.id + 1, second.region.id + 2)
    );
}

/// A service that peers address without a directory (the IP service) asks for its rank
/// and its mailbox interface by number; both are refused when taken or out of range, and
/// ordinary allocation keeps giving the lowest free ones.
#[test]
fn a_rank_and_a_mailbox_interface_can_be_asked_for_by_number() {
    use exanet_proto::workload::ServiceError;
    let shape: Shape = "1x1x1".parse().unwrap();
    let mut sim = Sim::new(shape, SimConfig::default()).unwrap();
    let (svc, ni, _) = sim.workloads(NodeId(0));
    let ip = svc
        .attach_at(ni, 7, Joining::new("job", PDID), Box::new(Ring::default()))
        .unwrap();
    assert_eq!(ip, 7);
    assert!(matches!(
        svc.attach_at(ni, 7, Joining::new("job", PDID), Box::new(Ring::default())),
        Err(ServiceError::RankTaken(7))
    ));
    assert!(matches!(
        svc.attach_at(ni, 8, Joining::new("job", PDID), Box::new(Ring::default())),
        Err(ServiceError::NoSuchRank(8))
    ));
    let other = svc
        .attach(ni, Joining::new("job", PDID), Box::new(Ring::default()))
        .unwrap();
    assert_eq!(other, 0, "the lowest free rank, not the one asked for");
    let last = exanet_proto::reserved::IP_MAILBOX_VI;
    assert_eq!(usize::from(last), exanet_proto::ni::MAILBOX_VIS - 1);
    let (vi, _) = svc
        .alloc(ni, ip, Resource::Mailbox, Some(16), Some(last))
        .unwrap();
    assert_eq!(vi, last);
    assert!(svc
        .alloc(ni, other, Resource::Mailbox, Some(16), Some(last))
        .is_err());
    assert!(svc
        .alloc(ni, other, Resource::Mailbox, Some(16), Some(last + 1))
        .is_err());
    assert!(matches!(
        svc.alloc(ni, other, Resource::Packetizer, None, Some(1)),
        Err(ServiceError::IndexNotMailbox)
    ));
    let (first, _) = svc
        .alloc(ni, other, Resource::Mailbox, Some(16), None)
        .unwrap();
    assert_eq!(first, 0);
}

/// Job A stamps one command 2^63 ps (a broken or hostile workload); job B, on the same
/// nodes, then does its own work: a notified write, a message, a write nobody is there to
/// take (refused until its attempts run out), one into a dead link (it times out on the
/// NI's own timers) and a slot that does not decode. Every completion B sees carries B's own modeled time: the NI kept one clock for
/// the node, which A's stamp moved, and B's failures and refusals came out at 9.2e18 ps.
/// A's stamp itself is taken at a day ahead of its rank's clock, and counted.
#[test]
fn one_jobs_stamp_does_not_move_another_jobs_modeled_time() {
    use exanet_proto::model::ModelTime;
    use exanet_proto::ni::MAX_LEAD;
    let shape: Shape = "1x1x1".parse().unwrap();
    let mut sim = Sim::new(shape, SimConfig::default()).unwrap();
    let (n0, n1) = (NodeId(0), NodeId(1));
    let (m0, m1) = (Shared::default(), Shared::default());
    sim.node_mut(n0).set_memory(Box::new(m0.clone()));
    sim.node_mut(n1).set_memory(Box::new(m1.clone()));
    let (a0, a1) = (
        Workload::attach_job(&mut sim, n0, &m0, Pdid(1)),
        Workload::attach_job(&mut sim, n1, &m1, Pdid(1)),
    );
    let (b0, b1) = (
        Workload::attach_job(&mut sim, n0, &m0, Pdid(2)),
        Workload::attach_job(&mut sim, n1, &m1, Pdid(2)),
    );
    let packetizer = |sim: &mut Sim, w: &Workload| {
        let (svc, ni, _) = sim.workloads(w.node);
        svc.alloc(ni, w.rank, Resource::Packetizer, None, None)
            .unwrap()
            .0
    };
    let mailbox = |sim: &mut Sim, w: &Workload, pdid: Pdid| {
        let (svc, ni, _) = sim.workloads(w.node);
        let (vi, _) = svc
            .alloc(ni, w.rank, Resource::Mailbox, Some(16), None)
            .unwrap();
        mailbox_gvas(pdid, w.node, w.rank, vi).unwrap()
    };
    let send = |vi: u8, dst: Gvas, tag: u32, at: ModelTime| Command::Send {
        tag,
        op: SendMessage {
            vi,
            ch: 0,
            dst,
            payload: vec![1; 8],
        },
        at,
    };

    // A: one message, stamped 2^63 ps.
    let (avi, ato) = (packetizer(&mut sim, &a0), mailbox(&mut sim, &a1, Pdid(1)));
    a0.post(&mut sim, &send(avi, ato, 1, ModelTime(1 << 63)));
    run(&mut sim);
    let day = ModelTime(MAX_LEAD);
    let far = ModelTime(1 << 62);
    for (who, got) in [
        ("A's sender", a0.ring.take()),
        ("A's receiver", a1.ring.take()),
    ] {
        assert!(
            matches!(got[..], [ref c] if c.at() > day && c.at() < far),
            "{who}: {got:?}"
        );
    }
    assert_eq!(sim.workloads(n0).1.stamps_clamped(), 1);

    // B, from 1 us of its own time on.
    let t0 = ModelTime::from_ns(1_000);
    let (bvi, bto) = (packetizer(&mut sim, &b0), mailbox(&mut sim, &b1, Pdid(2)));
    b0.post(&mut sim, &send(bvi, bto, 2, t0));
    let write = |tag: u32, ch: u8, dst: Gvas, notify: Option<u64>| Command::Write {
        tag,
        op: RdmaWrite {
            page: b0.page,
            ch,
            src_va: b0.region.va,
            dst,
            len: 40_000,
            notify,
        },
        at: t0,
    };
    let notify = b1.region.va + REGION - 64;
    b0.post(&mut sim, &write(3, 0, b1.gvas(b1.region.va), Some(notify)));
    let nobody = Gvas::new(Pdid(2), n1, 6, b1.region.va).unwrap();
    b0.post(&mut sim, &write(4, 1, nobody, None));
    // And one into a link that loses everything: it times out on the NI's own timers.
    let lost = LinkFaults {
        loss: 1.0,
        ..LinkFaults::default()
    };
    sim.set_link_faults(n0, NodeId(2), lost, 1).unwrap();
    let beyond = Gvas::new(Pdid(2), NodeId(2), 0, b1.region.va).unwrap();
    b0.post(&mut sim, &write(6, 2, beyond, None));
    let now = sim.now();
    let (svc, ni, mem) = sim.workloads(n0);
    let mut junk = [0xffu8; attach::SLOT];
    junk[1..5].copy_from_slice(&5u32.to_le_bytes());
    assert!(svc
        .execute(ni, mem, b0.rank, Command::decode(&junk), now)
        .is_err());
    run(&mut sim);
    let (got0, got1) = (b0.ring.take(), b1.ring.take());
    let status = |c: &Completion| match c {
        Completion::Sent { tag, status, .. } | Completion::Rdma { tag, status, .. } => {
            (*tag, *status)
        }
        // What tag an undecodable slot has is anyone's guess.
        Completion::Refused { status, .. } => (0, *status),
        _ => (u32::MAX, 0),
    };
    let mut ended: Vec<_> = got0.iter().map(status).collect();
    ended.sort_unstable();
    assert_eq!(
        ended,
        [
            (0, status::MALFORMED),
            (2, status::OK),
            (3, status::OK),
            (4, status::NACKED),
            (6, status::TIMED_OUT)
        ],
        "{got0:?}"
    );
    assert_eq!(got1.len(), 2, "B's message and notification: {got1:?}");
    // Within a second of B's own time: the failed writes took their eight modeled
    // retransmission timers (100 us each); anything of A's is a day or more.
    let second = t0 + 1_000_000_000_000;
    for c in got0.iter().chain(&got1) {
        assert!(c.at() >= t0 && c.at() < second, "B saw {c:?}");
    }
}
