//! A node is whole or visibly not (issue 48): on a local rack with IP over ExaNet, a
//! node's services are its daemon, its IP service (`exanet-ip`) and its network
//! namespace, and
//!
//! - `exactl status` shows each of them and names the ones that are down;
//! - `exactl node restart` brings the whole node back, so that after its daemon was
//!   killed (`kill -9`, not through exactl) IP to its address answers again;
//! - `exactl node pause`, `resume` and `kill` act on the daemon and the IP service together;
//! - an IP service that dies on its own (its daemon still up) is restarted by the rack's
//!   supervisor within [`RESTART_BOUND`], and the restart is counted (status and the
//!   service's `exanet_ip_restarts_total`);
//! - `rack down` leaves no process and no namespace of the rack.
//!
//! Needs root, /dev/net/tun, `ip` and `ping`; where one is missing each test prints a
//! SKIPPED line, and fails instead with `EXANET_REQUIRE_IP` set (CI sets it). Each test
//! brings up its own 2x1x1 rack, one at a time.

use std::path::Path;
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use exanet_tests::{metric_sum, parse_prometheus, run_with_timeout, Run, TestRack};
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use serde_json::Value;

const SHAPE: &str = "2x1x1";
/// The node the tests break, and the one they ping it from (another QFDB: a torus hop).
const VICTIM: &str = "M1QBF2";
const PEER: &str = "M1QAF1";
/// How soon a restarted node must answer a ping again (the peer's service asks a silent
/// peer again once a second; a restart itself takes well under a second).
const PING_BOUND: Duration = Duration::from_secs(10);
/// How soon an IP service killed alone must be up again: the supervisor looks every
/// 200 ms and a service starts in tens of milliseconds (docs/operating.md, "When a node
/// dies").
const RESTART_BOUND: Duration = Duration::from_secs(5);
/// How soon status must say a dead service is down.
const DOWN_BOUND: Duration = Duration::from_secs(2);

static ONE_RACK_AT_A_TIME: Mutex<()> = Mutex::new(());

fn skip(test: &str) -> bool {
    exanet_tests::skip_without_ip(test, &["ip", "ping"])
}

struct IpRack {
    rack: TestRack,
    name: String,
    _turn: MutexGuard<'static, ()>,
}

impl IpRack {
    fn up() -> IpRack {
        IpRack::up_with(&[])
    }

    /// A rack brought up with `more` `rack up` arguments.
    fn up_with(more: &[&str]) -> IpRack {
        let turn = ONE_RACK_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
        let rack = TestRack::new("whole");
        let name = rack.dir.file_name().unwrap().to_string_lossy().into_owned();
        let mut args = vec![
            "rack",
            "up",
            "--shape",
            SHAPE,
            "--ip",
            "on",
            "--timeout",
            "60",
        ];
        args.extend(more);
        let r = rack.exactl_timeout(&args, Duration::from_secs(90));
        let ip = IpRack {
            rack,
            name,
            _turn: turn,
        };
        assert!(r.success(), "rack up --ip on: {}", r.describe());
        ip
    }

    fn exactl(&self, args: &[&str]) -> Run {
        self.rack.exactl(args)
    }

    fn status_json(&self) -> (Run, Value) {
        let r = self.exactl(&["status", "--json"]);
        let v = r.json();
        (r, v)
    }

    /// Node `node`'s entry in `exactl status --json`.
    fn node<'a>(v: &'a Value, node: &str) -> &'a Value {
        v["nodes"]
            .as_array()
            .and_then(|ns| ns.iter().find(|n| n["node"] == node))
            .unwrap_or_else(|| panic!("no {node} in the status: {v:#}"))
    }

    /// The pid in a pid file of the rack (first line).
    fn pid_in(&self, rel: &str) -> i32 {
        let p = self.rack.dir.join(rel);
        let text = std::fs::read_to_string(&p)
            .unwrap_or_else(|e| panic!("cannot read {}: {e}", p.display()));
        let pid: i32 = text
            .lines()
            .next()
            .and_then(|l| l.trim().parse().ok())
            .unwrap_or_else(|| panic!("{} holds no pid: {text:?}", p.display()));
        assert!(pid > 1, "{}: {pid}", p.display());
        pid
    }

    fn daemon_pid(&self, node: &str) -> i32 {
        self.pid_in(&format!("run/{node}.pid"))
    }

    fn ip_pid(&self, node: &str) -> i32 {
        self.pid_in(&format!("run/ip/{node}.pid"))
    }

    fn addr(&self, node: &str) -> String {
        let shape: exanet_proto::Shape = SHAPE.parse().unwrap();
        let id = shape.parse_node(node).unwrap();
        format!("10.200.0.{}", id.0 + 1)
    }

    /// Pings `to` from `from`'s namespace until one echo comes back; how long that took,
    /// or `None` after `bound`.
    fn ping_until(&self, from: &str, to: &str, bound: Duration) -> Option<Duration> {
        let addr = self.addr(to);
        let t0 = Instant::now();
        while t0.elapsed() < bound {
            let r = run_with_timeout(
                self.rack
                    .command(&["exec", from, "--", "ping", "-c", "1", "-W", "1", &addr]),
                Duration::from_secs(15),
            )
            .unwrap_or_else(|e| panic!("{e}"));
            if r.success() {
                return Some(t0.elapsed());
            }
        }
        None
    }

    /// The IP service's metrics, at the address its ready file names.
    fn ip_metrics(&self, node: &str) -> Vec<exanet_tests::Sample> {
        let ready = self.rack.dir.join("run/ip").join(format!("{node}.ready"));
        let text = std::fs::read_to_string(&ready).unwrap();
        let addr = text.split_whitespace().nth(2).unwrap().to_string();
        let r = exanet_tests::http_get(&addr, "/metrics", Duration::from_secs(5)).unwrap();
        parse_prometheus(&r.body)
    }

    /// Takes the rack down and checks that nothing of it is left: no process naming its
    /// directory, no namespace of its name.
    fn down_and_check_clean(&self) {
        let r = self.rack.down().unwrap_or_else(|e| panic!("{e}"));
        assert!(r.success(), "rack down: {}", r.describe());
        let left = self.rack.processes();
        assert!(left.is_empty(), "left running after rack down: {left:?}");
        let ns = std::process::Command::new("ip")
            .args(["netns", "list"])
            .output()
            .unwrap();
        let ns = String::from_utf8_lossy(&ns.stdout);
        let ours: Vec<&str> = ns
            .lines()
            .filter(|l| l.starts_with(&format!("exanet-{}-", self.name)))
            .collect();
        assert!(ours.is_empty(), "namespaces left after rack down: {ours:?}");
    }
}

fn alive(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| {
            s.rsplit_once(')')
                .and_then(|(_, r)| r.split_whitespace().next().map(str::to_string))
        })
        .is_some_and(|st| !matches!(st.as_str(), "Z" | "X" | "x"))
}

/// The process state letter of `pid` (`T` when stopped).
fn state(pid: i32) -> Option<String> {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| {
            s.rsplit_once(')')
                .and_then(|(_, r)| r.split_whitespace().next().map(str::to_string))
        })
}

fn wait_gone(pid: i32, what: &str) {
    let t0 = Instant::now();
    while alive(pid) {
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "{what} is still alive"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn sigkill(pid: i32) {
    // pid > 1 (checked where it was read): one process of the test's rack.
    kill(Pid::from_raw(pid), Signal::SIGKILL).unwrap();
}

/// Every node of the status JSON has its three services up.
fn all_whole(v: &Value) -> Result<(), String> {
    for n in v["nodes"].as_array().ok_or("no nodes")? {
        for s in ["daemon", "ip", "netns"] {
            if n["services"][s]["state"] != "up" {
                return Err(format!(
                    "{}: {s} is {}: {n:#}",
                    n["node"], n["services"][s]["state"]
                ));
            }
        }
    }
    Ok(())
}

#[test]
fn a_node_whose_daemon_was_killed_is_whole_again_after_node_restart() {
    if skip("node_whole::a_node_whose_daemon_was_killed_is_whole_again_after_node_restart") {
        return;
    }
    let ip = IpRack::up();
    let (r, v) = ip.status_json();
    assert!(r.success(), "status of a fresh rack: {}", r.describe());
    all_whole(&v).unwrap();
    assert!(
        ip.ping_until(PEER, VICTIM, PING_BOUND).is_some(),
        "no ping before anything was broken"
    );

    // The daemon dies without exactl knowing; its IP service goes with it.
    let daemon = ip.daemon_pid(VICTIM);
    let service = ip.ip_pid(VICTIM);
    sigkill(daemon);
    wait_gone(daemon, "the killed daemon");
    let killed = Instant::now();

    // Status names what is down, within the bound: the daemon and the IP service. Counted
    // to the start of the status run that said it, not to its end: the bound is on what
    // status knows, not on how long a debug exactl takes to start on a loaded machine.
    let mut seen = None;
    while killed.elapsed() < DOWN_BOUND + Duration::from_secs(1) {
        let asked = killed.elapsed();
        let (r, v) = ip.status_json();
        let n = IpRack::node(&v, VICTIM);
        if n["services"]["daemon"]["state"] == "down" && n["services"]["ip"]["state"] == "down" {
            assert!(!r.success(), "status with a node down exited 0");
            seen = Some(asked);
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let seen = seen.unwrap_or_else(|| {
        panic!(
            "status did not say {VICTIM}'s daemon and IP service are down within {DOWN_BOUND:?} \
             of the kill: {:#}",
            ip.status_json().1
        )
    });
    assert!(seen <= DOWN_BOUND, "status said it after {seen:?}");
    assert!(!alive(service), "the IP service outlived its daemon");
    let text = ip.exactl(&["status"]);
    assert!(!text.success(), "{}", text.describe());
    let line = text
        .stdout
        .lines()
        .find(|l| l.contains(VICTIM) && l.contains("IP service") && l.contains("down"))
        .unwrap_or_else(|| {
            panic!(
                "status does not name {VICTIM}'s IP service down:\n{}",
                text.stdout
            )
        });
    eprintln!("status, {seen:?} after the kill: {line}");

    // The whole node comes back: daemon, IP service, same address.
    let t0 = Instant::now();
    let r = ip.exactl(&["node", "restart", VICTIM]);
    assert!(r.success(), "node restart: {}", r.describe());
    let restart_took = t0.elapsed();
    let new_service = ip.ip_pid(VICTIM);
    assert_ne!(new_service, service);
    assert!(alive(new_service), "no IP service after node restart");
    let answered = ip.ping_until(PEER, VICTIM, PING_BOUND).unwrap_or_else(|| {
        panic!(
            "{VICTIM} ({}) does not answer ping {PING_BOUND:?} after node restart; \
             its IP log:\n{}",
            ip.addr(VICTIM),
            std::fs::read_to_string(ip.rack.dir.join(format!("logs/{VICTIM}.ip.log")))
                .unwrap_or_default()
        )
    });
    eprintln!(
        "node restart took {:.2} s; ping answered {:.2} s after it returned",
        restart_took.as_secs_f64(),
        answered.as_secs_f64()
    );
    let (r, v) = ip.status_json();
    assert!(r.success(), "status after the restart: {}", r.describe());
    all_whole(&v).unwrap();
    // The operator's restart is not one of the supervisor's.
    assert_eq!(IpRack::node(&v, VICTIM)["services"]["ip"]["restarts"], 0);
    ip.down_and_check_clean();
}

/// With `--restart unless-stopped` a daemon that dies on its own comes back with its IP
/// service, counted where compose and systemd racks count theirs (status, metrics); one
/// that `exactl node kill` stopped stays down.
#[test]
fn a_daemon_that_dies_on_its_own_is_restarted_when_the_rack_asks() {
    if skip("node_whole::a_daemon_that_dies_on_its_own_is_restarted_when_the_rack_asks") {
        return;
    }
    let ip = IpRack::up_with(&["--restart", "unless-stopped"]);
    let node = "M1QAF2";
    let daemon = ip.daemon_pid(node);
    sigkill(daemon);
    let killed = Instant::now();
    let mut back = None;
    while killed.elapsed() < RESTART_BOUND * 2 {
        let (_, v) = ip.status_json();
        let n = IpRack::node(&v, node);
        if n["restarts"] == 1 && all_whole(&v).is_ok() {
            back = Some((killed.elapsed(), n.clone()));
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let (took, n) = back.unwrap_or_else(|| {
        panic!(
            "{node} is not whole {:?} after its daemon was killed: {:#}",
            RESTART_BOUND * 2,
            ip.status_json().1
        )
    });
    eprintln!(
        "{node} whole again {:.2} s after its daemon's kill -9",
        took.as_secs_f64()
    );
    assert_ne!(ip.daemon_pid(node), daemon, "{n:#}");
    assert!(
        ip.ping_until(PEER, node, PING_BOUND).is_some(),
        "no ping to {node} after its daemon came back"
    );
    let metrics = std::fs::read_to_string(ip.rack.dir.join("rack.toml")).unwrap();
    let rack: exanet_control::rack::RackFile = toml::from_str(&metrics).unwrap();
    let addr = rack.nodes[node].metrics.clone();
    let r = exanet_tests::http_get(&addr, "/metrics", Duration::from_secs(5)).unwrap();
    let restarts = metric_sum(
        &parse_prometheus(&r.body),
        "exanet_node_restarts_total",
        &[],
    );
    assert_eq!(restarts, 1.0, "exanet_node_restarts_total of {node}");
    // What the operator stops stays stopped.
    let other = "M1QAF3";
    let k = ip.exactl(&["node", "kill", other]);
    assert!(k.success(), "{}", k.describe());
    std::thread::sleep(RESTART_BOUND);
    let (_, v) = ip.status_json();
    assert_eq!(
        IpRack::node(&v, other)["services"]["daemon"]["state"],
        "down",
        "{other} was killed by `exactl node kill` and came back: {v:#}"
    );
    ip.down_and_check_clean();
}

#[test]
fn an_ip_service_killed_alone_is_restarted_and_counted() {
    if skip("node_whole::an_ip_service_killed_alone_is_restarted_and_counted") {
        return;
    }
    let ip = IpRack::up();
    let node = "M1QAF2";
    let service = ip.ip_pid(node);
    let daemon = ip.daemon_pid(node);
    sigkill(service);
    let killed = Instant::now();
    let mut back = None;
    while killed.elapsed() < RESTART_BOUND {
        let (_, v) = ip.status_json();
        let s = &IpRack::node(&v, node)["services"]["ip"];
        if s["state"] == "up" && s["pid"].as_i64().is_some_and(|p| p != i64::from(service)) {
            back = Some((killed.elapsed(), s.clone()));
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let (took, s) = back.unwrap_or_else(|| {
        panic!(
            "{node}'s IP service is not back {RESTART_BOUND:?} after it was killed: {:#}",
            ip.status_json().1
        )
    });
    eprintln!(
        "IP service of {node} back {:.3} s after kill -9",
        took.as_secs_f64()
    );
    assert_eq!(s["restarts"], 1, "{s:#}");
    assert_eq!(ip.daemon_pid(node), daemon, "the daemon was restarted too");
    assert!(
        ip.ping_until(PEER, node, PING_BOUND).is_some(),
        "no ping to {node} after its IP service came back"
    );
    let restarts = metric_sum(&ip.ip_metrics(node), "exanet_ip_restarts_total", &[]);
    assert_eq!(restarts, 1.0, "exanet_ip_restarts_total of {node}");
    let text = ip.exactl(&["status"]);
    assert!(text.success(), "{}", text.describe());
    ip.down_and_check_clean();
}

#[test]
fn node_pause_resume_and_kill_act_on_the_whole_node() {
    if skip("node_whole::node_pause_resume_and_kill_act_on_the_whole_node") {
        return;
    }
    let ip = IpRack::up();
    let daemon = ip.daemon_pid(VICTIM);
    let service = ip.ip_pid(VICTIM);

    let r = ip.exactl(&["node", "pause", VICTIM]);
    assert!(r.success(), "{}", r.describe());
    assert_eq!(state(daemon).as_deref(), Some("T"), "daemon not stopped");
    assert_eq!(
        state(service).as_deref(),
        Some("T"),
        "IP service not stopped"
    );
    let r = ip.exactl(&["status"]);
    assert!(!r.success(), "status with a paused node exited 0");
    assert!(
        r.stdout
            .lines()
            .any(|l| l.contains(VICTIM) && l.contains("IP service") && l.contains("paused")),
        "status does not say the IP service is paused:\n{}",
        r.stdout
    );
    let r = ip.exactl(&["node", "resume", VICTIM]);
    assert!(r.success(), "{}", r.describe());
    assert_ne!(state(daemon).as_deref(), Some("T"));
    assert_ne!(state(service).as_deref(), Some("T"));
    assert!(
        ip.ping_until(PEER, VICTIM, PING_BOUND).is_some(),
        "no ping after resume"
    );

    let r = ip.exactl(&["node", "kill", VICTIM]);
    assert!(r.success(), "{}", r.describe());
    wait_gone(daemon, "the daemon after node kill");
    wait_gone(service, "the IP service after node kill");
    // Killed by the operator: not restarted behind the operator's back.
    std::thread::sleep(Duration::from_secs(1));
    let (r, v) = ip.status_json();
    assert!(!r.success());
    let n = IpRack::node(&v, VICTIM);
    assert_eq!(n["services"]["daemon"]["state"], "down", "{n:#}");
    assert_eq!(n["services"]["ip"]["state"], "down", "{n:#}");
    // The node's namespace (its host, with whatever runs there) stays.
    assert_eq!(n["services"]["netns"]["state"], "up", "{n:#}");
    assert!(Path::new("/run/netns")
        .join(format!("exanet-{}-{VICTIM}", ip.name))
        .exists());

    let r = ip.exactl(&["node", "restart", VICTIM]);
    assert!(r.success(), "{}", r.describe());
    assert!(
        ip.ping_until(PEER, VICTIM, PING_BOUND).is_some(),
        "no ping after kill and restart"
    );
    let (r, v) = ip.status_json();
    assert!(r.success(), "{}", r.describe());
    all_whole(&v).unwrap();
    ip.down_and_check_clean();
}
