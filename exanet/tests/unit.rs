//! Pieces that need no daemon at all: settings, the rack file, error codes, and the C ABI's
//! argument checks.

use std::ffi::CStr;
use std::time::Duration;

use exanet::config::{parse_shape, parse_spin_us, socket_path};
use exanet::error::codes;
use exanet::ffi;
use exanet::{Config, Endpoint, Error, OpError};

#[test]
fn spin_setting_parses_microseconds() {
    assert_eq!(parse_spin_us("0").unwrap(), Duration::ZERO);
    assert_eq!(parse_spin_us(" 250 ").unwrap(), Duration::from_micros(250));
    for bad in ["", "-1", "1.5", "lots", "1000001"] {
        let e = parse_spin_us(bad).unwrap_err();
        assert!(
            matches!(
                e,
                Error::BadSetting {
                    name: "EXANET_SPIN_US",
                    ..
                }
            ),
            "{bad}"
        );
        assert_eq!(e.code(), codes::INVALID_ARGUMENT);
    }
}

#[test]
fn rack_file_shape_is_read_and_checked() {
    let text = "name = \"r\"\nshape = \"2x2x1\"\nwindow = 5\n[nodes.M1QAF1]\nlink = \"x\"\n";
    assert_eq!(parse_shape(text).unwrap().nodes(), 16);
    assert!(parse_shape("name = \"r\"\n").unwrap_err().contains("shape"));
    assert!(parse_shape("shape = 5\n").is_err());
    assert!(parse_shape("shape = \"2x0x1\"\n").is_err());
    assert!(parse_shape("shape = [\n").is_err());
    assert_eq!(
        socket_path("/r".as_ref(), "M1QAF2"),
        std::path::PathBuf::from("/r/run/M1QAF2.ni")
    );
}

#[test]
fn attach_errors_without_a_daemon() {
    let dir = std::env::temp_dir().join(format!("exanet-unit-{}", std::process::id()));
    let e = Endpoint::attach_to(&dir, "M1QAF1", None).unwrap_err();
    assert!(matches!(e, Error::Unreachable { .. }), "{e:?}");
    assert!(e.to_string().contains("M1QAF1.ni"));
    let e = Endpoint::attach_to(&dir, "M1QZF9", None).unwrap_err();
    assert!(matches!(e, Error::UnknownNode { .. }), "{e:?}");
    if std::env::var_os("EXANET_NODE").is_none() {
        let e = Endpoint::attach_with(&Config {
            rack_dir: Some(dir),
            ..Config::default()
        })
        .unwrap_err();
        assert!(matches!(e, Error::NoNode));
        assert_eq!(e.code(), codes::NO_NODE);
    }
}

#[test]
fn error_codes_are_distinct_negative_and_described() {
    let mut seen = std::collections::HashSet::new();
    for c in codes::ALL {
        assert!(seen.insert(c), "duplicate code {c}");
        assert!(c <= 0);
        assert_ne!(codes::describe(c), "unknown error code", "{c}");
        let s = unsafe_free_strerror(c);
        assert_eq!(s, codes::describe(c));
    }
    assert_eq!(unsafe_free_strerror(12345), "unknown error code");
    let op = |error| Error::Op { tag: 1, error };
    assert_eq!(op(OpError::TimedOut).code(), codes::NET_TIMEOUT);
    assert_eq!(op(OpError::LocalFault).code(), codes::LOCAL_FAULT);
    assert_eq!(op(OpError::Refused { code: 3 }).code(), codes::OP_REFUSED);
    assert_eq!(op(OpError::Malformed { code: 0 }).code(), codes::OP_REFUSED);
    assert_eq!(Error::Timeout.code(), codes::TIMEOUT);
    assert_eq!(Error::Disconnected.code(), codes::DISCONNECTED);
    assert_eq!(
        Error::AttachRefused("x".into()).code(),
        codes::ATTACH_REFUSED
    );
}

fn unsafe_free_strerror(c: i32) -> String {
    let p = ffi::exanet_strerror(c);
    assert!(!p.is_null());
    // The table holds 'static NUL-terminated strings; CStr borrows one.
    #[allow(unsafe_code)]
    let s = unsafe { CStr::from_ptr(p) };
    s.to_str().unwrap().to_string()
}

#[test]
#[allow(unsafe_code)]
fn c_abi_refuses_null_arguments() {
    use std::ptr::{null, null_mut};
    // SAFETY (whole test): every pointer passed is NULL or points to a live local.
    unsafe {
        assert_eq!(
            ffi::exanet_attach(null(), null(), null(), null_mut()),
            codes::INVALID_ARGUMENT
        );
        let msg = CStr::from_ptr(ffi::exanet_last_error()).to_str().unwrap();
        assert!(msg.contains("out is NULL"), "{msg}");
        let mut ep = null_mut();
        let rc = ffi::exanet_attach(
            c"/nonexistent-rack".as_ptr(),
            c"M1QAF1".as_ptr(),
            null(),
            &mut ep,
        );
        assert_eq!(rc, codes::UNREACHABLE);
        assert!(ep.is_null());
        let rc = ffi::exanet_attach(c"/x".as_ptr(), c"bogus".as_ptr(), null(), &mut ep);
        assert_eq!(rc, codes::UNKNOWN_NODE);
        let bad_utf8 = [0xffu8, 0];
        let rc = ffi::exanet_attach(
            bad_utf8.as_ptr().cast(),
            c"M1QAF1".as_ptr(),
            null(),
            &mut ep,
        );
        assert_eq!(rc, codes::INVALID_ARGUMENT);
        let mut info = std::mem::zeroed();
        assert_eq!(ffi::exanet_info(null(), &mut info), codes::INVALID_ARGUMENT);
        assert_eq!(ffi::exanet_wait(null(), 1, 0), codes::INVALID_ARGUMENT);
        assert_eq!(ffi::exanet_poll(null()), codes::INVALID_ARGUMENT);
        let mut tag = 0u32;
        let dst = ffi::exanet_mailbox_addr(1, 0, 3);
        assert_eq!(dst.va, exanet::MAILBOX_WINDOW | 3);
        assert_eq!(
            ffi::exanet_send(null(), 0, &dst, null(), 0, &mut tag),
            codes::INVALID_ARGUMENT
        );
        let mut m = std::mem::zeroed();
        assert_eq!(ffi::exanet_recv(null(), 0, &mut m), codes::INVALID_ARGUMENT);
        assert_eq!(ffi::exanet_mailbox_vi(null()), codes::INVALID_ARGUMENT);
        assert_eq!(ffi::exanet_region_va(null()), 0);
        assert_eq!(ffi::exanet_region_len(null()), 0);
        assert_eq!(
            ffi::exanet_region_write(null(), 0, null(), 0),
            codes::INVALID_ARGUMENT
        );
        // Releasing NULL handles is a no-op.
        ffi::exanet_detach(null_mut());
        ffi::exanet_region_free(null_mut());
        ffi::exanet_packetizer_close(null_mut());
        ffi::exanet_mailbox_close(null_mut());
        ffi::exanet_rdma_page_close(null_mut());
        assert_eq!(ffi::exanet_last_nack_reason(), 0);
    }
}
