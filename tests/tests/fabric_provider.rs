//! The libfabric provider (`exanet-fi`) as libfabric itself loads it: Debian's `fi_info`
//! finds `libexanet-fi.so` in `FI_PROVIDER_PATH` and lists it for a node of a running
//! rack, honours hints (or answers `-FI_ENODATA`), and a C program written to libfabric
//! opens the fabric and a domain (the process attaches to its node's NI), is refused what
//! is not built yet with `-FI_ENOSYS`, and closes both, more times than a node has ranks
//! (a domain that kept its rank would make the last attach fail).
//!
//! Needs `fi_info` (libfabric-bin) and libfabric's headers and library (libfabric-dev);
//! without them it says it skipped, unless `EXANET_REQUIRE_LIBFABRIC` is set (CI sets it).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use exanet_tests::{bin_dir, run_with_timeout, runs, skip_unless_required, Run, TestRack};

const REQUIRE: &str = "EXANET_REQUIRE_LIBFABRIC";
const LIMIT: Duration = Duration::from_secs(60);

/// A directory holding the provider under the name libfabric loads (`lib<name>-fi.so`),
/// or `None` (skipped) without libfabric's tools.
fn provider_dir(tmp: &Path) -> Option<PathBuf> {
    if !runs("fi_info", "--version") || !Path::new("/usr/include/rdma/fabric.h").exists() {
        skip_unless_required(
            REQUIRE,
            "the libfabric provider test",
            "no fi_info or libfabric headers (Debian: apt-get install libfabric-bin libfabric-dev)",
        );
        return None;
    }
    let lib = bin_dir().unwrap().join("libexanet_fi.so");
    assert!(
        lib.exists(),
        "{} is not built: run `cargo build --workspace` with the same profile first",
        lib.display()
    );
    let dir = tmp.join("fi");
    std::fs::create_dir_all(&dir).unwrap();
    std::os::unix::fs::symlink(&lib, dir.join("libexanet-fi.so")).unwrap();
    Some(dir)
}

fn with_env(mut c: Command, prov: &Path, rack: &Path, node: &str) -> Command {
    c.env("FI_PROVIDER_PATH", prov)
        .env("EXANET_RACK", rack)
        .env("EXANET_NODE", node)
        .env_remove("FI_PROVIDER")
        .env_remove("EXANET_JOB_KEY");
    c
}

fn fi_info(prov: &Path, rack: &Path, node: &str, args: &[&str]) -> Run {
    let mut c = Command::new("fi_info");
    c.args(["-p", "exanet"]).args(args);
    run_with_timeout(with_env(c, prov, rack, node), LIMIT).unwrap()
}

const PROGRAM: &str = r#"
#include <stdio.h>
#include <string.h>
#include <rdma/fabric.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_errno.h>

#define CHECK(what, expr) do { int r_ = (expr); if (r_) { \
    fprintf(stderr, "%s: %d (%s)\n", what, r_, fi_strerror(-r_)); return 1; } } while (0)

int main(void) {
    struct fi_info *hints = fi_allocinfo(), *info = NULL;
    hints->ep_attr->type = FI_EP_RDM;
    hints->caps = FI_TAGGED;
    hints->domain_attr->threading = FI_THREAD_DOMAIN;
    hints->fabric_attr->prov_name = strdup("exanet");
    CHECK("fi_getinfo", fi_getinfo(FI_VERSION(1, 17), NULL, NULL, 0, hints, &info));
    if (info->next || strcmp(info->fabric_attr->prov_name, "exanet")
        || info->domain_attr->threading != FI_THREAD_DOMAIN || (info->caps & FI_MSG)) {
        fprintf(stderr, "unexpected info\n");
        return 1;
    }
    printf("domain %s\n", info->domain_attr->name);
    /* More rounds than a node has ranks (8): a domain that kept its rank after its
     * close would make the ninth attach fail. */
    for (int round = 0; round < 9; round++) {
        struct fid_fabric *fabric;
        struct fid_domain *domain;
        struct fid_ep *ep;
        CHECK("fi_fabric", fi_fabric(info->fabric_attr, &fabric, NULL));
        CHECK("fi_domain", fi_domain(fabric, info, &domain, NULL));
        int r = fi_endpoint(domain, info, &ep, NULL);
        printf("fi_endpoint %d\n", r);
        CHECK("close domain", fi_close(&domain->fid));
        CHECK("close fabric", fi_close(&fabric->fid));
    }
    fi_freeinfo(info);
    fi_freeinfo(hints);
    printf("ok\n");
    return 0;
}
"#;

#[test]
fn libfabric_loads_the_provider_and_opens_its_domain() {
    let tmp = tempfile::tempdir().unwrap();
    let Some(prov) = provider_dir(tmp.path()) else {
        return;
    };
    let rack = TestRack::new("fi");
    rack.up("1x1x1", 60);

    let r = fi_info(&prov, &rack.dir, "M1QAF2", &[]);
    assert!(r.success(), "fi_info -p exanet: {}", r.describe());
    for line in [
        "provider: exanet",
        "fabric: exanet",
        "domain: M1QAF2",
        "type: FI_EP_RDM",
    ] {
        assert!(r.stdout.contains(line), "{line:?} in {}", r.stdout);
    }
    // The node's name in any spelling is the same domain; hints it cannot meet are
    // -FI_ENODATA (61), as is a node with no daemon to attach to.
    let r = fi_info(&prov, &rack.dir, "m1qaf3", &[]);
    assert!(r.stdout.contains("domain: M1QAF3"), "{}", r.describe());
    for args in [
        &["-t", "FI_EP_MSG"][..],
        &["-c", "FI_ATOMIC"],
        &["-f", "tcp"],
        &["-d", "M1QAF4", "-t", "FI_EP_RDM"],
    ] {
        let r = fi_info(&prov, &rack.dir, "M1QAF2", args);
        assert!(!r.success(), "fi_info -p exanet {args:?}: {}", r.describe());
        assert!(r.stderr.contains("-61"), "{args:?}: {}", r.describe());
    }
    let empty = tmp.path().join("no-rack");
    std::fs::create_dir_all(&empty).unwrap();
    let r = fi_info(&prov, &empty, "M1QAF2", &[]);
    assert!(!r.success() && r.stderr.contains("-61"), "{}", r.describe());

    // A program written to libfabric, linked with Debian's libfabric.
    let src = tmp.path().join("open.c");
    let exe = tmp.path().join("open");
    std::fs::write(&src, PROGRAM).unwrap();
    let cc = std::env::var("CC").unwrap_or_else(|_| "gcc".into());
    let out = Command::new(&cc)
        .args(["-std=gnu11", "-Wall", "-Werror", "-o"])
        .arg(&exe)
        .arg(&src)
        .arg("-lfabric")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{cc}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let r = run_with_timeout(
        with_env(Command::new(&exe), &prov, &rack.dir, "M1QAF2"),
        LIMIT,
    )
    .unwrap();
    assert!(r.success(), "{}", r.describe());
    assert!(r.stdout.contains("domain M1QAF2"), "{}", r.stdout);
    // Endpoints are not built yet: refused, not a crash.
    assert_eq!(
        r.stdout.matches("fi_endpoint -38").count(),
        9,
        "{}",
        r.stdout
    );
    assert!(r.stdout.ends_with("ok\n"), "{}", r.stdout);
    rack.down().unwrap();
}
