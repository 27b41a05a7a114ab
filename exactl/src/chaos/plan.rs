//! Stage 1 of a fault plan: reading and checking the TOML file against the rack's shape.

use std::path::Path;

use exanet_proto::fault::{FaultKind, FaultUnit, FaultValue, LinkFaults};
use exanet_proto::rng::SplitMix64;
use exanet_proto::{topology, NodeId, NodeName, Shape};

use crate::error::{CliError, Result};
use crate::faults::{self, Dir, Direction, FaultChange};
use crate::nodes::NodeOp;
use crate::units::{
    format_duration, one_of, parse_duration, parse_fault, plan_example, range_example,
};

/// Most random faults one plan may draw: a typo like `every = "1us"` would otherwise
/// build a timeline of millions of actions.
pub(super) const MAX_DRAWS: u64 = 10_000;

/// A checked plan: every node resolved, every value in range.
#[derive(Clone, Debug, PartialEq)]
pub struct Plan {
    pub name: String,
    /// Nanoseconds from the start to the end of the run, if the plan says.
    pub duration: Option<u64>,
    pub steps: Vec<Step>,
    pub randoms: Vec<RandomBlock>,
}

/// One `[[step]]`.
#[derive(Clone, Debug, PartialEq)]
pub struct Step {
    pub at: u64,
    /// Undone this long after `at` (else at the end of the run).
    pub hold: Option<u64>,
    pub what: What,
}

/// What a step (or a random draw) does.
#[derive(Clone, Debug, PartialEq)]
pub enum What {
    /// Changes the faults of some link directions; a partition is a change to `down`.
    Faults {
        dirs: Vec<Direction>,
        change: FaultChange,
        label: String,
        partition: bool,
    },
    Node {
        id: NodeId,
        op: NodeOp,
    },
}

/// A value or a range to draw from uniformly.
pub(super) type Span<T> = Option<(T, T)>;

/// One `[[random]]` block.
#[derive(Clone, Debug, PartialEq)]
pub struct RandomBlock {
    pub from: u64,
    pub until: u64,
    pub every: u64,
    pub hold: u64,
    /// Candidate links, each as its two ends.
    pub links: Vec<(NodeId, NodeId)>,
    /// What to draw, by [`FaultKind::index`].
    pub spans: [Span<FaultValue>; FaultKind::COUNT],
}

/// What a value is, for error messages.
pub(super) fn kind(v: &toml::Value) -> &'static str {
    match v {
        toml::Value::String(_) => "a string",
        toml::Value::Integer(_) | toml::Value::Float(_) => "a number",
        toml::Value::Boolean(_) => "true/false",
        toml::Value::Array(_) => "a list",
        toml::Value::Table(_) => "a table",
        toml::Value::Datetime(_) => "a date",
    }
}

pub(super) fn usage(file: &str, place: &str, msg: impl std::fmt::Display) -> CliError {
    CliError::Usage(format!("{file}: {place}: {msg}"))
}

/// Where in the file an error is: the file and `step 3`, `random 1` or `plan`.
pub(super) struct Ctx<'a> {
    file: &'a str,
    place: String,
}

impl<'a> Ctx<'a> {
    /// The context of a table inside this one (`step 2: set`).
    fn nested(&self, key: &str) -> Ctx<'a> {
        Ctx {
            file: self.file,
            place: format!("{}: {key}", self.place),
        }
    }

    fn err(&self, msg: impl std::fmt::Display) -> CliError {
        usage(self.file, &self.place, msg)
    }

    fn keys(&self, t: &toml::Table, allowed: &[&str], hint: &str) -> Result<()> {
        for k in t.keys() {
            if !allowed.contains(&k.as_str()) {
                return Err(self.err(format!("unknown key `{k}` ({hint})")));
            }
        }
        Ok(())
    }

    fn str<'v>(&self, t: &'v toml::Table, key: &str, example: &str) -> Result<Option<&'v str>> {
        match t.get(key) {
            None => Ok(None),
            Some(toml::Value::String(s)) => Ok(Some(s.as_str())),
            Some(v) => Err(self.err(format!(
                "`{key}` must be a string such as {example}, not {}",
                kind(v)
            ))),
        }
    }

    fn duration(&self, t: &toml::Table, key: &str) -> Result<Option<u64>> {
        match self.str(t, key, "\"1.5s\" (a number needs its unit)")? {
            None => Ok(None),
            Some(s) => parse_duration(s)
                .map(Some)
                .map_err(|e| self.err(format!("{key}: {e}"))),
        }
    }

    fn positive_duration(&self, t: &toml::Table, key: &str) -> Result<Option<u64>> {
        match self.duration(t, key)? {
            Some(0) => Err(self.err(format!("{key} must be longer than 0"))),
            d => Ok(d),
        }
    }

    fn node(&self, shape: &Shape, what: &str, s: &str) -> Result<NodeId> {
        shape
            .parse_node(s)
            .map_err(|e| self.err(format!("{what}: {e}")))
    }

    /// A list of node names (`["M1QAF1", "M1QAF2"]`).
    fn names(&self, v: &toml::Value, what: &str) -> Result<Vec<String>> {
        let bad = || {
            self.err(format!(
                "{what} must be a list of node names such as [\"M1QAF1\", \"M1QAF2\"]"
            ))
        };
        let toml::Value::Array(items) = v else {
            return Err(bad());
        };
        items
            .iter()
            .map(|i| match i {
                toml::Value::String(s) => Ok(s.clone()),
                _ => Err(bad()),
            })
            .collect()
    }
}

pub(super) const PLAN_KEYS: &[&str] = &["name", "duration", "step", "random"];
pub(super) const STEP_KEYS: &[&str] = &["at", "for", "link", "set", "node", "action", "partition"];
pub(super) const RANDOM_KEYS: &[&str] = &["from", "until", "every", "links", "set", "for"];

/// The keys of a step's `set`: every fault kind and `dir`, which goes with the kinds that
/// can be set on one direction (switches cut or restore the whole link).
pub(super) fn set_keys() -> Vec<&'static str> {
    let (switches, values): (Vec<FaultKind>, Vec<FaultKind>) = FaultKind::ALL
        .iter()
        .partition(|k| k.unit() == FaultUnit::Switch);
    values
        .iter()
        .map(|k| k.name())
        .chain(["dir"])
        .chain(switches.iter().map(|k| k.name()))
        .collect()
}

/// The kinds a random block can draw: all but switches (a drawn cut would be a partition).
pub(super) fn random_kinds() -> impl Iterator<Item = FaultKind> {
    FaultKind::ALL
        .iter()
        .copied()
        .filter(|k| k.unit() != FaultUnit::Switch)
}

pub(super) fn names(kinds: impl Iterator<Item = FaultKind>) -> Vec<&'static str> {
    kinds.map(|k| k.name()).collect()
}

/// Reads and checks a plan. `file` names it in errors; `shape` is the rack's.
pub fn parse_plan(text: &str, file: &str, shape: &Shape) -> Result<Plan> {
    let doc: toml::Table = text.parse().map_err(|e: toml::de::Error| {
        // The crate's message spans lines (it quotes the source); an operator gets one.
        let line = e.span().map_or(1, |r| {
            text[..r.start.min(text.len())].matches('\n').count() + 1
        });
        let msg: Vec<&str> = e.message().lines().map(str::trim).collect();
        usage(file, &format!("line {line}"), msg.join("; "))
    })?;
    let top = Ctx {
        file,
        place: "plan".into(),
    };
    top.keys(
        &doc,
        PLAN_KEYS,
        "a plan has name, duration, [[step]] and [[random]]",
    )?;
    let name = match top.str(&doc, "name", "\"flaky torus\"")? {
        Some(n) => n.to_string(),
        None => Path::new(file)
            .file_stem()
            .map_or_else(|| file.to_string(), |s| s.to_string_lossy().into_owned()),
    };
    let duration = top.positive_duration(&doc, "duration")?;
    let tables = |key: &str| -> Result<Vec<&toml::Table>> {
        match doc.get(key) {
            None => Ok(Vec::new()),
            Some(toml::Value::Array(items)) => items
                .iter()
                .map(|v| match v {
                    toml::Value::Table(t) => Ok(t),
                    _ => Err(top.err(format!("`{key}` must be [[{key}]] tables"))),
                })
                .collect(),
            Some(_) => Err(top.err(format!("`{key}` must be [[{key}]] tables"))),
        }
    };
    let mut steps = Vec::new();
    for (i, t) in tables("step")?.into_iter().enumerate() {
        let ctx = Ctx {
            file,
            place: format!("step {}", i + 1),
        };
        let step = parse_step(&ctx, t, shape)?;
        if let Some(d) = duration {
            if step.at >= d {
                return Err(ctx.err(format!(
                    "at {} is not before the plan's duration {}",
                    format_duration(step.at),
                    format_duration(d)
                )));
            }
        }
        steps.push(step);
    }
    let mut randoms = Vec::new();
    for (i, t) in tables("random")?.into_iter().enumerate() {
        let ctx = Ctx {
            file,
            place: format!("random {}", i + 1),
        };
        randoms.push(parse_random(&ctx, t, shape, duration)?);
    }
    if steps.is_empty() && randoms.is_empty() {
        return Err(top.err("no [[step]] and no [[random]]: the plan does nothing"));
    }
    Ok(Plan {
        name,
        duration,
        steps,
        randoms,
    })
}

pub(super) fn parse_step(ctx: &Ctx<'_>, t: &toml::Table, shape: &Shape) -> Result<Step> {
    ctx.keys(
        t,
        STEP_KEYS,
        "a step has at, for, and link + set, node + action, or partition",
    )?;
    let at = ctx
        .duration(t, "at")?
        .ok_or_else(|| ctx.err("`at` is missing (when the step happens, e.g. at = \"2s\")"))?;
    let hold = ctx.positive_duration(t, "for")?;
    let kinds: Vec<&str> = ["link", "node", "partition"]
        .into_iter()
        .filter(|k| t.contains_key(*k))
        .collect();
    let what = match kinds.as_slice() {
        ["link"] => parse_link_step(ctx, t, shape)?,
        ["node"] => {
            if t.get("set").is_some() {
                return Err(ctx.err("`set` goes with `link`, not `node`"));
            }
            let name = ctx.str(t, "node", "\"M1QBF2\"")?.unwrap_or_default();
            let id = ctx.node(shape, "node", name)?;
            let action = ctx
                .str(t, "action", "\"pause\"")?
                .ok_or_else(|| ctx.err(format!("`action` is missing ({})", NodeOp::choices())))?;
            let op = NodeOp::from_label(action)
                .ok_or_else(|| ctx.err(format!("action {action:?}: use {}", NodeOp::choices())))?;
            if hold.is_some() && matches!(op, NodeOp::Resume | NodeOp::Restart) {
                return Err(ctx.err(format!(
                    "`for` undoes a pause or a kill; {} has nothing to undo",
                    op.label()
                )));
            }
            What::Node { id, op }
        }
        ["partition"] => {
            for k in ["set", "action"] {
                if t.get(k).is_some() {
                    return Err(ctx.err(format!("`{k}` does not go with `partition`")));
                }
            }
            let sides = match t.get("partition") {
                Some(toml::Value::Array(s)) if (1..=2).contains(&s.len()) => s,
                _ => {
                    return Err(ctx.err(
                        "partition must be one or two lists of nodes, e.g. \
                         [[\"M1QAF1\"], [\"M1QBF1\"]] (one list: from the rest of the rack)",
                    ))
                }
            };
            let side = ctx.names(&sides[0], "partition")?;
            let from = match sides.get(1) {
                Some(v) => ctx.names(v, "partition")?,
                None => Vec::new(),
            };
            let dirs = faults::partition_directions(shape, &side, &from)
                .map_err(|e| ctx.err(format!("partition: {e}")))?;
            let upper = |v: &[String]| v.join(",").to_ascii_uppercase();
            let label = format!(
                "{} | {}",
                upper(&side),
                if from.is_empty() {
                    "rest of the rack".to_string()
                } else {
                    upper(&from)
                }
            );
            What::Faults {
                dirs,
                change: FaultChange::one(FaultKind::Down, FaultValue::Switch(true))?,
                label,
                partition: true,
            }
        }
        [] => return Err(ctx.err("nothing to do: give link + set, node + action, or partition")),
        many => {
            return Err(ctx.err(format!(
                "{} in one step: give one per step",
                many.join(" and ")
            )))
        }
    };
    Ok(Step { at, hold, what })
}

/// The two ends of `link = ["A", "B"]`, checked to be linked.
pub(super) fn link_ends(
    ctx: &Ctx<'_>,
    v: &toml::Value,
    shape: &Shape,
) -> Result<(NodeName, NodeName)> {
    let names = ctx.names(v, "link")?;
    let [a, b] = names.as_slice() else {
        return Err(ctx.err("link must name its two ends, e.g. [\"M1QAF1\", \"M1QBF1\"]"));
    };
    let parse = |s: &str| -> Result<NodeName> {
        let n: NodeName = s.parse().map_err(|e| ctx.err(format!("link: {e}")))?;
        shape.id_of(n).map_err(|e| ctx.err(format!("link: {e}")))?;
        Ok(n)
    };
    let (a, b) = (parse(a)?, parse(b)?);
    faults::directions(shape, a, b, Dir::Both).map_err(|e| ctx.err(format!("link: {e}")))?;
    Ok((a, b))
}

pub(super) fn parse_link_step(ctx: &Ctx<'_>, t: &toml::Table, shape: &Shape) -> Result<What> {
    if t.get("action").is_some() {
        return Err(ctx.err("`action` goes with `node`, not `link`"));
    }
    let (a, b) = link_ends(
        ctx,
        t.get("link").unwrap_or(&toml::Value::Boolean(false)),
        shape,
    )?;
    let set = match t.get("set") {
        Some(toml::Value::Table(s)) => s,
        Some(_) => return Err(ctx.err("set must be a table, e.g. set = { loss = \"5%\" }")),
        None => {
            return Err(ctx
                .err("`set` is missing: what to set on the link, e.g. set = { delay = \"1ms\" }"))
        }
    };
    let sctx = ctx.nested("set");
    let keys = set_keys();
    sctx.keys(set, &keys, &format!("use {}", one_of(&keys)))?;
    let mut change = FaultChange::default();
    for k in FaultKind::ALL {
        let name = k.name();
        let value = match k.unit() {
            FaultUnit::Switch => match set.get(name) {
                None => None,
                Some(toml::Value::Boolean(b)) => Some(FaultValue::Switch(*b)),
                Some(v) => {
                    return Err(sctx.err(format!("{name} must be true or false, not {}", kind(v))))
                }
            },
            unit => match sctx.str(set, name, plan_example(unit))? {
                None => None,
                Some(s) => {
                    Some(parse_fault(unit, s).map_err(|e| sctx.err(format!("{name}: {e}")))?)
                }
            },
        };
        if let Some(v) = value {
            change = change.with(*k, v)?;
        }
    }
    if change.is_empty() {
        return Err(sctx.err(format!(
            "nothing to set: give {}",
            one_of(&names(FaultKind::ALL.iter().copied()))
        )));
    }
    // What the daemons would refuse (a 20 s delay, a 10 bit/s rate) is refused here.
    change
        .apply(LinkFaults::default())
        .validate()
        .map_err(|e| sctx.err(e))?;
    let (na, nb) = (shape.id_of(a)?, shape.id_of(b)?);
    let (da, db) = (shape.display(na), shape.display(nb));
    let dir = match sctx.str(set, "dir", "\"both\"")? {
        None => Dir::Both,
        Some(s) => Dir::parse(s, &da, &db)
            .map_err(|_| sctx.err(format!("dir {s:?}: use both, {da}-{db} or {db}-{da}")))?,
    };
    if let Some((k, _)) = change.iter().find(|(k, _)| k.unit() == FaultUnit::Switch) {
        if dir != Dir::Both {
            return Err(sctx.err(format!(
                "{} cuts or restores the whole link; it cannot take dir",
                k.name()
            )));
        }
    }
    let dirs = faults::directions(shape, a, b, dir).map_err(|e| ctx.err(format!("link: {e}")))?;
    let label = match dir {
        Dir::Both => format!("{da}<->{db}"),
        Dir::AtoB => format!("{da}->{db}"),
        Dir::BtoA => format!("{db}->{da}"),
    };
    Ok(What::Faults {
        dirs,
        change,
        label,
        partition: false,
    })
}

/// `"1%..10%"` or `"5%"` (the same value every time).
pub(super) fn span(
    ctx: &Ctx<'_>,
    key: &str,
    s: &str,
    unit: FaultUnit,
) -> Result<(FaultValue, FaultValue)> {
    let (lo, hi) = match s.split_once("..") {
        Some((lo, hi)) => (lo, hi),
        None => (s, s),
    };
    let parse = |v: &str| parse_fault(unit, v.trim()).map_err(|e| ctx.err(format!("{key}: {e}")));
    let (lo, hi) = (parse(lo)?, parse(hi)?);
    if hi < lo {
        return Err(ctx.err(format!("{key} {s:?}: the range ends below its start")));
    }
    Ok((lo, hi))
}

pub(super) fn parse_random(
    ctx: &Ctx<'_>,
    t: &toml::Table,
    shape: &Shape,
    duration: Option<u64>,
) -> Result<RandomBlock> {
    ctx.keys(
        t,
        RANDOM_KEYS,
        "a random block has from, until, every, links, set and for",
    )?;
    let from = ctx.duration(t, "from")?.unwrap_or(0);
    let until = match (ctx.duration(t, "until")?, duration) {
        (Some(u), Some(d)) if u > d => {
            return Err(ctx.err(format!(
                "until {} is after the plan's duration {}",
                format_duration(u),
                format_duration(d)
            )))
        }
        (Some(u), _) => u,
        (None, Some(d)) => d,
        (None, None) => {
            return Err(ctx.err("`until` is missing, and the plan has no duration to stop at"))
        }
    };
    if from >= until {
        return Err(ctx.err("from must be before until"));
    }
    let every = ctx
        .positive_duration(t, "every")?
        .ok_or_else(|| ctx.err("`every` is missing (time between draws, e.g. every = \"2s\")"))?;
    let draws = (until - from).div_ceil(every);
    if draws > MAX_DRAWS {
        return Err(ctx.err(format!(
            "every {} from {} to {} draws {draws} faults; at most {MAX_DRAWS}",
            format_duration(every),
            format_duration(from),
            format_duration(until)
        )));
    }
    let hold = ctx.positive_duration(t, "for")?.unwrap_or(every);
    let links = match t.get("links") {
        None => topology::links(shape).iter().map(|l| (l.a, l.b)).collect(),
        Some(toml::Value::String(s)) if s.eq_ignore_ascii_case("any") => {
            topology::links(shape).iter().map(|l| (l.a, l.b)).collect()
        }
        Some(toml::Value::Array(pairs)) if !pairs.is_empty() => {
            let mut out = Vec::new();
            for p in pairs {
                let (a, b) = link_ends(ctx, p, shape)?;
                out.push((shape.id_of(a)?, shape.id_of(b)?));
            }
            out
        }
        Some(_) => {
            return Err(ctx
                .err("links must be \"any\" or a list of pairs, e.g. [[\"M1QAF1\", \"M1QAF2\"]]"))
        }
    };
    if links.is_empty() {
        return Err(ctx.err("this rack has no links to draw from"));
    }
    let set = match t.get("set") {
        Some(toml::Value::Table(s)) => s,
        _ => {
            return Err(ctx
                .err("set must be a table of values or ranges, e.g. set = { loss = \"1%..5%\" }"))
        }
    };
    let sctx = ctx.nested("set");
    let drawn = names(random_kinds());
    sctx.keys(
        set,
        &drawn,
        &format!("random faults draw {}, on both directions", one_of(&drawn)),
    )?;
    let mut spans = [None; FaultKind::COUNT];
    for k in random_kinds() {
        let unit = k.unit();
        if let Some(s) = sctx.str(set, k.name(), range_example(unit))? {
            spans[k.index()] = Some(span(&sctx, k.name(), s, unit)?);
        }
    }
    let block = RandomBlock {
        from,
        until,
        every,
        hold,
        links,
        spans,
    };
    let (lo, hi) = (block.change_at(false)?, block.change_at(true)?);
    if lo.is_empty() {
        return Err(sctx.err(format!("nothing to draw: give {}", one_of(&drawn))));
    }
    for c in [lo, hi] {
        c.apply(LinkFaults::default())
            .validate()
            .map_err(|e| sctx.err(e))?;
    }
    Ok(block)
}

impl RandomBlock {
    /// What the block draws for `kind`, as its low and high ends.
    pub fn span(&self, kind: FaultKind) -> Span<FaultValue> {
        self.spans[kind.index()]
    }

    /// The change with every range at its low (or high) end, to check the bounds.
    pub(super) fn change_at(&self, high: bool) -> Result<FaultChange> {
        let mut c = FaultChange::default();
        for k in FaultKind::ALL {
            if let Some((lo, hi)) = self.span(*k) {
                c = c.with(*k, if high { hi } else { lo })?;
            }
        }
        Ok(c)
    }

    /// One draw of every span, in table order (the order fixes which draw of the seed's
    /// stream each kind gets, so it must not change for a plan to replay).
    pub(super) fn draw(&self, rng: &mut SplitMix64) -> Result<FaultChange> {
        // Grids keep drawn values printable exactly: whole microseconds, kbit/s and
        // thousandths of a percent (what `format_*` print back).
        fn whole(rng: &mut SplitMix64, (lo, hi): (u64, u64), step: u64) -> u64 {
            let span = hi - lo;
            if span >= step {
                (lo + rng.below(span / step + 1) * step).min(hi)
            } else {
                lo + rng.below(span.saturating_add(1))
            }
        }
        fn share(rng: &mut SplitMix64, (lo, hi): (f64, f64)) -> f64 {
            let (a, b) = ((lo * 1e5).round(), (hi * 1e5).round());
            let k = rng.below((b - a).max(0.0) as u64 + 1) as f64;
            ((a + k) / 1e5).clamp(lo, hi)
        }
        let mut c = FaultChange::default();
        for k in FaultKind::ALL {
            let v = match self.span(*k) {
                None => continue,
                Some((FaultValue::Duration(lo), FaultValue::Duration(hi))) => {
                    FaultValue::Duration(whole(rng, (lo, hi), 1_000))
                }
                Some((FaultValue::Rate(lo), FaultValue::Rate(hi))) => {
                    FaultValue::Rate(whole(rng, (lo, hi), 1_000))
                }
                Some((FaultValue::Probability(lo), FaultValue::Probability(hi))) => {
                    FaultValue::Probability(share(rng, (lo, hi)))
                }
                // Switches are not drawn, and a span's ends share the kind's unit.
                Some((lo, _)) => lo,
            };
            c = c.with(*k, v)?;
        }
        Ok(c)
    }
}
