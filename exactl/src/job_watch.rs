//! What `exactl mpirun` watches while a job runs, so that a job the rack can no longer
//! carry ends with the reason instead of waiting for ever: MPI runtimes that lose a node,
//! or the fabric between two of their nodes, wait for it (Open MPI's abort itself rides IP
//! over ExaNet, across the same fabric).
//!
//! - A node is gone when its daemon is: on a local rack, its process is no longer the one
//!   the job started with (checked every [`PID_EVERY`], in a thread of its own); on a rack
//!   whose processes exactl cannot see (compose), it has answered no status request for
//!   the rack's link timeout (the rack's own measure of a silent peer), or its daemon's
//!   uptime went back (a container its engine restarted: the job's state did not survive
//!   it).
//! - A link the job's traffic takes (on a route between two of its nodes, either way) is
//!   lost when it has stayed down for longer than the NI's retry budget and a second: by
//!   then every send waiting across it has failed, and nothing crosses it for the job.
//!   A cut shorter than the link timeout heals (the budget outlasts it: `Rack::ni_config`).
//!   Both ends of each link are asked, so a node that does not answer cannot hide one.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use exanet_control::control::{LinkState, NodeStatus, Request};
use exanet_control::control_client::ControlClient;
use exanet_control::rack::Rack;
use exanet_proto::routing::{self, Hop};
use exanet_proto::topology::{self, Port};
use exanet_proto::{NodeId, Shape};

use crate::error::{CliError, Result};

/// How often a local rack's daemon processes are looked at.
const PID_EVERY: Duration = Duration::from_millis(250);
/// How often the job's nodes are asked for their status (links, uptime).
const STATUS_EVERY: Duration = Duration::from_secs(1);
/// How long one status request may take. A daemon busy carrying the job answers in
/// milliseconds; this is for one that is stopped or gone.
const STATUS_TIMEOUT: Duration = Duration::from_secs(2);
/// Past the NI's retry budget, before a lost link ends the job: the ranks' own errors
/// come first.
const LINK_GRACE: Duration = Duration::from_secs(1);

/// Why the watch says the job cannot go on.
#[derive(Clone, Debug, PartialEq)]
pub enum Verdict {
    /// A node of the job is gone.
    NodeGone {
        node: String,
        /// How it was seen to be gone ("daemon pid 42 gone", ...).
        how: String,
        /// Since the watch began.
        after: Duration,
    },
    /// A link between two nodes of the job stayed down too long.
    LinkLost {
        /// The link's two ends.
        ends: (String, String),
        /// Two nodes of the job whose route takes it.
        between: (String, String),
        down_for: Duration,
        after: Duration,
    },
}

impl Verdict {
    /// Since the watch began.
    pub fn after(&self) -> Duration {
        match self {
            Verdict::NodeGone { after, .. } | Verdict::LinkLost { after, .. } => *after,
        }
    }

    /// What happened ("node M1QAF2 died").
    pub fn what(&self) -> String {
        match self {
            Verdict::NodeGone { node, .. } => format!("node {node} died"),
            Verdict::LinkLost {
                ends: (a, b),
                between: (x, y),
                ..
            } => format!(
                "the link {a} <-> {b}, which carries the job's traffic between {x} and {y}, \
                 was lost"
            ),
        }
    }

    /// How it was seen ("daemon pid 42 gone").
    pub fn how(&self) -> String {
        match self {
            Verdict::NodeGone { how, .. } => how.clone(),
            Verdict::LinkLost { down_for, .. } => format!(
                "it has been down for {:.1} s, longer than the NI's retry budget: every send \
                 across it has failed",
                down_for.as_secs_f64()
            ),
        }
    }
}

/// A watch over one job's nodes and links, in a thread of its own until dropped.
pub struct Watch {
    rack: Rack,
    /// Made before `exactl mpirun` enters the first node's network namespace (on a local
    /// rack with IP): a client made afterwards reaches no daemon from in there, and every
    /// failed job was blamed on its first node, "its daemon does not answer".
    client: Arc<ControlClient>,
    ids: Vec<NodeId>,
    since: Instant,
    verdict: Arc<Mutex<Option<Verdict>>>,
    stop: Arc<AtomicBool>,
    threads: Vec<JoinHandle<()>>,
}

impl Watch {
    /// Starts watching the nodes `names` of `rack` and the links between them. On a
    /// local rack (`local`), a node without a live daemon is refused at once.
    pub fn start(rack: &Rack, rack_dir: &Path, names: &[String], local: bool) -> Result<Watch> {
        let shape = rack.shape();
        let ids = names
            .iter()
            .map(|n| {
                shape
                    .parse_node(n)
                    .map_err(|e| CliError::Failed(format!("{n}: {e}")))
            })
            .collect::<Result<Vec<_>>>()?;
        let daemons = if local {
            Some(local_daemons(rack, rack_dir, names)?)
        } else {
            None
        };
        let client = Arc::new(crate::control::client(rack)?);
        let state = State {
            shape,
            names: names.to_vec(),
            ids: ids.clone(),
            links: job_links(&shape, &ids),
            // Where the pids are watched, silence is no evidence: a busy daemon answers
            // late, a paused one comes back, and its links say the rest.
            silent_limit: (!local).then(|| rack.file.link_timeout()),
            link_limit: Duration::from_nanos(rack.ni_config().retry_budget_ns()) + LINK_GRACE,
            since: Instant::now(),
            silent_since: HashMap::new(),
            uptime: HashMap::new(),
            down_since: HashMap::new(),
        };
        let verdict = Arc::new(Mutex::new(None));
        let stop = Arc::new(AtomicBool::new(false));
        let spawn = |name: &str, f: Box<dyn FnOnce() + Send>| {
            std::thread::Builder::new()
                .name(name.into())
                .spawn(f)
                .map_err(|e| CliError::Failed(format!("cannot start the job's watch: {e}")))
        };
        let mut threads = Vec::new();
        {
            let (verdict, stop, client) = (verdict.clone(), stop.clone(), client.clone());
            threads.push(spawn(
                "job-watch",
                Box::new(move || state.run(&client, &verdict, &stop)),
            )?);
        }
        if let Some(daemons) = daemons {
            let pids = Pids {
                daemons,
                rack_dir: rack_dir.to_path_buf(),
                since: Instant::now(),
            };
            let (v, halt) = (verdict.clone(), stop.clone());
            match spawn("job-pids", Box::new(move || pids.run(&v, &halt))) {
                Ok(t) => threads.push(t),
                Err(e) => {
                    // The status thread goes too.
                    stop.store(true, Ordering::Relaxed);
                    for t in threads {
                        let _ = t.join();
                    }
                    return Err(e);
                }
            }
        }
        Ok(Watch {
            rack: rack.clone(),
            client,
            ids,
            since: Instant::now(),
            verdict,
            stop,
            threads,
        })
    }

    /// A job node that does not answer now (one status request each, [`STATUS_TIMEOUT`]):
    /// after a failed job, whether a node's death explains it.
    pub fn silent_now(&self) -> Option<Verdict> {
        let reqs = self.ids.iter().map(|&id| (id, Request::Status)).collect();
        let answers = crate::control::ask_all(&self.client, reqs, STATUS_TIMEOUT);
        let shape = self.rack.shape();
        self.ids
            .iter()
            .zip(answers)
            .find(|(_, a)| !matches!(a, Ok(exanet_control::control::Response::Status(_))))
            .map(|(&id, a)| Verdict::NodeGone {
                node: shape.display(id),
                how: match a {
                    Err(e) => format!("its daemon does not answer: {e}"),
                    Ok(r) => format!("its daemon answered {r:?} to a status request"),
                },
                after: self.since.elapsed(),
            })
    }

    /// Why the job cannot go on, once the watch has seen it.
    pub fn verdict(&self) -> Option<Verdict> {
        self.verdict
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }
}

impl Drop for Watch {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

/// The daemon process of every node in `names`; a node without a live one is refused.
fn local_daemons(rack: &Rack, rack_dir: &Path, names: &[String]) -> Result<Vec<(String, i32)>> {
    let layout = rack.layout();
    let mut daemons = Vec::with_capacity(names.len());
    for n in names {
        let pid_file = layout.pid_file(n);
        match crate::process::read_pid_file(&pid_file, n, rack_dir) {
            crate::process::PidFile::Running(d) => daemons.push((n.clone(), d.pid)),
            _ => {
                return Err(CliError::Failed(format!(
                    "{n} is down: no live daemon behind {} (`exactl node restart {n}` \
                     brings it back)",
                    pid_file.display()
                )))
            }
        }
    }
    Ok(daemons)
}

/// A link the job's traffic takes, by its two ends (lower id first).
type LinkKey = (NodeId, NodeId);

/// Every link on a route between two of `ids` (either way, routes being dimension-ordered
/// and so not always the same both ways), with the first such pair of job nodes.
fn job_links(shape: &Shape, ids: &[NodeId]) -> BTreeMap<LinkKey, (NodeId, NodeId)> {
    let mut links = BTreeMap::new();
    for &src in ids {
        for &dst in ids.iter().filter(|&&d| d != src) {
            let Ok(path) = routing::path(shape, src, dst) else {
                continue;
            };
            for (here, Hop { port, .. }) in path {
                if port == Port::Local {
                    continue;
                }
                if let Some((next, _)) = topology::neighbour(shape, here, port) {
                    let key = (here.min(next), here.max(next));
                    links.entry(key).or_insert((src.min(dst), src.max(dst)));
                }
            }
        }
    }
    links
}

/// The daemon processes of a local rack's job nodes, watched in a thread of their own so
/// that a slow status round never delays them.
struct Pids {
    daemons: Vec<(String, i32)>,
    rack_dir: PathBuf,
    since: Instant,
}

impl Pids {
    fn run(self, verdict: &Mutex<Option<Verdict>>, stop: &AtomicBool) {
        while !stop.load(Ordering::Relaxed) {
            if let Some(v) = self.dead_daemon() {
                say(verdict, v);
                return;
            }
            std::thread::sleep(PID_EVERY);
        }
    }

    /// The first node whose daemon is no longer the process it was (exited, killed, or
    /// replaced by a restart, which the job's state did not survive either).
    fn dead_daemon(&self) -> Option<Verdict> {
        self.daemons
            .iter()
            .find(|(node, pid)| !crate::process::is_our_daemon(*pid, node, &self.rack_dir))
            .map(|(node, pid)| Verdict::NodeGone {
                node: node.clone(),
                how: format!("daemon pid {pid} gone"),
                after: self.since.elapsed(),
            })
    }
}

/// The first verdict stands.
fn say(verdict: &Mutex<Option<Verdict>>, v: Verdict) {
    verdict
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .get_or_insert(v);
}

/// The status watch's own state, in its thread.
struct State {
    shape: Shape,
    names: Vec<String>,
    ids: Vec<NodeId>,
    links: BTreeMap<LinkKey, (NodeId, NodeId)>,
    /// How long a job node may answer nothing before it is gone; `None`: silence alone
    /// ends nothing (a local rack, whose processes are watched).
    silent_limit: Option<Duration>,
    link_limit: Duration,
    since: Instant,
    silent_since: HashMap<NodeId, Instant>,
    uptime: HashMap<NodeId, f64>,
    down_since: HashMap<LinkKey, Instant>,
}

impl State {
    fn run(
        mut self,
        client: &exanet_control::control_client::ControlClient,
        verdict: &Mutex<Option<Verdict>>,
        stop: &AtomicBool,
    ) {
        loop {
            let round = Instant::now() + STATUS_EVERY;
            if let Some(v) = self.look(client) {
                say(verdict, v);
                return;
            }
            // In small steps, so that the watch ends soon after the job.
            while Instant::now() < round {
                if stop.load(Ordering::Relaxed) {
                    return;
                }
                std::thread::sleep(Duration::from_millis(50));
            }
            if stop.load(Ordering::Relaxed) {
                return;
            }
        }
    }

    /// Asks the job's nodes and both ends of each of its links for their status.
    fn look(&mut self, client: &exanet_control::control_client::ControlClient) -> Option<Verdict> {
        let asked: BTreeSet<NodeId> = self
            .ids
            .iter()
            .copied()
            .chain(self.links.keys().flat_map(|&(a, b)| [a, b]))
            .collect();
        let reqs = asked.iter().map(|&id| (id, Request::Status)).collect();
        // Silence counts from when the round began: a node's silence is at least that.
        let began = Instant::now();
        let answers = crate::control::ask_all(client, reqs, STATUS_TIMEOUT);
        let now = Instant::now();
        let mut down: BTreeSet<LinkKey> = BTreeSet::new();
        for (&id, answer) in asked.iter().zip(answers) {
            let st = match answer {
                Ok(exanet_control::control::Response::Status(st)) => st,
                _ => {
                    let silent = *self.silent_since.entry(id).or_insert(began);
                    let limit = self.silent_limit.filter(|_| self.ids.contains(&id));
                    if let Some(limit) = limit.filter(|&l| now - silent >= l) {
                        return Some(Verdict::NodeGone {
                            node: self.shape.display(id),
                            how: format!(
                                "its daemon has not answered for {:.0} s, the rack's link \
                                 timeout {} s",
                                (now - silent).as_secs_f64(),
                                limit.as_secs()
                            ),
                            after: self.since.elapsed(),
                        });
                    }
                    continue;
                }
            };
            self.silent_since.remove(&id);
            if let Some(v) = self.restarted(id, &st) {
                return Some(v);
            }
            down.extend(self.links_down(id, &st));
        }
        self.down_since.retain(|k, _| down.contains(k));
        for k in down {
            let since = *self.down_since.entry(k).or_insert(now);
            if now - since >= self.link_limit {
                let (x, y) = self.links[&k];
                return Some(Verdict::LinkLost {
                    ends: (self.shape.display(k.0), self.shape.display(k.1)),
                    between: (self.shape.display(x), self.shape.display(y)),
                    down_for: now - since,
                    after: self.since.elapsed(),
                });
            }
        }
        None
    }

    /// A job node whose daemon's uptime went back since it last answered: a new daemon.
    /// (Only back: how much it grew depends on when each answer came, which a slow
    /// round shifts by seconds.)
    fn restarted(&mut self, id: NodeId, st: &NodeStatus) -> Option<Verdict> {
        let up = self.uptime.insert(id, st.uptime_seconds)?;
        (self.ids.contains(&id) && st.uptime_seconds < up).then(|| Verdict::NodeGone {
            node: self.shape.display(id),
            how: format!(
                "its daemon restarted: up {:.1} s, it was up {up:.1} s before",
                st.uptime_seconds
            ),
            after: self.since.elapsed(),
        })
    }

    /// The job's links that `st` (node `id`'s status) reports down.
    fn links_down(&self, id: NodeId, st: &NodeStatus) -> Vec<LinkKey> {
        st.links
            .iter()
            .filter(|l| l.state == LinkState::Down)
            .filter_map(|l| self.shape.parse_node(&l.peer).ok())
            .map(|peer| (id.min(peer), id.max(peer)))
            .filter(|k| self.links.contains_key(k))
            .collect()
    }
}

impl std::fmt::Debug for State {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("State")
            .field("nodes", &self.names)
            .field("links", &self.links.len())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(shape: &Shape, ids: &[NodeId]) -> Vec<(String, String)> {
        job_links(shape, ids)
            .keys()
            .map(|&(a, b)| (shape.display(a), shape.display(b)))
            .collect()
    }

    #[test]
    fn a_jobs_links_are_those_its_routes_take() {
        let shape: Shape = "2x1x1".parse().unwrap();
        let n = |s: &str| shape.parse_node(s).unwrap();
        // Two nodes of one QFDB: their own link only.
        assert_eq!(
            names(&shape, &[n("M1QAF2"), n("M1QAF3")]),
            vec![("M1QAF2".to_string(), "M1QAF3".to_string())]
        );
        // Across the QFDBs: through each side's F1 and the torus link, both ways.
        let across = names(&shape, &[n("M1QAF2"), n("M1QBF3")]);
        for want in [
            ("M1QAF1", "M1QBF1"),
            ("M1QAF1", "M1QAF2"),
            ("M1QBF1", "M1QBF3"),
        ] {
            assert!(
                across
                    .iter()
                    .any(|(a, b)| (a.as_str(), b.as_str()) == want
                        || (b.as_str(), a.as_str()) == want),
                "{want:?} not in {across:?}"
            );
        }
        assert!(
            !across.iter().any(|(a, b)| a == "M1QAF4" || b == "M1QAF4"),
            "a link no route takes: {across:?}"
        );
        // One node alone takes no link.
        assert!(job_links(&shape, &[n("M1QAF2")]).is_empty());
    }

    fn state(ids: &[NodeId]) -> State {
        let shape: Shape = "2x1x1".parse().unwrap();
        State {
            shape,
            names: ids.iter().map(|&id| shape.display(id)).collect(),
            ids: ids.to_vec(),
            links: job_links(&shape, ids),
            silent_limit: None,
            link_limit: Duration::from_secs(12),
            since: Instant::now(),
            silent_since: HashMap::new(),
            uptime: HashMap::new(),
            down_since: HashMap::new(),
        }
    }

    fn status(uptime: f64) -> NodeStatus {
        serde_json::from_value(serde_json::json!({
            "node": "M1QAF2", "id": 1, "shape": "2x1x1", "pid": 7, "uptime_seconds": uptime,
            "links": [], "forwarded_cells": 0, "injected_cells": 0, "delivered_cells": 0,
            "load_tx_cells": 0, "load_rx_cells": 0, "load_rx_bytes": 0, "errors": {},
        }))
        .unwrap()
    }

    /// A slow round shifts when each answer is taken by seconds: uptime that grew less
    /// than the rounds' spacing is no restart; uptime that went back is.
    #[test]
    fn only_an_uptime_that_went_back_is_a_restart() {
        let id = NodeId(1);
        let mut s = state(&[id, NodeId(2)]);
        assert_eq!(s.restarted(id, &status(10.0)), None);
        assert_eq!(
            s.restarted(id, &status(10.2)),
            None,
            "a late answer, then an early one"
        );
        assert_eq!(s.restarted(id, &status(13.0)), None);
        let v = s.restarted(id, &status(0.4)).expect("a new daemon");
        assert!(v.how().contains("restarted"), "{v:?}");
        // A node outside the job is not the job's to lose.
        let mut s = state(&[NodeId(2)]);
        s.restarted(id, &status(10.0));
        assert_eq!(s.restarted(id, &status(0.4)), None);
    }

    #[test]
    fn a_verdict_names_what_ended_the_job() {
        let v = Verdict::LinkLost {
            ends: ("M1QAF1".into(), "M1QBF1".into()),
            between: ("M1QAF2".into(), "M1QBF3".into()),
            down_for: Duration::from_millis(12_500),
            after: Duration::from_secs(20),
        };
        let (what, how) = (v.what(), v.how());
        assert!(
            what.contains("M1QAF1 <-> M1QBF1") && what.contains("M1QAF2 and M1QBF3"),
            "{what}"
        );
        assert!(how.contains("down for 12.5 s"), "{how}");
        assert_eq!(v.after(), Duration::from_secs(20));
    }
}
