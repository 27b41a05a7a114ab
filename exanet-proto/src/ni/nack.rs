//! Why a destination refuses a cell: the reason a NACK carries, and what the sender makes
//! of it. Its own module because the NI and the metric catalog both name the reasons.

use crate::code::numeric_code;

numeric_code! {
    /// Why a destination refused a cell (carried in a NACK's `aux`).
    pub enum NackReason {
        /// The destination memory is not registered (an SMMU page fault); worth retrying.
        PageFault = 1 => "page_fault",
        /// No receive context free (or no process on that rank); worth retrying.
        NoContext = 2 => "no_context",
        /// The cell arrived corrupt.
        Crc = 3 => "crc",
        /// The address makes no sense (outside the mailbox range, a cell index out of range).
        BadAddress = 4 => "bad_address",
        /// The cell's PDID is not the destination's.
        PdidMismatch = 5 => "pdid_mismatch",
        /// The mailbox is full.
        QueueFull = 6 => "queue_full",
        /// An RDMA block's last cell arrived and some of its cells did not: the NACK carries
        /// the block's bitmap so that the sender resends only the missing cells. It concerns
        /// one attempt of one block and never ends a transfer.
        Incomplete = 7 => "incomplete",
    }
}

/// Reason codes are 1..=REASONS-1, one after another; counters indexed by code have
/// REASONS entries.
pub const REASONS: usize = NackReason::ALL.len() + 1;

impl NackReason {
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

    /// Every reason, by code.
    pub fn all() -> impl Iterator<Item = NackReason> {
        NackReason::ALL.into_iter()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Counters are indexed by code: the codes run 1, 2, ... with no gap.
    #[test]
    fn reason_codes_are_one_after_another_from_one() {
        for (i, r) in NackReason::ALL.into_iter().enumerate() {
            assert_eq!(usize::from(r.code()), i + 1, "{r:?}");
        }
        assert_eq!(NackReason::all().count(), REASONS - 1);
    }
}
