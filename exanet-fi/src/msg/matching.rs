//! Matching messages with receives, as MPI and libfabric's tagged interface define it: an
//! arriving message goes to the first posted receive that accepts it (in the order they
//! were posted), and a posted receive takes the first unexpected message it accepts (in
//! the order they arrived). Tagged and untagged messages never match each other.

use std::collections::VecDeque;

use super::Peer;

/// What a posted receive accepts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Accepts {
    /// From this endpoint only, or from anyone.
    pub from: Option<Peer>,
    /// A tagged receive (`fi_trecv`) or an untagged one (`fi_recv`).
    pub tagged: bool,
    pub tag: u64,
    /// Tag bits that do not have to match.
    pub ignore: u64,
}

impl Accepts {
    pub fn accepts(&self, from: Peer, tag: Option<u64>) -> bool {
        if self.from.is_some_and(|f| f != from) {
            return false;
        }
        match tag {
            None => !self.tagged,
            Some(t) => self.tagged && (t ^ self.tag) & !self.ignore == 0,
        }
    }
}

/// What [`Matcher::post`] did with a receive.
#[derive(Debug)]
pub enum Posting<R, U> {
    /// A waiting message goes to it: (source, tag, message, receive).
    Matched(Peer, Option<u64>, U, R),
    /// It waits.
    Waiting,
    /// The first waiting message it accepts does not fit it: it is not posted.
    Unfit(R),
}

/// Posted receives (`R`) and messages that came before a receive for them (`U`).
#[derive(Debug)]
pub struct Matcher<R, U> {
    posted: VecDeque<(Accepts, R)>,
    unexpected: VecDeque<(Peer, Option<u64>, U)>,
    max_unexpected: usize,
}

impl<R, U> Matcher<R, U> {
    pub fn new(max_unexpected: usize) -> Matcher<R, U> {
        Matcher {
            posted: VecDeque::new(),
            unexpected: VecDeque::new(),
            max_unexpected,
        }
    }

    /// Posts a receive that takes the messages `fits` says it can. When the first waiting
    /// message it accepts fits, the message and the receive come back to be completed now
    /// ([`Posting::Matched`]); when it does not, the receive comes back unposted
    /// ([`Posting::Unfit`]). Otherwise the receive waits, before the first posted one
    /// `before` says it precedes (the rest of a buffer keeps the buffer's place).
    pub fn post(
        &mut self,
        accepts: Accepts,
        r: R,
        fits: impl Fn(&R, &U) -> bool,
        before: impl Fn(&R) -> bool,
    ) -> Posting<R, U> {
        match self
            .unexpected
            .iter()
            .position(|(from, tag, _)| accepts.accepts(*from, *tag))
        {
            Some(i) if fits(&r, &self.unexpected[i].2) => {
                let (from, tag, u) = self.unexpected.remove(i).expect("index in range");
                Posting::Matched(from, tag, u, r)
            }
            Some(_) => Posting::Unfit(r),
            None => {
                match self.posted.iter().position(|(_, p)| before(p)) {
                    Some(i) => self.posted.insert(i, (accepts, r)),
                    None => self.posted.push_back((accepts, r)),
                }
                Posting::Waiting
            }
        }
    }

    /// A message arrived: the first posted receive that accepts it and that `fits` says
    /// can take it, or `None` when it was queued as unexpected; second, in order, the
    /// receives that accepted it and could not take it, taken out on the way. The queue's
    /// bound is kept by whoever takes messages in: they take none while
    /// [`Matcher::has_room`] says no (a mailbox left full pushes back on senders).
    pub fn arrive(
        &mut self,
        from: Peer,
        tag: Option<u64>,
        u: U,
        fits: impl Fn(&R, &U) -> bool,
    ) -> (Option<(R, U)>, Vec<R>) {
        let mut unfit = Vec::new();
        let mut i = 0;
        while i < self.posted.len() {
            let (a, r) = &self.posted[i];
            if !a.accepts(from, tag) {
                i += 1;
                continue;
            }
            let fit = fits(r, &u);
            let (_, r) = self.posted.remove(i).expect("index in range");
            if fit {
                return (Some((r, u)), unfit);
            }
            unfit.push(r);
        }
        self.unexpected.push_back((from, tag, u));
        (None, unfit)
    }

    /// Whether another unexpected message would fit.
    pub fn has_room(&self) -> bool {
        self.unexpected.len() < self.max_unexpected
    }

    /// Takes back the first posted receive `pick` chooses.
    pub fn cancel(&mut self, pick: impl Fn(&R) -> bool) -> Option<R> {
        self.cancel_where(|_, r| pick(r))
    }

    /// Takes back the first posted receive `pick` chooses by what it accepts too.
    pub fn cancel_where(&mut self, pick: impl Fn(&Accepts, &R) -> bool) -> Option<R> {
        let i = self.posted.iter().position(|(a, r)| pick(a, r))?;
        self.posted.remove(i).map(|(_, r)| r)
    }

    /// The receives waiting, in the order they match.
    pub fn posted_receives(&self) -> impl Iterator<Item = (&Accepts, &R)> {
        self.posted.iter().map(|(a, r)| (a, r))
    }

    /// The first unexpected message `accepts` would take, without taking it.
    pub fn peek(&self, accepts: &Accepts) -> Option<(Peer, Option<u64>, &U)> {
        self.unexpected
            .iter()
            .find(|(from, tag, _)| accepts.accepts(*from, *tag))
            .map(|(f, t, u)| (*f, *t, u))
    }

    /// Takes the first unexpected message `accepts` would take.
    pub fn take(&mut self, accepts: &Accepts) -> Option<(Peer, Option<u64>, U)> {
        let i = self
            .unexpected
            .iter()
            .position(|(from, tag, _)| accepts.accepts(*from, *tag))?;
        self.unexpected.remove(i)
    }

    pub fn unexpected(&self) -> usize {
        self.unexpected.len()
    }

    pub fn posted(&self) -> usize {
        self.posted.len()
    }
}
