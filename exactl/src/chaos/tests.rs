use std::collections::BTreeSet;
use std::path::Path;

use exanet_proto::fault::{FaultKind, FaultValue, LinkFaults};
use exanet_proto::{topology, Shape};

use super::plan::{parse_plan, Plan, What};
use super::runner::restore_of;
use super::timeline::{conflict, expand, render_timeline, Action, Item, Origin, Timeline};
use crate::error::Result;
use crate::faults::{change_of, describe_change};
use crate::nodes::NodeOp;
use FaultKind::{Delay, Down, Jitter, Loss, Rate};

fn shape() -> Shape {
    "2x1x1".parse().unwrap()
}

fn plan(text: &str) -> Result<Plan> {
    parse_plan(text, "p.toml", &shape())
}

fn timeline(text: &str, seed: u64) -> Result<Timeline> {
    expand(&plan(text)?, &shape(), seed, "p.toml")
}

/// A bad plan: exit code 2, one line naming the file, the place and the problem.
#[track_caller]
fn refused(text: &str, place: &str, needle: &str) {
    let e = match plan(text) {
        Err(e) => e,
        Ok(p) => expand(&p, &shape(), 1, "p.toml").expect_err(text),
    };
    let m = e.to_string();
    assert_eq!(e.exit_code(), 2, "{m}");
    assert!(!m.contains('\n'), "{m}");
    assert!(m.starts_with(&format!("p.toml: {place}")), "{m}");
    assert!(m.contains(needle), "{m}");
}

const EXAMPLE: &str = r#"
    name = "flaky torus link"
    duration = "30s"
    [[step]]
    at = "0s"
    link = ["M1QAF1", "M1QBF1"]
    set = { delay = "1ms", loss = "5%" }
    for = "10s"
    [[step]]
    at = "12s"
    node = "M1QBF2"
    action = "kill"
    for = "5s"
    [[step]]
    at = "20s"
    partition = [["M1QAF1", "M1QAF2"], ["M1QBF1"]]
    for = "5s"
    [[random]]
    from = "0s"
    until = "30s"
    every = "2s"
    links = "any"
    set = { loss = "1%..10%", delay = "0ms..2ms" }
    for = "1s"
"#;

#[test]
fn the_example_plan_reads_as_written() {
    let p = plan(EXAMPLE).unwrap();
    let s = shape();
    assert_eq!(p.name, "flaky torus link");
    assert_eq!(p.duration, Some(30_000_000_000));
    assert_eq!(p.steps.len(), 3);
    let What::Faults {
        dirs,
        change,
        label,
        partition,
    } = &p.steps[0].what
    else {
        panic!()
    };
    assert_eq!(dirs.len(), 2);
    assert_eq!(label, "M1QAF1<->M1QBF1");
    assert!(!partition);
    assert_eq!(change.get(Delay), Some(FaultValue::Duration(1_000_000)));
    assert_eq!(change.get(Loss), Some(FaultValue::Probability(0.05)));
    assert_eq!(change.get(Jitter), None);
    assert_eq!(p.steps[0].hold, Some(10_000_000_000));
    assert_eq!(
        p.steps[1].what,
        What::Node {
            id: s.parse_node("M1QBF2").unwrap(),
            op: NodeOp::Kill
        }
    );
    let What::Faults {
        dirs,
        change,
        partition: true,
        ..
    } = &p.steps[2].what
    else {
        panic!()
    };
    // M1QAF1-M1QBF1 is the only link between the sides.
    assert_eq!(dirs.len(), 2);
    assert_eq!(change.get(Down), Some(FaultValue::Switch(true)));
    let r = &p.randoms[0];
    assert_eq!(r.links.len(), topology::links(&s).len());
    assert_eq!(
        r.span(Loss),
        Some((FaultValue::Probability(0.01), FaultValue::Probability(0.1)))
    );
    assert_eq!(
        r.span(Delay),
        Some((FaultValue::Duration(0), FaultValue::Duration(2_000_000)))
    );
    assert_eq!((r.every, r.hold), (2_000_000_000, 1_000_000_000));
}

#[test]
fn same_seed_same_timeline_other_seed_other_draws() {
    let a = timeline(EXAMPLE, 7).unwrap();
    let b = timeline(EXAMPLE, 7).unwrap();
    assert_eq!(a, b);
    let s = shape();
    assert_eq!(render_timeline(&a, &s, "p"), render_timeline(&b, &s, "p"));
    let c = timeline(EXAMPLE, 8).unwrap();
    assert_ne!(render_timeline(&a, &s, "p"), render_timeline(&c, &s, "p"));
    // The random draws themselves differ, not only the daemons' seeds.
    let draws = |t: &Timeline| -> Vec<What> {
        t.items
            .iter()
            .filter(|i| matches!(i.origin, Origin::Random(..)))
            .map(|i| i.what.clone())
            .collect()
    };
    assert_ne!(draws(&a), draws(&c));
    // The explicit steps do not depend on the seed; every action has its own seed.
    assert_eq!(a.items[..3], c.items[..3]);
    let seeds: BTreeSet<u64> = a.actions.iter().map(|x| x.seed).collect();
    assert_eq!(seeds.len(), a.actions.len());
}

#[test]
fn the_timeline_is_ordered_complete_and_within_the_plan() {
    let t = timeline(EXAMPLE, 1).unwrap();
    assert_eq!(t.end, 30_000_000_000);
    assert!(t.actions.windows(2).all(|w| w[0].at <= w[1].at));
    // Every item is done once and undone once, after it was done, by the end.
    for (i, item) in t.items.iter().enumerate() {
        let acts: Vec<&Action> = t.actions.iter().filter(|a| a.item == i).collect();
        assert_eq!(acts.len(), 2, "{item:?}");
        assert!(!acts[0].undo && acts[1].undo);
        assert!(acts[0].at < acts[1].at && acts[1].at <= t.end);
    }
    // 15 draws every 2 s; those overlapping the kill of M1QBF2 avoid its links, and
    // none touches a direction the explicit steps hold.
    let randoms: Vec<&Item> = t
        .items
        .iter()
        .filter(|i| matches!(i.origin, Origin::Random(..)))
        .collect();
    assert_eq!(randoms.len() as u64 + t.skipped.values().sum::<u64>(), 15);
    for (i, a) in t.items.iter().enumerate() {
        for b in &t.items[i + 1..] {
            assert_eq!(conflict(&shape(), a, b), None, "{a:?} vs {b:?}");
        }
    }
    for r in randoms {
        let What::Faults { change, .. } = &r.what else {
            panic!()
        };
        let Some(FaultValue::Probability(loss)) = change.get(Loss) else {
            panic!("{change:?}")
        };
        let Some(FaultValue::Duration(delay)) = change.get(Delay) else {
            panic!("{change:?}")
        };
        assert!((0.01..=0.1).contains(&loss), "{loss}");
        assert!(delay <= 2_000_000 && delay % 1_000 == 0, "{delay}");
        assert_eq!(r.end.unwrap() - r.start, 1_000_000_000);
    }
    let text = render_timeline(&t, &shape(), "p.toml");
    assert!(
        text.starts_with("plan \"flaky torus link\" (p.toml), seed 1: "),
        "{text}"
    );
    assert!(
        text.contains("    0.000s  step 1       set M1QAF1<->M1QBF1: delay 1ms, loss 5%  [seed 0x"),
        "{text}"
    );
    assert!(
        text.contains(
            "   10.000s  step 1       restore M1QAF1<->M1QBF1: delay, loss (as they were before)"
        ),
        "{text}"
    );
    assert!(
        text.contains("   12.000s  step 2       kill M1QBF2\n"),
        "{text}"
    );
    assert!(
        text.contains("   17.000s  step 2       restart M1QBF2\n"),
        "{text}"
    );
    assert!(
        text.contains("   20.000s  step 3       cut 1 link: M1QAF1,M1QAF2 | M1QBF1"),
        "{text}"
    );
    assert!(
        text.contains("   25.000s  step 3       heal 1 link:"),
        "{text}"
    );
}

#[test]
fn at_one_instant_nodes_return_first_and_leave_last() {
    let t = timeline(
        r#"
        [[step]]
        at = "0s"
        node = "M1QAF2"
        action = "pause"
        for = "1s"
        [[step]]
        at = "1s"
        link = ["M1QAF1", "M1QAF2"]
        set = { loss = "1%" }
        for = "1s"
        [[step]]
        at = "2s"
        node = "M1QAF2"
        action = "kill"
        for = "1s"
        "#,
        1,
    )
    .unwrap();
    let order: Vec<(u64, usize, bool)> = t
        .actions
        .iter()
        .map(|a| (a.at / 1_000_000_000, a.item, a.undo))
        .collect();
    assert_eq!(
        order,
        vec![
            (0, 0, false),
            (1, 0, true), // resume before the link change
            (1, 1, false),
            (2, 1, true), // the fault is cleared before the kill
            (2, 2, false),
            (3, 2, true),
        ]
    );
    assert_eq!(t.end, 3_000_000_000);
}

#[test]
fn bad_plans_name_the_file_the_step_and_the_problem() {
    let step = |body: &str| format!("duration = \"10s\"\n[[step]]\n{body}\n");
    refused("name = \"x\"\n", "plan", "does nothing");
    refused(
        "colour = \"red\"\n[[step]]\n",
        "plan",
        "unknown key `colour`",
    );
    refused("duration = 5\n", "plan", "must be a string");
    refused("duration = \"5\"\n", "plan", "no unit");
    // Values of the wrong type name the key, what it takes and what it got.
    refused(
        "duration = 5\n",
        "plan",
        "`duration` must be a string such as \"1.5s\" (a number needs its unit), not a number",
    );
    refused(
        "step = 5\n",
        "plan",
        "`step` must be [[step]] tables, not a number",
    );
    refused(
        &step("at = \"1s\"\nnode = \"M1QAF1\"\naction = true"),
        "step 1",
        "`action` must be a string such as \"pause\", not true/false",
    );
    refused(
        &step("at = \"1s\"\nlink = [\"M1QAF1\", 3]\nset = { loss = \"1%\" }"),
        "step 1",
        "`link` must be a list of node names",
    );
    refused("a = b\n", "line 1", "invalid string");
    refused(
        "[[step]]\nat = \"1s\"\n[step]\n",
        "line 3",
        "duplicate key `step`",
    );
    refused(&step("at = \"1s\""), "step 1", "nothing to do");
    refused(
        &step("node = \"M1QAF1\"\naction = \"pause\""),
        "step 1",
        "`at` is missing",
    );
    refused(
        &step("at = \"1s\"\nnode = \"M1QAF1\"\naction = \"pause\"\nlnk = 1"),
        "step 1",
        "unknown key `lnk`",
    );
    refused(
        &step("at = \"1x\"\nnode = \"M1QAF1\"\naction = \"pause\""),
        "step 1",
        "unknown unit",
    );
    refused(
        &step("at = \"10s\"\nnode = \"M1QAF1\"\naction = \"pause\""),
        "step 1",
        "not before the plan's duration",
    );
    refused(
        &step("at = \"1s\"\nnode = \"M9QAF1\"\naction = \"pause\""),
        "step 1",
        "M9QAF1",
    );
    refused(
        &step("at = \"1s\"\nnode = \"M1QAF1\"\naction = \"nap\""),
        "step 1",
        "pause, resume, kill or restart",
    );
    refused(
        &step("at = \"1s\"\nnode = \"M1QAF1\"\naction = \"resume\"\nfor = \"1s\""),
        "step 1",
        "nothing to undo",
    );
    refused(
        &step("at = \"1s\"\nnode = \"M1QAF1\"\naction = \"pause\"\nfor = \"0s\""),
        "step 1",
        "longer than 0",
    );
    refused(
        &step("at = \"1s\"\nnode = \"M1QAF1\"\nlink = [\"M1QAF1\", \"M1QAF2\"]"),
        "step 1",
        "link and node in one step",
    );
    let link = |ends: &str, set: &str| step(&format!("at = \"1s\"\nlink = {ends}\nset = {set}"));
    refused(
        &link("[\"M1QAF2\", \"M1QBF3\"]", "{ loss = \"1%\" }"),
        "step 1",
        "not linked",
    );
    refused(
        &link("[\"M1QAF1\"]", "{ loss = \"1%\" }"),
        "step 1",
        "two ends",
    );
    refused(
        &link("[\"M1QAF1\", \"M1QAF1\"]", "{ loss = \"1%\" }"),
        "step 1",
        "same node",
    );
    refused(
        &link("[\"M1QAF1\", \"M1QCF1\"]", "{ loss = \"1%\" }"),
        "step 1",
        "M1QCF1",
    );
    refused(
        &link("[\"M1QAF1\", \"M1QAF2\"]", "{ loss = \"0.5\" }"),
        "step 1: set",
        "not a percentage",
    );
    refused(
        &link("[\"M1QAF1\", \"M1QAF2\"]", "{ loss = \"101%\" }"),
        "step 1: set",
        "outside",
    );
    refused(
        &link("[\"M1QAF1\", \"M1QAF2\"]", "{ delay = \"20s\" }"),
        "step 1: set",
        "limit",
    );
    refused(
        &link("[\"M1QAF1\", \"M1QAF2\"]", "{ rate = \"10bit\" }"),
        "step 1: set",
        "minimum",
    );
    // A rate that could be bits or bytes is refused, not guessed (issue 10, defect 5).
    refused(
        &link("[\"M1QAF1\", \"M1QAF2\"]", "{ rate = \"100MB\" }"),
        "step 1: set",
        "not a rate",
    );
    refused(
        &link("[\"M1QAF1\", \"M1QAF2\"]", "{ wobble = \"1%\" }"),
        "step 1: set",
        "unknown key `wobble`",
    );
    refused(
        &link(
            "[\"M1QAF1\", \"M1QAF2\"]",
            "{ dir = \"up\", loss = \"1%\" }",
        ),
        "step 1: set",
        "M1QAF1-M1QAF2",
    );
    refused(
        &link("[\"M1QAF1\", \"M1QAF2\"]", "{ dir = \"A-B\", down = true }"),
        "step 1: set",
        "cannot take dir",
    );
    refused(
        &link("[\"M1QAF1\", \"M1QAF2\"]", "{ dir = \"both\" }"),
        "step 1: set",
        "nothing to set",
    );
    refused(
        &step("at = \"1s\"\nlink = [\"M1QAF1\", \"M1QAF2\"]"),
        "step 1",
        "`set` is missing",
    );
    refused(
        &step("at = \"1s\"\npartition = [[\"M1QAF1\"], [\"M1QAF1\"]]"),
        "step 1",
        "both sides",
    );
    refused(
        &step("at = \"1s\"\npartition = \"M1QAF1\""),
        "step 1",
        "one or two lists",
    );
    refused(
        &step("at = \"1s\"\npartition = [[\"M1QAF2\"], [\"M1QBF3\"]]"),
        "step 1",
        "no link joins",
    );
    let random = |body: &str| format!("duration = \"10s\"\n[[random]]\n{body}\n");
    refused(
        &random("every = \"1s\"\nset = { rate = \"1M..2M\" }"),
        "random 1: set",
        "no bit or byte unit",
    );
    refused(
        &random("every = \"1s\"\nset = { loss = \"5%..1%\" }"),
        "random 1: set",
        "ends below its start",
    );
    refused(
        &random("every = \"1s\"\nset = { loss = \"1%..x\" }"),
        "random 1: set",
        "\"x\"",
    );
    refused(
        &random("every = \"1s\"\nset = { dir = \"both\" }"),
        "random 1: set",
        "unknown key `dir`",
    );
    refused(
        &random("set = { loss = \"1%\" }"),
        "random 1",
        "`every` is missing",
    );
    refused(
        &random("every = \"1us\"\nset = { loss = \"1%\" }"),
        "random 1",
        "at most 10000",
    );
    refused(
        &random("every = \"1s\"\nuntil = \"11s\"\nset = { loss = \"1%\" }"),
        "random 1",
        "after the plan's duration",
    );
    refused(
        &random("every = \"1s\"\nfrom = \"5s\"\nuntil = \"5s\"\nset = { loss = \"1%\" }"),
        "random 1",
        "before until",
    );
    refused(
        &random("every = \"1s\"\nlinks = [[\"M1QAF2\", \"M1QBF3\"]]\nset = { loss = \"1%\" }"),
        "random 1",
        "not linked",
    );
    refused(
        &random("every = \"1s\"\nlinks = \"some\"\nset = { loss = \"1%\" }"),
        "random 1",
        "\"any\"",
    );
    refused(
        "[[random]]\nevery = \"1s\"\nset = { loss = \"1%\" }\n",
        "random 1",
        "no duration",
    );
}

#[test]
fn contradictory_steps_are_refused() {
    let two = |a: &str, b: &str| format!("[[step]]\n{a}\n[[step]]\n{b}\n");
    // The same fault on the same direction at once.
    refused(
        &two(
            "at = \"0s\"\nlink = [\"M1QAF1\", \"M1QAF2\"]\nset = { loss = \"5%\" }\nfor = \"10s\"",
            "at = \"5s\"\nlink = [\"M1QAF2\", \"M1QAF1\"]\nset = { loss = \"1%\", dir = \"M1QAF2-M1QAF1\" }\nfor = \"10s\"",
        ),
        "step 2",
        "contradicts step 1: both set loss on M1QAF2->M1QAF1 between 5.000s and 10.000s",
    );
    // A link change while an end is paused; a link fault across a kill.
    refused(
        &two(
            "at = \"0s\"\nnode = \"M1QAF2\"\naction = \"pause\"\nfor = \"10s\"",
            "at = \"5s\"\nlink = [\"M1QAF1\", \"M1QAF2\"]\nset = { delay = \"1ms\" }\nfor = \"10s\"",
        ),
        "step 2",
        "M1QAF2 is paused",
    );
    refused(
        &two(
            "at = \"0s\"\nlink = [\"M1QAF1\", \"M1QAF2\"]\nset = { delay = \"1ms\" }\nfor = \"10s\"",
            "at = \"5s\"\nnode = \"M1QAF2\"\naction = \"kill\"\nfor = \"1s\"",
        ),
        "step 2",
        "clear links",
    );
    // The same node paused twice at once; resumed in the middle of its kill.
    refused(
        &two(
            "at = \"0s\"\nnode = \"M1QAF2\"\naction = \"pause\"\nfor = \"10s\"",
            "at = \"5s\"\nnode = \"M1QAF2\"\naction = \"pause\"\nfor = \"1s\"",
        ),
        "step 2",
        "overlap",
    );
    refused(
        &two(
            "at = \"0s\"\nnode = \"M1QAF2\"\naction = \"kill\"\nfor = \"10s\"",
            "at = \"5s\"\nnode = \"M1QAF2\"\naction = \"restart\"",
        ),
        "step 2",
        "overlap",
    );
    // A step without `for` in a plan without duration that ends with it.
    refused(
        "[[step]]\nat = \"1s\"\nnode = \"M1QAF2\"\naction = \"pause\"\n",
        "step 1",
        "undone the moment",
    );
    // What is fine: different faults on one link, one direction each, back to back,
    // a change on the far direction of a paused node (the sender is not paused).
    let ok = |text: &str| timeline(text, 1).unwrap();
    ok(&two(
        "at = \"0s\"\nlink = [\"M1QAF1\", \"M1QAF2\"]\nset = { loss = \"5%\" }\nfor = \"10s\"",
        "at = \"5s\"\nlink = [\"M1QAF1\", \"M1QAF2\"]\nset = { delay = \"1ms\" }\nfor = \"10s\"",
    ));
    ok(&two(
        "at = \"0s\"\nlink = [\"M1QAF1\", \"M1QAF2\"]\nset = { loss = \"5%\", dir = \"A-B\" }\nfor = \"10s\"",
        "at = \"0s\"\nlink = [\"M1QAF1\", \"M1QAF2\"]\nset = { loss = \"1%\", dir = \"B-A\" }\nfor = \"10s\"",
    ));
    ok(&two(
        "at = \"0s\"\nlink = [\"M1QAF1\", \"M1QAF2\"]\nset = { loss = \"5%\" }\nfor = \"5s\"",
        "at = \"5s\"\nlink = [\"M1QAF1\", \"M1QAF2\"]\nset = { loss = \"1%\" }\nfor = \"5s\"",
    ));
    ok(&two(
        "at = \"0s\"\nnode = \"M1QAF2\"\naction = \"pause\"\nfor = \"10s\"",
        "at = \"5s\"\nlink = [\"M1QAF1\", \"M1QAF2\"]\nset = { delay = \"1ms\", dir = \"M1QAF1-M1QAF2\" }\nfor = \"1s\"",
    ));
}

#[test]
fn random_draws_avoid_what_the_steps_hold() {
    // One candidate link, held by a step for the first half: draws there are skipped.
    let t = timeline(
        r#"
        duration = "10s"
        [[step]]
        at = "0s"
        link = ["M1QAF1", "M1QAF2"]
        set = { loss = "50%" }
        for = "5s"
        [[random]]
        every = "1s"
        links = [["M1QAF1", "M1QAF2"]]
        set = { loss = "1%..2%", rate = "1Mbit..2Mbit" }
        "#,
        3,
    )
    .unwrap();
    assert_eq!(t.skipped.get(&1), Some(&5));
    let starts: Vec<u64> = t.items[1..]
        .iter()
        .map(|i| i.start / 1_000_000_000)
        .collect();
    assert_eq!(starts, vec![5, 6, 7, 8, 9]);
    assert!(render_timeline(&t, &shape(), "p").contains("random 1: 5 draws skipped"));
    for i in &t.items[1..] {
        let What::Faults { change, .. } = &i.what else {
            panic!()
        };
        let Some(FaultValue::Rate(rate)) = change.get(Rate) else {
            panic!("{change:?}")
        };
        assert!((1_000_000..=2_000_000).contains(&rate));
        assert_eq!(
            i.end.unwrap() - i.start,
            1_000_000_000,
            "for defaults to every"
        );
    }
}

/// Issue 10, defect 5: a plan's `rate = "12.5MB/s"` is 100 Mbit/s, not 12.5.
#[test]
fn plan_rates_take_bytes_as_eight_bits() {
    let p = plan(
        "duration = \"10s\"\n[[step]]\nat = \"1s\"\nlink = [\"M1QAF1\", \"M1QAF2\"]\n\
         set = { rate = \"12.5MB/s\" }\n",
    )
    .unwrap();
    match &p.steps[0].what {
        What::Faults { change, .. } => {
            assert_eq!(change.get(Rate), Some(FaultValue::Rate(100_000_000)))
        }
        w => panic!("{w:?}"),
    }
}

#[test]
fn restoring_sets_back_only_what_the_step_changed() {
    let before = LinkFaults {
        delay_ns: 7,
        loss: 0.2,
        rate_bps: 1_000_000,
        ..Default::default()
    };
    let change = change_of(&[
        (Loss, FaultValue::Probability(0.5)),
        (Down, FaultValue::Switch(true)),
    ]);
    let back = restore_of(&change, &before);
    assert_eq!(
        back,
        change_of(&[
            (Loss, FaultValue::Probability(0.2)),
            (Down, FaultValue::Switch(false)),
        ])
    );
    // Applied over what the step left, the undo gives back exactly the start.
    assert_eq!(back.apply(change.apply(before)), before);
    assert_eq!(describe_change(&back), "loss 20%, up");
}

#[test]
fn the_example_plans_in_the_repository_are_valid() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../chaos");
    let mut n = 0;
    for e in std::fs::read_dir(&dir).unwrap() {
        let path = e.unwrap().path();
        if path.extension().is_none_or(|x| x != "toml") {
            continue;
        }
        let text = std::fs::read_to_string(&path).unwrap();
        let file = path.display().to_string();
        // Each plan says in a comment the smallest rack it runs on.
        let shape: Shape = text
            .lines()
            .find_map(|l| l.strip_prefix("# rack: "))
            .unwrap_or_else(|| panic!("{file}: no `# rack: XxYxZ` line"))
            .trim()
            .parse()
            .unwrap();
        let p = parse_plan(&text, &file, &shape).unwrap_or_else(|e| panic!("{e}"));
        let a = expand(&p, &shape, 1, &file).unwrap_or_else(|e| panic!("{e}"));
        let b = expand(&p, &shape, 1, &file).unwrap();
        assert_eq!(a, b);
        assert!(!a.actions.is_empty());
        n += 1;
    }
    assert!(n >= 2, "only {n} plans in {}", dir.display());
}
