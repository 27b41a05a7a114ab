//! Ports for a rack on one host (a local rack, a test's rack): drawn at random below the
//! kernel's ephemeral range, so that no socket bound to port 0 takes one between the
//! moment it is picked and the moment its daemon binds it.

use std::collections::HashSet;
use std::net::{Ipv4Addr, TcpListener, UdpSocket};

/// Where a local rack's ports are drawn from: below the kernel's ephemeral range
/// (`ip_local_port_range`, 32768 when it cannot be read). A port the kernel handed out for
/// a bind to port 0 and that was let go is the next ephemeral port anyone (another rack's
/// dialing endpoint, a test's client socket) may get before the daemon binds it; a port
/// under the range is taken only by whoever names it.
pub fn pool() -> std::ops::Range<u16> {
    let floor = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|t| t.split_whitespace().next()?.parse::<u16>().ok())
        .unwrap_or(32768)
        .max(4096);
    (floor / 3).max(1024)..floor
}

/// Picks `n` (UDP link, TCP metrics) port pairs on 127.0.0.1 that are free right now, at
/// random from [`pool`] (a bind tells whether one is free). All ports differ.
pub fn pick_free(n: usize) -> std::io::Result<Vec<(u16, u16)>> {
    use std::hash::BuildHasher;
    let pool = pool();
    // RandomState is seeded per process: racks picking at once draw different ports.
    let hasher = std::collections::hash_map::RandomState::new();
    let mut seen = HashSet::with_capacity(2 * n);
    let mut out = Vec::with_capacity(n);
    let mut draw = 0u64;
    let mut pick = |tcp: bool| -> std::io::Result<u16> {
        for _ in 0..4096 {
            draw += 1;
            let port = pool.start + (hasher.hash_one(draw) % pool.len() as u64) as u16;
            let free = if tcp {
                TcpListener::bind((Ipv4Addr::LOCALHOST, port)).is_ok()
            } else {
                UdpSocket::bind((Ipv4Addr::LOCALHOST, port)).is_ok()
            };
            if free && seen.insert(port) {
                return Ok(port);
            }
        }
        Err(std::io::Error::other(format!(
            "no free port found in {}..{} (below the ephemeral range)",
            pool.start, pool.end
        )))
    };
    for _ in 0..n {
        let link = pick(false)?;
        let metrics = pick(true)?;
        out.push((link, metrics));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn free_ports_are_distinct() {
        let ports = pick_free(40).unwrap();
        let mut all: Vec<u16> = ports.iter().flat_map(|&(a, b)| [a, b]).collect();
        all.sort_unstable();
        all.dedup();
        assert_eq!(all.len(), 80);
        assert!(all.iter().all(|p| pool().contains(p)), "{all:?}");
    }
}
