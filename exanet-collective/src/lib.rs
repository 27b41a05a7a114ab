//! Software collectives as state machines: barrier, broadcast, reduce and allreduce among
//! a group of `size` members, done with point-to-point messages the way an MPI library
//! over the NI does them (report §5.1), for what the allreduce accelerator
//! ([`exanet_proto::ni::allreduce`]) does not cover: other operations, longer vectors, groups
//! that are not whole QFDBs.
//!
//! One [`SoftCollective`] is one member's part in one collective. The transport hands it
//! whole per-step messages ([`SoftCollective::on_receive`]) and carries out what it asks
//! to send ([`SoftCollective::poll_send`]); chunking, retransmission and telling one
//! collective's messages from another's (a collective id) are the transport's business.
//!
//! # Algorithms
//! - Barrier: dissemination; in round `r` member `i` sends an empty message to
//!   `i + 2^r` and waits for one from `i - 2^r` (mod `size`), for ceil(log2 size) rounds.
//! - Broadcast: binomial tree from `root`, in ranks relative to the root (`v = i - root`
//!   mod `size`): in round `t`, members with `v < 2^t` send to `v + 2^t`.
//! - Reduce: binomial tree to `root`, the mirror image: in round `t`, members whose `v` has
//!   lowest set bit `t` send their partial result to `v - 2^t`.
//! - Allreduce, [`Algorithm::RecursiveDoubling`]: with `2^k` the largest power of two not
//!   above `size` and `r = size - 2^k`, the first `2r` members pair up: odd ones send their
//!   vector to the even one below (fold in) and get the result from it at the end (fold
//!   out). The `2^k` remaining members, renumbered in order, exchange whole vectors with
//!   the partner `2^t` away in round `t`.
//! - Allreduce, [`Algorithm::Ring`]: reduce-scatter then allgather around the ring
//!   `i -> i + 1`, over `size` blocks split at element boundaries (sizes differ by at most
//!   one element; blocks may be empty when the vector has fewer elements than members).
//!
//! # Identical bits everywhere
//! Floating-point sums are not associative and `combine`'s min and max are not even
//! commutative on signed zeros, so each result must come out of one expression that every
//! member evaluates the same way (or receives ready-made):
//! - recursive doubling: every combine is `(value of the lower-numbered side) op (value of
//!   the higher-numbered side)`, both in the fold and in the exchanges, so both partners
//!   of an exchange evaluate the same expression on the same bits. The result is the
//!   fold (`v0 op v1`, `v2 op v3`, ..., then the unpaired members) reduced by adjacent
//!   pairs, halving each round;
//! - ring: block `b` is accumulated along the ring starting at member `b`, always
//!   `(partial received) op (my block)`, i.e. `((v_b op v_b+1) op v_b+2) ...` mod `size`,
//!   and the last member's bits are then copied to everyone;
//! - reduce: `(my partial) op (received partial)`, the receiver always being the lower
//!   relative rank: adjacent pairs in relative order, halving each round. With root 0 and
//!   a power-of-two size this is the recursive-doubling allreduce's expression.
//!
//! # Steps
//! `step = phase << 12 | round`, phases in time order within each kind, distinct across
//! kinds so that a stray message of another kind is refused rather than misapplied:
//! 1 barrier round, 2 broadcast round, 3 reduce round, 4 fold in (round 0), 5 recursive
//! doubling exchange, 6 fold out (round 0), 7 ring reduce-scatter, 8 ring allgather. The
//! round takes 12 bits, which bounds a group to [`MAX_GROUP`] members (the ring's
//! `size - 1` rounds per phase).
//!
//! # Hostile input
//! A message is accepted only if this member's schedule expects one from `from` at
//! `step`, it has not had it already, and it has the length the step needs; otherwise
//! [`SoftCollective::on_receive`] returns a typed error and leaves the collective as it
//! was, so the honest message may still come.

#![forbid(unsafe_code)]

use std::collections::{BTreeMap, VecDeque};
use std::ops::Range;

use thiserror::Error;

use exanet_proto::ni::allreduce::{combine, DataType, ReduceOp};

/// The most members a group may have: the ring's rounds must fit a step's 12-bit round.
pub const MAX_GROUP: usize = 1 << ROUND_BITS;
/// From this many bytes on, [`Algorithm::Auto`] takes the ring for an allreduce: the ring
/// sends each member about twice the vector in all, recursive doubling log2(size) times
/// the vector, but the ring takes `2 (size - 1)` rounds of latency instead of log2(size).
pub const RING_THRESHOLD: usize = 8 * 1024;

const ROUND_BITS: u32 = 12;
const BARRIER: u16 = 1;
const BCAST: u16 = 2;
const REDUCE: u16 = 3;
const FOLD_IN: u16 = 4;
const EXCHANGE: u16 = 5;
const FOLD_OUT: u16 = 6;
const SCATTER: u16 = 7;
const GATHER: u16 = 8;

fn step(phase: u16, round: usize) -> u16 {
    debug_assert!(round < MAX_GROUP, "round {round} does not fit the step");
    phase << ROUND_BITS | round as u16
}

/// What the group does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Barrier,
    Bcast {
        root: usize,
    },
    Reduce {
        root: usize,
        op: ReduceOp,
        ty: DataType,
    },
    Allreduce {
        op: ReduceOp,
        ty: DataType,
    },
}

impl Kind {
    fn label(self) -> &'static str {
        match self {
            Kind::Barrier => "barrier",
            Kind::Bcast { .. } => "broadcast",
            Kind::Reduce { .. } => "reduce",
            Kind::Allreduce { .. } => "allreduce",
        }
    }
}

/// How an allreduce is done. Barrier, broadcast and reduce have one algorithm each
/// (dissemination, binomial tree) and take `Auto` or `RecursiveDoubling` alike.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Algorithm {
    /// Recursive doubling below [`RING_THRESHOLD`] bytes, or when the vector has fewer
    /// elements than members (the ring would send empty blocks); the ring otherwise.
    Auto,
    RecursiveDoubling,
    Ring,
}

/// Why a collective could not be set up or refused a message.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum CollectiveError {
    #[error("a group of {0} members: a collective needs 1..={MAX_GROUP}")]
    BadSize(usize),
    #[error("index {index} is not a member of a group of {size}")]
    NotAMember { index: usize, size: usize },
    #[error("root {root} is not a member of a group of {size}")]
    BadRoot { root: usize, size: usize },
    #[error(
        "a vector of {len} B is not a whole number of {}-byte {} elements",
        .ty.size(),
        .ty.label()
    )]
    BadLength { len: usize, ty: DataType },
    #[error("the ring algorithm is for allreduce only, not {kind}")]
    BadAlgorithm { kind: &'static str },
    #[error(
        "no message is expected from member {from} at step {step:#06x} (phase {}, round {})",
        .step >> ROUND_BITS,
        .step & 0xFFF
    )]
    UnexpectedStep { from: usize, step: u16 },
    #[error("step {step:#06x} from member {from}: {got} B where {want} B were expected")]
    WrongLength {
        from: usize,
        step: u16,
        got: usize,
        want: usize,
    },
    #[error("step {step:#06x} from member {from} arrived twice")]
    Duplicate { from: usize, step: u16 },
}

/// A message for the transport to deliver to member `to`, to be handed there to
/// [`SoftCollective::on_receive`] with this member's index and `step`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Outgoing {
    pub to: usize,
    pub step: u16,
    pub data: Vec<u8>,
}

/// What a received message does to the local buffer.
#[derive(Clone, Copy, Debug)]
enum Apply {
    /// Overwrite (broadcast, fold out, allgather).
    Replace,
    /// Reduce into the buffer; `received_first` says which operand the message is, so
    /// that the expression is the one the module doc promises.
    Combine {
        op: ReduceOp,
        ty: DataType,
        received_first: bool,
    },
}

#[derive(Clone, Debug)]
struct Recv {
    from: usize,
    part: Range<usize>,
    apply: Apply,
}

/// One step of a member's schedule: its send goes out as soon as the step is reached
/// (with the buffer as the earlier steps left it), then the step waits for its receive.
#[derive(Clone, Debug)]
struct Action {
    step: u16,
    send: Option<(usize, Range<usize>)>,
    recv: Option<Recv>,
}

/// One member's part in one software collective.
#[derive(Clone, Debug)]
pub struct SoftCollective {
    kind: Kind,
    algo: Algorithm,
    size: usize,
    me: usize,
    data: Vec<u8>,
    schedule: Vec<Action>,
    /// Step -> index in `schedule` of the actions that receive.
    expect: BTreeMap<u16, usize>,
    /// Messages that came before their step was reached.
    early: BTreeMap<u16, Vec<u8>>,
    next: usize,
    /// Whether `schedule[next]`'s send is already queued.
    sent: bool,
    out: VecDeque<Outgoing>,
}

impl SoftCollective {
    /// Member `me`'s part in a collective of `size` members. `data` is:
    /// - barrier: ignored (pass an empty Vec);
    /// - broadcast: the root's data at the root; elsewhere a buffer of the same length
    ///   (contents ignored), since every member knows the count, as in `MPI_Bcast`, and a
    ///   message of another length is then refused;
    /// - reduce, allreduce: my vector, the same length at every member.
    pub fn new(
        kind: Kind,
        algo: Algorithm,
        size: usize,
        me: usize,
        data: Vec<u8>,
    ) -> Result<SoftCollective, CollectiveError> {
        if size == 0 || size > MAX_GROUP {
            return Err(CollectiveError::BadSize(size));
        }
        if me >= size {
            return Err(CollectiveError::NotAMember { index: me, size });
        }
        if let Kind::Bcast { root } | Kind::Reduce { root, .. } = kind {
            if root >= size {
                return Err(CollectiveError::BadRoot { root, size });
            }
        }
        if let Kind::Reduce { ty, .. } | Kind::Allreduce { ty, .. } = kind {
            if data.len() % ty.size() != 0 {
                return Err(CollectiveError::BadLength {
                    len: data.len(),
                    ty,
                });
            }
        }
        let mut data = data;
        let (algo, schedule) = match kind {
            _ if algo == Algorithm::Ring && !matches!(kind, Kind::Allreduce { .. }) => {
                return Err(CollectiveError::BadAlgorithm { kind: kind.label() })
            }
            Kind::Barrier => {
                data.clear();
                (Algorithm::RecursiveDoubling, barrier(size, me))
            }
            Kind::Bcast { root } => (
                Algorithm::RecursiveDoubling,
                bcast(size, me, root, data.len()),
            ),
            Kind::Reduce { root, op, ty } => (
                Algorithm::RecursiveDoubling,
                reduce(size, me, root, data.len(), op, ty),
            ),
            Kind::Allreduce { op, ty } => {
                let algo = match algo {
                    Algorithm::Auto
                        if data.len() >= RING_THRESHOLD && data.len() / ty.size() >= size =>
                    {
                        Algorithm::Ring
                    }
                    Algorithm::Auto => Algorithm::RecursiveDoubling,
                    a => a,
                };
                let schedule = if algo == Algorithm::Ring {
                    ring(size, me, data.len(), op, ty)
                } else {
                    recursive_doubling(size, me, data.len(), op, ty)
                };
                (algo, schedule)
            }
        };
        let expect = schedule
            .iter()
            .enumerate()
            .filter(|(_, a)| a.recv.is_some())
            .map(|(i, a)| (a.step, i))
            .collect();
        let mut c = SoftCollective {
            kind,
            algo,
            size,
            me,
            data,
            schedule,
            expect,
            early: BTreeMap::new(),
            next: 0,
            sent: false,
            out: VecDeque::new(),
        };
        c.advance();
        Ok(c)
    }

    /// The next message to send, in the order they are due; None until a receive lets the
    /// collective go on.
    pub fn poll_send(&mut self) -> Option<Outgoing> {
        self.out.pop_front()
    }

    /// A message from member `from` for `step`. It may come before the steps this member
    /// has still to take: it is kept until its step is reached. Refused (with the
    /// collective left unchanged) when not from a member, not expected from `from` at
    /// `step`, already received, or of the wrong length.
    pub fn on_receive(
        &mut self,
        from: usize,
        step: u16,
        data: &[u8],
    ) -> Result<(), CollectiveError> {
        if from >= self.size {
            return Err(CollectiveError::NotAMember {
                index: from,
                size: self.size,
            });
        }
        let unexpected = CollectiveError::UnexpectedStep { from, step };
        let recv = self
            .expect
            .get(&step)
            .and_then(|&at| self.schedule[at].recv.as_ref().map(|r| (at, r)));
        let Some((at, recv)) = recv.filter(|(_, r)| r.from == from) else {
            return Err(unexpected);
        };
        if at < self.next || self.early.contains_key(&step) {
            return Err(CollectiveError::Duplicate { from, step });
        }
        if data.len() != recv.part.len() {
            return Err(CollectiveError::WrongLength {
                from,
                step,
                got: data.len(),
                want: recv.part.len(),
            });
        }
        self.early.insert(step, data.to_vec());
        self.advance();
        Ok(())
    }

    /// The length of the message this member still expects from `from` at `step`, if it
    /// expects one: what a transport checks before it sets memory aside for a message
    /// announced ahead of its data.
    pub fn expected_len(&self, from: usize, step: u16) -> Option<usize> {
        let &at = self.expect.get(&step)?;
        let recv = self.schedule[at].recv.as_ref()?;
        let pending = recv.from == from && at >= self.next && !self.early.contains_key(&step);
        pending.then_some(recv.part.len())
    }

    /// Every step taken and every message handed out through [`Self::poll_send`]. The
    /// peers may still need those messages delivered to finish.
    pub fn is_done(&self) -> bool {
        self.next == self.schedule.len() && self.out.is_empty()
    }

    /// Once done: allreduce, everyone's result; reduce, the result at the root and
    /// `Some(&[])` elsewhere (done, nothing to show: None would read as "not done");
    /// broadcast, the root's data; barrier, empty.
    pub fn result(&self) -> Option<&[u8]> {
        self.is_done().then_some(self.data.as_slice())
    }

    /// The communication rounds (steps) this member takes part in: what its latency
    /// costs, for tests and benchmarks.
    pub fn rounds(&self) -> usize {
        self.schedule.len()
    }

    /// The algorithm running, with [`Algorithm::Auto`] resolved (barrier, broadcast and
    /// reduce report [`Algorithm::RecursiveDoubling`]: their log-round algorithms).
    pub fn algorithm(&self) -> Algorithm {
        self.algo
    }

    pub fn kind(&self) -> Kind {
        self.kind
    }

    pub fn me(&self) -> usize {
        self.me
    }

    pub fn size(&self) -> usize {
        self.size
    }

    /// The round this member is in (0-based; [`Self::rounds`] once done): with
    /// [`Self::awaiting`], what a collective that timed out says of where it stopped.
    pub fn round(&self) -> usize {
        self.next
    }

    /// The member whose message this one waits for to finish its round: None when the
    /// round receives nothing or the collective is done.
    pub fn awaiting(&self) -> Option<usize> {
        let action = self.schedule.get(self.next)?;
        action.recv.as_ref().map(|r| r.from)
    }

    fn advance(&mut self) {
        while let Some(action) = self.schedule.get(self.next) {
            if !self.sent {
                if let Some((to, part)) = &action.send {
                    self.out.push_back(Outgoing {
                        to: *to,
                        step: action.step,
                        data: self.data[part.clone()].to_vec(),
                    });
                }
                self.sent = true;
            }
            if let Some(recv) = &action.recv {
                let Some(msg) = self.early.remove(&action.step) else {
                    return;
                };
                let mine = &mut self.data[recv.part.clone()];
                match recv.apply {
                    Apply::Replace => mine.copy_from_slice(&msg),
                    Apply::Combine {
                        op,
                        ty,
                        received_first: true,
                    } => {
                        let mut acc = msg;
                        combine(op, ty, &mut acc, mine);
                        mine.copy_from_slice(&acc);
                    }
                    Apply::Combine { op, ty, .. } => combine(op, ty, mine, &msg),
                }
            }
            self.next += 1;
            self.sent = false;
        }
        if let Kind::Reduce { root, .. } = self.kind {
            // A non-root's buffer holds a partial result by now: not something to show.
            if self.me != root {
                self.data.clear();
            }
        }
    }
}

/// ceil(log2 n): the rounds of a dissemination or binomial algorithm over n members.
fn log_rounds(n: usize) -> usize {
    n.next_power_of_two().trailing_zeros() as usize
}

fn barrier(n: usize, me: usize) -> Vec<Action> {
    (0..log_rounds(n))
        .map(|r| {
            let d = 1 << r;
            Action {
                step: step(BARRIER, r),
                send: Some(((me + d) % n, 0..0)),
                recv: Some(Recv {
                    from: (me + n - d) % n,
                    part: 0..0,
                    apply: Apply::Replace,
                }),
            }
        })
        .collect()
}

fn bcast(n: usize, me: usize, root: usize, len: usize) -> Vec<Action> {
    let v = (me + n - root) % n;
    let abs = |rel: usize| (rel + root) % n;
    let mut s = Vec::new();
    for t in 0..log_rounds(n) {
        let mask = 1 << t;
        if v < mask {
            if v + mask < n {
                s.push(Action {
                    step: step(BCAST, t),
                    send: Some((abs(v + mask), 0..len)),
                    recv: None,
                });
            }
        } else if v < 2 * mask {
            s.push(Action {
                step: step(BCAST, t),
                send: None,
                recv: Some(Recv {
                    from: abs(v - mask),
                    part: 0..len,
                    apply: Apply::Replace,
                }),
            });
        }
    }
    s
}

fn reduce(n: usize, me: usize, root: usize, len: usize, op: ReduceOp, ty: DataType) -> Vec<Action> {
    let v = (me + n - root) % n;
    let abs = |rel: usize| (rel + root) % n;
    let mut s = Vec::new();
    for t in 0..log_rounds(n) {
        let mask = 1 << t;
        if v & mask != 0 {
            s.push(Action {
                step: step(REDUCE, t),
                send: Some((abs(v - mask), 0..len)),
                recv: None,
            });
            break;
        }
        if v + mask < n {
            s.push(Action {
                step: step(REDUCE, t),
                send: None,
                recv: Some(Recv {
                    from: abs(v + mask),
                    part: 0..len,
                    apply: Apply::Combine {
                        op,
                        ty,
                        received_first: false,
                    },
                }),
            });
        }
    }
    s
}

fn recursive_doubling(n: usize, me: usize, len: usize, op: ReduceOp, ty: DataType) -> Vec<Action> {
    let pow = if n.is_power_of_two() {
        n
    } else {
        n.next_power_of_two() / 2
    };
    let extra = n - pow;
    let all = 0..len;
    let mut s = Vec::new();
    if me < 2 * extra && me % 2 == 1 {
        // Folded out: contribute to the even member below, then get its result.
        s.push(Action {
            step: step(FOLD_IN, 0),
            send: Some((me - 1, all.clone())),
            recv: None,
        });
        s.push(Action {
            step: step(FOLD_OUT, 0),
            send: None,
            recv: Some(Recv {
                from: me - 1,
                part: all,
                apply: Apply::Replace,
            }),
        });
        return s;
    }
    if me < 2 * extra {
        s.push(Action {
            step: step(FOLD_IN, 0),
            send: None,
            recv: Some(Recv {
                from: me + 1,
                part: all.clone(),
                apply: Apply::Combine {
                    op,
                    ty,
                    received_first: false,
                },
            }),
        });
    }
    // The renumbering keeps the members' order, so "lower new rank" is "lower ranks".
    let rank = if me < 2 * extra { me / 2 } else { me - extra };
    let member = |r: usize| if r < extra { 2 * r } else { r + extra };
    for t in 0..log_rounds(pow) {
        let partner = rank ^ (1 << t);
        s.push(Action {
            step: step(EXCHANGE, t),
            send: Some((member(partner), all.clone())),
            recv: Some(Recv {
                from: member(partner),
                part: all.clone(),
                apply: Apply::Combine {
                    op,
                    ty,
                    received_first: partner < rank,
                },
            }),
        });
    }
    if me < 2 * extra {
        s.push(Action {
            step: step(FOLD_OUT, 0),
            send: Some((me + 1, all)),
            recv: None,
        });
    }
    s
}

/// The byte range of block `b` of `n`, a vector of `len` bytes of `elem`-byte elements
/// split at element boundaries, the first `elements % n` blocks one element longer.
fn block(b: usize, n: usize, len: usize, elem: usize) -> Range<usize> {
    let elements = len / elem;
    let (base, longer) = (elements / n, elements % n);
    let start = b * base + b.min(longer);
    let end = start + base + usize::from(b < longer);
    start * elem..end * elem
}

fn ring(n: usize, me: usize, len: usize, op: ReduceOp, ty: DataType) -> Vec<Action> {
    let (right, left) = ((me + 1) % n, (me + n - 1) % n);
    let blk = |b: usize| block(b % n, n, len, ty.size());
    let mut s = Vec::new();
    // Block b starts at member b and gathers one contribution per hop, so member i ends
    // holding block i + 1 complete, which the allgather then passes round.
    for r in 0..n - 1 {
        s.push(Action {
            step: step(SCATTER, r),
            send: Some((right, blk(me + n - r))),
            recv: Some(Recv {
                from: left,
                part: blk(me + 2 * n - r - 1),
                apply: Apply::Combine {
                    op,
                    ty,
                    received_first: true,
                },
            }),
        });
    }
    for r in 0..n - 1 {
        s.push(Action {
            step: step(GATHER, r),
            send: Some((right, blk(me + 1 + n - r))),
            recv: Some(Recv {
                from: left,
                part: blk(me + n - r),
                apply: Apply::Replace,
            }),
        });
    }
    s
}

// The references the unit tests' expectations come from, shared with exanet-proto's
// tests/allreduce_sim.rs (by path: it brings `SplitMix64` in from here).
#[cfg(test)]
use exanet_proto::SplitMix64;
#[cfg(test)]
#[path = "../../exanet-proto/tests/support/reference.rs"]
mod reference;

#[cfg(test)]
mod tests {
    use super::reference::{combined, vector};
    use super::*;
    use exanet_proto::SplitMix64;

    const TYPES: [DataType; 4] = [DataType::I32, DataType::I64, DataType::F32, DataType::F64];
    const OPS: [ReduceOp; 3] = [ReduceOp::Sum, ReduceOp::Min, ReduceOp::Max];

    #[derive(Clone, Copy, Debug)]
    enum Delivery {
        Fifo,
        Shuffled(u64),
        /// Always the pending message with the highest step: forces early arrivals.
        LatestFirst,
    }

    fn members(kind: Kind, algo: Algorithm, inputs: &[Vec<u8>]) -> Vec<SoftCollective> {
        let n = inputs.len();
        (0..n)
            .map(|i| SoftCollective::new(kind, algo, n, i, inputs[i].clone()).unwrap())
            .collect()
    }

    /// Runs the group to the end through a simulated network; returns each member's result.
    fn run(kind: Kind, algo: Algorithm, inputs: &[Vec<u8>], delivery: Delivery) -> Vec<Vec<u8>> {
        let mut m = members(kind, algo, inputs);
        let mut rng = SplitMix64::new(match delivery {
            Delivery::Shuffled(seed) => seed,
            _ => 0,
        });
        let mut pool: Vec<(usize, Outgoing)> = Vec::new();
        loop {
            for (i, c) in m.iter_mut().enumerate() {
                while let Some(o) = c.poll_send() {
                    assert_ne!(o.to, i, "{kind:?}: member {i} sends to itself");
                    pool.push((i, o));
                }
            }
            if pool.is_empty() {
                break;
            }
            let k = match delivery {
                Delivery::Fifo => 0,
                Delivery::Shuffled(_) => rng.below(pool.len() as u64) as usize,
                Delivery::LatestFirst => (0..pool.len()).max_by_key(|&k| pool[k].1.step).unwrap(),
            };
            let (from, o) = pool.remove(k);
            m[o.to]
                .on_receive(from, o.step, &o.data)
                .unwrap_or_else(|e| panic!("{kind:?} {algo:?} n={}: {e}", inputs.len()));
        }
        m.iter()
            .enumerate()
            .map(|(i, c)| {
                let r = c.result();
                assert!(
                    r.is_some(),
                    "{kind:?} {algo:?} n={}: member {i} not done",
                    inputs.len()
                );
                r.unwrap().to_vec()
            })
            .collect()
    }

    /// Adjacent pairs, lower op higher, halving until one is left (an odd last one moves
    /// up unchanged): the binomial reduce's expression, and recursive doubling's after
    /// the fold.
    fn pairwise(op: ReduceOp, ty: DataType, mut vals: Vec<Vec<u8>>) -> Vec<u8> {
        while vals.len() > 1 {
            vals = vals
                .chunks(2)
                .map(|c| match c {
                    [a, b] => combined(op, ty, a, b),
                    [a] => a.clone(),
                    _ => unreachable!(),
                })
                .collect();
        }
        vals.pop().unwrap()
    }

    fn reference_rd(op: ReduceOp, ty: DataType, v: &[Vec<u8>]) -> Vec<u8> {
        let n = v.len();
        let mut pow = 1;
        while pow * 2 <= n {
            pow *= 2;
        }
        let extra = n - pow;
        let folded = (0..extra)
            .map(|i| combined(op, ty, &v[2 * i], &v[2 * i + 1]))
            .chain(v[2 * extra..].iter().cloned())
            .collect();
        pairwise(op, ty, folded)
    }

    fn reference_ring(op: ReduceOp, ty: DataType, v: &[Vec<u8>]) -> Vec<u8> {
        let n = v.len();
        let elements = v[0].len() / ty.size();
        let mut out = Vec::new();
        for b in 0..n {
            let count = elements / n + usize::from(b < elements % n);
            let start = out.len();
            let bytes = start..start + count * ty.size();
            let mut acc = v[b][bytes.clone()].to_vec();
            for t in 1..n {
                acc = combined(op, ty, &acc, &v[(b + t) % n][bytes.clone()]);
            }
            out.extend(acc);
        }
        out
    }

    fn reference_reduce(op: ReduceOp, ty: DataType, root: usize, v: &[Vec<u8>]) -> Vec<u8> {
        let n = v.len();
        pairwise(op, ty, (0..n).map(|r| v[(r + root) % n].clone()).collect())
    }

    fn sizes() -> impl Iterator<Item = usize> {
        (1..=17).chain([32, 64])
    }

    fn lengths(n: usize, ty: DataType) -> Vec<usize> {
        let mut l = vec![1, 2, 3, n.saturating_sub(1), n, n + 1, 4096 / ty.size()];
        l.retain(|&e| e >= 1);
        l.sort_unstable();
        l.dedup();
        l
    }

    #[test]
    fn allreduce_matches_reference_bit_for_bit_on_every_member() {
        let mut rng = SplitMix64::new(0xA11);
        for n in sizes() {
            for ty in TYPES {
                for op in OPS {
                    for elements in lengths(n, ty) {
                        let inputs: Vec<_> =
                            (0..n).map(|_| vector(&mut rng, ty, elements)).collect();
                        let kind = Kind::Allreduce { op, ty };
                        for (algo, want) in [
                            (Algorithm::RecursiveDoubling, reference_rd(op, ty, &inputs)),
                            (Algorithm::Ring, reference_ring(op, ty, &inputs)),
                        ] {
                            let got = run(kind, algo, &inputs, Delivery::Shuffled(rng.next_u64()));
                            for (i, r) in got.iter().enumerate() {
                                // Not assert_eq: a 4 KiB vector in the message
                                // would hide where it went wrong.
                                let diff = r.iter().zip(&want).position(|(a, b)| a != b);
                                assert!(
                                    r == &want,
                                    "{algo:?} {op:?} {ty:?} n={n} elements={elements}: \
                                     member {i} differs at byte {diff:?}"
                                );
                            }
                        }
                    }
                }
            }
        }
    }

    /// A member says which round it is in and whose message it waits for: in a
    /// recursive-doubling allreduce of four (two rounds), member 0 waits for 1, then
    /// for 2.
    #[test]
    fn a_member_says_where_it_waits() {
        let kind = Kind::Allreduce {
            op: ReduceOp::Sum,
            ty: DataType::I64,
        };
        let mut m: Vec<_> = (0..4)
            .map(|i| {
                SoftCollective::new(kind, Algorithm::RecursiveDoubling, 4, i, vec![0; 8]).unwrap()
            })
            .collect();
        assert_eq!((m[0].round(), m[0].awaiting()), (0, Some(1)));
        let o = m[1].poll_send().expect("member 1's first step");
        assert_eq!(o.to, 0);
        m[0].on_receive(1, o.step, &o.data).unwrap();
        assert_eq!((m[0].round(), m[0].awaiting()), (1, Some(2)));
        assert_eq!(m[0].rounds(), 2);
    }

    #[test]
    fn bcast_gives_the_roots_data_everywhere() {
        let mut rng = SplitMix64::new(0xB);
        for n in sizes() {
            for root in [0, n - 1] {
                for len in [0, 1, 7, 4096] {
                    let data = vector(&mut rng, DataType::I32, len / 4 + 1)[..len].to_vec();
                    let inputs: Vec<_> = (0..n)
                        .map(|i| {
                            if i == root {
                                data.clone()
                            } else {
                                vec![0xEE; len]
                            }
                        })
                        .collect();
                    let got = run(
                        Kind::Bcast { root },
                        Algorithm::Auto,
                        &inputs,
                        Delivery::Shuffled(rng.next_u64()),
                    );
                    assert!(
                        got.iter().all(|r| *r == data),
                        "n={n} root={root} len={len}"
                    );
                }
            }
        }
    }

    #[test]
    fn reduce_gives_the_reference_at_root_and_nothing_elsewhere() {
        let mut rng = SplitMix64::new(0xC);
        for n in sizes() {
            for root in [0, n - 1] {
                for ty in TYPES {
                    for op in OPS {
                        for elements in [1, 5, 4096 / ty.size()] {
                            let inputs: Vec<_> =
                                (0..n).map(|_| vector(&mut rng, ty, elements)).collect();
                            let kind = Kind::Reduce { root, op, ty };
                            let got = run(
                                kind,
                                Algorithm::Auto,
                                &inputs,
                                Delivery::Shuffled(rng.next_u64()),
                            );
                            assert_eq!(
                                got[root],
                                reference_reduce(op, ty, root, &inputs),
                                "{kind:?} n={n}"
                            );
                            assert!(got
                                .iter()
                                .enumerate()
                                .all(|(i, r)| i == root || r.is_empty()));
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn reduce_at_zero_equals_allreduce_on_powers_of_two() {
        let mut rng = SplitMix64::new(0xD);
        for n in [1, 2, 4, 8, 16, 32] {
            let (op, ty) = (ReduceOp::Sum, DataType::F64);
            let inputs: Vec<_> = (0..n).map(|_| vector(&mut rng, ty, 64)).collect();
            let reduced = run(
                Kind::Reduce { root: 0, op, ty },
                Algorithm::Auto,
                &inputs,
                Delivery::Fifo,
            );
            let all = run(
                Kind::Allreduce { op, ty },
                Algorithm::RecursiveDoubling,
                &inputs,
                Delivery::Fifo,
            );
            assert_eq!(reduced[0], all[0], "n={n}");
        }
    }

    #[test]
    fn barrier_completes_for_every_size() {
        for n in sizes() {
            let got = run(
                Kind::Barrier,
                Algorithm::Auto,
                &vec![Vec::new(); n],
                Delivery::Shuffled(n as u64),
            );
            assert!(got.iter().all(Vec::is_empty), "n={n}");
        }
    }

    #[test]
    fn barrier_holds_everyone_until_the_last_member_enters() {
        for n in 2..=17 {
            for late in [0, n / 2, n - 1] {
                let mut m: Vec<Option<SoftCollective>> = (0..n)
                    .map(|i| {
                        (i != late).then(|| {
                            SoftCollective::new(Kind::Barrier, Algorithm::Auto, n, i, Vec::new())
                                .unwrap()
                        })
                    })
                    .collect();
                let mut held = Vec::new();
                let mut pool: Vec<(usize, Outgoing)> = Vec::new();
                let mut drain =
                    |m: &mut Vec<Option<SoftCollective>>, held: &mut Vec<(usize, Outgoing)>| loop {
                        for (i, c) in m.iter_mut().enumerate() {
                            while let Some(o) = c.as_mut().and_then(SoftCollective::poll_send) {
                                pool.push((i, o));
                            }
                        }
                        let Some((from, o)) = pool.pop() else { break };
                        match &mut m[o.to] {
                            Some(c) => c.on_receive(from, o.step, &o.data).unwrap(),
                            None => held.push((from, o)),
                        }
                    };
                drain(&mut m, &mut held);
                for (i, c) in m.iter().enumerate() {
                    assert!(
                        !c.as_ref().is_some_and(SoftCollective::is_done),
                        "n={n} late={late}: {i} left early"
                    );
                }
                m[late] = Some(
                    SoftCollective::new(Kind::Barrier, Algorithm::Auto, n, late, Vec::new())
                        .unwrap(),
                );
                for (from, o) in std::mem::take(&mut held) {
                    m[late]
                        .as_mut()
                        .unwrap()
                        .on_receive(from, o.step, &o.data)
                        .unwrap();
                }
                drain(&mut m, &mut held);
                assert!(held.is_empty());
                assert!(
                    m.iter().all(|c| c.as_ref().unwrap().is_done()),
                    "n={n} late={late}"
                );
            }
        }
    }

    #[test]
    fn delivery_order_does_not_change_a_bit() {
        let mut rng = SplitMix64::new(0xE);
        for n in [3, 5, 8, 13, 17] {
            let (op, ty) = (ReduceOp::Sum, DataType::F32);
            let inputs: Vec<_> = (0..n).map(|_| vector(&mut rng, ty, 100)).collect();
            let kinds = [
                (Kind::Allreduce { op, ty }, Algorithm::RecursiveDoubling),
                (Kind::Allreduce { op, ty }, Algorithm::Ring),
                (
                    Kind::Reduce {
                        root: n - 1,
                        op,
                        ty,
                    },
                    Algorithm::Auto,
                ),
                (Kind::Bcast { root: n - 1 }, Algorithm::Auto),
            ];
            for (kind, algo) in kinds {
                let fifo = run(kind, algo, &inputs, Delivery::Fifo);
                let latest = run(kind, algo, &inputs, Delivery::LatestFirst);
                assert_eq!(fifo, latest, "{kind:?} {algo:?} n={n}");
                for seed in 0..8 {
                    assert_eq!(
                        fifo,
                        run(kind, algo, &inputs, Delivery::Shuffled(seed)),
                        "{kind:?} {algo:?} n={n} seed={seed}"
                    );
                }
            }
        }
    }

    #[test]
    fn an_early_message_waits_for_its_step() {
        let (op, ty) = (ReduceOp::Sum, DataType::I32);
        let kind = Kind::Allreduce { op, ty };
        let v = |x: i32| x.to_le_bytes().to_vec();
        let mut m0 = SoftCollective::new(kind, Algorithm::RecursiveDoubling, 4, 0, v(1)).unwrap();
        assert_eq!(
            m0.poll_send(),
            Some(Outgoing {
                to: 1,
                step: step(EXCHANGE, 0),
                data: v(1)
            })
        );
        // Round 1 from member 2 (holding 2's and 3's sum) before round 0 from member 1.
        m0.on_receive(2, step(EXCHANGE, 1), &v(30)).unwrap();
        assert!(!m0.is_done());
        assert_eq!(m0.poll_send(), None);
        m0.on_receive(1, step(EXCHANGE, 0), &v(2)).unwrap();
        assert_eq!(
            m0.poll_send(),
            Some(Outgoing {
                to: 2,
                step: step(EXCHANGE, 1),
                data: v(3)
            })
        );
        assert_eq!(m0.result(), Some(v(33).as_slice()));
    }

    #[test]
    fn algorithm_choice_and_rounds() {
        let f64s = |elements: usize| vec![0u8; elements * 8];
        let ar = |algo, n, me, data| {
            SoftCollective::new(
                Kind::Allreduce {
                    op: ReduceOp::Sum,
                    ty: DataType::F64,
                },
                algo,
                n,
                me,
                data,
            )
            .unwrap()
        };
        // Auto: the ring from RING_THRESHOLD bytes on, unless it would send empty blocks.
        assert_eq!(
            ar(Algorithm::Auto, 8, 0, f64s(RING_THRESHOLD / 8 - 1)).algorithm(),
            Algorithm::RecursiveDoubling
        );
        assert_eq!(
            ar(Algorithm::Auto, 8, 0, f64s(RING_THRESHOLD / 8)).algorithm(),
            Algorithm::Ring
        );
        assert_eq!(
            ar(Algorithm::Auto, 2048, 0, f64s(1024)).algorithm(),
            Algorithm::RecursiveDoubling
        );
        assert_eq!(
            ar(Algorithm::Ring, 8, 0, f64s(1)).algorithm(),
            Algorithm::Ring
        );
        // Rounds: log2 for powers of two; the fold adds two for the even paired members;
        // the odd paired ones only fold in and out; the ring takes 2 (n - 1).
        assert_eq!(ar(Algorithm::RecursiveDoubling, 16, 5, f64s(4)).rounds(), 4);
        assert_eq!(ar(Algorithm::RecursiveDoubling, 1, 0, f64s(4)).rounds(), 0);
        assert_eq!(ar(Algorithm::RecursiveDoubling, 11, 0, f64s(4)).rounds(), 5);
        assert_eq!(ar(Algorithm::RecursiveDoubling, 11, 5, f64s(4)).rounds(), 2);
        assert_eq!(ar(Algorithm::RecursiveDoubling, 11, 6, f64s(4)).rounds(), 3);
        assert_eq!(ar(Algorithm::Ring, 11, 3, f64s(4)).rounds(), 20);
        let new =
            |kind, n, me| SoftCollective::new(kind, Algorithm::Auto, n, me, Vec::new()).unwrap();
        assert_eq!(new(Kind::Barrier, 17, 3).rounds(), 5);
        assert_eq!(new(Kind::Bcast { root: 2 }, 17, 2).rounds(), 5);
        // Relative rank 16 is the leaf added in the last round.
        assert_eq!(new(Kind::Bcast { root: 2 }, 17, 1).rounds(), 1);
        let reduce = Kind::Reduce {
            root: 0,
            op: ReduceOp::Max,
            ty: DataType::I64,
        };
        assert_eq!(new(reduce, 17, 0).rounds(), 5);
        assert_eq!(new(reduce, 17, 1).rounds(), 1);
        assert_eq!(new(reduce, 17, 12).rounds(), 3);
    }

    #[test]
    fn bad_construction_is_a_typed_error() {
        let sum = Kind::Allreduce {
            op: ReduceOp::Sum,
            ty: DataType::F32,
        };
        let new = |kind, algo, n, me, len| {
            SoftCollective::new(kind, algo, n, me, vec![0; len]).map(|_| ())
        };
        assert_eq!(
            new(sum, Algorithm::Auto, 0, 0, 4),
            Err(CollectiveError::BadSize(0))
        );
        assert_eq!(
            new(sum, Algorithm::Auto, MAX_GROUP + 1, 0, 4),
            Err(CollectiveError::BadSize(MAX_GROUP + 1))
        );
        assert_eq!(
            new(sum, Algorithm::Ring, MAX_GROUP, MAX_GROUP - 1, 4),
            Ok(())
        );
        assert_eq!(
            new(sum, Algorithm::Auto, 4, 4, 4),
            Err(CollectiveError::NotAMember { index: 4, size: 4 })
        );
        assert_eq!(
            new(Kind::Bcast { root: 4 }, Algorithm::Auto, 4, 0, 4),
            Err(CollectiveError::BadRoot { root: 4, size: 4 })
        );
        let reduce = Kind::Reduce {
            root: 9,
            op: ReduceOp::Min,
            ty: DataType::I64,
        };
        assert_eq!(
            new(reduce, Algorithm::Auto, 4, 0, 8),
            Err(CollectiveError::BadRoot { root: 9, size: 4 })
        );
        assert_eq!(
            new(sum, Algorithm::Auto, 4, 0, 6),
            Err(CollectiveError::BadLength {
                len: 6,
                ty: DataType::F32
            })
        );
        let reduce = Kind::Reduce {
            root: 0,
            op: ReduceOp::Min,
            ty: DataType::I64,
        };
        assert_eq!(
            new(reduce, Algorithm::Auto, 4, 0, 12),
            Err(CollectiveError::BadLength {
                len: 12,
                ty: DataType::I64
            })
        );
        assert_eq!(
            new(Kind::Barrier, Algorithm::Ring, 4, 0, 0),
            Err(CollectiveError::BadAlgorithm { kind: "barrier" })
        );
        let e = CollectiveError::BadLength {
            len: 6,
            ty: DataType::F32,
        }
        .to_string();
        assert!(e.contains("6 B") && e.contains("4-byte f32"), "{e}");
    }

    #[test]
    fn hostile_messages_are_typed_errors_that_change_nothing() {
        let (op, ty) = (ReduceOp::Sum, DataType::I64);
        let kind = Kind::Allreduce { op, ty };
        let v = |x: i64| x.to_le_bytes().to_vec();
        let mut m = SoftCollective::new(kind, Algorithm::RecursiveDoubling, 4, 0, v(1)).unwrap();
        let r0 = step(EXCHANGE, 0);
        assert_eq!(
            m.on_receive(4, r0, &v(2)),
            Err(CollectiveError::NotAMember { index: 4, size: 4 })
        );
        assert_eq!(
            m.on_receive(usize::MAX, r0, &v(2)),
            Err(CollectiveError::NotAMember {
                index: usize::MAX,
                size: 4
            })
        );
        for (from, s) in [
            (1, 0xFFFF),
            (1, step(EXCHANGE, 2)),
            (1, step(BARRIER, 0)),
            (2, r0),
            (0, r0),
            (1, step(FOLD_IN, 0)),
        ] {
            assert_eq!(
                m.on_receive(from, s, &v(2)),
                Err(CollectiveError::UnexpectedStep { from, step: s })
            );
        }
        assert_eq!(
            m.on_receive(1, r0, &[0; 4]),
            Err(CollectiveError::WrongLength {
                from: 1,
                step: r0,
                got: 4,
                want: 8
            })
        );
        assert_eq!(
            m.on_receive(1, r0, &[]),
            Err(CollectiveError::WrongLength {
                from: 1,
                step: r0,
                got: 0,
                want: 8
            })
        );
        // What a transport may set memory aside for: only what is still to come.
        assert_eq!(m.expected_len(1, r0), Some(8));
        assert_eq!(m.expected_len(2, r0), None);
        assert_eq!(m.expected_len(1, 0xFFFF), None);
        // An early message, then the same again: refused while it waits, and after.
        let r1 = step(EXCHANGE, 1);
        assert_eq!(m.expected_len(2, r1), Some(8));
        m.on_receive(2, r1, &v(30)).unwrap();
        assert_eq!(m.expected_len(2, r1), None, "it came early and is kept");
        assert_eq!(
            m.on_receive(2, r1, &v(30)),
            Err(CollectiveError::Duplicate { from: 2, step: r1 })
        );
        m.on_receive(1, r0, &v(2)).unwrap();
        assert_eq!(m.expected_len(1, r0), None, "taken");
        assert_eq!(
            m.on_receive(1, r0, &v(2)),
            Err(CollectiveError::Duplicate { from: 1, step: r0 })
        );
        assert_eq!(
            m.on_receive(2, r1, &v(30)),
            Err(CollectiveError::Duplicate { from: 2, step: r1 })
        );
        // None of the refusals left a trace.
        assert_eq!(m.result(), None);
        while m.poll_send().is_some() {}
        assert_eq!(m.result(), Some(v(33).as_slice()));
        let e = CollectiveError::UnexpectedStep {
            from: 3,
            step: step(EXCHANGE, 2),
        }
        .to_string();
        assert!(
            e.contains("member 3") && e.contains("0x5002") && e.contains("phase 5, round 2"),
            "{e}"
        );
        // A broadcast of another length than this member expects.
        let mut b = SoftCollective::new(Kind::Bcast { root: 0 }, Algorithm::Auto, 2, 1, vec![0; 3])
            .unwrap();
        assert_eq!(
            b.on_receive(0, step(BCAST, 0), &[1; 4]),
            Err(CollectiveError::WrongLength {
                from: 0,
                step: step(BCAST, 0),
                got: 4,
                want: 3
            })
        );
    }

    #[test]
    fn random_garbage_never_panics() {
        let mut rng = SplitMix64::new(0xF);
        for n in [1, 2, 3, 5, 8, 12] {
            let (op, ty) = (ReduceOp::Max, DataType::F64);
            let kinds = [
                (Kind::Barrier, Algorithm::Auto),
                (Kind::Bcast { root: n - 1 }, Algorithm::Auto),
                (Kind::Reduce { root: 0, op, ty }, Algorithm::Auto),
                (Kind::Allreduce { op, ty }, Algorithm::RecursiveDoubling),
                (Kind::Allreduce { op, ty }, Algorithm::Ring),
            ];
            for (kind, algo) in kinds {
                let len = if kind == Kind::Barrier { 0 } else { 3 * 8 };
                let mut m = members(kind, algo, &vec![vec![0; len]; n]);
                for _ in 0..2000 {
                    let to = rng.below(n as u64) as usize;
                    let from = rng.below(n as u64 + 2) as usize;
                    let s = (rng.below(10) as u16) << ROUND_BITS | rng.below(20) as u16;
                    let data = vec![0u8; rng.below(40) as usize];
                    let _ = m[to].on_receive(from, s, &data);
                    let _ = m[to].poll_send();
                    let _ = m[to].result();
                }
            }
        }
    }
}
