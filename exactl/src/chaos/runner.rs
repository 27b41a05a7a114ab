//! Stage 3 of a fault plan: carrying the timeline out against the rack, and undoing what
//! it set at the end or on Ctrl-C.

use std::collections::BTreeSet;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use exanet_control::control_client::ControlClient;
use exanet_control::rack::{Deploy, Rack};
use exanet_proto::fault::LinkFaults;
use exanet_proto::NodeId;

use super::plan::{parse_plan, What};
use super::timeline::{derive, describe_action, expand, render_timeline, secs, Item, Timeline};
use crate::error::{CliError, Result};
use crate::fabric;
use crate::faults::{self, describe_change, Direction, FaultChange};
use crate::nodes::{self, NodeOp};

/// `exactl chaos run` options.
#[derive(clap::Args, Debug)]
pub struct ChaosRunArgs {
    /// The plan file (TOML; see chaos/*.toml)
    #[arg(value_name = "PLAN")]
    pub plan: PathBuf,
    /// Seed of the run: the random steps and the daemons' fault draws follow from it
    #[arg(long, value_name = "N", default_value_t = 1)]
    pub seed: u64,
    /// Check the plan and print its timeline without touching the rack
    #[arg(long)]
    pub dry_run: bool,
}

/// How long a daemon may take to answer a control request.
pub(super) const TIMEOUT: Duration = Duration::from_secs(3);
/// How long a restarted daemon gets to answer again before the plan moves on.
pub(super) const RESTART_TIMEOUT: Duration = Duration::from_secs(20);
/// How often a sleeping run looks at the Ctrl-C flag.
pub(super) const POLL: Duration = Duration::from_millis(20);

/// Sleeps until `ns` after `t0`; false if interrupted first. A time beyond what the
/// clock can represent (a plan of centuries) is waited for until Ctrl-C.
pub(super) fn sleep_until(t0: Instant, ns: u64) -> bool {
    let deadline = t0.checked_add(Duration::from_nanos(ns));
    loop {
        if crate::interrupt::raised() {
            return false;
        }
        let now = Instant::now();
        let left = match deadline {
            Some(d) if now >= d => return true,
            Some(d) => d - now,
            None => POLL,
        };
        std::thread::sleep(left.min(POLL));
    }
}

/// What an item set that its undo must set back.
#[derive(Clone, Debug)]
pub(super) enum Applied {
    /// Per direction, the faults the item changed with the values they had before.
    Faults(Vec<(Direction, FaultChange)>),
    Node,
}

/// The change that sets back what `change` changed, from the values `before` it.
pub(super) fn restore_of(change: &FaultChange, before: &LinkFaults) -> FaultChange {
    let mut back = FaultChange::default();
    for (k, _) in change.iter() {
        // `before` holds every kind in its own unit, so `with` takes it.
        back = back.with(k, k.get(before)).unwrap_or(back);
    }
    back
}

/// Waits until node `id` answers again after a restart (its links rejoin by themselves).
pub(super) fn wait_answering(client: &ControlClient, id: NodeId) -> Result<Duration> {
    let t0 = Instant::now();
    let mut last = String::from("no answer yet");
    while t0.elapsed() < RESTART_TIMEOUT && !crate::interrupt::raised() {
        match fabric::query_one(client, id, Duration::from_millis(500)) {
            Ok(_) => return Ok(t0.elapsed()),
            Err(e) => last = e,
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    Err(CliError::Failed(format!(
        "{} does not answer {:.1} s after its restart ({last})",
        client.rack().shape().display(id),
        t0.elapsed().as_secs_f64()
    )))
}

pub(super) struct Runner<'a> {
    rack: &'a Rack,
    client: ControlClient,
    tl: &'a Timeline,
    /// What each item set and has not undone yet.
    active: Vec<Option<Applied>>,
    t0: Instant,
    failed: usize,
}

impl Runner<'_> {
    /// Narrates the plan. A reader that left (`exactl chaos run ... | head`) does not end
    /// the run: what the plan set must still be undone on time.
    fn say(&self, item: &Item, text: &str) {
        let _ = crate::stdout::try_write(format_args!(
            "{:>10}  {:<12} {text}\n",
            format!("{:.3}s", self.t0.elapsed().as_secs_f64()),
            item.origin.to_string()
        ));
    }

    fn node_op(&self, id: NodeId, op: NodeOp) -> Result<String> {
        nodes::apply(self.rack, op, id)?;
        if op == NodeOp::Restart {
            let took = wait_answering(&self.client, id)?;
            return Ok(format!(" (answering after {:.2}s)", took.as_secs_f64()));
        }
        Ok(String::new())
    }

    /// Carries out one action and prints its line.
    fn perform(&mut self, idx: usize, undo: bool, seed: u64) {
        let tl = self.tl;
        let shape = self.rack.shape();
        let item = &tl.items[idx];
        let mut restored = None;
        let outcome: Result<String> = match (&item.what, undo) {
            (What::Faults { dirs, change, .. }, false) => {
                match faults::current_faults(&self.client, dirs) {
                    Ok(before) => {
                        // Recorded before the change is sent: if only some daemons take it,
                        // the undo still sets back every direction.
                        self.active[idx] = Some(Applied::Faults(
                            before
                                .iter()
                                .map(|(d, f)| (*d, restore_of(change, f)))
                                .collect(),
                        ));
                        faults::change_links(&self.client, dirs, change, Some(seed))
                            .map(|()| String::new())
                    }
                    Err(e) => Err(e),
                }
            }
            (What::Faults { .. }, true) => match self.active[idx].take() {
                Some(Applied::Faults(back)) => {
                    restored = describe_restored(&back);
                    let r = undo_faults(&self.client, &back, seed);
                    if r.is_err() {
                        self.active[idx] = Some(Applied::Faults(back));
                    }
                    r.map(|()| String::new())
                }
                _ => Ok(" (skipped: it was not set)".into()),
            },
            (What::Node { id, op }, false) => {
                let r = self.node_op(*id, *op);
                if r.is_ok() && matches!(op, NodeOp::Pause | NodeOp::Kill) {
                    self.active[idx] = Some(Applied::Node);
                }
                r
            }
            (What::Node { id, op }, true) => match self.active[idx].take() {
                Some(Applied::Node) => {
                    let back = if *op == NodeOp::Kill {
                        NodeOp::Restart
                    } else {
                        NodeOp::Resume
                    };
                    let r = self.node_op(*id, back);
                    if r.is_err() {
                        self.active[idx] = Some(Applied::Node);
                    }
                    r
                }
                _ => Ok(" (skipped: it was not done)".into()),
            },
        };
        let text = describe_action(&shape, item, undo, restored.as_deref());
        match outcome {
            Ok(note) => {
                self.say(item, &format!("{text}{note}"));
            }
            Err(e) => {
                self.failed += 1;
                self.say(item, &format!("{text}: FAILED: {e}"));
            }
        }
    }

    /// Undoes everything still in force: nodes back first (a paused daemon could not
    /// take the link changes), then faults, newest first.
    fn clean_up(&mut self) -> usize {
        let mut order: Vec<usize> = (0..self.active.len())
            .filter(|i| self.active[*i].is_some())
            .collect();
        order.sort_by_key(|i| {
            (
                !matches!(self.active[*i], Some(Applied::Node)),
                std::cmp::Reverse(*i),
            )
        });
        let n = order.len();
        for i in order {
            let seed = derive(self.tl.seed, 2 * i as u64 + 1);
            self.perform(i, true, seed);
        }
        n
    }
}

/// `loss 0%, delay 0` when every direction gets the same values back, else `as before`.
pub(super) fn describe_restored(back: &[(Direction, FaultChange)]) -> Option<String> {
    let first = back.first()?;
    if back.iter().all(|(_, c)| c == &first.1) {
        Some(describe_change(&first.1))
    } else {
        Some("each direction as before".into())
    }
}

pub(super) fn undo_faults(
    client: &ControlClient,
    back: &[(Direction, FaultChange)],
    seed: u64,
) -> Result<()> {
    // One request batch per distinct set of values to restore (usually just one).
    let mut groups: Vec<(FaultChange, Vec<Direction>)> = Vec::new();
    for (d, c) in back {
        match groups.iter_mut().find(|(g, _)| g == c) {
            Some((_, dirs)) => dirs.push(*d),
            None => groups.push((*c, vec![*d])),
        }
    }
    let mut first = None;
    for (c, dirs) in &groups {
        if let Err(e) = faults::change_links(client, dirs, c, Some(seed)) {
            first.get_or_insert(e);
        }
    }
    first.map_or(Ok(()), Err)
}

/// Refuses to start a plan the rack cannot carry out, before anything is done.
pub(super) fn preflight(rack: &Rack, client: &ControlClient, tl: &Timeline) -> Result<()> {
    let shape = rack.shape();
    let mut nodes = BTreeSet::new();
    let mut node_ops = false;
    let mut restarts = false;
    for item in &tl.items {
        match &item.what {
            What::Faults { dirs, .. } => nodes.extend(dirs.iter().map(|d| d.from)),
            What::Node { id, op } => {
                nodes.insert(*id);
                node_ops = true;
                restarts |= matches!(op, NodeOp::Kill | NodeOp::Restart);
            }
        }
    }
    match rack.file.deploy.clone().unwrap_or(Deploy::Local) {
        Deploy::External { how } if node_ops => {
            return Err(CliError::Usage(format!(
                "the plan pauses, kills or restarts nodes, but this rack's daemons are not \
                 run by exactl ({how}); nothing was done"
            )))
        }
        Deploy::Local if restarts => {
            crate::process::daemon_binary()?;
        }
        _ => {}
    }
    let answers = fabric::query_all(client, TIMEOUT);
    let silent: Vec<String> = nodes
        .iter()
        .filter_map(|id| match answers.get(id.0 as usize) {
            Some(Ok(_)) => None,
            Some(Err(e)) => Some(format!("{} ({e})", shape.display(*id))),
            None => Some(shape.display(*id)),
        })
        .collect();
    if !silent.is_empty() {
        return Err(CliError::Failed(format!(
            "the plan needs nodes that do not answer: {}; nothing was done",
            silent.join(", ")
        )));
    }
    Ok(())
}

pub(super) fn load_plan(dir: &Path, args: &ChaosRunArgs) -> Result<(Rack, Timeline, String)> {
    let file = args.plan.display().to_string();
    let text = std::fs::read_to_string(&args.plan)
        .map_err(|e| CliError::Usage(format!("cannot read the plan {file}: {e}")))?;
    let rack = Rack::load(dir)?;
    let shape = rack.shape();
    let plan = parse_plan(&text, &file, &shape)?;
    let tl = expand(&plan, &shape, args.seed, &file)?;
    Ok((rack, tl, file))
}

/// `exactl chaos run PLAN [--seed N] [--dry-run]`.
pub fn run(dir: &Path, args: &ChaosRunArgs) -> Result<()> {
    let (rack, tl, file) = load_plan(dir, args)?;
    let shape = rack.shape();
    if args.dry_run {
        crate::stdout::out!("{}", render_timeline(&tl, &shape, &file));
        return Ok(());
    }
    let client = crate::control::client(&rack)?;
    preflight(&rack, &client, &tl)?;
    // Ctrl-C (or SIGTERM) from now on only raises the flag, so the run can undo what it
    // set before it exits.
    crate::interrupt::catch();
    crate::stdout::outln!(
        "plan {:?} ({file}), seed {}: {} actions over {} (Ctrl-C stops it and undoes what it set)",
        tl.name,
        tl.seed,
        tl.actions.len(),
        secs(tl.end)
    );
    let mut r = Runner {
        rack: &rack,
        client,
        tl: &tl,
        active: vec![None; tl.items.len()],
        t0: Instant::now(),
        failed: 0,
    };
    let mut interrupted = false;
    let mut reached = 0;
    for a in &tl.actions {
        if !sleep_until(r.t0, a.at) {
            interrupted = true;
            break;
        }
        r.perform(a.item, a.undo, a.seed);
        reached += 1;
    }
    // The run lasts the plan's duration even when the last action comes earlier.
    if !interrupted && !sleep_until(r.t0, tl.end) {
        interrupted = true;
    }
    let stopped_at = r.t0.elapsed();
    if interrupted {
        // A second Ctrl-C during the clean-up ends exactl at once, for an operator who
        // would rather leave the faults set than wait.
        crate::interrupt::restore();
        // Lowered so the clean-up's own waits (a restart) run to the end.
        crate::interrupt::lower();
        // Before the clean-up: a reader that left must not end exactl here either.
        let _ = crate::stdout::try_write(format_args!(
            "{:>10}  interrupted: undoing what the plan set (Ctrl-C again to leave it set)\n",
            format!("{:.3}s", stopped_at.as_secs_f64())
        ));
    }
    // After a full run only what failed to undo is left; a second try costs little.
    let undone = r.clean_up();
    let left: Vec<String> = r
        .active
        .iter()
        .enumerate()
        .filter(|(_, a)| a.is_some())
        .map(|(i, _)| {
            let item = &tl.items[i];
            format!(
                "{} ({})",
                item.origin,
                describe_action(&shape, item, false, None)
            )
        })
        .collect();
    let total = tl.actions.len();
    let mut summary = format!("plan {:?}, seed {}: ", tl.name, tl.seed);
    if interrupted {
        let _ = write!(summary, "interrupted after {reached} of {total} actions");
    } else {
        let _ = write!(summary, "{reached} of {total} actions");
    }
    let _ = write!(
        summary,
        " ({} failed), {undone} undone in the clean-up, in {:.3}s; {}",
        r.failed,
        r.t0.elapsed().as_secs_f64(),
        if left.is_empty() {
            "nothing it set is left".to_string()
        } else {
            format!("STILL SET: {}", left.join("; "))
        }
    );
    crate::stdout::outln!("{summary}");
    if interrupted {
        return Err(CliError::Failed(format!(
            "interrupted at {:.3}s{}",
            stopped_at.as_secs_f64(),
            if left.is_empty() {
                "; everything the plan set was undone"
            } else {
                "; some of what the plan set is still set (see above)"
            }
        )));
    }
    if r.failed > 0 || !left.is_empty() {
        return Err(CliError::Failed(format!(
            "{} action{} of the plan failed (see above)",
            r.failed,
            if r.failed == 1 { "" } else { "s" }
        )));
    }
    Ok(())
}
