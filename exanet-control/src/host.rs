//! What the host has to give, read the same way by `exactl rack up` (which sizes the rack
//! and its memory budget from it) and by each daemon (which falls back to it when it has
//! no budget of the rack's): memory that can be taken without swapping, and sizes as the
//! emulator prints them.

use std::path::{Path, PathBuf};

/// Memory this process can take without swapping: MemAvailable, or what its memory cgroup
/// still allows when that is less (a container's limit is not in MemAvailable, and a rack
/// beyond it would be killed rather than refused).
pub fn memory_available() -> Option<u64> {
    let avail = meminfo(
        &std::fs::read_to_string("/proc/meminfo").ok()?,
        "MemAvailable",
    )?;
    Some(cgroup_memory_left().map_or(avail, |left| avail.min(left)))
}

/// `Key:   N kB` of /proc/meminfo's `text`, in bytes.
pub fn meminfo(text: &str, key: &str) -> Option<u64> {
    text.lines()
        .find_map(|l| l.strip_prefix(key)?.strip_prefix(':'))
        .and_then(|v| v.split_whitespace().next()?.parse::<u64>().ok())
        .map(|kib| kib.saturating_mul(1024))
}

/// Limit less usage of this process's memory cgroup (v2, else v1), when it has a limit.
fn cgroup_memory_left() -> Option<u64> {
    let cgroups = std::fs::read_to_string("/proc/self/cgroup").ok()?;
    for line in cgroups.lines() {
        let mut parts = line.splitn(3, ':');
        let (_, controllers, path) = (parts.next()?, parts.next()?, parts.next()?);
        let (base, limit, usage) = if controllers.is_empty() {
            ("/sys/fs/cgroup", "memory.max", "memory.current")
        } else if controllers.split(',').any(|c| c == "memory") {
            (
                "/sys/fs/cgroup/memory",
                "memory.limit_in_bytes",
                "memory.usage_in_bytes",
            )
        } else {
            continue;
        };
        // The cgroup's own directory, else the mount's root (in a container the path in
        // /proc/self/cgroup is the host's, and the container sees its cgroup at the root).
        let path = path.trim_start_matches('/');
        for dir in [Path::new(base).join(path), PathBuf::from(base)] {
            let read = |f: &str| std::fs::read_to_string(dir.join(f)).ok();
            if let (Some(l), Some(u)) = (read(limit), read(usage)) {
                // "max" (v2) or a huge number (v1): no limit.
                let (Ok(l), Ok(u)) = (l.trim().parse::<u64>(), u.trim().parse::<u64>()) else {
                    return None;
                };
                return (l < 1 << 60).then(|| l.saturating_sub(u));
            }
        }
    }
    None
}

/// A size in the unit that reads best: "4.7 GiB", "34.3 MiB", "512 B".
pub fn bytes(n: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = n as f64;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < UNITS.len() {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{n} B")
    } else {
        format!("{v:.1} {}", UNITS[u])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_read_best() {
        assert_eq!(bytes(512), "512 B");
        assert_eq!(bytes(35_999_488), "34.3 MiB");
        assert_eq!(bytes(18 << 30), "18.0 GiB");
    }

    #[test]
    fn meminfo_is_read_in_bytes() {
        let text = "MemTotal:       24684096 kB\nMemAvailable:   24140728 kB\n";
        assert_eq!(meminfo(text, "MemAvailable"), Some(24_140_728 * 1024));
        assert_eq!(meminfo(text, "Mem"), None);
        assert_eq!(meminfo(text, "Shmem"), None);
    }
}
