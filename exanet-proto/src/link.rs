//! One direction of a link as its sending end sees it: the frames handed to the wire, the
//! operator's faults on them, the frames those faults hold back, and the credit of cells
//! they lost. The daemon (over a QUIC stream) and the simulator (over its event queue) both
//! send through a [`LinkSender`], so a fault has the same effect on a real rack and in a
//! simulated one; they differ only in what they do with a [`Departure`].

use std::collections::VecDeque;

use bytes::BytesMut;

use crate::cell::{Cell, CellError};
use crate::fault::{flip_bit, CellFate, FaultError, FaultInjector, FaultStats, LinkFaults};
use crate::frame::{self, FrameError, CELL_FRAME_HEADER, CREDIT_FRAME_LEN, MARKER_FRAME_LEN};
use crate::model::ModelTime;
use crate::routing::{Vc, NVCS};
use crate::time::Instant;

/// A frame leaving for the far end of the link.
#[derive(Clone, Debug, PartialEq)]
pub enum Departure {
    /// A cell; `flip` is a bit of its encoding (0 = most significant bit of the first
    /// byte) the wire flips on the way.
    Cell {
        vc: Vc,
        cell: Cell,
        flip: Option<usize>,
    },
    /// Link-level credit: never lost (flow control is reliable), but delayed and
    /// rate-limited with the cells it rides beside.
    Credit {
        vc: Vc,
        bytes: u32,
        /// When the space was freed, in modeled time.
        freed: ModelTime,
    },
    /// A cut's marker (see [`crate::cut`]): behind every frame sent before it, as credit is.
    Marker { epoch: u64 },
}

impl Departure {
    /// Bytes the frame occupies on the wire, framing included.
    pub fn frame_len(&self) -> usize {
        match self {
            Departure::Cell { cell, .. } => CELL_FRAME_HEADER + cell.wire_len(),
            Departure::Credit { .. } => CREDIT_FRAME_LEN,
            Departure::Marker { .. } => MARKER_FRAME_LEN,
        }
    }

    /// Appends the frame to a link's byte stream. A flipped bit lands in the cell, never in
    /// the framing: a cut frame length would desynchronise the whole link, which is not a
    /// bit error.
    pub fn encode(&self, out: &mut BytesMut) -> Result<(), CellError> {
        match self {
            Departure::Cell { vc, cell, flip } => {
                let start = out.len();
                frame::encode_cell(*vc, cell, out)?;
                if let Some(bit) = flip {
                    flip_bit(&mut out[start + CELL_FRAME_HEADER..], *bit);
                }
                Ok(())
            }
            Departure::Credit { vc, bytes, freed } => {
                frame::encode_credit(*vc, *bytes, *freed, out);
                Ok(())
            }
            Departure::Marker { epoch } => {
                frame::encode_marker(*epoch, out);
                Ok(())
            }
        }
    }

    /// What the far end decodes from a cell frame: the cell (its payload marked corrupt
    /// when the payload CRC fails), or the error its frame decoder gives when the header or
    /// footer CRC fails (the receiver refunds the credit of the bytes it cannot use).
    /// `None` for a credit.
    pub fn received_cell(self) -> Option<Result<(Vc, Cell), FrameError>> {
        match self {
            Departure::Cell {
                vc,
                cell,
                flip: None,
            } => Some(Ok((vc, cell))),
            Departure::Cell {
                vc,
                cell,
                flip: Some(bit),
            } => {
                let len = cell.wire_len();
                let mut b = BytesMut::with_capacity(len);
                if let Err(err) = cell.encode(&mut b) {
                    let len = len as u32;
                    return Some(Err(FrameError::Cell { vc, len, err }));
                }
                flip_bit(&mut b, bit);
                Some(
                    Cell::decode(&b.freeze())
                        .map(|mut c| {
                            c.stamp = cell.stamp;
                            (vc, c)
                        })
                        .map_err(|err| FrameError::Cell {
                            vc,
                            len: len as u32,
                            err,
                        }),
                )
            }
            Departure::Credit { .. } | Departure::Marker { .. } => None,
        }
    }
}

/// The sending end of one link direction.
#[derive(Debug)]
pub struct LinkSender {
    faults: FaultInjector,
    /// Frames that left and wait for the link's owner to put them on the wire.
    out: VecDeque<Departure>,
    /// Frames held back by the faults, with when each leaves, in that order (FIFO but
    /// for the cells reordering holds back further).
    held: VecDeque<(Instant, Departure)>,
    held_bytes: usize,
    /// Credit of cells the faults dropped, by VC, owed back to this end's own output.
    owed: [u32; NVCS],
}

impl LinkSender {
    /// A sender with no faults; `seed` starts the draws of faults set later.
    pub fn new(seed: u64) -> LinkSender {
        LinkSender {
            faults: FaultInjector::new(seed),
            out: VecDeque::new(),
            held: VecDeque::new(),
            held_bytes: 0,
            owed: [0; NVCS],
        }
    }

    /// Replaces the faults from `now` on. Frames already held keep their place; if the new
    /// setting no longer shapes, they are all due at once, so clearing a fault takes effect
    /// immediately rather than after the old delay drains.
    pub fn set_faults(&mut self, faults: LinkFaults, now: Instant) -> Result<(), FaultError> {
        self.faults.set(faults, now)?;
        if !faults.shapes() {
            for (at, _) in self.held.iter_mut() {
                *at = now;
            }
        }
        Ok(())
    }

    /// Restarts the draws from `seed` (a fault plan run twice draws the same fates).
    pub fn reseed(&mut self, seed: u64) {
        self.faults.reseed(seed);
    }

    pub fn faults(&self) -> &LinkFaults {
        self.faults.faults()
    }

    /// What the faults have done so far.
    pub fn stats(&self) -> FaultStats {
        self.faults.stats()
    }

    /// Bytes held back right now.
    pub fn held_bytes(&self) -> usize {
        self.held_bytes
    }

    /// Hands a cell to the wire at `now`: it leaves now, or is held back by shaping (see
    /// [`poll`](Self::poll) for both), or is lost and its credit owed back (see
    /// [`take_owed`](Self::take_owed)). A duplicated cell leaves twice, if `credit` can
    /// take the copy's link credit from the output.
    pub fn send_cell(
        &mut self,
        now: Instant,
        vc: Vc,
        cell: Cell,
        credit: impl FnOnce(u32) -> bool,
    ) {
        if self.faults.faults().is_clear() {
            self.depart(
                now,
                Departure::Cell {
                    vc,
                    cell,
                    flip: None,
                },
                0,
            );
            return;
        }
        let len = cell.wire_len();
        let flip = match self.faults.cell_fate(len) {
            CellFate::Pass => None,
            CellFate::Drop => {
                // Handed back by the owner when it next serves the link, not here:
                // crediting the output from inside the loop that feeds it would let it
                // drop cells for as long as there are any.
                let owed = &mut self.owed[usize::from(vc.0)];
                *owed = owed.saturating_add(len as u32);
                return;
            }
            CellFate::Corrupt { bit } => Some(bit),
        };
        let copy = self
            .faults
            .duplicates(|| credit(len as u32))
            .then(|| cell.clone());
        let late = self.faults.reorder_ns();
        self.depart(now, Departure::Cell { vc, cell, flip }, late);
        if let Some(cell) = copy {
            self.depart(now, Departure::Cell { vc, cell, flip }, 0);
        }
    }

    /// Hands a credit to the wire at `now` (see [`Departure::Credit`]).
    pub fn send_credit(&mut self, now: Instant, vc: Vc, bytes: u32, freed: ModelTime) {
        self.depart(now, Departure::Credit { vc, bytes, freed }, 0);
    }

    /// Hands a cut's marker to the wire at `now`, behind what was sent before it.
    pub fn send_marker(&mut self, now: Instant, epoch: u64) {
        self.depart(now, Departure::Marker { epoch }, 0);
    }

    /// `late`: held back this much beyond its turn, for later frames to overtake it.
    fn depart(&mut self, now: Instant, d: Departure, late: u64) {
        if self.held.is_empty() && self.faults.faults().is_clear() {
            self.out.push_back(d);
            return;
        }
        let len = d.frame_len();
        let at = self.faults.release_at(now, len);
        if at <= now && late == 0 && self.held.is_empty() {
            self.out.push_back(d);
            return;
        }
        self.held_bytes += len;
        let at = at + late;
        // Behind everything due no later than it: only a reordered cell lands before
        // frames already held.
        let i = self.held.partition_point(|(t, _)| *t <= at);
        self.held.insert(i, (at, d));
    }

    /// The next frame to put on the wire at `now`: those that left, then the held ones
    /// that fell due, in order.
    pub fn poll(&mut self, now: Instant) -> Option<Departure> {
        if let Some(d) = self.out.pop_front() {
            return Some(d);
        }
        match self.held.front() {
            Some((at, _)) if *at <= now => {
                let (_, d) = self.held.pop_front()?;
                self.held_bytes -= d.frame_len();
                Some(d)
            }
            _ => None,
        }
    }

    /// Nothing waits to leave, now or later.
    pub fn is_empty(&self) -> bool {
        self.out.is_empty() && self.held.is_empty()
    }

    /// When the next held frame is due.
    pub fn poll_at(&self) -> Option<Instant> {
        self.held.front().map(|(at, _)| *at)
    }

    /// Whether credit of lost cells is waiting for [`take_owed`](Self::take_owed).
    pub fn owes(&self) -> bool {
        self.owed.iter().any(|&n| n > 0)
    }

    /// The credit of lost cells, by VC, that this end's output should get back now.
    pub fn take_owed(&mut self) -> Option<[u32; NVCS]> {
        let owed = std::mem::take(&mut self.owed);
        owed.iter().any(|&n| n > 0).then_some(owed)
    }

    /// The link's session ended: what was on the wire is lost with it, and so is the
    /// credit of dropped cells (the next session starts from its peer's grant, and handing
    /// it back on top would overrun the peer's queue). Returns the frames discarded.
    pub fn reset(&mut self) -> usize {
        let n = self.held.len() + self.out.len();
        self.out.clear();
        self.held.clear();
        self.held_bytes = 0;
        self.owed = [0; NVCS];
        n
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cell::CellType;
    use crate::fault::FaultKind;
    use crate::frame::{Frame, FrameDecoder};
    use crate::gvas::{Gvas, Pdid};
    use crate::shape::NodeId;

    fn cell(n: u8) -> Cell {
        let dst = Gvas::new(Pdid(1), NodeId(1), 0, 0).unwrap();
        Cell::new(dst, CellType::Load, NodeId(0), vec![n; 32].into()).unwrap()
    }

    fn faults(f: impl FnOnce(&mut LinkFaults)) -> LinkFaults {
        let mut lf = LinkFaults::default();
        f(&mut lf);
        lf
    }

    /// Sends a cell (credit for copies always there) and takes what leaves at once.
    fn send(s: &mut LinkSender, now: Instant, vc: Vc, c: Cell) -> Option<Departure> {
        s.send_cell(now, vc, c, |_| true);
        s.poll(now)
    }

    fn credit(s: &mut LinkSender, now: Instant, vc: Vc, n: u32) -> Option<Departure> {
        s.send_credit(now, vc, n, ModelTime::ZERO);
        s.poll(now)
    }

    #[test]
    fn without_faults_every_frame_leaves_at_once_untouched() {
        let mut s = LinkSender::new(1);
        let d = send(&mut s, Instant::ZERO, Vc(1), cell(3));
        assert_eq!(
            d,
            Some(Departure::Cell {
                vc: Vc(1),
                cell: cell(3),
                flip: None
            })
        );
        assert!(credit(&mut s, Instant::ZERO, Vc(2), 99).is_some());
        assert_eq!(
            (s.held_bytes(), s.poll_at(), s.take_owed(), s.is_empty()),
            (0, None, None, true)
        );
    }

    #[test]
    fn a_lost_cell_owes_its_credit_once() {
        let mut s = LinkSender::new(1);
        s.set_faults(faults(|f| f.loss = 1.0), Instant::ZERO)
            .unwrap();
        assert_eq!(send(&mut s, Instant::ZERO, Vc(2), cell(1)), None);
        assert_eq!(send(&mut s, Instant::ZERO, Vc(2), cell(2)), None);
        let len = cell(1).wire_len() as u32;
        assert_eq!(s.take_owed(), Some([0, 0, 2 * len, 0]));
        assert_eq!(s.take_owed(), None, "owed credit is handed back once");
        assert_eq!(s.stats().cells(FaultKind::Loss), 2);
        // Credit is never lost.
        assert!(credit(&mut s, Instant::ZERO, Vc(0), 5).is_some());
    }

    #[test]
    fn delay_holds_frames_in_order_until_due_and_clearing_releases_them() {
        let mut s = LinkSender::new(1);
        let t0 = Instant::ZERO;
        s.set_faults(faults(|f| f.delay_ns = 1000), t0).unwrap();
        assert_eq!(send(&mut s, t0, Vc(0), cell(1)), None);
        assert_eq!(credit(&mut s, t0 + 10, Vc(0), 64), None);
        assert_eq!(s.poll_at(), Some(t0 + 1000));
        assert_eq!(s.poll(t0 + 999), None);
        assert!(matches!(s.poll(t0 + 1000), Some(Departure::Cell { .. })));
        assert_eq!(s.held_bytes(), CREDIT_FRAME_LEN);
        s.set_faults(LinkFaults::default(), t0 + 20).unwrap();
        assert!(matches!(s.poll(t0 + 20), Some(Departure::Credit { .. })));
        assert_eq!((s.held_bytes(), s.poll_at()), (0, None));
    }

    #[test]
    fn a_session_end_discards_held_frames_and_owed_credit() {
        let mut s = LinkSender::new(1);
        s.set_faults(faults(|f| f.delay_ns = 1000), Instant::ZERO)
            .unwrap();
        s.send_cell(Instant::ZERO, Vc(0), cell(1), |_| true);
        s.set_faults(faults(|f| f.loss = 1.0), Instant::ZERO)
            .unwrap();
        s.send_cell(Instant::ZERO, Vc(0), cell(2), |_| true);
        assert_eq!(s.reset(), 1);
        assert_eq!(
            (s.held_bytes(), s.poll_at(), s.take_owed()),
            (0, None, None)
        );
    }

    #[test]
    fn a_duplicated_cell_leaves_twice_only_with_credit_for_the_copy() {
        let mut s = LinkSender::new(1);
        s.set_faults(faults(|f| f.duplicate = 1.0), Instant::ZERO)
            .unwrap();
        let len = cell(1).wire_len() as u32;
        let mut asked = Vec::new();
        s.send_cell(Instant::ZERO, Vc(1), cell(1), |n| {
            asked.push(n);
            true
        });
        s.send_cell(Instant::ZERO, Vc(1), cell(2), |_| false);
        let out: Vec<Departure> = std::iter::from_fn(|| s.poll(Instant::ZERO)).collect();
        let want = |n| Departure::Cell {
            vc: Vc(1),
            cell: cell(n),
            flip: None,
        };
        assert_eq!(out, vec![want(1), want(1), want(2)]);
        assert_eq!(
            asked,
            vec![len],
            "the copy takes the cell's own length of credit"
        );
        assert_eq!(
            s.stats().cells(FaultKind::Duplicate),
            1,
            "only copies sent count"
        );
    }

    #[test]
    fn reordered_cells_are_overtaken_and_everything_leaves_once() {
        let mut s = LinkSender::new(5);
        let f = faults(|f| {
            f.reorder = 0.3;
            f.reorder_ns = 10_000;
        });
        s.set_faults(f, Instant::ZERO).unwrap();
        for n in 0..100u8 {
            s.send_cell(Instant(u64::from(n) * 100), Vc(0), cell(n), |_| true);
        }
        let mut order = Vec::new();
        let mut now = Instant::ZERO;
        while !s.is_empty() {
            while let Some(Departure::Cell { cell, .. }) = s.poll(now) {
                order.push(cell.payload[0]);
            }
            now = s.poll_at().unwrap_or(now);
        }
        let mut sorted = order.clone();
        sorted.sort_unstable();
        assert_eq!(sorted, (0..100).collect::<Vec<u8>>(), "each cell once");
        assert_ne!(order, sorted, "some cells were overtaken");
        let held = s.stats().cells(FaultKind::Reorder);
        assert!((15..50).contains(&held), "{held} of 100 at 30%");
        assert_eq!(s.held_bytes(), 0);
        let bad = faults(|f| f.reorder = 0.1);
        assert!(s.set_faults(bad, now).is_err(), "reorder needs a window");
    }

    #[test]
    fn a_corrupted_cell_flips_inside_the_cell_and_the_framing_survives() {
        let mut s = LinkSender::new(7);
        s.set_faults(faults(|f| f.corrupt = 1.0), Instant::ZERO)
            .unwrap();
        let mut wire = BytesMut::new();
        for n in 0..64 {
            let d = send(&mut s, Instant::ZERO, Vc(1), cell(n)).unwrap();
            assert!(matches!(d, Departure::Cell { flip: Some(_), .. }));
            let decoded = d.clone().received_cell().unwrap();
            d.encode(&mut wire).unwrap();
            s.send_credit(Instant::ZERO, Vc(3), 11, ModelTime(5));
            s.poll(Instant::ZERO).unwrap().encode(&mut wire).unwrap();
            // What the far end decodes from the stream is what `received_cell` says.
            let mut dec = FrameDecoder::new();
            dec.push_bytes(std::mem::take(&mut wire).freeze());
            match (dec.next_frame(), decoded) {
                (Some(Ok(Frame::Cell(vc, c))), Ok((dvc, dc))) => {
                    assert_eq!((vc, c.is_corrupt()), (dvc, dc.is_corrupt()));
                    assert!(c.is_corrupt() || c != cell(n), "some bit must differ");
                }
                (Some(Err(got)), Err(want)) => assert_eq!(got, want),
                (got, want) => panic!("stream gave {got:?}, received_cell {want:?}"),
            }
            assert!(
                matches!(
                    dec.next_frame(),
                    Some(Ok(Frame::Credit(Vc(3), 11, ModelTime(5))))
                ),
                "the frame after a corrupted cell still decodes"
            );
        }
    }
}
