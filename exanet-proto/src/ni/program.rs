//! What the NI may promise on behalf of its ranks' programs: a lower bound on the modeled
//! time of anything they may still post, which cells served in modeled order must wait
//! for ([`crate::order`]). Only the driver knows what a program does (the daemon sees
//! whether it sleeps on its completion ring); the NI knows what it posted and what was
//! delivered to it.
//!
//! - A **running** program's next post is no earlier than its last (its clock never goes
//!   back), or than its start.
//! - A **waiting** program (blocked in the library) posts again only once something
//!   delivered to it wakes it, so no earlier than the earliest delivery it has not taken
//!   yet; with none, it promises nothing, and what reaches the NI for it is what bounds
//!   it (the NI relays).
//! - A **scripted** rank's work is all given before the rack runs (the simulator's tests):
//!   there is nothing to promise.
//!
//! A process may also attach later: no earlier than the floor the driver sets (a daemon
//! starts processes' clocks at the wall clock, so the wall clock bounds them).
//!
//! What breaks a promise is a program that waited with a timeout and posts when it runs
//! out, or one the driver stopped trusting (silent for too long while running): such a
//! post is taken when it comes, and what it puts out of order is counted as late.

use super::RANKS;
use crate::time::ModelTime;

/// What a rank's program is doing, as the driver sees it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Program {
    #[default]
    Scripted,
    Running,
    Waiting,
}

#[derive(Clone, Copy, Debug)]
struct Rank {
    attached: bool,
    program: Program,
    /// The latest stamp it posted with (its start until it posts).
    last_post: ModelTime,
    /// The earliest delivery it may not have taken yet.
    undelivered: ModelTime,
}

impl Rank {
    /// Nothing this rank's program posts from now on is earlier.
    fn promise(&self) -> ModelTime {
        match self.program {
            Program::Scripted => ModelTime::NEVER,
            Program::Running => self.last_post,
            Program::Waiting => self.undelivered.max(self.last_post),
        }
    }
}

impl Default for Rank {
    fn default() -> Rank {
        Rank {
            attached: false,
            program: Program::Scripted,
            last_post: ModelTime::ZERO,
            undelivered: ModelTime::NEVER,
        }
    }
}

/// The promises of one NI's ranks.
#[derive(Debug, Default)]
pub(crate) struct Programs {
    ranks: [Rank; RANKS],
    /// No process attaches from now on with an earlier start (`None`: none will).
    attach_floor: Option<ModelTime>,
    /// The earliest a post could come by the NI's last horizon (its programs' promise
    /// with whatever else the NI had to send; zero before any: in the host's order none
    /// is given), whether the switch was to bound it by what reaches the NI too (a
    /// program waited: it relays), and what each rank's program was taken to be doing
    /// then: which promise a post behind it broke ([`Programs::posted`]).
    promised: std::cell::Cell<(ModelTime, bool, [Program; RANKS])>,
    /// The earliest delivery to any of the NI's programs since that horizon: a post at
    /// or after it may be a reaction, which a relaying horizon covers.
    delivered_since: std::cell::Cell<ModelTime>,
}

impl Programs {
    pub(crate) fn attach(&mut self, rank: u8, start: ModelTime) {
        if let Some(r) = self.ranks.get_mut(usize::from(rank)) {
            *r = Rank {
                attached: true,
                last_post: start,
                ..Rank::default()
            };
        }
    }

    pub(crate) fn detach(&mut self, rank: u8) {
        if let Some(r) = self.ranks.get_mut(usize::from(rank)) {
            *r = Rank::default();
        }
    }

    pub(crate) fn set(&mut self, rank: u8, program: Program) {
        if let Some(r) = self.ranks.get_mut(usize::from(rank)) {
            r.program = program;
        }
    }

    /// The rank's program took everything delivered to it.
    pub(crate) fn drained(&mut self, rank: u8) {
        if let Some(r) = self.ranks.get_mut(usize::from(rank)) {
            r.undelivered = ModelTime::NEVER;
        }
    }

    pub(crate) fn delivered(&mut self, rank: u8, at: ModelTime) {
        if let Some(r) = self.ranks.get_mut(usize::from(rank)) {
            r.undelivered = r.undelivered.min(at);
        }
        self.delivered_since.set(self.delivered_since.get().min(at));
    }

    /// `rank` posted at `at`. When that is behind the last horizon handed out, and not a
    /// reaction to a delivery since that a relaying horizon covered, the program the rank
    /// was taken to be then (a post out of modeled order, which the promise said could
    /// not come).
    pub(crate) fn posted(&mut self, rank: u8, at: ModelTime) -> Option<Program> {
        let r = self.ranks.get_mut(usize::from(rank))?;
        r.last_post = r.last_post.max(at);
        let (given, relayed, taken) = self.promised.get();
        let reaction = relayed && at >= self.delivered_since.get();
        (at < given && !reaction).then(|| taken[usize::from(rank)])
    }

    pub(crate) fn set_attach_floor(&mut self, floor: Option<ModelTime>) {
        self.attach_floor = floor;
    }

    /// No program of this NI posts anything earlier, nor does one that attaches later.
    pub(crate) fn promise(&self) -> ModelTime {
        let mut p = self.attach_floor.unwrap_or(ModelTime::NEVER);
        for r in self.ranks.iter().filter(|r| r.attached) {
            p = p.min(r.promise());
        }
        self.promised
            .set((p, self.relay(), self.ranks.map(|r| r.program)));
        self.delivered_since.set(ModelTime::NEVER);
        p
    }

    /// Whether nothing a program of this NI may still post goes before a cell of `rank`'s
    /// at `stamp`, in modeled time and then by rank: what the NI's own cells wait for in
    /// modeled order, so that of the posts of several ranks at one modeled time the
    /// lowest rank's goes first whichever the host delivered first. A program's own later
    /// posts come after what it posted (its clock never goes back, and equal stamps keep
    /// its order); one that attaches later starts past the attach floor. What a post
    /// makes starts `lead` after it (the NI's handling of the command).
    pub(crate) fn none_before(&self, stamp: ModelTime, rank: u8, lead: u64) -> bool {
        if self.attach_floor.is_some_and(|f| f + lead <= stamp) {
            return false;
        }
        self.ranks
            .iter()
            .enumerate()
            .filter(|(_, r)| r.attached)
            .all(|(p, r)| {
                let first = r.promise() + lead;
                first > stamp || (first == stamp && p >= usize::from(rank))
            })
    }

    /// The NI's horizon made of [`Programs::promise`] was `given` (no later than it): a
    /// post behind that is out of modeled order.
    pub(crate) fn given(&self, given: ModelTime) {
        let (_, relayed, taken) = self.promised.get();
        self.promised.set((given, relayed, taken));
    }

    /// Whether no program of the NI may post before the attach floor (with none set:
    /// none may post at all): nothing of its own to promise.
    pub(crate) fn quiet(&self) -> bool {
        let floor = self.attach_floor.unwrap_or(ModelTime::NEVER);
        self.ranks
            .iter()
            .filter(|r| r.attached)
            .all(|r| r.promise() >= floor)
    }

    /// Whether a program may post anywhere in reaction to what reaches the NI for it.
    pub(crate) fn relay(&self) -> bool {
        self.ranks
            .iter()
            .any(|r| r.attached && r.program == Program::Waiting)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn running_promises_its_last_post_waiting_its_earliest_delivery() {
        let mut p = Programs::default();
        assert_eq!(p.promise(), ModelTime::NEVER, "nothing attached, no floor");
        p.attach(0, ModelTime(100));
        assert_eq!(
            p.promise(),
            ModelTime::NEVER,
            "scripted: nothing to promise"
        );
        p.set(0, Program::Running);
        assert_eq!(p.promise(), ModelTime(100), "its start");
        p.posted(0, ModelTime(250));
        p.posted(0, ModelTime(200));
        assert_eq!(p.promise(), ModelTime(250), "its latest post");
        p.set(0, Program::Waiting);
        assert!(p.relay());
        assert_eq!(
            p.promise(),
            ModelTime::NEVER,
            "waiting with nothing delivered"
        );
        p.delivered(0, ModelTime(900));
        p.delivered(0, ModelTime(700));
        assert_eq!(
            p.promise(),
            ModelTime(700),
            "woken by its earliest delivery"
        );
        p.drained(0);
        assert_eq!(p.promise(), ModelTime::NEVER);
        p.set_attach_floor(Some(ModelTime(5000)));
        assert_eq!(
            p.promise(),
            ModelTime(5000),
            "a process that attaches later"
        );
        p.detach(0);
        assert!(!p.relay());
    }

    /// A post behind the last promise handed out names what its rank's program was taken
    /// to be then; none before any promise (the host's order).
    #[test]
    fn a_post_behind_the_promise_names_the_program_it_was_taken_for() {
        let mut p = Programs::default();
        p.attach(0, ModelTime(100));
        p.attach(1, ModelTime(100));
        assert_eq!(p.posted(0, ModelTime(150)), None, "nothing promised yet");
        p.set(0, Program::Running);
        p.set(1, Program::Scripted);
        assert_eq!(p.promise(), ModelTime(150));
        assert_eq!(p.posted(0, ModelTime(160)), None, "on its promise");
        // Taken for gone, it posts behind what its running neighbour promised.
        assert_eq!(p.posted(1, ModelTime(120)), Some(Program::Scripted));
        p.set(1, Program::Running);
        assert_eq!(p.promise(), ModelTime(120));
        assert_eq!(p.posted(1, ModelTime(130)), None);
        p.set(0, Program::Waiting);
        p.set(1, Program::Waiting);
        p.delivered(0, ModelTime(500));
        assert_eq!(p.promise(), ModelTime(500));
        assert_eq!(p.posted(0, ModelTime(400)), Some(Program::Waiting));
        // Waiting with nothing delivered: nothing promised but what reaches the NI (it
        // relays). A reaction to a delivery since is covered; a post before it is not.
        p.drained(0);
        p.drained(1);
        assert_eq!(p.promise(), ModelTime::NEVER);
        p.delivered(1, ModelTime(800));
        assert_eq!(p.posted(1, ModelTime(810)), None, "a reaction");
        assert_eq!(p.posted(0, ModelTime(790)), Some(Program::Waiting));
    }
}
