//! Why a destination refuses a cell: the reason a NACK carries, and what the sender makes
//! of it. Its own module because the NI and the metric catalog both name the reasons.

/// Why a destination refused a cell (carried in a NACK's `aux`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum NackReason {
    /// The destination memory is not registered (an SMMU page fault); worth retrying.
    PageFault = 1,
    /// No receive context free (or no process on that rank); worth retrying.
    NoContext = 2,
    /// The cell arrived corrupt.
    Crc = 3,
    /// The address makes no sense (outside the mailbox range, a cell index out of range).
    BadAddress = 4,
    /// The cell's PDID is not the destination's.
    PdidMismatch = 5,
    /// The mailbox is full.
    QueueFull = 6,
    /// An RDMA block's last cell arrived and some of its cells did not: the NACK carries
    /// the block's bitmap so that the sender resends only the missing cells. It concerns
    /// one attempt of one block and never ends a transfer.
    Incomplete = 7,
}

/// Reason codes are 1..=REASONS-1; counters indexed by code have REASONS entries.
pub const REASONS: usize = 8;

impl NackReason {
    pub fn from_u8(v: u8) -> Option<NackReason> {
        Some(match v {
            1 => NackReason::PageFault,
            2 => NackReason::NoContext,
            3 => NackReason::Crc,
            4 => NackReason::BadAddress,
            5 => NackReason::PdidMismatch,
            6 => NackReason::QueueFull,
            7 => NackReason::Incomplete,
            _ => return None,
        })
    }

    /// Whether the sender should try again (the condition may clear).
    pub fn transient(self) -> bool {
        matches!(
            self,
            NackReason::PageFault
                | NackReason::NoContext
                | NackReason::Crc
                | NackReason::Incomplete
        )
    }

    pub fn label(self) -> &'static str {
        match self {
            NackReason::PageFault => "page_fault",
            NackReason::NoContext => "no_context",
            NackReason::Crc => "crc",
            NackReason::BadAddress => "bad_address",
            NackReason::PdidMismatch => "pdid_mismatch",
            NackReason::QueueFull => "queue_full",
            NackReason::Incomplete => "incomplete",
        }
    }

    /// Every reason, by code.
    pub fn all() -> impl Iterator<Item = NackReason> {
        (1..REASONS as u8).filter_map(NackReason::from_u8)
    }
}
