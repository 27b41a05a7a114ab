//! Tests that need what a machine may lack (root, a tool) skip where it is missing, but a
//! skip must never pass unnoticed where the test was meant to run: each such test names an
//! `EXANET_REQUIRE_*` variable, and CI sets it for what CI can run.
//!
//! This file uses nothing but std so that test crates that cannot depend on `exanet-tests`
//! (it depends on them) include it by path (`#[path = "../../tests/src/require.rs"]`),
//! rather than each growing its own copy.

use std::io::Write;

/// Whether `var` asks for the tests it guards to run: any non-empty value does (`1`,
/// `yes`, even `0`: a variable set by CI to anything means "this must run here").
pub fn required(var: &str) -> bool {
    requires(std::env::var_os(var).as_deref())
}

/// [`required`] of a variable's value (`None`: unset).
pub fn requires(value: Option<&std::ffi::OsStr>) -> bool {
    value.is_some_and(|v| !v.is_empty())
}

/// What a test does when it cannot run here because of `why`: with `var` set
/// ([`required`]), it fails, naming the variable; otherwise it prints a SKIPPED line and
/// the caller returns. The line goes straight to the process's stderr: the test harness
/// swallows `eprintln!` of a passing test, and a skip nobody sees is what this is against.
#[track_caller]
pub fn skip_unless_required(var: &str, test: &str, why: &str) {
    if required(var) {
        panic!("{var} is set, so {test} must run here, but it cannot: {why}");
    }
    let _ = writeln!(
        std::io::stderr(),
        "\n*** SKIPPED {test}: {why} (set {var}=1 to make this a failure) ***\n"
    );
}

/// Whether `program` runs with `arg` (e.g. `--version`) and exits 0: the usual probe for
/// an installed tool.
pub fn runs(program: &str, arg: &str) -> bool {
    std::process::Command::new(program)
        .arg(arg)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// Whether this process runs as root (effective uid 0), read from /proc so that this file
/// needs no libc.
pub fn is_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("Uid:"))
                .and_then(|ids| ids.split_whitespace().nth(1).map(str::to_string))
        })
        .is_some_and(|euid| euid == "0")
}

/// A system user made for a test that runs as root, deleted when dropped (also when the
/// test fails). One left by an earlier run that was killed is taken over.
pub struct SystemUser {
    name: String,
}

impl SystemUser {
    pub fn create(name: &str) -> Result<SystemUser, String> {
        let out = std::process::Command::new("useradd")
            .args([
                "--system",
                "--no-create-home",
                "--shell",
                "/usr/sbin/nologin",
                name,
            ])
            .output()
            .map_err(|e| format!("useradd: {e}"))?;
        // 9: the user exists already.
        if !out.status.success() && out.status.code() != Some(9) {
            return Err(format!(
                "useradd {name}: {} {}",
                out.status,
                String::from_utf8_lossy(&out.stderr)
            ));
        }
        Ok(SystemUser {
            name: name.to_string(),
        })
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// Its uid (`flag` "-u") or gid ("-g"), as `id` says.
    pub fn id(&self, flag: &str) -> u32 {
        let out = std::process::Command::new("id")
            .args([flag, &self.name])
            .output()
            .unwrap_or_else(|e| panic!("id {flag} {}: {e}", self.name));
        assert!(out.status.success(), "id {flag} {}", self.name);
        String::from_utf8_lossy(&out.stdout)
            .trim()
            .parse()
            .unwrap_or_else(|e| panic!("id {flag} {}: {e}", self.name))
    }
}

impl Drop for SystemUser {
    fn drop(&mut self) {
        let ok = std::process::Command::new("userdel")
            .arg(&self.name)
            .stderr(std::process::Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        if !ok {
            let _ = writeln!(
                std::io::stderr(),
                "could not delete test user {}",
                self.name
            );
        }
    }
}

/// Whether `tool` is a file in a directory of PATH.
pub fn on_path(tool: &str) -> bool {
    std::env::var_os("PATH")
        .is_some_and(|p| std::env::split_paths(&p).any(|d| d.join(tool).is_file()))
}

/// Why IP over ExaNet cannot run here, if it cannot: root, `/dev/net/tun`, and `tools`
/// on PATH (`ip` and whatever the test runs on the nodes).
pub fn ip_missing(tools: &[&str]) -> Option<String> {
    if !is_root() {
        return Some("not root".into());
    }
    if !std::path::Path::new("/dev/net/tun").exists() {
        return Some("no /dev/net/tun".into());
    }
    tools
        .iter()
        .find(|t| !on_path(t))
        .map(|t| format!("no `{t}`"))
}

/// True when a test of IP over ExaNet must skip (and says so, [`skip_unless_required`]
/// with `EXANET_REQUIRE_IP`): [`ip_missing`] found something missing.
#[track_caller]
pub fn skip_without_ip(test: &str, tools: &[&str]) -> bool {
    let Some(why) = ip_missing(tools) else {
        return false;
    };
    skip_unless_required("EXANET_REQUIRE_IP", test, &format!("IP over ExaNet: {why}"));
    true
}

/// The directory of an MPICH with ch4:ofi (its `mpicc` and `mpiexec`): `EXANET_MPICH_OFI`
/// (CI makes one: `python3 -m venv V && V/bin/pip install mpich`, then `V/bin`). `None`
/// when there is none, after [`skip_unless_required`] with `EXANET_REQUIRE_MPICH_OFI`
/// (the caller returns).
#[track_caller]
pub fn mpich_ofi_or_skip(test: &str) -> Option<std::path::PathBuf> {
    let bin = std::env::var_os("EXANET_MPICH_OFI")
        .map(std::path::PathBuf::from)
        .filter(|b| b.join("mpiexec").exists() && b.join("mpicc").exists());
    if bin.is_none() {
        skip_unless_required(
            "EXANET_REQUIRE_MPICH_OFI",
            test,
            "no MPICH with ch4:ofi: set EXANET_MPICH_OFI to the directory of its mpicc and \
             mpiexec (python3 -m venv V && V/bin/pip install mpich; then V/bin)",
        );
    }
    bin
}
