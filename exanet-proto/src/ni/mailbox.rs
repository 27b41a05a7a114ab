//! Mailboxes: 64 virtual interfaces per node, each a bounded queue owned by one rank, fed
//! by any number of senders. The NI has already checked the PDID; here a message is
//! refused when the interface has no owner on that rank (no receive context) or its
//! queue is full, and a retransmitted copy of a message already queued is acknowledged
//! again but not queued twice.
//!
//! # Capacity
//! A mailbox of capacity N holds N unread messages. A mailbox allocated with
//! [`Mailboxes::alloc`] is read by [`Mailboxes::pop`]: a popped message is read. One
//! allocated with [`Mailboxes::alloc_counted`] is read further away (the daemon pops
//! messages into a workload's completion ring, and the workload takes them later): a popped
//! message still counts against the capacity until the reader's [`ConsumedCount`] says it
//! was taken. The count is asked only when the mailbox looks full, and it is not trusted:
//! a reader that claims more than it was given is taken to have read what it was given, so
//! whatever it claims, the NI's queue never holds more than the capacity, and a reader that
//! lies only lets more messages into its own, bounded, path.

use std::collections::VecDeque;

use bytes::Bytes;

use crate::ni::recent::Recent;

use super::{Ctx, NackReason, NiConfig, NiError, NiEvent, MAILBOX_WINDOW};
use crate::cell::Cell;
use crate::model::ModelTime;
use crate::shape::NodeId;
use crate::time::Instant;

pub const MAILBOX_VIS: usize = 64;

/// A message as the reader sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Message {
    pub src: NodeId,
    pub src_rank: u8,
    pub payload: Bytes,
    /// When it was written into the mailbox, in modeled time.
    pub at: ModelTime,
}

/// How many messages the reader of a mailbox has taken so far: a count only the reader
/// advances (the daemon reads it from memory its workload writes). It may wrap, and may lie.
pub trait ConsumedCount: Send + Sync {
    fn consumed(&self) -> u64;
}

impl<F: Fn() -> u64 + Send + Sync> ConsumedCount for F {
    fn consumed(&self) -> u64 {
        self()
    }
}

/// The reader of a counted mailbox: what it was given and what it said it took.
struct Reader {
    count: Box<dyn ConsumedCount>,
    /// The count when the mailbox was allocated.
    base: u64,
    /// Messages popped (handed to the reader) since then.
    handed: u64,
    /// Of those, the ones the reader took, as far as the NI knows (<= `handed`).
    taken: u64,
}

struct Vi {
    owner: u8,
    capacity: usize,
    queue: VecDeque<Message>,
    reader: Option<Reader>,
}

impl Vi {
    /// Messages that count against the capacity: queued, or handed and not taken yet.
    fn unread(&self) -> usize {
        let out = self.reader.as_ref().map_or(0, |r| r.handed - r.taken);
        self.queue.len() + usize::try_from(out).unwrap_or(usize::MAX)
    }

    /// Asks the reader what it took. Never beyond what it was handed, never backwards.
    fn refresh(&mut self) {
        if let Some(r) = &mut self.reader {
            let said = r.count.consumed().wrapping_sub(r.base).min(r.handed);
            r.taken = r.taken.max(said);
        }
    }

    fn full(&mut self) -> bool {
        if self.unread() < self.capacity {
            return false;
        }
        self.refresh();
        self.unread() >= self.capacity
    }
}

pub struct Mailboxes {
    vis: Vec<Option<Vi>>,
    /// Messages delivered recently, by (source, txn, VI), to drop retransmitted copies.
    seen: Recent<(NodeId, u32, u8), ()>,
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
            seen: Recent::default(),
        }
    }

    /// Gives a free mailbox interface with room for `capacity` messages to `rank`.
    /// Popping a message reads it.
    pub fn alloc(&mut self, rank: u8, capacity: usize) -> Result<u8, NiError> {
        self.alloc_with(rank, capacity, None, |_| false, |_| None)
    }

    /// Gives a free mailbox interface with room for `capacity` unread messages to `rank`,
    /// whose reader says through the count `count` makes for the interface's index how
    /// many it took: a popped message counts until then (see the module's documentation).
    /// `want` names the interface; without it the lowest free one that is not `kept`
    /// (kept for an owner to ask for by number: `crate::reserved`) is given.
    pub fn alloc_counted(
        &mut self,
        rank: u8,
        capacity: usize,
        want: Option<u8>,
        kept: impl Fn(u8) -> bool,
        count: impl FnOnce(u8) -> Box<dyn ConsumedCount>,
    ) -> Result<u8, NiError> {
        self.alloc_with(rank, capacity, want, kept, |vi| {
            let count = count(vi);
            let base = count.consumed();
            Some(Reader {
                count,
                base,
                handed: 0,
                taken: 0,
            })
        })
    }

    fn alloc_with(
        &mut self,
        rank: u8,
        capacity: usize,
        want: Option<u8>,
        kept: impl Fn(u8) -> bool,
        reader: impl FnOnce(u8) -> Option<Reader>,
    ) -> Result<u8, NiError> {
        const WHAT: &str = "mailbox interface";
        let vi = match want.map(usize::from) {
            // A service peers address by a fixed interface (the IP service's) asks for it.
            Some(w) => match self.vis.get(w) {
                None => {
                    return Err(NiError::NoSuch {
                        what: WHAT,
                        index: w,
                    })
                }
                Some(Some(_)) => {
                    return Err(NiError::Busy {
                        what: WHAT,
                        index: w,
                    })
                }
                Some(None) => w,
            },
            None => self
                .vis
                .iter()
                .enumerate()
                .position(|(i, v)| v.is_none() && !kept(i as u8))
                .ok_or(NiError::Exhausted(WHAT))?,
        };
        self.vis[vi] = Some(Vi {
            owner: rank,
            capacity: capacity.max(1),
            queue: VecDeque::new(),
            reader: reader(vi as u8),
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

    /// The oldest message of the interface (the reader moves the head). For a counted
    /// mailbox it is handed to the reader, and counts until the reader says it took it.
    pub fn pop(&mut self, rank: u8, vi: u8) -> Result<Option<Message>, NiError> {
        let v = self.vi_mut(rank, vi)?;
        let m = v.queue.pop_front();
        if let (Some(_), Some(r)) = (&m, &mut v.reader) {
            r.handed += 1;
        }
        Ok(m)
    }

    /// Messages in the NI's queue (not popped yet).
    pub fn len(&mut self, rank: u8, vi: u8) -> Result<usize, NiError> {
        Ok(self.vi_mut(rank, vi)?.queue.len())
    }

    /// Messages that count against the capacity: queued, or popped and not taken by the
    /// reader yet (asked now).
    pub fn unread(&mut self, rank: u8, vi: u8) -> Result<usize, NiError> {
        let v = self.vi_mut(rank, vi)?;
        v.refresh();
        Ok(v.unread())
    }

    pub(crate) fn deliver(&mut self, cx: &mut Ctx, cell: &Cell) -> Result<(), NackReason> {
        let key = seen_key(cell).ok_or(NackReason::BadAddress)?;
        // A copy of a delivered message is taken as delivered whatever became of its
        // interface since (freed, or another's): its original's ACK was what was lost.
        if self.seen.contains_key(&key) {
            return Ok(());
        }
        let (vi, rank) = (key.2, cell.dst.rank());
        let Some(Some(v)) = self.vis.get_mut(vi as usize) else {
            return Err(NackReason::NoContext);
        };
        if v.owner != rank {
            return Err(NackReason::NoContext);
        }
        if v.full() {
            return Err(NackReason::QueueFull);
        }
        v.queue.push_back(Message {
            src: cell.src,
            src_rank: cell.src_rank,
            payload: cell.payload.clone(),
            at: cx.at,
        });
        self.seen.insert(key, (), cx.now);
        cx.out.events.push_back(NiEvent::Mailbox {
            rank,
            vi,
            at: cx.at,
        });
        Ok(())
    }

    /// Whether `cell` is a copy of a message delivered here (to whichever process).
    pub(crate) fn delivered(&self, cell: &Cell) -> bool {
        seen_key(cell).is_some_and(|k| self.seen.contains_key(&k))
    }

    /// When the oldest remembered delivery is to be forgotten.
    pub(crate) fn next_deadline(&self, cfg: &NiConfig) -> Option<Instant> {
        self.seen.next_deadline(cfg.keep_ns())
    }

    /// Forgets deliveries older than the configured memory.
    pub(crate) fn expire(&mut self, now: Instant, cfg: &NiConfig) {
        self.seen.expire(now, cfg.keep_ns());
    }
}

/// What a delivered message is remembered by: (source, txn, interface); `None` for an
/// address outside the mailboxes' interfaces.
fn seen_key(cell: &Cell) -> Option<(NodeId, u32, u8)> {
    let vi = cell.dst.va() & !MAILBOX_WINDOW;
    let vi = u8::try_from(vi)
        .ok()
        .filter(|&v| usize::from(v) < MAILBOX_VIS)?;
    Some((cell.src, cell.txn, vi))
}
