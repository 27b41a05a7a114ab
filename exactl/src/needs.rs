//! What a local rack takes from its host, and whether this host has it. `rack up` asks
//! before it writes or starts anything: a rack too big for its host would otherwise come
//! half up and then fail, or take the host's memory until the kernel's OOM killer picks
//! something to kill.
//!
//! The figures are measured (docs/operating.md, "What a rack needs from its host", says
//! how), except the IP services' registered memory, which is computed the way `exanet-ip`
//! sizes it: it grows with the square of the rack's nodes and dominates a large rack with
//! IP. Registered memory is memfd memory that the daemon allocates in full when it is
//! registered (exanet-shm's `Region::create`): it counts as `Shmem` in /proc/meminfo and
//! takes real memory, but is not bounded by the size of /dev/shm, so /dev/shm is not what
//! is checked.

use std::fmt;

use exanet_control::host::memory_available;
use exanet_control::rack::MemoryBudget;
use exanet_proto::Shape;

/// What one daemon takes with its rack up and idle. Measured: MemAvailable fell by 2466
/// and 2574 MiB in two starts of a 1024-node rack without IP (2.4 and 2.5 MiB a daemon;
/// 1.7 MiB at 128 nodes), rounded up.
const DAEMON_MEMORY: u64 = 3 << 20;
/// What a node's IP service takes beyond its registered memory (its own process, the
/// daemon's threads serving it, the namespace and TUN device). Measured: a 128-node rack
/// with IP took 343 MiB beyond its registered memory, 2.7 MiB a node, 1.0 MiB more than
/// a daemon alone; rounded up.
const IP_SERVICE_MEMORY: u64 = 3 << 19;
/// The command and completion rings exanetd makes for every attached workload (the
/// `exanet-rings` memfd, 329472 bytes as measured in /proc/PID/fd).
const ATTACH_RINGS: u64 = 329_472;

/// Threads (each a task the kernel counts against `pid_max`) of a daemon, and what a
/// node's IP service adds: 4 per daemon without IP, 14 per node with it, measured at 128
/// and 1024 nodes (the daemon runs one runtime thread whatever the host's cores).
const DAEMON_TASKS: u64 = 4;
const IP_SERVICE_TASKS: u64 = 10;
/// Open files: 13 per daemon without IP, 35 per node with it, measured likewise.
const DAEMON_FILES: u64 = 13;
const IP_SERVICE_FILES: u64 = 22;

/// The receive ring an IP service keeps for each peer in a rack of `nodes` at `mtu`, as
/// the service sizes it.
fn ip_ring_len(nodes: u64, mtu: u64) -> u64 {
    let clamp = |v: u64| u32::try_from(v).unwrap_or(u32::MAX);
    u64::from(exanet_ip_proto::ring_len(clamp(nodes), clamp(mtu)))
}

/// Registered memory of one node's IP service when no node has talked to it yet: its send
/// buffers (one per RDMA write channel) and its attach rings.
pub fn ip_registered_at_rest_per_node() -> u64 {
    exanet_proto::ni::rdma::WRITE_CHANNELS as u64 * u64::from(exanet_ip_proto::MAX_BATCH)
        + ATTACH_RINGS
}

/// Registered memory of one node's IP service at most: a ring (with its notification slot)
/// per node of the rack, a send buffer per RDMA write channel, and its attach rings. The
/// rings are registered a slab at a time as peers first send (an idle rack has none), but
/// a rack is only brought up where every node could talk to every other.
pub fn ip_registered_per_node(nodes: u64, mtu: u64) -> u64 {
    let area = (ip_ring_len(nodes, mtu) + exanet_ip_proto::service::NOTIFY_SLOT) * nodes;
    area + ip_registered_at_rest_per_node()
}

/// What a rack needs from its host.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Needs {
    pub shape: Shape,
    /// The IP services' MTU, when the rack runs IP over ExaNet.
    pub ip_mtu: Option<u32>,
    /// Bytes of memory in all.
    pub memory: u64,
    /// Of which registered by the IP services, at most (every node has talked to every
    /// other).
    pub ip_registered: u64,
    /// What the IP services register before any node has talked to another.
    pub ip_at_rest: u64,
    /// Threads.
    pub tasks: u64,
    /// Open files.
    pub files: u64,
    /// Network namespaces.
    pub netns: u64,
}

impl Needs {
    pub fn of(shape: Shape, ip_mtu: Option<u32>) -> Needs {
        let nodes = u64::from(shape.nodes());
        let ip_registered = ip_mtu.map_or(0, |mtu| {
            nodes.saturating_mul(ip_registered_per_node(nodes, u64::from(mtu)))
        });
        let ip_at_rest = if ip_mtu.is_some() {
            nodes.saturating_mul(ip_registered_at_rest_per_node())
        } else {
            0
        };
        let (memory, tasks, files) = match ip_mtu {
            None => (DAEMON_MEMORY, DAEMON_TASKS, DAEMON_FILES),
            Some(_) => (
                DAEMON_MEMORY + IP_SERVICE_MEMORY,
                DAEMON_TASKS + IP_SERVICE_TASKS,
                DAEMON_FILES + IP_SERVICE_FILES,
            ),
        };
        Needs {
            shape,
            ip_mtu,
            memory: (nodes * memory).saturating_add(ip_registered),
            ip_registered,
            ip_at_rest,
            tasks: nodes * tasks,
            files: nodes * files,
            netns: if ip_mtu.is_some() { nodes } else { 0 },
        }
    }

    /// The rack in words: "a 4x4x2 rack (128 nodes) with IP over ExaNet".
    fn rack(&self) -> String {
        format!(
            "a {} rack ({} nodes) {}",
            self.shape,
            self.shape.nodes(),
            if self.ip_mtu.is_some() {
                "with IP over ExaNet"
            } else {
                "without IP"
            }
        )
    }
}

impl fmt::Display for Needs {
    /// One line: the memory (and how much of it is IP rings), threads and open files.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} takes about {}", self.rack(), bytes(self.memory))?;
        if self.ip_registered > 0 {
            write!(
                f,
                " of memory ({} of it the IP services' registered memory; {} until nodes \
                 talk to each other)",
                bytes(self.ip_registered),
                bytes(self.ip_at_rest)
            )?;
        } else {
            f.write_str(" of memory")?;
        }
        write!(f, ", {} threads, {} open files", self.tasks, self.files)
    }
}

/// What this host has left for a rack. `None`: not known here (a missing /proc file), and
/// then not checked.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Host {
    /// Memory that can be taken without swapping: MemAvailable, or what the memory
    /// cgroup still allows when that is less.
    pub memory: Option<u64>,
    /// Threads that can still be started: under `pid_max` and `threads-max`, and under
    /// the user's RLIMIT_NPROC when not root.
    pub tasks: Option<u64>,
    /// Files that can still be opened system-wide (`fs.file-max` less those open).
    pub files: Option<u64>,
    /// Network namespaces that can still be made (`user.max_net_namespaces`).
    pub netns: Option<u64>,
}

impl Host {
    /// Reads what this host has left from /proc and /sys.
    pub fn read() -> Host {
        Host {
            memory: memory_available(),
            tasks: tasks_available(),
            files: files_available(),
            netns: read_u64("/proc/sys/user/max_net_namespaces"),
        }
    }
}

/// What the rack's daemons may register on this host, together (`run/memory-budget.toml`,
/// read by each daemon; exanetd's `host_budget` module): three quarters of the memory
/// available after the rack's own needs, plus the IP services' registered memory, which
/// `needs` counted already and which only they may use. `None` when the host's memory is
/// not known: the daemons then budget each node alone, and say so.
pub fn registered_budget(needs: &Needs, host: &Host) -> Option<MemoryBudget> {
    let available = host.memory?;
    let left = available.saturating_sub(needs.memory);
    let jobs = (u128::from(left) * u128::from(MemoryBudget::AVAILABLE_PERCENT) / 100) as u64;
    Some(MemoryBudget {
        total_bytes: jobs.saturating_add(needs.ip_registered),
        ip_bytes: needs.ip_registered,
        available_bytes: available,
        rack_bytes: needs.memory,
    })
}

/// Why the host cannot hold the rack: each resource it lacks, with both figures.
pub fn shortfalls(needs: &Needs, host: &Host) -> Vec<String> {
    let mut out = Vec::new();
    if let Some(have) = host.memory.filter(|&h| needs.memory > h) {
        let ip = if needs.ip_registered > 0 {
            format!(
                " ({} of it the IP services' registered memory, {} a node)",
                bytes(needs.ip_registered),
                bytes(needs.ip_registered / u64::from(needs.shape.nodes()))
            )
        } else {
            String::new()
        };
        out.push(format!(
            "memory: it needs about {}{ip}, this host has {} available",
            bytes(needs.memory),
            bytes(have)
        ));
    }
    if let Some(have) = host.tasks.filter(|&h| needs.tasks > h) {
        out.push(format!(
            "threads: it needs about {}, this host can start {} more (pid_max, threads-max, \
             or this user's process limit `ulimit -u`)",
            needs.tasks, have
        ));
    }
    if let Some(have) = host.files.filter(|&h| needs.files > h) {
        out.push(format!(
            "open files: it needs about {}, this host can open {} more (fs.file-max)",
            needs.files, have
        ));
    }
    if let Some(have) = host.netns.filter(|&h| needs.netns > h) {
        out.push(format!(
            "network namespaces: it needs {}, this host allows {} (user.max_net_namespaces)",
            needs.netns, have
        ));
    }
    out
}

pub use exanet_control::host::bytes;

fn read_u64(path: &str) -> Option<u64> {
    std::fs::read_to_string(path).ok()?.trim().parse().ok()
}

fn tasks_available() -> Option<u64> {
    // The fourth field of /proc/loadavg is running/total scheduling entities: every
    // thread of the host.
    let loadavg = std::fs::read_to_string("/proc/loadavg").ok()?;
    let total: u64 = loadavg
        .split_whitespace()
        .nth(3)?
        .split('/')
        .nth(1)?
        .parse()
        .ok()?;
    let max = read_u64("/proc/sys/kernel/pid_max")?
        .min(read_u64("/proc/sys/kernel/threads-max").unwrap_or(u64::MAX));
    let mut left = max.saturating_sub(total);
    if !nix::unistd::geteuid().is_root() {
        // RLIMIT_NPROC counts every thread of the user, and root is exempt from it.
        use nix::sys::resource::{getrlimit, Resource};
        if let Ok((soft, _)) = getrlimit(Resource::RLIMIT_NPROC) {
            if soft != libc::RLIM_INFINITY {
                let mine = user_tasks(nix::unistd::getuid().as_raw());
                left = left.min(soft.saturating_sub(mine));
            }
        }
    }
    Some(left)
}

/// Threads of processes whose real uid is `uid`.
fn user_tasks(uid: libc::uid_t) -> u64 {
    let Ok(rd) = std::fs::read_dir("/proc") else {
        return 0;
    };
    let mut n = 0;
    for e in rd.flatten() {
        if !e
            .file_name()
            .to_string_lossy()
            .bytes()
            .all(|b| b.is_ascii_digit())
        {
            continue;
        }
        let Ok(status) = std::fs::read_to_string(e.path().join("status")) else {
            continue;
        };
        let field = |k: &str| {
            status
                .lines()
                .find_map(|l| l.strip_prefix(k))
                .and_then(|v| v.split_whitespace().next()?.parse::<u64>().ok())
        };
        if field("Uid:") == Some(u64::from(uid)) {
            n += field("Threads:").unwrap_or(1);
        }
    }
    n
}

fn files_available() -> Option<u64> {
    // allocated, free (always 0 since 2.6), max
    let text = std::fs::read_to_string("/proc/sys/fs/file-nr").ok()?;
    let v: Vec<u64> = text
        .split_whitespace()
        .filter_map(|t| t.parse().ok())
        .collect();
    Some(v.get(2)?.saturating_sub(*v.first()?))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shape(s: &str) -> Shape {
        s.parse().unwrap()
    }

    #[test]
    fn ip_rings_follow_exanet_ip_sizes() {
        // The registered memory of one node's service as read in /proc/PID/fd of real
        // racks: 4211200 + 2099200 + 329472 bytes at 4 nodes, 33570816 + 2099200 + 329472
        // at 128 (the receive area, the send buffers, the attach rings).
        assert_eq!(
            ip_registered_per_node(4, 65000),
            4_211_200 + 2_099_200 + 329_472
        );
        assert_eq!(
            ip_registered_per_node(128, 65000),
            33_570_816 + 2_099_200 + 329_472
        );
        // Beyond 128 nodes every ring stays at four MTU batches, so the area grows with
        // the square of the rack: 1024 nodes take 256 MiB of rings a node.
        assert_eq!(ip_ring_len(1024, 65000), 262_144);
        assert!(ip_registered_per_node(1024, 65000) > 256 << 20);
    }

    #[test]
    fn needs_grow_with_the_rack_and_ip() {
        let off = Needs::of(shape("4x4x2"), None);
        assert_eq!(off.ip_registered, 0);
        assert_eq!(off.netns, 0);
        assert_eq!(off.tasks, 128 * DAEMON_TASKS);
        let on = Needs::of(shape("4x4x2"), Some(65000));
        assert_eq!(on.netns, 128);
        // 4.4 GiB of rings and about 4.7 GiB in all at most: what the measured rack took
        // when every service registered every ring at start. Before nodes talk, only the
        // send buffers and attach rings: 310,870,016 bytes held by the daemons of an idle
        // 4x4x2 rack (quick_start's memfd count).
        assert_eq!(on.ip_registered, 128 * 35_999_488);
        assert_eq!(on.ip_at_rest, 310_870_016);
        assert_eq!(off.ip_at_rest, 0);
        assert!((4_700 << 20..5 << 30).contains(&on.memory), "{on}");
        let big = Needs::of(shape("8x8x4"), Some(65000));
        assert!(big.memory > 250 << 30, "{big}");
        assert!(Needs::of(shape("8x8x4"), None).memory <= 3 << 30);
    }

    #[test]
    fn a_host_short_of_anything_is_named_with_both_figures() {
        let needs = Needs::of(shape("8x8x4"), Some(65000));
        let roomy = Host {
            memory: Some(1 << 40),
            tasks: Some(100_000),
            files: Some(1_000_000),
            netns: Some(10_000),
        };
        assert!(shortfalls(&needs, &roomy).is_empty());
        assert!(
            shortfalls(&needs, &Host::default()).is_empty(),
            "unknown is not short"
        );
        let small = Host {
            memory: Some(18 << 30),
            tasks: Some(1000),
            files: Some(100),
            netns: Some(10),
        };
        let s = shortfalls(&needs, &small);
        assert_eq!(s.len(), 4, "{s:?}");
        assert!(
            s[0].starts_with("memory: it needs about 262.9 GiB")
                && s[0].contains("18.0 GiB available"),
            "{}",
            s[0]
        );
        assert!(
            s[0].contains("registered memory, 258.4 MiB a node"),
            "{}",
            s[0]
        );
        assert!(
            s[1].contains("14336") && s[1].contains("1000 more"),
            "{}",
            s[1]
        );
        assert!(
            s[3].contains("needs 1024") && s[3].contains("allows 10"),
            "{}",
            s[3]
        );
    }

    #[test]
    fn registered_memory_gets_three_quarters_of_what_the_rack_leaves_and_ip_its_rings() {
        let host = Host {
            memory: Some(23 << 30),
            ..Host::default()
        };
        let off = Needs::of(shape("4x4x2"), None);
        let b = registered_budget(&off, &host).unwrap();
        assert_eq!(b.ip_bytes, 0);
        assert_eq!(b.total_bytes, ((23 << 30) - off.memory) / 4 * 3);
        assert_eq!((b.available_bytes, b.rack_bytes), (23 << 30, off.memory));
        // The host: three nodes of one job at 8 GiB each no longer fit, half of it
        // for one job beside others is under 9 GiB.
        assert!(b.total_bytes < 24 << 30 && b.per_job(50) < 9 << 30, "{b:?}");
        let on = Needs::of(shape("4x4x2"), Some(65000));
        let b = registered_budget(&on, &host).unwrap();
        assert_eq!(b.ip_bytes, on.ip_registered);
        assert_eq!(b.total_bytes - b.ip_bytes, ((23 << 30) - on.memory) / 4 * 3);
        assert_eq!(registered_budget(&on, &Host::default()), None);
        // A host with less than the rack needs (refused before this is asked) gives jobs
        // nothing rather than wrapping around.
        let tiny = Host {
            memory: Some(1 << 20),
            ..Host::default()
        };
        assert_eq!(
            registered_budget(&on, &tiny).map(|b| b.total_bytes - b.ip_bytes),
            Some(0)
        );
    }

    #[test]
    fn this_host_is_read() {
        let h = Host::read();
        assert!(h.memory.is_some_and(|m| m > 0), "{h:?}");
        assert!(h.tasks.is_some() && h.files.is_some(), "{h:?}");
    }
}
