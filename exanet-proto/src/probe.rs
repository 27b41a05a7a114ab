//! Probe cells: the fabric's ping and traceroute (like ibping + ibtracert).
//!
//! A probe is sent by a node's switch to a destination node; every switch that transmits
//! it onto a link appends its node id, so the path is recorded by the fabric itself, not
//! recomputed from the routing function. The destination answers with a `ProbeReply`
//! that carries the forward path and records the way back the same way.
//!
//! Payload: probe id u32 | forward hop count u8 | flags u8 (bit 0: path truncated) |
//! node ids, u32 each, in the order visited.

use bytes::{BufMut, Bytes, BytesMut};

use crate::cell::{Cell, MAX_PAYLOAD};
use crate::shape::NodeId;

/// Bytes a switch appends per hop.
pub const HOP_LEN: u32 = 4;
const FIXED: usize = 6;
const TRUNCATED: u8 = 1;

/// A probe payload as decoded.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProbeBody {
    pub id: u32,
    pub forward_hops: u8,
    pub truncated: bool,
    pub path: Vec<NodeId>,
}

impl ProbeBody {
    pub fn new(id: u32) -> ProbeBody {
        ProbeBody {
            id,
            forward_hops: 0,
            truncated: false,
            path: Vec::new(),
        }
    }

    pub fn encode(&self) -> Bytes {
        let mut b = BytesMut::with_capacity(FIXED + 4 * self.path.len());
        b.put_u32(self.id);
        b.put_u8(self.forward_hops);
        b.put_u8(if self.truncated { TRUNCATED } else { 0 });
        for n in self.path.iter().take((MAX_PAYLOAD - FIXED) / 4) {
            b.put_u32(n.0);
        }
        b.freeze()
    }

    /// `None` for a payload that is not a probe body (a hostile or corrupt sender).
    pub fn decode(p: &[u8]) -> Option<ProbeBody> {
        if p.len() < FIXED || (p.len() - FIXED) % 4 != 0 {
            return None;
        }
        let path = p[FIXED..]
            .chunks_exact(4)
            .map(|c| NodeId(u32::from_be_bytes([c[0], c[1], c[2], c[3]])))
            .collect();
        Some(ProbeBody {
            id: u32::from_be_bytes([p[0], p[1], p[2], p[3]]),
            forward_hops: p[4],
            truncated: p[5] & TRUNCATED != 0,
            path,
        })
    }
}

/// True when [`record_hop`] would change the payload.
fn records(p: &[u8], node: NodeId) -> bool {
    p.len() >= FIXED && !(p.len() >= FIXED + 4 && p[p.len() - 4..] == node.0.to_be_bytes())
}

/// How many bytes [`record_hop`] adds to this payload.
pub fn growth(p: &[u8], node: NodeId) -> u32 {
    if records(p, node) && p.len() + 4 <= MAX_PAYLOAD {
        HOP_LEN
    } else {
        0
    }
}

/// Appends `node` to a probe's recorded path, unless it is already the last entry (the
/// responder records itself) or there is no room left (then the path is marked truncated).
pub fn record_hop(cell: &mut Cell, node: NodeId) {
    let p = &cell.payload;
    if !records(p, node) {
        return;
    }
    let mut b = BytesMut::with_capacity(p.len() + 4);
    b.extend_from_slice(p);
    if p.len() + 4 <= MAX_PAYLOAD {
        b.put_u32(node.0);
    } else {
        b[5] |= TRUNCATED;
    }
    cell.payload = b.freeze();
}
