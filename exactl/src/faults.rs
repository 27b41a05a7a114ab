//! `exactl link set|clear|show`, `exactl partition` and `exactl heal`: faults on the
//! rack's links, set on the daemons at each end (each end shapes what it sends).
//!
//! `link set` changes only the faults it is given and keeps the others, like `tc qdisc
//! change`: the current setting is read from the daemons first. Everything is checked
//! (nodes, adjacency, units, flag combinations) before any daemon is asked, so a bad
//! command changes nothing.

use std::collections::BTreeSet;
use std::fmt::Write as _;
use std::path::Path;
use std::time::Duration;

use exanet_control::control::{LinkStatus, NodeStatus, Request, Response};
use exanet_control::control_client::ControlClient;
use exanet_control::rack::Rack;
use exanet_proto::fault::{FaultKind, FaultUnit, FaultUnitMismatch, FaultValue, LinkFaults};
use exanet_proto::{NodeId, NodeName, Shape};
use serde_json::json;

use crate::error::{CliError, Result};
use crate::fabric;
use crate::live::RackLiveness;
use crate::table::{Column, Table};
use crate::units::{fault_words as words_of, one_of};

/// How long a daemon may take to answer.
const TIMEOUT: Duration = Duration::from_secs(3);

/// Which directions of a link a change applies to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Dir {
    Both,
    /// From the first node named to the second.
    AtoB,
    BtoA,
}

impl Dir {
    /// `both`, or `A-B` / `B-A` spelled with the node names (any case) or literally.
    pub fn parse(s: &str, a: &str, b: &str) -> Result<Dir> {
        let t = s.trim().to_ascii_uppercase();
        let (a, b) = (a.to_ascii_uppercase(), b.to_ascii_uppercase());
        if t == "BOTH" {
            Ok(Dir::Both)
        } else if t == "A-B" || t == format!("{a}-{b}") {
            Ok(Dir::AtoB)
        } else if t == "B-A" || t == format!("{b}-{a}") {
            Ok(Dir::BtoA)
        } else {
            Err(CliError::BadValue {
                what: "--dir",
                value: s.to_string(),
                message: format!("use both, {a}-{b} or {b}-{a}"),
            })
        }
    }
}

/// The faults a command changes, by kind; a kind not named keeps what is set.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct FaultChange([Option<FaultValue>; FaultKind::COUNT]);

impl FaultChange {
    /// This change, also setting `kind` to `value` (a value of another unit than the
    /// kind's is refused, so [`apply`](Self::apply) never meets one).
    pub fn with(
        mut self,
        kind: FaultKind,
        value: FaultValue,
    ) -> std::result::Result<FaultChange, FaultUnitMismatch> {
        if value.unit() != kind.unit() {
            return Err(FaultUnitMismatch {
                kind,
                want: kind.unit(),
                got: value,
            });
        }
        self.0[kind.index()] = Some(value);
        Ok(self)
    }

    /// A change of `kind` alone.
    pub fn one(
        kind: FaultKind,
        value: FaultValue,
    ) -> std::result::Result<FaultChange, FaultUnitMismatch> {
        FaultChange::default().with(kind, value)
    }

    pub fn get(&self, kind: FaultKind) -> Option<FaultValue> {
        self.0[kind.index()]
    }

    /// The kinds it changes with their new values, in table order.
    pub fn iter(&self) -> impl Iterator<Item = (FaultKind, FaultValue)> + '_ {
        FaultKind::ALL
            .iter()
            .filter_map(|k| self.get(*k).map(|v| (*k, v)))
    }

    pub fn is_empty(&self) -> bool {
        *self == FaultChange::default()
    }

    pub fn apply(&self, mut f: LinkFaults) -> LinkFaults {
        for (k, v) in self.iter() {
            // `with` let only values of the kind's unit in, so this cannot fail.
            let _ = k.set(&mut f, v);
        }
        f
    }
}

/// The fault flags of `exactl link set`, one per [`FaultKind`] (and one more for a kind
/// with an off flag), so a kind added to the table is a flag without a change here.
/// Rates refuse `0`/`off` (use `--no-rate`), so a typo never unshapes a link.
#[derive(Debug, Default)]
pub struct FaultFlags(pub FaultChange);

impl clap::FromArgMatches for FaultFlags {
    fn from_arg_matches(m: &clap::ArgMatches) -> std::result::Result<Self, clap::Error> {
        let mut change = FaultChange::default();
        for k in FaultKind::ALL {
            let off = k
                .off_flag()
                .is_some_and(|(off, _)| m.get_flag(off))
                .then_some(match k.unit() {
                    FaultUnit::Duration => FaultValue::Duration(0),
                    FaultUnit::Rate => FaultValue::Rate(0),
                    FaultUnit::Probability => FaultValue::Probability(0.0),
                    FaultUnit::Switch => FaultValue::Switch(false),
                });
            let on = match k.unit() {
                FaultUnit::Switch => m.get_flag(k.name()).then_some(FaultValue::Switch(true)),
                _ => m.get_one::<FaultValue>(k.name()).copied(),
            };
            if let Some(v) = on.or(off) {
                change = change.with(*k, v).map_err(|e| {
                    clap::Error::raw(clap::error::ErrorKind::ValueValidation, e.to_string())
                })?;
            }
        }
        Ok(FaultFlags(change))
    }

    fn update_from_arg_matches(
        &mut self,
        m: &clap::ArgMatches,
    ) -> std::result::Result<(), clap::Error> {
        *self = Self::from_arg_matches(m)?;
        Ok(())
    }
}

impl clap::Args for FaultFlags {
    fn augment_args(mut cmd: clap::Command) -> clap::Command {
        use clap::{Arg, ArgAction};
        for k in FaultKind::ALL {
            let unit = k.unit();
            let mut arg = Arg::new(k.name()).long(k.name()).help(k.help());
            arg = match unit {
                FaultUnit::Switch => arg.action(ArgAction::SetTrue),
                _ => arg
                    .value_name(crate::units::value_name(unit))
                    .value_parser(move |s: &str| crate::units::parse_fault(unit, s))
                    .allow_hyphen_values(true),
            };
            if let Some((off, help)) = k.off_flag() {
                cmd = cmd.arg(arg.conflicts_with(off));
                cmd = cmd.arg(
                    Arg::new(off)
                        .long(off)
                        .help(help)
                        .action(ArgAction::SetTrue),
                );
            } else {
                cmd = cmd.arg(arg);
            }
        }
        cmd
    }

    fn augment_args_for_update(cmd: clap::Command) -> clap::Command {
        Self::augment_args(cmd)
    }
}

/// One direction of a link: faults set at `from` on what it sends to `to`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Direction {
    pub from: NodeId,
    pub to: NodeId,
}

/// Resolves two node names to an existing link's directions.
pub fn directions(shape: &Shape, a: NodeName, b: NodeName, dir: Dir) -> Result<Vec<Direction>> {
    let (ia, ib) = (shape.id_of(a)?, shape.id_of(b)?);
    if ia == ib {
        return Err(CliError::Usage(format!(
            "{} names the same node twice; a link joins two nodes",
            shape.display(ia)
        )));
    }
    if fabric::link_between(shape, ia, ib).is_none() {
        return Err(CliError::Usage(format!(
            "{} and {} are not linked (`exactl status` lists the links)",
            shape.display(ia),
            shape.display(ib)
        )));
    }
    let ab = Direction { from: ia, to: ib };
    let ba = Direction { from: ib, to: ia };
    Ok(match dir {
        Dir::Both => vec![ab, ba],
        Dir::AtoB => vec![ab],
        Dir::BtoA => vec![ba],
    })
}

/// The faults each daemon reports for its end, by direction (what `link set` merges
/// with, and what a fault plan restores).
pub fn current_faults(
    client: &ControlClient,
    dirs: &[Direction],
) -> Result<Vec<(Direction, LinkFaults)>> {
    let shape = client.rack().shape();
    let senders: Vec<NodeId> = dirs
        .iter()
        .map(|d| d.from)
        .collect::<BTreeSet<_>>()
        .into_iter()
        .collect();
    let reqs = senders.iter().map(|n| (*n, Request::Status)).collect();
    let mut answers = crate::control::request_live(client, reqs, TIMEOUT);
    let mut out = Vec::new();
    for d in dirs {
        let i = senders.iter().position(|n| *n == d.from).unwrap_or(0);
        let st = match answers.get(i) {
            Some(Ok(Response::Status(st))) => st,
            Some(Ok(Response::Error { message })) => {
                return Err(CliError::Refused {
                    node: shape.display(d.from),
                    message: message.clone(),
                })
            }
            Some(Ok(other)) => {
                return Err(CliError::Unexpected {
                    node: shape.display(d.from),
                    request: "status",
                    answer: format!("{other:?}"),
                })
            }
            Some(Err(_)) => {
                return Err(match answers.swap_remove(i) {
                    Err(CliError::Control { node, source }) => CliError::Failed(format!(
                        "{node}: {}",
                        fabric::short_control_error(&source)
                    )),
                    Err(e) => e,
                    Ok(_) => CliError::Failed(format!("{}: no answer", shape.display(d.from))),
                })
            }
            None => return Err(CliError::Failed("no answer".into())),
        };
        let faults = link_of(st, &shape.display(d.to)).and_then(|l| l.faults);
        out.push((*d, faults.unwrap_or_default()));
    }
    Ok(out)
}

fn link_of<'a>(st: &'a NodeStatus, peer: &str) -> Option<&'a LinkStatus> {
    st.links.iter().find(|l| l.peer.eq_ignore_ascii_case(peer))
}

/// Applies `change` to each direction (merged with what is set there) and checks the
/// result before asking any daemon. `seed` restarts the fault draws at every end.
pub fn change_links(
    client: &ControlClient,
    dirs: &[Direction],
    change: &FaultChange,
    seed: Option<u64>,
) -> Result<()> {
    let merged = current_faults(client, dirs)?
        .into_iter()
        .map(|(d, now)| (d, change.apply(now)))
        .collect();
    set_faults(client, merged, seed)
}

/// Sets exactly these faults on these directions (no merge), after checking them all.
/// `seed` restarts the fault draws, differently for each direction.
pub fn set_faults(
    client: &ControlClient,
    settings: Vec<(Direction, LinkFaults)>,
    seed: Option<u64>,
) -> Result<()> {
    let shape = client.rack().shape();
    let mut reqs = Vec::with_capacity(settings.len());
    for (d, faults) in settings {
        faults
            .validate()
            .map_err(|e| CliError::Usage(e.to_string()))?;
        reqs.push((
            d.from,
            Request::LinkSet {
                peer: shape.display(d.to),
                faults,
                seed: seed.map(|s| s ^ (u64::from(d.from.0) << 32 | u64::from(d.to.0))),
            },
        ));
    }
    crate::control::all_ok(client, reqs, TIMEOUT, "link_set")
}

/// `exactl link set`.
pub fn set(dir: &Path, a: NodeName, b: NodeName, which: &str, change: &FaultChange) -> Result<()> {
    let rack = Rack::load(dir)?;
    let shape = rack.shape();
    let which = Dir::parse(
        which,
        &shape.display(shape.id_of(a)?),
        &shape.display(shape.id_of(b)?),
    )?;
    if change.is_empty() {
        let flags: Vec<String> = FaultKind::ALL
            .iter()
            .flat_map(|k| {
                let off = (k.unit() == FaultUnit::Switch)
                    .then(|| k.off_flag().map(|(off, _)| format!("--{off}")))
                    .flatten();
                std::iter::once(format!("--{}", k.name())).chain(off)
            })
            .collect();
        return Err(CliError::Usage(format!(
            "nothing to set: give {}",
            one_of(&flags)
        )));
    }
    if let Some((k, _)) = change.iter().find(|(k, _)| k.unit() == FaultUnit::Switch) {
        if which != Dir::Both {
            let off = k
                .off_flag()
                .map_or(String::new(), |(o, _)| format!(" and --{o}"));
            return Err(CliError::Usage(format!(
                "--{}{off} cut or restore the whole link; they cannot take --dir",
                k.name()
            )));
        }
    }
    // Values out of the injector's range are wrong whatever is set already (whether
    // settings that need each other are all there is known only once merged).
    change
        .apply(LinkFaults::default())
        .validate_values()
        .map_err(|e| CliError::Usage(e.to_string()))?;
    let dirs = directions(&shape, a, b, which)?;
    let client = crate::control::client(&rack)?;
    let after: Vec<(Direction, LinkFaults)> = current_faults(&client, &dirs)?
        .into_iter()
        .map(|(d, now)| (d, change.apply(now)))
        .collect();
    set_faults(&client, after.clone(), None)?;
    crate::stdout::outln!("{}", set_line(&shape, &dirs, change, &after));
    Ok(())
}

/// What `link set` changed, in one line: `M1QAF1 -> M1QAF2: delay 200us, loss 1% (both
/// directions)`, and what else stays in force on the link when it kept other faults.
pub fn set_line(
    shape: &Shape,
    dirs: &[Direction],
    change: &FaultChange,
    after: &[(Direction, LinkFaults)],
) -> String {
    let Some(first) = dirs.first() else {
        return String::new();
    };
    let scope = if dirs.len() > 1 {
        "both directions"
    } else {
        "this direction only"
    };
    let mut line = format!(
        "{} -> {}: {} ({scope})",
        shape.display(first.from),
        shape.display(first.to),
        describe_change(change)
    );
    // Faults the command did not name and that stay set.
    let named_only = change.apply(LinkFaults::default());
    if after.iter().any(|(_, f)| *f != named_only) {
        let _ = write!(line, "; in force now: {}", in_force(shape, after));
    }
    line
}

/// `delay 200us, loss 1%` when every direction has the same faults, else each direction's.
fn in_force(shape: &Shape, faults: &[(Direction, LinkFaults)]) -> String {
    let words = |f: &LinkFaults| {
        let w = fault_words(f);
        if w.is_empty() {
            "none".to_string()
        } else {
            w.join(", ")
        }
    };
    match faults {
        [(_, f), rest @ ..] if rest.iter().all(|(_, g)| g == f) => words(f),
        _ => faults
            .iter()
            .map(|(d, f)| {
                format!(
                    "{}->{} {}",
                    shape.display(d.from),
                    shape.display(d.to),
                    words(f)
                )
            })
            .collect::<Vec<_>>()
            .join("; "),
    }
}

/// `delay 1ms, loss 5%`: the changed faults in `exactl link set` words.
pub fn describe_change(c: &FaultChange) -> String {
    c.iter()
        .map(|(k, v)| words_of(k, v))
        .collect::<Vec<_>>()
        .join(", ")
}

/// `exactl link clear A B` (or every link with `all`).
pub fn clear(dir: &Path, ends: Option<(NodeName, NodeName)>) -> Result<()> {
    let rack = Rack::load(dir)?;
    let shape = rack.shape();
    let client = crate::control::client(&rack)?;
    match ends {
        Some((a, b)) => {
            let dirs = directions(&shape, a, b, Dir::Both)?;
            // What was set, for the report; an end that cannot say is still cleared
            // where it can be (and its failure is the error).
            let before = current_faults(&client, &dirs).ok();
            let clear = dirs.iter().map(|d| (*d, LinkFaults::default()));
            set_faults(&client, clear.collect(), None)?;
            let was = match before {
                Some(b) if b.iter().all(|(_, f)| f.is_clear()) => "nothing was set".to_string(),
                Some(b) => format!("removed {}", in_force(&shape, &b)),
                None => "what was set is unknown".to_string(),
            };
            crate::stdout::outln!(
                "{} -> {}: faults cleared, {was} (both directions)",
                shape.display(dirs[0].from),
                shape.display(dirs[0].to)
            );
            Ok(())
        }
        None => {
            let reqs = shape
                .node_ids()
                .map(|id| (id, Request::LinkClear))
                .collect();
            crate::control::all_ok(&client, reqs, TIMEOUT, "link_clear")?;
            crate::stdout::outln!(
                "every link: faults cleared at all {} nodes (cut links are up again)",
                shape.nodes()
            );
            Ok(())
        }
    }
}

/// Every direction of every link (from each node's own report).
struct Row<'a> {
    from: String,
    l: &'a LinkStatus,
}

/// `exactl link show`.
pub fn show(dir: &Path, as_json: bool, all: bool) -> Result<()> {
    let rack = Rack::load(dir)?;
    let live = RackLiveness::of(&rack);
    if live.all_gone() && !as_json {
        return Err(crate::live::not_running(&rack));
    }
    let shape = rack.shape();
    let answers: Vec<fabric::Answer> = if live.all_gone() {
        shape
            .node_ids()
            .map(|id| Err(live.message(id).unwrap_or_default()))
            .collect()
    } else {
        let client = crate::control::client(&rack)?;
        fabric::query_live(&client, &live, TIMEOUT)
    };
    let mut rows = Vec::new();
    let mut silent = Vec::new();
    for (id, a) in shape.node_ids().zip(&answers) {
        match a {
            Ok(st) => {
                for l in &st.links {
                    let touched = l.faults.is_some()
                        || l.admin_down
                        || l.fault_stats != Default::default()
                        || l.counters.rx_corrupt_cells != 0;
                    if all || touched {
                        rows.push(Row {
                            from: st.node.clone(),
                            l,
                        });
                    }
                }
            }
            Err(e) => silent.push(format!("{}: {e}", shape.display(id))),
        }
    }
    if as_json {
        let v: Vec<_> = rows
            .iter()
            .map(|r| {
                json!({
                    "from": r.from, "to": r.l.peer, "port": r.l.port, "kind": r.l.kind,
                    "state": r.l.state, "admin_down": r.l.admin_down,
                    "faults": r.l.faults, "fault_stats": r.l.fault_stats,
                    "held_bytes": r.l.held_bytes, "rx_corrupt_cells": r.l.counters.rx_corrupt_cells,
                })
            })
            .collect();
        crate::stdout::outln!(
            "{}",
            serde_json::to_string_pretty(&json!({ "links": v, "unanswered": silent }))
                .map_err(|e| CliError::Failed(e.to_string()))?
        );
    } else {
        crate::stdout::out!(
            "{}",
            render(&rows, answers.len() - silent.len(), answers.len())
        );
    }
    if live.all_gone() {
        return Err(crate::live::not_running(&rack));
    }
    match silent.len() {
        0 => Ok(()),
        n if n == answers.len() => Err(CliError::Failed(format!(
            "no daemon of the rack at {} answers, so no link could be shown (is it up? \
             `exactl rack up` starts it): {}",
            dir.display(),
            silent[0]
        ))),
        n => Err(CliError::Failed(format!(
            "{n} of {} nodes did not answer, so their ends of links are not shown: {}{}",
            answers.len(),
            silent[..n.min(3)].join("; "),
            if n > 3 { "; ..." } else { "" }
        ))),
    }
}

/// The faults of one direction in the words of the command line.
pub fn describe(f: &LinkFaults) -> String {
    let parts = fault_words(f);
    if parts.is_empty() {
        "-".into()
    } else {
        parts.join(" ")
    }
}

/// `["down", "delay 200us", "loss 0.1%"]`: each fault set, in command-line words; a
/// cut first, since it overrides the rest.
fn fault_words(f: &LinkFaults) -> Vec<String> {
    let (switches, values): (Vec<FaultKind>, Vec<FaultKind>) = FaultKind::ALL
        .iter()
        .partition(|k| k.unit() == FaultUnit::Switch);
    switches
        .into_iter()
        .chain(values)
        .map(|k| (k, k.get(f)))
        .filter(|(_, v)| !v.is_clear())
        .map(|(k, v)| words_of(k, v))
        .collect()
}

/// The table of `link show`: `answered` of `nodes` nodes reported the rows. Columns are
/// as wide as their widest cell (at least as wide as they always were), so long fault
/// text does not push the counters out of line.
fn render(rows: &[Row<'_>], answered: usize, nodes: usize) -> String {
    let mut out = String::new();
    if rows.is_empty() {
        if answered == nodes {
            out.push_str(
                "no link has faults set or injected (`exactl link show --all` lists every link)\n",
            );
        } else if answered > 0 {
            let _ = writeln!(
                out,
                "no link end at the {answered} of {nodes} nodes that answered has faults set \
                 or injected (the others could not be asked)"
            );
        }
        return out;
    }
    let counted: Vec<FaultKind> = FaultKind::ALL
        .iter()
        .copied()
        .filter(|k| k.counter().is_some())
        .collect();
    let mut columns = vec![
        Column::left("LINK").min(16),
        Column::left("STATE").min(5),
        Column::left("FAULTS").min(40),
    ];
    columns.extend(
        counted
            .iter()
            .filter_map(|k| Some(Column::right(k.counter_header()?).min(9))),
    );
    columns.extend([
        Column::right("DELAYED").min(9),
        Column::right("HELD").min(9),
        Column::right("RX_BAD").min(9),
    ]);
    let cells = rows.iter().map(|r| {
        let f = r.l.faults.unwrap_or_default();
        let st = r.l.fault_stats;
        let mut row = vec![
            format!("{}->{}", r.from, r.l.peer),
            match (r.l.admin_down, r.l.state) {
                (true, _) => "cut",
                (false, exanet_control::control::LinkState::Up) => "up",
                (false, exanet_control::control::LinkState::Down) => "down",
            }
            .to_string(),
            describe(&f),
        ];
        row.extend(counted.iter().map(|&k| st.cells(k).to_string()));
        row.extend([
            st.delayed_frames.to_string(),
            r.l.held_bytes.to_string(),
            r.l.counters.rx_corrupt_cells.to_string(),
        ]);
        row
    });
    out.push_str(&Table::new(columns).rows(cells).render());
    out
}

/// Parses a node list (`M1QAF1 M1QAF2,M1QBF1`) into distinct ids.
fn node_set(shape: &Shape, names: &[String]) -> Result<BTreeSet<NodeId>> {
    let mut out = BTreeSet::new();
    for n in names
        .iter()
        .flat_map(|s| s.split(','))
        .filter(|s| !s.is_empty())
    {
        out.insert(shape.parse_node(n)?);
    }
    Ok(out)
}

/// The links cut by a partition of `side` from `from` (every other node if empty).
pub fn partition_directions(
    shape: &Shape,
    side: &[String],
    from: &[String],
) -> Result<Vec<Direction>> {
    let a = node_set(shape, side)?;
    if a.is_empty() {
        return Err(CliError::Usage("partition: name at least one node".into()));
    }
    let b: BTreeSet<NodeId> = if from.is_empty() {
        shape.node_ids().filter(|n| !a.contains(n)).collect()
    } else {
        node_set(shape, from)?
    };
    if let Some(both) = a.intersection(&b).next() {
        return Err(CliError::Usage(format!(
            "{} is on both sides of the partition",
            shape.display(*both)
        )));
    }
    let mut dirs = Vec::new();
    for l in exanet_proto::topology::links(shape) {
        let crosses =
            (a.contains(&l.a) && b.contains(&l.b)) || (a.contains(&l.b) && b.contains(&l.a));
        if crosses {
            dirs.push(Direction { from: l.a, to: l.b });
            dirs.push(Direction { from: l.b, to: l.a });
        }
    }
    if dirs.is_empty() {
        return Err(CliError::Usage(
            "no link joins the two sides: nothing to cut (routing is static, so a partition \
             cuts the links between the sets, not the paths through other nodes)"
                .into(),
        ));
    }
    Ok(dirs)
}

/// `exactl partition NODES... [--from NODES...]`.
pub fn partition(dir: &Path, side: &[String], from: &[String]) -> Result<()> {
    let rack = Rack::load(dir)?;
    let shape = rack.shape();
    let dirs = partition_directions(&shape, side, from)?;
    let client = crate::control::client(&rack)?;
    change_links(
        &client,
        &dirs,
        &FaultChange::one(FaultKind::Down, FaultValue::Switch(true))?,
        None,
    )?;
    let upper = |v: &[String]| v.join(",").to_ascii_uppercase();
    let other = if from.is_empty() {
        "the rest of the rack".to_string()
    } else {
        upper(from)
    };
    crate::stdout::outln!(
        "cut {} between {} and {other}: {}",
        links_phrase(dirs.len() / 2),
        upper(side),
        link_list(&shape, &dirs)
    );
    Ok(())
}

/// `1 link`, `3 links`.
fn links_phrase(n: usize) -> String {
    format!("{n} link{}", if n == 1 { "" } else { "s" })
}

/// `M1QAF1<->M1QAF4, M1QAF2<->M1QAF4` (each link once; the first 6, then how many more).
fn link_list(shape: &Shape, dirs: &[Direction]) -> String {
    let links: BTreeSet<(NodeId, NodeId)> = dirs
        .iter()
        .map(|d| (d.from.min(d.to), d.from.max(d.to)))
        .collect();
    let mut names: Vec<String> = links
        .iter()
        .take(6)
        .map(|(a, b)| format!("{}<->{}", shape.display(*a), shape.display(*b)))
        .collect();
    if links.len() > 6 {
        names.push(format!("and {} more", links.len() - 6));
    }
    names.join(", ")
}

/// `exactl heal`: sets every cut link up again, keeping its other faults.
pub fn heal(dir: &Path) -> Result<()> {
    let rack = Rack::load(dir)?;
    let shape = rack.shape();
    let client = crate::control::client(&rack)?;
    let answers = fabric::query_all(&client, TIMEOUT);
    let mut up = Vec::new();
    for (id, a) in shape.node_ids().zip(&answers) {
        let Ok(st) = a else { continue };
        for l in st.links.iter().filter(|l| l.admin_down) {
            let Ok(peer) = shape.parse_node(&l.peer) else {
                continue;
            };
            let mut faults = l.faults.unwrap_or_default();
            faults.down = false;
            up.push((Direction { from: id, to: peer }, faults));
        }
    }
    let dirs: Vec<Direction> = up.iter().map(|(d, _)| *d).collect();
    set_faults(&client, up, None)?;
    let unanswered = answers.iter().filter(|a| a.is_err()).count();
    if dirs.is_empty() {
        crate::stdout::outln!("no link was cut: nothing to heal");
    } else {
        let links: BTreeSet<(NodeId, NodeId)> = dirs
            .iter()
            .map(|d| (d.from.min(d.to), d.from.max(d.to)))
            .collect();
        crate::stdout::outln!(
            "healed {}: {} (their other faults stay)",
            links_phrase(links.len()),
            link_list(&shape, &dirs)
        );
    }
    if unanswered > 0 {
        return Err(CliError::Failed(format!(
            "{unanswered} nodes did not answer; links they cut stay cut"
        )));
    }
    Ok(())
}

#[cfg(test)]
pub(crate) fn change_of(values: &[(FaultKind, FaultValue)]) -> FaultChange {
    values
        .iter()
        .fold(FaultChange::default(), |c, (k, v)| c.with(*k, *v).unwrap())
}

#[cfg(test)]
mod tests {
    use super::*;
    use FaultKind::{Delay, Down, Loss, Rate};

    fn shape() -> Shape {
        "2x2x1".parse().unwrap()
    }

    fn n(s: &str) -> NodeName {
        s.parse().unwrap()
    }

    #[test]
    fn dir_accepts_both_letters_and_names() {
        assert_eq!(Dir::parse("both", "M1QAF1", "M1QAF2").unwrap(), Dir::Both);
        assert_eq!(Dir::parse("A-B", "M1QAF1", "M1QAF2").unwrap(), Dir::AtoB);
        assert_eq!(
            Dir::parse("m1qaf2-m1qaf1", "M1QAF1", "M1QAF2").unwrap(),
            Dir::BtoA
        );
        let e = Dir::parse("up", "M1QAF1", "M1QAF2").unwrap_err();
        assert_eq!(e.exit_code(), 2);
        assert!(e.to_string().contains("M1QAF1-M1QAF2"), "{e}");
    }

    #[test]
    fn directions_need_a_real_link() {
        let s = shape();
        let d = directions(&s, n("M1QAF1"), n("M1QAF2"), Dir::Both).unwrap();
        assert_eq!(d.len(), 2);
        assert_eq!(d[0].from, d[1].to);
        let e = directions(&s, n("M1QAF1"), n("M1QAF1"), Dir::Both).unwrap_err();
        assert!(e.to_string().contains("same node"), "{e}");
        // F2 of QFDB A and F3 of QFDB B are on different boards and not torus neighbours.
        let e = directions(&s, n("M1QAF2"), n("M1QBF3"), Dir::Both).unwrap_err();
        assert!(e.to_string().contains("not linked"), "{e}");
        assert_eq!(e.exit_code(), 2);
        assert!(directions(&s, n("M9QAF1"), n("M1QAF1"), Dir::Both).is_err());
    }

    #[test]
    fn change_keeps_what_it_does_not_name() {
        let before = LinkFaults {
            delay_ns: 1_000_000,
            loss: 0.1,
            ..Default::default()
        };
        let c = change_of(&[
            (Loss, FaultValue::Probability(0.0)),
            (Rate, FaultValue::Rate(100_000_000)),
        ]);
        let after = c.apply(before);
        assert_eq!(after.delay_ns, 1_000_000);
        assert_eq!(after.loss, 0.0);
        assert_eq!(after.rate_bps, 100_000_000);
        assert!(!FaultChange::default().apply(before).is_clear());
        assert!(FaultChange::default().is_empty() && !c.is_empty());
    }

    #[test]
    fn partition_cuts_exactly_the_links_between_the_sets() {
        let s = shape();
        // One node from the rest of the rack: every one of its links.
        let d = partition_directions(&s, &["M1QAF1".into()], &[]).unwrap();
        let me = s.parse_node("M1QAF1").unwrap();
        let degree = exanet_proto::topology::node_links(&s, me).len();
        assert_eq!(d.len(), 2 * degree);
        assert!(d.iter().all(|x| x.from == me || x.to == me));
        // A whole QFDB from another: only the torus links between them.
        let qa: Vec<String> = (1..=4).map(|f| format!("M1QAF{f}")).collect();
        let qb: Vec<String> = (1..=4).map(|f| format!("M1QBF{f}")).collect();
        let d = partition_directions(&s, &qa, &qb).unwrap();
        assert!(!d.is_empty());
        for x in &d {
            let (f, t) = (s.display(x.from), s.display(x.to));
            assert!(
                (f.contains("QA") && t.contains("QB")) || (f.contains("QB") && t.contains("QA")),
                "{f}->{t}"
            );
        }
        let e =
            partition_directions(&s, &["M1QAF1".into()], &["M1QAF1,M1QAF2".into()]).unwrap_err();
        assert!(e.to_string().contains("both sides"), "{e}");
        let e = partition_directions(&s, &["M1QAF2".into()], &["M1QBF3".into()]).unwrap_err();
        assert!(e.to_string().contains("no link joins"), "{e}");
    }

    /// Issue 10: `link set` said nothing of what it changed.
    #[test]
    fn set_says_what_it_changed_in_one_line() {
        let s = shape();
        let both = directions(&s, n("M1QAF1"), n("M1QAF2"), Dir::Both).unwrap();
        let change = change_of(&[
            (Delay, FaultValue::Duration(200_000)),
            (Loss, FaultValue::Probability(0.01)),
        ]);
        let after: Vec<_> = both
            .iter()
            .map(|d| (*d, change.apply(LinkFaults::default())))
            .collect();
        assert_eq!(
            set_line(&s, &both, &change, &after),
            "M1QAF1 -> M1QAF2: delay 200us, loss 1% (both directions)"
        );
        // Faults it did not name stay, and the line says so.
        let one = directions(&s, n("M1QAF1"), n("M1QAF2"), Dir::BtoA).unwrap();
        let rate = change_of(&[(Rate, FaultValue::Rate(100_000_000))]);
        let kept = LinkFaults {
            delay_ns: 200_000,
            ..Default::default()
        };
        let after = vec![(one[0], rate.apply(kept))];
        let line = set_line(&s, &one, &rate, &after);
        assert_eq!(
            line,
            "M1QAF2 -> M1QAF1: rate 100Mbit (this direction only); in force now: \
             delay 200us, rate 100Mbit"
        );
        let off = change_of(&[
            (Rate, FaultValue::Rate(0)),
            (Down, FaultValue::Switch(false)),
        ]);
        let after: Vec<_> = both.iter().map(|d| (*d, LinkFaults::default())).collect();
        assert_eq!(
            set_line(&s, &both, &off, &after),
            "M1QAF1 -> M1QAF2: rate off, up (both directions)"
        );
        // Directions that differ are named one by one.
        let after = vec![(both[0], kept), (both[1], LinkFaults::default())];
        assert!(
            in_force(&s, &after) == "M1QAF1->M1QAF2 delay 200us; M1QAF2->M1QAF1 none",
            "{}",
            in_force(&s, &after)
        );
    }

    fn status_link(peer: &str, faults: LinkFaults) -> LinkStatus {
        let mut l: LinkStatus = serde_json::from_value(json!({
            "port": "f2", "peer": peer, "kind": "qfdb", "gbps": 16, "state": "up",
            "sessions": 1, "tx_cells": 0, "tx_bytes": 0, "rx_cells": 0, "rx_bytes": 0,
            "stall_seconds": 0.0, "queue_cells": 0, "queue_bytes": 0, "in_flight_bytes": 0,
        }))
        .unwrap();
        l.faults = Some(faults);
        for _ in 0..123_456 {
            l.fault_stats.count(FaultKind::Loss);
        }
        l
    }

    /// Issue 10: a fault text longer than 40 characters pushed its row's counters right.
    #[test]
    fn show_keeps_columns_aligned_with_long_fault_text() {
        let long = LinkFaults {
            delay_ns: 1_500_000,
            jitter_ns: 250_000,
            rate_bps: 1_500_000_000,
            loss: 0.125,
            corrupt: 0.001,
            ..Default::default()
        };
        let short = LinkFaults {
            loss: 0.01,
            ..Default::default()
        };
        let (a, b) = (status_link("M1QAF2", long), status_link("M1QAF1", short));
        let rows = [
            Row {
                from: "M1QAF1".into(),
                l: &a,
            },
            Row {
                from: "M1QAF2".into(),
                l: &b,
            },
        ];
        let text = render(&rows, 4, 4);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 3, "{text}");
        assert!(describe(&long).len() > 40, "{}", describe(&long));
        // Right-aligned counters end every line at the same column, and each column
        // starts where its header does.
        assert!(lines.iter().all(|l| l.len() == lines[0].len()), "{text}");
        let col = lines[0].find("DROPPED").unwrap();
        for l in &lines[1..] {
            assert_eq!(&l[col - 2..col + 7], "   123456", "{text}");
        }
        // A short fault text keeps the layout it always had.
        let text = render(&rows[1..], 4, 4);
        assert!(
            text.starts_with(&format!(
                "{:<16} {:<5} {:<40} {:>9}",
                "LINK", "STATE", "FAULTS", "DROPPED"
            )),
            "{text}"
        );
    }

    /// Issue 10: `link show` said "no link has faults" also when it could not ask.
    #[test]
    fn show_claims_no_faults_only_for_nodes_that_answered() {
        assert!(render(&[], 4, 4).starts_with("no link has faults set or injected"));
        let partial = render(&[], 3, 4);
        assert!(partial.contains("3 of 4 nodes that answered"), "{partial}");
        assert!(!partial.contains("no link has faults"), "{partial}");
        assert_eq!(render(&[], 0, 4), "");
    }

    #[test]
    fn describe_uses_command_line_words() {
        let f = LinkFaults {
            delay_ns: 200_000,
            rate_bps: 100_000_000,
            loss: 0.001,
            down: true,
            ..Default::default()
        };
        assert_eq!(describe(&f), "down delay 200us rate 100Mbit loss 0.1%");
        assert_eq!(describe(&LinkFaults::default()), "-");
    }
}
