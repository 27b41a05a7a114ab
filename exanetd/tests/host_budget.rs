//! The registered memory of one host's daemons is bounded together (issue 47, item 7):
//! a job that registered its host share on one node is refused on another, while another
//! job still registers, and what one node gives back another may take.

mod support;

use std::time::Duration;

use exanet_control::rack::{write_rack_file, Job, Layout, MemoryBudget};
use exanet_proto::attach::{Reply, Request};
use support::raw::{attach, try_request, Workload};
use support::TestRack;

const MIB: u64 = 1 << 20;

/// Registers `len` bytes: the region's id, or the daemon's refusal.
fn register(w: &Workload, len: u64) -> Result<u32, String> {
    match try_request(&w.conn, &Request::Register { len }, &[])?.0 {
        Reply::Registered { region, .. } => Ok(region),
        Reply::Error { message } => Err(message),
        other => Err(format!("unexpected reply {other:?}")),
    }
}

#[test]
fn a_job_is_refused_past_its_host_share_on_a_second_node_while_another_job_registers() {
    let mut r = TestRack::new("host-budget", "1x1x1", env!("CARGO_BIN_EXE_exanetd"));
    let mut f = r.rack().file.clone();
    f.jobs.insert(
        "alice".into(),
        Job {
            key: Some("alice-key".into()),
            pdid: 42,
            ..Job::default()
        },
    );
    write_rack_file(&r.dir, &f).unwrap();
    // What `rack up` would have measured on a very small host: 48 MiB for the rack's
    // jobs, 24 MiB each (two jobs: half each). Every node alone allows a job 8 GiB.
    let layout = Layout::new(&r.dir);
    std::fs::create_dir_all(layout.run_dir()).unwrap();
    MemoryBudget {
        total_bytes: 48 * MIB,
        ip_bytes: 0,
        available_bytes: 0,
        rack_bytes: 0,
    }
    .write(&layout.memory_budget())
    .unwrap();
    r.start_all();
    r.wait_links_up(&["M1QAF1", "M1QAF2"], Duration::from_secs(20));

    let a = attach(&r, "M1QAF1", None).unwrap();
    let b = attach(&r, "M1QAF2", None).unwrap();
    let c = attach(&r, "M1QAF2", Some("alice-key")).unwrap();
    let held = register(&a, 20 * MIB).unwrap();
    let refused = register(&b, 16 * MIB).unwrap_err();
    assert!(
        refused.starts_with("M1QAF2: job default may not register 16.0 MiB more")
            && refused.contains("24.0 MiB")
            && refused.contains("4.0 MiB of it left"),
        "{refused}"
    );
    // Another job on the same node still registers.
    register(&c, 16 * MIB).unwrap();
    let s = r.status("M1QAF2").unwrap();
    assert_eq!(
        s.errors.get("host_memory_refused"),
        Some(&1),
        "{:?}",
        s.errors
    );

    // Given back on M1QAF1, taken on M1QAF2.
    let (reply, _) = try_request(&a.conn, &Request::Unregister { region: held }, &[]).unwrap();
    assert_eq!(reply, Reply::Ok);
    register(&b, 16 * MIB).unwrap();
    // Jobs hold 32 of their 48 MiB: alice may take 8 more (her 24), not 9.
    let e = register(&c, 9 * MIB).unwrap_err();
    assert!(e.starts_with("M1QAF2: job alice may not register"), "{e}");
    register(&c, 8 * MIB).unwrap();
    // The default job has 8 MiB left, on any node of the host: a third node's daemon
    // counts what the other two hold.
    let d = attach(&r, "M1QAF3", None).unwrap();
    let e = register(&d, 9 * MIB).unwrap_err();
    assert!(e.starts_with("M1QAF3: job default may not register"), "{e}");
    register(&d, 8 * MIB).unwrap();
    drop((a, b, c, d));
}
