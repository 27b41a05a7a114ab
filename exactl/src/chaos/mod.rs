//! `exactl chaos run PLAN [--seed N] [--dry-run]`: fault plans, faults scheduled over time.
//!
//! A plan is a TOML file of timed steps (a link fault, a node pause/kill, a partition,
//! each optionally undone after `for`) and random blocks (faults on links drawn from the
//! seed). Running one goes through three stages, the first two pure:
//!
//! 1. [`plan`] reads and checks the whole file against the rack's shape: unknown
//!    keys, units, nodes, adjacency. Any problem is one line naming the file and the step,
//!    and nothing is done.
//! 2. [`timeline`] turns the plan and a seed into a `Timeline`: every action with its time
//!    and its own seed for the daemons' fault draws. Same plan and seed, same timeline.
//!    Steps that contradict each other (two setting the same fault on the same link at
//!    once, a link change on a paused or killed node) are refused here; random draws skip
//!    the links such a conflict would touch, so they never fight the explicit steps.
//! 3. [`runner`] carries the timeline out against the rack and, at the end or on Ctrl-C,
//!    undoes whatever it set that is still in force.
//!
//! Undoing a link step sets back exactly the faults it changed, to the values they had
//! just before it (read from the daemons), so an operator's own faults on the same link
//! survive the plan.

mod plan;
mod runner;
#[cfg(test)]
mod tests;
mod timeline;

pub use runner::{run, ChaosRunArgs};
