//! The C header against the library: every declared function links, the structs have the
//! layout the Rust side uses, and the error codes agree. Needs gcc (or $CC), no daemon.

mod rack;

use std::mem::{offset_of, size_of};
use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use exanet::error::codes;
use exanet::ffi::{exanet_addr_t, exanet_info_t, exanet_message_t, exanet_notification_t};

fn header() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("include/exanet.h")
}

/// `name value` of every `#define EXANET_E* value` in the header.
fn header_codes() -> Vec<(String, i32)> {
    let text = std::fs::read_to_string(header()).unwrap();
    text.lines()
        .filter_map(|l| {
            let mut w = l.split_whitespace();
            (w.next()? == "#define").then_some(())?;
            let name = w.next()?;
            let value = w.next()?.parse().ok()?;
            (name == "EXANET_OK" || name.starts_with("EXANET_E")).then(|| (name.to_string(), value))
        })
        .collect()
}

/// The header's name for each library code.
const NAMES: [(&str, i32); 27] = [
    ("EXANET_OK", codes::OK),
    ("EXANET_EINVAL", codes::INVALID_ARGUMENT),
    ("EXANET_ENONODE", codes::NO_NODE),
    ("EXANET_EUNKNOWNNODE", codes::UNKNOWN_NODE),
    ("EXANET_EBADRANK", codes::BAD_RANK),
    ("EXANET_EFOREIGNPDID", codes::FOREIGN_PDID),
    ("EXANET_EBADADDR", codes::BAD_ADDRESS),
    ("EXANET_ERACKFILE", codes::RACK_FILE),
    ("EXANET_EUNREACHABLE", codes::UNREACHABLE),
    ("EXANET_EATTACH", codes::ATTACH_REFUSED),
    ("EXANET_EDAEMON", codes::DAEMON),
    ("EXANET_EPROTO", codes::PROTOCOL),
    ("EXANET_EDISCONNECTED", codes::DISCONNECTED),
    ("EXANET_ECORRUPT", codes::CORRUPT),
    ("EXANET_ESYSTEM", codes::SYSTEM),
    ("EXANET_ETIMEDOUT", codes::TIMEOUT),
    ("EXANET_ENACKED", codes::NACKED),
    ("EXANET_ENETTIMEDOUT", codes::NET_TIMEOUT),
    ("EXANET_ELOCALFAULT", codes::LOCAL_FAULT),
    ("EXANET_EREFUSED", codes::OP_REFUSED),
    ("EXANET_EBUSY", codes::BUSY),
    ("EXANET_EBADCHANNEL", codes::BAD_CHANNEL),
    ("EXANET_ETOOLONG", codes::TOO_LONG),
    ("EXANET_EOUTOFBOUNDS", codes::OUT_OF_BOUNDS),
    ("EXANET_EBADLENGTH", codes::BAD_LENGTH),
    ("EXANET_EUNKNOWNTAG", codes::UNKNOWN_TAG),
    ("EXANET_EINTERNAL", codes::INTERNAL),
];

#[test]
fn header_error_codes_match_the_library() {
    // Every library code is named once...
    let mut named: Vec<i32> = NAMES.iter().map(|&(_, v)| v).collect();
    let mut from_lib = codes::ALL.to_vec();
    named.sort_unstable();
    from_lib.sort_unstable();
    assert_eq!(named, from_lib);
    // ...and the header gives each name the library's value (not just the same set of values).
    let mut from_header = header_codes();
    let mut expected: Vec<(String, i32)> = NAMES.iter().map(|&(n, v)| (n.to_string(), v)).collect();
    from_header.sort_unstable();
    expected.sort_unstable();
    assert_eq!(from_header, expected);
}

const PROBE: &str = r#"
#include <stddef.h>
#include <stdio.h>
#include "exanet.h"

int main(void) {
    void (*fns[])(void) = {
        (void (*)(void))exanet_attach, (void (*)(void))exanet_detach, (void (*)(void))exanet_info,
        (void (*)(void))exanet_node_by_name, (void (*)(void))exanet_set_spin, (void (*)(void))exanet_mailbox_addr,
        (void (*)(void))exanet_register, (void (*)(void))exanet_region_free, (void (*)(void))exanet_region_va,
        (void (*)(void))exanet_region_len, (void (*)(void))exanet_region_write, (void (*)(void))exanet_region_read,
        (void (*)(void))exanet_packetizer_open, (void (*)(void))exanet_packetizer_close,
        (void (*)(void))exanet_mailbox_open, (void (*)(void))exanet_mailbox_close, (void (*)(void))exanet_mailbox_vi,
        (void (*)(void))exanet_send, (void (*)(void))exanet_recv, (void (*)(void))exanet_rdma_page_open,
        (void (*)(void))exanet_rdma_page_close, (void (*)(void))exanet_rdma_write, (void (*)(void))exanet_rdma_read,
        (void (*)(void))exanet_wait, (void (*)(void))exanet_forget, (void (*)(void))exanet_poll,
        (void (*)(void))exanet_wait_notification, (void (*)(void))exanet_strerror, (void (*)(void))exanet_last_error,
        (void (*)(void))exanet_last_nack_reason,
    };
    for (size_t i = 0; i < sizeof fns / sizeof fns[0]; i++)
        if (!fns[i]) return 1;
    printf("%zu %zu %zu %zu %zu %zu %zu %zu %zu\n",
           sizeof(exanet_info_t), offsetof(exanet_info_t, rank), offsetof(exanet_info_t, node_name),
           sizeof(exanet_addr_t), offsetof(exanet_addr_t, va),
           sizeof(exanet_message_t), offsetof(exanet_message_t, payload),
           sizeof(exanet_notification_t), offsetof(exanet_notification_t, src_node));
    exanet_endpoint *ep = (exanet_endpoint *)1;
    int rc = exanet_attach("/nonexistent", "M1QAF1", NULL, &ep);
    printf("%d %d %s|%s\n", rc, ep == NULL, exanet_strerror(rc), exanet_last_error());
    exanet_addr_t a = exanet_mailbox_addr(3, 1, 2);
    printf("%u %u %llx\n", a.node, a.rank, (unsigned long long)a.va);
    return 0;
}
"#;

#[test]
fn header_links_and_matches_the_rust_layout() {
    let dir = std::env::temp_dir().join(format!("exanet-cabi-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let src = dir.join("probe.c");
    std::fs::write(&src, PROBE).unwrap();
    let exe = dir.join("probe");
    let mut cc = Command::new(std::env::var("CC").unwrap_or_else(|_| "gcc".into()));
    cc.args(["-std=c11", "-Wall", "-Wextra", "-Werror", "-pedantic", "-I"])
        .arg(header().parent().unwrap())
        .arg(&src)
        .arg(rack::exanet_lib())
        .args([
            "-lpthread",
            "-ldl",
            "-lm",
            "-lrt",
            "-lutil",
            "-lgcc_s",
            "-o",
        ])
        .arg(&exe);
    let (ok, out, err) = rack::run(cc, Duration::from_secs(120));
    assert!(ok, "compiling against exanet.h failed:\n{out}\n{err}");
    let (ok, out, err) = rack::run(Command::new(&exe), Duration::from_secs(30));
    assert!(ok, "probe failed:\n{out}\n{err}");
    let lines: Vec<&str> = out.lines().collect();
    let sizes: Vec<usize> = lines[0].split(' ').map(|n| n.parse().unwrap()).collect();
    assert_eq!(
        sizes,
        [
            size_of::<exanet_info_t>(),
            offset_of!(exanet_info_t, rank),
            offset_of!(exanet_info_t, node_name),
            size_of::<exanet_addr_t>(),
            offset_of!(exanet_addr_t, va),
            size_of::<exanet_message_t>(),
            offset_of!(exanet_message_t, payload),
            size_of::<exanet_notification_t>(),
            offset_of!(exanet_notification_t, src_node),
        ]
    );
    let (rc, rest) = lines[1].split_once(' ').unwrap();
    assert_eq!(rc.parse::<i32>().unwrap(), codes::UNREACHABLE);
    assert!(
        rest.starts_with(
            "1 daemon unreachable|cannot reach the daemon at /nonexistent/run/M1QAF1.ni"
        ),
        "{rest}"
    );
    assert_eq!(lines[2], format!("3 1 {:x}", exanet::MAILBOX_WINDOW | 2));
    let _ = std::fs::remove_dir_all(dir);
}
