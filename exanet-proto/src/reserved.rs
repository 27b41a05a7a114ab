//! What a node's NI keeps for its owners-to-be, so that no job can squat it.
//!
//! Some resources are found by peers without a directory, by a fixed number, and whoever
//! takes one first is found in place of its owner:
//! - the rack's IP service attaches at rank [`IP_RANK`] and receives on mailbox
//!   [`IP_MAILBOX_VI`] on every node; a job that took either before the service
//!   started (or restarted) denied IP over ExaNet to that node;
//! - a rank's collective mailbox is interface [`COLLECTIVE_MAILBOX_BASE`] + rank (peers
//!   address a member's collective mailbox by its rank); a job that took interfaces 48..55
//!   made every other job's collectives on that node fail.
//!
//! So these belong to their owner from the start: the service's rank and mailbox to the
//! service's protection domain, a collective mailbox to the rank of that number, whoever
//! attaches there. Nobody else is given them, by number or as "the lowest free one".

use serde::{Deserialize, Serialize};

use crate::gvas::Pdid;
use crate::ni::{MAILBOX_VIS, RANKS};

/// The rank the IP service attaches at on every node, so peers find its mailbox without a
/// directory: the highest, leaving the low ranks to jobs, which are given the lowest free.
pub const IP_RANK: u8 = RANKS as u8 - 1;

/// The mailbox (virtual interface) the service receives its control messages on: the
/// last, since workloads are given the lowest free one and expect to start at 0.
pub const IP_MAILBOX_VI: u8 = MAILBOX_VIS as u8 - 1;

/// The collective mailbox of rank `r` is interface `COLLECTIVE_MAILBOX_BASE + r`.
pub const COLLECTIVE_MAILBOX_BASE: u8 = 48;

/// The collective mailbox interface of `rank`.
pub fn collective_mailbox(rank: u8) -> u8 {
    COLLECTIVE_MAILBOX_BASE + rank
}

/// Who a reserved resource belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "owner", content = "id")]
pub enum Owner {
    /// The rack's service of this protection domain (the IP service).
    Service(u16),
    /// Whoever holds this rank.
    Rank(u8),
}

impl std::fmt::Display for Owner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Owner::Service(pdid) => write!(f, "the IP service (PDID {pdid})"),
            Owner::Rank(r) => write!(f, "rank {r}"),
        }
    }
}

/// What one reservation keeps, for `exactl status`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Reservation {
    /// "rank 7", "mailbox 63", "mailboxes 48..55".
    pub resource: String,
    /// Whose it is: "the IP service (PDID 65535)", "rank r (48 + r)".
    pub owner: String,
}

/// The reservations of one node.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Reservations {
    /// The protection domain of the rack's IP service, if the rack has one.
    service: Option<Pdid>,
}

impl Reservations {
    /// Only the ranks' collective mailboxes.
    pub fn ranks_only() -> Reservations {
        Reservations::default()
    }

    /// The collective mailboxes, and the IP service's rank and mailbox for `pdid`.
    pub fn with_service(pdid: Pdid) -> Reservations {
        Reservations {
            service: Some(pdid),
        }
    }

    /// Whose rank `rank` is, if it is kept for someone.
    pub fn rank_owner(&self, rank: u8) -> Option<Owner> {
        let pdid = self.service?;
        (rank == IP_RANK).then_some(Owner::Service(pdid.0))
    }

    /// Whose mailbox interface `vi` is, if it is kept for someone.
    pub fn mailbox_owner(&self, vi: u8) -> Option<Owner> {
        if let Some(pdid) = self.service {
            if vi == IP_MAILBOX_VI {
                return Some(Owner::Service(pdid.0));
            }
        }
        let r = vi.checked_sub(COLLECTIVE_MAILBOX_BASE)?;
        (usize::from(r) < RANKS).then_some(Owner::Rank(r))
    }

    /// Whether a workload of `pdid` at `rank` may hold what `owner` owns.
    pub fn may_hold(owner: Option<Owner>, rank: u8, pdid: Pdid) -> bool {
        match owner {
            None => true,
            Some(Owner::Service(p)) => p == pdid.0,
            Some(Owner::Rank(r)) => r == rank,
        }
    }

    /// Every reservation, to show.
    pub fn list(&self) -> Vec<Reservation> {
        let mut out = Vec::new();
        if let Some(p) = self.service {
            let owner = Owner::Service(p.0).to_string();
            out.push(Reservation {
                resource: format!("rank {IP_RANK}"),
                owner: owner.clone(),
            });
            out.push(Reservation {
                resource: format!("mailbox {IP_MAILBOX_VI}"),
                owner,
            });
        }
        out.push(Reservation {
            resource: format!(
                "mailboxes {}..{}",
                COLLECTIVE_MAILBOX_BASE,
                COLLECTIVE_MAILBOX_BASE as usize + RANKS - 1
            ),
            owner: format!(
                "rank r, mailbox {COLLECTIVE_MAILBOX_BASE} + r (its collective mailbox)"
            ),
        });
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::workload::Joining;

    #[test]
    fn the_services_rank_and_mailbox_are_its_pdids_only() {
        let r = Reservations::with_service(Pdid(65535));
        assert_eq!(r.rank_owner(IP_RANK), Some(Owner::Service(65535)));
        assert_eq!(r.rank_owner(0), None);
        assert_eq!(r.mailbox_owner(IP_MAILBOX_VI), Some(Owner::Service(65535)));
        assert!(Reservations::may_hold(
            r.rank_owner(IP_RANK),
            IP_RANK,
            Pdid(65535)
        ));
        assert!(!Reservations::may_hold(
            r.rank_owner(IP_RANK),
            IP_RANK,
            Pdid(1)
        ));
        // Without a service nothing but the collective mailboxes is kept.
        let none = Reservations::ranks_only();
        assert_eq!(none.rank_owner(IP_RANK), None);
        assert_eq!(none.mailbox_owner(IP_MAILBOX_VI), None);
    }

    #[test]
    fn each_collective_mailbox_is_its_ranks() {
        let r = Reservations::with_service(Pdid(9));
        for rank in 0..RANKS as u8 {
            let vi = collective_mailbox(rank);
            assert_eq!(r.mailbox_owner(vi), Some(Owner::Rank(rank)));
            assert!(Reservations::may_hold(r.mailbox_owner(vi), rank, Pdid(1)));
            let other = (rank + 1) % RANKS as u8;
            assert!(!Reservations::may_hold(r.mailbox_owner(vi), other, Pdid(1)));
        }
        assert_eq!(r.mailbox_owner(COLLECTIVE_MAILBOX_BASE - 1), None);
        assert_eq!(r.mailbox_owner(COLLECTIVE_MAILBOX_BASE + RANKS as u8), None);
        assert_eq!(r.mailbox_owner(0), None);
    }

    /// A completion ring that keeps nothing: these tests look only at what is handed out.
    struct Discard;

    impl crate::workload::CompletionRing for Discard {
        fn push(&mut self, _: &[u8; crate::attach::SLOT]) -> bool {
            true
        }
        fn has_room(&mut self) -> bool {
            true
        }
        fn wake(&mut self) {}
        fn consumed(&self, _: u8) -> Box<dyn crate::ni::mailbox::ConsumedCount> {
            Box::new(|| 0)
        }
    }

    fn service() -> (crate::workload::WorkloadService, crate::ni::Ni) {
        let ni = crate::ni::Ni::new(crate::NodeId(0), 4, crate::ni::NiConfig::default());
        let svc = crate::workload::WorkloadService::new(1)
            .with_reservations(Reservations::with_service(Pdid(65535)));
        (svc, ni)
    }

    #[test]
    fn a_job_never_gets_the_services_rank() {
        use crate::workload::ServiceError;
        let (mut svc, mut ni) = service();
        // Asked for by number: refused, naming the owner.
        let err = svc
            .attach_at(
                &mut ni,
                IP_RANK,
                Joining::new("job", Pdid(1)),
                Box::new(Discard),
            )
            .unwrap_err();
        assert_eq!(
            err,
            ServiceError::RankReserved {
                rank: IP_RANK,
                owner: Owner::Service(65535)
            }
        );
        assert!(err.to_string().contains("IP service"), "{err}");
        // As "any": ranks 0..6, then none left for this job.
        let mut got: Vec<u8> = (0..RANKS - 1)
            .map(|_| {
                svc.attach(&mut ni, Joining::new("job", Pdid(1)), Box::new(Discard))
                    .unwrap()
            })
            .collect();
        got.sort();
        assert_eq!(got, (0..IP_RANK).collect::<Vec<_>>());
        assert_eq!(
            svc.attach(&mut ni, Joining::new("job", Pdid(1)), Box::new(Discard)),
            Err(ServiceError::RanksTaken { kept: 1 })
        );
        // The service still gets its rank.
        assert_eq!(
            svc.attach_at(
                &mut ni,
                IP_RANK,
                Joining::new("ip", Pdid(65535)),
                Box::new(Discard)
            ),
            Ok(IP_RANK)
        );
    }

    #[test]
    fn kept_mailboxes_go_to_their_owners_only() {
        use crate::attach::Resource;
        use crate::workload::ServiceError;
        let (mut svc, mut ni) = service();
        // As much as the node has: only the reservations refuse here.
        let mut who = Joining::new("job", Pdid(1));
        who.limits = who.job_limits;
        let job = svc.attach(&mut ni, who, Box::new(Discard)).unwrap();
        let ip = svc
            .attach_at(
                &mut ni,
                IP_RANK,
                Joining::new("ip", Pdid(65535)),
                Box::new(Discard),
            )
            .unwrap();
        let mailbox =
            |svc: &mut crate::workload::WorkloadService, ni: &mut crate::ni::Ni, rank, vi| {
                svc.alloc(ni, rank, Resource::Mailbox, Some(1), vi)
                    .map(|(index, _)| index)
            };
        // Another rank's collective mailbox, and the service's: refused.
        for (vi, owner) in [
            (collective_mailbox(job + 1), Owner::Rank(job + 1)),
            (IP_MAILBOX_VI, Owner::Service(65535)),
        ] {
            assert_eq!(
                mailbox(&mut svc, &mut ni, job, Some(vi)),
                Err(ServiceError::MailboxReserved { index: vi, owner })
            );
        }
        // Its own collective mailbox, and the service its own: given.
        assert_eq!(
            mailbox(&mut svc, &mut ni, job, Some(collective_mailbox(job))),
            Ok(collective_mailbox(job))
        );
        assert_eq!(
            mailbox(&mut svc, &mut ni, ip, Some(IP_MAILBOX_VI)),
            Ok(IP_MAILBOX_VI)
        );
        // "Any mailbox" never hands out a kept one: every free unkept one, then none.
        let mut any = Vec::new();
        while let Ok(vi) = mailbox(&mut svc, &mut ni, job, None) {
            any.push(vi);
        }
        assert_eq!(
            any,
            (0..COLLECTIVE_MAILBOX_BASE)
                .chain(56..63)
                .collect::<Vec<_>>()
        );
    }
}
