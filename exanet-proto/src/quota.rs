//! What one job and one attached process may hold on a node.
//!
//! A node has 8 ranks, 16 RDMA pages, 64 packetizer interfaces and 64 mailboxes (SPEC §4),
//! handed out first come, first served; without limits one job could take them all and lock
//! every other job out of the node. When the rack file names more than one job, each gets a
//! share ([`JOB_DEFAULTS`], or its `[jobs.NAME]` table); a rack with one job lets it use the
//! whole node. Each attached process gets a smaller share ([`RANK_DEFAULTS`], or
//! `[ni] rank_max_*`). Registered memory is real memory the daemon allocates, so it is
//! bounded the same way. A refusal says which limit it hit; the daemon counts it as
//! `quota_refused`.

use std::fmt;

use serde::{Deserialize, Serialize};

const MIB: u64 = 1 << 20;

/// What one job may hold on one node; absent fields keep the defaults
/// ([`JOB_DEFAULTS`]), which leave a share of every NI resource to other jobs.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct JobQuota {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_ranks: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_rdma_pages: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_packetizers: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_mailboxes: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_registered_mib: Option<u64>,
}

/// `[ni] rank_max_*` in the rack file: what one attached process may hold; absent fields
/// keep [`RANK_DEFAULTS`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RankQuota {
    pub max_rdma_pages: Option<u32>,
    pub max_packetizers: Option<u32>,
    pub max_mailboxes: Option<u32>,
    pub max_registered_mib: Option<u64>,
}

/// What a job or a rank may hold.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    pub ranks: u32,
    pub rdma_pages: u32,
    pub packetizers: u32,
    pub mailboxes: u32,
    pub registered_bytes: u64,
}

/// A job's share of one node by default when the rack has other jobs: three quarters of each
/// NI resource, so that another job always finds some; 8 GiB of registered memory.
pub const JOB_DEFAULTS: Limits = Limits {
    ranks: 6,
    rdma_pages: 12,
    packetizers: 48,
    mailboxes: 48,
    registered_bytes: 8192 * MIB,
};

/// One attached process's share by default: half of each NI resource, 4 GiB of registered
/// memory (one maximal RDMA transfer's worth).
pub const RANK_DEFAULTS: Limits = Limits {
    ranks: 1,
    rdma_pages: 8,
    packetizers: 32,
    mailboxes: 32,
    registered_bytes: 4096 * MIB,
};

/// What a node has of each resource (SPEC §4): no limit above these means anything.
const NODE: Limits = Limits {
    ranks: crate::ni::RANKS as u32,
    rdma_pages: crate::ni::RDMA_PAGES as u32,
    packetizers: 64,
    mailboxes: 64,
    // Far more than any host has; the real bound is the job's setting.
    registered_bytes: 1 << 40,
};

/// A resource a rank holds some of.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Rank,
    RdmaPage,
    Packetizer,
    Mailbox,
    RegisteredBytes,
}

impl Kind {
    fn label(self) -> &'static str {
        match self {
            Kind::Rank => "ranks",
            Kind::RdmaPage => "RDMA pages",
            Kind::Packetizer => "packetizer interfaces",
            Kind::Mailbox => "mailboxes",
            Kind::RegisteredBytes => "bytes of registered memory",
        }
    }
}

impl Limits {
    fn get(&self, k: Kind) -> u64 {
        match k {
            Kind::Rank => self.ranks.into(),
            Kind::RdmaPage => self.rdma_pages.into(),
            Kind::Packetizer => self.packetizers.into(),
            Kind::Mailbox => self.mailboxes.into(),
            Kind::RegisteredBytes => self.registered_bytes,
        }
    }

    /// A job's limits: its table's settings over [`JOB_DEFAULTS`] when the rack has
    /// `jobs > 1` jobs, over the whole node when it is the only one.
    pub fn for_job(q: &JobQuota, jobs: usize) -> Limits {
        let d = if jobs > 1 {
            JOB_DEFAULTS
        } else {
            Limits {
                registered_bytes: JOB_DEFAULTS.registered_bytes,
                ..NODE
            }
        };
        Limits::over(q, d)
    }

    /// A rank's limits: `[ni] rank_max_*` over [`RANK_DEFAULTS`].
    pub fn for_rank(q: &RankQuota) -> Limits {
        let as_job = JobQuota {
            max_ranks: Some(1),
            max_rdma_pages: q.max_rdma_pages,
            max_packetizers: q.max_packetizers,
            max_mailboxes: q.max_mailboxes,
            max_registered_mib: q.max_registered_mib,
        };
        Limits::over(&as_job, RANK_DEFAULTS)
    }

    /// The settings of `q`, `d` where it has none.
    fn over(q: &JobQuota, d: Limits) -> Limits {
        Limits {
            ranks: q.max_ranks.unwrap_or(d.ranks),
            rdma_pages: q.max_rdma_pages.unwrap_or(d.rdma_pages),
            packetizers: q.max_packetizers.unwrap_or(d.packetizers),
            mailboxes: q.max_mailboxes.unwrap_or(d.mailboxes),
            registered_bytes: q
                .max_registered_mib
                .map_or(d.registered_bytes, |m| m.saturating_mul(MIB)),
        }
    }

    /// A job table's limits are within what a node has (0 is allowed: a job that may not
    /// use that resource here).
    pub fn check_job(q: &JobQuota) -> Result<(), String> {
        Limits::for_job(q, 2).within_node("max_", true)
    }

    /// `[ni] rank_max_*` are within what a node has.
    pub fn check_rank(q: &RankQuota) -> Result<(), String> {
        Limits::for_rank(q).within_node("rank_max_", false)
    }

    /// Every limit is at most what a node has; `prefix` names the settings in errors.
    fn within_node(&self, prefix: &str, with_ranks: bool) -> Result<(), String> {
        let counts = [
            ("ranks", self.ranks, NODE.ranks),
            ("rdma_pages", self.rdma_pages, NODE.rdma_pages),
            ("packetizers", self.packetizers, NODE.packetizers),
            ("mailboxes", self.mailboxes, NODE.mailboxes),
        ];
        for (name, v, max) in counts.into_iter().skip(usize::from(!with_ranks)) {
            if v > max {
                return Err(format!(
                    "{prefix}{name} = {v} is more than a node has ({max})"
                ));
            }
        }
        if self.registered_bytes > NODE.registered_bytes {
            return Err(format!("{prefix}registered_mib is over 1 TiB"));
        }
        Ok(())
    }
}

/// What one attached process holds.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Holding {
    pub rdma_pages: u32,
    pub packetizers: u32,
    pub mailboxes: u32,
    pub registered_bytes: u64,
}

impl Holding {
    pub fn get(&self, k: Kind) -> u64 {
        match k {
            Kind::Rank => 1,
            Kind::RdmaPage => self.rdma_pages.into(),
            Kind::Packetizer => self.packetizers.into(),
            Kind::Mailbox => self.mailboxes.into(),
            Kind::RegisteredBytes => self.registered_bytes,
        }
    }

    /// Adds `n` of `k` (negative: gives it back).
    pub fn add(&mut self, k: Kind, n: i64) {
        let f = |v: u64| v.saturating_add_signed(n);
        match k {
            Kind::Rank => {}
            Kind::RdmaPage => self.rdma_pages = f(self.rdma_pages.into()) as u32,
            Kind::Packetizer => self.packetizers = f(self.packetizers.into()) as u32,
            Kind::Mailbox => self.mailboxes = f(self.mailboxes.into()) as u32,
            Kind::RegisteredBytes => self.registered_bytes = f(self.registered_bytes),
        }
    }
}

/// A limit a request would break.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Exceeded {
    pub kind: Kind,
    /// `None`: the rank's own limit; `Some(job)`: the job's.
    pub job: Option<String>,
    pub limit: u64,
    pub held: u64,
}

impl fmt::Display for Exceeded {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let what = self.kind.label();
        match &self.job {
            Some(job) => write!(
                f,
                "job {job} holds {} of its {} {what} on this node",
                self.held, self.limit
            ),
            None => write!(
                f,
                "this process holds {} of its {} {what}",
                self.held, self.limit
            ),
        }
    }
}

impl std::error::Error for Exceeded {}

/// Whether a rank holding `mine`, of a job whose ranks hold `job_total` together
/// (`mine` included), may take `n` more of `k`.
pub fn check(
    kind: Kind,
    n: u64,
    mine: &Holding,
    rank: &Limits,
    job: (&str, &Limits, &Holding, u32),
) -> Result<(), Exceeded> {
    let (job_name, job_limits, job_total, job_ranks) = job;
    let held = mine.get(kind);
    if kind != Kind::Rank && held.saturating_add(n) > rank.get(kind) {
        return Err(Exceeded {
            kind,
            job: None,
            limit: rank.get(kind),
            held,
        });
    }
    let held = match kind {
        Kind::Rank => job_ranks.into(),
        _ => job_total.get(kind),
    };
    if held.saturating_add(n) > job_limits.get(kind) {
        return Err(Exceeded {
            kind,
            job: Some(job_name.to_string()),
            limit: job_limits.get(kind),
            held,
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_rank_limit_and_a_job_limit_each_refuse_with_what_they_hit() {
        let rank = Limits {
            rdma_pages: 2,
            ..RANK_DEFAULTS
        };
        let job = Limits {
            rdma_pages: 3,
            ..JOB_DEFAULTS
        };
        let mine = Holding {
            rdma_pages: 2,
            ..Holding::default()
        };
        let e = check(Kind::RdmaPage, 1, &mine, &rank, ("a", &job, &mine, 1)).unwrap_err();
        assert_eq!((e.job.as_deref(), e.limit, e.held), (None, 2, 2));
        let mine = Holding {
            rdma_pages: 1,
            ..Holding::default()
        };
        let total = Holding {
            rdma_pages: 3,
            ..Holding::default()
        };
        let e = check(Kind::RdmaPage, 1, &mine, &rank, ("a", &job, &total, 2)).unwrap_err();
        assert_eq!((e.job.as_deref(), e.limit, e.held), (Some("a"), 3, 3));
        assert_eq!(
            e.to_string(),
            "job a holds 3 of its 3 RDMA pages on this node"
        );
        let total = Holding {
            rdma_pages: 2,
            ..Holding::default()
        };
        assert!(check(Kind::RdmaPage, 1, &mine, &rank, ("a", &job, &total, 2)).is_ok());
        // Ranks count per job only.
        let one_more = |ranks| {
            let none = Holding::default();
            check(Kind::Rank, 1, &none, &rank, ("a", &job, &total, ranks))
        };
        assert!(one_more(6).is_err());
        assert!(one_more(5).is_ok());
    }
}
