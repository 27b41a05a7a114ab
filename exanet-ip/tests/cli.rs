//! The `exanet-ip` binary's refusals of bad command lines and racks. Beyond what they
//! check, these tests make `cargo test --workspace` build the binary, which the IP over
//! ExaNet end-to-end test (in `tests/`) starts through `exactl rack up --ip on`.

use std::process::Command;

fn exanet_ip() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_exanet-ip"));
    c.env_remove("EXANET_RACK")
        .env_remove("EXANET_NODE")
        .env_remove("EXANET_IP_IN_FLIGHT")
        .env("RUST_LOG", "off");
    c
}

#[test]
fn a_missing_rack_is_named_in_the_error() {
    let dir = std::env::temp_dir().join(format!("exanet-ip-cli-{}-absent", std::process::id()));
    let out = exanet_ip()
        .args(["--rack", dir.to_str().unwrap(), "--node", "M1QAF1"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.starts_with("exanet-ip: "), "{err}");
    assert!(err.contains(dir.to_str().unwrap()), "{err}");
}

#[test]
fn in_flight_outside_one_to_eight_is_a_usage_error() {
    for bad in ["0", "9", "-1", "many"] {
        let out = exanet_ip()
            .args(["--node", "M1QAF1", &format!("--in-flight={bad}")])
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(2), "--in-flight {bad}: {out:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains("--in-flight"), "--in-flight {bad}: {err}");
    }
}

#[test]
fn the_node_is_required() {
    let out = exanet_ip().output().unwrap();
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    assert!(String::from_utf8_lossy(&out.stderr).contains("--node"));
}
