//! Addresses and address vectors.
//!
//! The provider's own address format (`FI_FORMAT_UNSPEC`, which libfabric reserves for a
//! provider-specific format: [`ADDR_LEN`] bytes) is a node id (u32, big-endian), a rank
//! and a mailbox, then two zero bytes. A rank or mailbox of [`ANY`] (only in a source
//! address) leaves the choice to the node: the domain attaches at any free rank, the
//! endpoint takes any free mailbox. `FI_SOCKADDR_IN` addresses are the node's IP over
//! ExaNet address (the rack's subnet) with a port that is the service.
//!
//! A service is a number: 0 names no endpoint in particular (any rank, any mailbox), and
//! `n >= 1` names rank `((n - 1) % 336) / 48` and mailbox `(n - 1) % 48`: every rank a
//! workload may have (0-6; 7 is the IP service's) and every mailbox below the kept ones
//! (48 + rank is that rank's collective mailbox). So `fi_getinfo(node, service)` names
//! the endpoint a peer opened with `fi_getinfo(NULL, service, FI_SOURCE)` without asking
//! it, as libfabric's programs expect; services 336 apart name the same endpoint.
//!
//! In an `FI_AV_TABLE` an address's `fi_addr_t` is its index in insertion order; in an
//! `FI_AV_MAP` it is the address itself as a number (node << 16 | rank << 8 | mailbox), so
//! that no table is needed to send.

use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr};
use std::sync::Mutex;

use crate::abi::FI_ADDR_UNSPEC;
use crate::msg::Peer;

/// Bytes of an endpoint address in the provider's own format.
pub const ADDR_LEN: usize = 8;

/// A rank or mailbox left to the node (a source address only).
pub const ANY: u8 = 0xff;

/// Ranks a service names: the workloads' (rank 7 is the IP service's).
pub const SERVICE_RANKS: u32 = 7;
/// Mailboxes a service names: those below the kept collective mailboxes (48 + rank).
pub const SERVICE_MAILBOXES: u32 = 48;
/// Distinct endpoints services name on one node.
pub const SERVICES: u32 = SERVICE_RANKS * SERVICE_MAILBOXES;

/// An address as `fi_getinfo` hands it out: a node, and a rank and mailbox or [`ANY`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Addr {
    pub node: u32,
    pub rank: u8,
    pub vi: u8,
}

impl Addr {
    /// The endpoint it names, when it names one.
    pub fn peer(self) -> Option<Peer> {
        (self.rank < 8 && self.vi < 64).then_some(Peer {
            node: self.node,
            rank: self.rank,
            vi: self.vi,
        })
    }

    /// The service (see the module) that names this rank and mailbox: 0 for [`ANY`], and
    /// for a rank or mailbox no service names (rank 7, collective mailboxes) too.
    pub fn service(self) -> u32 {
        let (r, v) = (u32::from(self.rank), u32::from(self.vi));
        if r < SERVICE_RANKS && v < SERVICE_MAILBOXES {
            1 + r * SERVICE_MAILBOXES + v
        } else {
            0
        }
    }

    /// `service` on `node`.
    pub fn at(node: u32, service: u32) -> Addr {
        if service == 0 {
            return Addr {
                node,
                rank: ANY,
                vi: ANY,
            };
        }
        let i = (service - 1) % SERVICES;
        Addr {
            node,
            rank: (i / SERVICE_MAILBOXES) as u8,
            vi: (i % SERVICE_MAILBOXES) as u8,
        }
    }
}

impl From<Peer> for Addr {
    fn from(p: Peer) -> Addr {
        Addr {
            node: p.node,
            rank: p.rank,
            vi: p.vi,
        }
    }
}

/// A service as `fi_getinfo` and `fi_av_insertsvc` take it: a decimal number up to 65535
/// (a port, as libfabric's tools pass one), or `None` when it is not one.
pub fn parse_service(text: &str) -> Option<u32> {
    let t = text.trim();
    if t.is_empty() || t.len() > 5 || !t.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    t.parse::<u32>().ok().filter(|&n| n <= 65535)
}

/// An endpoint address as bytes.
pub fn encode(p: Peer) -> [u8; ADDR_LEN] {
    let n = p.node.to_be_bytes();
    [n[0], n[1], n[2], n[3], p.rank, p.vi, 0, 0]
}

/// The endpoint an address names, if it is one.
pub fn decode(b: &[u8]) -> Option<Peer> {
    decode_addr(b)?.peer()
}

/// An address as bytes, rank and mailbox possibly [`ANY`].
pub fn encode_addr(a: Addr) -> [u8; ADDR_LEN] {
    let n = a.node.to_be_bytes();
    [n[0], n[1], n[2], n[3], a.rank, a.vi, 0, 0]
}

/// The address `b` holds (a source address: rank and mailbox may be [`ANY`]).
pub fn decode_addr(b: &[u8]) -> Option<Addr> {
    if b.len() != ADDR_LEN || b[6] != 0 || b[7] != 0 {
        return None;
    }
    let a = Addr {
        node: u32::from_be_bytes([b[0], b[1], b[2], b[3]]),
        rank: b[4],
        vi: b[5],
    };
    let any = a.rank == ANY && a.vi == ANY;
    (any || a.peer().is_some()).then_some(a)
}

/// What names a node in `fi_getinfo` and `fi_av_insertsvc`: the rack's shape (node
/// names) and its IP over ExaNet addresses, and the node this process runs on.
#[derive(Clone, Debug)]
pub struct Addressing {
    pub here: u32,
    shape: Option<exanet::Shape>,
    /// Node id to its IP over ExaNet address (the rack's subnet, `[ip]`).
    ips: Vec<Option<Ipv4Addr>>,
}

impl Addressing {
    /// The rack's addressing as its rack file says; `here`: this process's node.
    pub fn load(rack_dir: &std::path::Path, here: u32) -> Addressing {
        let Ok(rack) = exanet_control::rack::Rack::load(rack_dir) else {
            return Addressing {
                here,
                shape: exanet::config::read_shape(rack_dir).ok(),
                ips: Vec::new(),
            };
        };
        let shape = rack.file.shape;
        let subnet = exanet_control::ip::subnet(rack.file.ip.as_ref());
        let ips = (0..shape.nodes())
            .map(|i| exanet_control::ip::node_addr(subnet, exanet::NodeId(i)))
            .collect();
        Addressing {
            here,
            shape: Some(shape),
            ips,
        }
    }

    /// Addressing of a rack of `shape` without IP addresses (tests).
    pub fn of_shape(shape: exanet::Shape, here: u32) -> Addressing {
        Addressing {
            here,
            shape: Some(shape),
            ips: Vec::new(),
        }
    }

    /// The node `text` names: a node's name (any case), its IP over ExaNet address, a
    /// host name that resolves to one, or this node (`localhost`, a loopback address, the
    /// host's own name). `None`: no node of this rack.
    pub fn node(&self, text: &str) -> Option<u32> {
        let t = text.trim();
        if t.is_empty() {
            return None;
        }
        if t.eq_ignore_ascii_case("localhost") || self.is_host_name(t) {
            return Some(self.here);
        }
        if let Some(shape) = &self.shape {
            if let Ok(id) = shape.parse_node(t) {
                return Some(id.0);
            }
        }
        if let Ok(ip) = t.parse::<IpAddr>() {
            return self.node_of_ip(ip);
        }
        // A host name: only one with a name's characters goes to the resolver (a
        // caller's garbage must not wait on DNS).
        let hostlike = t.len() <= 253
            && t.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'.');
        if !hostlike {
            return None;
        }
        let addrs = std::net::ToSocketAddrs::to_socket_addrs(&(t, 0)).ok()?;
        addrs.into_iter().find_map(|a| self.node_of_ip(a.ip()))
    }

    fn node_of_ip(&self, ip: IpAddr) -> Option<u32> {
        if ip.is_loopback() {
            return Some(self.here);
        }
        let IpAddr::V4(v4) = ip else { return None };
        self.ips
            .iter()
            .position(|a| *a == Some(v4))
            .map(|i| i as u32)
    }

    fn is_host_name(&self, t: &str) -> bool {
        std::fs::read_to_string("/proc/sys/kernel/hostname")
            .is_ok_and(|h| h.trim().eq_ignore_ascii_case(t))
    }

    /// A node's name as the rack spells it.
    pub fn node_name(&self, node: u32) -> String {
        match &self.shape {
            Some(s) => s.display(exanet::NodeId(node)),
            None => format!("node#{node}"),
        }
    }

    /// `a` as `fi_av_straddr` writes it: `exanet://M1QBF3:156/3/11` (node, service,
    /// rank, mailbox), or `exanet://M1QBF3` for a node's address with no endpoint.
    pub fn text(&self, a: Addr) -> String {
        let node = self.node_name(a.node);
        match a.peer() {
            Some(p) => format!("exanet://{node}:{}/{}/{}", a.service(), p.rank, p.vi),
            None => format!("exanet://{node}"),
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Table,
    Map,
}

#[derive(Debug, Default)]
struct Table {
    by_index: Vec<Option<Peer>>,
    by_peer: HashMap<Peer, u64>,
}

#[derive(Debug)]
pub struct Av {
    kind: Kind,
    table: Mutex<Table>,
}

impl Av {
    pub fn new(kind: Kind) -> Av {
        Av {
            kind,
            table: Mutex::new(Table::default()),
        }
    }

    fn table(&self) -> std::sync::MutexGuard<'_, Table> {
        self.table.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Inserts `addrs`; each gets its `fi_addr_t`, or [`FI_ADDR_UNSPEC`] when it is not
    /// an address (counted as not inserted).
    pub fn insert(&self, addrs: &[Option<Peer>]) -> Vec<u64> {
        let mut t = self.table();
        addrs
            .iter()
            .map(|a| match (a, self.kind) {
                (None, _) => FI_ADDR_UNSPEC,
                (Some(p), Kind::Map) => {
                    let a = map_addr(*p);
                    t.by_peer.insert(*p, a);
                    a
                }
                (Some(p), Kind::Table) => {
                    // The lowest index a removal freed, as libfabric's own vectors do:
                    // programs that remove an address and insert it again expect its
                    // old index (fabtests' `fi_av_xfer` reads index 0 after it).
                    let i = match t.by_index.iter().position(Option::is_none) {
                        Some(free) => {
                            t.by_index[free] = Some(*p);
                            free as u64
                        }
                        None => {
                            t.by_index.push(Some(*p));
                            (t.by_index.len() - 1) as u64
                        }
                    };
                    t.by_peer.entry(*p).or_insert(i);
                    i
                }
            })
            .collect()
    }

    /// The endpoint `addr` names.
    pub fn lookup(&self, addr: u64) -> Option<Peer> {
        match self.kind {
            Kind::Map => {
                let p = Peer {
                    node: (addr >> 16) as u32,
                    rank: (addr >> 8) as u8,
                    vi: addr as u8,
                };
                (addr >> 48 == 0 && map_addr(p) == addr && p.rank < 8 && p.vi < 64).then_some(p)
            }
            Kind::Table => self
                .table()
                .by_index
                .get(usize::try_from(addr).ok()?)
                .copied()
                .flatten(),
        }
    }

    /// The `fi_addr_t` an endpoint was inserted as (a message's source).
    pub fn reverse(&self, p: Peer) -> u64 {
        self.table()
            .by_peer
            .get(&p)
            .copied()
            .unwrap_or(FI_ADDR_UNSPEC)
    }

    /// Removes `addr`; false when it names nothing.
    pub fn remove(&self, addr: u64) -> bool {
        let Some(p) = self.lookup(addr) else {
            return false;
        };
        let mut t = self.table();
        if self.kind == Kind::Table {
            t.by_index[addr as usize] = None;
        }
        if t.by_peer.get(&p) == Some(&addr) {
            t.by_peer.remove(&p);
        }
        true
    }
}

fn map_addr(p: Peer) -> u64 {
    (u64::from(p.node) << 16) | (u64::from(p.rank) << 8) | u64::from(p.vi)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_round_trip_and_bad_ones_are_refused() {
        let p = Peer {
            node: 123_456,
            rank: 7,
            vi: 63,
        };
        assert_eq!(decode(&encode(p)), Some(p));
        assert_eq!(decode(&[0; 7]), None);
        assert_eq!(decode(&[0, 0, 0, 1, 8, 0, 0, 0]), None);
        assert_eq!(decode(&[0, 0, 0, 1, 0, 64, 0, 0]), None);
        assert_eq!(decode(&[0, 0, 0, 1, 0, 0, 1, 0]), None);
    }

    #[test]
    fn tables_index_and_maps_encode_and_both_find_sources() {
        let (a, b) = (
            Peer {
                node: 1,
                rank: 0,
                vi: 2,
            },
            Peer {
                node: 6,
                rank: 3,
                vi: 0,
            },
        );
        let t = Av::new(Kind::Table);
        assert_eq!(
            t.insert(&[Some(a), None, Some(b)]),
            vec![0, FI_ADDR_UNSPEC, 1]
        );
        assert_eq!(
            (t.lookup(0), t.lookup(1), t.lookup(2)),
            (Some(a), Some(b), None)
        );
        assert_eq!(t.reverse(b), 1);
        assert!(t.remove(0));
        assert_eq!((t.lookup(0), t.reverse(a)), (None, FI_ADDR_UNSPEC));
        assert!(!t.remove(0));
        // Inserted again, it takes the index its removal freed.
        assert_eq!(t.insert(&[Some(a)]), vec![0]);
        assert_eq!((t.lookup(0), t.reverse(a)), (Some(a), 0));
        assert!(t.remove(0));
        let m = Av::new(Kind::Map);
        let ids = m.insert(&[Some(a), Some(b)]);
        assert_eq!(
            ids.iter().map(|&i| m.lookup(i)).collect::<Vec<_>>(),
            vec![Some(a), Some(b)]
        );
        assert_eq!(m.reverse(a), ids[0]);
        assert_eq!(m.lookup(u64::MAX), None);
    }
}
