//! A rack over two hosts: the 2x2x1 rack (16 nodes) split over two network namespaces
//! standing for two machines, each with an address of its own, joined by a veth pair (the
//! cable between the hosts). Host A runs the 8 nodes of blade M1 (y = 0), host B the 8 of
//! blade M2 (y = 1), so the two torus Y links cross between the hosts and everything else
//! stays inside one. The rack file names each node by its host's address (as the Ansible
//! role writes it: `link = "HOST:21000+id"`, `listen = "0.0.0.0:..."`); the test makes the
//! certificates with `exactl rack pki`, starts every `exanetd` itself inside its host's
//! namespace, and operates the rack with `exactl` from the root namespace, which reaches the
//! hosts over a management network of its own (one more veth pair per host), as an
//! operator's machine would.
//!
//! It checks that
//! - every link of the rack comes up, the two between the hosts included, and every node
//!   is ready (`/ready` over the network);
//! - `exactl ping` crosses from a node of host A to one of host B and back;
//! - verified RDMA (writes compared byte for byte, read back) and mailbox messages cross,
//!   each ACKed message delivered exactly once;
//! - cutting the cable while traffic runs (a host partition) is survived: operations
//!   complete or fail with the NI's reason (timed out), the operator still sees both
//!   hosts, with exactly the links between them down; once the cable is back the links
//!   come back by themselves (new sessions), traffic completes at the first attempt, no
//!   message ACKed is lost, none is delivered twice, no data lands corrupt;
//! - `exactl rack down` stops the daemons of both hosts from the root namespace.
//!
//! The cut lasts until the operator sees the links between the hosts down, which takes
//! the QUIC idle timeout (10 s) after the last packet. While it lasts, a ping inside a host
//! on a path no traffic to the other host shares must answer; one through the input queue
//! of M1QBF1 where cells for the cut link wait (M1QAF3 -> M1QBF3, every link of it up) is
//! only observed and printed: switch input queues are FIFO per port and VC and cells for a
//! link that is down stay queued, so it gets no answer until the cable is back.
//!
//! Needs root and `ip` (iproute2); without either it prints a SKIPPED line and passes,
//! unless `EXANET_REQUIRE_ROOT` is set (to anything): then it fails. CI sets it. The
//! daemons are started through `setpriv` (util-linux, always installed on Debian).
//! Every address is private and only routed between these namespaces and the root
//! namespace (an `unreachable` route covers the block, so nothing to it ever takes the
//! default route); the namespaces have no default route; everything is removed at the
//! end, also when the test fails.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use exanet::{Endpoint, Gvas, Mailbox, MemoryRegion, Packetizer, RdmaPage};
use exanet_tests::{
    http_get, is_root, pattern, run_with_timeout, runs, skip_unless_required, Ledger, Run, Tally,
    TestRack,
};
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use serde_json::Value;

const SHAPE: &str = "2x2x1";
const NODES: usize = 16;
/// Links of a 2x2x1 rack: 6 in each of the 4 QFDBs, 2 X rings and 2 Y rings of two.
const LINKS: usize = 28;
/// The links between the hosts: the Y rings.
const CROSS_LINKS: usize = 2;
/// The workloads: one on each host, their traffic crossing the cable (M1QAF2 -> M1QAF1 ->
/// M1QBF1 -> M2QBF1 -> M2QBF3, dimension order X then Y).
const SRC: &str = "M1QAF2";
const DST: &str = "M2QBF3";
/// One RDMA transfer: 4 blocks of 16 KiB.
const LEN: u64 = 64 << 10;
/// Transfers use a fresh slot of their regions each, so that a late block of a transfer
/// that failed can only land where that transfer was going.
const SLOTS: u64 = 128;
/// Slots kept for the traffic after the recovery.
const SLOTS_RESERVED: u64 = 8;
/// Long enough for any operation to exhaust its retries.
const WAIT: Option<Duration> = Some(Duration::from_secs(30));
const LINK_PORT_BASE: u16 = 21000;
const METRICS_PORT_BASE: u16 = 22000;
/// Timeout of the `ip` commands.
const IP_TIMEOUT: Duration = Duration::from_secs(30);
/// Prefix of this test's namespaces; the pid of the test process follows.
const NS_PREFIX: &str = "exanet-t2h-";
/// The tag of the rack directory (`TestRack`).
const RACK_TAG: &str = "2hosts";
/// Prefix of the root namespace ends of this test's veths; the pid follows.
const IF_PREFIX: &str = "x2h";

fn host_of(node: &str) -> usize {
    // Blade M1 is y = 0 (host A), M2 is y = 1 (host B).
    if node.starts_with("M1") {
        0
    } else {
        1
    }
}

/// Every node of the rack, by id: ((z*Y + y)*X + x)*4 + fpga - 1.
fn node_names() -> Vec<String> {
    let mut out = Vec::new();
    for blade in 1..=2 {
        for slot in ['A', 'B'] {
            for fpga in 1..=4 {
                out.push(format!("M{blade}Q{slot}F{fpga}"));
            }
        }
    }
    out
}

// --- The network: two hosts, a cable, a management network to the root namespace.

/// `ip ARGS`; `args` is split at spaces (no name or address here has one).
fn ip(args: &str) -> Result<Run, String> {
    let mut c = Command::new("ip");
    c.args(args.split_whitespace());
    run_with_timeout(c, IP_TIMEOUT)
}

/// `ip ARGS`, which must succeed.
#[track_caller]
fn ip_ok(args: &str) {
    match ip(args) {
        Ok(r) if r.success() => {}
        Ok(r) => panic!("ip {args}: {}", r.describe()),
        Err(e) => panic!("ip {args}: {e}"),
    }
}

fn pid_alive(pid: i32) -> bool {
    Path::new(&format!("/proc/{pid}")).exists()
}

/// The two hosts and the wires between them. Dropping it removes all of it.
struct Net {
    ns: [String; 2],
    /// The two ends of the cable, in host A and host B.
    cable: [String; 2],
    /// Each host's address (on its end of the cable).
    addr: [String; 2],
    /// The root namespace ends of the management links.
    root_ifs: Vec<String>,
    /// The `unreachable` route covering every address of this run (`ip route del` args).
    guard_route: Option<String>,
}

impl Net {
    /// Namespaces, cable and management links, with addresses from `10.231.B.0/22`, the
    /// block chosen among the 64 of 10.231.0.0/16 so that nothing on this machine uses it:
    /// `.B.1` and `.B.2` for the hosts (on the cable, a /24), `.B+1.0/30` and `.B+2.0/30`
    /// for the management links of host A and host B.
    fn new() -> Net {
        sweep_stale();
        let pid = std::process::id();
        let tag = format!("{IF_PREFIX}{pid}");
        let mut net = Net {
            ns: [format!("{NS_PREFIX}{pid}-a"), format!("{NS_PREFIX}{pid}-b")],
            cable: [format!("{tag}a"), format!("{tag}b")],
            addr: [String::new(), String::new()],
            root_ifs: Vec::new(),
            guard_route: None,
        };
        let routes = ip("-4 route show table all").map_or(String::new(), |r| r.stdout);
        let addrs = ip("-4 -o addr show").map_or(String::new(), |r| r.stdout);
        let mut block = None;
        for i in 0..64u32 {
            let b = ((pid + i) % 64) * 4;
            let used = (b..b + 4).any(|o| {
                let p = format!("10.231.{o}.");
                routes.contains(&p) || addrs.contains(&p)
            });
            // Everything of the block not routed more precisely below is unreachable, so
            // nothing sent to it takes the default route off the machine. The metric is our
            // pid, so that a later run can tell a leftover of a killed run from the route of
            // a run in progress.
            let route = format!("unreachable 10.231.{b}.0/22 metric {pid}");
            if !used && ip(&format!("route add {route}")).is_ok_and(|r| r.success()) {
                net.guard_route = Some(route);
                block = Some(b);
                break;
            }
        }
        let b = block.expect("no free /22 in 10.231.0.0/16 for the test's addresses");
        net.addr = [format!("10.231.{b}.1"), format!("10.231.{b}.2")];
        let [ns_a, ns_b] = &net.ns;
        let [cable_a, cable_b] = &net.cable;

        for ns in &net.ns {
            ip_ok(&format!("netns add {ns}"));
            ip_ok(&format!("-n {ns} link set lo up"));
        }
        // The cable.
        ip_ok(&format!(
            "link add {cable_a} netns {ns_a} type veth peer name {cable_b} netns {ns_b}"
        ));
        for h in 0..2 {
            let (ns, cable, addr) = (&net.ns[h], &net.cable[h], &net.addr[h]);
            ip_ok(&format!("-n {ns} addr add {addr}/24 dev {cable}"));
            ip_ok(&format!("-n {ns} link set {cable} up"));
        }
        // The management links, root .1 <-> host .2, and in the root namespace a route to
        // the host's address through it. The hosts get no route beyond their two links.
        for h in 0..2 {
            let (ns, addr) = (&net.ns[h], &net.addr[h]);
            let side = ["a", "b"][h];
            let (root_if, host_if) = (format!("{tag}r{side}"), format!("{tag}m{side}"));
            ip_ok(&format!(
                "link add {root_if} type veth peer name {host_if} netns {ns}"
            ));
            net.root_ifs.push(root_if.clone());
            let o = b + 1 + h as u32;
            ip_ok(&format!("addr add 10.231.{o}.1/30 dev {root_if}"));
            ip_ok(&format!("-n {ns} addr add 10.231.{o}.2/30 dev {host_if}"));
            ip_ok(&format!("link set {root_if} up"));
            ip_ok(&format!("-n {ns} link set {host_if} up"));
            ip_ok(&format!(
                "route add {addr}/32 via 10.231.{o}.2 dev {root_if}"
            ));
        }
        net
    }

    /// Pulls the cable out of host A (its end down; host B's end loses its carrier).
    fn cut(&self) {
        ip_ok(&format!(
            "-n {} link set {} down",
            self.ns[0], self.cable[0]
        ));
    }

    fn restore(&self) {
        ip_ok(&format!("-n {} link set {} up", self.ns[0], self.cable[0]));
    }
}

impl Drop for Net {
    fn drop(&mut self) {
        for ns in &self.ns {
            // Whatever still runs in it (the daemons are stopped before this).
            kill_in_namespace(ns);
            match ip(&format!("netns del {ns}")) {
                Ok(r) if r.success() || r.stderr.contains("No such file") => {}
                Ok(r) => eprintln!("cleanup: ip netns del {ns}: {}", r.describe()),
                Err(e) => eprintln!("cleanup: ip netns del {ns}: {e}"),
            }
        }
        // Deleting a namespace deletes the veths with an end in it; make sure.
        for i in &self.root_ifs {
            if ip(&format!("link show {i}")).is_ok_and(|r| r.success()) {
                let _ = ip(&format!("link del {i}"));
            }
        }
        if let Some(route) = &self.guard_route {
            match ip(&format!("route del {route}")) {
                Ok(r) if r.success() => {}
                Ok(r) => eprintln!("cleanup: ip route del {route}: {}", r.describe()),
                Err(e) => eprintln!("cleanup: ip route del {route}: {e}"),
            }
        }
    }
}

/// SIGKILLs the exanetd processes running in namespace `ns`.
fn kill_in_namespace(ns: &str) {
    let Ok(r) = ip(&format!("netns pids {ns}")) else {
        return;
    };
    for pid in r
        .stdout
        .split_whitespace()
        .filter_map(|p| p.parse::<i32>().ok())
    {
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
        if pid > 1 && String::from_utf8_lossy(&cmdline).contains("exanetd") {
            eprintln!("cleanup: killing exanetd pid {pid} left in {ns}");
            // pid > 1 names one process, an exanetd in this test's namespace.
            let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
        }
    }
}

/// Removes what an earlier run of this test that was killed (and so could not clean up)
/// left behind: its namespaces (and the daemons in them), its management links and its
/// route, all named after its pid, when no process has that pid any more.
fn sweep_stale() {
    let dead = |pid: &str| pid.parse::<i32>().is_ok_and(|p| !pid_alive(p));
    if let Ok(r) = ip("netns list") {
        for name in r.stdout.lines().filter_map(|l| l.split_whitespace().next()) {
            let Some(rest) = name.strip_prefix(NS_PREFIX) else {
                continue;
            };
            let pid = rest.rsplit_once('-').map_or(rest, |(p, _)| p);
            if dead(pid) {
                eprintln!("removing namespace {name} left by a killed run");
                kill_in_namespace(name);
                let _ = ip(&format!("netns del {name}"));
            }
        }
    }
    if let Ok(r) = ip("-o link show") {
        for l in r.stdout.lines() {
            // "7: x2h123ra@if6: <...>"
            let Some(name) = l
                .split(':')
                .nth(1)
                .map(|n| n.trim().split('@').next().unwrap_or(""))
            else {
                continue;
            };
            let Some(rest) = name.strip_prefix(IF_PREFIX) else {
                continue;
            };
            if dead(rest.trim_end_matches(|c: char| c.is_ascii_alphabetic())) {
                eprintln!("removing link {name} left by a killed run");
                let _ = ip(&format!("link del {name}"));
            }
        }
    }
    // TestRack's directories: exanet-e2e-2hosts-PID-N.
    if let Ok(rd) = std::fs::read_dir(std::env::temp_dir()) {
        for e in rd.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            let Some(rest) = name.strip_prefix(&format!("exanet-e2e-{RACK_TAG}-")) else {
                continue;
            };
            if rest.split_once('-').is_some_and(|(pid, _)| dead(pid)) {
                eprintln!("removing rack directory {name} left by a killed run");
                let _ = std::fs::remove_dir_all(e.path());
            }
        }
    }
    if let Ok(r) = ip("-4 route show type unreachable") {
        for l in r.stdout.lines() {
            // "unreachable 10.231.B.0/22 metric PID"
            let w: Vec<&str> = l.split_whitespace().collect();
            let (Some(prefix), Some(i)) = (
                w.iter()
                    .find(|x| x.starts_with("10.231.") && x.ends_with("/22")),
                w.iter().position(|x| *x == "metric"),
            ) else {
                continue;
            };
            if let Some(pid) = w.get(i + 1).filter(|p| dead(p)) {
                eprintln!("removing route {prefix} left by a killed run");
                let _ = ip(&format!("route del unreachable {prefix} metric {pid}"));
            }
        }
    }
}

// --- The rack over the two hosts.

struct TwoHosts {
    /// The daemons, by node id (stopped first on drop).
    daemons: Vec<(String, Child)>,
    rack: TestRack,
    net: Net,
}

impl TwoHosts {
    fn new() -> TwoHosts {
        let net = Net::new();
        let rack = TestRack::new(RACK_TAG);
        let mut h = TwoHosts {
            daemons: Vec::new(),
            rack,
            net,
        };
        h.write_rack_file();
        let r = h.rack.exactl(&["rack", "pki"]);
        assert!(r.success(), "exactl rack pki: {}", r.describe());
        for d in ["logs", "run"] {
            std::fs::create_dir_all(h.rack.dir.join(d)).unwrap();
        }
        for (id, node) in node_names().into_iter().enumerate() {
            let child = h.start_daemon(&node);
            assert_eq!(h.daemons.len(), id);
            h.daemons.push((node, child));
        }
        h
    }

    fn dir(&self) -> &Path {
        &self.rack.dir
    }

    fn write_rack_file(&self) {
        std::fs::create_dir_all(self.dir()).unwrap();
        let mut text = format!(
            "# The two_hosts test: blade M1 on host A ({}), blade M2 on host B ({}).\n\
             name = \"two-hosts\"\nshape = \"{SHAPE}\"\n",
            self.net.addr[0], self.net.addr[1]
        );
        for (id, node) in node_names().iter().enumerate() {
            let addr = &self.net.addr[host_of(node)];
            let (l, m) = (LINK_PORT_BASE + id as u16, METRICS_PORT_BASE + id as u16);
            text.push_str(&format!(
                "\n[nodes.{node}]\nlink = \"{addr}:{l}\"\nmetrics = \"{addr}:{m}\"\n\
                 listen = \"0.0.0.0:{l}\"\nmetrics_listen = \"0.0.0.0:{m}\"\n"
            ));
        }
        text.push_str(
            "\n[deploy]\nkind = \"external\"\n\
             how = \"started by the two_hosts test in network namespaces\"\n",
        );
        std::fs::write(self.dir().join("rack.toml"), text).unwrap();
    }

    /// `ip netns exec HOST setpriv --pdeathsig KILL exanetd --rack DIR --node NODE`, its
    /// output in `logs/NODE.log`. `ip netns exec` and `setpriv` each exec the next program
    /// in place, so the child is the daemon. The daemon dies with the thread that started
    /// it (`--pdeathsig KILL`, which survives the exec of exanetd), should this test be
    /// killed.
    fn start_daemon(&self, node: &str) -> Child {
        let log_path = self.dir().join("logs").join(format!("{node}.log"));
        let log = std::fs::File::create(&log_path).unwrap();
        let mut c = Command::new("ip");
        c.args(["netns", "exec", &self.net.ns[host_of(node)]])
            .args(["setpriv", "--pdeathsig", "KILL"])
            .arg(&self.rack.bins.exanetd)
            .arg("--rack")
            .arg(self.dir())
            .arg("--node")
            .arg(node)
            .current_dir("/")
            .env("RUST_LOG", "info")
            .env_remove("EXANET_RACK")
            .env_remove("EXANET_NODE")
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log);
        c.spawn()
            .unwrap_or_else(|e| panic!("cannot start the daemon of {node} with ip netns exec: {e}"))
    }

    fn metrics_addr(&self, node: &str) -> String {
        let id = node_names().iter().position(|n| n == node).unwrap();
        format!(
            "{}:{}",
            self.net.addr[host_of(node)],
            METRICS_PORT_BASE + id as u16
        )
    }

    /// `exactl status --json` (its exit status says whether every node answered).
    fn status(&self) -> Result<Value, String> {
        let r = self.rack.exactl(&["status", "--json"]);
        serde_json::from_str(&r.stdout).map_err(|e| format!("{e}: {}", r.describe()))
    }

    /// Daemons that exited.
    fn exited(&mut self) -> Vec<String> {
        self.daemons
            .iter_mut()
            .filter_map(|(n, c)| match c.try_wait() {
                Ok(Some(st)) => Some(format!("{n} ({st})")),
                _ => None,
            })
            .collect()
    }

    /// Polls `exactl status` until `done` holds of it, at most `limit`; the time it took.
    #[track_caller]
    fn wait_status(
        &mut self,
        what: &str,
        limit: Duration,
        done: impl Fn(&Links) -> bool,
    ) -> Duration {
        let t0 = Instant::now();
        loop {
            let gone = self.exited();
            assert!(
                gone.is_empty(),
                "daemons exited while waiting for {what}: {gone:?}"
            );
            let last = match self.status() {
                Ok(v) => {
                    let l = Links::of(&v);
                    if done(&l) {
                        return t0.elapsed();
                    }
                    l.describe()
                }
                Err(e) => e,
            };
            assert!(
                t0.elapsed() < limit,
                "{what}: not within {} s; last status: {last}",
                limit.as_secs()
            );
            std::thread::sleep(Duration::from_millis(300));
        }
    }
}

impl Drop for TwoHosts {
    fn drop(&mut self) {
        // The daemons first (SIGTERM, then SIGKILL), while the network still routes to them.
        for (_, c) in &mut self.daemons {
            if let Ok(None) = c.try_wait() {
                // The pid is our child's, not yet reaped.
                let _ = kill(Pid::from_raw(c.id() as i32), Signal::SIGTERM);
            }
        }
        let deadline = Instant::now() + Duration::from_secs(10);
        for (n, c) in &mut self.daemons {
            loop {
                match c.try_wait() {
                    Ok(None) if Instant::now() < deadline => {
                        std::thread::sleep(Duration::from_millis(20))
                    }
                    Ok(None) => {
                        eprintln!("cleanup: {n} ignored SIGTERM; killing it");
                        let _ = c.kill();
                        let _ = c.wait();
                        break;
                    }
                    _ => break,
                }
            }
        }
        // No daemon is left for TestRack's `exactl rack down` to ask: without the rack
        // file it asks nobody (and the addresses are about to go away).
        let _ = std::fs::remove_file(self.dir().join("rack.toml"));
        // Then `rack` (log tails on failure, the directory) and `net` drop, in that order.
    }
}

/// The links of an `exactl status --json`.
struct Links {
    reachable: usize,
    /// (a, b, kind, state, sessions seen at the a end)
    links: Vec<(String, String, String, String, u64)>,
}

impl Links {
    fn of(v: &Value) -> Links {
        let links = v["links"]
            .as_array()
            .map(|ls| {
                ls.iter()
                    .map(|l| {
                        let s = |k: &str| l[k].as_str().unwrap_or("?").to_string();
                        (
                            s("a"),
                            s("b"),
                            s("kind"),
                            s("state"),
                            l["a_end"]["sessions"].as_u64().unwrap_or(0),
                        )
                    })
                    .collect()
            })
            .unwrap_or_default();
        Links {
            reachable: v["summary"]["nodes_reachable"].as_u64().unwrap_or(0) as usize,
            links,
        }
    }

    fn cross(&self) -> impl Iterator<Item = &(String, String, String, String, u64)> {
        self.links.iter().filter(|l| host_of(&l.0) != host_of(&l.1))
    }

    fn inside(&self) -> impl Iterator<Item = &(String, String, String, String, u64)> {
        self.links.iter().filter(|l| host_of(&l.0) == host_of(&l.1))
    }

    fn all_up(&self) -> bool {
        self.reachable == NODES
            && self.links.len() == LINKS
            && self.links.iter().all(|l| l.3 == "up")
    }

    /// Both hosts answer, the links between them are down, every other is up.
    fn partitioned(&self) -> bool {
        self.reachable == NODES
            && self.links.len() == LINKS
            && self.cross().all(|l| l.3 == "down")
            && self.inside().all(|l| l.3 == "up")
    }

    fn describe(&self) -> String {
        let not_up: Vec<String> = self
            .links
            .iter()
            .filter(|l| l.3 != "up")
            .map(|l| format!("{}-{} {}", l.0, l.1, l.3))
            .collect();
        format!(
            "{} of {NODES} nodes answered, {} links, not up: {not_up:?}",
            self.reachable,
            self.links.len()
        )
    }
}

/// Sets its flag when dropped.
struct StopOnDrop(Arc<AtomicBool>);

impl Drop for StopOnDrop {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Relaxed);
    }
}

// --- Traffic between the hosts.

/// What traffic came to.
/// Where a transfer went: its region (on the destination) and slot, and what it carried.
struct Landed {
    what: &'static str,
    slot: u64,
    seed: u64,
}

/// A workload on each host: A writes to B and reads it back, B writes to A, A sends
/// messages to a mailbox of B.
struct Workloads {
    a: Endpoint,
    b: Endpoint,
    a_src: MemoryRegion,
    a_back: MemoryRegion,
    a_dst: MemoryRegion,
    b_src: MemoryRegion,
    b_dst: MemoryRegion,
    a_page: RdmaPage,
    b_page: RdmaPage,
    tx: Packetizer,
    inbox: Mailbox,
    inbox_addr: Gvas,
    next_slot: u64,
    seq: u64,
    /// Every message sent, ACKed and delivered.
    ledger: Ledger,
    /// Transfers that did not complete: whatever of them arrived late must be right.
    unfinished: Vec<Landed>,
}

impl Workloads {
    fn attach(dir: &Path) -> Workloads {
        let attach = |node: &str| {
            Endpoint::attach_to(dir, node, None)
                .unwrap_or_else(|e| panic!("cannot attach to {node} from the root namespace: {e}"))
        };
        let (a, b) = (attach(SRC), attach(DST));
        let reg = |ep: &Endpoint| ep.register(LEN * SLOTS).unwrap();
        let (a_src, a_back, a_dst) = (reg(&a), reg(&a), reg(&b));
        let (b_src, b_dst) = (reg(&b), reg(&a));
        // a_dst is B's (A writes into it), b_dst is A's (B writes into it).
        let (a_page, b_page) = (a.rdma_page().unwrap(), b.rdma_page().unwrap());
        let tx = a.packetizer().unwrap();
        let inbox = b.mailbox(256).unwrap();
        let inbox_addr = a.mailbox_addr(b.node_id(), b.rank(), inbox.vi()).unwrap();
        Workloads {
            a,
            b,
            a_src,
            a_back,
            a_dst,
            b_src,
            b_dst,
            a_page,
            b_page,
            tx,
            inbox,
            inbox_addr,
            next_slot: 0,
            seq: 0,
            ledger: Ledger::default(),
            unfinished: Vec::new(),
        }
    }

    /// A fresh slot, unless only the reserved ones are left (and `reserve` is false).
    fn slot(&mut self, reserve: bool) -> Option<u64> {
        let limit = if reserve {
            SLOTS
        } else {
            SLOTS - SLOTS_RESERVED
        };
        (self.next_slot < limit).then(|| {
            self.next_slot += 1;
            self.next_slot - 1
        })
    }

    /// A writes a fresh pattern into B and, if that completed, reads it back; B writes a
    /// fresh pattern into A. Whatever completes is compared byte for byte.
    fn rdma(&mut self, t: &mut Tally, reserve: bool) -> bool {
        let Some(s) = self.slot(reserve) else {
            return false;
        };
        let off = s * LEN;
        // A -> B.
        let seed = s * 2;
        let data = pattern(seed, LEN as usize);
        self.a_src.write(off, &data).unwrap();
        let to = self.a_dst.gvas(off).unwrap();
        let tag = self
            .a_page
            .write(0, &self.a_src, off, to, LEN, None)
            .unwrap();
        match self.a.wait(tag, WAIT) {
            Ok(()) => {
                t.ok += 1;
                assert!(
                    self.a_dst.to_vec(off, LEN).unwrap() == data,
                    "an RDMA write from host A completed with corrupt data on host B (slot {s})"
                );
                let tag = self.a_page.read(0, to, &self.a_back, off, LEN).unwrap();
                match self.a.wait(tag, WAIT) {
                    Ok(()) => {
                        t.ok += 1;
                        assert!(
                            self.a_back.to_vec(off, LEN).unwrap() == data,
                            "an RDMA read of host B's memory completed with corrupt data (slot {s})"
                        );
                    }
                    Err(e) => {
                        t.fail(e);
                        self.unfinished.push(Landed {
                            what: "read back",
                            slot: s,
                            seed,
                        });
                    }
                }
            }
            Err(e) => {
                t.fail(e);
                self.unfinished.push(Landed {
                    what: "A -> B",
                    slot: s,
                    seed,
                });
            }
        }
        // B -> A.
        let seed = s * 2 + 1;
        let data = pattern(seed, LEN as usize);
        self.b_src.write(off, &data).unwrap();
        let to = self.b_dst.gvas(off).unwrap();
        let tag = self
            .b_page
            .write(0, &self.b_src, off, to, LEN, None)
            .unwrap();
        match self.b.wait(tag, WAIT) {
            Ok(()) => {
                t.ok += 1;
                assert!(
                    self.b_dst.to_vec(off, LEN).unwrap() == data,
                    "an RDMA write from host B completed with corrupt data on host A (slot {s})"
                );
            }
            Err(e) => {
                t.fail(e);
                self.unfinished.push(Landed {
                    what: "B -> A",
                    slot: s,
                    seed,
                });
            }
        }
        true
    }

    /// One 64-byte message from A to B's mailbox, carrying its sequence number.
    fn message(&mut self, t: &mut Tally) {
        self.seq += 1;
        let to = self.inbox_addr;
        self.ledger.send(
            t,
            &self.a,
            &self.tx,
            to,
            (self.seq, self.seq.wrapping_add(1 << 40)),
            WAIT,
        );
        self.drain(t);
    }

    /// Checks every message that arrived against what was sent under its number.
    fn drain(&mut self, t: &mut Tally) {
        t.received += self.ledger.drain(&self.inbox);
    }

    /// Every message ACKed so far has been delivered.
    #[track_caller]
    fn assert_acked_delivered(&mut self, t: &mut Tally) {
        t.received += self
            .ledger
            .assert_acked_delivered(&self.inbox, Duration::from_secs(20));
    }

    /// `rounds` of RDMA (from the reserved slots if need be) and `messages` messages.
    fn traffic(&mut self, rounds: u32, messages: u32) -> Tally {
        let mut t = Tally::default();
        for _ in 0..rounds {
            assert!(self.rdma(&mut t, true), "out of RDMA slots");
        }
        for _ in 0..messages {
            self.message(&mut t);
        }
        self.assert_acked_delivered(&mut t);
        t
    }

    /// Whatever arrived of a transfer that did not complete is what it carried: each
    /// 256-byte cell of its slot holds its data or is untouched (zero).
    #[track_caller]
    fn assert_unfinished_clean(&self) -> (usize, usize) {
        let (mut landed, mut cells) = (0, 0);
        for u in &self.unfinished {
            let region = match u.what {
                "A -> B" => &self.a_dst,
                "read back" => &self.a_back,
                _ => &self.b_dst,
            };
            let got = region.to_vec(u.slot * LEN, LEN).unwrap();
            let want = pattern(u.seed, LEN as usize);
            for (i, (g, w)) in got.chunks(256).zip(want.chunks(256)).enumerate() {
                cells += 1;
                if g == w {
                    landed += 1;
                } else {
                    assert!(
                        g.iter().all(|&x| x == 0),
                        "{} transfer in slot {} that did not complete left corrupt data in \
                         cell {i} (bytes {}..{})",
                        u.what,
                        u.slot,
                        i * 256,
                        (i + 1) * 256
                    );
                }
            }
        }
        (landed, cells)
    }
}

#[test]
fn rack_over_two_hosts_survives_a_host_partition() {
    const TEST: &str = "two_hosts::rack_over_two_hosts_survives_a_host_partition";
    let why = if !is_root() {
        Some("it makes network namespaces and veths: needs root")
    } else if !runs("ip", "-V") {
        Some("needs `ip` (Debian: apt-get install iproute2)")
    } else {
        None
    };
    if let Some(why) = why {
        skip_unless_required("EXANET_REQUIRE_ROOT", TEST, why);
        return;
    }
    let t0 = Instant::now();
    let mut h = TwoHosts::new();
    eprintln!(
        "host A {} ({}), host B {} ({}), rack {}",
        h.net.ns[0],
        h.net.addr[0],
        h.net.ns[1],
        h.net.addr[1],
        h.dir().display()
    );

    // Every link comes up, those between the hosts included, and every node is ready.
    let up = h.wait_status("every link up", Duration::from_secs(90), Links::all_up);
    eprintln!(
        "all {LINKS} links up {:.1} s after the daemons started",
        up.as_secs_f64()
    );
    let v = h.status().unwrap();
    let links = Links::of(&v);
    let cross: Vec<_> = links.cross().collect();
    assert_eq!(cross.len(), CROSS_LINKS, "{}", links.describe());
    assert!(
        cross.iter().all(|l| l.2 == "torus_y"),
        "{}",
        links.describe()
    );
    for node in node_names() {
        let r = http_get(&h.metrics_addr(&node), "/ready", Duration::from_secs(10))
            .unwrap_or_else(|e| panic!("/ready of {node}: {e}"));
        assert_eq!(r.status, 200, "{node} is not ready: {}", r.body);
    }

    // A ping crosses between the hosts, both ways.
    for (from, to) in [(SRC, DST), (DST, SRC)] {
        let r = h.rack.exactl(&["ping", from, to, "--json"]);
        assert!(r.success(), "exactl ping {from} {to}: {}", r.describe());
        let p = r.json();
        assert!(p["received"].as_u64().unwrap_or(0) >= 1, "{p}");
        let path: Vec<&str> = p["path"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(Value::as_str)
            .collect();
        assert!(
            path.first() == Some(&from) && path.last() == Some(&to),
            "ping {from} {to} recorded the path {path:?}"
        );
        assert!(
            path.windows(2).any(|w| host_of(w[0]) != host_of(w[1])),
            "the path {path:?} does not cross between the hosts"
        );
        eprintln!(
            "ping {from} -> {to}: {} hops {path:?}, rtt {:.0} us, {}/{} back",
            p["hops"],
            p["rtt_us"].as_f64().unwrap_or(0.0),
            p["received"],
            p["sent"]
        );
    }

    // Verified RDMA and messages cross, every message ACKed delivered exactly once.
    let mut w = Workloads::attach(h.dir());
    let t = w.traffic(2, 20);
    assert_eq!(t.failures(), 0, "traffic between the hosts failed: {t:?}");
    assert_eq!((t.ok, t.received), (2 * 3 + 20, 20), "{t:?}");
    eprintln!("traffic between the hosts: {t:?}");

    // The cable is cut while traffic runs.
    let sessions_before: Vec<u64> = links.cross().map(|l| l.4).collect();
    let stop = Arc::new(AtomicBool::new(false));
    // Should the test fail, the traffic stops before the daemons do.
    let _stop_on_failure = StopOnDrop(stop.clone());
    let (ops_ok, ops_failed) = (Arc::new(AtomicU32::new(0)), Arc::new(AtomicU32::new(0)));
    let traffic = {
        let (stop, ops_ok, ops_failed) = (stop.clone(), ops_ok.clone(), ops_failed.clone());
        std::thread::spawn(move || {
            let mut t = Tally::default();
            while !stop.load(Ordering::Relaxed) {
                let (ok0, failed0) = (t.ok, t.failures());
                w.rdma(&mut t, false);
                w.message(&mut t);
                ops_ok.fetch_add(t.ok - ok0, Ordering::Relaxed);
                ops_failed.fetch_add(t.failures() - failed0, Ordering::Relaxed);
                std::thread::sleep(Duration::from_millis(100));
            }
            (w, t)
        })
    };
    let deadline = Instant::now() + Duration::from_secs(60);
    while ops_ok.load(Ordering::Relaxed) < 4 && !traffic.is_finished() {
        assert!(Instant::now() < deadline, "the traffic did not get going");
        std::thread::sleep(Duration::from_millis(10));
    }
    h.net.cut();
    let cut_at = Instant::now();
    let ok_at_cut = ops_ok.load(Ordering::Relaxed);
    eprintln!("cable cut after {ok_at_cut} operations completed");
    // The operator still sees both hosts: exactly the links between them go down.
    let down = h.wait_status(
        "the links between the hosts down, all others up",
        Duration::from_secs(60),
        Links::partitioned,
    );
    eprintln!(
        "links between the hosts down {:.1} s after the cut (QUIC idle timeout)",
        down.as_secs_f64()
    );
    let deadline = Instant::now() + Duration::from_secs(60);
    while ops_failed.load(Ordering::Relaxed) == 0 && !traffic.is_finished() {
        assert!(
            Instant::now() < deadline,
            "no operation failed while the hosts were cut apart"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    // The operator's ping says so: between the hosts no probe comes back; inside each host
    // a path that no traffic to the other host shares answers.
    let ping = |from: &str, to: &str, ms: &str| {
        h.rack
            .exactl(&["ping", from, to, "--count", "1", "--timeout-ms", ms])
    };
    let r = ping(SRC, DST, "2000");
    assert_eq!(
        r.code(),
        Some(1),
        "ping between the hosts while the cable is cut: {}",
        r.describe()
    );
    eprintln!("during the cut: ping {SRC} -> {DST}: {}", r.stderr.trim());
    for (from, to) in [("M1QAF3", "M1QAF4"), ("M2QBF2", "M2QBF4")] {
        let r = ping(from, to, "10000");
        assert!(
            r.success(),
            "ping {from} -> {to} inside one host during the cut: {}",
            r.describe()
        );
    }
    // Observed, not asserted: a path inside host A through M1QBF1, where cells of the
    // traffic to host B wait for the cut link at the head of the input queue they share
    // with it (switch input queues are FIFO per port and VC, and cells for a link that is
    // down stay queued until it comes back), gets no answer while the cut lasts.
    let r = ping("M1QAF3", "M1QBF3", "3000");
    let queued = h.status().ok().and_then(|v| {
        v["nodes"]
            .as_array()?
            .iter()
            .find(|n| n["node"] == "M1QBF1")
            .and_then(|n| {
                n["links"]
                    .as_array()?
                    .iter()
                    .find(|l| l["peer"] == "M1QAF1")
                    .map(|l| l["queue_cells"].clone())
            })
    });
    eprintln!(
        "during the cut (observed): ping M1QAF3 -> M1QBF3, inside host A through M1QBF1: {} \
         (M1QBF1 holds {} cells from M1QAF1 for the cut link)",
        if r.success() {
            "answered".to_string()
        } else {
            r.stderr.trim().to_string()
        },
        queued.unwrap_or(Value::Null)
    );

    // The cable is back: the links come back by themselves.
    h.net.restore();
    let cut_for = cut_at.elapsed();
    let back = h.wait_status(
        "the links between the hosts back after the cable is restored",
        Duration::from_secs(60),
        Links::all_up,
    );
    eprintln!(
        "links between the hosts up again {:.1} s after the cable was restored (cut for {:.1} s)",
        back.as_secs_f64(),
        cut_for.as_secs_f64()
    );
    stop.store(true, Ordering::Relaxed);
    let (mut w, mut during) = match traffic.join() {
        Ok(r) => r,
        Err(p) => std::panic::resume_unwind(p),
    };
    eprintln!("traffic across the cut: {during:?}");
    assert!(during.ok >= 4, "{during:?}");
    assert!(
        during.failed.keys().all(|k| k.contains("timed out")),
        "operations across a cut cable failed for other reasons than timing out: {during:?}"
    );
    assert!(
        during.failed.keys().any(|k| k.contains("timed out")),
        "no operation timed out across the cut: {during:?}"
    );
    w.assert_acked_delivered(&mut during);
    let v = h.status().unwrap();
    let links = Links::of(&v);
    let sessions_after: Vec<u64> = links.cross().map(|l| l.4).collect();
    assert!(
        sessions_after
            .iter()
            .zip(&sessions_before)
            .all(|(a, b)| a > b),
        "the links between the hosts did not start new sessions: {sessions_before:?} -> \
         {sessions_after:?}"
    );

    // Traffic completes at the first attempt, and nothing is lost or doubled.
    let after = w.traffic(3, 20);
    assert_eq!(after.failures(), 0, "traffic after the recovery: {after:?}");
    assert_eq!(after.ok, 3 * 3 + 20, "{after:?}");
    // (A message of the cut may arrive among these: more is fine, each once.)
    assert!(after.received >= 20, "{after:?}");
    w.assert_acked_delivered(&mut during);
    let lost_unacked = w.ledger.sent.len() - w.ledger.delivered.len();
    // A message the NI gave up on may still arrive: its cells waited in a switch for the
    // link and went out when it came back (at most once, as checked).
    let failed_delivered = w.ledger.delivered.difference(&w.ledger.acked).count();
    let (landed, cells) = w.assert_unfinished_clean();
    eprintln!(
        "after the recovery: {after:?}; {} messages sent, {} ACKed, {} delivered once each \
         ({failed_delivered} of them reported timed out; {lost_unacked} not delivered, none \
         of them ACKed); {} transfers unfinished, {landed} of their {cells} cells landed \
         late, all intact",
        w.ledger.sent.len(),
        w.ledger.acked.len(),
        w.ledger.delivered.len(),
        w.unfinished.len()
    );
    drop(w);

    // exactl stops the daemons of both hosts from the root namespace.
    let r = h.rack.exactl(&["rack", "down", "--timeout", "20"]);
    assert!(r.success(), "exactl rack down: {}", r.describe());
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let left: Vec<String> = h
            .daemons
            .iter_mut()
            .filter_map(|(n, c)| (!matches!(c.try_wait(), Ok(Some(_)))).then(|| n.clone()))
            .collect();
        if left.is_empty() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "exactl rack down left daemons running: {left:?}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    eprintln!("two hosts test done in {:.1} s", t0.elapsed().as_secs_f64());
}
