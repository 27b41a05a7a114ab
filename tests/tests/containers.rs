//! Container racks on a real Docker engine (issue 5): a 16-node compose rack with
//! workloads across QFDBs, a restart, a real Prometheus checking every dashboard
//! expression, clean teardown; the same rack as a swarm stack; the Ansible playbook; the
//! Kubernetes manifests through kustomize.
//!
//! Every test here is `#[ignore]`d: they need Docker, the `exanet:latest` image
//! (`docker/build.sh`), Debian's `prometheus`, `ansible-playbook` and `kubectl` (Debian's
//! kubernetes-client). Without kubectl the Kubernetes test prints a SKIPPED line and
//! passes, unless `EXANET_REQUIRE_KUBECTL` is set (to anything).
//! `scripts/test-containers.sh` installs what is missing, builds the image and runs them
//! one at a time. Set `EXANET_IMAGE` to test another image.

use std::collections::BTreeSet;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use exanet_tests::{bins, http_get, run_with_timeout, runs, skip_unless_required, Run};
use serde_json::Value;

const SHAPE: &str = "2x2x1";
/// Not the generator's default (10.213/16): a rack a developer has up stays untouched.
const SUBNET: &str = "10.219.0.0/16";
const SWARM_NAME_PREFIX: &str = "exanet-swarm-test";
const HTTP: Duration = Duration::from_secs(5);

fn image() -> String {
    std::env::var("EXANET_IMAGE")
        .ok()
        .filter(|v| !v.is_empty())
        .unwrap_or_else(|| "exanet:latest".into())
}

/// A test's scratch directory, removed when the test ends however it ends (a test that
/// failed used to leave its compose file and rack behind).
/// Open to every user as a plain directory is (tempfile makes its own 0700), since what
/// the containers run may not be root.
fn scratch(tag: &str) -> tempfile::TempDir {
    use std::os::unix::fs::PermissionsExt;
    let d = tempfile::Builder::new()
        .prefix(&format!("exanet-ct-{tag}-"))
        .tempdir()
        .unwrap();
    std::fs::set_permissions(d.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    d
}

fn command(program: &str, args: &[&str]) -> Command {
    let mut c = Command::new(program);
    c.args(args);
    c
}

/// Runs a command, panicking with everything it printed unless it succeeds.
#[track_caller]
fn must(cmd: Command, timeout: Duration) -> Run {
    let shown = format!("{cmd:?}");
    let r = run_with_timeout(cmd, timeout).unwrap_or_else(|e| panic!("{e}"));
    assert!(r.success(), "{shown} failed: {}", r.describe());
    r
}

fn quiet(cmd: Command, timeout: Duration) -> Option<Run> {
    run_with_timeout(cmd, timeout).ok()
}

/// Polls `f` until it returns Ok or `timeout` passes; panics with its last error.
#[track_caller]
fn wait_until(what: &str, timeout: Duration, mut f: impl FnMut() -> Result<(), String>) {
    let start = Instant::now();
    loop {
        match f() {
            Ok(()) => {
                eprintln!("{what}: {:.1} s", start.elapsed().as_secs_f64());
                return;
            }
            Err(e) if start.elapsed() > timeout => {
                panic!("{what}: not within {} s: {e}", timeout.as_secs())
            }
            Err(_) => std::thread::sleep(Duration::from_millis(500)),
        }
    }
}

/// Generates a rack with exactl (the host build), as a user would.
fn generate(out: &Path, name: &str, extra: &[&str]) {
    let mut c = Command::new(bins().exactl);
    c.args(["rack", "compose", "--shape", SHAPE, "--subnet", SUBNET])
        .args(["--name", name, "--image", &image(), "--out"])
        .arg(out)
        .args(extra);
    must(c, Duration::from_secs(30));
}

fn rack_nodes(rack_dir: &Path) -> Vec<(String, String)> {
    let text = std::fs::read_to_string(rack_dir.join("rack.toml")).unwrap();
    let v: toml::Value = toml::from_str(&text).unwrap();
    v["nodes"]
        .as_table()
        .unwrap()
        .iter()
        .map(|(n, e)| (n.clone(), e["metrics"].as_str().unwrap().to_string()))
        .collect()
}

/// A compose project, taken down with its volumes whatever happens to the test.
struct Compose {
    dir: PathBuf,
    project: String,
}

impl Compose {
    fn cmd(&self, args: &[&str]) -> Command {
        let mut c = Command::new("docker-compose");
        // -p as well as .env: the teardown must hit this project even if .env is gone.
        c.current_dir(&self.dir)
            .args(["-p", &self.project])
            .args(args);
        c
    }
    fn node_container(&self, node: &str) -> String {
        let r = must(self.cmd(&["ps", "-q", node]), Duration::from_secs(30));
        r.stdout.trim().to_string()
    }
}

impl Drop for Compose {
    fn drop(&mut self) {
        let _ = run_with_timeout(
            self.cmd(&["down", "-v", "--remove-orphans", "-t", "5"]),
            Duration::from_secs(120),
        );
    }
}

/// The IP address `exactl hosts` gives `node` of the rack in `rack_dir`.
fn host_addr(rack_dir: &Path, node: &str) -> String {
    let r = must(
        command(
            bins().exactl.to_str().unwrap(),
            &["--rack", rack_dir.to_str().unwrap(), "hosts"],
        ),
        Duration::from_secs(30),
    );
    r.stdout
        .lines()
        .find_map(|l| {
            let mut f = l.split_whitespace();
            let addr = f.next()?;
            f.any(|n| n == node).then(|| addr.to_string())
        })
        .unwrap_or_else(|| panic!("no address for {node} in:\n{}", r.stdout))
}

/// Starts the IP services of `a` and `b`, then: ping from `a` to `b`, and iperf3 TCP from
/// `a` to a server on `b`, through the emulated fabric.
fn ip_between_containers(compose: &Compose, rack_dir: &Path, a: &str, b: &str) {
    let (a_ip, b_ip) = (format!("{a}-ip"), format!("{b}-ip"));
    must(
        compose.cmd(&["up", "-d", &a_ip, &b_ip]),
        Duration::from_secs(120),
    );
    let b_addr = host_addr(rack_dir, b);
    wait_until(
        &format!("ping {a} -> {b} ({b_addr})"),
        Duration::from_secs(60),
        || {
            let r = quiet(
                compose.cmd(&["exec", "-T", a, "ping", "-c", "1", "-W", "2", &b_addr]),
                Duration::from_secs(20),
            )
            .ok_or("ping timed out")?;
            r.success().then_some(()).ok_or(r.describe())
        },
    );
    let ping = must(
        compose.cmd(&["exec", "-T", a, "ping", "-c", "5", "-W", "2", &b_addr]),
        Duration::from_secs(30),
    );
    assert!(
        ping.stdout.contains("5 packets received"),
        "{}",
        ping.stdout
    );
    must(
        compose.cmd(&["exec", "-T", "-d", b, "iperf3", "-s", "-1"]),
        Duration::from_secs(30),
    );
    let mut tcp = None;
    wait_until(
        &format!("iperf3 {a} -> {b}"),
        Duration::from_secs(60),
        || {
            let r = quiet(
                compose.cmd(&["exec", "-T", a, "iperf3", "-c", &b_addr, "-t", "2", "-J"]),
                Duration::from_secs(40),
            )
            .ok_or("iperf3 timed out")?;
            if !r.success() {
                return Err(r.describe());
            }
            let v: Value = serde_json::from_str(&r.stdout).map_err(|e| e.to_string())?;
            tcp = v["end"]["sum_received"]["bits_per_second"].as_f64();
            Ok(())
        },
    );
    let bps = tcp.expect("iperf3 reported a rate");
    assert!(bps > 1e6, "iperf3 TCP {a} -> {b}: {bps} b/s");
    eprintln!(
        "IP over ExaNet between containers: iperf3 TCP {a} -> {b} {:.0} Mb/s",
        bps / 1e6
    );
}

/// What docker still holds of a compose project: containers, networks, volumes.
fn leftovers(project: &str) -> Vec<String> {
    let filter = format!("label=com.docker.compose.project={project}");
    let mut out = Vec::new();
    for what in [
        vec!["ps", "-aq", "--filter", &filter],
        vec!["network", "ls", "-q", "--filter", &filter],
        vec!["volume", "ls", "-q", "--filter", &filter],
    ] {
        let r = must(command("docker", &what), Duration::from_secs(30));
        out.extend(
            r.stdout
                .split_whitespace()
                .map(|s| format!("{} {s}", what[0])),
        );
    }
    out
}

/// A Prometheus from Debian's package on the host, scraping the rack's containers.
struct Prometheus {
    child: Child,
    addr: String,
}

impl Prometheus {
    fn start(config: &Path, data: &Path) -> Prometheus {
        let port = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let addr = format!("127.0.0.1:{port}");
        let log = std::fs::File::create(data.with_extension("log")).unwrap();
        let child = Command::new("prometheus")
            .arg(format!("--config.file={}", config.display()))
            .arg(format!("--storage.tsdb.path={}", data.display()))
            .arg(format!("--web.listen-address={addr}"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("prometheus (Debian's package) is installed");
        Prometheus { child, addr }
    }

    /// A GET of Prometheus' HTTP API. HTTP/1.0, so that the answer is not chunked.
    fn api(&self, path_and_query: &str) -> Result<Value, String> {
        use std::io::{Read, Write};
        let mut s = std::net::TcpStream::connect(&self.addr).map_err(|e| e.to_string())?;
        s.set_read_timeout(Some(HTTP)).map_err(|e| e.to_string())?;
        write!(
            s,
            "GET {path_and_query} HTTP/1.0\r\nHost: {}\r\n\r\n",
            self.addr
        )
        .map_err(|e| e.to_string())?;
        let mut raw = String::new();
        s.read_to_string(&mut raw).map_err(|e| e.to_string())?;
        let (head, body) = raw
            .split_once("\r\n\r\n")
            .ok_or(format!("no headers: {raw}"))?;
        if !head.starts_with("HTTP/1.1 200") && !head.starts_with("HTTP/1.0 200") {
            return Err(format!("{path_and_query}: {head} {body}"));
        }
        serde_json::from_str(body).map_err(|e| format!("{e}: {body}"))
    }

    fn query(&self, expr: &str) -> Result<Vec<Value>, String> {
        let v = self.api(&format!("/api/v1/query?query={}", urlencode(expr)))?;
        if v["status"] != "success" {
            return Err(format!("{expr}: {v}"));
        }
        Ok(v["data"]["result"].as_array().cloned().unwrap_or_default())
    }
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn urlencode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// Every `expr` of a Grafana dashboard, with its variables given values that select the
/// whole rack (`$node`, `$port` are regex matchers) and the ranges of a short test.
fn dashboard_exprs(path: &Path) -> Vec<String> {
    fn walk(v: &Value, out: &mut Vec<String>) {
        match v {
            Value::Object(m) => {
                if let (Some(Value::String(e)), true) = (m.get("expr"), m.contains_key("refId")) {
                    out.push(e.clone());
                }
                m.values().for_each(|v| walk(v, out));
            }
            Value::Array(a) => a.iter().for_each(|v| walk(v, out)),
            _ => {}
        }
    }
    let v: Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap())
        .unwrap_or_else(|e| panic!("{}: not JSON: {e}", path.display()));
    let mut out = Vec::new();
    walk(&v, &mut out);
    out.into_iter()
        .map(|e| {
            e.replace("$__rate_interval", "1m")
                .replace("$__range", "10m")
                .replace("$node", ".*")
                .replace("$port", ".*")
        })
        .collect()
}

/// `exactl mpirun` on the compose rack: Open MPI and the program are this host's (run in
/// containers beside the nodes', `exactl exec --host-programs`), every byte checked by the
/// program (`tests/programs/mpi_checks.c`). Over the NI (the libfabric provider) on four
/// nodes of two QFDBs, and over IP over ExaNet between the two nodes whose IP services
/// the test started.
fn mpi_on_the_rack(dir: &Path, rack_dir: &Path) {
    let test = "containers::compose_rack_runs_workloads_restarts_and_is_scraped (MPI)";
    if !runs("mpicc.openmpi", "--version") || !runs("mpirun.openmpi", "--version") {
        // The container tests need nothing of MPI but this part; CI installs it.
        exanet_tests::skip_unless_required(
            "EXANET_REQUIRE_IP",
            test,
            "no mpicc.openmpi or mpirun.openmpi (Debian: openmpi-bin libopenmpi-dev)",
        );
        return;
    }
    let prog = exanet_tests::compile_c(
        "mpicc.openmpi",
        dir,
        "mpi_checks",
        include_str!("../programs/mpi_checks.c"),
        &["-O2"],
    );
    for (fabric, nodes, said, ranks) in [
        (
            "ni",
            "M1QAF2,M2QBF3,M1QBF1,M2QAF4",
            "messages over the NI",
            4,
        ),
        (
            "ip",
            "M2QBF3,M1QAF2",
            "messages over TCP over IP over ExaNet",
            2,
        ),
    ] {
        let mut c = Command::new(bins().exactl);
        c.current_dir(dir)
            .arg("--rack")
            .arg(rack_dir)
            .args(["mpirun", "--fabric", fabric, "--nodes", nodes])
            .args(["--mpi-arg=--timeout", "--mpi-arg=100", "--"])
            .arg(&prog);
        let t0 = Instant::now();
        let r = must(c, Duration::from_secs(150));
        eprintln!(
            "MPI program on the compose rack, --fabric {fabric}: {:.1} s",
            t0.elapsed().as_secs_f64()
        );
        let ok = format!("MPI checks: ok on {ranks} ranks");
        assert!(
            r.stderr.contains(said) && r.stdout.contains(&ok),
            "--fabric {fabric}: {}",
            r.describe()
        );
    }
}

/// A job on the compose rack whose node's container is killed ends, the node named:
/// exactl owns no process of a container, so its watch sees the node stop answering
/// (issue 48). The node is restarted after, for what follows.
fn a_job_ends_when_its_node_dies(dir: &Path, rack_dir: &Path) {
    let test = "containers::compose_rack_runs_workloads_restarts_and_is_scraped (node death)";
    if !runs("mpirun.openmpi", "--version") {
        exanet_tests::skip_unless_required("EXANET_REQUIRE_IP", test, "no mpirun.openmpi");
        return;
    }
    const VICTIM: &str = "M2QBF3";
    let exactl = |args: &[&str]| {
        let mut c = Command::new(bins().exactl);
        c.current_dir(dir).arg("--rack").arg(rack_dir).args(args);
        c
    };
    // Not an MPI program: the launcher and its daemons are what must end.
    let mut job = exactl(&[
        "mpirun",
        "--fabric",
        "ip",
        "--nodes",
        "M1QAF2,M2QBF3",
        "--",
        "sleep",
        "300",
    ])
    .stdout(std::process::Stdio::piped())
    .stderr(std::process::Stdio::piped())
    .spawn()
    .unwrap();
    // The ranks running: long enough for the launcher to have started them.
    std::thread::sleep(Duration::from_secs(8));
    assert!(
        job.try_wait().unwrap().is_none(),
        "{test}: the job ended before the kill"
    );
    must(exactl(&["node", "kill", VICTIM]), Duration::from_secs(60));
    let killed = Instant::now();
    let bound = Duration::from_secs(45);
    let status = loop {
        if let Some(st) = job.try_wait().unwrap() {
            break st;
        }
        if killed.elapsed() > bound {
            let _ = job.kill();
            panic!("{test}: the job still runs {bound:?} after {VICTIM} was killed");
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let took = killed.elapsed();
    let out = job.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    eprintln!(
        "{test}: the job ended ({status}) {:.1} s after the kill",
        took.as_secs_f64()
    );
    assert!(
        !status.success() && err.contains(&format!("node {VICTIM} died")),
        "{test}: {status}, the node not named: {err}"
    );
    let r = must(
        exactl(&["node", "restart", VICTIM]),
        Duration::from_secs(120),
    );
    assert!(r.stderr.contains("rejoined"), "{}", r.describe());
}

/// The same with an MPICH that reaches fabrics through libfabric (PyPI's, in a virtual
/// environment outside `/usr`, found by `EXANET_MPICH_OFI` as in `ip_over_exanet`):
/// Hydra's proxies call back to its address on the compose network, and the containers
/// have the environment mounted at its path.
fn mpich_on_the_rack(dir: &Path, rack_dir: &Path) {
    let test = "containers::compose_rack_runs_workloads_restarts_and_is_scraped (MPICH)";
    let Some(bin) = exanet_tests::mpich_ofi_or_skip(test) else {
        return;
    };
    let cc = bin.join("mpicc");
    let prog = exanet_tests::compile_c(
        &cc.to_string_lossy(),
        dir,
        "mpi_checks_mpich",
        include_str!("../programs/mpi_checks.c"),
        &["-O2"],
    );
    let mut c = Command::new(bins().exactl);
    c.current_dir(dir)
        .arg("--rack")
        .arg(rack_dir)
        .args(["mpirun", "--mpi", "mpich", "--mpirun"])
        .arg(bin.join("mpiexec"))
        .args(["--nodes", "M1QAF2,M2QBF3,M1QBF1,M2QAF4", "--"])
        .arg(&prog)
        // Hydra's own limit, under the test's.
        .env("MPIEXEC_TIMEOUT", "100");
    let t0 = Instant::now();
    let r = must(c, Duration::from_secs(150));
    eprintln!(
        "MPICH program on the compose rack: {:.1} s",
        t0.elapsed().as_secs_f64()
    );
    assert!(
        r.stderr
            .contains("messages over the NI (libfabric provider exanet, MPICH ch4:ofi)")
            && r.stdout.contains("MPI checks: ok on 4 ranks"),
        "{}",
        r.describe()
    );
}

/// Runs `exanet-perf ... run` in a node's container; the JSON lines it printed.
fn perf(compose: &Compose, node: &str, args: &[&str]) -> Vec<Value> {
    let mut all = vec!["exec", "-T", node, "exanet-perf"];
    all.extend_from_slice(args);
    all.push("--json");
    let r = must(compose.cmd(&all), Duration::from_secs(120));
    r.stdout
        .lines()
        .filter(|l| l.starts_with('{'))
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

#[test]
#[ignore = "needs Docker and the exanet image: scripts/test-containers.sh"]
fn compose_rack_runs_workloads_restarts_and_is_scraped() {
    let scratch_dir = scratch("compose");
    let dir = scratch_dir.path();
    let project = format!("exanet-ct-{}", std::process::id());
    generate(dir, &project, &["--prometheus", "--grafana"]);
    let compose = Compose {
        dir: dir.to_path_buf(),
        project: project.clone(),
    };
    // Both parsers docker-compose has: v1 validates the file against its schema here.
    must(compose.cmd(&["config", "-q"]), Duration::from_secs(60));
    let promtool = must(
        command(
            "promtool",
            &[
                "check",
                "config",
                dir.join("prometheus/prometheus.yml").to_str().unwrap(),
            ],
        ),
        Duration::from_secs(30),
    );
    assert!(
        promtool.stdout.contains("SUCCESS"),
        "{}",
        promtool.describe()
    );

    // Prometheus and Grafana images cannot be pulled here: start the rack's own services.
    let nodes = rack_nodes(&dir.join("rack"));
    assert_eq!(nodes.len(), 16);
    let mut up = vec!["up", "-d", "pki"];
    up.extend(nodes.iter().map(|(n, _)| n.as_str()));
    let t0 = Instant::now();
    must(compose.cmd(&up), Duration::from_secs(300));
    eprintln!("docker-compose up: {:.1} s", t0.elapsed().as_secs_f64());

    let ready = |addr: &str| -> Result<(), String> {
        let r = http_get(addr, "/ready", HTTP)?;
        (r.status == 200).then_some(()).ok_or(r.body)
    };
    wait_until(
        "every node ready (all links up)",
        Duration::from_secs(120),
        || nodes.iter().try_for_each(|(_, m)| ready(m)),
    );
    eprintln!(
        "from up to every link up: {:.1} s",
        t0.elapsed().as_secs_f64()
    );
    let prom = Prometheus::start(
        &dir.join("prometheus/prometheus.yml"),
        &dir.join("prom-data"),
    );
    wait_until("every container healthy", Duration::from_secs(120), || {
        for (n, _) in &nodes {
            let id = compose.node_container(n);
            let r = must(
                command(
                    "docker",
                    &["inspect", "-f", "{{.State.Health.Status}}", &id],
                ),
                Duration::from_secs(30),
            );
            if r.stdout.trim() != "healthy" {
                return Err(format!("{n}: {}", r.stdout.trim()));
            }
        }
        Ok(())
    });

    // IP over ExaNet between containers of different QFDBs: each node's IP service runs in
    // its container's network namespace; busybox's ping and iperf3 run unmodified.
    ip_between_containers(&compose, &dir.join("rack"), "M2QBF3", "M1QAF2");

    // Workloads across QFDBs: server on M1QAF2 (QFDB M1QA), clients on M2QBF3 (M2QB).
    let server = compose
        .cmd(&[
            "exec",
            "-T",
            "M1QAF2",
            "exanet-perf",
            "pingpong",
            "serve",
            "--sessions",
            "3",
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let pp = perf(
        &compose,
        "M2QBF3",
        &["pingpong", "run", "--peer", "M1QAF2", "--iterations", "200"],
    );
    assert_eq!(pp.len(), 5, "{pp:?}");
    assert!(pp
        .iter()
        .all(|r| r["iterations"] == 200 && r["p50_us"].as_f64().unwrap() > 0.0));
    let w = perf(
        &compose,
        "M2QBF3",
        &[
            "rdma-lat",
            "run",
            "--peer",
            "M1QAF2",
            "--verify",
            "--sizes",
            "4K,1M",
            "--iterations",
            "5",
        ],
    );
    assert_eq!(w.len(), 2, "{w:?}");
    // Every transfer compared: 5 measured and the 1 warm-up of each size.
    assert!(w.iter().all(|r| r["verified_transfers"] == 6), "{w:?}");
    // A workload in a container of its own, sharing M2QBF3's IPC namespace and the rack
    // directory, with no network: it reaches the NI through /rack/run/M2QBF3.ni.
    let m2qbf3 = compose.node_container("M2QBF3");
    let rack_mount = format!("{}:/rack", dir.join("rack").display());
    let ipc = format!("container:{m2qbf3}");
    let img = image();
    let r = must(
        command(
            "docker",
            &[
                "run",
                "--rm",
                "--ipc",
                &ipc,
                "--network",
                "none",
                "-v",
                &rack_mount,
                "-e",
                "EXANET_NODE=M2QBF3",
                &img,
                "exanet-perf",
                "rdma-bw",
                "run",
                "--peer",
                "M1QAF2",
                "--op",
                "read",
                "--verify",
                "--sizes",
                "256K",
                "--json",
            ],
        ),
        Duration::from_secs(120),
    );
    let bw: Value =
        serde_json::from_str(r.stdout.lines().find(|l| l.starts_with('{')).unwrap()).unwrap();
    // rdma-bw compares what each of its 8 window slots holds at the end.
    assert_eq!(bw["verified_transfers"], 8, "{}", r.describe());
    let served = server.wait_with_output().unwrap();
    assert!(
        served.status.success(),
        "{}",
        String::from_utf8_lossy(&served.stderr)
    );

    // An unmodified MPI program, compiled and launched on this host, its ranks on the
    // nodes, its messages through the NI, then over IP over ExaNet; and MPICH's.
    mpi_on_the_rack(dir, &dir.join("rack"));
    mpich_on_the_rack(dir, &dir.join("rack"));
    a_job_ends_when_its_node_dies(dir, &dir.join("rack"));

    // NACKs for the dashboards: a client whose peer has no server is refused (no_context)
    // until it gives up.
    let r = run_with_timeout(
        compose.cmd(&[
            "exec",
            "-T",
            "M1QBF1",
            "exanet-perf",
            "pingpong",
            "run",
            "--peer",
            "M2QAF4",
            "--connect-timeout-ms",
            "1500",
        ]),
        Duration::from_secs(60),
    )
    .unwrap();
    assert_eq!(r.code(), Some(1), "{}", r.describe());

    // Prometheus scrapes all 16 nodes, and every dashboard expression returns data.
    wait_until(
        "Prometheus scrapes all 16 targets",
        Duration::from_secs(60),
        || {
            let v = prom.api("/api/v1/targets?state=active")?;
            let t = v["data"]["activeTargets"]
                .as_array()
                .cloned()
                .unwrap_or_default();
            let up = t.iter().filter(|t| t["health"] == "up").count();
            (t.len() == 16 && up == 16)
                .then_some(())
                .ok_or(format!("{up} of {} targets up", t.len()))
        },
    );
    let mut exprs = BTreeSet::new();
    for d in ["exanet-rack.json", "exanet-torus.json"] {
        exprs.extend(dashboard_exprs(&dir.join("grafana/dashboards").join(d)));
    }
    assert!(exprs.len() > 20, "{exprs:?}");
    wait_until(
        "every dashboard expression returns data",
        Duration::from_secs(90),
        || {
            let empty: Vec<&String> = exprs
                .iter()
                .filter(|e| prom.query(e).map(|r| r.is_empty()).unwrap_or(true))
                .collect();
            empty.is_empty().then_some(()).ok_or(format!("{empty:#?}"))
        },
    );
    let nacks = prom
        .query(r#"sum(exanet_ni_nacks_total{reason="no_context"})"#)
        .unwrap();
    assert!(
        nacks[0]["value"][1]
            .as_str()
            .unwrap()
            .parse::<f64>()
            .unwrap()
            > 0.0
    );

    // A node whose daemon dies is restarted by docker and rejoins its neighbours.
    let victim = "M1QBF1";
    let id = compose.node_container(victim);
    let pid = must(
        command("docker", &["inspect", "-f", "{{.State.Pid}}", &id]),
        Duration::from_secs(30),
    );
    must(
        command("kill", &["-9", pid.stdout.trim()]),
        Duration::from_secs(10),
    );
    wait_until(
        "the killed node restarted by docker",
        Duration::from_secs(60),
        || {
            let r = must(
                command(
                    "docker",
                    &["inspect", "-f", "{{.RestartCount}} {{.State.Running}}", &id],
                ),
                Duration::from_secs(30),
            );
            (r.stdout.trim() != "0 true" && r.stdout.trim().ends_with("true"))
                .then_some(())
                .ok_or(r.stdout)
        },
    );
    wait_until(
        "the restarted node's links all up again",
        Duration::from_secs(60),
        || nodes.iter().try_for_each(|(_, m)| ready(m)),
    );
    let r = must(
        compose.cmd(&[
            "exec", "-T", "M2QAF4", "exactl", "--rack", "/rack", "ping", "M2QAF4", victim,
        ]),
        Duration::from_secs(60),
    );
    assert!(r.stdout.contains("0% loss"), "{}", r.describe());

    // The operator's exactl on the host drives the containers as it drives a local rack:
    // the control API on each node's static address, the compose tool for node failures.
    let rack_dir = dir.join("rack");
    let exactl = |args: &[&str]| {
        let mut c = Command::new(bins().exactl);
        c.arg("--rack").arg(&rack_dir).args(args);
        c
    };
    // A ping whose every probe gets through, and one none of whose probes may (exit 1).
    let ping_ok = |src: &str, dst: &str| {
        let r = must(
            exactl(&["ping", src, dst, "--count", "3"]),
            Duration::from_secs(60),
        );
        assert!(r.stdout.contains("0% loss"), "{}", r.describe());
    };
    let ping_fails = |src: &str, dst: &str, count: &str, why: &str| {
        let r = run_with_timeout(
            exactl(&["ping", src, dst, "--count", count, "--timeout-ms", "300"]),
            Duration::from_secs(60),
        )
        .unwrap();
        // Exit 1 is also what a ping that could not ask its source node gets: require
        // that the probes went out and none came back.
        assert_eq!(r.code(), Some(1), "{why}: {}", r.describe());
        assert!(
            r.stdout
                .contains(&format!("{count} probes sent, 0 received, 100% loss")),
            "{why}: {}",
            r.describe()
        );
    };
    let st = must(exactl(&["status", "--json"]), Duration::from_secs(60)).json();
    let reachable = st["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|n| n["reachable"] == true)
        .count();
    assert_eq!(reachable, 16, "{st}");
    ping_ok("M1QAF1", "M2QBF4");
    // A link fault from the host: in effect at once, and in the metrics Prometheus scrapes.
    must(
        exactl(&["link", "set", "M1QAF1", "M1QBF1", "--loss", "100%"]),
        Duration::from_secs(30),
    );
    ping_fails(
        "M1QAF1",
        "M1QBF1",
        "3",
        "probes crossed a link losing everything",
    );
    wait_until(
        "the injected drops in Prometheus",
        Duration::from_secs(60),
        || {
            let v = prom.query(
                r#"sum(exanet_link_faults_injected_total{node="M1QAF1",peer="M1QBF1",fault="drop"})"#,
            )?;
            let n: f64 = v
                .first()
                .and_then(|x| x["value"][1].as_str()?.parse().ok())
                .unwrap_or(0.0);
            (n >= 3.0).then_some(()).ok_or(format!("{n} drops"))
        },
    );
    must(
        exactl(&["link", "clear", "M1QAF1", "M1QBF1"]),
        Duration::from_secs(30),
    );
    ping_ok("M1QAF1", "M1QBF1");
    // Node failures through the compose tool: a killed container stays down (docker does
    // not restart what it was told to kill) until exactl restarts it; it then rejoins.
    let victim = "M2QAF3";
    must(exactl(&["node", "kill", victim]), Duration::from_secs(60));
    ping_fails("M2QAF1", victim, "1", "a killed node answered");
    let r = must(
        exactl(&["node", "restart", victim]),
        Duration::from_secs(120),
    );
    assert!(r.stderr.contains("rejoined"), "{}", r.describe());
    ping_ok("M2QAF1", victim);

    // A command on a node runs in its container, as that node, with its exit status.
    let r = run_with_timeout(
        exactl(&[
            "exec",
            "M1QBF2",
            "--",
            "sh",
            "-c",
            "echo $EXANET_NODE; exit 3",
        ]),
        Duration::from_secs(60),
    )
    .unwrap();
    assert_eq!(
        (r.code(), r.stdout.trim()),
        (Some(3), "M1QBF2"),
        "{}",
        r.describe()
    );

    drop(prom);
    let t = Instant::now();
    must(
        compose.cmd(&["down", "-v", "-t", "5"]),
        Duration::from_secs(120),
    );
    eprintln!("docker-compose down -v: {:.1} s", t.elapsed().as_secs_f64());
    assert_eq!(leftovers(&project), Vec::<String>::new());
    drop(compose);
}

/// Swarm as it was before the test: left alone if it was active, left if the test made it.
struct Swarm {
    created: bool,
    gwbridge_existed: bool,
    stack: Option<String>,
}

impl Drop for Swarm {
    fn drop(&mut self) {
        if let Some(stack) = &self.stack {
            let _ = quiet(
                command("docker", &["stack", "rm", stack]),
                Duration::from_secs(60),
            );
            // Containers go away asynchronously; the network only after them.
            let filter = format!("label=com.docker.stack.namespace={stack}");
            let start = Instant::now();
            while start.elapsed() < Duration::from_secs(60) {
                let left = quiet(
                    command("docker", &["ps", "-aq", "--filter", &filter]),
                    Duration::from_secs(30),
                );
                if left.is_some_and(|r| r.stdout.trim().is_empty()) {
                    break;
                }
                std::thread::sleep(Duration::from_millis(500));
            }
        }
        if self.created {
            let _ = quiet(
                command("docker", &["swarm", "leave", "--force"]),
                Duration::from_secs(60),
            );
            if !self.gwbridge_existed && !remove_gwbridge() {
                use std::io::Write as _;
                let _ = writeln!(
                    std::io::stderr(),
                    "NOTE: the engine kept a stale endpoint in docker_gwbridge (moby issue \
                     37018); the empty network is left behind, attached to: {:?}",
                    gwbridge_containers()
                );
            }
        }
    }
}

/// Removes the `docker_gwbridge` network that `swarm init` made. After `swarm leave` the
/// engine still tears down the ingress sandbox attached to it for a moment, and a `network
/// rm` in that window fails ("has active endpoints"): retry until the network is gone,
/// disconnecting the ingress sandbox's gateway endpoint if the engine still lists it.
///
/// Some engines keep a stale endpoint in the network's store that no command can name
/// (moby issue 37018: `Containers` is empty, `rm` still says "active endpoints"; seen here
/// once in ten runs). Nothing of the test is attached to it then, and the empty bridge is
/// all that is left: the test says so on stderr instead of failing. Returns whether the
/// network is gone.
fn remove_gwbridge() -> bool {
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(90) {
        let exists = quiet(
            command("docker", &["network", "inspect", "docker_gwbridge"]),
            Duration::from_secs(30),
        )
        .is_some_and(|r| r.success());
        if !exists {
            return true;
        }
        let _ = quiet(
            command(
                "docker",
                &[
                    "network",
                    "disconnect",
                    "--force",
                    "docker_gwbridge",
                    "gateway_ingress-sbox",
                ],
            ),
            Duration::from_secs(30),
        );
        let _ = quiet(
            command("docker", &["network", "rm", "docker_gwbridge"]),
            Duration::from_secs(30),
        );
        std::thread::sleep(Duration::from_millis(500));
    }
    false
}

/// What is attached to `docker_gwbridge`, as the engine lists it.
fn gwbridge_containers() -> Option<String> {
    quiet(
        command(
            "docker",
            &[
                "network",
                "inspect",
                "docker_gwbridge",
                "-f",
                "{{json .Containers}}",
            ],
        ),
        Duration::from_secs(30),
    )
    .filter(|r| r.success())
    .map(|r| r.stdout.trim().to_string())
}

fn swarm_state() -> String {
    must(
        command("docker", &["info", "-f", "{{.Swarm.LocalNodeState}}"]),
        Duration::from_secs(30),
    )
    .stdout
    .trim()
    .to_string()
}

#[test]
#[ignore = "needs Docker and the exanet image: scripts/test-containers.sh"]
fn swarm_stack_deploys_the_rack_and_pings_across_it() {
    let before = swarm_state();
    let gwbridge_existed = quiet(
        command("docker", &["network", "inspect", "docker_gwbridge"]),
        Duration::from_secs(30),
    )
    .is_some_and(|r| r.success());
    let mut swarm = Swarm {
        created: false,
        gwbridge_existed,
        stack: None,
    };
    if before != "active" {
        // A swarm needs an address to advertise; this host's first non-loopback one.
        let addr = must(command("hostname", &["-I"]), Duration::from_secs(10))
            .stdout
            .split_whitespace()
            .next()
            .expect("the host has an address")
            .to_string();
        must(
            command("docker", &["swarm", "init", "--advertise-addr", &addr]),
            Duration::from_secs(60),
        );
        swarm.created = true;
    }
    let scratch_dir = scratch("swarm");
    let dir = scratch_dir.path();
    let stack = format!("{SWARM_NAME_PREFIX}-{}", std::process::id());
    generate(dir, &stack, &[]);
    swarm.stack = Some(stack.clone());
    let mut deploy = command(
        "docker",
        &["stack", "deploy", "-c", "docker-stack.yml", &stack],
    );
    deploy.current_dir(dir.join("swarm"));
    let t0 = Instant::now();
    must(deploy, Duration::from_secs(180));
    let nodes = rack_nodes(&dir.join("swarm/rack"));
    let container = |node: &str| -> Option<String> {
        let filter = format!("label=com.docker.swarm.service.name={stack}_{node}");
        let r = quiet(
            command(
                "docker",
                &[
                    "ps",
                    "-q",
                    "--filter",
                    &filter,
                    "--filter",
                    "status=running",
                ],
            ),
            Duration::from_secs(30),
        )?;
        r.stdout.split_whitespace().next().map(str::to_string)
    };
    wait_until(
        "every swarm task ready (all links up)",
        Duration::from_secs(240),
        || {
            for (n, _) in &nodes {
                let c = container(n).ok_or(format!("{n}: no running task"))?;
                let r = quiet(
                    command(
                        "docker",
                        &[
                            "exec",
                            &c,
                            "busybox",
                            "wget",
                            "-q",
                            "-O",
                            "-",
                            "http://127.0.0.1:9700/ready",
                        ],
                    ),
                    Duration::from_secs(30),
                )
                .ok_or("exec timed out")?;
                if !r.success() {
                    return Err(format!("{n}: {}", r.stderr.trim()));
                }
            }
            Ok(())
        },
    );
    eprintln!(
        "swarm: from deploy to every link up: {:.1} s",
        t0.elapsed().as_secs_f64()
    );
    let c = container("M1QAF1").unwrap();
    let r = must(
        command(
            "docker",
            &[
                "exec", &c, "exactl", "--rack", "/rack", "ping", "M1QAF1", "M2QBF4", "--json",
            ],
        ),
        Duration::from_secs(60),
    );
    let v = r.json();
    let path: Vec<&str> = v["path"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|n| n.as_str())
        .collect();
    // Every node of the dimension-order route answered on the way, in order.
    let shape: exanet_proto::Shape = "2x2x1".parse().unwrap();
    let (src, dst) = (
        shape.parse_node("M1QAF1").unwrap(),
        shape.parse_node("M2QBF4").unwrap(),
    );
    let want: Vec<String> = exanet_proto::routing::path(&shape, src, dst)
        .unwrap()
        .iter()
        .map(|(n, _)| shape.display(*n).to_string())
        .collect();
    assert_eq!(path, want, "{v}");
    drop(swarm);
    assert_eq!(swarm_state(), before, "the swarm is left as it was");
    if !gwbridge_existed {
        // Gone, or (an engine's stale endpoint, see remove_gwbridge) empty: nothing of the
        // test is attached to it.
        let left = gwbridge_containers();
        assert!(
            left.as_deref().is_none_or(|c| c == "{}" || c == "null"),
            "docker_gwbridge left behind with {left:?} attached"
        );
    }
}

#[test]
#[ignore = "needs ansible-playbook: scripts/test-containers.sh"]
fn ansible_playbook_passes_syntax_and_check_mode() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../ansible");
    let scratch_dir = scratch("ansible");
    let work = scratch_dir.path();
    let bin_dir = bins().exactl.parent().unwrap().to_path_buf();
    let extra = format!(
        "exanet_bin_dir={} exanet_stage_dir={} exanet_shape=1x1x1",
        bin_dir.display(),
        work.join("stage").display()
    );
    let mut syntax = command(
        "ansible-playbook",
        &[
            "-i",
            "inventory/localhost.yml",
            "--syntax-check",
            "site.yml",
        ],
    );
    syntax.current_dir(&root);
    must(syntax, Duration::from_secs(120));
    let mut check = command(
        "ansible-playbook",
        &[
            "-i",
            "inventory/localhost.yml",
            "--check",
            "--diff",
            "-e",
            &extra,
            "site.yml",
        ],
    );
    check.current_dir(&root).env("ANSIBLE_NOCOLOR", "1");
    let r = must(check, Duration::from_secs(300));
    assert!(r.stdout.contains("failed=0"), "{}", r.describe());
    // Check mode changed nothing on the host: no unit, no rack directory.
    assert!(
        !Path::new("/etc/systemd/system/exanetd@.service").exists()
            || std::env::var_os("EXANET_ANSIBLE_INSTALLED").is_some()
    );
    // The staged rack file (made for real, on the controller) is a valid 4-node rack.
    let staged = work.join("stage/rack.toml");
    let text = std::fs::read_to_string(&staged)
        .unwrap_or_else(|e| panic!("{}: {e}\n{}", staged.display(), r.stdout));
    let v: toml::Value = toml::from_str(&text).unwrap();
    assert_eq!(v["nodes"].as_table().unwrap().len(), 4);
}

#[test]
#[ignore = "needs kubectl (kustomize): scripts/test-containers.sh"]
fn kubernetes_kustomization_renders_every_node_once() {
    // `kubectl help` exits 0 with any kubectl (Debian's kubernetes-client included).
    if !runs("kubectl", "help") {
        skip_unless_required(
            "EXANET_REQUIRE_KUBECTL",
            "containers::kubernetes_kustomization_renders_every_node_once",
            "no kubectl to render the kustomization (Debian: apt-get install kubernetes-client)",
        );
        return;
    }
    let scratch_dir = scratch("k8s");
    let dir = scratch_dir.path();
    let mut c = Command::new(bins().exactl);
    c.args(["rack", "k8s", "--shape", "4x4x2", "--out"])
        .arg(dir.as_os_str());
    must(c, Duration::from_secs(30));
    let mut pki = Command::new(bins().exactl);
    pki.arg("--rack")
        .arg(dir.join("rack"))
        .args(["rack", "pki"]);
    must(pki, Duration::from_secs(120));
    let r = must(
        command("kubectl", &["kustomize", dir.to_str().unwrap()]),
        Duration::from_secs(60),
    );
    use serde::Deserialize;
    let docs: Vec<serde_yaml::Value> = serde_yaml::Deserializer::from_str(&r.stdout)
        .map(|d| serde_yaml::Value::deserialize(d).unwrap())
        .collect();
    let kind = |k: &str| {
        docs.iter()
            .find(|d| d["kind"] == k)
            .unwrap_or_else(|| panic!("no {k}"))
    };
    let (sts, cm, secret) = (kind("StatefulSet"), kind("ConfigMap"), kind("Secret"));
    assert_eq!(sts["spec"]["replicas"].as_u64(), Some(128));
    let nodes: Vec<&str> = cm["data"]["nodes"].as_str().unwrap().lines().collect();
    let unique: BTreeSet<&str> = nodes.iter().copied().collect();
    assert_eq!((nodes.len(), unique.len()), (128, 128));
    let keys: BTreeSet<String> = secret["data"]
        .as_mapping()
        .unwrap()
        .keys()
        .map(|k| k.as_str().unwrap().to_string())
        .collect();
    for n in &nodes {
        assert!(
            keys.contains(&format!("{n}.pem")) && keys.contains(&format!("{n}.key")),
            "{n}"
        );
    }
    assert!(!keys.contains("ca.key"));
    // kustomize renamed the generated objects (content hash): the pod must use the new names.
    let vols = sts["spec"]["template"]["spec"]["volumes"]
        .as_sequence()
        .unwrap();
    let cm_name = cm["metadata"]["name"].as_str().unwrap();
    let secret_name = secret["metadata"]["name"].as_str().unwrap();
    assert!(vols
        .iter()
        .any(|v| v["configMap"]["name"].as_str() == Some(cm_name)));
    assert!(vols
        .iter()
        .any(|v| v["secret"]["secretName"].as_str() == Some(secret_name)));
}
