//! Mailboxes: 64 virtual interfaces per node, each a bounded queue owned by one rank, fed
//! by any number of senders. The NI has already checked the PDID; here a message is
//! refused when the interface has no owner on that rank (no receive context) or its
//! queue is full, and a retransmitted copy of a message already queued is acknowledged
//! again but not queued twice.

use std::collections::{BTreeMap, VecDeque};

use bytes::Bytes;

use super::{NackReason, NiConfig, NiError, NiEvent, Out, MAILBOX_WINDOW};
use crate::cell::Cell;
use crate::shape::NodeId;
use crate::time::Instant;

pub const MAILBOX_VIS: usize = 64;

/// A message as the reader sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Message {
    pub src: NodeId,
    pub src_rank: u8,
    pub payload: Bytes,
}

struct Vi {
    owner: u8,
    capacity: usize,
    queue: VecDeque<Message>,
}

pub struct Mailboxes {
    vis: Vec<Option<Vi>>,
    /// Messages delivered recently, by (source, txn, VI), to drop retransmitted copies.
    seen: BTreeMap<(NodeId, u32, u8), Instant>,
    seen_order: VecDeque<(Instant, (NodeId, u32, u8))>,
}

impl Default for Mailboxes {
    fn default() -> Self {
        Mailboxes::new()
    }
}

impl Mailboxes {
    pub fn new() -> Mailboxes {
        Mailboxes {
            vis: (0..MAILBOX_VIS).map(|_| None).collect(),
            seen: BTreeMap::new(),
            seen_order: VecDeque::new(),
        }
    }

    /// Gives a free mailbox interface with room for `capacity` messages to `rank`.
    pub fn alloc(&mut self, rank: u8, capacity: usize) -> Result<u8, NiError> {
        let vi = self
            .vis
            .iter()
            .position(Option::is_none)
            .ok_or(NiError::Exhausted("mailbox interface"))?;
        self.vis[vi] = Some(Vi {
            owner: rank,
            capacity: capacity.max(1),
            queue: VecDeque::new(),
        });
        Ok(vi as u8)
    }

    fn vi_mut(&mut self, rank: u8, vi: u8) -> Result<&mut Vi, NiError> {
        match self.vis.get_mut(vi as usize) {
            None | Some(None) => Err(NiError::NoSuch {
                what: "mailbox interface",
                index: vi as usize,
            }),
            Some(Some(v)) if v.owner != rank => Err(NiError::NotOwner {
                what: "mailbox interface",
                index: vi as usize,
            }),
            Some(Some(v)) => Ok(v),
        }
    }

    pub fn free(&mut self, rank: u8, vi: u8) -> Result<(), NiError> {
        self.vi_mut(rank, vi)?;
        self.vis[vi as usize] = None;
        Ok(())
    }

    pub(crate) fn detach(&mut self, rank: u8) {
        for v in self.vis.iter_mut() {
            if v.as_ref().is_some_and(|v| v.owner == rank) {
                *v = None;
            }
        }
    }

    /// The oldest message of the interface (the reader moves the head).
    pub fn pop(&mut self, rank: u8, vi: u8) -> Result<Option<Message>, NiError> {
        Ok(self.vi_mut(rank, vi)?.queue.pop_front())
    }

    pub fn len(&mut self, rank: u8, vi: u8) -> Result<usize, NiError> {
        Ok(self.vi_mut(rank, vi)?.queue.len())
    }

    pub(crate) fn deliver(
        &mut self,
        cell: &Cell,
        now: Instant,
        _cfg: &NiConfig,
        out: &mut Out,
    ) -> Result<(), NackReason> {
        let vi = cell.dst.va() & !MAILBOX_WINDOW;
        if vi >= MAILBOX_VIS as u64 {
            return Err(NackReason::BadAddress);
        }
        let vi = vi as u8;
        let rank = cell.dst.rank();
        let Some(Some(v)) = self.vis.get_mut(vi as usize) else {
            return Err(NackReason::NoContext);
        };
        if v.owner != rank {
            return Err(NackReason::NoContext);
        }
        let key = (cell.src, cell.txn, vi);
        if self.seen.contains_key(&key) {
            return Ok(());
        }
        if v.queue.len() >= v.capacity {
            return Err(NackReason::QueueFull);
        }
        v.queue.push_back(Message {
            src: cell.src,
            src_rank: cell.src_rank,
            payload: cell.payload.clone(),
        });
        self.seen.insert(key, now);
        self.seen_order.push_back((now, key));
        out.events.push_back(NiEvent::Mailbox { rank, vi });
        Ok(())
    }

    /// When the oldest remembered delivery is to be forgotten.
    pub(crate) fn next_deadline(&self, cfg: &NiConfig) -> Option<Instant> {
        self.seen_order.front().map(|(t, _)| *t + cfg.remember_ns)
    }

    /// Forgets deliveries older than the configured memory.
    pub(crate) fn expire(&mut self, now: Instant, cfg: &NiConfig) {
        while let Some(&(t, key)) = self.seen_order.front() {
            if now.since(t) < cfg.remember_ns {
                break;
            }
            self.seen_order.pop_front();
            if self.seen.get(&key) == Some(&t) {
                self.seen.remove(&key);
            }
        }
    }
}
