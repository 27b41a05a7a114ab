//! The receiving half of the RDMA engine: data cells written into memory and tracked per
//! block in a bitmap, each block answered once (ACK, or `Incomplete` with the bitmap so
//! that only the missing cells come again), finished blocks remembered so that late copies
//! are dropped, read requests accepted for the initiator to serve, and notifications.

use std::collections::btree_map::Entry;
use std::collections::BTreeMap;

use super::initiator::{ReadDone, ServedRead};
use super::{
    arm, check_range, failure_from_code, incomplete_payload, Note, BLOCK_SIZE, MAX_SERVED,
    NOTIFY_BLOCK, TXN_RDMA, TXN_SERVED,
};
use crate::cell::{Cell, CellType, FLAG_LAST};
use crate::gvas::Gvas;
use crate::ni::recent::Recent;
use crate::ni::{Ctx, Memory, NackReason, NiConfig, NiEvent};
use crate::shape::NodeId;
use crate::time::{Instant, ModelTime};

#[derive(Clone, Copy, Debug)]
struct RxBlock {
    seq: u16,
    bitmap: u64,
    last: Option<u8>,
    touched: Instant,
    /// The modeled time of its latest cell.
    modeled: ModelTime,
}

type RxKey = (NodeId, u32, u64);

/// `a` is not newer than `b` in wrapping 16-bit sequence space.
fn seq_le(a: u16, b: u16) -> bool {
    b.wrapping_sub(a) < 0x8000
}

pub(super) struct Target {
    served_next: u32,
    /// Read requests being served or served recently, by (reader, read txn). Scanned
    /// whole at every expiry before `Recent`, a node serving an MPI program's rendezvous
    /// reads (thousands a second, each kept for seconds) spent a tenth of its daemon's
    /// CPU there.
    served_seen: Recent<(NodeId, u32), ()>,
    rx: BTreeMap<RxKey, RxBlock>,
    /// Finished blocks: key -> sequence, to drop late copies.
    finished: Recent<RxKey, u16>,
    /// No deadline of the target is earlier than this (see the initiator's `wake`).
    wake: Option<Instant>,
}

impl Target {
    pub(super) fn with_epoch(epoch: u32) -> Target {
        Target {
            served_next: epoch & (TXN_SERVED - 1),
            served_seen: Recent::default(),
            rx: BTreeMap::new(),
            finished: Recent::default(),
            wake: None,
        }
    }

    /// A data cell of some block arrived. True when its payload was written into memory
    /// (what keeps a read waiting for that data alive).
    pub(super) fn on_data(&mut self, cx: &mut Ctx, cell: &Cell, mem: &mut dyn Memory) -> bool {
        let (now, cfg) = (cx.now, cx.cfg);
        let block_no = cell.dst.va() / BLOCK_SIZE;
        let key = (cell.src, cell.txn, block_no);
        if cell.aux >= 64 || cell.payload.is_empty() {
            cx.answer(cell, Some(NackReason::BadAddress));
            return false;
        }
        // One look at the receive contexts per cell. A cell of a block under way (same
        // sequence) needs no look among the finished ones, thousands of them: a block
        // enters `rx` only past that look, and leaves it when it finishes. Only a block's
        // first cell (or a late copy) pays for it.
        let full = self.rx.len() >= cfg.rx_contexts;
        let entry = self.rx.entry(key);
        let under_way = matches!(&entry, Entry::Occupied(o) if o.get().seq == cell.seq);
        if !under_way && Self::answer_finished(&self.finished, cx, cell, key) {
            return false;
        }
        let ctx = match entry {
            Entry::Occupied(o) => o.into_mut(),
            Entry::Vacant(_) if full => {
                cx.answer(cell, Some(NackReason::NoContext));
                return false;
            }
            Entry::Vacant(v) => v.insert(RxBlock {
                seq: cell.seq,
                bitmap: 0,
                last: None,
                touched: now,
                modeled: cx.at,
            }),
        };
        if ctx.seq != cell.seq {
            if seq_le(cell.seq, ctx.seq) {
                cx.stats.stale_cells += 1;
                return false;
            }
            *ctx = RxBlock {
                seq: cell.seq,
                bitmap: 0,
                last: None,
                touched: now,
                modeled: cx.at,
            };
        }
        ctx.touched = now;
        ctx.modeled = cx.at;
        arm(&mut self.wake, now + cfg.remember_ns);
        if mem
            .write(cell.dst.rank(), cell.dst.va(), &cell.payload)
            .is_err()
        {
            // Forget the block rather than hold a receive context for it: the sender
            // retries it whole, and a job faulting on purpose cannot starve the pool.
            self.rx.remove(&key);
            cx.answer(cell, Some(NackReason::PageFault));
            return false;
        }
        ctx.bitmap |= 1 << cell.aux;
        if cell.flags & FLAG_LAST != 0 {
            ctx.last = Some(cell.aux);
        }
        let Some(last) = ctx.last else { return true };
        let full = if last == 63 {
            u64::MAX
        } else {
            (1u64 << (last + 1)) - 1
        };
        if ctx.bitmap != full {
            // The last cell came and some before it did not (links keep order, so they
            // were lost): say which arrived, so the sender resends only the others. A
            // repair ends with the last cell again, which asks again.
            if cell.flags & FLAG_LAST != 0 {
                let p = incomplete_payload(block_no, ctx.bitmap);
                cx.answer_with(cell, Some(NackReason::Incomplete), p);
            }
            return true;
        }
        let seq = ctx.seq;
        self.rx.remove(&key);
        self.remember_finished(key, seq, now, cfg);
        cx.stats.rdma_blocks_received += 1;
        cx.answer(cell, None);
        true
    }

    /// A remote node asks to read this node's memory. Answers it, and returns the write
    /// that serves it when it is accepted; `served` counts the writes serving reads now.
    pub(super) fn on_read_request(
        &mut self,
        cx: &mut Ctx,
        cell: &Cell,
        mem: &dyn Memory,
        served: impl FnOnce() -> usize,
    ) -> Option<ServedRead> {
        if self.answer_copy(cx, cell) {
            return None;
        }
        let key = (cell.src, cell.txn);
        let p = &cell.payload;
        if p.len() != 16 {
            cx.answer(cell, Some(NackReason::BadAddress));
            return None;
        }
        let dst_va = u64::from_be_bytes(p[..8].try_into().expect("8 bytes"));
        let len = u64::from_be_bytes(p[8..16].try_into().expect("8 bytes"));
        let pdid = cell.dst.pdid();
        let (Ok(dst), Ok(done_to)) = (
            Gvas::new(pdid, cell.src, cell.src_rank, dst_va),
            Gvas::new(pdid, cell.src, cell.src_rank, 0),
        ) else {
            cx.answer(cell, Some(NackReason::BadAddress));
            return None;
        };
        if check_range(cell.dst.va(), len).is_err() || check_range(dst_va, len).is_err() {
            cx.answer(cell, Some(NackReason::BadAddress));
            return None;
        }
        // A source that is not registered would fail at its first block anyway; refused
        // here, it costs no transfer record (a 4 GiB read asked of unregistered memory
        // must not make this engine do anything but answer).
        if !mem.contains(cell.dst.rank(), cell.dst.va(), len) {
            cx.answer(cell, Some(NackReason::PageFault));
            return None;
        }
        if served() >= MAX_SERVED {
            cx.answer(cell, Some(NackReason::NoContext));
            return None;
        }
        cx.answer(cell, None);
        self.served_seen.insert(key, (), cx.now);
        arm(&mut self.wake, cx.now + cx.cfg.keep_ns());
        self.served_next = (self.served_next + 1) & (TXN_SERVED - 1);
        Some(ServedRead {
            txn: TXN_RDMA | TXN_SERVED | self.served_next,
            rank: cell.dst.rank(),
            src_va: cell.dst.va(),
            dst,
            len,
            done_to,
            read_txn: cell.txn,
        })
    }

    /// A notification arrived. Returns the read it ends, for a "read done".
    pub(super) fn on_notify(
        &mut self,
        cx: &mut Ctx,
        cell: &Cell,
        mem: &mut dyn Memory,
    ) -> Option<ReadDone> {
        if self.answer_copy(cx, cell) {
            return None;
        }
        let key = (cell.src, cell.txn, NOTIFY_BLOCK);
        let Some(note) = Note::decode(&cell.payload) else {
            cx.answer(cell, Some(NackReason::BadAddress));
            return None;
        };
        let done = match note.kind {
            Note::WRITE => {
                if mem
                    .write(cell.dst.rank(), cell.dst.va(), &cell.payload)
                    .is_err()
                {
                    cx.answer(cell, Some(NackReason::PageFault));
                    return None;
                }
                cx.out.events.push_back(NiEvent::Notified {
                    rank: cell.dst.rank(),
                    va: cell.dst.va(),
                    src: cell.src,
                    len: note.len,
                    at: cx.at,
                });
                None
            }
            Note::READ_DONE => Some(ReadDone {
                from: cell.src,
                rank: cell.dst.rank(),
                txn: note.txn,
                result: if note.status == 0 {
                    Ok(())
                } else {
                    Err(failure_from_code(note.status))
                },
            }),
            _ => {
                cx.answer(cell, Some(NackReason::BadAddress));
                return None;
            }
        };
        self.remember_finished(key, cell.seq, cx.now, cx.cfg);
        cx.answer(cell, None);
        done
    }

    /// Answers `cell` as its original was if it is a copy of something this target
    /// finished: a block, a notice, a read it accepted. False when it is not one. The
    /// first look at a notice or read request; asked before anything else, too, for cells
    /// whose rank is no longer their job's: a copy whose original's answer was lost and
    /// whose receiver has left since was delivered all the same, and refused, it would
    /// fail at its sender what had succeeded.
    pub(super) fn answer_copy(&mut self, cx: &mut Ctx, cell: &Cell) -> bool {
        match cell.kind {
            CellType::Write => {
                let key = (cell.src, cell.txn, cell.dst.va() / BLOCK_SIZE);
                Self::answer_finished(&self.finished, cx, cell, key)
            }
            CellType::Notify => {
                let done = self
                    .finished
                    .contains_key(&(cell.src, cell.txn, NOTIFY_BLOCK));
                if done {
                    cx.answer(cell, None);
                }
                done
            }
            CellType::ReadRequest => {
                let accepted = self.served_seen.contains_key(&(cell.src, cell.txn));
                if accepted {
                    cx.answer(cell, None);
                }
                accepted
            }
            _ => false,
        }
    }

    /// A data cell of finished block `key` at or before its last sequence is a late copy:
    /// dropped, and the block's last cell answered again (its ACK may be what was lost).
    fn answer_finished(
        finished: &Recent<RxKey, u16>,
        cx: &mut Ctx,
        cell: &Cell,
        key: RxKey,
    ) -> bool {
        match finished.get(&key) {
            Some(&seq) if seq_le(cell.seq, seq) => {
                cx.stats.duplicates += 1;
                if cell.seq == seq && cell.flags & FLAG_LAST != 0 {
                    cx.answer(cell, None);
                }
                true
            }
            _ => false,
        }
    }

    /// Remembers finished block (or notice) `key` at sequence `seq`, to drop late copies.
    fn remember_finished(&mut self, key: RxKey, seq: u16, now: Instant, cfg: &NiConfig) {
        self.finished.insert(key, seq, now);
        arm(&mut self.wake, now + cfg.keep_ns());
    }

    /// No earlier than the target's next deadline (see `wake`).
    pub(super) fn next_deadline(&self, cfg: &NiConfig) -> Option<Instant> {
        // Debug builds check the hint against the scan it replaces.
        debug_assert!(
            self.scan_deadlines(cfg)
                .is_none_or(|d| self.wake.is_some_and(|w| w <= d)),
            "wake-up hint {:?} later than the next deadline {:?}",
            self.wake,
            self.scan_deadlines(cfg)
        );
        self.wake
    }

    /// When receive state is next to be forgotten, exactly: even a node that sends
    /// nothing forgets it after a while.
    fn scan_deadlines(&self, cfg: &NiConfig) -> Option<Instant> {
        let keep = cfg.keep_ns();
        self.finished
            .next_deadline(keep)
            .into_iter()
            .chain(self.rx.values().map(|c| c.touched + cfg.remember_ns))
            .chain(self.served_seen.next_deadline(keep))
            .min()
    }

    /// Forgets old receive state. A block under way whose cells stopped coming for
    /// `remember_ns` is forgotten (its sender gave up or went away); in modeled order only
    /// once nothing that could continue it can still reach the NI within that time of its
    /// latest cell, in modeled time. There its cells wait for the rack's cuts in real
    /// time, seconds apart on a loaded host (a 128-rank collective on two cores), and a
    /// block forgotten between two of them was answered `Incomplete` when its last cell
    /// came, and the repair it asked for cost modeled time on every output it crossed, by
    /// how long the host took (its cells then found the block finished and were dropped).
    pub(super) fn on_timeout(&mut self, cx: &Ctx) {
        let (now, cfg) = (cx.now, cx.cfg);
        let window = cfg.remember_ns.saturating_mul(1_000);
        self.rx.retain(|_, c| {
            if now.since(c.touched) < cfg.remember_ns {
                return true;
            }
            if cx.settled(c.modeled + window) {
                return false;
            }
            // Held: looked at again a real-time window later.
            c.touched = now;
            true
        });
        let keep = cfg.keep_ns();
        self.finished.expire(now, keep);
        self.served_seen.expire(now, keep);
        self.wake = self.scan_deadlines(cfg);
    }
}
