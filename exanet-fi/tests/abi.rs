//! The provider's mirror of libfabric's ABI (`src/abi.rs`) against the installed headers,
//! checked by the C compiler: a C file asserts (`_Static_assert`) the size and alignment of
//! every mirrored struct, the offset and size of each of its fields, and the value of every
//! constant, as Rust has them. Needs gcc (or $CC) and libfabric's headers (Debian:
//! libfabric-dev); without the headers the test says it skipped, unless
//! `EXANET_REQUIRE_LIBFABRIC` is set (CI sets it).

use std::mem::{align_of, offset_of, size_of};
use std::path::Path;
use std::process::Command;

use exanet_fi::abi::*;

/// C assertions of each struct's layout as Rust has it. A field named with a trailing
/// underscore in Rust (`type_`) is the C keyword without it.
macro_rules! layouts {
    ($( $s:ident { $( $f:ident ),* $(,)? } )*) => {
        fn layouts() -> String {
            let mut c = String::new();
            $(
                let s = stringify!($s);
                c += &format!(
                    "_Static_assert(sizeof(struct {s}) == {}, \"sizeof {s}\");\n\
                     _Static_assert(_Alignof(struct {s}) == {}, \"_Alignof {s}\");\n",
                    size_of::<$s>(),
                    align_of::<$s>(),
                );
                $(
                    let f = stringify!($f).trim_end_matches('_');
                    let size = {
                        fn size_of_field<T, F>(_: impl Fn(&T) -> &F) -> usize {
                            size_of::<F>()
                        }
                        size_of_field(|v: &$s| &v.$f)
                    };
                    c += &format!(
                        "_Static_assert(offsetof(struct {s}, {f}) == {}, \"offsetof {s}.{f}\");\n\
                         _Static_assert(sizeof(((struct {s} *)0)->{f}) == {size}, \"size of {s}.{f}\");\n",
                        offset_of!($s, $f),
                    );
                )*
            )*
            c
        }
    };
}

layouts! {
    fi_context { internal }
    fid { fclass, context, ops }
    fi_ops { size, close, bind, control, ops_open, tostr, ops_set }
    fi_tx_attr { caps, mode, op_flags, msg_order, comp_order, inject_size, size, iov_limit, rma_iov_limit, tclass }
    fi_rx_attr { caps, mode, op_flags, msg_order, comp_order, total_buffered_recv, size, iov_limit }
    fi_ep_attr {
        type_, protocol, protocol_version, max_msg_size, msg_prefix_size, max_order_raw_size,
        max_order_war_size, max_order_waw_size, mem_tag_format, tx_ctx_cnt, rx_ctx_cnt,
        auth_key_size, auth_key,
    }
    fi_domain_attr {
        domain, name, threading, control_progress, data_progress, resource_mgmt, av_type,
        mr_mode, mr_key_size, cq_data_size, cq_cnt, ep_cnt, tx_ctx_cnt, rx_ctx_cnt,
        max_ep_tx_ctx, max_ep_rx_ctx, max_ep_stx_ctx, max_ep_srx_ctx, cntr_cnt, mr_iov_limit,
        caps, mode, auth_key, auth_key_size, max_err_data, mr_cnt, tclass,
    }
    fi_fabric_attr { fabric, name, prov_name, prov_version, api_version }
    fi_info {
        next, caps, mode, addr_format, src_addrlen, dest_addrlen, src_addr, dest_addr, handle,
        tx_attr, rx_attr, ep_attr, domain_attr, fabric_attr, nic,
    }
    fi_provider { version, fi_version, context, name, getinfo, fabric, cleanup }
    fi_ops_fabric { size, domain, passive_ep, eq_open, wait_open, trywait, domain2 }
    fid_fabric { fid, ops, api_version }
    fi_ops_domain {
        size, av_open, cq_open, endpoint, scalable_ep, cntr_open, poll_open, stx_ctx, srx_ctx,
        query_atomic, query_collective, endpoint2,
    }
    fi_ops_mr { size, reg, regv, regattr }
    fid_domain { fid, ops, mr }
    fi_ops_ep { size, cancel, getopt, setopt, tx_ctx, rx_ctx, rx_size_left, tx_size_left }
    fi_ops_cm { size, setname, getname, getpeer, connect, listen, accept, reject, shutdown, join }
    fi_msg { msg_iov, desc, iov_count, addr, context, data }
    fi_msg_tagged { msg_iov, desc, iov_count, addr, tag, ignore, context, data }
    fi_ops_msg { size, recv, recvv, recvmsg, send, sendv, sendmsg, inject, senddata, injectdata }
    fi_ops_tagged { size, recv, recvv, recvmsg, send, sendv, sendmsg, inject, senddata, injectdata }
    fid_ep { fid, ops, cm, msg, rma, tagged, atomic, collective }
    fi_rma_iov { addr, len, key }
    fi_msg_rma { msg_iov, desc, iov_count, addr, rma_iov, rma_iov_count, context, data }
    fi_ops_rma { size, read, readv, readmsg, write, writev, writemsg, inject, writedata, injectdata }
    fid_mr { fid, mem_desc, key }
    fi_mr_attr {
        mr_iov, iov_count, access, offset, requested_key, context, auth_key_size, auth_key,
        iface, device,
    }
    fi_av_attr { type_, rx_ctx_bits, count, ep_per_node, name, map_addr, flags }
    fi_ops_av { size, insert, insertsvc, insertsym, remove, lookup, straddr, av_set }
    fid_av { fid, ops }
    fi_cq_attr { size, flags, format, wait_obj, signaling_vector, wait_cond, wait_set }
    fi_cq_tagged_entry { op_context, flags, len, buf, data, tag }
    fi_cq_err_entry { op_context, flags, len, buf, data, tag, olen, err, prov_errno, err_data, err_data_size }
    fi_ops_cq { size, read, readfrom, readerr, sread, sreadfrom, signal, strerror }
    fi_cntr_attr { events, wait_obj, wait_set, flags }
    fi_ops_cntr { size, read, readerr, add, set, wait, adderr, seterr }
    fid_cntr { fid, ops }
    fid_cq { fid, ops }
    fi_eq_attr { size, flags, wait_obj, signaling_vector, wait_set }
    fi_ops_eq { size, read, readerr, write, sread, strerror }
    fid_eq { fid, ops }
}

/// The operation tables the provider does not offer, whole: only their size matters.
fn whole_tables() -> String {
    [
        ("fi_ops_atomic", size_of::<fi_ops_atomic>()),
        ("fi_ops_collective", size_of::<fi_ops_collective>()),
    ]
    .iter()
    .map(|(s, n)| format!("_Static_assert(sizeof(struct {s}) == {n}, \"sizeof {s}\");\n"))
    .collect()
}

/// Every constant of `src/abi.rs` with its C name, as a 64-bit value.
fn constants() -> Vec<(&'static str, i128)> {
    let c = |v: i32| i128::from(v);
    let u = |v: u64| i128::from(v);
    vec![
        (
            "FI_VERSION(FI_MAJOR_VERSION, FI_MINOR_VERSION)",
            u(FI_API_VERSION.into()),
        ),
        ("FI_MSG", u(FI_MSG)),
        ("FI_RMA", u(FI_RMA)),
        ("FI_TAGGED", u(FI_TAGGED)),
        ("FI_ATOMIC", u(FI_ATOMIC)),
        ("FI_READ", u(FI_READ)),
        ("FI_WRITE", u(FI_WRITE)),
        ("FI_RECV", u(FI_RECV)),
        ("FI_SEND", u(FI_SEND)),
        ("FI_REMOTE_READ", u(FI_REMOTE_READ)),
        ("FI_REMOTE_WRITE", u(FI_REMOTE_WRITE)),
        ("FI_REMOTE_CQ_DATA", u(FI_REMOTE_CQ_DATA)),
        ("FI_PEEK", u(FI_PEEK)),
        ("FI_MULTI_RECV", u(FI_MULTI_RECV)),
        ("FI_COMPLETION", u(FI_COMPLETION)),
        ("FI_INJECT", u(FI_INJECT)),
        ("FI_INJECT_COMPLETE", u(FI_INJECT_COMPLETE)),
        ("FI_TRANSMIT_COMPLETE", u(FI_TRANSMIT_COMPLETE)),
        ("FI_DELIVERY_COMPLETE", u(FI_DELIVERY_COMPLETE)),
        ("FI_LOCAL_COMM", u(FI_LOCAL_COMM)),
        ("FI_REMOTE_COMM", u(FI_REMOTE_COMM)),
        ("FI_SOURCE", u(FI_SOURCE)),
        ("FI_DIRECTED_RECV", u(FI_DIRECTED_RECV)),
        ("FI_CONTEXT", u(FI_CONTEXT)),
        ("FI_CONTEXT2", u(FI_CONTEXT2)),
        ("FI_MR_LOCAL", c(FI_MR_LOCAL)),
        ("FI_MR_VIRT_ADDR", c(FI_MR_VIRT_ADDR)),
        ("FI_MR_ALLOCATED", c(FI_MR_ALLOCATED)),
        ("FI_MR_PROV_KEY", c(FI_MR_PROV_KEY)),
        ("FI_MR_ENDPOINT", c(FI_MR_ENDPOINT)),
        ("FI_MR_UNSPEC", c(FI_MR_UNSPEC)),
        ("FI_MR_BASIC", c(FI_MR_BASIC)),
        ("FI_MR_SCALABLE", c(FI_MR_SCALABLE)),
        ("FI_ORDER_SAS", u(FI_ORDER_SAS)),
        ("FI_ADDR_UNSPEC", u(FI_ADDR_UNSPEC)),
        ("FI_EP_UNSPEC", c(FI_EP_UNSPEC)),
        ("FI_EP_RDM", c(FI_EP_RDM)),
        ("FI_OPT_ENDPOINT", c(FI_OPT_ENDPOINT)),
        ("FI_OPT_MIN_MULTI_RECV", c(FI_OPT_MIN_MULTI_RECV)),
        ("FI_AV_UNSPEC", c(FI_AV_UNSPEC)),
        ("FI_AV_MAP", c(FI_AV_MAP)),
        ("FI_AV_TABLE", c(FI_AV_TABLE)),
        ("FI_PROGRESS_UNSPEC", c(FI_PROGRESS_UNSPEC)),
        ("FI_PROGRESS_AUTO", c(FI_PROGRESS_AUTO)),
        ("FI_PROGRESS_MANUAL", c(FI_PROGRESS_MANUAL)),
        ("FI_THREAD_UNSPEC", c(FI_THREAD_UNSPEC)),
        ("FI_THREAD_SAFE", c(FI_THREAD_SAFE)),
        ("FI_THREAD_ENDPOINT", c(FI_THREAD_ENDPOINT)),
        ("FI_RM_UNSPEC", c(FI_RM_UNSPEC)),
        ("FI_RM_ENABLED", c(FI_RM_ENABLED)),
        ("FI_FORMAT_UNSPEC", u(FI_FORMAT_UNSPEC.into())),
        ("FI_PROTO_UNSPEC", u(FI_PROTO_UNSPEC.into())),
        ("FI_CLASS_FABRIC", u(FI_CLASS_FABRIC as u64)),
        ("FI_CLASS_DOMAIN", u(FI_CLASS_DOMAIN as u64)),
        ("FI_EINVAL", c(FI_EINVAL)),
        ("FI_ENOMEM", c(FI_ENOMEM)),
        ("FI_ENOSYS", c(FI_ENOSYS)),
        ("FI_ENODATA", c(FI_ENODATA)),
        ("FI_EBUSY", c(FI_EBUSY)),
        ("FI_EIO", c(FI_EIO)),
        ("FI_ENODEV", c(FI_ENODEV)),
        ("FI_EAGAIN", c(FI_EAGAIN)),
        ("FI_ECANCELED", c(FI_ECANCELED)),
        ("FI_EHOSTUNREACH", c(FI_EHOSTUNREACH)),
        ("FI_ECONNREFUSED", c(FI_ECONNREFUSED)),
        ("FI_ENOPROTOOPT", c(FI_ENOPROTOOPT)),
        ("FI_ENOENT", c(FI_ENOENT)),
        ("FI_EACCES", c(FI_EACCES)),
        ("FI_EADDRINUSE", c(FI_EADDRINUSE)),
        ("FI_ETIMEDOUT", c(FI_ETIMEDOUT)),
        ("FI_EOPBADSTATE", c(FI_EOPBADSTATE)),
        ("FI_EAVAIL", c(FI_EAVAIL)),
        ("FI_ENOCQ", c(FI_ENOCQ)),
        ("FI_ETRUNC", c(FI_ETRUNC)),
        ("FI_ENOKEY", c(FI_ENOKEY)),
        ("FI_ENOAV", c(FI_ENOAV)),
        ("FI_ETOOSMALL", c(FI_ETOOSMALL)),
        ("FI_ENOMSG", c(FI_ENOMSG)),
        ("FI_EMSGSIZE", c(FI_EMSGSIZE)),
        ("FI_ENABLE", c(FI_ENABLE)),
        ("FI_SELECTIVE_COMPLETION", u(FI_SELECTIVE_COMPLETION)),
        ("FI_TRANSMIT", u(FI_TRANSMIT)),
        ("FI_CLAIM", u(FI_CLAIM)),
        ("FI_DISCARD", u(FI_DISCARD)),
        ("FI_CLASS_EP", u(FI_CLASS_EP as u64)),
        ("FI_CLASS_AV", u(FI_CLASS_AV as u64)),
        ("FI_CLASS_MR", u(FI_CLASS_MR as u64)),
        ("FI_CLASS_EQ", u(FI_CLASS_EQ as u64)),
        ("FI_CLASS_CQ", u(FI_CLASS_CQ as u64)),
        ("FI_CLASS_CNTR", u(FI_CLASS_CNTR as u64)),
        ("FI_CNTR_EVENTS_COMP", c(FI_CNTR_EVENTS_COMP)),
        ("FI_CQ_FORMAT_UNSPEC", c(FI_CQ_FORMAT_UNSPEC)),
        ("FI_CQ_FORMAT_CONTEXT", c(FI_CQ_FORMAT_CONTEXT)),
        ("FI_CQ_FORMAT_MSG", c(FI_CQ_FORMAT_MSG)),
        ("FI_CQ_FORMAT_DATA", c(FI_CQ_FORMAT_DATA)),
        ("FI_CQ_FORMAT_TAGGED", c(FI_CQ_FORMAT_TAGGED)),
        ("FI_WAIT_NONE", c(FI_WAIT_NONE)),
        ("FI_WAIT_UNSPEC", c(FI_WAIT_UNSPEC)),
    ]
}

fn source() -> String {
    let mut c = String::from(
        "#include <stddef.h>\n#include <stdint.h>\n#include <rdma/fabric.h>\n\
         #include <rdma/fi_domain.h>\n#include <rdma/fi_errno.h>\n\
         #include <rdma/providers/fi_prov.h>\n#include <rdma/fi_endpoint.h>\n\
         #include <rdma/fi_cm.h>\n#include <rdma/fi_tagged.h>\n#include <rdma/fi_rma.h>\n\
         #include <rdma/fi_atomic.h>\n#include <rdma/fi_collective.h>\n#include <rdma/fi_eq.h>\n",
    );
    c += &layouts();
    c += &whole_tables();
    for (name, value) in constants() {
        // Compared as 128-bit integers, so that neither side's width or sign decides
        // (every value here is non-negative).
        assert!(value >= 0, "{name}");
        c += &format!("_Static_assert((__int128)({name}) == (__int128){value}ULL, \"{name}\");\n");
    }
    c += "int main(void) { return 0; }\n";
    c
}

#[test]
fn the_mirror_matches_the_installed_headers() {
    if !Path::new("/usr/include/rdma/fabric.h").exists() {
        let msg = "no libfabric headers (Debian: apt-get install libfabric-dev)";
        assert!(
            std::env::var_os("EXANET_REQUIRE_LIBFABRIC").is_none(),
            "EXANET_REQUIRE_LIBFABRIC is set: {msg}"
        );
        eprintln!("*** SKIPPED the libfabric ABI check: {msg} ***");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("abi.c");
    std::fs::write(&file, source()).unwrap();
    let cc = std::env::var("CC").unwrap_or_else(|_| "gcc".into());
    let out = Command::new(&cc)
        .args(["-std=gnu11", "-Werror", "-fsyntax-only"])
        .arg(&file)
        .output()
        .unwrap_or_else(|e| panic!("{cc}: {e}"));
    assert!(
        out.status.success(),
        "the provider's ABI mirror differs from libfabric's headers:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The check catches a mirror that is wrong: a layout shifted by one byte does not compile.
#[test]
fn a_wrong_layout_fails_the_check() {
    if !Path::new("/usr/include/rdma/fabric.h").exists() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("abi.c");
    let wrong = source().replacen(
        &format!(
            "offsetof(struct fi_info, caps) == {}",
            offset_of!(fi_info, caps)
        ),
        &format!(
            "offsetof(struct fi_info, caps) == {}",
            offset_of!(fi_info, caps) + 1
        ),
        1,
    );
    assert_ne!(wrong, source());
    std::fs::write(&file, wrong).unwrap();
    let cc = std::env::var("CC").unwrap_or_else(|_| "gcc".into());
    let out = Command::new(&cc)
        .args(["-std=gnu11", "-Werror", "-fsyntax-only"])
        .arg(&file)
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("offsetof fi_info.caps"));
}

/// The 2.x tail of `fi_domain_attr` where libfabric 2.5.1's `fabric.h` has it (offsets
/// from `offsetof` against those headers; Debian ships 1.17's, which the C check above
/// holds the first part to).
#[test]
fn the_domain_attributes_have_libfabric_2s_tail() {
    assert_eq!(offset_of!(fi_domain_attr_2, v1), 0);
    assert_eq!(offset_of!(fi_domain_attr, tclass), 184);
    assert_eq!(offset_of!(fi_domain_attr_2, max_ep_auth_key), 192);
    assert_eq!(offset_of!(fi_domain_attr_2, max_group_id), 200);
    assert_eq!(offset_of!(fi_domain_attr_2, max_cntr_value), 208);
    assert_eq!(offset_of!(fi_domain_attr_2, max_err_cntr_value), 216);
    assert_eq!(size_of::<fi_domain_attr_2>(), 224);
}
