//! The C header against the library, checked by the C compiler: a C file that includes
//! exanet.h asserts (`_Static_assert`) the size, alignment, every field's offset, size and
//! type of every public struct, and assigns every function to a pointer of the type its
//! Rust definition in `src/ffi.rs` has (a mismatch does not compile: `-Werror
//! -pedantic-errors`). The same tables compile only against the Rust definitions, and are
//! checked to name every function of the header and of `ffi.rs` and every field. The
//! error codes, NACK reasons and limits agree; the program links and runs. Needs gcc (or
//! $CC), no daemon.

mod rack;

use std::ffi::{c_char, c_int, c_void};
use std::mem::{align_of, offset_of, size_of};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use exanet::error::codes;
use exanet::ffi::{self, exanet_endpoint, exanet_mailbox, exanet_packetizer};
use exanet::ffi::{exanet_addr_t, exanet_info_t, exanet_message_t, exanet_notification_t};
use exanet::ffi::{
    exanet_collectives, exanet_group, exanet_member_t, exanet_rdma_page, exanet_region,
};
use exanet::NackReason;

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
const NAMES: [(&str, i32); 28] = [
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
    ("EXANET_EABORTED", codes::ABORTED),
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

/// The public structs: every field with its Rust type and the C type of a pointer to it.
/// The closure each expands to destructures the Rust struct without `..`, so a field added
/// on the Rust side and missing here does not compile; on the C side, an initializer with
/// one element per field listed here does not compile if the header has more or fewer.
macro_rules! layouts {
    ($( $s:ident { $( $f:ident : $rt:ty => $ct:literal ),* $(,)? } )*) => {
        /// C declarations asserting the Rust layout of every struct; (struct, fields).
        fn layouts() -> (String, Vec<(&'static str, Vec<&'static str>)>) {
            let mut c = String::new();
            let mut names = Vec::new();
            $(
                let _all_fields_with_these_types = |v: $s| {
                    let $s { $($f),* } = v;
                    $( let _: $rt = $f; )*
                };
                let s = stringify!($s);
                c += &format!(
                    "_Static_assert(sizeof({s}) == {}, \"sizeof({s})\");\n\
                     _Static_assert(_Alignof({s}) == {}, \"_Alignof({s})\");\n",
                    size_of::<$s>(),
                    align_of::<$s>(),
                );
                let mut init: Vec<&str> = Vec::new();
                $(
                    let f = stringify!($f);
                    c += &format!(
                        "_Static_assert(offsetof({s}, {f}) == {}, \"offsetof({s}, {f})\");\n\
                         _Static_assert(sizeof((({s} *)0)->{f}) == {}, \"size of {s}.{f}\");\n\
                         _Static_assert(_Generic(&(({s} *)0)->{f}, {}: 1, default: 0), \
                         \"type of {s}.{f}\");\n",
                        offset_of!($s, $f),
                        size_of::<$rt>(),
                        $ct,
                    );
                    init.push(if $ct.contains('[') { "{0}" } else { "0" });
                )*
                c += &format!("const {s} exactly_these_fields_of_{s} = {{ {} }};\n", init.join(", "));
                names.push((s, vec![$(stringify!($f)),*]));
            )*
            (c, names)
        }
    };
}

layouts! {
    exanet_info_t {
        node_id: u32 => "uint32_t *",
        nodes: u32 => "uint32_t *",
        pdid: u16 => "uint16_t *",
        rank: u8 => "uint8_t *",
        node_name: [c_char; 16] => "char (*)[16]",
    }
    exanet_addr_t {
        node: u32 => "uint32_t *",
        rank: u8 => "uint8_t *",
        va: u64 => "uint64_t *",
    }
    exanet_member_t {
        node: u32 => "uint32_t *",
        rank: u8 => "uint8_t *",
    }
    exanet_message_t {
        src_node: u32 => "uint32_t *",
        src_rank: u8 => "uint8_t *",
        vi: u8 => "uint8_t *",
        len: u8 => "uint8_t *",
        payload: [u8; 64] => "uint8_t (*)[64]",
        at_ps: u64 => "uint64_t *",
    }
    exanet_notification_t {
        va: u64 => "uint64_t *",
        len: u64 => "uint64_t *",
        src_node: u32 => "uint32_t *",
        at_ps: u64 => "uint64_t *",
    }
}

/// Every function of the C ABI: its parameter and result types in Rust and in C. Each entry
/// coerces the Rust function to a pointer of exactly those Rust types (or does not
/// compile) and becomes a C definition `RESULT (*const chk_NAME)(PARAMS) = NAME;`, which
/// does not compile against a header that declares the function otherwise.
macro_rules! signatures {
    ($( $name:ident ( $($rt:ty => $ct:literal),* ) -> $rr:ty => $cr:literal; )*) => {
        /// (function, C definition checking its type).
        #[allow(clippy::unused_unit)]
        fn signatures() -> Vec<(&'static str, String)> {
            vec![$({
                let _: unsafe extern "C" fn($($rt),*) -> $rr = ffi::$name;
                let params: &[&str] = &[$($ct),*];
                let params = if params.is_empty() { "void".to_string() } else { params.join(", ") };
                let name = stringify!($name);
                (name, format!("{} (*const chk_{name})({params}) = {name};\n", $cr))
            }),*]
        }
    };
}

signatures! {
    exanet_attach(
        *const c_char => "const char *", *const c_char => "const char *",
        *const c_char => "const char *", *mut *mut exanet_endpoint => "exanet_endpoint **"
    ) -> c_int => "int";
    exanet_detach(*mut exanet_endpoint => "exanet_endpoint *") -> () => "void";
    exanet_info(
        *const exanet_endpoint => "const exanet_endpoint *", *mut exanet_info_t => "exanet_info_t *"
    ) -> c_int => "int";
    exanet_node_by_name(
        *const exanet_endpoint => "const exanet_endpoint *", *const c_char => "const char *",
        *mut u32 => "uint32_t *"
    ) -> c_int => "int";
    exanet_set_spin(*const exanet_endpoint => "const exanet_endpoint *", u64 => "uint64_t")
        -> c_int => "int";
    exanet_mailbox_addr(u32 => "uint32_t", u8 => "uint8_t", u8 => "uint8_t")
        -> exanet_addr_t => "exanet_addr_t";
    exanet_register(
        *const exanet_endpoint => "const exanet_endpoint *", u64 => "uint64_t",
        *mut *mut exanet_region => "exanet_region **"
    ) -> c_int => "int";
    exanet_region_free(*mut exanet_region => "exanet_region *") -> () => "void";
    exanet_region_va(*const exanet_region => "const exanet_region *") -> u64 => "uint64_t";
    exanet_region_len(*const exanet_region => "const exanet_region *") -> u64 => "uint64_t";
    exanet_region_write(
        *const exanet_region => "const exanet_region *", u64 => "uint64_t",
        *const c_void => "const void *", usize => "size_t"
    ) -> c_int => "int";
    exanet_region_read(
        *const exanet_region => "const exanet_region *", u64 => "uint64_t",
        *mut c_void => "void *", usize => "size_t"
    ) -> c_int => "int";
    exanet_packetizer_open(
        *const exanet_endpoint => "const exanet_endpoint *",
        *mut *mut exanet_packetizer => "exanet_packetizer **"
    ) -> c_int => "int";
    exanet_packetizer_close(*mut exanet_packetizer => "exanet_packetizer *") -> () => "void";
    exanet_mailbox_open(
        *const exanet_endpoint => "const exanet_endpoint *", u32 => "uint32_t",
        *mut *mut exanet_mailbox => "exanet_mailbox **"
    ) -> c_int => "int";
    exanet_mailbox_close(*mut exanet_mailbox => "exanet_mailbox *") -> () => "void";
    exanet_mailbox_vi(*const exanet_mailbox => "const exanet_mailbox *") -> c_int => "int";
    exanet_send(
        *const exanet_packetizer => "const exanet_packetizer *", c_int => "int",
        *const exanet_addr_t => "const exanet_addr_t *", *const c_void => "const void *",
        usize => "size_t", *mut u32 => "uint32_t *"
    ) -> c_int => "int";
    exanet_recv(
        *const exanet_mailbox => "const exanet_mailbox *", i64 => "int64_t",
        *mut exanet_message_t => "exanet_message_t *"
    ) -> c_int => "int";
    exanet_try_send(
        *const exanet_packetizer => "const exanet_packetizer *",
        *const exanet_addr_t => "const exanet_addr_t *", *const c_void => "const void *",
        usize => "size_t", *mut u32 => "uint32_t *"
    ) -> c_int => "int";
    exanet_recv_unclocked(
        *const exanet_mailbox => "const exanet_mailbox *",
        *mut exanet_message_t => "exanet_message_t *"
    ) -> c_int => "int";
    exanet_rdma_page_open(
        *const exanet_endpoint => "const exanet_endpoint *",
        *mut *mut exanet_rdma_page => "exanet_rdma_page **"
    ) -> c_int => "int";
    exanet_rdma_page_close(*mut exanet_rdma_page => "exanet_rdma_page *") -> () => "void";
    exanet_collectives_open(
        *const exanet_endpoint => "const exanet_endpoint *",
        *mut *mut exanet_collectives => "exanet_collectives **"
    ) -> c_int => "int";
    exanet_collectives_close(*mut exanet_collectives => "exanet_collectives *") -> () => "void";
    exanet_collectives_set_eager_limit(
        *const exanet_collectives => "const exanet_collectives *", u32 => "uint32_t"
    ) -> c_int => "int";
    exanet_group_create(
        *const exanet_collectives => "const exanet_collectives *", u16 => "uint16_t",
        *const exanet_member_t => "const exanet_member_t *", u32 => "uint32_t",
        *mut *mut exanet_group => "exanet_group **"
    ) -> c_int => "int";
    exanet_group_free(*mut exanet_group => "exanet_group *") -> () => "void";
    exanet_allreduce(
        *const exanet_collectives => "const exanet_collectives *",
        *const exanet_group => "const exanet_group *", c_int => "int", c_int => "int",
        *const c_void => "const void *", *mut c_void => "void *", u32 => "uint32_t",
        c_int => "int"
    ) -> c_int => "int";
    exanet_reduce(
        *const exanet_collectives => "const exanet_collectives *",
        *const exanet_group => "const exanet_group *", u32 => "uint32_t", c_int => "int",
        c_int => "int", *const c_void => "const void *", *mut c_void => "void *",
        u32 => "uint32_t"
    ) -> c_int => "int";
    exanet_bcast(
        *const exanet_collectives => "const exanet_collectives *",
        *const exanet_group => "const exanet_group *", u32 => "uint32_t",
        *mut c_void => "void *", u32 => "uint32_t"
    ) -> c_int => "int";
    exanet_barrier(
        *const exanet_collectives => "const exanet_collectives *",
        *const exanet_group => "const exanet_group *"
    ) -> c_int => "int";
    exanet_rdma_write(
        *const exanet_rdma_page => "const exanet_rdma_page *", u8 => "uint8_t",
        *const exanet_region => "const exanet_region *", u64 => "uint64_t",
        *const exanet_addr_t => "const exanet_addr_t *", u64 => "uint64_t",
        *const u64 => "const uint64_t *", *mut u32 => "uint32_t *"
    ) -> c_int => "int";
    exanet_rdma_read(
        *const exanet_rdma_page => "const exanet_rdma_page *", u8 => "uint8_t",
        *const exanet_addr_t => "const exanet_addr_t *",
        *const exanet_region => "const exanet_region *", u64 => "uint64_t", u64 => "uint64_t",
        *mut u32 => "uint32_t *"
    ) -> c_int => "int";
    exanet_rdma_try_write(
        *const exanet_rdma_page => "const exanet_rdma_page *",
        *const exanet_region => "const exanet_region *", u64 => "uint64_t",
        *const exanet_addr_t => "const exanet_addr_t *", u64 => "uint64_t",
        *const u64 => "const uint64_t *", *mut u32 => "uint32_t *"
    ) -> c_int => "int";
    exanet_rdma_try_read(
        *const exanet_rdma_page => "const exanet_rdma_page *",
        *const exanet_addr_t => "const exanet_addr_t *",
        *const exanet_region => "const exanet_region *", u64 => "uint64_t", u64 => "uint64_t",
        *mut u32 => "uint32_t *"
    ) -> c_int => "int";
    exanet_wait(
        *const exanet_endpoint => "const exanet_endpoint *", u32 => "uint32_t", i64 => "int64_t"
    ) -> c_int => "int";
    exanet_wait_modeled(
        *const exanet_endpoint => "const exanet_endpoint *", u32 => "uint32_t", i64 => "int64_t",
        *mut u64 => "uint64_t *"
    ) -> c_int => "int";
    exanet_clock_ps(*const exanet_endpoint => "const exanet_endpoint *") -> u64 => "uint64_t";
    exanet_advance_clock_ps(*const exanet_endpoint => "const exanet_endpoint *", u64 => "uint64_t") -> u64 => "uint64_t";
    exanet_result(
        *const exanet_endpoint => "const exanet_endpoint *", u32 => "uint32_t",
        *mut u64 => "uint64_t *"
    ) -> c_int => "int";
    exanet_took_ps(*const exanet_endpoint => "const exanet_endpoint *", u64 => "uint64_t") -> u64 => "uint64_t";
    exanet_idle(*const exanet_endpoint => "const exanet_endpoint *") -> c_int => "int";
    exanet_busy(*const exanet_endpoint => "const exanet_endpoint *") -> c_int => "int";
    exanet_hold(*const exanet_endpoint => "const exanet_endpoint *") -> c_int => "int";
    exanet_unhold(*const exanet_endpoint => "const exanet_endpoint *") -> c_int => "int";
    exanet_forget(*const exanet_endpoint => "const exanet_endpoint *", u32 => "uint32_t")
        -> c_int => "int";
    exanet_poll(*const exanet_endpoint => "const exanet_endpoint *") -> c_int => "int";
    exanet_wait_notification(
        *const exanet_endpoint => "const exanet_endpoint *", i64 => "int64_t",
        *mut exanet_notification_t => "exanet_notification_t *"
    ) -> c_int => "int";
    exanet_strerror(c_int => "int") -> *const c_char => "const char *";
    exanet_last_error() -> *const c_char => "const char *";
    exanet_last_nack_reason() -> c_int => "int";
}

/// `text` without its `/* ... */` and `//` comments.
fn strip_comments(text: &str) -> String {
    let mut out = String::new();
    let mut rest = text;
    while let Some(i) = rest.find("/*") {
        out.push_str(&rest[..i]);
        rest = rest[i..].split_once("*/").map_or("", |(_, r)| r);
    }
    out.push_str(rest);
    out.lines()
        .map(|l| l.split_once("//").map_or(l, |(code, _)| code))
        .collect::<Vec<_>>()
        .join("\n")
}

/// Every `exanet_*` identifier followed by `(` in the header's declarations.
fn header_functions() -> Vec<String> {
    let text = strip_comments(&std::fs::read_to_string(header()).unwrap());
    let mut names = Vec::new();
    let mut rest = text.as_str();
    while let Some(i) = rest.find("exanet_") {
        let word_start = i == 0 || {
            let b = rest.as_bytes()[i - 1];
            !(b.is_ascii_alphanumeric() || b == b'_')
        };
        let tail = &rest[i..];
        let end = tail
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .unwrap_or(tail.len());
        if word_start && tail[end..].trim_start().starts_with('(') {
            names.push(tail[..end].to_string());
        }
        rest = &tail[end..];
    }
    names.sort();
    names.dedup();
    names
}

/// Every `extern "C" fn` that `src/ffi.rs` defines.
fn rust_functions() -> Vec<String> {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("src/ffi.rs");
    let text = std::fs::read_to_string(path).unwrap();
    let mut names: Vec<String> = text
        .lines()
        .filter_map(|l| l.split_once("extern \"C\" fn ")?.1.split('(').next())
        .map(|n| n.trim().to_string())
        .collect();
    names.sort();
    names
}

#[test]
fn the_check_tables_cover_every_function_and_field() {
    let mut listed: Vec<String> = signatures().iter().map(|(n, _)| n.to_string()).collect();
    listed.sort();
    assert_eq!(
        listed,
        header_functions(),
        "functions checked vs declared in exanet.h"
    );
    assert_eq!(
        listed,
        rust_functions(),
        "functions checked vs defined in src/ffi.rs"
    );
    // The header's struct bodies name the same fields, in the same order.
    let text = strip_comments(&std::fs::read_to_string(header()).unwrap());
    let (_, structs) = layouts();
    for (s, fields) in structs {
        let body = text
            .split_once(&format!("typedef struct {s} {{"))
            .and_then(|(_, rest)| rest.split_once('}'))
            .unwrap_or_else(|| panic!("no `typedef struct {s} {{ ... }}` in exanet.h"))
            .0;
        let in_header: Vec<&str> = body
            .split(';')
            .filter_map(|decl| {
                let decl = decl.split('[').next()?.trim();
                decl.rsplit(|c: char| c.is_whitespace() || c == '*').next()
            })
            .filter(|n| !n.is_empty())
            .collect();
        assert_eq!(in_header, fields, "fields of {s}");
    }
}

/// `(name, value)` of every `#define EXANET_NACK_* value` in the header.
fn header_nack_reasons() -> Vec<(String, u8)> {
    let text = std::fs::read_to_string(header()).unwrap();
    text.lines()
        .filter_map(|l| {
            let mut w = l.split_whitespace();
            (w.next()? == "#define").then_some(())?;
            let name = w.next()?.strip_prefix("EXANET_NACK_")?;
            Some((name.to_string(), w.next()?.parse().ok()?))
        })
        .collect()
}

/// The reasons a caller can see: every reason of the NI but those internal to it (a
/// NACK that concerns one attempt of one block and never ends an operation).
fn public_nack_reasons() -> Vec<(String, u8)> {
    NackReason::all()
        .filter(|r| r.label() != "incomplete")
        .map(|r| (r.label().to_ascii_uppercase(), r as u8))
        .collect()
}

#[test]
fn header_nack_reasons_match_the_ni() {
    let mut header = header_nack_reasons();
    let mut ni = public_nack_reasons();
    header.sort();
    ni.sort();
    assert_eq!(header, ni);
    // What the header calls transient is what the NI retries.
    let text = std::fs::read_to_string(self::header()).unwrap();
    for r in NackReason::all().filter(|r| r.label() != "incomplete") {
        let line = text
            .lines()
            .find(|l| {
                l.starts_with(&format!(
                    "#define EXANET_NACK_{} ",
                    r.label().to_ascii_uppercase()
                ))
            })
            .unwrap();
        assert_eq!(line.contains("(transient)"), r.transient(), "{line}");
    }
}

/// The C program: every check above as code the compiler must accept, then a run that
/// links and calls the library.
fn probe_source() -> String {
    let mut c = String::from(
        "#include <stddef.h>\n#include <stdint.h>\n#include <stdio.h>\n#include \"exanet.h\"\n\n",
    );
    c += &layouts().0;
    for (_, def) in signatures() {
        c += &def;
    }
    for (name, value) in NAMES {
        c += &format!("_Static_assert({name} == {value}, \"{name}\");\n");
    }
    for (name, value) in public_nack_reasons() {
        c += &format!("_Static_assert(EXANET_NACK_{name} == {value}, \"EXANET_NACK_{name}\");\n");
    }
    let limits = [
        ("EXANET_MAX_MESSAGE", exanet::MAX_MESSAGE as u64),
        (
            "EXANET_PACKETIZER_CHANNELS",
            u64::from(exanet::PACKETIZER_CHANNELS),
        ),
        (
            "EXANET_RDMA_CHANNELS",
            u64::from(exanet::RDMA_WRITE_CHANNELS),
        ),
        (
            "EXANET_RDMA_CHANNELS",
            u64::from(exanet::RDMA_READ_CHANNELS),
        ),
        ("EXANET_MAX_TRANSFER", exanet::MAX_TRANSFER),
        // The record of a completion notification (exanet-proto's `send_notice`; the e2e
        // C test reads one byte by byte).
        ("EXANET_NOTIFICATION_SIZE", 16),
    ];
    for (name, value) in limits {
        c += &format!("_Static_assert({name} == {value}ULL, \"{name}\");\n");
    }
    c += r#"
int main(void) {
    exanet_endpoint *ep = (exanet_endpoint *)1;
    int rc = chk_exanet_attach("/nonexistent", "M1QAF1", NULL, &ep);
    printf("%d %d %s|%s\n", rc, ep == NULL, chk_exanet_strerror(rc), chk_exanet_last_error());
    exanet_addr_t a = chk_exanet_mailbox_addr(3, 1, 2);
    printf("%u %u %llx\n", a.node, a.rank, (unsigned long long)a.va);
    return 0;
}
"#;
    c
}

/// Compiles `src` against exanet.h and the static library, as strictly as C11 allows.
fn compile(dir: &Path, src: &str) -> (bool, String, PathBuf) {
    let file = dir.join("probe.c");
    std::fs::write(&file, src).unwrap();
    let exe = dir.join("probe");
    let (ok, out) = rack::compile_c(
        &file,
        &exe,
        &[
            "-std=c11",
            "-Wall",
            "-Wextra",
            "-Werror",
            "-pedantic-errors",
        ],
    );
    (ok, out, exe)
}

fn scratch(tag: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("exanet-cabi-{tag}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

#[test]
fn header_matches_the_rust_layout_and_signatures_and_links() {
    let dir = scratch("ok");
    let src = probe_source();
    let (ok, diag, exe) = compile(&dir, &src);
    assert!(
        ok,
        "exanet.h disagrees with src/ffi.rs:\n{diag}\n--- probe.c:\n{src}"
    );
    let (ok, out, err) = rack::run(Command::new(&exe), Duration::from_secs(30));
    assert!(ok, "probe failed:\n{out}\n{err}");
    let lines: Vec<&str> = out.lines().collect();
    let (rc, rest) = lines[0].split_once(' ').unwrap();
    assert_eq!(rc.parse::<i32>().unwrap(), codes::UNREACHABLE);
    assert!(
        rest.starts_with(
            "1 daemon unreachable|cannot reach the daemon at /nonexistent/run/M1QAF1.ni"
        ),
        "{rest}"
    );
    assert_eq!(lines[1], format!("3 1 {:x}", exanet::MAILBOX_WINDOW | 2));
    let _ = std::fs::remove_dir_all(dir);
}

/// The checks can fail: a header that differs from the library in one field's type, one
/// field's position, one extra field, one parameter's constness or one result type does
/// not compile.
#[test]
fn a_header_that_differs_does_not_compile() {
    let text = std::fs::read_to_string(header()).unwrap();
    // (what, header text, replaced by, what the compiler's refusal names)
    let mutations: [(&str, &str, &str, &str); 6] = [
        (
            "field type",
            "    uint16_t pdid;",
            "    uint32_t pdid;",
            "type of exanet_info_t.pdid",
        ),
        (
            "signedness",
            "    uint8_t len;  ",
            "    int8_t len;   ",
            "type of exanet_message_t.len",
        ),
        (
            "field order",
            "    uint64_t va;          /* where in this rank's memory it was written */\n    \
             uint64_t len;",
            "    uint64_t len;\n    uint64_t va;",
            "offsetof(exanet_notification_t, va)",
        ),
        (
            "a field in padding",
            "    uint8_t rank;         /* 0..7 */",
            "    uint8_t rank; uint8_t spare;",
            "missing-field-initializers",
        ),
        (
            "parameter constness",
            "int exanet_poll(const exanet_endpoint *ep);",
            "int exanet_poll(exanet_endpoint *ep);",
            "chk_exanet_poll",
        ),
        (
            "result type",
            "uint64_t exanet_region_len(const exanet_region *r);",
            "uint32_t exanet_region_len(const exanet_region *r);",
            "chk_exanet_region_len",
        ),
    ];
    for (what, from, to, named) in mutations {
        assert_eq!(
            text.matches(from).count(),
            1,
            "{what}: {from:?} not once in exanet.h"
        );
        let dir = scratch(&what.replace(' ', "-"));
        std::fs::write(dir.join("exanet.h"), text.replacen(from, to, 1)).unwrap();
        // The probe includes "exanet.h" from its own directory first.
        let (ok, diag, _) = compile(&dir, &probe_source());
        assert!(!ok, "{what}: a header with {to:?} compiled");
        assert!(
            diag.contains(named),
            "{what}: refused, but not by the check of {named:?}:\n{diag}"
        );
        let _ = std::fs::remove_dir_all(dir);
    }
}
