//! Whether the daemon processes of a local rack are alive, found without asking them: a
//! daemon whose process is gone cannot answer, and waiting out a control timeout for it
//! (seconds per command) only to print "no answer" tells the operator less than this does.
//!
//! Only racks whose daemons are local processes (`[deploy]` absent or `local`) are looked
//! at; for compose, swarm, Kubernetes or hosts exactl cannot see the processes and every
//! node is [`Liveness::Unknown`] (asked as before). A node of a local rack is
//! [`Liveness::Gone`] only on positive evidence, and only when nothing else could be its
//! daemon:
//!
//! - its pid file names a process that is no longer its daemon (exited, a zombie, or a
//!   recycled pid), or there is no pid file (`rack down` and `node kill` remove them);
//! - and its link address is one of this host's (so a daemon there would be in this
//!   network namespace) and no UDP socket of this host holds that port, as the daemon's
//!   QUIC endpoint does from start to exit.
//!
//! A live process behind the pid file, a pid file that is not a pid, an address of
//! another host or namespace, a host name, or a port someone holds: [`Liveness::Unknown`],
//! and the daemon is asked. A paused daemon is alive (it is asked, and does not answer).

use std::collections::HashSet;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, UdpSocket};
use std::path::Path;

use exanet_control::rack::{Deploy, Rack};
use exanet_proto::NodeId;

use crate::error::{CliError, NOT_RUNNING};
use crate::process::{self, PidFile};

/// What is known of one node's daemon process without asking it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Liveness {
    /// Its process runs (it may still be paused or slow): ask it.
    Running { pid: i32 },
    /// Its process is gone; why exactl knows (`pid 1234 exited`).
    Gone(String),
    /// exactl cannot tell: ask it.
    Unknown,
}

/// The liveness of every node of a rack, indexed by node id.
#[derive(Clone, Debug)]
pub struct RackLiveness {
    pub nodes: Vec<Liveness>,
}

impl RackLiveness {
    /// Looks at the rack's pid files and this host's UDP sockets (nothing is asked).
    pub fn of(rack: &Rack) -> RackLiveness {
        let shape = rack.shape();
        let n = shape.nodes() as usize;
        let local = matches!(rack.file.deploy, None | Some(Deploy::Local));
        if !local {
            return RackLiveness {
                nodes: vec![Liveness::Unknown; n],
            };
        }
        let layout = rack.layout();
        let dir = rack.dir.canonicalize().unwrap_or_else(|_| rack.dir.clone());
        let sockets = UdpPorts::read();
        let nodes = shape
            .node_ids()
            .map(|id| {
                let node = shape.display(id);
                let entry = rack.entry(id);
                let link = || local_link_addr(&entry.link, entry.listen.as_deref());
                node_liveness(&layout.pid_file(&node), &node, &dir, link, sockets.as_ref())
            })
            .collect();
        RackLiveness { nodes }
    }

    /// Why node `id`'s process is known to be gone, if it is.
    pub fn gone(&self, id: NodeId) -> Option<&str> {
        match self.nodes.get(id.0 as usize) {
            Some(Liveness::Gone(why)) => Some(why),
            _ => None,
        }
    }

    /// `process not running (pid 1234 exited)` for a node known to be gone.
    pub fn message(&self, id: NodeId) -> Option<String> {
        self.gone(id).map(|why| format!("{NOT_RUNNING} ({why})"))
    }

    pub fn gone_count(&self) -> usize {
        self.nodes
            .iter()
            .filter(|l| matches!(l, Liveness::Gone(_)))
            .count()
    }

    /// True when every node's process is known to be gone: the rack is not running.
    pub fn all_gone(&self) -> bool {
        !self.nodes.is_empty() && self.gone_count() == self.nodes.len()
    }
}

/// One service of a node as `exactl status` shows it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ServiceState {
    Up {
        pid: Option<i32>,
    },
    /// Stopped by SIGSTOP (`exactl node pause`).
    Paused {
        pid: i32,
    },
    /// Why, and what brings it back.
    Down(String),
    /// The rack runs no such service (a rack without IP over ExaNet).
    Off,
    /// exactl cannot see it (the daemons are not local processes).
    Unknown,
}

impl ServiceState {
    pub fn label(&self) -> &'static str {
        match self {
            ServiceState::Up { .. } => "up",
            ServiceState::Paused { .. } => "paused",
            ServiceState::Down(_) => "down",
            ServiceState::Off => "off",
            ServiceState::Unknown => "unknown",
        }
    }

    /// Counts against the node being whole: down or paused.
    pub fn is_down(&self) -> bool {
        matches!(self, ServiceState::Down(_) | ServiceState::Paused { .. })
    }

    pub fn pid(&self) -> Option<i32> {
        match self {
            ServiceState::Up { pid } => *pid,
            ServiceState::Paused { pid } => Some(*pid),
            _ => None,
        }
    }
}

/// A node's services: its daemon, its IP service and its network namespace (with IP over
/// ExaNet on a local rack), with how often the supervisor restarted the IP service.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeServices {
    pub daemon: ServiceState,
    pub ip: ServiceState,
    pub netns: ServiceState,
    /// The namespace's name, when the rack has them.
    pub netns_name: Option<String>,
    pub ip_restarts: crate::ip_service::Restarts,
}

impl NodeServices {
    /// Each service that is down or paused, with its name for people.
    pub fn down(&self) -> Vec<(&'static str, &ServiceState)> {
        [
            ("daemon", &self.daemon),
            ("IP service", &self.ip),
            ("namespace", &self.netns),
        ]
        .into_iter()
        .filter(|(_, s)| s.is_down())
        .collect()
    }

    pub fn whole(&self) -> bool {
        self.down().is_empty()
    }
}

/// What the rack's services look like: every node's, and the supervisor's pid when the
/// rack has IP services (`None` inside when it is not running).
pub struct RackServices {
    pub nodes: Vec<NodeServices>,
    /// `None`: the rack has no IP services to supervise; `Some(None)`: nothing supervises them.
    pub supervisor: Option<Option<i32>>,
}

impl RackServices {
    /// The services of every node of `rack`, from what its daemons answered (`answered`,
    /// by node id, with the error of one that did not), its pid files and namespaces.
    pub fn of(rack: &Rack, live: &RackLiveness, answered: &[Result<(), String>]) -> RackServices {
        let shape = rack.shape();
        let local = matches!(rack.file.deploy, None | Some(Deploy::Local));
        let dir = rack.dir.canonicalize().unwrap_or_else(|_| rack.dir.clone());
        let layout = exanet_control::rack::Layout::new(&dir);
        let ip = local && crate::ip_service::enabled(&layout);
        let supervisor = ip.then(|| crate::supervisor::running(&layout));
        let nodes = shape
            .node_ids()
            .zip(answered)
            .map(|(id, answer)| {
                let node = shape.display(id);
                let pid = match live.nodes.get(id.0 as usize) {
                    Some(Liveness::Running { pid }) => Some(*pid),
                    _ => None,
                };
                let daemon = match (answer, pid) {
                    (_, Some(pid)) if process::is_stopped(pid) => ServiceState::Paused { pid },
                    (Ok(()), pid) => ServiceState::Up { pid },
                    (Err(e), _) => ServiceState::Down(e.clone()),
                };
                if !ip {
                    let other = if local {
                        ServiceState::Off
                    } else {
                        ServiceState::Unknown
                    };
                    return NodeServices {
                        daemon,
                        ip: other.clone(),
                        netns: other,
                        netns_name: None,
                        ip_restarts: Default::default(),
                    };
                }
                let service = match crate::ip_service::service_process(&layout, &node) {
                    crate::ip_service::ServiceProcess::Running { pid, stopped: true } => {
                        ServiceState::Paused { pid }
                    }
                    crate::ip_service::ServiceProcess::Running { pid, .. } => {
                        ServiceState::Up { pid: Some(pid) }
                    }
                    crate::ip_service::ServiceProcess::Gone(why) => {
                        let back = match (&daemon, supervisor) {
                            (ServiceState::Up { .. }, Some(Some(_))) => {
                                "the rack's supervisor starts it again".to_string()
                            }
                            (ServiceState::Up { .. }, _) => format!(
                                "no supervisor runs to start it again: `exactl node restart \
                                 {node}`"
                            ),
                            _ => format!(
                                "it comes back with its daemon: `exactl node restart {node}`"
                            ),
                        };
                        ServiceState::Down(format!("not running ({why}); {back}"))
                    }
                };
                let ns = crate::ip_service::netns_name(rack, &node);
                let netns = if crate::ip_service::netns_path(rack, &node).exists() {
                    ServiceState::Up { pid: None }
                } else {
                    ServiceState::Down(format!(
                        "{} is gone; `exactl node restart {node}` makes it again (what ran \
                         in the old one stays cut off)",
                        crate::ip_service::netns_path(rack, &node).display()
                    ))
                };
                NodeServices {
                    daemon,
                    ip: service,
                    netns,
                    netns_name: Some(ns),
                    ip_restarts: crate::ip_service::restarts(&layout, &node),
                }
            })
            .collect();
        RackServices { nodes, supervisor }
    }

    /// Services down or paused, over the rack.
    pub fn down_count(&self) -> usize {
        self.nodes.iter().map(|n| n.down().len()).sum()
    }
}

/// The liveness of one node from its pid file and, when that does not show a live
/// daemon, its link port (`link`: its address when that is one of this host's).
fn node_liveness(
    pid_file: &Path,
    node: &str,
    rack_dir: &Path,
    link: impl FnOnce() -> Option<SocketAddr>,
    sockets: Option<&UdpPorts>,
) -> Liveness {
    let had_pid = match std::fs::read_to_string(pid_file) {
        Ok(_) => match process::read_pid_file(pid_file, node, rack_dir) {
            PidFile::Running(d) => return Liveness::Running { pid: d.pid },
            PidFile::Garbage => return Liveness::Unknown,
            PidFile::Stale => std::fs::read_to_string(pid_file)
                .ok()
                .and_then(|t| t.trim().parse::<i32>().ok()),
        },
        // No pid file, or one exactl cannot read (then the port decides).
        Err(_) => None,
    };
    let Some(sockets) = sockets else {
        return Liveness::Unknown;
    };
    let Some(addr) = link() else {
        return Liveness::Unknown;
    };
    if sockets.holds(addr) {
        return Liveness::Unknown;
    }
    Liveness::Gone(match had_pid {
        Some(pid) => format!("pid {pid} exited"),
        None => format!("no pid file, and nothing holds its link port {addr}"),
    })
}

/// The node's link address when it is a literal address of this host (and the daemon
/// binds the same port); `None` when exactl cannot tell where the daemon would be.
fn local_link_addr(link: &str, listen: Option<&str>) -> Option<SocketAddr> {
    let addr = parse_addr(link)?;
    if let Some(l) = listen {
        // A daemon that binds elsewhere (a container's 0.0.0.0, a mapped port): only the
        // same port on an address of this host says anything.
        if parse_addr(l)?.port() != addr.port() {
            return None;
        }
    }
    // Binding port 0 on the address succeeds exactly when the address is this host's
    // (in this network namespace); it takes no port anyone could want.
    UdpSocket::bind(SocketAddr::new(addr.ip(), 0)).ok()?;
    Some(addr)
}

/// `127.0.0.1:4000`, `[::1]:4000`, `localhost:4000`; host names other than localhost are
/// not resolved (they may name another host, and a lookup may hang).
fn parse_addr(s: &str) -> Option<SocketAddr> {
    if let Ok(a) = s.parse::<SocketAddr>() {
        return Some(a);
    }
    let port = s.strip_prefix("localhost:")?.parse().ok()?;
    Some(SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), port))
}

/// The local addresses of this host's UDP sockets (`/proc/net/udp` and `udp6`).
#[derive(Debug, Default)]
pub struct UdpPorts {
    bound: HashSet<SocketAddr>,
}

impl UdpPorts {
    /// `None` when `/proc/net/udp` cannot be read (then nothing is known).
    ///
    /// The kernel prints its socket table a page at a time, and a socket can be missed
    /// when others come and go between two pages (seen: a test's socket, bound before the
    /// read, absent from it while other tests opened and closed sockets). A port is held
    /// when either of two reads saw it, so a node is called gone only if both missed it.
    pub fn read() -> Option<UdpPorts> {
        let mut ports = UdpPorts::read_once()?;
        if let Some(again) = UdpPorts::read_once() {
            ports.bound.extend(again.bound);
        }
        Some(ports)
    }

    fn read_once() -> Option<UdpPorts> {
        let v4 = std::fs::read_to_string("/proc/net/udp").ok()?;
        // A host without IPv6 has no udp6 table.
        let v6 = std::fs::read_to_string("/proc/net/udp6").unwrap_or_default();
        Some(UdpPorts::parse(&v4, &v6))
    }

    fn parse(v4: &str, v6: &str) -> UdpPorts {
        let bound = v4
            .lines()
            .chain(v6.lines())
            .filter_map(|l| l.split_whitespace().nth(1))
            .filter_map(parse_proc_addr)
            .collect();
        UdpPorts { bound }
    }

    /// True when a socket is bound to `addr`'s port on `addr`'s address, on the
    /// unspecified address (all of them), or on the IPv4-mapped form of either.
    pub fn holds(&self, addr: SocketAddr) -> bool {
        let port = addr.port();
        let ip = addr.ip();
        let mapped = match ip {
            IpAddr::V4(v4) => IpAddr::V6(v4.to_ipv6_mapped()),
            IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
        };
        self.bound.iter().any(|b| {
            b.port() == port && (b.ip() == ip || b.ip() == mapped || b.ip().is_unspecified())
        })
    }
}

/// `0100007F:9C40` (IPv4) or 32 hex digits `:PORT` (IPv6), as the kernel prints them:
/// each 32-bit word of the address in the host's byte order, the port big-endian.
fn parse_proc_addr(field: &str) -> Option<SocketAddr> {
    let (ip, port) = field.split_once(':')?;
    let port = u16::from_str_radix(port, 16).ok()?;
    let word = |h: &str| u32::from_str_radix(h, 16).ok().map(u32::to_ne_bytes);
    let ip = match ip.len() {
        8 => IpAddr::V4(Ipv4Addr::from(word(ip)?)),
        32 => {
            let mut b = [0u8; 16];
            for i in 0..4 {
                b[i * 4..i * 4 + 4].copy_from_slice(&word(&ip[i * 8..i * 8 + 8])?);
            }
            IpAddr::V6(Ipv6Addr::from(b))
        }
        _ => return None,
    };
    Some(SocketAddr::new(ip, port))
}

/// The one line for a local rack none of whose daemon processes is alive.
pub fn not_running(rack: &Rack) -> CliError {
    CliError::RackNotRunning {
        name: rack.file.name.clone(),
        dir: rack.dir.clone(),
        nodes: rack.shape().nodes() as usize,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proc_net_udp_lines_are_read_as_the_kernel_writes_them() {
        // Header lines and garbage are skipped.
        let v4 = "  sl  local_address rem_address   st tx_queue rx_queue\n\
                  \x20 12: 0100007F:9C40 00000000:0000 07 00000000:00000000\n\
                  \x20 13: 00000000:1F90 00000000:0000 07 00000000:00000000\n";
        let v6 = "  sl  local_address                         remote_address\n\
                  \x20 1: 00000000000000000000000001000000:0FA0 00000000000000000000000000000000:0000 07\n\
                  \x20 2: 0000000000000000FFFF00000100007F:0BB8 00000000000000000000000000000000:0000 07\n";
        let p = UdpPorts::parse(v4, v6);
        let a = |s: &str| s.parse::<SocketAddr>().unwrap();
        assert!(p.holds(a("127.0.0.1:40000")));
        assert!(!p.holds(a("127.0.0.2:40000")), "another address, same port");
        assert!(!p.holds(a("127.0.0.1:40001")));
        // 0.0.0.0:8080 holds the port on every address.
        assert!(p.holds(a("127.0.0.9:8080")));
        assert!(p.holds(a("[::1]:4000")));
        // ::ffff:127.0.0.1:3000 is 127.0.0.1:3000.
        assert!(p.holds(a("127.0.0.1:3000")));
        assert!(!p.holds(a("127.0.0.1:4001")));
    }

    #[test]
    fn a_bound_socket_is_seen_and_a_closed_one_is_not() {
        let s = UdpSocket::bind("127.0.0.1:0").unwrap();
        let addr = s.local_addr().unwrap();
        assert!(UdpPorts::read().unwrap().holds(addr));
        drop(s);
        assert!(!UdpPorts::read().unwrap().holds(addr));
    }

    #[test]
    fn only_literal_addresses_of_this_host_are_judged() {
        assert_eq!(
            local_link_addr("127.0.0.1:4000", None),
            Some("127.0.0.1:4000".parse().unwrap())
        );
        assert!(local_link_addr("localhost:4000", None).is_some());
        // TEST-NET-1 is nobody's address here; a name is not resolved.
        assert_eq!(local_link_addr("192.0.2.1:4000", None), None);
        assert_eq!(local_link_addr("m1qaf1.rack:4000", None), None);
        // A daemon binding another port (a mapped one) is not judged by this port.
        assert_eq!(
            local_link_addr("127.0.0.1:4000", Some("0.0.0.0:5000")),
            None
        );
        assert!(local_link_addr("127.0.0.1:4000", Some("0.0.0.0:4000")).is_some());
    }

    #[test]
    fn a_node_is_gone_only_on_evidence() {
        let dir = std::env::temp_dir().join(format!("exactl-live-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let pid_file = dir.join("M1QAF1.pid");
        let held = UdpSocket::bind("127.0.0.1:0").unwrap();
        let held_addr = held.local_addr().unwrap();
        let free_addr = {
            let s = UdpSocket::bind("127.0.0.1:0").unwrap();
            s.local_addr().unwrap()
        };
        let sockets = UdpPorts::read().unwrap();
        let live = |link: Option<SocketAddr>, sockets: Option<&UdpPorts>| {
            node_liveness(&pid_file, "M1QAF1", &dir, || link, sockets)
        };
        // No pid file, nothing on the port: gone, saying why.
        let l = live(Some(free_addr), Some(&sockets));
        assert!(
            matches!(&l, Liveness::Gone(why) if why.contains("nothing holds its link port")),
            "{l:?}"
        );
        // Something holds the port: perhaps a daemon started some other way; ask it.
        assert_eq!(live(Some(held_addr), Some(&sockets)), Liveness::Unknown);
        // An address that is not this host's, or no socket table: ask.
        assert_eq!(live(None, Some(&sockets)), Liveness::Unknown);
        assert_eq!(live(Some(free_addr), None), Liveness::Unknown);
        // A pid file of a dead process: gone, naming the pid.
        std::fs::write(&pid_file, "999999999\n").unwrap();
        assert_eq!(
            live(Some(free_addr), Some(&sockets)),
            Liveness::Gone("pid 999999999 exited".into())
        );
        // A pid file that is not a pid: ask.
        std::fs::write(&pid_file, "garbage").unwrap();
        assert_eq!(live(Some(free_addr), Some(&sockets)), Liveness::Unknown);
        // A live process that is not this node's daemon is no evidence of one.
        std::fs::write(&pid_file, format!("{}\n", std::process::id())).unwrap();
        assert!(matches!(
            live(Some(free_addr), Some(&sockets)),
            Liveness::Gone(_)
        ));
        drop(held);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
