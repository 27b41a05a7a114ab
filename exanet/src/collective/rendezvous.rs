//! The rendezvous side of software collectives: steps longer than the eager limit go as
//! an RTS, the receiver's CTS naming where the data goes, and an RDMA write with a
//! completion notification there (see [`super::wire`]).
//!
//! Both ends take their memory from a [`Pool`]: the sender stages a step's data in it
//! (the NI reads an RDMA write's source from registered memory), the receiver lands
//! steps and their notifications in it. A pool is emptied between collectives, when
//! every write from and into it has ended; after a failed collective it is retired
//! instead, since a peer's write may still land in it or read from it.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::Arc;

use crate::endpoint::{MemoryRegion, RDMA_WRITE_CHANNELS};
use crate::engine::Shared;
use crate::error::Result;

/// The smallest region a pool registers: most collectives then register once.
const MIN_REGION: u64 = 256 * 1024;
/// Every slot starts on a cell boundary: the RDMA engine cuts the first cell short
/// otherwise, and nothing is gained by it.
const ALIGN: u64 = 256;
/// Bytes of a completion notification.
pub(super) const NOTIFICATION: u64 = 16;
/// Retired pools kept registered before the oldest is let go: long enough that every
/// write into it has ended (the NI gives up a transfer within its retry budget).
pub(super) const RETIRED_POOLS: usize = 4;

/// A piece of a pool: `len` bytes at `offset` of region `region`, VA `va`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Slot {
    pub region: usize,
    pub offset: u64,
    pub va: u64,
    pub len: u64,
}

/// Registered memory handed out by bumping a pointer, emptied all at once.
pub(super) struct Pool {
    shared: Arc<Shared>,
    regions: Vec<MemoryRegion>,
    /// Bytes given out of the last region.
    used: u64,
}

impl Pool {
    pub fn new(shared: &Arc<Shared>) -> Pool {
        Pool {
            shared: Arc::clone(shared),
            regions: Vec::new(),
            used: 0,
        }
    }

    /// `len` bytes, registering a larger region when the last one is full. Its
    /// notifications are the pool's, not the program's.
    pub fn alloc(&mut self, len: u64) -> Result<Slot> {
        let need = len.max(1).div_ceil(ALIGN) * ALIGN;
        let fits = self
            .regions
            .last()
            .is_some_and(|r| r.len() - self.used >= need);
        if !fits {
            let last = self.regions.last().map_or(0, MemoryRegion::len);
            let size = need.next_power_of_two().max(2 * last).max(MIN_REGION);
            let r = MemoryRegion::register(&self.shared, size)?;
            self.shared.claim_notifications(r.va()..r.va() + r.len());
            self.regions.push(r);
            self.used = 0;
        }
        let region = self.regions.len() - 1;
        let offset = self.used;
        self.used += need;
        Ok(Slot {
            region,
            offset,
            va: self.regions[region].va() + offset,
            len,
        })
    }

    pub fn region(&self, slot: &Slot) -> &MemoryRegion {
        &self.regions[slot.region]
    }

    /// The starts of the regions whose notifications the pool takes.
    pub fn claims(&self) -> Vec<u64> {
        self.regions.iter().map(MemoryRegion::va).collect()
    }

    /// Empties the pool for the next collective, keeping its largest region.
    pub fn reset(&mut self) {
        let keep = self.regions.len().saturating_sub(1);
        for r in self.regions.drain(..keep) {
            self.shared.release_notifications(r.va());
        }
        self.used = 0;
    }
}

impl Drop for Pool {
    fn drop(&mut self) {
        for r in &self.regions {
            self.shared.release_notifications(r.va());
        }
    }
}

/// A step staged for an RDMA write, waiting for its CTS or a write channel.
#[derive(Clone, Copy, Debug)]
pub(super) struct Staged {
    pub to: usize,
    pub slot: Slot,
}

/// A landing slot given out in a CTS: step `step` from member `from` lands at
/// `slot.va + NOTIFICATION`, its notification at `slot.va`.
#[derive(Clone, Copy, Debug)]
pub(super) struct Landing {
    pub from: usize,
    pub step: u16,
    pub slot: Slot,
}

/// What one collective's rendezvous have under way.
#[derive(Default)]
pub(super) struct Transfers {
    /// Announced (RTS sent), waiting for the receiver's CTS, by (member, step).
    pub announced: HashMap<(usize, u16), Staged>,
    /// CTS received, waiting for a write channel: the write's source, destination VA and
    /// notification VA.
    pub ready: VecDeque<(Staged, u64, u64)>,
    /// Writes posted: tag and channel.
    pub writing: Vec<(u32, u8)>,
    /// CTS sent, by notification VA.
    pub landing: HashMap<u64, Landing>,
    /// RTS taken, so that a copy of one is known for one.
    pub announced_to_me: HashSet<(usize, u16)>,
}

impl Transfers {
    /// Nothing of this member's sends is left to do.
    pub fn sends_done(&self) -> bool {
        self.announced.is_empty() && self.ready.is_empty() && self.writing.is_empty()
    }

    /// A write channel no posted write holds.
    pub fn free_channel(&self) -> Option<u8> {
        (0..RDMA_WRITE_CHANNELS).find(|c| self.writing.iter().all(|&(_, w)| w != *c))
    }
}
