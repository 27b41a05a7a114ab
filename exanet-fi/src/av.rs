//! Address vectors: the endpoint addresses an application inserted, by `fi_addr_t`.
//!
//! An endpoint's address ([`ADDR_LEN`] bytes, `FI_FORMAT_UNSPEC`) is its node id (u32,
//! big-endian), its rank and its mailbox, then two zero bytes. In an `FI_AV_TABLE` an
//! address's `fi_addr_t` is its index in insertion order; in an `FI_AV_MAP` it is the
//! address itself as a number (node << 16 | rank << 8 | mailbox), so that no table is
//! needed to send.

use std::collections::HashMap;
use std::sync::Mutex;

use crate::abi::FI_ADDR_UNSPEC;
use crate::msg::Peer;

/// Bytes of an endpoint address.
pub const ADDR_LEN: usize = 8;

/// An endpoint address as bytes.
pub fn encode(p: Peer) -> [u8; ADDR_LEN] {
    let n = p.node.to_be_bytes();
    [n[0], n[1], n[2], n[3], p.rank, p.vi, 0, 0]
}

/// The endpoint an address names, if it is one.
pub fn decode(b: &[u8]) -> Option<Peer> {
    if b.len() != ADDR_LEN || b[6] != 0 || b[7] != 0 || b[4] > 7 || b[5] > 63 {
        return None;
    }
    Some(Peer {
        node: u32::from_be_bytes([b[0], b[1], b[2], b[3]]),
        rank: b[4],
        vi: b[5],
    })
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
                    let i = t.by_index.len() as u64;
                    t.by_index.push(Some(*p));
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
