//! Errors: [`Error`] for everything the library can fail at, [`OpError`] for how a posted
//! operation (a send, an RDMA write or read) ended when it did not succeed, and the integer
//! codes the C ABI returns ([`Error::code`], [`codes`]).

use std::io;
use std::path::PathBuf;

use exanet_proto::attach::status;
use exanet_proto::ni::NackReason;
use thiserror::Error;

/// How a posted operation ended, when it did not succeed (from its completion's `status`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Error)]
pub enum OpError {
    /// The destination refused it (or kept refusing it until the retries ran out).
    /// `reason` is `None` when the daemon sent a code this library does not know.
    #[error("NACKed by the destination: {}", nack_label(*.reason, *.code))]
    Nacked {
        reason: Option<NackReason>,
        /// The raw NACK code.
        code: u8,
    },
    /// No answer from the destination after the allowed attempts.
    #[error("timed out in the network (no answer from the destination)")]
    TimedOut,
    /// The local source memory could not be read (not registered, or gone).
    #[error("local fault: the source memory could not be read")]
    LocalFault,
    /// The daemon refused the command before anything was sent (bad index, busy channel,
    /// bad length, address outside registered memory...).
    #[error("refused by the NI: {} (code {code})", exanet_proto::attach::refusal::label(*.code))]
    Refused { code: u8 },
    /// The daemon could not decode the command slot (a library/daemon mismatch).
    #[error("command slot rejected as malformed (code {code})")]
    Malformed { code: u8 },
    /// Another member of the collective failed, and so it failed everywhere; `code` says
    /// how the first member failed.
    #[error("collective aborted: {}", exanet_proto::ni::allreduce::abort_label(*.code))]
    Aborted { code: u8 },
    /// A status code this library does not know.
    #[error("unknown completion status {status} (reason {reason})")]
    Unknown { status: u8, reason: u8 },
}

/// The channels of an interface with `count` of them, as `exanet.h` writes ranges: "0..3".
fn channel_range(count: u8) -> String {
    match count.checked_sub(1) {
        Some(last) => format!("0..{last}"),
        None => "it has none".to_string(),
    }
}

fn nack_label(reason: Option<NackReason>, code: u8) -> String {
    match reason {
        Some(r) => r.label().to_string(),
        None => format!("unknown reason {code}"),
    }
}

impl OpError {
    /// Maps a completion's `status` and `reason` to `Ok(())` or the failure.
    pub fn from_status(st: u8, reason: u8) -> Result<(), OpError> {
        match st {
            status::OK => Ok(()),
            status::NACKED => Err(OpError::Nacked {
                reason: NackReason::from_u8(reason),
                code: reason,
            }),
            status::TIMED_OUT => Err(OpError::TimedOut),
            status::LOCAL_FAULT => Err(OpError::LocalFault),
            status::REFUSED => Err(OpError::Refused { code: reason }),
            status::MALFORMED => Err(OpError::Malformed { code: reason }),
            status::ABORTED => Err(OpError::Aborted { code: reason }),
            _ => Err(OpError::Unknown { status: st, reason }),
        }
    }

    /// Whether trying again may succeed (a transient NACK, or a network timeout).
    pub fn transient(&self) -> bool {
        match self {
            OpError::Nacked {
                reason: Some(r), ..
            } => r.transient(),
            OpError::TimedOut => true,
            _ => false,
        }
    }
}

/// Everything that can go wrong in this library.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum Error {
    /// A collective that cannot be run as asked (a group that is not one, a path the
    /// group or vector does not allow, a peer that sent what the algorithm cannot take).
    #[error("collective: {0}")]
    Collective(String),
    /// A software collective ran out of time: the round it was in (0-based; the message
    /// counts from 1), the member whose message it waited for (None: it waited for the
    /// answers to what it sent, or for its rendezvous writes), and how many of its
    /// messages were not answered yet.
    #[error(
        "collective timed out after {waited_ms} ms in round {} of {rounds}: {}",
        .round + 1,
        waiting_for(*.awaiting, *.unanswered)
    )]
    CollectiveTimeout {
        waited_ms: u64,
        round: usize,
        rounds: usize,
        awaiting: Option<usize>,
        unanswered: usize,
    },
    /// Another member of a software collective gave it up (and told this one).
    #[error("collective aborted: member {member} failed: {reason}")]
    CollectiveAborted { member: usize, reason: String },
    /// No node was given and `EXANET_NODE` is not set.
    #[error(
        "no node given: pass one or set EXANET_NODE (e.g. EXANET_NODE=M1QAF1), or run on a \
         node (`exactl exec NODE -- ...`)"
    )]
    NoNode,
    /// A node name that is not `M<blade>Q<slot>F<fpga>`, or not in this rack.
    #[error("unknown node {name:?}: {reason}")]
    UnknownNode { name: String, reason: String },
    /// A node id outside the rack.
    #[error("node id {id} is not in this rack of {nodes} nodes")]
    BadNode { id: u32, nodes: u32 },
    /// A rank outside 0..=7.
    #[error("rank {0} is outside 0..=7")]
    BadRank(u8),
    /// An address whose PDID is not this workload's: the NI stamps the workload's own PDID
    /// on everything it sends, so such an address is a mistake.
    #[error("address carries PDID {pdid}, but this workload's PDID is {own}")]
    ForeignPdid { pdid: u16, own: u16 },
    /// A VA that does not fit the GVAS's 39 bits, or some other malformed address.
    #[error("bad address: {0}")]
    BadAddress(String),
    /// The rack file could not be read or parsed (node names cannot be resolved).
    #[error("rack file {path}: {message}")]
    RackFile { path: PathBuf, message: String },
    /// Connecting to the daemon's attach socket failed.
    #[error("cannot reach the daemon at {path}: {source} (is the rack up and the node right?)")]
    Unreachable {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    /// The daemon refused to attach this workload (e.g. an unknown job key, no rank free).
    #[error("the daemon refused to attach: {0}")]
    AttachRefused(String),
    /// The daemon answered a control request with an error (no interface free, bad length...).
    #[error("the daemon refused {op}: {message}")]
    Daemon { op: &'static str, message: String },
    /// The daemon said something that does not follow the attach protocol.
    #[error("attach protocol error: {0}")]
    Protocol(String),
    /// The daemon did not answer a control request in time.
    #[error("the daemon did not answer {op} within {secs} s")]
    ControlTimeout { op: &'static str, secs: u64 },
    /// The daemon closed the connection (it stopped, or detached this workload).
    #[error("the daemon closed the connection (it stopped or detached this workload)")]
    Disconnected,
    /// The shared memory the daemon hands out is inconsistent (a corrupt ring, a slot that
    /// does not decode). The endpoint is unusable afterwards ([`Error::Broken`]).
    #[error("shared memory corrupt: {0}")]
    Corrupt(String),
    /// An earlier fatal error made this endpoint unusable.
    #[error("endpoint unusable after an earlier error: {0}")]
    Broken(String),
    /// Creating or accessing shared memory failed.
    #[error("shared memory: {0}")]
    Shm(#[from] exanet_shm::RegionError),
    /// A system call failed.
    #[error("{op}: {source}")]
    Io {
        op: &'static str,
        #[source]
        source: io::Error,
    },
    /// A wait ran out of time (nothing failed: the operation may still complete).
    #[error("timed out waiting")]
    Timeout,
    /// A posted operation failed.
    #[error("operation {tag} failed: {error}")]
    Op { tag: u32, error: OpError },
    /// The channel still has an operation in flight: wait for it first.
    #[error("{what} {index} channel {ch} is busy (operation {tag} in flight)")]
    ChannelBusy {
        what: &'static str,
        index: u8,
        ch: u8,
        tag: u32,
    },
    /// A channel number outside the interface's channels (`count` of them: 0..=count-1).
    #[error("channel {ch} does not exist ({})", channel_range(*.count))]
    BadChannel { ch: u8, count: u8 },
    /// A packetizer payload longer than 64 bytes.
    #[error("payload of {len} B exceeds the {max} B a packetizer message carries")]
    PayloadTooLong { len: usize, max: usize },
    /// An access outside a memory region.
    #[error("{len} B at offset {offset} do not fit the {region_len} B region")]
    OutOfBounds {
        offset: u64,
        len: u64,
        region_len: u64,
    },
    /// A length that is not allowed (zero, or more than the NI handles).
    #[error("bad length {len}: {why}")]
    BadLength { len: u64, why: &'static str },
    /// A memory region of another endpoint.
    #[error("the memory region belongs to another endpoint")]
    ForeignRegion,
    /// A tag this endpoint does not know (never posted, or already waited for).
    #[error("unknown tag {0} (never posted, or its completion was already collected)")]
    UnknownTag(u32),
    /// A setting (environment variable) with a bad value.
    #[error("bad setting {name}={value:?}: {why}")]
    BadSetting {
        name: &'static str,
        value: String,
        why: &'static str,
    },
}

/// The integer error codes of the C ABI (`EXANET_E*` in `exanet.h`); 0 is success.
pub mod codes {
    pub const OK: i32 = 0;
    pub const INVALID_ARGUMENT: i32 = -1;
    pub const NO_NODE: i32 = -2;
    pub const UNKNOWN_NODE: i32 = -3;
    pub const BAD_RANK: i32 = -4;
    pub const FOREIGN_PDID: i32 = -5;
    pub const BAD_ADDRESS: i32 = -6;
    pub const RACK_FILE: i32 = -7;
    pub const UNREACHABLE: i32 = -8;
    pub const ATTACH_REFUSED: i32 = -9;
    pub const DAEMON: i32 = -10;
    pub const PROTOCOL: i32 = -11;
    pub const DISCONNECTED: i32 = -12;
    pub const CORRUPT: i32 = -13;
    pub const SYSTEM: i32 = -14;
    pub const TIMEOUT: i32 = -15;
    pub const NACKED: i32 = -16;
    pub const NET_TIMEOUT: i32 = -17;
    pub const LOCAL_FAULT: i32 = -18;
    pub const OP_REFUSED: i32 = -19;
    pub const BUSY: i32 = -20;
    pub const BAD_CHANNEL: i32 = -21;
    pub const TOO_LONG: i32 = -22;
    pub const OUT_OF_BOUNDS: i32 = -23;
    pub const BAD_LENGTH: i32 = -24;
    pub const UNKNOWN_TAG: i32 = -25;
    pub const INTERNAL: i32 = -26;
    pub const ABORTED: i32 = -27;

    /// Every code, for tables and tests.
    pub const ALL: [i32; 28] = [
        OK,
        INVALID_ARGUMENT,
        NO_NODE,
        UNKNOWN_NODE,
        BAD_RANK,
        FOREIGN_PDID,
        BAD_ADDRESS,
        RACK_FILE,
        UNREACHABLE,
        ATTACH_REFUSED,
        DAEMON,
        PROTOCOL,
        DISCONNECTED,
        CORRUPT,
        SYSTEM,
        TIMEOUT,
        NACKED,
        NET_TIMEOUT,
        LOCAL_FAULT,
        OP_REFUSED,
        BUSY,
        BAD_CHANNEL,
        TOO_LONG,
        OUT_OF_BOUNDS,
        BAD_LENGTH,
        UNKNOWN_TAG,
        INTERNAL,
        ABORTED,
    ];

    /// A short description of a code (what `exanet_strerror` returns).
    pub fn describe(code: i32) -> &'static str {
        match code {
            OK => "success",
            INVALID_ARGUMENT => "invalid argument (null pointer, bad string, bad value)",
            NO_NODE => "no node given and EXANET_NODE not set",
            UNKNOWN_NODE => "unknown node",
            BAD_RANK => "rank outside 0..7",
            FOREIGN_PDID => "address carries another PDID than the workload's",
            BAD_ADDRESS => "bad address",
            RACK_FILE => "rack file unreadable",
            UNREACHABLE => "daemon unreachable",
            ATTACH_REFUSED => "the daemon refused to attach (unknown job key?)",
            DAEMON => "the daemon refused the request",
            PROTOCOL => "attach protocol error",
            DISCONNECTED => "the daemon closed the connection",
            CORRUPT => "shared memory corrupt",
            SYSTEM => "system error",
            TIMEOUT => "timed out waiting",
            NACKED => "NACKed by the destination",
            NET_TIMEOUT => "operation timed out in the network",
            LOCAL_FAULT => "local fault (source memory unreadable)",
            OP_REFUSED => "operation refused by the NI",
            BUSY => "channel busy",
            BAD_CHANNEL => "no such channel",
            TOO_LONG => "payload too long (64 bytes at most)",
            OUT_OF_BOUNDS => "access outside the memory region",
            BAD_LENGTH => "bad length",
            UNKNOWN_TAG => "unknown tag",
            INTERNAL => "internal error",
            ABORTED => "collective aborted (another member failed)",
            _ => "unknown error code",
        }
    }
}

impl Error {
    /// The C ABI code of this error (see [`codes`]).
    pub fn code(&self) -> i32 {
        use codes::*;
        match self {
            Error::NoNode => NO_NODE,
            Error::UnknownNode { .. } | Error::BadNode { .. } => UNKNOWN_NODE,
            Error::BadRank(_) => BAD_RANK,
            Error::ForeignPdid { .. } => FOREIGN_PDID,
            Error::BadAddress(_) => BAD_ADDRESS,
            Error::RackFile { .. } => RACK_FILE,
            Error::Unreachable { .. } => UNREACHABLE,
            Error::AttachRefused(_) => ATTACH_REFUSED,
            Error::Daemon { .. } => DAEMON,
            Error::Protocol(_) | Error::ControlTimeout { .. } => PROTOCOL,
            Error::Disconnected => DISCONNECTED,
            Error::Corrupt(_) | Error::Broken(_) => CORRUPT,
            Error::Shm(_) | Error::Io { .. } => SYSTEM,
            Error::Timeout | Error::CollectiveTimeout { .. } => TIMEOUT,
            Error::CollectiveAborted { .. } => ABORTED,
            Error::Op { error, .. } => match error {
                OpError::Nacked { .. } => NACKED,
                OpError::TimedOut => NET_TIMEOUT,
                OpError::LocalFault => LOCAL_FAULT,
                OpError::Aborted { .. } => ABORTED,
                OpError::Refused { .. } | OpError::Malformed { .. } | OpError::Unknown { .. } => {
                    OP_REFUSED
                }
            },
            Error::ChannelBusy { .. } => BUSY,
            Error::BadChannel { .. } => BAD_CHANNEL,
            Error::PayloadTooLong { .. } => TOO_LONG,
            Error::OutOfBounds { .. } => OUT_OF_BOUNDS,
            Error::BadLength { .. } => BAD_LENGTH,
            Error::ForeignRegion | Error::BadSetting { .. } | Error::Collective(_) => {
                INVALID_ARGUMENT
            }
            Error::UnknownTag(_) => UNKNOWN_TAG,
        }
    }

    /// The operation failure, if this is one.
    pub fn op_error(&self) -> Option<OpError> {
        match self {
            Error::Op { error, .. } => Some(*error),
            _ => None,
        }
    }

    pub(crate) fn io(op: &'static str) -> impl FnOnce(io::Error) -> Error {
        move |source| Error::Io { op, source }
    }
}

/// `Result` with this crate's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// What a collective that timed out was waiting for, in words.
fn waiting_for(awaiting: Option<usize>, unanswered: usize) -> String {
    let who = match awaiting {
        Some(m) => format!("waiting for member {m}"),
        None => "waiting for no member's message".to_string(),
    };
    format!("{who}, {unanswered} of its messages not answered")
}
