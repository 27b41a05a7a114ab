//! The packetizer: 64 virtual interfaces x 4 channels per node. A channel sends one
//! message of up to 64 B at a time and keeps it until the destination answers; without an
//! answer it retransmits after a timeout, a bounded number of times. Its state is what
//! the caller polls: ongoing, ACKed, NACKed (with the reason) or timed out.

use bytes::Bytes;

use super::{Ctx, NackReason, NiError, NiEvent, Out, SendMessage};
use crate::cell::{Cell, CellType, FLAG_FIRST, FLAG_LAST};
use crate::gvas::Gvas;
use crate::model::{ModelTime, Stamp};
use crate::time::Instant;

pub const PACKETIZER_VIS: usize = 64;
pub const CHANNELS: usize = 4;
pub const MAX_MESSAGE: usize = 64;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ChannelState {
    Idle,
    Ongoing,
    Acked,
    Nacked(NackReason),
    TimedOut,
}

struct Channel {
    state: ChannelState,
    /// The message in flight, kept for retransmission.
    cell: Option<Cell>,
    deadline: Option<Instant>,
    attempts: u8,
    counter: u32,
    /// When the message in flight was first sent: no copy goes after
    /// `NiConfig::copy_limit_ns` (a late timer, a stalled host, must not send one).
    first_sent: Instant,
    /// In modeled order: when the attempt in flight left the node's switch, in modeled
    /// time (`None` while it has not). Its copy is due a timer's length after.
    left: Option<ModelTime>,
    /// In modeled order: its real-time timer fired but its copy is not due by the model
    /// yet; it needs the rack's horizons to move on (see [`Packetizer::awaits_horizons`]).
    held: bool,
}

pub struct Packetizer {
    owner: [Option<u8>; PACKETIZER_VIS],
    channels: Vec<Channel>,
    /// Channels with a deadline, so that an idle packetizer costs nothing per poll.
    timed: usize,
    /// Channels whose copy is held (`Channel::held`): asked after every pump of a daemon
    /// in modeled order, so counted rather than looked for among them all.
    held: usize,
}

fn idx(vi: u8, ch: u8) -> usize {
    vi as usize * CHANNELS + ch as usize
}

impl Default for Packetizer {
    fn default() -> Self {
        Packetizer::new()
    }
}

impl Packetizer {
    pub fn new() -> Packetizer {
        Packetizer::with_epoch(0)
    }

    /// A packetizer whose message ids start from `epoch` (see `NiConfig::epoch`).
    pub fn with_epoch(epoch: u32) -> Packetizer {
        Packetizer {
            owner: [None; PACKETIZER_VIS],
            channels: (0..PACKETIZER_VIS * CHANNELS)
                .map(|_| Channel {
                    state: ChannelState::Idle,
                    cell: None,
                    deadline: None,
                    attempts: 0,
                    first_sent: Instant::ZERO,
                    left: None,
                    held: false,
                    counter: epoch & 0x7F_FFFF,
                })
                .collect(),
            timed: 0,
            held: 0,
        }
    }

    /// Gives a free virtual interface to `rank`.
    pub fn alloc(&mut self, rank: u8) -> Result<u8, NiError> {
        let vi = self
            .owner
            .iter()
            .position(Option::is_none)
            .ok_or(NiError::Exhausted("packetizer interface"))?;
        self.owner[vi] = Some(rank);
        Ok(vi as u8)
    }

    /// Returns an interface; refused while one of its channels has a message in flight
    /// (that message must end in a completion first).
    pub fn free(&mut self, rank: u8, vi: u8) -> Result<(), NiError> {
        self.check(rank, vi, 0)?;
        if (0..CHANNELS as u8).any(|ch| self.channels[idx(vi, ch)].state == ChannelState::Ongoing) {
            return Err(NiError::Busy {
                what: "packetizer interface",
                index: vi as usize,
            });
        }
        self.release(vi);
        Ok(())
    }

    fn release(&mut self, vi: u8) {
        self.owner[vi as usize] = None;
        for ch in 0..CHANNELS as u8 {
            self.hold(idx(vi, ch), false);
            let c = &mut self.channels[idx(vi, ch)];
            c.state = ChannelState::Idle;
            c.cell = None;
            if c.deadline.take().is_some() {
                self.timed -= 1;
            }
        }
    }

    /// The rank is gone: its messages in flight end (reported timed out; nobody waits
    /// for them) and its interfaces are freed.
    pub(crate) fn detach(&mut self, rank: u8, out: &mut Out, at: ModelTime) {
        for vi in 0..PACKETIZER_VIS as u8 {
            if self.owner[vi as usize] == Some(rank) {
                for ch in 0..CHANNELS as u8 {
                    if self.channels[idx(vi, ch)].state == ChannelState::Ongoing {
                        self.finish(idx(vi, ch), ChannelState::TimedOut, out, at);
                    }
                }
                self.release(vi);
            }
        }
    }

    fn check(&self, rank: u8, vi: u8, ch: u8) -> Result<(), NiError> {
        match self.owner.get(vi as usize) {
            None => Err(NiError::NoSuch {
                what: "packetizer interface",
                index: vi as usize,
            }),
            Some(o) if *o != Some(rank) => Err(NiError::NotOwner {
                what: "packetizer interface",
                index: vi as usize,
            }),
            _ if ch as usize >= CHANNELS => Err(NiError::NoSuch {
                what: "packetizer channel",
                index: ch as usize,
            }),
            _ => Ok(()),
        }
    }

    pub fn state(&self, rank: u8, vi: u8, ch: u8) -> Result<ChannelState, NiError> {
        self.check(rank, vi, ch)?;
        Ok(self.channels[idx(vi, ch)].state)
    }

    /// Sends `op` for `rank` to `dst`, its destination as the NI stamped it, as one cell
    /// of `kind`: the packetizer carries any one-cell operation the destination NI acts
    /// on and answers (a message or memory write is a `Write`).
    pub(crate) fn send(
        &mut self,
        cx: &mut Ctx,
        rank: u8,
        kind: CellType,
        op: &SendMessage,
        dst: Gvas,
    ) -> Result<(), NiError> {
        let (vi, ch, payload) = (op.vi, op.ch, &op.payload);
        self.check(rank, vi, ch)?;
        if payload.len() > MAX_MESSAGE {
            return Err(NiError::TooLong(payload.len()));
        }
        let c = &mut self.channels[idx(vi, ch)];
        if c.state == ChannelState::Ongoing {
            return Err(NiError::Busy {
                what: "packetizer channel",
                index: ch as usize,
            });
        }
        c.counter = (c.counter + 1) & 0x7F_FFFF;
        let mut cell = Cell::new(dst, kind, cx.me, Bytes::copy_from_slice(payload))
            .expect("a message fits a cell");
        cell.txn = (u32::from(vi) << 25) | (u32::from(ch) << 23) | c.counter;
        cell.src_rank = rank;
        cell.flags = FLAG_FIRST | FLAG_LAST;
        cell.stamp = Stamp::at(cx.at);
        c.state = ChannelState::Ongoing;
        c.attempts = 1;
        c.first_sent = cx.now;
        c.left = None;
        if c.deadline.replace(cx.now + cx.cfg.retransmit_ns).is_none() {
            self.timed += 1;
        }
        cx.out.cells.push_back(cell.clone());
        c.cell = Some(cell);
        Ok(())
    }

    /// Marks channel `i`'s copy held or not, keeping the count.
    fn hold(&mut self, i: usize, on: bool) {
        let c = &mut self.channels[i];
        if c.held != on {
            c.held = on;
            if on {
                self.held += 1;
            } else {
                self.held -= 1;
            }
        }
    }

    /// Sends channel `i`'s message again at modeled time `at`, as a new attempt of the
    /// same txn (so that the receiver recognises a duplicate of a delivered message), and
    /// counts it. A copy that was held for the horizons is held no longer: every resend
    /// goes through here, so none can leave the held count behind.
    fn resend(&mut self, i: usize, cx: &mut Ctx, at: ModelTime) {
        self.hold(i, false);
        let c = &mut self.channels[i];
        c.attempts += 1;
        c.left = None;
        c.deadline = Some(cx.now + super::backoff(cx.cfg.retransmit_ns, c.attempts));
        if let Some(cell) = &mut c.cell {
            cell.seq = cell.seq.wrapping_add(1);
            cell.stamp = Stamp::at(at);
            cx.out.cells.push_back(cell.clone());
            cx.stats.retransmissions += 1;
        }
    }

    fn finish(&mut self, i: usize, state: ChannelState, out: &mut Out, at: ModelTime) {
        self.hold(i, false);
        let c = &mut self.channels[i];
        c.state = state;
        if c.deadline.take().is_some() {
            self.timed -= 1;
        }
        let rank = c.cell.take().map(|m| m.src_rank).unwrap_or(0);
        out.events.push_back(NiEvent::Packetizer {
            rank,
            vi: (i / CHANNELS) as u8,
            ch: (i % CHANNELS) as u8,
            state,
            at,
        });
    }

    pub(crate) fn on_answer(&mut self, cx: &mut Ctx, ans: &Cell, nack: Option<NackReason>) {
        let vi = (ans.txn >> 25) & 0x3F;
        let ch = (ans.txn >> 23) & 0x3;
        let i = idx(vi as u8, ch as u8);
        // Only the answer to the attempt in flight counts: a late answer to an earlier
        // message or attempt (or a forged one) is ignored, so that a late NACK cannot end
        // a channel whose retransmission was delivered.
        // An ACK of an earlier copy proves delivery as well as one of the latest: it comes
        // late in real time when the host was slow and the copy was sent again, and its
        // modeled time is the delivery's, not the needless retransmission's.
        let matches = self.channels[i].cell.as_ref().is_some_and(|c| {
            c.txn == ans.txn
                && c.dst.node() == ans.src
                && (c.seq == ans.seq || (nack.is_none() && c.seq.wrapping_sub(ans.seq) < 0x8000))
        });
        if !matches || self.channels[i].state != ChannelState::Ongoing {
            return;
        }
        if nack == Some(NackReason::Crc) && self.channels[i].attempts < cx.cfg.max_attempts {
            // Damaged on the way: the message itself is fine, send it again.
            let at = cx.at;
            self.resend(i, cx, at);
            return;
        }
        let state = match nack {
            None => ChannelState::Acked,
            Some(r) => ChannelState::Nacked(r),
        };
        let at = cx.at;
        self.finish(i, state, cx.out, at);
    }

    /// In modeled order, a message left the node's switch at `cell.stamp`.
    pub(crate) fn on_departed(&mut self, cell: &Cell) {
        // Answers this NI sends carry their sender's txn, not one of these channels'.
        if matches!(cell.kind, CellType::Ack | CellType::Nack) {
            return;
        }
        let vi = (cell.txn >> 25) & 0x3F;
        let ch = (cell.txn >> 23) & 0x3;
        let Some(c) = self.channels.get_mut(idx(vi as u8, ch as u8)) else {
            return;
        };
        if c.cell
            .as_ref()
            .is_some_and(|m| m.txn == cell.txn && m.seq == cell.seq)
        {
            c.left = Some(cell.stamp.head);
        }
    }

    pub(crate) fn next_deadline(&self) -> Option<Instant> {
        if self.timed == 0 {
            return None;
        }
        self.channels.iter().filter_map(|c| c.deadline).min()
    }

    /// Whether a message's copy waits for the rack's horizons to show its answer cannot
    /// come first: work for the rack (see `Ni::has_work`). An idle rack takes no cut, so
    /// the horizons of the last one, taken while the lost cell was still on its way,
    /// held the copy back for ever, and the program waiting for its channel with it.
    pub(crate) fn awaits_horizons(&self) -> bool {
        self.held > 0
    }

    pub(crate) fn on_timeout(&mut self, cx: &mut Ctx) {
        if self.timed == 0 {
            return;
        }
        for i in 0..self.channels.len() {
            let c = &mut self.channels[i];
            if c.deadline.is_none_or(|d| d > cx.now) {
                continue;
            }
            // The modeled timer runs from the modeled send.
            let due = c
                .cell
                .as_ref()
                .map_or(cx.at, |m| m.stamp.head + cx.cfg.model.retransmit);
            // In modeled order, from when it left the node's switch; until its answer
            // is known not to come before the copy would, look again later.
            let copy_at = c
                .left
                .map_or(ModelTime::NEVER, |l| l + cx.cfg.model.retransmit)
                .max(due);
            if !cx.copy_due(copy_at) && cx.now.since(c.first_sent) < cx.cfg.copy_limit_ns() {
                c.deadline = Some(cx.now + cx.cfg.retransmit_ns);
                self.hold(i, true);
                continue;
            }
            if c.attempts >= cx.cfg.max_attempts
                || cx.now.since(c.first_sent) >= cx.cfg.copy_limit_ns()
            {
                cx.stats.timeouts += 1;
                self.finish(i, ChannelState::TimedOut, cx.out, due);
                continue;
            }
            self.resend(i, cx, due);
        }
    }
}
