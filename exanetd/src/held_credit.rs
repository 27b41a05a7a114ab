//! Credit a link writer holds back for the next frames to carry.
//!
//! Under a ping-pong every cell's credit went out in a QUIC packet of its own, a third of
//! a link's packets, each waking the neighbour's daemon for something it did not need
//! yet: the upstream neighbour had most of its window left. Held for at most
//! [`CREDIT_HOLD`] and at most a share of the window granted, it rides with the next cell
//! or marker instead. The bytes keep their order: whatever goes next goes behind them.
//!
//! Only the daemon holds credit. The simulator hands frames over as the station makes
//! them, so the model's figures are the same either way; on daemons, credit that arrives
//! later can only make a sender's estimate of a downstream buffer's occupancy stay an
//! estimate a little longer.

use bytes::Bytes;
use exanet_proto::Instant;

/// How long (ns) a link writer holds output that is only credit.
pub const CREDIT_HOLD: u64 = 1_000_000;

/// The writer holds at most this share (1/N) of the window it granted, so that an upstream
/// neighbour waits for held credit only once it has used 7/8 of its window.
pub const CREDIT_HOLD_SHARE: u32 = 8;

/// What a writer does with an output.
#[derive(Debug, PartialEq, Eq)]
pub enum Offered {
    /// Held: nothing to write now. `arm`: wake the writer then to write it anyway.
    Held { arm: Option<Instant> },
    /// Write these, in this order.
    Write(Vec<Bytes>),
    /// Nothing to write.
    Nothing,
}

/// A writer's held credit frames.
#[derive(Debug)]
pub struct HeldCredit {
    /// The most credit held at once: a share of the window this end granted.
    limit: u64,
    chunks: Vec<Bytes>,
    credit: u64,
    until: Option<Instant>,
}

impl HeldCredit {
    /// For a link whose end granted `window` bytes per VC.
    pub fn new(window: u32) -> HeldCredit {
        HeldCredit {
            limit: u64::from(window / CREDIT_HOLD_SHARE),
            chunks: Vec::new(),
            credit: 0,
            until: None,
        }
    }

    /// The writer took `bytes` from the station at `now`; `credit_only` is the credit they
    /// return when they are credit frames and nothing else.
    pub fn offer(&mut self, bytes: Bytes, credit_only: Option<u64>, now: Instant) -> Offered {
        // Past its time, what is held goes now, with whatever came: the writer's timer
        // fired once and is not armed again.
        let due = self.until.is_some_and(|t| t <= now);
        if let Some(c) = credit_only.filter(|c| !due && self.credit + c <= self.limit) {
            self.credit += c;
            self.chunks.push(bytes);
            if self.until.is_some() {
                return Offered::Held { arm: None };
            }
            let at = now + CREDIT_HOLD;
            self.until = Some(at);
            return Offered::Held { arm: Some(at) };
        }
        if bytes.is_empty() && !due {
            return Offered::Nothing;
        }
        self.chunks.push(bytes);
        let chunks = std::mem::take(&mut self.chunks)
            .into_iter()
            .filter(|b| !b.is_empty())
            .collect();
        (self.credit, self.until) = (0, None);
        Offered::Write(chunks)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn b(s: &'static str) -> Bytes {
        Bytes::from_static(s.as_bytes())
    }

    #[test]
    fn credit_waits_for_the_next_cell_and_goes_before_it() {
        let mut h = HeldCredit::new(8000);
        let t0 = Instant(1_000);
        assert_eq!(
            h.offer(b("c1"), Some(64), t0),
            Offered::Held {
                arm: Some(t0 + CREDIT_HOLD)
            }
        );
        // A second credit joins it; the writer's timer is already armed.
        assert_eq!(
            h.offer(b("c2"), Some(64), t0 + 10),
            Offered::Held { arm: None }
        );
        assert_eq!(h.offer(Bytes::new(), None, t0 + 20), Offered::Nothing);
        assert_eq!(
            h.offer(b("cell"), None, t0 + 30),
            Offered::Write(vec![b("c1"), b("c2"), b("cell")])
        );
        // Nothing is left held: the next credit arms the timer again.
        assert_eq!(
            h.offer(b("c3"), Some(64), t0 + 40),
            Offered::Held {
                arm: Some(t0 + 40 + CREDIT_HOLD)
            }
        );
    }

    #[test]
    fn credit_goes_alone_when_it_has_waited_long_enough() {
        let mut h = HeldCredit::new(8000);
        let t0 = Instant(0);
        h.offer(b("c1"), Some(64), t0);
        assert_eq!(
            h.offer(Bytes::new(), None, t0 + (CREDIT_HOLD - 1)),
            Offered::Nothing
        );
        assert_eq!(
            h.offer(Bytes::new(), None, t0 + CREDIT_HOLD),
            Offered::Write(vec![b("c1")])
        );
        assert_eq!(
            h.offer(Bytes::new(), None, t0 + (CREDIT_HOLD + 1)),
            Offered::Nothing
        );
    }

    #[test]
    fn credit_that_comes_when_the_held_is_due_goes_with_it() {
        // Woken by its timer, the writer finds more credit: holding it too would leave
        // both with no timer armed.
        let mut h = HeldCredit::new(8000);
        let t0 = Instant(0);
        h.offer(b("c1"), Some(64), t0);
        assert_eq!(
            h.offer(b("c2"), Some(64), t0 + CREDIT_HOLD),
            Offered::Write(vec![b("c1"), b("c2")])
        );
    }

    #[test]
    fn credit_over_the_limit_goes_at_once_with_what_was_held() {
        let mut h = HeldCredit::new(8000);
        let t0 = Instant(0);
        h.offer(b("c1"), Some(600), t0);
        assert_eq!(
            h.offer(b("c2"), Some(600), t0 + 1),
            Offered::Write(vec![b("c1"), b("c2")])
        );
        // A credit that is over the limit by itself is never held.
        assert_eq!(
            h.offer(b("big"), Some(2000), t0 + 2),
            Offered::Write(vec![b("big")])
        );
    }
}
