//! `exactl top` and `exactl chaos run` from the command line: plans are checked before
//! anything is done (no daemons needed), and against a real 4-node rack `top` shows its
//! links, a plan's faults are in force while it runs and gone after it, also after Ctrl-C.

mod common;

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use common::{assert_usage_error, daemon_or_skip, rack_toml, text, Scratch};
use serde_json::Value;

/// Writes a plan file into the scratch directory and returns its path.
fn write_plan(s: &Scratch, name: &str, text: &str) -> String {
    let p = s.dir.join(name);
    std::fs::write(&p, text).unwrap();
    p.display().to_string()
}

/// A background exactl, killed if the test fails before it exits.
struct Background {
    child: Child,
    lines: mpsc::Receiver<String>,
    seen: Vec<String>,
}

impl Background {
    fn spawn(mut cmd: Command) -> Background {
        let mut child = cmd
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start exactl");
        let stdout = child.stdout.take().unwrap();
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(|l| l.ok()) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Background {
            child,
            lines,
            seen: Vec::new(),
        }
    }

    /// Waits for a stdout line containing `needle`.
    #[track_caller]
    fn wait_for(&mut self, needle: &str, within: Duration) {
        let deadline = Instant::now() + within;
        while Instant::now() < deadline {
            match self.lines.recv_timeout(Duration::from_millis(50)) {
                Ok(l) => {
                    let hit = l.contains(needle);
                    self.seen.push(l);
                    if hit {
                        return;
                    }
                }
                Err(mpsc::RecvTimeoutError::Timeout) => {}
                Err(mpsc::RecvTimeoutError::Disconnected) => break,
            }
        }
        panic!(
            "no line with {needle:?} within {within:?}; got:\n{}",
            self.seen.join("\n")
        );
    }

    /// Waits for the exit; the exit code and everything printed on stdout and stderr.
    fn finish(mut self, within: Duration) -> (Option<i32>, String, String) {
        let deadline = Instant::now() + within;
        let status = loop {
            if let Some(s) = self.child.try_wait().unwrap() {
                break s;
            }
            assert!(
                Instant::now() < deadline,
                "still running after {within:?}; so far:\n{}",
                self.seen.join("\n")
            );
            std::thread::sleep(Duration::from_millis(50));
        };
        // The reader thread ends with the pipe.
        while let Ok(l) = self.lines.recv_timeout(Duration::from_secs(2)) {
            self.seen.push(l);
        }
        let mut err = String::new();
        if let Some(mut e) = self.child.stderr.take() {
            let _ = std::io::Read::read_to_string(&mut e, &mut err);
        }
        (status.code(), self.seen.join("\n"), err)
    }
}

impl Drop for Background {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// A plan with a random block, so that different seeds draw differently.
const RANDOM_PLAN: &str = r#"
name = "noise"
duration = "10s"
[[step]]
at = "1s"
link = ["M1QAF1", "M1QAF2"]
set = { delay = "1ms" }
for = "2s"
[[random]]
every = "1s"
set = { loss = "1%..20%" }
for = "500ms"
"#;

#[test]
fn plans_are_checked_before_anything_is_done() {
    let s = Scratch::new("check").with_rack_file(&rack_toml("1x1x1"));
    // Nothing runs: a plan that reached the rack would fail with exit 1, not 2.
    for (body, mut needles) in [
        (
            "[[step]]\nat = \"0s\"\nnode = \"M1QAF1\"\naction = \"pause\"\nfor = \"1s\"\n\
             [[step]]\nat = \"1s\"\nlink = [\"M1QAF1\", \"M1QCF1\"]\nset = { loss = \"1%\" }\n",
            vec!["step 2", "M1QCF1"],
        ),
        (
            "[[step]]\nat = \"0s\"\nlink = [\"M1QAF1\", \"M1QAF2\"]\nset = { loss = \"1\" }\n",
            vec!["step 1: set", "loss", "not a percentage"],
        ),
        (
            "[[step]]\nat = \"0s\"\nlink = [\"M1QAF1\", \"M1QAF2\"]\nset = { loss = \"1%\" }\nfor = \"5s\"\n\
             [[step]]\nat = \"1s\"\nnode = \"M1QAF2\"\naction = \"kill\"\nfor = \"1s\"\n",
            vec!["step 2", "contradicts step 1"],
        ),
        ("[[step]]\nat = 1\n", vec!["plan.toml: step 1", "`at` must be a string"]),
        ("[[step]\n", vec!["plan.toml: line 1"]),
    ] {
        let path = write_plan(&s, "plan.toml", body);
        needles.push(&path); // the message names the file
        for extra in [&[][..], &["--dry-run"][..]] {
            let mut args = vec!["chaos", "run", path.as_str()];
            args.extend(extra);
            assert_usage_error(&s.exactl(&args), &needles);
        }
    }
    let out = s.exactl(&["chaos", "run", "/nonexistent/plan.toml"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(text(&out.stderr).contains("/nonexistent/plan.toml"));

    // --dry-run needs the rack file, not the daemons, and is the same for the same seed.
    let path = write_plan(&s, "noise.toml", RANDOM_PLAN);
    let dry = |seed: &str| {
        let out = s.exactl(&["chaos", "run", &path, "--dry-run", "--seed", seed]);
        assert!(out.status.success(), "{}", text(&out.stderr));
        text(&out.stdout)
    };
    let (a, b, c) = (dry("42"), dry("42"), dry("43"));
    assert_eq!(a, b);
    assert_ne!(a, c);
    assert!(a.starts_with("plan \"noise\""), "{a}");
    assert!(
        a.contains("step 1       set M1QAF1<->M1QAF2: delay 1ms"),
        "{a}"
    );
    assert!(a.contains("random 1.1"), "{a}");
    // Each line is an action: 1 step and 10 draws, each done and undone.
    assert_eq!(a.lines().filter(|l| l.contains("s  ")).count(), 22, "{a}");
}

/// Link directions from `link show --json` with faults set, as (from, to, faults).
fn faulted_links(v: &Value) -> Vec<(String, String, Value)> {
    v["links"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|l| !l["faults"].is_null() || l["admin_down"] == true)
        .map(|l| {
            (
                l["from"].as_str().unwrap_or("").to_string(),
                l["to"].as_str().unwrap_or("").to_string(),
                l["faults"].clone(),
            )
        })
        .collect()
}

/// The state letter of a process (`R`, `S`, `T` for stopped, ...), from /proc.
fn proc_state(pid: &str) -> Option<char> {
    let stat = std::fs::read_to_string(format!("/proc/{}/stat", pid.trim())).ok()?;
    stat.rsplit_once(')')?.1.trim_start().chars().next()
}

/// Waits until `status --json` reports every node reachable and every link up.
fn wait_all_up(s: &Scratch, within: Duration) -> Value {
    let deadline = Instant::now() + within;
    loop {
        let out = s.exactl(&["status", "--json"]);
        let v: Value = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
        let all_up = v["summary"]["nodes_reachable"] == 4 && v["summary"]["links_up"] == 6;
        if all_up || Instant::now() > deadline {
            assert!(all_up, "not all up after {within:?}: {}", v["summary"]);
            return v;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

#[test]
fn top_and_chaos_on_a_running_rack() {
    let Some(_) = daemon_or_skip("top_and_chaos_on_a_running_rack") else {
        return;
    };
    let t0 = Instant::now();
    let mut s = Scratch::new("live");
    s.daemons = true;
    let out = s.exactl(&["rack", "up", "--shape", "1x1x1", "--timeout", "30"]);
    assert!(out.status.success(), "rack up: {}", text(&out.stderr));

    // top: two frames one after the other (stdout is not a terminal), naming links.
    let out = s.exactl(&["top", "--count", "2", "--interval", "200ms"]);
    let top = text(&out.stdout);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(
        !top.contains('\x1b'),
        "no screen control off a terminal: {top:?}"
    );
    let headers: Vec<&str> = top.lines().filter(|l| l.starts_with("rack \"")).collect();
    assert_eq!(headers.len(), 2, "{top}");
    assert!(
        headers
            .iter()
            .all(|h| h.contains("4/4 nodes answering, 6/6 links up")),
        "{top}"
    );
    assert!(
        top.contains("\n\nrack \""),
        "frames are separated by a blank line: {top}"
    );
    for l in ["M1QAF1->M1QAF2", "M1QAF2->M1QAF1", "M1QAF3->M1QAF4"] {
        assert!(top.contains(l), "{l}: {top}");
    }
    let out = s.exactl(&[
        "top",
        "--count",
        "1",
        "--interval",
        "100ms",
        "--json",
        "--limit",
        "5",
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let v: Value = serde_json::from_str(text(&out.stdout).trim()).expect("one JSON frame");
    assert_eq!(v["nodes_answering"], 4);
    assert_eq!(v["link_directions"].as_array().unwrap().len(), 5);
    assert!(v["link_directions"][0]["utilization"].is_number(), "{v}");

    // The same timeline for the same seed, against the running rack too.
    let noise = write_plan(&s, "noise.toml", RANDOM_PLAN);
    let dry = || {
        text(
            &s.exactl(&["chaos", "run", &noise, "--dry-run", "--seed", "5"])
                .stdout,
        )
    };
    assert_eq!(dry(), dry());

    // A plan: loss on F1<->F2 for 3 s and F3 frozen for 4 s. While it runs the faults are
    // in force; after it, nothing is left.
    let plan = write_plan(
        &s,
        "plan.toml",
        r#"
        name = "short"
        duration = "4s"
        [[step]]
        at = "0s"
        link = ["M1QAF1", "M1QAF2"]
        set = { loss = "5%" }
        for = "3s"
        [[step]]
        at = "0s"
        node = "M1QAF3"
        action = "pause"
        for = "4s"
        "#,
    );
    let mut run = Background::spawn(s.command(&["chaos", "run", &plan, "--seed", "9"]));
    run.wait_for("pause M1QAF3", Duration::from_secs(10));
    let f3_pid = std::fs::read_to_string(s.dir.join("run/M1QAF3.pid")).unwrap();
    // SIGSTOP takes effect when the kernel next schedules the daemon: give it a moment.
    let deadline = Instant::now() + Duration::from_secs(2);
    while proc_state(&f3_pid) != Some('T') && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
    assert_eq!(proc_state(&f3_pid), Some('T'), "M1QAF3 is stopped");
    // Both queries wait for the frozen F3 (3 s), so they run side by side.
    let show = s.command(&["link", "show", "--json"]);
    let status = s.command(&["status", "--json"]);
    let (show, status) = std::thread::scope(|sc| {
        let a = sc.spawn(move || {
            let mut c = show;
            c.output().unwrap()
        });
        let b = sc.spawn(move || {
            let mut c = status;
            c.output().unwrap()
        });
        (a.join().unwrap(), b.join().unwrap())
    });
    let v: Value = serde_json::from_slice(&show.stdout).expect("link show --json");
    let mut faulted = faulted_links(&v);
    faulted.sort_by(|a, b| (&a.0, &a.1).cmp(&(&b.0, &b.1)));
    assert_eq!(faulted.len(), 2, "{v:#}");
    assert_eq!(
        (faulted[0].0.as_str(), faulted[0].1.as_str()),
        ("M1QAF1", "M1QAF2")
    );
    assert_eq!(
        (faulted[1].0.as_str(), faulted[1].1.as_str()),
        ("M1QAF2", "M1QAF1")
    );
    assert!(faulted.iter().all(|f| f.2["loss"] == 0.05), "{v:#}");
    // F3 cannot answer (`link show` does not say which node; `status` below does).
    assert_eq!(v["unanswered"].as_array().unwrap().len(), 1, "{v:#}");
    let st: Value = serde_json::from_slice(&status.stdout).expect("status --json");
    let reachable: Vec<bool> = st["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n["reachable"] == true)
        .collect();
    assert_eq!(
        reachable,
        vec![true, true, false, true],
        "{}",
        st["summary"]
    );

    let (code, out, err) = run.finish(Duration::from_secs(20));
    assert_eq!(code, Some(0), "stdout:\n{out}\nstderr:\n{err}");
    assert!(out.contains("restore M1QAF1<->M1QAF2: loss 0%"), "{out}");
    assert!(out.contains("resume M1QAF3"), "{out}");
    assert!(
        out.contains("4 of 4 actions (0 failed), 0 undone in the clean-up")
            && out.contains("nothing it set is left"),
        "{out}"
    );
    assert_ne!(proc_state(&f3_pid), Some('T'), "M1QAF3 runs again");
    let out = s.exactl(&["link", "show", "--all", "--json"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["links"].as_array().unwrap().len(), 12);
    assert!(faulted_links(&v).is_empty(), "{v:#}");
    wait_all_up(&s, Duration::from_secs(10));

    // Ctrl-C in the middle of a long plan undoes what it set: a partition and a delay.
    let plan = write_plan(
        &s,
        "long.toml",
        r#"
        duration = "60s"
        [[step]]
        at = "0s"
        link = ["M1QAF1", "M1QAF2"]
        set = { delay = "2ms" }
        [[step]]
        at = "0s"
        partition = [["M1QAF4"]]
        "#,
    );
    let mut run = Background::spawn(s.command(&["chaos", "run", &plan]));
    run.wait_for(
        "cut 3 links: M1QAF4 | rest of the rack",
        Duration::from_secs(10),
    );
    let out = s.exactl(&["link", "show", "--json"]);
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    // 2 delayed directions and 6 cut ones.
    assert_eq!(faulted_links(&v).len(), 8, "{v:#}");
    let kill = Command::new("kill")
        .args(["-INT", &run.child.id().to_string()])
        .status()
        .unwrap();
    assert!(kill.success());
    let (code, out, err) = run.finish(Duration::from_secs(20));
    assert_eq!(
        code,
        Some(1),
        "interrupted is not success; stdout:\n{out}\nstderr:\n{err}"
    );
    assert!(
        err.contains("interrupted at") && err.contains("everything the plan set was undone"),
        "{err}"
    );
    assert!(
        out.contains("interrupted after 2 of 4 actions (0 failed), 2 undone in the clean-up")
            && out.contains("heal 3 links")
            && out.contains("restore M1QAF1<->M1QAF2: delay 0"),
        "{out}"
    );
    let out = s.exactl(&["link", "show", "--all", "--json"]);
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(faulted_links(&v).is_empty(), "{v:#}");
    wait_all_up(&s, Duration::from_secs(15));

    let out = s.exactl(&["rack", "down"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    s.daemons = false;
    eprintln!("top_and_chaos_on_a_running_rack took {:?}", t0.elapsed());
}
