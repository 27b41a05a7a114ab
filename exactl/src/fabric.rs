//! What the daemons of a rack say about themselves: their status, queried concurrently over
//! the control API, and the rack's links as seen from both ends.

use std::collections::HashMap;
use std::time::Duration;

use exanet_control::control::{self, LinkState, LinkStatus, NodeStatus, Request, Response};
use exanet_control::control_client::ControlClient;
use exanet_proto::topology::{self, Link};
use exanet_proto::{NodeId, Shape};

use crate::live::RackLiveness;

/// One node's answer to `status`, or why there was none.
pub type Answer = Result<NodeStatus, String>;

/// Asks every node of the rack for its status, `timeout` per node from when it is asked
/// (a few at a time: [`crate::control::ask_all`]). The
/// answers are indexed by node id. A node of a local rack whose process is gone is not
/// asked: its answer is "process not running" at once.
pub fn query_all(client: &ControlClient, timeout: Duration) -> Vec<Answer> {
    query_live(client, &RackLiveness::of(client.rack()), timeout)
}

/// [`query_all`] with the liveness already looked at.
pub fn query_live(client: &ControlClient, live: &RackLiveness, timeout: Duration) -> Vec<Answer> {
    let shape = client.rack().shape();
    let reqs = shape
        .node_ids()
        .filter(|id| live.gone(*id).is_none())
        .map(|id| (id, Request::Status))
        .collect();
    let mut asked = crate::control::ask_all(client, reqs, timeout).into_iter();
    shape
        .node_ids()
        .map(|id| match live.message(id) {
            Some(m) => Err(m),
            None => asked
                .next()
                .map_or_else(|| Err("no answer".to_string()), status_answer),
        })
        .collect()
}

/// Asks one node for its status.
pub fn query_one(client: &ControlClient, id: NodeId, timeout: Duration) -> Answer {
    status_answer(client.request(id, &Request::Status, timeout))
}

fn status_answer(r: std::result::Result<Response, control::ControlError>) -> Answer {
    match r {
        Ok(Response::Status(st)) => Ok(*st),
        Ok(Response::Error { message }) => Err(format!("daemon error: {message}")),
        Ok(other) => Err(format!("unexpected answer to status: {other:?}")),
        Err(e) => Err(short_control_error(&e)),
    }
}

/// A control error in a few words, for tables and progress lines (the node and its
/// address are on the same line already).
pub fn short_control_error(e: &control::ControlError) -> String {
    use control::ControlError as E;
    match e {
        E::Unreachable { message, .. } => format!("unreachable: {message}"),
        E::Remote { message, .. } => message.clone(),
        E::Connect { source, .. } => format!("cannot connect: {source}"),
        E::Io { source, .. } => format!("control connection failed: {source}"),
        E::Protocol { message, .. } => format!("bad answer: {message}"),
        E::Credentials(m) => m.clone(),
    }
}

/// The state of a link as seen from both ends.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Health {
    /// Both ends report it up.
    Up,
    /// Exactly one end reports it up.
    Half,
    /// Neither end reports it up (or neither answered).
    Down,
}

impl Health {
    pub fn label(self) -> &'static str {
        match self {
            Health::Up => "up",
            Health::Half => "half",
            Health::Down => "down",
        }
    }
}

/// One link of the rack with what each end reports about it.
#[derive(Clone, Debug)]
pub struct LinkView<'a> {
    pub link: Link,
    pub a_end: Option<&'a LinkStatus>,
    pub b_end: Option<&'a LinkStatus>,
}

impl LinkView<'_> {
    pub fn health(&self) -> Health {
        let up = |e: Option<&LinkStatus>| e.is_some_and(|l| l.state == LinkState::Up);
        match (up(self.a_end), up(self.b_end)) {
            (true, true) => Health::Up,
            (false, false) => Health::Down,
            _ => Health::Half,
        }
    }

    /// `M1QAF1 <-> M1QBF1 (torus_x)`.
    pub fn describe(&self, shape: &Shape) -> String {
        format!(
            "{} <-> {} ({})",
            shape.display(self.link.a),
            shape.display(self.link.b),
            self.link.kind.label()
        )
    }
}

/// Every link of `shape` (topology order) with each end's report, from `answers` indexed by
/// node id. A daemon's link is matched to the topology by its peer's name.
pub fn link_views<'a>(shape: &Shape, answers: &'a [Answer]) -> Vec<LinkView<'a>> {
    let mut ends: HashMap<(NodeId, NodeId), &'a LinkStatus> = HashMap::new();
    for (i, a) in answers.iter().enumerate() {
        let Ok(st) = a else { continue };
        let here = NodeId(i as u32);
        for l in &st.links {
            if let Ok(peer) = shape.parse_node(&l.peer) {
                ends.insert((here, peer), l);
            }
        }
    }
    topology::links(shape)
        .into_iter()
        .map(|link| LinkView {
            link,
            a_end: ends.get(&(link.a, link.b)).copied(),
            b_end: ends.get(&(link.b, link.a)).copied(),
        })
        .collect()
}

/// The link between two adjacent nodes, if there is one.
pub fn link_between(shape: &Shape, a: NodeId, b: NodeId) -> Option<Link> {
    topology::node_links(shape, a)
        .into_iter()
        .find(|l| l.other(a).is_some_and(|(n, _)| n == b))
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// The status a healthy daemon of `shape` would report for node `id`, every link up.
    pub(crate) fn healthy(shape: &Shape, id: NodeId) -> NodeStatus {
        let links = topology::node_links(shape, id)
            .into_iter()
            .map(|l| {
                let (peer, _) = l.other(id).unwrap();
                // Built from JSON so that fields the daemon adds later with a default do
                // not break these tests.
                serde_json::from_value::<LinkStatus>(serde_json::json!({
                    "port": l.port_of(id).unwrap().to_string(),
                    "peer": shape.display(peer),
                    "kind": l.kind.label(),
                    "gbps": l.kind.gbps(),
                    "state": "up",
                    "sessions": 1,
                    "tx_cells": 10,
                    "tx_bytes": 2560,
                    "rx_cells": 10,
                    "rx_bytes": 2560,
                    "stall_seconds": 0.0,
                    "queue_cells": 0,
                    "queue_bytes": 0,
                    "in_flight_bytes": 0,
                }))
                .unwrap()
            })
            .collect::<Vec<_>>();
        serde_json::from_value(serde_json::json!({
            "node": shape.display(id),
            "id": id.0,
            "shape": shape.to_string(),
            "pid": 4242,
            "uptime_seconds": 1.0,
            "links": links,
            "forwarded_cells": 0,
            "injected_cells": 0,
            "delivered_cells": 0,
            "load_tx_cells": 0,
            "load_rx_cells": 0,
            "load_rx_bytes": 0,
            "errors": {},
        }))
        .unwrap()
    }

    pub(crate) fn healthy_rack(shape: &Shape) -> Vec<Answer> {
        shape.node_ids().map(|id| Ok(healthy(shape, id))).collect()
    }

    #[test]
    fn all_up_when_every_end_reports_up() {
        let shape: Shape = "2x2x1".parse().unwrap();
        let answers = healthy_rack(&shape);
        let views = link_views(&shape, &answers);
        assert_eq!(views.len(), topology::links(&shape).len());
        assert!(views.iter().all(|v| v.health() == Health::Up));
    }

    #[test]
    fn one_end_down_is_half_and_unreachable_node_takes_its_links_down() {
        let shape: Shape = "1x1x1".parse().unwrap();
        let mut answers = healthy_rack(&shape);
        // F1 says its link to F2 is down: that link is half up.
        if let Ok(st) = &mut answers[0] {
            st.links
                .iter_mut()
                .find(|l| l.peer == "M1QAF2")
                .unwrap()
                .state = LinkState::Down;
        }
        // F4 does not answer: its three links are half (the other ends still say up).
        answers[3] = Err("no control socket".into());
        let views = link_views(&shape, &answers);
        let by_name: HashMap<String, Health> = views
            .iter()
            .map(|v| (v.describe(&shape), v.health()))
            .collect();
        assert_eq!(by_name["M1QAF1 <-> M1QAF2 (qfdb)"], Health::Half);
        assert_eq!(by_name["M1QAF1 <-> M1QAF3 (qfdb)"], Health::Up);
        assert_eq!(by_name["M1QAF1 <-> M1QAF4 (qfdb)"], Health::Half);
        assert_eq!(by_name["M1QAF2 <-> M1QAF3 (qfdb)"], Health::Up);
        let (up, half) = views.iter().fold((0, 0), |(u, h), v| match v.health() {
            Health::Up => (u + 1, h),
            Health::Half => (u, h + 1),
            Health::Down => (u, h),
        });
        assert_eq!((up, half), (2, 4));
        answers[0] = Err("gone".into());
        let views = link_views(&shape, &answers);
        let down = views.iter().filter(|v| v.health() == Health::Down).count();
        // F1-F4 has neither end answering.
        assert_eq!(down, 1);
    }

    #[test]
    fn peers_are_matched_case_insensitively_and_strangers_ignored() {
        let shape: Shape = "1x1x1".parse().unwrap();
        let mut answers = healthy_rack(&shape);
        if let Ok(st) = &mut answers[1] {
            for l in &mut st.links {
                l.peer = l.peer.to_ascii_lowercase();
            }
            let mut stranger = st.links[0].clone();
            stranger.peer = "M7QZF1".into();
            st.links.push(stranger);
        }
        let views = link_views(&shape, &answers);
        assert!(views.iter().all(|v| v.health() == Health::Up));
    }

    #[test]
    fn link_between_finds_torus_and_qfdb_links() {
        let shape: Shape = "4x4x2".parse().unwrap();
        let a = shape.parse_node("M1QAF1").unwrap();
        let b = shape.parse_node("M1QBF1").unwrap();
        let c = shape.parse_node("M1QBF2").unwrap();
        assert_eq!(link_between(&shape, a, b).unwrap().kind.label(), "torus_x");
        assert_eq!(link_between(&shape, c, b).unwrap().kind.label(), "qfdb");
        assert!(link_between(&shape, a, c).is_none());
    }
}
