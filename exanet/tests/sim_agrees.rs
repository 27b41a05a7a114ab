//! The simulator and real daemons give the same modeled figures for the same workload
//! (issue 26, "Simulator and daemons agree"): one client routine, run by the same client
//! library against the fake daemon (a simulated rack: exanet-proto's `Sim`, with the
//! station, node and workload service every daemon runs) and against a local rack of real
//! daemons with the same model. Uncontended, so host order cannot enter: a message, RDMA
//! writes and a read, and round trips, between two processes of one node.
//!
//! Needs `exactl` and `exanetd` built with the same profile.

mod common;
mod rack;

use std::path::Path;
use std::time::Duration;

use exanet::{Config, Endpoint};

const T: Option<Duration> = Some(Duration::from_secs(20));

fn attach(dir: &Path, node: &str) -> Endpoint {
    Endpoint::attach_with(&Config {
        rack_dir: Some(dir.to_path_buf()),
        node: Some(node.into()),
        // Only what the program asks of the NI: no compute.
        compute_scale_ppm: Some(0),
        ..Config::default()
    })
    .unwrap_or_else(|e| panic!("attach to {node} of {}: {e}", dir.display()))
}

/// Modeled durations, picoseconds, of what one routine did, by name.
type Figures = Vec<(&'static str, u64)>;

fn routine(dir: &Path, node: &str) -> Figures {
    let a = attach(dir, node);
    let b = attach(dir, node);
    let mut out = Figures::new();
    // Both start together (a daemon starts each process's clock where it attached).
    let start = a.clock().max(b.clock());
    a.advance_clock(start);
    b.advance_clock(start);

    // One message, posted to taken.
    let inbox = b.mailbox(64).unwrap();
    let to_b = a.mailbox_addr(b.node_id(), b.rank(), inbox.vi()).unwrap();
    let tx = a.packetizer().unwrap();
    let t0 = a.clock();
    let tag = tx.send(0, to_b, b"sixteen bytes!!!").unwrap();
    let acked = a.wait_modeled(tag, T).unwrap();
    let m = inbox.recv(T).unwrap();
    out.push(("message arrival", m.at.since(t0)));
    out.push(("message ACK", acked.since(t0)));

    // RDMA writes of growing size and a read, one at a time.
    let len = 1 << 20;
    let src = a.register(len).unwrap();
    let dst = b.register(len).unwrap();
    src.write(0, &vec![0x5a; len as usize]).unwrap();
    let page = a.rdma_page().unwrap();
    for (name, n) in [
        ("write 4 KiB", 4096),
        ("write 64 KiB", 65536),
        ("write 1 MiB", len),
    ] {
        let t0 = a.clock();
        let tag = page
            .write(0, &src, 0, dst.gvas(0).unwrap(), n, None)
            .unwrap();
        out.push((name, a.wait_modeled(tag, T).unwrap().since(t0)));
    }
    let t0 = a.clock();
    let tag = page.read(0, dst.gvas(0).unwrap(), &src, 0, 65536).unwrap();
    out.push(("read 64 KiB", a.wait_modeled(tag, T).unwrap().since(t0)));

    // Ten round trips of a 64 B message: b echoes what it takes.
    let back = a.mailbox(64).unwrap();
    let to_a = b.mailbox_addr(a.node_id(), a.rank(), back.vi()).unwrap();
    let echo = b.packetizer().unwrap();
    let t0 = a.clock();
    for i in 0..10u8 {
        a.wait(tx.send(0, to_b, &[i; 64]).unwrap(), T).unwrap();
        let m = inbox.recv(T).unwrap();
        b.wait(echo.send(0, to_a, &m.payload).unwrap(), T).unwrap();
        assert_eq!(back.recv(T).unwrap().payload, vec![i; 64]);
    }
    out.push(("10 round trips of 64 B", a.clock().since(t0)));
    out
}

#[test]
fn the_simulator_and_real_daemons_model_the_same_times() {
    let fake = common::Fake::start("agree", common::Behavior::Serve);
    let simulated = routine(&fake.dir, common::NODE);

    // A rack of daemons with the fake's model: the default, with its software cost per
    // call.
    let r = rack::Rack::up("agree", "2x1x1");
    r.restart_with(&format!(
        "\n[model]\nsoftware_ns = {}\n",
        common::FAKE_SOFTWARE_PS as f64 / 1000.0
    ));
    let real = routine(&r.dir, common::NODE);
    assert!(simulated.iter().all(|(_, t)| *t > 0), "{simulated:?}");
    assert_eq!(simulated, real, "simulated (left) and on daemons (right)");
}
