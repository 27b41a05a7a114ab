//! exactl's command line: bad input of every kind is refused with exit code 2 and one line
//! on stderr naming the problem, and nothing is written. One smoke test starts a 4-node
//! rack of real daemons.

mod common;

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use common::{assert_usage_error, daemon_or_skip, rack_toml, rack_toml_free_ports, text, Scratch};

#[test]
fn bad_shapes_are_refused_and_nothing_is_written() {
    for (shape, why) in [
        ("4x0x2", "at least 1"),
        ("abc", "expected XxYxZ"),
        ("4x4", "expected XxYxZ"),
        ("27x1x1", "at most 26"),
        ("-1x2x2", "expected XxYxZ"),
    ] {
        let s = Scratch::new("shape");
        let out = s.exactl(&["rack", "up", "--shape", shape]);
        assert_usage_error(&out, &[shape, why]);
        assert!(!s.dir.exists(), "{shape}: {} was created", s.dir.display());
    }
}

#[test]
fn bad_rack_up_options_are_refused_and_nothing_is_written() {
    for (args, needle) in [
        (vec!["--window", "100"], "--window 100"),
        (vec!["--window", "lots"], "--window"),
        (vec!["--base-port", "65500"], "--base-port 65500"),
        (vec!["--base-port", "70000"], "--base-port"),
        (vec!["--name", "has space"], "--name"),
        (vec!["--timeout", "0"], "--timeout"),
        (vec!["--frobnicate"], "--frobnicate"),
        (vec!["--shape", "26x26x6"], "limited to 1024 nodes"),
    ] {
        let s = Scratch::new("upopt");
        let mut a = vec!["rack", "up"];
        a.extend(&args);
        assert_usage_error(&s.exactl(&a), &[needle]);
        assert!(!s.dir.exists(), "{args:?}: {} was created", s.dir.display());
    }
}

#[test]
fn a_different_shape_for_an_existing_rack_says_how_to_start_over() {
    let s = Scratch::new("mismatch").with_rack_file(&rack_toml("2x2x1"));
    let before = std::fs::read_to_string(s.dir.join("rack.toml")).unwrap();
    let out = s.exactl(&["rack", "up", "--shape", "4x4x2"]);
    assert_usage_error(&out, &["2x2x1", "4x4x2", "rack down", "rack.toml"]);
    let after = std::fs::read_to_string(s.dir.join("rack.toml")).unwrap();
    assert_eq!(before, after, "the rack file was changed");
    assert!(!s.dir.join("tls").exists() && !s.dir.join("run").exists());
}

#[test]
fn unknown_nodes_are_named() {
    let s = Scratch::new("node").with_rack_file(&rack_toml("2x2x1"));
    // Well-formed names outside the 2x2x1 rack.
    for (src, dst, bad) in [
        ("M9QAF1", "M1QAF1", "M9QAF1"),
        ("M1QAF1", "M1QCF1", "M1QCF1"),
        ("M1QAF1", "M3QAF2", "M3QAF2"),
    ] {
        let out = s.exactl(&["ping", src, dst]);
        assert_usage_error(&out, &[bad, "2x2x1"]);
    }
    // Malformed names need no rack file.
    for bad in ["X1", "M1QAF5", "M1QA", "M0", "MxQAF1"] {
        let out = s.exactl(&["ping", "M1QAF1", bad]);
        assert_usage_error(&out, &[bad, "M<blade>Q<slot>F<fpga>"]);
    }
}

#[test]
fn missing_and_unknown_arguments_exit_2() {
    let s = Scratch::new("args");
    for (args, needle) in [
        (vec!["ping"], "<SRC>"),
        (vec!["ping", "M1QAF1"], "<DST>"),
        (vec!["ping", "M1QAF1", "M1QAF2", "--count", "0"], "--count"),
        (
            vec!["ping", "M1QAF1", "M1QAF2", "--count", "many"],
            "--count",
        ),
        (
            vec!["ping", "M1QAF1", "M1QAF2", "--timeout-ms", "0"],
            "--timeout-ms",
        ),
        (vec!["ping", "M1QAF1", "M1QAF2", "extra"], "extra"),
        (vec!["status", "--bogus"], "--bogus"),
        (vec!["rack"], "subcommand"),
        (vec!["rack", "sideways"], "sideways"),
        (vec!["rack", "down", "--timeout", "soon"], "--timeout"),
        (vec!["launch"], "launch"),
        (vec![], "subcommand"),
    ] {
        let out = s.exactl(&args);
        assert_usage_error(&out, &[needle]);
    }
    assert!(!s.dir.exists());
}

#[test]
fn invalid_rack_files_are_named() {
    let cases: Vec<(String, &str)> = vec![
        ("this is not toml".into(), "rack.toml"),
        ("name = \"t\"\nshape = \"2x0x1\"\n[nodes]\n".into(), "2x0x1"),
        (
            rack_toml("1x1x1").replace("[nodes.M1QAF3]", "[nodes.M1QAF9]"),
            "M1QAF9",
        ),
        (
            rack_toml("1x1x1").replace("127.0.0.1:40002", "nohost"),
            "M1QAF3",
        ),
        (
            format!("colour = \"red\"\n{}", rack_toml("1x1x1")),
            "colour",
        ),
        (rack_toml("1x1x1").replace("name = \"t\"\n", ""), "name"),
        // IP addresses that could route out of the rack, or too few for its nodes.
        (
            format!("{}[ip]\nsubnet = \"8.8.8.0/24\"\n", rack_toml("1x1x1")),
            "not private",
        ),
        (
            format!("{}[ip]\nsubnet = \"10.9.9.0/30\"\n", rack_toml("1x1x1")),
            "room for 2 nodes",
        ),
    ];
    for (contents, needle) in &cases {
        let s = Scratch::new("badfile").with_rack_file(contents);
        for args in [
            vec!["status"],
            vec!["status", "--json"],
            vec!["ping", "M1QAF1", "M1QAF2"],
            vec!["rack", "up"],
            vec!["rack", "down"],
            vec!["hosts"],
        ] {
            let out = s.exactl(&args);
            assert_usage_error(&out, &["bad rack file", needle]);
        }
        assert!(!s.dir.join("tls").exists() && !s.dir.join("run").exists());
    }
}

#[test]
fn an_unreadable_rack_file_is_a_usage_error() {
    // A directory where the file should be cannot be read, whoever runs the test.
    let s = Scratch::new("unreadable");
    std::fs::create_dir_all(s.dir.join("rack.toml")).unwrap();
    assert_usage_error(
        &s.exactl(&["status"]),
        &["cannot read rack file", "rack.toml"],
    );
}

#[test]
fn commands_on_a_missing_rack() {
    let s = Scratch::new("missing");
    assert_usage_error(&s.exactl(&["status"]), &["no rack at", "rack up"]);
    assert_usage_error(&s.exactl(&["ping", "M1QAF1", "M1QAF2"]), &["no rack at"]);
    // Stopping a rack that is not there succeeds: there is nothing to stop.
    let out = s.exactl(&["rack", "down"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(text(&out.stdout).contains("nothing was running"));
    assert!(!s.dir.exists());
}

#[test]
fn a_rack_that_is_not_running_is_a_runtime_failure() {
    let s = Scratch::new("stopped").with_rack_file(&rack_toml_free_ports("1x1x1"));
    let out = s.exactl(&["status", "--json"]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("status --json");
    assert_eq!(v["shape"], "1x1x1");
    assert_eq!(v["nodes"].as_array().unwrap().len(), 4);
    assert!(v["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .all(|n| n["reachable"] == false
            && n["error"].as_str().unwrap().contains("process not running")));
    assert!(v["links"]
        .as_array()
        .unwrap()
        .iter()
        .all(|l| l["state"] == "down"));
    // Said in one line, not a table of unreachable nodes (issue 10).
    for args in [
        vec!["status"],
        vec!["link", "show"],
        vec!["top", "--count", "1"],
    ] {
        let out = s.exactl(&args);
        assert_not_running_line(&out, &args);
    }
    let out = s.exactl(&["ping", "M1QAF1", "M1QAF2"]);
    assert_eq!(out.status.code(), Some(1));
    let err = text(&out.stderr);
    assert!(
        err.contains("M1QAF1: process not running") && err.lines().count() == 1,
        "{err}"
    );
    let out = s.exactl(&["rack", "down"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
}

/// Exit 1, nothing on stdout, one line on stderr saying the rack is not running.
#[track_caller]
fn assert_not_running_line(out: &std::process::Output, args: &[&str]) {
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{args:?}: {err}");
    assert!(out.stdout.is_empty(), "{args:?}: {}", text(&out.stdout));
    assert_eq!(err.trim_end().lines().count(), 1, "{args:?}: {err}");
    assert!(
        err.contains("is not running: none of its 4 daemon processes is alive"),
        "{args:?}: {err}"
    );
    assert!(!err.contains("unreachable"), "{args:?}: {err}");
}

#[test]
fn rack_down_never_signals_a_process_that_is_not_its_daemon() {
    let s = Scratch::new("recycled").with_rack_file(&rack_toml("1x1x1"));
    // A live process whose pid sits in a pid file, as if a daemon's pid had been recycled.
    let mut sleeper = Command::new("sleep").arg("30").spawn().unwrap();
    std::fs::create_dir_all(s.dir.join("run")).unwrap();
    std::fs::write(s.dir.join("run/M1QAF1.pid"), format!("{}\n", sleeper.id())).unwrap();
    let out = s.exactl(&["rack", "down"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(text(&out.stdout).contains("nothing was running"));
    assert!(
        sleeper.try_wait().unwrap().is_none(),
        "the sleeper was killed"
    );
    assert!(
        !s.dir.join("run/M1QAF1.pid").exists(),
        "stale pid file left"
    );
    sleeper.kill().unwrap();
    sleeper.wait().unwrap();
}

/// Processes (not zombies) whose command line mentions `dir`.
fn processes_of(dir: &Path) -> Vec<String> {
    let needle = dir.to_string_lossy().into_owned();
    let mut out = Vec::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        if !name.bytes().all(|b| b.is_ascii_digit()) {
            continue;
        }
        let Ok(cmd) = std::fs::read(e.path().join("cmdline")) else {
            continue;
        };
        let cmd = String::from_utf8_lossy(&cmd).replace('\0', " ");
        let zombie = std::fs::read_to_string(e.path().join("stat"))
            .ok()
            .and_then(|s| {
                s.rsplit_once(')')
                    .map(|(_, r)| r.trim_start().starts_with('Z'))
            })
            .unwrap_or(true);
        if cmd.contains(&needle) && !zombie {
            out.push(format!("{name}: {cmd}"));
        }
    }
    out
}

#[test]
fn smoke_one_qfdb_up_status_ping_down() {
    let Some(_) = daemon_or_skip("smoke_one_qfdb_up_status_ping_down") else {
        return;
    };
    let mut s = Scratch::new("smoke");
    s.daemons = true;
    let t0 = Instant::now();
    let out = s.exactl(&["rack", "up", "--shape", "1x1x1", "--timeout", "30"]);
    assert!(
        out.status.success(),
        "rack up failed after {:?}: {}",
        t0.elapsed(),
        text(&out.stderr)
    );
    assert!(
        text(&out.stdout).contains("4 nodes, 6 links up"),
        "{}",
        text(&out.stdout)
    );

    let again = s.exactl(&["rack", "up"]);
    assert_eq!(again.status.code(), Some(1));
    assert!(
        text(&again.stderr).contains("already running"),
        "{}",
        text(&again.stderr)
    );

    let out = s.exactl(&["status", "--json"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("status --json");
    let links = v["links"].as_array().unwrap();
    assert_eq!(links.len(), 6);
    assert!(links.iter().all(|l| l["state"] == "up"), "{v:#}");
    assert!(v["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .all(|n| n["reachable"] == true));

    let out = s.exactl(&["status"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(text(&out.stdout).contains("4/4 nodes answering, 6/6 links up"));

    let out = s.exactl(&["ping", "M1QAF2", "M1QAF3", "--count", "2", "--json"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let r: serde_json::Value = serde_json::from_slice(&out.stdout).expect("ping --json");
    assert_eq!(r["hops"], 1);
    assert_eq!(r["path"], serde_json::json!(["M1QAF2", "M1QAF3"]));
    assert!(r["rtt_us"].as_f64().unwrap() > 0.0);
    // One QFDB link: ~120 ns of link, two switches, the probe's serialisation.
    let modeled = r["modeled_one_way_ns"]
        .as_f64()
        .expect("modeled_one_way_ns");
    assert!((150.0..200.0).contains(&modeled), "{r:#}");

    let out = s.exactl(&["ping", "m1qaf2", "M1QAF3"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let human = text(&out.stdout);
    assert!(human.contains("From M1QAF2 to M1QAF3: 1 hop"), "{human}");
    assert!(human.contains("qfdb"), "{human}");
    let shown = format!(" us, modeled one-way {:.3} us\n", modeled / 1000.0);
    assert!(human.contains(&shown), "{human}");

    // Workloads started with `exactl exec` attach to that node's daemon: a pingpong
    // server on M1QAF4 and its client on M1QAF2, each told its node only by exec.
    let perf = Path::new(common::EXACTL).with_file_name("exanet-perf");
    if perf.exists() {
        use std::io::BufRead;
        use std::process::Stdio;
        let perf = perf.to_str().unwrap();
        let mut server = s
            .command(&[
                "exec",
                "M1QAF4",
                "--",
                perf,
                "pingpong",
                "serve",
                "--sessions",
                "1",
            ])
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let mut ready = String::new();
        std::io::BufReader::new(server.stdout.take().unwrap())
            .read_line(&mut ready)
            .unwrap();
        assert!(ready.starts_with("ready node=M1QAF4 "), "{ready}");
        let out = s.exactl(&[
            "exec",
            "M1QAF2",
            "--",
            perf,
            "pingpong",
            "run",
            "--peer",
            "M1QAF4",
            "--sizes",
            "8",
            "--iterations",
            "20",
            "--json",
            "--quiet",
        ]);
        assert!(out.status.success(), "{}", text(&out.stderr));
        let r: serde_json::Value = serde_json::from_slice(&out.stdout).expect("pingpong --json");
        let peer = r["peer"].as_str().unwrap_or_default();
        assert!(peer.starts_with("M1QAF4:"), "{r}");
        assert_eq!(r["iterations"].as_u64(), Some(20), "{r}");
        // Its one session over, the server exits (killed if it has not within 10 s).
        let deadline = Instant::now() + Duration::from_secs(10);
        let status = loop {
            if let Some(st) = server.try_wait().unwrap() {
                break Some(st);
            }
            if Instant::now() > deadline {
                let _ = server.kill();
                let _ = server.wait();
                break None;
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        assert!(
            status.is_some_and(|st| st.success()),
            "the server did not end with its session: {status:?}"
        );
    } else {
        common::skipped_or_fail("exec of exanet-perf", "no exanet-perf next to exactl");
    }

    let out = s.exactl(&["rack", "down"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(
        text(&out.stdout).contains("stopped 4 daemon"),
        "{}",
        text(&out.stdout)
    );
    s.daemons = false;
    // The daemons are gone (reparented zombies aside), and so are their pid files and sockets.
    let deadline = Instant::now() + Duration::from_secs(5);
    let mut left = processes_of(&s.dir);
    while !left.is_empty() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(100));
        left = processes_of(&s.dir);
    }
    assert!(left.is_empty(), "left behind: {left:?}");
    let run: Vec<_> = std::fs::read_dir(s.dir.join("run"))
        .unwrap()
        .flatten()
        .collect();
    assert!(run.is_empty(), "run/ still holds {run:?}");
    let out = s.exactl(&["rack", "down"]);
    assert!(out.status.success());
    assert!(text(&out.stdout).contains("nothing was running"));
}

/// The modeled one-way latency of `exactl ping SRC DST --json` in ns, and the human
/// report's line with it.
fn modeled_ping(s: &Scratch, src: &str, dst: &str) -> (f64, String) {
    let out = s.exactl(&["ping", src, dst, "--count", "1", "--json"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let r: serde_json::Value = serde_json::from_slice(&out.stdout).expect("ping --json");
    let ns = r["modeled_one_way_ns"]
        .as_f64()
        .unwrap_or_else(|| panic!("no modeled_one_way_ns: {r:#}"));
    let out = s.exactl(&["ping", src, dst, "--count", "1"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let line = text(&out.stdout)
        .lines()
        .find(|l| l.starts_with("rtt min/median/max"))
        .unwrap_or_default()
        .to_string();
    (ns, line)
}

/// `exactl ping` shows, beside the measured round trip, the modeled one-way latency of
/// the path from the rack's `[model]`: a torus hop (a link and two router traversals of
/// ~145 ns) takes longer than a hop inside a QFDB, and a changed `[model]` changes it.
#[test]
fn ping_shows_the_modeled_one_way_latency_of_the_path() {
    let Some(_) = daemon_or_skip("ping_shows_the_modeled_one_way_latency_of_the_path") else {
        return;
    };
    let mut s = Scratch::new("modeled");
    s.daemons = true;
    let out = s.exactl(&["rack", "up", "--shape", "2x1x1", "--timeout", "60"]);
    assert!(out.status.success(), "rack up: {}", text(&out.stderr));

    let (intra, intra_line) = modeled_ping(&s, "M1QAF1", "M1QAF2");
    let (torus, torus_line) = modeled_ping(&s, "M1QAF1", "M1QBF1");
    for (ns, line) in [(intra, &intra_line), (torus, &torus_line)] {
        let shown = format!(", modeled one-way {:.3} us", ns / 1000.0);
        assert!(line.ends_with(&shown), "{line:?} for {ns} ns");
    }
    // One QFDB link and two 13.3 ns switches; one torus link and two 145 ns routers.
    assert!((150.0..200.0).contains(&intra), "intra-QFDB {intra} ns");
    assert!((400.0..480.0).contains(&torus), "torus {torus} ns");
    assert!(torus > intra + 250.0, "torus {torus} ns, intra {intra} ns");

    // exactl reads the model from the rack file: 1 us more per torus link.
    let file = s.dir.join("rack.toml");
    let mut toml = std::fs::read_to_string(&file).unwrap();
    assert!(!toml.contains("[model]"), "{toml}");
    toml.push_str("\n[model]\ntorus_link_ns = 1120\n");
    std::fs::write(&file, toml).unwrap();
    let (slower, _) = modeled_ping(&s, "M1QAF1", "M1QBF1");
    assert!(
        (slower - torus - 1000.0).abs() < 1e-6,
        "{slower} ns, was {torus} ns"
    );
    assert_eq!(modeled_ping(&s, "M1QAF1", "M1QAF2").0, intra);

    let out = s.exactl(&["rack", "down"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    s.daemons = false;
}

/// Every fault and failure command refuses bad input with one line and exit code 2,
/// before any daemon is asked (none runs here: a request would fail with exit 1).
#[test]
fn fault_commands_refuse_bad_input_before_asking_any_daemon() {
    let s = Scratch::new("faults").with_rack_file(&rack_toml("2x2x1"));
    let link = |rest: &[&'static str]| {
        let mut v = vec!["link", "set", "M1QAF1", "M1QBF1"];
        v.extend_from_slice(rest);
        v
    };
    for (args, needles) in [
        // Nodes and links.
        (
            vec!["link", "set", "M9QAF1", "M1QAF1", "--loss", "1%"],
            vec!["M9QAF1", "2x2x1"],
        ),
        (
            vec!["link", "set", "M1QAF2", "M1QBF3", "--loss", "1%"],
            vec!["not linked"],
        ),
        (
            vec!["link", "set", "M1QAF1", "M1QAF1", "--loss", "1%"],
            vec!["same node"],
        ),
        (vec!["link", "set", "M1QAF1"], vec!["<B>"]),
        // Units and ranges.
        (
            link(&["--loss", "101%"]),
            vec!["--loss", "outside 0% to 100%"],
        ),
        (link(&["--loss", "-1%"]), vec!["--loss"]),
        (link(&["--loss", "0.5"]), vec!["--loss", "percentage"]),
        (link(&["--corrupt", "lots"]), vec!["--corrupt"]),
        (link(&["--delay", "5"]), vec!["--delay", "no unit"]),
        (link(&["--delay", "5mss"]), vec!["--delay", "unknown unit"]),
        (link(&["--jitter", "1e3us"]), vec!["--jitter"]),
        (link(&["--rate", "100"]), vec!["--rate", "no unit"]),
        (link(&["--rate", "100MB/s/s"]), vec!["--rate"]),
        // Bytes or bits? Refused rather than guessed (issue 10, defect 5).
        (
            link(&["--rate", "100MB"]),
            vec!["--rate", "not a rate", "MB/s"],
        ),
        (link(&["--rate", "5B"]), vec!["--rate", "not a rate"]),
        (
            link(&["--rate", "100M"]),
            vec!["--rate", "100Mbit", "100MB/s"],
        ),
        (link(&["--rate", "100Mb"]), vec!["--rate", "bits or bytes"]),
        (link(&["--delay", "11s"]), vec!["delay", "limit"]),
        (link(&["--rate", "10bit"]), vec!["rate", "minimum"]),
        // Contradictions.
        (link(&["--down", "--up"]), vec!["--down", "--up"]),
        (link(&["--rate", "1Gbit", "--no-rate"]), vec!["--no-rate"]),
        (link(&[]), vec!["nothing to set"]),
        (link(&["--down", "--dir", "A-B"]), vec!["--dir"]),
        (
            link(&["--loss", "1%", "--dir", "sideways"]),
            vec!["--dir", "sideways"],
        ),
        (vec!["link", "clear", "M1QAF1"], vec!["<B>"]),
        (vec!["link", "clear"], vec!["<A>"]),
        (
            vec!["link", "clear", "M1QAF1", "M1QBF1", "--all"],
            vec!["--all"],
        ),
        (vec!["link", "show", "--bogus"], vec!["--bogus"]),
        (vec!["link", "wiggle"], vec!["wiggle"]),
        // Nodes.
        (vec!["node", "kill", "M9QAF1"], vec!["M9QAF1"]),
        (vec!["node", "kill"], vec!["<NAME>"]),
        (vec!["node", "explode", "M1QAF1"], vec!["explode"]),
        // Partitions.
        (vec!["partition"], vec!["<NODES>"]),
        (
            vec!["partition", "M1QAF1", "--from", "M1QAF1,M1QAF2"],
            vec!["both sides"],
        ),
        (
            vec!["partition", "M1QAF2", "--from", "M1QBF3"],
            vec!["no link joins"],
        ),
        (
            vec!["partition", "M1QAF1", "--from", "M7QAF1"],
            vec!["M7QAF1"],
        ),
        (vec!["heal", "now"], vec!["now"]),
    ] {
        let out = s.exactl(&args);
        assert_usage_error(&out, &needles.iter().map(|n| &**n).collect::<Vec<_>>());
    }
    // Nothing was created beside the rack file: no certificates, no run directory.
    assert!(!s.dir.join("tls").exists() && !s.dir.join("run").exists());
}

/// A killed node and a stopped rack are reported at once and briefly; every command that
/// changes something says what, in one line (issue 10, operator experience).
#[test]
fn changes_are_told_and_dead_daemons_are_named_at_once() {
    let Some(_) = daemon_or_skip("changes_are_told_and_dead_daemons_are_named_at_once") else {
        return;
    };
    let mut s = Scratch::new("gone");
    s.daemons = true;
    let out = s.exactl(&["rack", "up", "--shape", "1x1x1", "--timeout", "30"]);
    assert!(out.status.success(), "rack up: {}", text(&out.stderr));
    let said = |args: &[&str]| -> String {
        let out = s.exactl(args);
        assert!(out.status.success(), "{args:?}: {}", text(&out.stderr));
        let line = text(&out.stdout);
        assert_eq!(line.lines().count(), 1, "{args:?}: {line:?}");
        line.trim_end().to_string()
    };

    assert_eq!(
        said(&["link", "set", "M1QAF1", "M1QAF2", "--delay", "200us", "--loss", "1%"]),
        "M1QAF1 -> M1QAF2: delay 200us, loss 1% (both directions)"
    );
    assert_eq!(
        said(&["link", "set", "M1QAF1", "M1QAF2", "--dir", "A-B", "--rate", "12.5MB/s"]),
        "M1QAF1 -> M1QAF2: rate 100Mbit (this direction only); in force now: delay 200us, \
         rate 100Mbit, loss 1%"
    );
    let line = said(&["link", "clear", "M1QAF1", "M1QAF2"]);
    assert!(
        line.starts_with("M1QAF1 -> M1QAF2: faults cleared, removed M1QAF1->M1QAF2 delay 200us, rate 100Mbit, loss 1%; M1QAF2->M1QAF1 delay 200us, loss 1%"),
        "{line}"
    );
    assert_eq!(
        said(&["partition", "M1QAF4"]),
        "cut 3 links between M1QAF4 and the rest of the rack: M1QAF1<->M1QAF4, \
         M1QAF2<->M1QAF4, M1QAF3<->M1QAF4"
    );
    assert!(said(&["heal"]).starts_with("healed 3 links: M1QAF1<->M1QAF4"));
    assert_eq!(said(&["heal"]), "no link was cut: nothing to heal");
    assert!(said(&["link", "clear", "--all"]).contains("faults cleared at all 4 nodes"));
    let pid2 = std::fs::read_to_string(s.dir.join("run/M1QAF2.pid")).unwrap();
    let pid2 = pid2.trim();
    assert_eq!(
        said(&["node", "pause", "M1QAF2"]),
        format!("M1QAF2: paused (SIGSTOP to pid {pid2})")
    );
    assert_eq!(
        said(&["node", "resume", "M1QAF2"]),
        format!("M1QAF2: resumed (SIGCONT to pid {pid2})")
    );
    let pid3 = std::fs::read_to_string(s.dir.join("run/M1QAF3.pid")).unwrap();
    assert_eq!(
        said(&["node", "kill", "M1QAF3"]),
        format!("M1QAF3: killed (SIGKILL to pid {})", pid3.trim())
    );

    // The killed node: "process not running", at once, from every command that asks it.
    let out = s.exactl(&["status"]);
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    let f3: Vec<&str> = stdout
        .lines()
        .filter(|l| l.starts_with("M1QAF3 ") && !l.contains("<->"))
        .collect();
    assert_eq!(f3.len(), 1, "{stdout}");
    assert!(f3[0].contains("process not running"), "{stdout}");
    assert!(stdout.contains("3/4 nodes answering"), "{stdout}");
    assert!(!stdout.contains("unreachable"), "{stdout}");
    assert!(
        stderr.trim_end() == "exactl: 1 of 4 nodes did not answer (1 with no process running)",
        "{stderr}"
    );
    for (src, dst, role) in [("M1QAF3", "M1QAF1", "send"), ("M1QAF1", "M1QAF3", "answer")] {
        let out = s.exactl(&["ping", src, dst]);
        let err = text(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{err}");
        assert_eq!(err.lines().count(), 1, "{err}");
        assert!(
            err.contains("M1QAF3: process not running")
                && err.contains(&format!("cannot {role} probes")),
            "{err}"
        );
    }
    let out = s.exactl(&["link", "show"]);
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(!stdout.contains("no link has faults"), "{stdout}");
    assert!(
        stderr.contains("1 of 4 nodes did not answer")
            && stderr.contains("M1QAF3: process not running"),
        "{stderr}"
    );
    let out = s.exactl(&["link", "set", "M1QAF3", "M1QAF1", "--loss", "1%"]);
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("M1QAF3: process not running"), "{err}");

    // The whole rack stopped: one line.
    let out = s.exactl(&["rack", "down"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    s.daemons = false;
    for args in [
        vec!["status"],
        vec!["link", "show"],
        vec!["top", "--count", "1"],
    ] {
        assert_not_running_line(&s.exactl(&args), &args);
    }
    let out = s.exactl(&["ping", "M1QAF1", "M1QAF2"]);
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("M1QAF1: process not running"), "{err}");
}

/// `exactl exec` stands in for `ssh NODE CMD`: the command gets the node's attach
/// settings, its stdin, stdout and stderr, and its exit status is exactl's; what cannot
/// run exits as a shell would (127 not found), and a bad node is a usage error.
#[test]
fn exec_runs_a_command_as_the_node_and_passes_its_status_through() {
    use std::io::Write;
    use std::process::Stdio;
    let s = Scratch::new("exec").with_rack_file(&rack_toml("1x1x1"));
    let out = s.exactl(&[
        "exec",
        "m1qaf3",
        "--",
        "sh",
        "-c",
        "echo \"$EXANET_NODE $EXANET_RACK\"; echo to-stderr >&2; exit 7",
    ]);
    assert_eq!(out.status.code(), Some(7), "{}", text(&out.stderr));
    let dir = s.dir.canonicalize().unwrap();
    assert_eq!(text(&out.stdout), format!("M1QAF3 {}\n", dir.display()));
    assert_eq!(text(&out.stderr), "to-stderr\n");

    // As a remote-shell agent calls it: no `--`, the command's own options after it.
    let mut child = s
        .command(&["exec", "M1QAF1", "tr", "-d", "l"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(b"hello").unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success());
    assert_eq!(text(&out.stdout), "heo");

    let out = s.exactl(&["exec", "M1QAF2", "exanet-no-such-command"]);
    assert_eq!(out.status.code(), Some(127));
    assert!(
        text(&out.stderr).contains("cannot run exanet-no-such-command on M1QAF2"),
        "{}",
        text(&out.stderr)
    );
    assert_usage_error(&s.exactl(&["exec", "M1QCF1", "true"]), &["M1QCF1"]);
    assert_usage_error(&s.exactl(&["exec", "M1QAF1"]), &["CMD"]);
}

/// A reader that goes away early (`exactl hosts | head -1`) ends exactl quietly and with
/// success, as it ends a Unix tool: no panic of `print!` on a closed pipe.
#[test]
fn a_closed_stdout_ends_exactl_quietly() {
    let s = Scratch::new("closed-stdout").with_rack_file(&rack_toml("4x4x2"));
    for _ in 0..5 {
        let mut c = s.command(&["hosts"]);
        c.stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped());
        let mut child = c.spawn().unwrap();
        // Close the read end before exactl writes its 128 lines.
        drop(child.stdout.take());
        let out = child.wait_with_output().unwrap();
        let err = text(&out.stderr);
        assert!(!err.contains("panicked"), "{err}");
        assert!(out.status.success(), "{:?}: {err}", out.status);
    }
}
