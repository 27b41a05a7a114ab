//! A node's part in a consistent cut of the rack (Chandy and Lamport's snapshot), from
//! which the [`Coordinator`](crate::horizon::Coordinator) computes link horizons for
//! daemons that each see only themselves (see [`crate::horizon`]).
//!
//! A node begins cut `epoch` when the coordinator tells it to, with the ports whose
//! neighbours are in the cut (a cut is of the nodes that may matter: see
//! [`crate::horizon::Coordinator`]). It then records what it holds (the earliest key it
//! has for each output, what its NI may inject, its outputs' timelines) and sends a marker,
//! behind every cell it sent before, to each of those neighbours and on each link it sent
//! cells on since its last part. On each link to a neighbour in the cut it then records
//! the heads of the cells that come in until that link's marker does: those were on the
//! link at the cut (a marker that came before the node began means what came before it is
//! in the node's part). Its part is complete when each of those links has answered with a
//! marker, or went down (what was on a link that went down is lost with it).

use crate::horizon::{NodeCut, PortCut, OUTLOOK_INTERVALS};
use crate::time::ModelTime;
use crate::topology::{Port, NPORTS};

/// A node's progress through the latest cut it began.
#[derive(Debug, Default)]
pub(crate) struct Cut {
    /// The latest epoch begun (0: none).
    epoch: u64,
    /// Links whose marker is still to come in.
    waiting: [bool; NPORTS],
    /// The ports whose marker the cut under way waits for (the coordinator's `waits`).
    waits: u16,
    /// The latest epoch whose marker came in on each port: a node begins a cut only when
    /// the coordinator tells it (it must know which neighbours are in it), so a marker may
    /// come first, and what came before it on that link is then in the node's part.
    seen: [u64; NPORTS],
    /// The part being recorded; taken once complete.
    part: Option<NodeCut>,
    /// The part complete and not yet taken.
    done: Option<NodeCut>,
}

/// What a node holds at the moment it begins a cut.
pub(crate) struct Holdings {
    pub busy: bool,
    pub relays: bool,
    /// Each link port as the part reports it (nothing on its link yet).
    pub ports: Vec<PortCut>,
    /// Nothing held and its programs promise nothing before the attach floor.
    pub quiet: bool,
    /// Ports it sent cells on since its previous part.
    pub sent: u16,
}

impl Cut {
    /// The latest epoch begun.
    pub(crate) fn epoch(&self) -> u64 {
        self.epoch
    }

    /// Begins `epoch` with what the node holds, waiting for a marker on each port of `up`
    /// that `waits` names (bit per port index) and whose marker of `epoch` has not come
    /// yet. False when `epoch` is not newer than the latest begun (a repeated order).
    pub(crate) fn begin(&mut self, epoch: u64, held: Holdings, up: &[Port], waits: u16) -> bool {
        if epoch <= self.epoch {
            return false;
        }
        self.epoch = epoch;
        self.waits = waits;
        self.waiting = [false; NPORTS];
        for p in up {
            let i = p.index();
            self.waiting[i] = waits & (1 << i) != 0 && self.seen[i] < epoch;
        }
        let ports = held.ports;
        // A part of an older cut not taken is of no use any more.
        self.done = None;
        self.part = Some(NodeCut {
            epoch,
            busy: held.busy,
            relays: held.relays,
            ports,
            quiet: held.quiet,
            sent: held.sent,
        });
        self.settle();
        true
    }

    /// A cell with `head` came in on `port`.
    pub(crate) fn cell(&mut self, port: Port, head: ModelTime) {
        if !self.waiting[port.index()] {
            return;
        }
        if let Some(p) = self
            .part
            .as_mut()
            .and_then(|c| c.ports.iter_mut().find(|p| p.port == port))
        {
            p.on_link = p.on_link.min(head);
        }
    }

    /// The marker of `epoch` came in on `port`, before or after the node began `epoch`.
    /// A marker of an older cut answers nothing.
    pub(crate) fn marker(&mut self, port: Port, epoch: u64) {
        let seen = &mut self.seen[port.index()];
        *seen = (*seen).max(epoch);
        if epoch == self.epoch {
            self.waiting[port.index()] = false;
            self.settle();
        }
    }

    /// A new session on `port` (after its hello): the latest epoch begun, whose marker
    /// goes first on it (nothing was sent on it before), so that a peer waiting for this
    /// link's marker gets one whatever happened to the old session. With a part under way,
    /// the peer's marker on it is awaited in turn: cells the peer sent before its own part
    /// began may travel on the new session.
    pub(crate) fn session_up(&mut self, port: Port) -> Option<u64> {
        if self.epoch == 0 {
            return None;
        }
        if self.part.is_some() && self.waits & (1 << port.index()) != 0 {
            self.waiting[port.index()] = true;
        }
        Some(self.epoch)
    }

    /// The link on `port` went down: its marker will not come.
    pub(crate) fn link_down(&mut self, port: Port) {
        self.waiting[port.index()] = false;
        self.settle();
    }

    fn settle(&mut self) {
        if self.waiting.iter().all(|w| !w) {
            if let Some(mut p) = self.part.take() {
                // A cell that was on a link at the cut is the node's by now: not quiet
                // (its sender's next part would not say it sent it).
                p.quiet &= p.ports.iter().all(|c| c.on_link == ModelTime::NEVER);
                self.done = Some(p);
            }
        }
    }

    /// The node's part of the latest cut, once complete.
    pub(crate) fn take(&mut self) -> Option<NodeCut> {
        self.done.take()
    }
}

/// The outlook of each of a switch's link outputs, from the earliest key it may still
/// forward (see [`crate::horizon`]).
pub(crate) fn holdings(node: &crate::node::Node, ports: &[Port], sent: u16) -> Holdings {
    let sw = node.switch();
    let from = sw.earliest_key();
    let busy = node.busy();
    Holdings {
        busy,
        quiet: !busy && node.ni().promises_nothing_before_floor(),
        sent,
        relays: sw.ni_relays(),
        ports: ports
            .iter()
            .map(|&port| PortCut {
                port,
                toward: sw.earliest_toward(port),
                ni: sw.ni_toward(port),
                on_link: ModelTime::NEVER,
                to_ni: sw.earliest_to_ni(port),
                outlook: sw.outlook(port, from, OUTLOOK_INTERVALS),
            })
            .collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::horizon::Outlook;

    fn held() -> Holdings {
        Holdings {
            busy: true,
            relays: false,
            quiet: false,
            sent: 0,
            ports: vec![
                PortCut {
                    port: Port::Qfdb(1),
                    toward: ModelTime(7),
                    ni: ModelTime(5),
                    on_link: ModelTime::NEVER,
                    to_ni: ModelTime::NEVER,
                    outlook: Outlook::default(),
                },
                PortCut {
                    port: Port::Qfdb(2),
                    toward: ModelTime::NEVER,
                    ni: ModelTime(6),
                    on_link: ModelTime::NEVER,
                    to_ni: ModelTime(9),
                    outlook: Outlook::default(),
                },
            ],
        }
    }

    /// Every port waited for.
    const ALL: u16 = u16::MAX;

    /// A cut waits only for the neighbours in it, and not for a marker that came before
    /// the node began the cut (what came before it on that link is in the node's part).
    #[test]
    fn a_part_waits_for_the_markers_of_the_cut_it_was_told_of() {
        let mut c = Cut::default();
        c.marker(Port::Qfdb(2), 5);
        let only_1 = 1 << Port::Qfdb(1).index();
        assert!(c.begin(
            5,
            held(),
            &[Port::Qfdb(1), Port::Qfdb(2)],
            only_1 | 1 << Port::Qfdb(2).index()
        ));
        assert!(c.take().is_none(), "port 1's marker is still to come");
        c.marker(Port::Qfdb(1), 5);
        assert_eq!(c.take().map(|p| p.epoch), Some(5));
        // A neighbour not in the cut is not waited for, on a new session either.
        assert!(c.begin(6, held(), &[Port::Qfdb(1), Port::Qfdb(2)], only_1));
        assert_eq!(c.session_up(Port::Qfdb(2)), Some(6));
        c.marker(Port::Qfdb(1), 6);
        assert_eq!(c.take().map(|p| p.epoch), Some(6));
    }

    #[test]
    fn a_part_records_what_came_in_on_each_link_until_its_marker() {
        let mut c = Cut::default();
        assert!(c.begin(1, held(), &[Port::Qfdb(1), Port::Qfdb(2)], ALL));
        c.cell(Port::Qfdb(1), ModelTime(40));
        c.cell(Port::Qfdb(1), ModelTime(30));
        c.marker(Port::Qfdb(1), 1);
        // After its marker, a cell on the link is not of this cut.
        c.cell(Port::Qfdb(1), ModelTime(3));
        c.cell(Port::Qfdb(2), ModelTime(50));
        assert!(
            c.take().is_none(),
            "the second link's marker is still to come"
        );
        c.marker(Port::Qfdb(2), 1);
        let part = c.take().expect("complete");
        assert_eq!(part.epoch, 1);
        assert_eq!(part.ports[0].ni, ModelTime(5));
        assert_eq!(part.ports[0].on_link, ModelTime(30));
        assert_eq!(part.ports[0].toward, ModelTime(7));
        assert_eq!(part.ports[1].on_link, ModelTime(50));
        assert!(c.take().is_none(), "taken once");
    }

    #[test]
    fn old_epochs_and_links_that_go_down_do_not_hold_a_cut() {
        let mut c = Cut::default();
        assert!(c.begin(2, held(), &[Port::Qfdb(1), Port::Qfdb(2)], ALL));
        assert!(!c.begin(2, held(), &[], ALL), "an epoch is begun once");
        assert!(!c.begin(1, held(), &[], ALL), "an older epoch is not begun");
        c.marker(Port::Qfdb(1), 1);
        c.link_down(Port::Qfdb(2));
        assert!(c.take().is_none(), "an older marker does not answer");
        c.marker(Port::Qfdb(1), 2);
        assert_eq!(c.take().map(|p| p.epoch), Some(2));
        // A session that comes up while a part is under way is waited for, and gets the
        // marker of the latest epoch either way.
        assert!(c.begin(3, held(), &[Port::Qfdb(1)], ALL));
        assert_eq!(c.session_up(Port::Qfdb(2)), Some(3));
        c.marker(Port::Qfdb(1), 3);
        assert!(
            c.take().is_none(),
            "the new session's marker is still to come"
        );
        c.marker(Port::Qfdb(2), 3);
        assert_eq!(c.take().map(|p| p.epoch), Some(3));
        assert_eq!(
            c.session_up(Port::Qfdb(2)),
            Some(3),
            "complete: marker, no wait"
        );
        // A node with no link up has its part at once.
        assert!(c.begin(4, held(), &[], ALL));
        assert_eq!(c.take().map(|p| p.epoch), Some(4));
    }
}
