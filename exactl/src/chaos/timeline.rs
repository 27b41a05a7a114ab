//! Stage 2 of a fault plan: the timeline of a plan and a seed, every action with its
//! time and its own seed; contradictions between steps are refused here.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use exanet_proto::SplitMix64;
use exanet_proto::{NodeId, Shape};

use super::plan::{usage, Plan, What};
use crate::error::Result;
use crate::faults::{describe_change, Direction, FaultChange};
use crate::nodes::NodeOp;

/// Where an item of the timeline comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Origin {
    /// `[[step]]` number (from 1).
    Step(usize),
    /// `[[random]]` number and draw number (from 1).
    Random(usize, usize),
}

impl std::fmt::Display for Origin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Origin::Step(i) => write!(f, "step {i}"),
            Origin::Random(b, d) => write!(f, "random {b}.{d}"),
        }
    }
}

/// One thing the plan does, and when it is undone.
#[derive(Clone, Debug, PartialEq)]
pub struct Item {
    pub origin: Origin,
    pub start: u64,
    /// When it is undone; `None` for what has nothing to undo (resume, restart).
    pub end: Option<u64>,
    pub what: What,
}

/// One action at one time: doing an item or undoing it.
#[derive(Clone, Debug, PartialEq)]
pub struct Action {
    pub at: u64,
    pub item: usize,
    pub undo: bool,
    /// Restarts the daemons' fault draws on the directions it touches.
    pub seed: u64,
}

#[derive(Clone, Debug, PartialEq)]
pub struct Timeline {
    pub name: String,
    pub seed: u64,
    pub end: u64,
    pub items: Vec<Item>,
    pub actions: Vec<Action>,
    /// Random draws that found no free link, by block.
    pub skipped: BTreeMap<usize, u64>,
}

/// A seed for stream `k` of a run seeded `seed`: unrelated streams for neighbouring `k`.
pub(super) fn derive(seed: u64, k: u64) -> u64 {
    SplitMix64::new(seed ^ k.wrapping_mul(0xD1B5_4A32_D192_ED03)).next_u64()
}

/// Random blocks draw from streams of their own, so adding a step leaves the draws alone.
pub(super) const RANDOM_STREAM: u64 = 0x5241_4E44_0000_0000;

/// When, at one instant, an action runs: nodes come back first, then faults are cleared,
/// then new ones set, then nodes go away. So a fault can be cleared at the very moment
/// its node is paused, and set the moment it is resumed.
pub(super) fn phase(item: &Item, undo: bool) -> u8 {
    match (&item.what, undo) {
        (What::Node { .. }, true) => 0,
        (
            What::Node {
                op: NodeOp::Resume | NodeOp::Restart,
                ..
            },
            false,
        ) => 0,
        (What::Faults { .. }, true) => 1,
        (What::Faults { .. }, false) => 2,
        (What::Node { .. }, false) => 3,
    }
}

pub(super) fn fault_keys(c: &FaultChange) -> Vec<&'static str> {
    c.iter().map(|(k, _)| k.name()).collect()
}

pub(super) fn secs(ns: u64) -> String {
    format!("{:.3}s", ns as f64 / 1e9)
}

/// Why `a` and `b` cannot both be in the plan, if they cannot.
pub(super) fn conflict(shape: &Shape, a: &Item, b: &Item) -> Option<String> {
    let win = |i: &Item| (i.start, i.end.unwrap_or(i.start));
    let ((sa, ea), (sb, eb)) = (win(a), win(b));
    match (&a.what, &b.what) {
        (
            What::Faults {
                dirs: da,
                change: ca,
                ..
            },
            What::Faults {
                dirs: db,
                change: cb,
                ..
            },
        ) => {
            if !(sa < eb && sb < ea) {
                return None;
            }
            let kb = fault_keys(cb);
            let key = fault_keys(ca).into_iter().find(|k| kb.contains(k))?;
            let d = da.iter().find(|d| db.contains(d))?;
            Some(format!(
                "both set {key} on {}->{} between {} and {} (each would restore what the \
                 other set)",
                shape.display(d.from),
                shape.display(d.to),
                secs(sa.max(sb)),
                secs(ea.min(eb))
            ))
        }
        (What::Faults { .. }, What::Node { .. }) => conflict(shape, b, a),
        (What::Node { id, op }, What::Faults { dirs, .. }) => {
            if !dirs.iter().any(|d| d.from == *id) {
                return None;
            }
            let node = shape.display(*id);
            match op {
                NodeOp::Kill if sa < eb && sb < ea => Some(format!(
                    "{node} is killed from {} to {} while its links' faults are changed \
                     (a restarted daemon starts with clear links)",
                    secs(sa),
                    secs(ea)
                )),
                NodeOp::Pause => [sb, eb].into_iter().find(|t| sa < *t && *t < ea).map(|t| {
                    format!(
                        "{node} is paused from {} to {} and cannot take the link change \
                             at {}",
                        secs(sa),
                        secs(ea),
                        secs(t)
                    )
                }),
                _ => None,
            }
        }
        (What::Node { id: ia, op: oa }, What::Node { id: ib, op: ob }) => {
            if ia != ib {
                return None;
            }
            let windowed = |op: &NodeOp| matches!(op, NodeOp::Pause | NodeOp::Kill);
            let clash = match (windowed(oa), windowed(ob)) {
                (true, true) => sa < eb && sb < ea,
                (true, false) => sa <= sb && sb <= ea,
                (false, true) => sb <= sa && sa <= eb,
                (false, false) => false,
            };
            clash.then(|| {
                format!(
                    "{} and {} of {} overlap in time",
                    oa.label(),
                    ob.label(),
                    shape.display(*ia)
                )
            })
        }
    }
}

/// The timeline of `plan` for `seed`. `file` names the plan in errors.
pub fn expand(plan: &Plan, shape: &Shape, seed: u64, file: &str) -> Result<Timeline> {
    // Without a duration the run ends when the last explicit or random fault does.
    let natural = plan
        .steps
        .iter()
        .map(|s| s.at + s.hold.unwrap_or(0))
        .chain(plan.randoms.iter().map(|r| r.until.saturating_add(r.hold)))
        .max()
        .unwrap_or(0);
    let end = plan.duration.unwrap_or(natural);
    let mut items: Vec<Item> = Vec::new();
    for (i, s) in plan.steps.iter().enumerate() {
        let undoable = match &s.what {
            What::Faults { .. } => true,
            What::Node { op, .. } => matches!(op, NodeOp::Pause | NodeOp::Kill),
        };
        let item_end = undoable.then(|| s.hold.map_or(end, |h| (s.at + h).min(end)));
        if item_end == Some(s.at) {
            return Err(usage(
                file,
                &format!("step {}", i + 1),
                "it would be undone the moment it is done (no `for`, and the plan ends \
                 there): give it a `for` or give the plan a duration",
            ));
        }
        let item = Item {
            origin: Origin::Step(i + 1),
            start: s.at,
            end: item_end,
            what: s.what.clone(),
        };
        for other in &items {
            if let Some(why) = conflict(shape, other, &item) {
                return Err(usage(
                    file,
                    &format!("step {}", i + 1),
                    format!("contradicts {}: {why}", other.origin),
                ));
            }
        }
        items.push(item);
    }
    let mut skipped = BTreeMap::new();
    for (b, block) in plan.randoms.iter().enumerate() {
        let mut rng = SplitMix64::new(derive(seed, RANDOM_STREAM | b as u64));
        let mut t = block.from;
        let mut draw = 0;
        while t < block.until {
            draw += 1;
            let stop = t.saturating_add(block.hold).min(end);
            if stop <= t {
                break;
            }
            // Only what overlaps this draw in time can conflict with it.
            let nearby: Vec<&Item> = items
                .iter()
                .filter(|o| o.start <= stop && o.end.unwrap_or(o.start) >= t)
                .collect();
            let candidate = |x: NodeId, y: NodeId, change: FaultChange| Item {
                origin: Origin::Random(b + 1, draw),
                start: t,
                end: Some(stop),
                what: What::Faults {
                    dirs: vec![Direction { from: x, to: y }, Direction { from: y, to: x }],
                    change,
                    label: format!("{}<->{}", shape.display(x), shape.display(y)),
                    partition: false,
                },
            };
            let keys_only = block.change_at(false)?;
            let free: Vec<(NodeId, NodeId)> = block
                .links
                .iter()
                .copied()
                .filter(|&(x, y)| {
                    let c = candidate(x, y, keys_only);
                    nearby.iter().all(|o| conflict(shape, o, &c).is_none())
                })
                .collect();
            if free.is_empty() {
                *skipped.entry(b + 1).or_insert(0) += 1;
            } else {
                let (x, y) = free[rng.below(free.len() as u64) as usize];
                let change = block.draw(&mut rng)?;
                items.push(candidate(x, y, change));
            }
            t = t.saturating_add(block.every);
        }
    }
    let mut actions = Vec::new();
    for (i, item) in items.iter().enumerate() {
        let k = 2 * i as u64;
        actions.push(Action {
            at: item.start,
            item: i,
            undo: false,
            seed: derive(seed, k),
        });
        if let Some(e) = item.end {
            actions.push(Action {
                at: e,
                item: i,
                undo: true,
                seed: derive(seed, k + 1),
            });
        }
    }
    actions.sort_by_key(|a| (a.at, phase(&items[a.item], a.undo), a.item));
    Ok(Timeline {
        name: plan.name.clone(),
        seed,
        end,
        items,
        actions,
        skipped,
    })
}

/// What an action does, in words (`restored` is what an undo set back, when known).
pub(super) fn describe_action(
    shape: &Shape,
    item: &Item,
    undo: bool,
    restored: Option<&str>,
) -> String {
    match (&item.what, undo) {
        (
            What::Faults {
                label,
                partition: true,
                dirs,
                ..
            },
            u,
        ) => {
            let n = dirs.len() / 2;
            format!(
                "{} {n} link{}: {label}",
                if u { "heal" } else { "cut" },
                if n == 1 { "" } else { "s" }
            )
        }
        (What::Faults { label, change, .. }, false) => {
            format!("set {label}: {}", describe_change(change))
        }
        (What::Faults { label, change, .. }, true) => match restored {
            Some(r) => format!("restore {label}: {r}"),
            None => format!(
                "restore {label}: {} (as they were before)",
                fault_keys(change).join(", ")
            ),
        },
        (What::Node { id, op }, u) => {
            let verb = match (op, u) {
                (NodeOp::Pause, true) => "resume",
                (NodeOp::Kill, true) => "restart",
                (op, _) => op.label(),
            };
            format!("{verb} {}", shape.display(*id))
        }
    }
}

/// The `--dry-run` listing: a header, then one line per action.
pub fn render_timeline(tl: &Timeline, shape: &Shape, file: &str) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "plan {:?} ({file}), seed {}: {} actions over {}",
        tl.name,
        tl.seed,
        tl.actions.len(),
        secs(tl.end)
    );
    for a in &tl.actions {
        let item = &tl.items[a.item];
        let seed = match item.what {
            What::Faults { .. } => format!("  [seed {:#018x}]", a.seed),
            What::Node { .. } => String::new(),
        };
        let _ = writeln!(
            out,
            "{:>10}  {:<12} {}{seed}",
            secs(a.at),
            item.origin.to_string(),
            describe_action(shape, item, a.undo, None)
        );
    }
    for (b, n) in &tl.skipped {
        let _ = writeln!(
            out,
            "random {b}: {n} draws skipped: every candidate link was taken by another step"
        );
    }
    out
}
