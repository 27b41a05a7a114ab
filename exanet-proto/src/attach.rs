//! The workload interface: how a process on a node's host drives that node's NI.
//!
//! # Control plane: the attach socket
//! A workload connects to the daemon's Unix socket `run/<NODE>.ni` and exchanges JSON
//! lines ([`Request`], [`Reply`]); file descriptors travel with a reply as SCM_RIGHTS
//! (never with a request, below). The connection stays open for the life of the attachment: when it closes
//! (the process exited or died) the daemon detaches the rank, frees its interfaces and
//! fails what it had posted.
//!
//! 1. `attach {version, job_key, rank}` -> `attached {rank, pdid, node, ...}` + fds (a
//!    `version` other than [`PROTOCOL_VERSION`] is refused, naming the one spoken): the shared region
//!    holding the two rings, the receiving end of the daemon -> workload doorbell
//!    (`exanet_shm::Doorbell`) and the sending end of the workload -> daemon one
//!    (`exanet_shm::Ringer`), each an end of a Unix stream socket pair. The PDID comes from the job the key names (or the rack's
//!    default job), never from the workload.
//! 2. `register {len}` -> `registered {region, va}` + one memfd: the daemon creates the
//!    memory (a sealed, fully allocated memfd), the workload maps it, and the NI may read and
//!    write it at GVAS VA `va..va+len` of this rank. The daemon never maps memory a workload
//!    made: such memory could fault under it (a hugetlbfs file whose pool runs dry, a tmpfs
//!    file that hits its size limit), and a fault in the daemon stops the whole node.
//!
//! No request carries descriptors: the daemon's socket refuses them (a `sendmsg` with
//! `SCM_RIGHTS` fails with `EPERM` in the workload, on Linux >= 6.16); on older kernels a
//! request that comes with some is refused and the descriptors closed.
//! 3. `alloc {kind}` -> `allocated {index}` for a packetizer interface, a mailbox
//!    (with its capacity; `generation` says which allocation it is) or an RDMA page;
//!    `free {kind, index}`.
//!
//! # Data plane: two rings in shared memory
//! The command ring (workload -> daemon) carries [`Command`]s, the completion ring
//! (daemon -> workload) carries [`Completion`]s; both use 128-byte slots, encoded here
//! byte by byte (all integers big-endian). Nothing read from a ring is trusted: every
//! field is checked and a bad command earns an error completion.
//!
//! # Mailbox capacity: the consumed counters
//! A mailbox of capacity N holds N unread messages: a message counts from its arrival until
//! the workload takes it, wherever it waits meanwhile (the NI's queue, the completion ring,
//! the workload's own queue); then the NI NACKs `queue_full`. The workload says what it
//! took in the ring region: at `consumed_offset` ([`Reply::Attached`]) are
//! [`crate::ni::MAILBOX_VIS`] 64-bit counters in host byte order, 8-byte aligned, one per
//! mailbox interface; the workload adds one to mailbox `vi`'s counter (atomically, with
//! release ordering) each time it takes a message of that mailbox, before handing it to
//! the program. The daemon reads a counter only when the mailbox looks full, counting from
//! its value when the mailbox was allocated, and believes no more than it handed out: a
//! workload that writes anything else there only changes what its own mailboxes accept.
//!
//! Each mailbox allocation has a generation ([`Reply::Allocated`]), carried by each of its
//! messages ([`Completion::Message`]): a message of a mailbox freed since (still in the
//! ring when it was freed) is not one of a new mailbox given the same index.

use serde::{Deserialize, Serialize};
use thiserror::Error;

use crate::gvas::{Gvas, GVAS_LEN};
use crate::model::ModelTime;
use crate::ni::{DataType, RdmaRead, RdmaWrite, ReduceOp, SendMessage};

/// Ring slot size for commands and completions.
pub const SLOT: usize = 128;
/// Bytes of message payload a slot carries.
pub const INLINE: usize = 64;
/// The versions, each what changed from the one before (workload and daemon must speak
/// the same):
/// 1: the first (doorbells are eventfds; the workload registers memory it made).
/// 2: doorbells are socket-pair ends instead of eventfds, and registered memory is made by
/// the daemon (`register` carries no descriptor, `registered` carries the memfd).
/// 3: mailbox capacity counts until the workload takes a message: the consumed counters
/// (`attached.consumed_offset`) and mailbox generations (`allocated.generation`, in each
/// message completion).
/// 4: modeled time (commands carry the workload's clock, completions the modeled time;
/// `attached.software_ps`, `attached.compute_scale_ppm`), allreduce commands and
/// `collective_counts` reports.
/// 5: doorbells are pipes (a read end and a write end) instead of socket-pair ends, so that
/// no channel between a workload and its daemon can carry descriptors. Later, within 5
/// (each side reads what the other leaves out as zero): `attached.clock_ps`.
/// 6: doorbells are ends of Unix stream socket pairs again, each shut down in the direction
/// it does not use and refusing descriptors (`SO_PASSRIGHTS`): a workload that `splice`d
/// from or into its end of a pipe held the pipe's mutex, which every call of the daemon's
/// on that pipe takes, and froze the node (`exanet_shm::doorbell`, "why a socket pair").
pub const PROTOCOL_VERSION: u32 = 6;
/// Bytes of the consumed counters: one u64 per mailbox interface.
pub const CONSUMED_LEN: usize = crate::ni::MAILBOX_VIS * 8;

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case", deny_unknown_fields)]
pub enum Request {
    Attach {
        version: u32,
        #[serde(default)]
        job_key: Option<String>,
        /// The rank to attach at (refused if taken); absent: the lowest free one.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        rank: Option<u8>,
    },
    /// Answered by [`Reply::Registered`] with the memfd of the new memory.
    Register {
        len: u64,
    },
    Unregister {
        region: u32,
    },
    Alloc {
        kind: Resource,
        #[serde(default)]
        capacity: Option<u32>,
        /// The interface wanted (mailboxes only; refused if taken); absent: the lowest
        /// free one.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        index: Option<u8>,
    },
    Free {
        kind: Resource,
        index: u8,
    },
    /// Collectives the workload's library ran since its last report, for the node's
    /// metrics (the software ones never show in the NI's counters). At most
    /// [`MAX_COLLECTIVE_REPORTS`] entries; answered by [`Reply::Ok`].
    CollectiveCounts {
        reports: Vec<CollectiveReport>,
    },
}

/// Entries one [`Request::CollectiveCounts`] may carry: one per kind and path.
pub const MAX_COLLECTIVE_REPORTS: usize = CollectiveKind::ALL.len() * CollectivePath::ALL.len();

/// Which collective (what workloads report).
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize,
)]
#[serde(rename_all = "snake_case")]
pub enum CollectiveKind {
    #[default]
    Barrier,
    Bcast,
    Reduce,
    Allreduce,
}

impl CollectiveKind {
    pub const ALL: [CollectiveKind; 4] = [
        CollectiveKind::Barrier,
        CollectiveKind::Bcast,
        CollectiveKind::Reduce,
        CollectiveKind::Allreduce,
    ];

    pub fn label(self) -> &'static str {
        match self {
            CollectiveKind::Barrier => "barrier",
            CollectiveKind::Bcast => "bcast",
            CollectiveKind::Reduce => "reduce",
            CollectiveKind::Allreduce => "allreduce",
        }
    }
}

/// Which way a collective ran: on the NI's accelerator or in the library over the NI.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize,
)]
#[serde(rename_all = "snake_case")]
pub enum CollectivePath {
    Accelerator,
    #[default]
    Software,
}

impl CollectivePath {
    pub const ALL: [CollectivePath; 2] = [CollectivePath::Accelerator, CollectivePath::Software];

    pub fn label(self) -> &'static str {
        match self {
            CollectivePath::Accelerator => "accelerator",
            CollectivePath::Software => "software",
        }
    }
}

/// How many collectives of one kind and path started, completed and failed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CollectiveReport {
    pub kind: CollectiveKind,
    pub path: CollectivePath,
    pub started: u64,
    pub completed: u64,
    pub failed: u64,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Resource {
    Packetizer,
    Mailbox,
    RdmaPage,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "result", rename_all = "snake_case")]
pub enum Reply {
    /// Sent with three fds: the ring region, the workload's end of the daemon -> workload
    /// doorbell, the workload's end of the workload -> daemon doorbell.
    Attached {
        node: String,
        node_id: u32,
        rank: u8,
        pdid: u16,
        /// Slots of the command ring, then of the completion ring.
        command_slots: u32,
        completion_slots: u32,
        /// Offsets of the two rings in the region.
        command_offset: u64,
        completion_offset: u64,
        /// Offset of the consumed counters in the region ([`CONSUMED_LEN`] bytes).
        consumed_offset: u64,
        region_len: u64,
        nodes: u32,
        /// The rack's modeled software cost per library call ([`crate::model`]),
        /// picoseconds, and how much of the time spent outside library calls counts as
        /// modeled compute, in millionths: the client library's clock follows them.
        software_ps: u64,
        compute_scale_ppm: u64,
        /// Where the process's modeled clock starts, picoseconds: the wall clock within
        /// a cycle (`ModelTime::from_wall`), so that it starts after what earlier programs
        /// did on the rack. Absent from an older daemon: zero.
        #[serde(default)]
        clock_ps: u64,
    },
    /// Sent with one fd: the memfd of the memory, `len` bytes, sealed against any change
    /// of size.
    Registered {
        region: u32,
        va: u64,
    },
    Allocated {
        index: u8,
        /// Of a mailbox: which allocation of this session it is (its messages carry it).
        #[serde(default)]
        generation: u32,
    },
    Ok,
    Error {
        message: String,
    },
}

/// What a workload asks of its NI (one command ring slot).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Command {
    /// Send a packetizer message.
    Send {
        tag: u32,
        op: SendMessage,
        /// The workload's modeled clock when it posted the command.
        at: ModelTime,
    },
    /// An RDMA write from this rank's memory.
    Write {
        tag: u32,
        op: RdmaWrite,
        at: ModelTime,
    },
    /// An RDMA read into this rank's memory.
    Read {
        tag: u32,
        op: RdmaRead,
        at: ModelTime,
    },
    /// An allreduce on the NI's accelerator.
    Allreduce {
        tag: u32,
        op: AllreducePost,
        at: ModelTime,
    },
}

/// An accelerated allreduce as a workload posts it: the vector at `src_va`, the result to
/// `dst_va`, and the members in a table at `table_va` of this rank's memory (`count`
/// entries of [`MEMBER_ENTRY`] bytes: node id u32 big-endian, rank u8, three zero
/// bytes), as the hardware takes a pointer to its {rank, network address} table.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AllreducePost {
    pub id: u32,
    pub op: ReduceOp,
    pub ty: DataType,
    pub len: u16,
    pub count: u16,
    pub src_va: u64,
    pub dst_va: u64,
    pub table_va: u64,
}

/// Bytes of one member table entry of an [`AllreducePost`].
pub const MEMBER_ENTRY: usize = 8;

impl Command {
    /// The tag the workload gave the command, echoed in its completion.
    pub fn tag(&self) -> u32 {
        match self {
            Command::Send { tag, .. }
            | Command::Write { tag, .. }
            | Command::Read { tag, .. }
            | Command::Allreduce { tag, .. } => *tag,
        }
    }

    /// The command, posted at modeled time `t`.
    pub fn posted_at(mut self, t: ModelTime) -> Command {
        match &mut self {
            Command::Send { at, .. }
            | Command::Write { at, .. }
            | Command::Read { at, .. }
            | Command::Allreduce { at, .. } => *at = t,
        }
        self
    }

    /// The modeled time the workload posted the command at.
    pub fn at(&self) -> ModelTime {
        match self {
            Command::Send { at, .. }
            | Command::Write { at, .. }
            | Command::Read { at, .. }
            | Command::Allreduce { at, .. } => *at,
        }
    }
}

/// Status codes of completions.
pub mod status {
    pub const OK: u8 = 0;
    /// NACKed by the destination; `reason` says why (see `ni::NackReason`).
    pub const NACKED: u8 = 1;
    pub const TIMED_OUT: u8 = 2;
    /// The local source memory could not be read.
    pub const LOCAL_FAULT: u8 = 3;
    /// The command itself was refused (bad index, busy channel, bad length...).
    pub const REFUSED: u8 = 4;
    /// The command slot could not be decoded.
    pub const MALFORMED: u8 = 5;
    /// Another member of the collective failed; the reason is its failure code (see
    /// `ni::allreduce::abort_label`).
    pub const ABORTED: u8 = 6;

    use crate::ni::{ChannelState, Failure};

    /// The (status, reason) of a packetizer send that reached `state`; `None` while it is
    /// not final.
    pub fn of_send(state: ChannelState) -> Option<(u8, u8)> {
        match state {
            ChannelState::Acked => Some((OK, 0)),
            ChannelState::Nacked(r) => Some((NACKED, r as u8)),
            ChannelState::TimedOut => Some((TIMED_OUT, 0)),
            ChannelState::Idle | ChannelState::Ongoing => None,
        }
    }

    /// The (status, reason) of an RDMA transfer that ended with `result`.
    pub fn of_transfer(result: Result<(), Failure>) -> (u8, u8) {
        match result {
            Ok(()) => (OK, 0),
            Err(Failure::Nacked(r)) => (NACKED, r as u8),
            Err(Failure::TimedOut) => (TIMED_OUT, 0),
            Err(Failure::LocalFault) => (LOCAL_FAULT, 0),
            Err(Failure::Detached) => (REFUSED, 0),
            Err(Failure::Aborted(code)) => (ABORTED, code),
        }
    }
}

/// Why a command was refused before anything was sent (`code` of
/// [`Completion::Refused`] with `status::REFUSED`).
pub mod refusal {
    /// The rank is outside 0..=7.
    pub const BAD_RANK: u8 = 1;
    /// The rank is not attached.
    pub const NOT_ATTACHED: u8 = 2;
    /// No such interface, page or channel.
    pub const NO_SUCH: u8 = 3;
    /// The interface or page belongs to another rank.
    pub const NOT_OWNER: u8 = 4;
    /// The channel has an operation in flight.
    pub const BUSY: u8 = 5;
    /// Nothing of that kind is free.
    pub const EXHAUSTED: u8 = 6;
    /// A message longer than 64 bytes.
    pub const TOO_LONG: u8 = 7;
    /// A transfer length of 0 or over the maximum.
    pub const BAD_LENGTH: u8 = 8;
    /// An address range outside the 39-bit VA space.
    pub const BAD_RANGE: u8 = 9;
    /// A destination node outside the rack.
    pub const BAD_DESTINATION: u8 = 10;
    /// An allreduce the accelerator cannot run (members, vector length, too many).
    pub const BAD_COLLECTIVE: u8 = 11;

    /// The refusal code of a command the NI refused with `e`.
    pub fn of(e: &crate::ni::NiError) -> u8 {
        use crate::ni::NiError;
        match e {
            NiError::BadRank(_) => BAD_RANK,
            NiError::NotAttached(_) => NOT_ATTACHED,
            NiError::NoSuch { .. } => NO_SUCH,
            NiError::NotOwner { .. } => NOT_OWNER,
            NiError::Busy { .. } => BUSY,
            NiError::Exhausted(_) => EXHAUSTED,
            NiError::TooLong(_) => TOO_LONG,
            NiError::BadLength(_) => BAD_LENGTH,
            NiError::BadRange { .. } => BAD_RANGE,
            NiError::BadDestination(_) => BAD_DESTINATION,
            NiError::Allreduce(_) => BAD_COLLECTIVE,
        }
    }

    /// A short label for a refusal code.
    pub fn label(code: u8) -> &'static str {
        match code {
            BAD_RANK => "bad rank",
            NOT_ATTACHED => "not attached",
            NO_SUCH => "no such interface, page or channel",
            NOT_OWNER => "owned by another rank",
            BUSY => "busy",
            EXHAUSTED => "none free",
            TOO_LONG => "message too long",
            BAD_LENGTH => "bad length",
            BAD_RANGE => "address range out of the VA space",
            BAD_DESTINATION => "destination not in the rack",
            BAD_COLLECTIVE => "not a collective the accelerator runs",
            _ => "unknown refusal",
        }
    }
}

/// What the NI tells a workload (one completion ring slot).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Completion {
    /// A `Send` ended: ACKed (`status::OK`), NACKed or timed out.
    Sent {
        tag: u32,
        vi: u8,
        ch: u8,
        status: u8,
        reason: u8,
        /// When, in modeled time (every completion carries one).
        at: ModelTime,
    },
    /// An RDMA write or read ended.
    Rdma {
        tag: u32,
        page: u8,
        ch: u8,
        read: bool,
        status: u8,
        reason: u8,
        at: ModelTime,
    },
    /// A command was refused before anything was sent.
    Refused {
        tag: u32,
        status: u8,
        code: u8,
        at: ModelTime,
    },
    /// A message arrived in mailbox `vi`, allocation `generation`.
    Message {
        vi: u8,
        generation: u32,
        src_node: u32,
        src_rank: u8,
        payload: Vec<u8>,
        at: ModelTime,
    },
    /// An accelerated allreduce ended (its result is at its `dst_va` when `status` is OK).
    Collective {
        tag: u32,
        status: u8,
        reason: u8,
        at: ModelTime,
    },
    /// A completion notification was written at `va` of this rank.
    Notified {
        va: u64,
        src_node: u32,
        len: u64,
        at: ModelTime,
    },
}

impl Completion {
    /// When the completion happened, in modeled time.
    pub fn at(&self) -> ModelTime {
        match self {
            Completion::Sent { at, .. }
            | Completion::Rdma { at, .. }
            | Completion::Refused { at, .. }
            | Completion::Message { at, .. }
            | Completion::Collective { at, .. }
            | Completion::Notified { at, .. } => *at,
        }
    }
}

#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum SlotError {
    #[error("slot of {0} B, expected {SLOT}")]
    Size(usize),
    #[error("unknown opcode {0:#04x}")]
    Opcode(u8),
    #[error("inline payload of {0} B exceeds {INLINE}")]
    Inline(usize),
    #[error("unknown {what} {value}")]
    Field { what: &'static str, value: u8 },
}

const OP_SEND: u8 = 1;
const OP_WRITE: u8 = 2;
const OP_READ: u8 = 3;
const OP_ALLREDUCE: u8 = 4;
const EV_SENT: u8 = 0x81;
const EV_RDMA: u8 = 0x82;
const EV_REFUSED: u8 = 0x83;
const EV_MESSAGE: u8 = 0x84;
const EV_NOTIFIED: u8 = 0x85;
const EV_COLLECTIVE: u8 = 0x86;

fn put_u16(b: &mut [u8], at: usize, v: u16) {
    b[at..at + 2].copy_from_slice(&v.to_be_bytes());
}
fn put_u32(b: &mut [u8], at: usize, v: u32) {
    b[at..at + 4].copy_from_slice(&v.to_be_bytes());
}
fn put_u64(b: &mut [u8], at: usize, v: u64) {
    b[at..at + 8].copy_from_slice(&v.to_be_bytes());
}
fn put_gvas(b: &mut [u8], at: usize, g: &Gvas) {
    b[at..at + GVAS_LEN].copy_from_slice(&g.to_bytes());
}
fn put_inline(b: &mut [u8], len_at: usize, at: usize, payload: &[u8]) {
    let n = payload.len().min(INLINE);
    put_u16(b, len_at, n as u16);
    b[at..at + n].copy_from_slice(&payload[..n]);
}
fn get_u16(b: &[u8], at: usize) -> u16 {
    u16::from_be_bytes([b[at], b[at + 1]])
}
fn get_u32(b: &[u8], at: usize) -> u32 {
    u32::from_be_bytes(b[at..at + 4].try_into().expect("4 bytes"))
}
fn get_u64(b: &[u8], at: usize) -> u64 {
    u64::from_be_bytes(b[at..at + 8].try_into().expect("8 bytes"))
}
fn get_gvas(b: &[u8], at: usize) -> Gvas {
    Gvas::from_bytes(b[at..at + GVAS_LEN].try_into().expect("10 bytes"))
}
/// An inline payload whose length is at `len_at`, or its length when over [`INLINE`].
fn get_inline(b: &[u8], len_at: usize, at: usize) -> Result<Vec<u8>, usize> {
    let n = usize::from(get_u16(b, len_at));
    if n > INLINE {
        return Err(n);
    }
    Ok(b[at..at + n].to_vec())
}

/// Where each field of a command slot starts (the table on [`Command::encode`]); one
/// name per place, so that encoder and decoder cannot disagree.
mod cmd {
    pub const OPCODE: usize = 0;
    /// The send's VI, the write's or read's page; the allreduce's operation.
    pub const UNIT: usize = 1;
    /// The channel; the allreduce's data type.
    pub const CHANNEL: usize = 2;
    pub const FLAGS: usize = 3;
    /// Bit of [`FLAGS`]: a notify VA is present (write).
    pub const NOTIFY_PRESENT: u8 = 1;
    pub const TAG: usize = 4;
    /// The destination (send, write) or source (read).
    pub const GVAS: usize = 8;
    pub const INLINE_LEN: usize = 18;
    /// The write's source VA, the read's destination VA, the allreduce's source.
    pub const VA: usize = 24;
    /// The write's or read's length; the allreduce's result VA.
    pub const LEN: usize = 32;
    /// The write's notify VA; the allreduce's member table VA.
    pub const NOTIFY_VA: usize = 40;
    pub const CLOCK: usize = 48;
    pub const PAYLOAD: usize = 64;
    /// The allreduce's own fields.
    pub const COLLECTIVE_ID: usize = 8;
    pub const VECTOR_LEN: usize = 12;
    pub const MEMBERS: usize = 14;
}

/// Where each field of a completion slot starts (the table on [`Completion::encode`]).
mod ev {
    pub const KIND: usize = 0;
    /// The VI or page.
    pub const UNIT: usize = 1;
    pub const CHANNEL: usize = 2;
    pub const STATUS: usize = 3;
    /// The tag, or the mailbox generation (message).
    pub const TAG: usize = 4;
    /// The NACK reason (sent, rdma, collective) or refusal code (refused).
    pub const REASON: usize = 8;
    pub const RDMA_FLAGS: usize = 9;
    /// Bit of [`RDMA_FLAGS`]: the operation was a read.
    pub const READ: u8 = 1;
    pub const SRC_NODE: usize = 12;
    pub const SRC_RANK: usize = 16;
    pub const INLINE_LEN: usize = 18;
    pub const VA: usize = 24;
    pub const LEN: usize = 32;
    pub const TIME: usize = 40;
    pub const PAYLOAD: usize = 64;
}

/// Command slot layout:
///
/// | bytes | field |
/// |---|---|
/// | 0 | opcode: 1 send, 2 write, 3 read |
/// | 1 | vi (send) or page (write, read) |
/// | 2 | channel |
/// | 3 | flags: bit 0 = notify present (write) |
/// | 4..8 | tag, echoed in the completion |
/// | 8..18 | GVAS: destination (send, write) or source (read); its PDID is ignored |
/// | 18..20 | inline payload length (send) |
/// | 24..32 | source VA (write) or destination VA (read) |
/// | 32..40 | length (write, read) |
/// | 40..48 | notify VA (write) |
/// | 48..56 | the workload's modeled clock, picoseconds |
/// | 64..128 | inline payload (send) |
///
/// An allreduce (opcode 4): 1 operation, 2 type, 4..8 tag, 8..12 collective id, 12..14
/// vector length, 14..16 member count, 24..32 source VA, 32..40 result VA, 40..48 member
/// table VA, 48..56 clock.
impl Command {
    pub fn encode(&self) -> [u8; SLOT] {
        let mut b = [0u8; SLOT];
        let (tag, at) = match self {
            Command::Send { tag, at, .. }
            | Command::Write { tag, at, .. }
            | Command::Read { tag, at, .. }
            | Command::Allreduce { tag, at, .. } => (*tag, *at),
        };
        put_u32(&mut b, cmd::TAG, tag);
        put_u64(&mut b, cmd::CLOCK, at.0);
        match self {
            Command::Send {
                op:
                    SendMessage {
                        vi,
                        ch,
                        dst,
                        payload,
                    },
                ..
            } => {
                b[cmd::OPCODE] = OP_SEND;
                b[cmd::UNIT] = *vi;
                b[cmd::CHANNEL] = *ch;
                put_gvas(&mut b, cmd::GVAS, dst);
                put_inline(&mut b, cmd::INLINE_LEN, cmd::PAYLOAD, payload);
            }
            Command::Write {
                op:
                    RdmaWrite {
                        page,
                        ch,
                        src_va,
                        dst,
                        len,
                        notify,
                    },
                ..
            } => {
                b[cmd::OPCODE] = OP_WRITE;
                b[cmd::UNIT] = *page;
                b[cmd::CHANNEL] = *ch;
                if notify.is_some() {
                    b[cmd::FLAGS] |= cmd::NOTIFY_PRESENT;
                }
                put_gvas(&mut b, cmd::GVAS, dst);
                put_u64(&mut b, cmd::VA, *src_va);
                put_u64(&mut b, cmd::LEN, *len);
                put_u64(&mut b, cmd::NOTIFY_VA, notify.unwrap_or(0));
            }
            Command::Read {
                op:
                    RdmaRead {
                        page,
                        ch,
                        src,
                        dst_va,
                        len,
                    },
                ..
            } => {
                b[cmd::OPCODE] = OP_READ;
                b[cmd::UNIT] = *page;
                b[cmd::CHANNEL] = *ch;
                put_gvas(&mut b, cmd::GVAS, src);
                put_u64(&mut b, cmd::VA, *dst_va);
                put_u64(&mut b, cmd::LEN, *len);
            }
            Command::Allreduce { op, .. } => {
                b[cmd::OPCODE] = OP_ALLREDUCE;
                b[cmd::UNIT] = op.op as u8;
                b[cmd::CHANNEL] = op.ty as u8;
                put_u32(&mut b, cmd::COLLECTIVE_ID, op.id);
                put_u16(&mut b, cmd::VECTOR_LEN, op.len);
                put_u16(&mut b, cmd::MEMBERS, op.count);
                put_u64(&mut b, cmd::VA, op.src_va);
                put_u64(&mut b, cmd::LEN, op.dst_va);
                put_u64(&mut b, cmd::NOTIFY_VA, op.table_va);
            }
        }
        b
    }

    /// Decodes a slot; the tag is returned with the error when it could be read.
    pub fn decode(b: &[u8]) -> Result<Command, (u32, SlotError)> {
        if b.len() != SLOT {
            return Err((0, SlotError::Size(b.len())));
        }
        let tag = get_u32(b, cmd::TAG);
        let at = ModelTime(get_u64(b, cmd::CLOCK));
        let (unit, ch) = (b[cmd::UNIT], b[cmd::CHANNEL]);
        match b[cmd::OPCODE] {
            OP_SEND => Ok(Command::Send {
                tag,
                op: SendMessage {
                    vi: unit,
                    ch,
                    dst: get_gvas(b, cmd::GVAS),
                    payload: get_inline(b, cmd::INLINE_LEN, cmd::PAYLOAD)
                        .map_err(|n| (tag, SlotError::Inline(n)))?,
                },
                at,
            }),
            OP_WRITE => Ok(Command::Write {
                tag,
                op: RdmaWrite {
                    page: unit,
                    ch,
                    src_va: get_u64(b, cmd::VA),
                    dst: get_gvas(b, cmd::GVAS),
                    len: get_u64(b, cmd::LEN),
                    notify: (b[cmd::FLAGS] & cmd::NOTIFY_PRESENT != 0)
                        .then(|| get_u64(b, cmd::NOTIFY_VA)),
                },
                at,
            }),
            OP_READ => Ok(Command::Read {
                tag,
                op: RdmaRead {
                    page: unit,
                    ch,
                    src: get_gvas(b, cmd::GVAS),
                    dst_va: get_u64(b, cmd::VA),
                    len: get_u64(b, cmd::LEN),
                },
                at,
            }),
            OP_ALLREDUCE => {
                let op = ReduceOp::from_u8(unit).ok_or((
                    tag,
                    SlotError::Field {
                        what: "reduce operation",
                        value: unit,
                    },
                ))?;
                let ty = DataType::from_u8(ch).ok_or((
                    tag,
                    SlotError::Field {
                        what: "data type",
                        value: ch,
                    },
                ))?;
                Ok(Command::Allreduce {
                    tag,
                    op: AllreducePost {
                        id: get_u32(b, cmd::COLLECTIVE_ID),
                        op,
                        ty,
                        len: get_u16(b, cmd::VECTOR_LEN),
                        count: get_u16(b, cmd::MEMBERS),
                        src_va: get_u64(b, cmd::VA),
                        dst_va: get_u64(b, cmd::LEN),
                        table_va: get_u64(b, cmd::NOTIFY_VA),
                    },
                    at,
                })
            }
            op => Err((tag, SlotError::Opcode(op))),
        }
    }
}

/// Completion slot layout:
///
/// | bytes | field |
/// |---|---|
/// | 0 | kind: 0x81 sent, 0x82 rdma, 0x83 refused, 0x84 message, 0x85 notified, 0x86 collective |
/// | 1 | vi / page |
/// | 2 | channel |
/// | 3 | status ([`status`]) |
/// | 4..8 | tag (sent, rdma, refused, collective) or mailbox generation (message) |
/// | 8 | NACK reason (sent, rdma, collective) or refusal code (refused) |
/// | 9 | bit 0: read (rdma) |
/// | 12..16 | source node (message, notified) |
/// | 16 | source rank (message) |
/// | 18..20 | payload length (message) |
/// | 24..32 | VA (notified) |
/// | 32..40 | length (notified) |
/// | 40..48 | modeled time, picoseconds |
/// | 64..128 | payload (message) |
impl Completion {
    pub fn encode(&self) -> [u8; SLOT] {
        let mut b = [0u8; SLOT];
        put_u64(&mut b, ev::TIME, self.at().0);
        match self {
            Completion::Sent {
                tag,
                vi,
                ch,
                status,
                reason,
                ..
            } => {
                b[ev::KIND] = EV_SENT;
                b[ev::UNIT] = *vi;
                b[ev::CHANNEL] = *ch;
                b[ev::STATUS] = *status;
                put_u32(&mut b, ev::TAG, *tag);
                b[ev::REASON] = *reason;
            }
            Completion::Rdma {
                tag,
                page,
                ch,
                read,
                status,
                reason,
                ..
            } => {
                b[ev::KIND] = EV_RDMA;
                b[ev::UNIT] = *page;
                b[ev::CHANNEL] = *ch;
                b[ev::STATUS] = *status;
                put_u32(&mut b, ev::TAG, *tag);
                b[ev::REASON] = *reason;
                if *read {
                    b[ev::RDMA_FLAGS] |= ev::READ;
                }
            }
            Completion::Refused {
                tag, status, code, ..
            } => {
                b[ev::KIND] = EV_REFUSED;
                b[ev::STATUS] = *status;
                put_u32(&mut b, ev::TAG, *tag);
                b[ev::REASON] = *code;
            }
            Completion::Message {
                vi,
                generation,
                src_node,
                src_rank,
                payload,
                ..
            } => {
                b[ev::KIND] = EV_MESSAGE;
                b[ev::UNIT] = *vi;
                put_u32(&mut b, ev::TAG, *generation);
                put_u32(&mut b, ev::SRC_NODE, *src_node);
                b[ev::SRC_RANK] = *src_rank;
                put_inline(&mut b, ev::INLINE_LEN, ev::PAYLOAD, payload);
            }
            Completion::Collective {
                tag,
                status,
                reason,
                ..
            } => {
                b[ev::KIND] = EV_COLLECTIVE;
                b[ev::STATUS] = *status;
                put_u32(&mut b, ev::TAG, *tag);
                b[ev::REASON] = *reason;
            }
            Completion::Notified {
                va, src_node, len, ..
            } => {
                b[ev::KIND] = EV_NOTIFIED;
                put_u32(&mut b, ev::SRC_NODE, *src_node);
                put_u64(&mut b, ev::VA, *va);
                put_u64(&mut b, ev::LEN, *len);
            }
        }
        b
    }

    pub fn decode(b: &[u8]) -> Result<Completion, SlotError> {
        if b.len() != SLOT {
            return Err(SlotError::Size(b.len()));
        }
        let at = ModelTime(get_u64(b, ev::TIME));
        let tag = get_u32(b, ev::TAG);
        Ok(match b[ev::KIND] {
            EV_SENT => Completion::Sent {
                tag,
                vi: b[ev::UNIT],
                ch: b[ev::CHANNEL],
                status: b[ev::STATUS],
                reason: b[ev::REASON],
                at,
            },
            EV_RDMA => Completion::Rdma {
                tag,
                page: b[ev::UNIT],
                ch: b[ev::CHANNEL],
                read: b[ev::RDMA_FLAGS] & ev::READ != 0,
                status: b[ev::STATUS],
                reason: b[ev::REASON],
                at,
            },
            EV_REFUSED => Completion::Refused {
                tag,
                status: b[ev::STATUS],
                code: b[ev::REASON],
                at,
            },
            EV_MESSAGE => Completion::Message {
                vi: b[ev::UNIT],
                generation: tag,
                src_node: get_u32(b, ev::SRC_NODE),
                src_rank: b[ev::SRC_RANK],
                payload: get_inline(b, ev::INLINE_LEN, ev::PAYLOAD).map_err(SlotError::Inline)?,
                at,
            },
            EV_COLLECTIVE => Completion::Collective {
                tag,
                status: b[ev::STATUS],
                reason: b[ev::REASON],
                at,
            },
            EV_NOTIFIED => Completion::Notified {
                src_node: get_u32(b, ev::SRC_NODE),
                va: get_u64(b, ev::VA),
                len: get_u64(b, ev::LEN),
                at,
            },
            k => return Err(SlotError::Opcode(k)),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ni_outcomes_map_to_distinct_codes_with_labels() {
        use crate::ni::{ChannelState, Failure, NackReason, NiError};
        use crate::NodeId;
        let errors = [
            NiError::BadRank(9),
            NiError::NotAttached(1),
            NiError::NoSuch {
                what: "page",
                index: 1,
            },
            NiError::NotOwner {
                what: "page",
                index: 1,
            },
            NiError::Busy {
                what: "channel",
                index: 1,
            },
            NiError::Exhausted("mailbox"),
            NiError::TooLong(65),
            NiError::BadLength(0),
            NiError::BadRange { va: 1, len: 1 },
            NiError::BadDestination(NodeId(999)),
        ];
        let codes: std::collections::BTreeSet<u8> = errors.iter().map(refusal::of).collect();
        assert_eq!(codes.len(), errors.len(), "refusal codes must be distinct");
        assert!(codes
            .iter()
            .all(|c| refusal::label(*c) != "unknown refusal"));
        assert_eq!(status::of_send(ChannelState::Ongoing), None);
        assert_eq!(status::of_send(ChannelState::Acked), Some((status::OK, 0)));
        assert_eq!(
            status::of_send(ChannelState::Nacked(NackReason::Crc)),
            Some((status::NACKED, NackReason::Crc as u8))
        );
        assert_eq!(status::of_transfer(Ok(())), (status::OK, 0));
        assert_eq!(
            status::of_transfer(Err(Failure::TimedOut)),
            (status::TIMED_OUT, 0)
        );
        assert_eq!(
            status::of_transfer(Err(Failure::LocalFault)),
            (status::LOCAL_FAULT, 0)
        );
    }
    use crate::gvas::Pdid;
    use crate::shape::NodeId;

    /// One command of each kind, with fields at their extremes.
    fn sample_commands() -> Vec<Command> {
        let g = Gvas::new(Pdid(3), NodeId(9), 2, 0x1234).unwrap();
        vec![
            Command::Send {
                tag: 7,
                op: SendMessage {
                    vi: 1,
                    ch: 3,
                    dst: g,
                    payload: b"hello".to_vec(),
                },
                at: ModelTime(1),
            },
            Command::Write {
                tag: 8,
                op: RdmaWrite {
                    page: 2,
                    ch: 31,
                    src_va: 0x1000,
                    dst: g,
                    len: 1 << 22,
                    notify: Some(0x40),
                },
                at: ModelTime(u64::MAX),
            },
            Command::Read {
                tag: 9,
                op: RdmaRead {
                    page: 15,
                    ch: 0,
                    src: g,
                    dst_va: 0x2000,
                    len: 5,
                },
                at: ModelTime(123_456_789),
            },
            Command::Allreduce {
                tag: 10,
                op: AllreducePost {
                    id: 0xABCD_0001,
                    op: ReduceOp::Max,
                    ty: DataType::F64,
                    len: 256,
                    count: 1024,
                    src_va: 0x10,
                    dst_va: 0x20,
                    table_va: 0x30,
                },
                at: ModelTime(77),
            },
        ]
    }

    /// One completion of each kind.
    fn sample_completions() -> Vec<Completion> {
        vec![
            Completion::Sent {
                tag: 1,
                vi: 2,
                ch: 3,
                status: status::NACKED,
                reason: 6,
                at: ModelTime(1),
            },
            Completion::Rdma {
                tag: 2,
                page: 1,
                ch: 4,
                read: true,
                status: status::OK,
                reason: 0,
                at: ModelTime(2),
            },
            Completion::Refused {
                tag: 3,
                status: status::REFUSED,
                code: 2,
                at: ModelTime(3),
            },
            Completion::Message {
                vi: 5,
                generation: 0xDEAD_BEEF,
                src_node: 77,
                src_rank: 1,
                payload: vec![1; 64],
                at: ModelTime(4),
            },
            Completion::Notified {
                va: 0x99,
                src_node: 3,
                len: 4096,
                at: ModelTime(u64::MAX),
            },
            Completion::Collective {
                tag: 5,
                status: status::ABORTED,
                reason: 0x11,
                at: ModelTime(9),
            },
        ]
    }

    #[test]
    fn commands_and_completions_round_trip() {
        for c in sample_commands() {
            assert_eq!(Command::decode(&c.encode()), Ok(c));
        }
        for e in sample_completions() {
            assert_eq!(Completion::decode(&e.encode()), Ok(e));
        }
    }

    /// crc32 of the samples' slots, as encoded by attach protocol 6.
    const GOLDEN: u32 = 300_919_853;

    /// The slots' bytes are an interface between a workload's library and its daemon:
    /// the fields sit where the layout tables say (the tag, the clock), and every byte of
    /// the samples is pinned by a checksum, so that a change of layout shows here and
    /// goes with a new attach protocol version.
    #[test]
    fn the_slot_layout_is_the_published_one() {
        for c in sample_commands() {
            let b = c.encode();
            let (tag, at) = match &c {
                Command::Send { tag, at, .. }
                | Command::Write { tag, at, .. }
                | Command::Read { tag, at, .. }
                | Command::Allreduce { tag, at, .. } => (*tag, *at),
            };
            assert_eq!(b[4..8], tag.to_be_bytes(), "{c:?}");
            assert_eq!(b[48..56], at.0.to_be_bytes(), "{c:?}");
        }
        for e in sample_completions() {
            assert_eq!(e.encode()[40..48], e.at().0.to_be_bytes(), "{e:?}");
        }
        let mut all = Vec::new();
        for c in sample_commands() {
            all.extend_from_slice(&c.encode());
        }
        for e in sample_completions() {
            all.extend_from_slice(&e.encode());
        }
        assert_eq!(crc32fast::hash(&all), GOLDEN, "the slot layout changed");
    }

    #[test]
    fn garbage_slots_are_refused_not_trusted() {
        let mut b = [0u8; SLOT];
        b[0] = 0x77;
        b[4..8].copy_from_slice(&5u32.to_be_bytes());
        assert_eq!(Command::decode(&b), Err((5, SlotError::Opcode(0x77))));
        b[0] = OP_SEND;
        b[18] = 0xFF;
        assert!(matches!(
            Command::decode(&b),
            Err((5, SlotError::Inline(_)))
        ));
        assert!(Command::decode(&b[..10]).is_err());
    }
}
