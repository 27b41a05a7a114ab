//! A node that dies under an MPI job ends the job (issue 48): `kill -9` of one node's
//! daemon while eight ranks exchange messages makes `exactl mpirun` say which node died,
//! end the launcher and every process of the job on every node (ranks, Open MPI's orted,
//! Hydra's proxies), remove the job's temporary directories and host file, and exit
//! non-zero, within [`BOUND`] of the kill. Before, the ranks reported
//! `MPI_ERRORS_ARE_FATAL` and the launcher waited until killed, its orted left behind.
//!
//! Over the NI (the libfabric provider) and over IP over ExaNet, with Open MPI and MPICH.
//! Needs what `tests/tests/ip_over_exanet.rs` needs (root, /dev/net/tun, `ip`, the MPIs);
//! skipped loudly where something is missing, a failure with `EXANET_REQUIRE_IP` (and
//! `EXANET_REQUIRE_MPICH_OFI` for MPICH over the NI).

use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use exanet_tests::{compile_c, skip_unless_required, TestRack};
use nix::sys::signal::{kill, killpg, Signal};
use nix::unistd::Pid;

/// From the kill to `exactl mpirun`'s exit: what docs/mpi.md promises ("When a node
/// dies"). Measured 0.1 to 1.4 s on a 2-core machine.
const BOUND: Duration = Duration::from_secs(15);

/// The node whose daemon dies: not the launcher's (the first), on the other QFDB.
const VICTIM: &str = "M1QBF2";

/// One job at a time: the leftover checks look at every process of this host.
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// Allreduce and a ring of sendrecv (eager and rendezvous sizes) for up to `argv[1]`
/// seconds; rank 0 says when the loop runs.
const PROGRAM: &str = r#"
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    int rank, size;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    double secs = argc > 1 ? atof(argv[1]) : 60.0;
    static char sbuf[4096], rbuf[4096];
    double t0 = MPI_Wtime();
    long it = 0;
    while (MPI_Wtime() - t0 < secs) {
        int x = rank, s = 0;
        MPI_Allreduce(&x, &s, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
        MPI_Sendrecv(sbuf, it % 2 ? 16 : 4096, MPI_CHAR, (rank + 1) % size, 0, rbuf, 4096,
                     MPI_CHAR, (rank + size - 1) % size, 0, MPI_COMM_WORLD,
                     MPI_STATUS_IGNORE);
        if (rank == 0 && it == 20) { printf("running\n"); fflush(stdout); }
        it++;
    }
    if (rank == 0) { printf("finished %ld\n", it); fflush(stdout); }
    MPI_Finalize();
    return 0;
}
"#;

/// How a test launches: the compiler, and `exactl mpirun`'s arguments before `-np`.
struct Launch<'a> {
    cc: &'a str,
    args: Vec<&'a str>,
}

fn have(tool: &str) -> bool {
    exanet_tests::on_path(tool)
}

/// Whether `test` can run here with `tools` (else skipped, or failed when
/// `EXANET_REQUIRE_IP` says it must run).
fn runs_here(test: &str, tools: &[&str]) -> bool {
    if exanet_tests::skip_without_ip(test, &["ip"]) {
        return false;
    }
    if let Some(t) = tools.iter().find(|t| !have(t)) {
        skip_unless_required(
            "EXANET_REQUIRE_IP",
            test,
            &format!("no {t} (Debian: openmpi-bin libopenmpi-dev mpich libmpich-dev)"),
        );
        return false;
    }
    true
}

#[test]
fn open_mpi_over_the_ni_ends_when_a_node_dies() {
    const TEST: &str = "node_death_mpi::open_mpi_over_the_ni_ends_when_a_node_dies";
    if runs_here(TEST, &["mpicc.openmpi", "mpirun.openmpi"]) {
        a_node_dies_during_the_job(
            TEST,
            Launch {
                cc: "mpicc.openmpi",
                args: vec!["--fabric", "ni"],
            },
        );
    }
}

#[test]
fn open_mpi_over_ip_ends_when_a_node_dies() {
    const TEST: &str = "node_death_mpi::open_mpi_over_ip_ends_when_a_node_dies";
    if runs_here(TEST, &["mpicc.openmpi", "mpirun.openmpi"]) {
        a_node_dies_during_the_job(
            TEST,
            Launch {
                cc: "mpicc.openmpi",
                args: vec!["--fabric", "ip"],
            },
        );
    }
}

#[test]
fn mpich_over_the_ni_ends_when_a_node_dies() {
    const TEST: &str = "node_death_mpi::mpich_over_the_ni_ends_when_a_node_dies";
    if !runs_here(TEST, &[]) {
        return;
    }
    let Some(bin) = exanet_tests::mpich_ofi_or_skip(TEST) else {
        return;
    };
    let cc = bin.join("mpicc").to_string_lossy().to_string();
    let mpiexec = bin.join("mpiexec").to_string_lossy().to_string();
    a_node_dies_during_the_job(
        TEST,
        Launch {
            cc: &cc,
            args: vec!["--mpi", "mpich", "--mpirun", &mpiexec, "--fabric", "ni"],
        },
    );
}

#[test]
fn mpich_over_ip_ends_when_a_node_dies() {
    const TEST: &str = "node_death_mpi::mpich_over_ip_ends_when_a_node_dies";
    if runs_here(TEST, &["mpicc.mpich", "mpiexec.hydra"]) {
        a_node_dies_during_the_job(
            TEST,
            Launch {
                cc: "mpicc.mpich",
                args: vec!["--mpi", "mpich", "--fabric", "ip"],
            },
        );
    }
}

/// An `exactl mpirun` running in a process group of its own, its output in files; killed
/// with its group if the test ends before it does.
struct Job {
    child: Child,
    out: PathBuf,
    err: PathBuf,
}

impl Job {
    fn read(&self) -> (String, String) {
        (
            std::fs::read_to_string(&self.out).unwrap_or_default(),
            std::fs::read_to_string(&self.err).unwrap_or_default(),
        )
    }

    fn describe(&self) -> String {
        let (out, err) = self.read();
        format!(
            "--- stdout:\n{}\n--- stderr:\n{}",
            out.trim_end(),
            err.trim_end()
        )
    }
}

impl Drop for Job {
    fn drop(&mut self) {
        if self.child.try_wait().ok().flatten().is_none() {
            // The group is the child's own (process_group(0)).
            let _ = killpg(Pid::from_raw(self.child.id() as i32), Signal::SIGKILL);
            let _ = self.child.wait();
        }
    }
}

fn a_node_dies_during_the_job(test: &str, launch: Launch) {
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
    let rack = TestRack::new("death");
    let up = rack.exactl_timeout(
        &[
            "rack",
            "up",
            "--shape",
            "2x1x1",
            "--ip",
            "on",
            "--timeout",
            "120",
        ],
        Duration::from_secs(180),
    );
    assert!(up.success(), "{test}: rack up --ip on: {}", up.describe());
    let prog = compile_c(launch.cc, &rack.dir, "deathprog", PROGRAM, &["-O2"]);
    let prog_s = prog.to_string_lossy().to_string();

    let mut args = vec!["mpirun"];
    args.extend(launch.args.iter().copied());
    args.extend(["-np", "8", "--", &prog_s, "60"]);
    let out = rack.dir.join("job.out");
    let err = rack.dir.join("job.err");
    use std::os::unix::process::CommandExt;
    let child = rack
        .command(&args)
        .process_group(0)
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(&out).unwrap())
        .stderr(std::fs::File::create(&err).unwrap())
        .spawn()
        .unwrap();
    let mut job = Job { child, out, err };

    // The ranks exchange messages: then the node dies under them.
    let deadline = Instant::now() + Duration::from_secs(60);
    while !job.read().0.contains("running") {
        if let Some(st) = job.child.try_wait().unwrap() {
            panic!(
                "{test}: the job ended ({st}) before it ran: {}",
                job.describe()
            );
        }
        assert!(
            Instant::now() < deadline,
            "{test}: the job did not start within 60 s: {}",
            job.describe()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    std::thread::sleep(Duration::from_secs(1));
    let pid = rack
        .daemon_pid(VICTIM)
        .unwrap_or_else(|| panic!("{test}: no pid file for {VICTIM}"));
    assert!(pid > 1);
    let killed = Instant::now();
    // The daemon of this test's rack, named by its pid file.
    kill(Pid::from_raw(pid), Signal::SIGKILL).unwrap();

    // Twice the bound before giving up, so that a slow end shows its figure.
    let status = loop {
        if let Some(st) = job.child.try_wait().unwrap() {
            break st;
        }
        if killed.elapsed() > BOUND * 2 {
            let left = leftovers(&rack.dir, &prog);
            panic!(
                "{test}: exactl mpirun still runs {:.0} s after {VICTIM}'s daemon was killed \
                 (job processes: {left:?}): {}",
                killed.elapsed().as_secs_f64(),
                job.describe()
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let took = killed.elapsed();
    let (_, stderr) = job.read();
    eprintln!(
        "{test}: exactl mpirun exited ({status}) {:.2} s after {VICTIM}'s daemon was killed",
        took.as_secs_f64()
    );
    assert!(!status.success(), "{test}: {status}: {}", job.describe());
    assert!(
        stderr.contains(&format!(
            "node {VICTIM} died during the job (daemon pid {pid} gone)"
        )),
        "{test}: the node is not named: {}",
        job.describe()
    );
    assert!(
        took <= BOUND,
        "{test}: the job took {:.1} s to end, over {} s: {}",
        took.as_secs_f64(),
        BOUND.as_secs(),
        job.describe()
    );
    let left = leftovers(&rack.dir, &prog);
    assert!(
        left.is_empty(),
        "{test}: processes of the job left: {left:?}: {}",
        job.describe()
    );
    let hostfiles: Vec<_> = std::fs::read_dir(rack.dir.join("run/mpi"))
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().to_string())
        .filter(|n| n.starts_with("hostfile."))
        .collect();
    assert!(
        hostfiles.is_empty(),
        "{test}: host files left: {hostfiles:?}"
    );
    let staged = staging_left(&rack);
    assert!(
        staged.is_empty(),
        "{test}: the job's files left in the nodes' temporary directories: {staged:?}"
    );
}

/// Live processes of the job: the program (`pgrep -f` of its path, which is this test's
/// rack's), and MPI launchers and runtime daemons (orted, Hydra's proxies) started for
/// this rack (their environment names it).
fn leftovers(rack_dir: &Path, prog: &Path) -> Vec<String> {
    let rack_dir = rack_dir.canonicalize().unwrap_or(rack_dir.to_path_buf());
    let mut left: Vec<String> =
        exanet_tests::processes_mentioning(&[prog.to_string_lossy().to_string()])
            .into_iter()
            .map(|p| format!("{} {}", p.pid, p.cmdline))
            .collect();
    let runtime = [
        "orted",
        "hydra_pmi_proxy",
        "mpirun",
        "mpirun.openmpi",
        "mpiexec",
        "mpiexec.hydra",
        "deathprog",
    ];
    let ours = format!("EXANET_RACK={}", rack_dir.display());
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|n| n.parse::<i32>().ok()) else {
            continue;
        };
        let comm = std::fs::read_to_string(e.path().join("comm")).unwrap_or_default();
        if !runtime.contains(&comm.trim()) {
            continue;
        }
        // A zombie's environment reads empty: it is gone but for its parent's wait.
        let env = std::fs::read(e.path().join("environ")).unwrap_or_default();
        if env.split(|&b| b == 0).any(|v| v == ours.as_bytes()) {
            let line = format!("{pid} {}", comm.trim());
            if !left.iter().any(|l| l.starts_with(&format!("{pid} "))) {
                left.push(line);
            }
        }
    }
    left
}

/// What is left in the nodes' temporary directories (`rack up` made them empty; Open
/// MPI's session directories and PMIx's stores go there).
fn staging_left(rack: &TestRack) -> Vec<PathBuf> {
    let records = rack.dir.join("run/ip");
    let mut left = Vec::new();
    let mut read = 0;
    for e in std::fs::read_dir(&records).into_iter().flatten().flatten() {
        let path = e.path();
        if path.extension().is_none_or(|x| x != "tmpdir") {
            continue;
        }
        let Some(dir) = std::fs::read_to_string(&path)
            .ok()
            .map(|t| PathBuf::from(t.trim()))
        else {
            continue;
        };
        read += 1;
        left.extend(
            std::fs::read_dir(&dir)
                .into_iter()
                .flatten()
                .flatten()
                .map(|e| e.path()),
        );
    }
    // Every node's directory looked into: none missed is "nothing left" by accident.
    assert_eq!(
        read,
        8,
        "node directory records read in {}",
        records.display()
    );
    left
}
