//! Stage 1 of a fault plan: reading and checking the TOML file against the rack's shape.

use std::path::Path;

use exanet_proto::fault::{FaultKind, FaultUnit, FaultValue, LinkFaults};
use exanet_proto::SplitMix64;
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

// ---------------------------------------------------------------------------------------
// The file as written: serde types, one per table, that refuse unknown keys and values of
// the wrong type. Each value type says what it expects (with an example), so serde's own
// message, turned into operator words by `Ctx::serde`, names the key, what it must be and
// what it was. The fault kinds of a `set` are the one open-ended table: its keys come from
// the fault table, so it is read as a table and checked against that.

/// Declares a newtype read from a string by `parse`, whose type errors show an example.
macro_rules! parsed {
    ($(#[$doc:meta])* $name:ident($ty:ty), $expecting:literal, $parse:expr) => {
        $(#[$doc])*
        #[derive(Clone, Debug)]
        struct $name($ty);

        impl<'de> serde::Deserialize<'de> for $name {
            fn deserialize<D: serde::Deserializer<'de>>(
                d: D,
            ) -> std::result::Result<$name, D::Error> {
                struct V;
                impl serde::de::Visitor<'_> for V {
                    type Value = $name;
                    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                        f.write_str($expecting)
                    }
                    fn visit_str<E: serde::de::Error>(
                        self,
                        s: &str,
                    ) -> std::result::Result<$name, E> {
                        let parse: fn(&str) -> std::result::Result<$ty, String> = $parse;
                        parse(s).map($name).map_err(E::custom)
                    }
                }
                d.deserialize_str(V)
            }
        }
    };
}

fn text(s: &str) -> std::result::Result<String, String> {
    Ok(s.to_string())
}

parsed!(
    /// `"1.5s"`: a duration, its unit required.
    Dur(u64),
    "a string such as \"1.5s\" (a number needs its unit)",
    parse_duration
);
parsed!(PlanName(String), "a string such as \"flaky torus\"", text);
parsed!(NodeText(String), "a string such as \"M1QBF2\"", text);
parsed!(ActionText(String), "a string such as \"pause\"", text);

/// A list of node names (`["M1QAF1", "M1QAF2"]`); `what` it must be is in `E`.
#[derive(Clone, Debug)]
struct Names(Vec<String>);

const NAMES: &str = "a list of node names such as [\"M1QAF1\", \"M1QAF2\"]";
const PARTITION: &str = "one or two lists of nodes, e.g. [[\"M1QAF1\"], [\"M1QBF1\"]] (one list: \
                         from the rest of the rack)";
const LINKS: &str = "\"any\" or a list of pairs, e.g. [[\"M1QAF1\", \"M1QAF2\"]]";

/// Reads a list of node-name lists from `seq`; anything else in it is refused as not
/// being `expecting`.
fn name_lists<'de, A: serde::de::SeqAccess<'de>>(
    mut seq: A,
    expecting: &'static str,
) -> std::result::Result<Vec<Names>, A::Error> {
    let mut out = Vec::new();
    while let Some(v) = seq.next_element::<toml::Value>()? {
        out.push(names_of(&v).ok_or_else(|| {
            serde::de::Error::invalid_value(serde::de::Unexpected::Other(kind(&v)), &expecting)
        })?);
    }
    Ok(out)
}

fn names_of(v: &toml::Value) -> Option<Names> {
    let toml::Value::Array(items) = v else {
        return None;
    };
    items
        .iter()
        .map(|i| i.as_str().map(str::to_string))
        .collect::<Option<Vec<_>>>()
        .map(Names)
}

impl<'de> serde::Deserialize<'de> for Names {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Names, D::Error> {
        let v = toml::Value::deserialize(d)?;
        names_of(&v).ok_or_else(|| {
            serde::de::Error::invalid_value(serde::de::Unexpected::Other(kind(&v)), &NAMES)
        })
    }
}

/// `partition = [["A", "B"], ["C"]]`: one side, or two.
#[derive(Clone, Debug)]
struct Partition(Vec<Names>);

impl<'de> serde::Deserialize<'de> for Partition {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        struct V;
        impl<'de> serde::de::Visitor<'de> for V {
            type Value = Partition;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(PARTITION)
            }
            fn visit_seq<A: serde::de::SeqAccess<'de>>(
                self,
                seq: A,
            ) -> std::result::Result<Partition, A::Error> {
                let sides = name_lists(seq, PARTITION)?;
                if !(1..=2).contains(&sides.len()) {
                    return Err(serde::de::Error::invalid_length(sides.len(), &PARTITION));
                }
                Ok(Partition(sides))
            }
        }
        d.deserialize_seq(V)
    }
}

/// A random block's `links`: every link of the rack, or these.
#[derive(Clone, Debug)]
enum Links {
    Any,
    Pairs(Vec<Names>),
}

impl<'de> serde::Deserialize<'de> for Links {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        struct V;
        impl<'de> serde::de::Visitor<'de> for V {
            type Value = Links;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(LINKS)
            }
            fn visit_str<E: serde::de::Error>(self, s: &str) -> std::result::Result<Links, E> {
                if s.eq_ignore_ascii_case("any") {
                    Ok(Links::Any)
                } else {
                    Err(E::invalid_value(serde::de::Unexpected::Str(s), &LINKS))
                }
            }
            fn visit_seq<A: serde::de::SeqAccess<'de>>(
                self,
                seq: A,
            ) -> std::result::Result<Links, A::Error> {
                let pairs = name_lists(seq, LINKS)?;
                if pairs.is_empty() {
                    return Err(serde::de::Error::invalid_length(0, &LINKS));
                }
                Ok(Links::Pairs(pairs))
            }
        }
        d.deserialize_any(V)
    }
}

/// Declares a list of `[[KEY]]` tables whose type error says so.
macro_rules! tables {
    ($name:ident, $expecting:literal) => {
        #[derive(Default)]
        struct $name(Vec<toml::Table>);

        impl<'de> serde::Deserialize<'de> for $name {
            fn deserialize<D: serde::Deserializer<'de>>(
                d: D,
            ) -> std::result::Result<$name, D::Error> {
                struct V;
                impl<'de> serde::de::Visitor<'de> for V {
                    type Value = $name;
                    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                        f.write_str($expecting)
                    }
                    fn visit_seq<A: serde::de::SeqAccess<'de>>(
                        self,
                        mut seq: A,
                    ) -> std::result::Result<$name, A::Error> {
                        let mut out = Vec::new();
                        while let Some(t) = seq.next_element::<toml::Table>()? {
                            out.push(t);
                        }
                        Ok($name(out))
                    }
                }
                d.deserialize_seq(V)
            }
        }
    };
}

tables!(StepTables, "[[step]] tables");
tables!(RandomTables, "[[random]] tables");

/// The whole file.
#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct PlanDoc {
    name: Option<PlanName>,
    duration: Option<Dur>,
    /// Read one by one, so an error can name the step.
    #[serde(default)]
    step: StepTables,
    #[serde(default)]
    random: RandomTables,
}

/// One `[[step]]`.
#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct StepDoc {
    at: Option<Dur>,
    #[serde(rename = "for")]
    hold: Option<Dur>,
    link: Option<Names>,
    set: Option<toml::Value>,
    node: Option<NodeText>,
    action: Option<ActionText>,
    partition: Option<Partition>,
}

/// One `[[random]]`.
#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct RandomDoc {
    from: Option<Dur>,
    until: Option<Dur>,
    every: Option<Dur>,
    links: Option<Links>,
    set: Option<toml::Value>,
    #[serde(rename = "for")]
    hold: Option<Dur>,
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

    /// Reads the table `t` of this place as a `T`; a refusal names the key and says what
    /// it must be (`hint` lists the keys the table takes).
    fn serde<T: serde::de::DeserializeOwned>(&self, t: toml::Table, hint: &str) -> Result<T> {
        T::deserialize(toml::Value::Table(t)).map_err(|e| self.serde_err(&e, hint))
    }

    /// serde's `invalid type: integer `5`, expected a string such as "1.5s"` with its
    /// `in `at`` becomes `` `at` must be a string such as "1.5s", not a number``; an
    /// unknown field becomes an unknown key with the keys the table takes; a value's own
    /// refusal (a bad unit) follows its key.
    fn serde_err(&self, e: &toml::de::Error, hint: &str) -> CliError {
        let text = e.to_string();
        let mut lines = text.lines();
        let msg = lines.next().unwrap_or_default().trim();
        let key = lines
            .find_map(|l| l.trim().strip_prefix("in `")?.strip_suffix('`'))
            .unwrap_or_default();
        if let Some(rest) = msg.strip_prefix("unknown field `") {
            let name = rest.split('`').next().unwrap_or_default();
            return self.err(format!("unknown key `{name}` ({hint})"));
        }
        let got_expected = ["invalid type: ", "invalid value: ", "invalid length "]
            .iter()
            .find_map(|p| msg.strip_prefix(p))
            .and_then(|rest| rest.split_once(", expected "));
        match got_expected {
            Some((got, expected)) => {
                let got = match got.split([' ', '`']).next().unwrap_or_default() {
                    // The operator's own text is the clearest way to name it.
                    "string" if got.contains('"') => got.trim_start_matches("string "),
                    "integer" | "floating" => "a number",
                    "string" => "a string",
                    "boolean" => "true/false",
                    "sequence" => "a list",
                    "map" => "a table",
                    _ => got,
                };
                let got = if got.chars().all(|c| c.is_ascii_digit()) {
                    format!("{got} of them")
                } else {
                    got.to_string()
                };
                self.err(format!("`{key}` must be {expected}, not {got}"))
            }
            None if key.is_empty() => self.err(msg),
            None => self.err(format!("{key}: {msg}")),
        }
    }

    fn positive(&self, key: &str, d: Option<Dur>) -> Result<Option<u64>> {
        match d {
            Some(Dur(0)) => Err(self.err(format!("{key} must be longer than 0"))),
            d => Ok(d.map(|d| d.0)),
        }
    }

    fn node(&self, shape: &Shape, what: &str, s: &str) -> Result<NodeId> {
        shape
            .parse_node(s)
            .map_err(|e| self.err(format!("{what}: {e}")))
    }

    /// The keys of a `set` table outside `allowed`.
    fn keys(&self, t: &toml::Table, allowed: &[&str], hint: &str) -> Result<()> {
        match t.keys().find(|k| !allowed.contains(&k.as_str())) {
            Some(k) => Err(self.err(format!("unknown key `{k}` ({hint})"))),
            None => Ok(()),
        }
    }

    /// The string under `key` of a `set` table.
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
}

const PLAN_HINT: &str = "a plan has name, duration, [[step]] and [[random]]";
const STEP_HINT: &str = "a step has at, for, and link + set, node + action, or partition";
const RANDOM_HINT: &str = "a random block has from, until, every, links, set and for";

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
    let doc: PlanDoc = top.serde(doc, PLAN_HINT)?;
    let name = match doc.name {
        Some(n) => n.0,
        None => Path::new(file)
            .file_stem()
            .map_or_else(|| file.to_string(), |s| s.to_string_lossy().into_owned()),
    };
    let duration = top.positive("duration", doc.duration)?;
    let mut steps = Vec::new();
    for (i, t) in doc.step.0.into_iter().enumerate() {
        let ctx = Ctx {
            file,
            place: format!("step {}", i + 1),
        };
        let step = parse_step(&ctx, ctx.serde(t, STEP_HINT)?, shape)?;
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
    for (i, t) in doc.random.0.into_iter().enumerate() {
        let ctx = Ctx {
            file,
            place: format!("random {}", i + 1),
        };
        randoms.push(parse_random(
            &ctx,
            ctx.serde(t, RANDOM_HINT)?,
            shape,
            duration,
        )?);
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

fn parse_step(ctx: &Ctx<'_>, t: StepDoc, shape: &Shape) -> Result<Step> {
    let at =
        t.at.ok_or_else(|| ctx.err("`at` is missing (when the step happens, e.g. at = \"2s\")"))?
            .0;
    let hold = ctx.positive("for", t.hold)?;
    let kinds: Vec<&str> = [
        ("link", t.link.is_some()),
        ("node", t.node.is_some()),
        ("partition", t.partition.is_some()),
    ]
    .into_iter()
    .filter_map(|(k, on)| on.then_some(k))
    .collect();
    let what = match kinds.as_slice() {
        ["link"] => {
            if t.action.is_some() {
                return Err(ctx.err("`action` goes with `node`, not `link`"));
            }
            parse_link_step(ctx, t.link.unwrap_or(Names(Vec::new())), t.set, shape)?
        }
        ["node"] => {
            if t.set.is_some() {
                return Err(ctx.err("`set` goes with `link`, not `node`"));
            }
            let name = t.node.map(|n| n.0).unwrap_or_default();
            let id = ctx.node(shape, "node", &name)?;
            let action = t
                .action
                .ok_or_else(|| ctx.err(format!("`action` is missing ({})", NodeOp::choices())))?
                .0;
            let op = NodeOp::from_label(&action)
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
            if t.set.is_some() {
                return Err(ctx.err("`set` does not go with `partition`"));
            }
            if t.action.is_some() {
                return Err(ctx.err("`action` does not go with `partition`"));
            }
            let mut sides = t.partition.map(|p| p.0).unwrap_or_default().into_iter();
            let side = sides.next().map(|n| n.0).unwrap_or_default();
            let from = sides.next().map(|n| n.0).unwrap_or_default();
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
fn link_ends(ctx: &Ctx<'_>, names: &Names, shape: &Shape) -> Result<(NodeName, NodeName)> {
    let [a, b] = names.0.as_slice() else {
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

fn parse_link_step(
    ctx: &Ctx<'_>,
    link: Names,
    set: Option<toml::Value>,
    shape: &Shape,
) -> Result<What> {
    let (a, b) = link_ends(ctx, &link, shape)?;
    let set = match set {
        Some(toml::Value::Table(s)) => s,
        Some(_) => return Err(ctx.err("set must be a table, e.g. set = { loss = \"5%\" }")),
        None => {
            return Err(ctx
                .err("`set` is missing: what to set on the link, e.g. set = { delay = \"1ms\" }"))
        }
    };
    let set = &set;
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
fn span(ctx: &Ctx<'_>, key: &str, s: &str, unit: FaultUnit) -> Result<(FaultValue, FaultValue)> {
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

fn parse_random(
    ctx: &Ctx<'_>,
    t: RandomDoc,
    shape: &Shape,
    duration: Option<u64>,
) -> Result<RandomBlock> {
    let from = t.from.map_or(0, |d| d.0);
    let until = match (t.until.map(|d| d.0), duration) {
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
        .positive("every", t.every)?
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
    let hold = ctx.positive("for", t.hold)?.unwrap_or(every);
    let links = match t.links.unwrap_or(Links::Any) {
        Links::Any => topology::links(shape).iter().map(|l| (l.a, l.b)).collect(),
        Links::Pairs(pairs) => {
            let mut out = Vec::new();
            for p in &pairs {
                let (a, b) = link_ends(ctx, p, shape)?;
                out.push((shape.id_of(a)?, shape.id_of(b)?));
            }
            out
        }
    };
    if links.is_empty() {
        return Err(ctx.err("this rack has no links to draw from"));
    }
    let set = match t.set {
        Some(toml::Value::Table(s)) => s,
        _ => {
            return Err(ctx
                .err("set must be a table of values or ranges, e.g. set = { loss = \"1%..5%\" }"))
        }
    };
    let set = &set;
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
