//! What exanet.h promises, from C against a real rack (tests/c_contract.c): one process
//! attaching several times, exanet_recv on an empty mailbox, a bad channel's message, an
//! RDMA write's completion notification (the 16-byte record at its VA, byte by byte, and
//! the page_fault NACK when that VA is not registered), the 4 GiB limit, a region of another
//! endpoint, and exanet_detach freeing the endpoint. Needs gcc (or $CC) and `exactl` and
//! `exanetd` built (`cargo build -p exactl -p exanetd`).

mod rack;

use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use rack::Rack;

fn build() -> PathBuf {
    let manifest = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let dir = std::env::temp_dir().join(format!("exanet-c-contract-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let exe = dir.join("c_contract");
    let (ok, out) = rack::compile_c(
        &manifest.join("tests/c_contract.c"),
        &exe,
        &["-std=c11", "-g", "-Wall", "-Wextra", "-Werror"],
    );
    assert!(ok, "compiling c_contract.c failed:\n{out}");
    exe
}

#[test]
fn the_header_contract_holds_from_c() {
    let exe = build();
    let _dir = rack::RemoveOnDrop(exe.parent().unwrap().to_path_buf());
    let rack = Rack::up("cc", "2x1x1");
    let mut c = Command::new(&exe);
    c.arg(&rack.dir)
        .args(["M1QAF2", "M1QBF3"])
        .env_remove("EXANET_JOB_KEY");
    let (ok, out, err) = rack::run(c, Duration::from_secs(180));
    assert!(ok, "c_contract failed:\n{out}\n{err}");
    let passed: Vec<&str> = out.lines().filter_map(|l| l.strip_prefix("ok ")).collect();
    assert_eq!(
        passed,
        [
            "attach_several_times",
            "recv_empty_mailbox_times_out",
            "two_attachments_of_one_process_talk",
            "modeled_times_reach_c",
            "bad_channel_names_0..3",
            "notification_delivered",
            "notification_record_layout",
            "notification_outside_registered_memory_nacked_page_fault",
            "longer_than_max_transfer_is_ebadlength",
            "region_of_another_endpoint_einval",
            "poll",
            "calls_for_libraries_on_top",
            "collectives_of_a_group_of_one",
            "detach_frees_the_endpoint",
        ],
        "{out}\n{err}"
    );
    assert_eq!(out.lines().last(), Some("done"), "{out}");
}
