//! Software collectives against real daemons of a local rack: steps past the eager limit
//! go by rendezvous (RTS, CTS, RDMA write with a notification), under faults too, and two
//! jobs' collectives on the same nodes never mix. Needs `exactl` and `exanetd` built with
//! the same profile (`cargo build -p exactl -p exanetd`).

mod rack;

use std::time::Duration;

use exanet::collective::{Collectives, DataType, Group, Path, ReduceOp, EAGER_LIMIT};
use exanet::{Endpoint, NodeId};
use rack::Rack;

/// Attaches one endpoint per node (with `key`'s job), opens their collectives and a group
/// `id` of all of them, and runs `f(member index, collectives, group)` on one thread per
/// member.
fn on_members<T: Send>(
    rack: &Rack,
    nodes: &[&str],
    key: Option<&str>,
    id: u16,
    f: impl Fn(usize, &mut Collectives, &Group) -> T + Sync,
) -> Vec<T> {
    let eps: Vec<Endpoint> = nodes
        .iter()
        .map(|n| Endpoint::attach_to(&rack.dir, n, key).unwrap())
        .collect();
    let members: Vec<(NodeId, u8)> = eps.iter().map(|e| (e.node_id(), e.rank())).collect();
    std::thread::scope(|s| {
        let handles: Vec<_> = eps
            .iter()
            .enumerate()
            .map(|(i, ep)| {
                let (members, f) = (&members, &f);
                s.spawn(move || {
                    let mut c = ep.collectives().unwrap();
                    c.set_timeout(Duration::from_secs(60));
                    let g = c.group(id, members).unwrap();
                    f(i, &mut c, &g)
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

/// Member `i`'s vector of `n` i64: distinct per member and element, some negative.
fn vector(i: usize, n: usize, salt: i64) -> Vec<i64> {
    (0..n as i64)
        .map(|k| ((k * 7919 + salt) ^ ((i as i64 + 1) * 1_000_003)) - 500)
        .collect()
}

fn bytes_i64(v: &[i64]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

fn i64s(b: &[u8]) -> Vec<i64> {
    b.chunks(8)
        .map(|c| i64::from_le_bytes(c.try_into().unwrap()))
        .collect()
}

/// The elementwise reduction of every member's [`vector`] by `op`.
fn reduced(members: usize, n: usize, salt: i64, op: fn(i64, i64) -> i64) -> Vec<i64> {
    (1..members).fold(vector(0, n, salt), |acc, i| {
        acc.iter()
            .zip(vector(i, n, salt))
            .map(|(&a, b)| op(a, b))
            .collect()
    })
}

fn sum_of(members: usize, n: usize, salt: i64) -> Vec<i64> {
    reduced(members, n, salt, i64::wrapping_add)
}

// The 5-element (40 B) row goes by rendezvous only past the default limit.
const _: () = assert!(40 > EAGER_LIMIT);

const NODES6: [&str; 6] = ["M1QAF1", "M1QAF2", "M1QAF4", "M1QBF1", "M1QBF2", "M1QBF3"];

/// Every kind over six members of two QFDBs (not a power of two, so recursive doubling
/// folds in and out), at sizes that go eagerly, by rendezvous, and past what messages can
/// carry (steps > 65535 B); one member sends steps of up to 4 KB as messages, and the
/// others follow it.
#[test]
fn software_collectives_go_by_rendezvous_past_the_eager_limit() {
    let rack = Rack::up("crdv", "2x1x1");
    let m = NODES6.len();
    let sizes = [1usize, 5, 512, 40_000]; // elements of i64: 8 B .. 320 KB
    let out = on_members(&rack, &NODES6, None, 7, |i, c, g| {
        assert!(c.has_rdma(), "member {i} got no RDMA page");
        if i == 2 {
            c.set_eager_limit(4096);
        }
        let mut rdv = Vec::new();
        for (s, &n) in sizes.iter().enumerate() {
            let before = c.stats().rendezvous;
            let got = c
                .allreduce(
                    g,
                    ReduceOp::Sum,
                    DataType::I64,
                    &bytes_i64(&vector(i, n, s as i64)),
                    Path::Software,
                )
                .unwrap_or_else(|e| panic!("member {i}, {n} elements: {e}"));
            assert_eq!(
                i64s(&got),
                sum_of(m, n, s as i64),
                "member {i}, {n} elements"
            );
            rdv.push(c.stats().rendezvous - before);
        }
        // f64: every member gets the same bits.
        let f: Vec<u8> = (0..3000)
            .flat_map(|k| (1.0 / (k as f64 + i as f64 + 0.3)).to_le_bytes())
            .collect();
        let fsum = c
            .allreduce(g, ReduceOp::Sum, DataType::F64, &f, Path::Software)
            .unwrap();
        // A broadcast from member 3 and a reduce to member 1 of 100 KB.
        let payload: Vec<u8> = (0..100_000u32).map(|k| (k * 31 + 7) as u8).collect();
        let mine = if i == 3 {
            payload.clone()
        } else {
            vec![0; payload.len()]
        };
        let b = c.bcast(g, 3, &mine).unwrap();
        assert_eq!(b, payload, "member {i}: broadcast");
        let r = c
            .reduce(
                g,
                1,
                ReduceOp::Min,
                DataType::I64,
                &bytes_i64(&vector(i, 12_500, 9)),
            )
            .unwrap();
        if i == 1 {
            assert_eq!(
                i64s(&r),
                reduced(m, 12_500, 9, i64::min),
                "the reduce's root"
            );
        } else {
            assert!(r.is_empty());
        }
        c.barrier(g).unwrap();
        (rdv, fsum, c.stats())
    });
    for (i, (rdv, fsum, stats)) in out.iter().enumerate() {
        // 8 B goes as messages everywhere; past 65535 B a step can only go by rendezvous.
        assert_eq!(rdv[0], 0, "member {i}: {rdv:?}");
        assert!(rdv[3] > 0, "member {i}: {rdv:?}");
        if i == 2 {
            // Its steps of 40 B and 4 KB went as messages.
            assert_eq!(rdv[1] + rdv[2], 0, "member {i}: {rdv:?}");
        } else {
            assert!(rdv[1] > 0 && rdv[2] > 0, "member {i}: {rdv:?}");
        }
        assert_eq!(fsum, &out[0].1, "member {i}'s f64 sum differs in its bits");
        assert_eq!(stats.failed, [0, 0], "member {i}");
    }
}

/// 1% loss and 0.1% corruption on the torus link between the QFDBs: every collective
/// completes with the right result (the NI recovers the cells of the messages and the
/// writes alike).
#[test]
fn rendezvous_survive_loss_and_corruption() {
    let rack = Rack::up("cflt", "2x1x1");
    rack.link_set("M1QAF1", "M1QBF1", &["--loss", "1%", "--corrupt", "0.1%"]);
    let nodes = ["M1QAF1", "M1QAF3", "M1QBF1", "M1QBF4"];
    let out = on_members(&rack, &nodes, None, 3, |i, c, g| {
        for round in 0..6 {
            let n = [64, 2000, 9000][round % 3];
            let got = c
                .allreduce(
                    g,
                    ReduceOp::Sum,
                    DataType::I64,
                    &bytes_i64(&vector(i, n, round as i64)),
                    Path::Software,
                )
                .unwrap_or_else(|e| panic!("member {i}, round {round}: {e}"));
            assert_eq!(
                i64s(&got),
                sum_of(4, n, round as i64),
                "member {i}, round {round}"
            );
        }
        c.stats().rendezvous
    });
    assert!(out.iter().all(|&r| r > 0), "{out:?}");
    let status = rack::run(rack.exactl(&["status"]), Duration::from_secs(30));
    assert!(status.0, "{}", status.2);
}

/// Two jobs run the same group id on the same eight nodes at once, on the accelerator and
/// in software, each with its own vectors: each job gets its own sums.
#[test]
fn two_jobs_collectives_on_the_same_nodes_never_mix() {
    let rack = Rack::up("c2job", "2x1x1");
    rack.restart_with("\n[jobs.alice]\nkey = \"alice-secret\"\npdid = 42\n");
    let nodes = [
        "M1QAF1", "M1QAF2", "M1QAF3", "M1QAF4", "M1QBF1", "M1QBF2", "M1QBF3", "M1QBF4",
    ];
    let job = |key: Option<&'static str>, salt: i64| {
        on_members(&rack, &nodes, key, 1, move |i, c, g| {
            for round in 0..4 {
                let path = [Path::Accelerator, Path::Software][round % 2];
                let n = [32, 3000][round / 2];
                let got = c
                    .allreduce(
                        g,
                        ReduceOp::Sum,
                        DataType::I64,
                        &bytes_i64(&vector(i, n, salt + round as i64)),
                        path,
                    )
                    .unwrap_or_else(|e| panic!("job {key:?}, member {i}, round {round}: {e}"));
                assert_eq!(
                    i64s(&got),
                    sum_of(8, n, salt + round as i64),
                    "job {key:?}, member {i}, round {round}"
                );
            }
        })
    };
    std::thread::scope(|s| {
        let a = s.spawn(|| job(None, 100));
        let b = s.spawn(|| job(Some("alice-secret"), 200));
        a.join().unwrap();
        b.join().unwrap();
    });
}

/// A member that gives a software collective up tells the others, which fail at once with
/// its reason rather than wait out their own timeout. Member 2 never joins; member 0
/// waits for it 300 ms, member 1 (which waits for member 0) would wait 60 s.
///
/// The abort is best effort: a member whose collective mailbox does not exist yet never
/// hears it. So member 0 starts only once member 1 has its mailbox (each member makes its
/// own in its thread; on a loaded machine member 1's could come after member 0's 300 ms,
/// which failed this test about one run in eight).
#[test]
fn a_member_that_gives_up_aborts_the_others() {
    let rack = Rack::up("cabrt", "1x1x1");
    let nodes = ["M1QAF1", "M1QAF2", "M1QAF3"];
    let both_ready = std::sync::Barrier::new(2);
    let out = on_members(&rack, &nodes, None, 4, |i, c, g| {
        if i == 2 {
            return None;
        }
        both_ready.wait();
        if i == 0 {
            c.set_timeout(Duration::from_millis(300));
        }
        let t0 = std::time::Instant::now();
        let e = c
            .allreduce(g, ReduceOp::Sum, DataType::I64, &[1; 8], Path::Software)
            .unwrap_err();
        Some((e, t0.elapsed()))
    });
    let (e0, _) = out[0].as_ref().unwrap();
    // It says where it stopped: past its exchange with member 1, waiting for the member
    // that never came.
    match e0 {
        exanet::Error::CollectiveTimeout {
            round, awaiting, ..
        } => assert_eq!((*round, *awaiting), (1, Some(2)), "{e0}"),
        other => panic!("member 0: {other:?}"),
    }
    assert_eq!(e0.code(), exanet::error::codes::TIMEOUT);
    let (e1, t1) = out[1].as_ref().unwrap();
    match e1 {
        exanet::Error::CollectiveAborted { member, reason } => {
            assert_eq!(*member, 0, "{e1}");
            assert!(reason.contains("timed out"), "{e1}");
        }
        other => panic!("member 1: {other:?}"),
    }
    assert_eq!(e1.code(), exanet::error::codes::ABORTED);
    assert!(*t1 < Duration::from_secs(30), "member 1 waited {t1:?}");
}
