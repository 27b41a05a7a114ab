//! The C entry points libfabric calls: `fi_prov_ini`, the provider's `getinfo` and
//! `fabric`, and the objects they open. All of the crate's unsafe code is here; the
//! decisions are made in safe Rust ([`crate::offer`]) and only laid out in C here.
//!
//! What libfabric frees, it frees with `free(3)` (`fi_freeinfo`): every `fi_info` and
//! attribute and string handed to it is allocated with `calloc(3)`/`strdup(3)`. Objects
//! the provider opens (fabric, domain) are Rust boxes whose first field is the libfabric
//! object, returned by pointer and taken back by their `close`.
//!
//! libfabric's inline wrappers call operations without a null check, so every operation
//! table is complete: what is not offered yet answers `-FI_ENOSYS`.

use std::ffi::{c_char, c_int, c_void, CStr};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::ptr::{self, addr_of_mut};
use std::sync::OnceLock;

use crate::abi::*;
use crate::offer::{self, Hints, Offer};

/// The provider's own version (`fi_info -p exanet -v` shows it).
const PROVIDER_VERSION: u32 = fi_version(0, 1);

/// Runs `f`, turning a panic into `-FI_EIO` rather than unwinding into C.
fn guard(f: impl FnOnce() -> c_int) -> c_int {
    catch_unwind(AssertUnwindSafe(f)).unwrap_or(-FI_EIO)
}

struct Provider(*mut fi_provider);
// SAFETY: the pointer is written once, before it is shared, and afterwards only libfabric
// reads or writes the struct (its `context`), under its own lock.
unsafe impl Send for Provider {}
// SAFETY: as above.
unsafe impl Sync for Provider {}

/// What libfabric's loader calls after `dlopen`ing `libexanet-fi.so` from
/// `FI_PROVIDER_PATH`.
#[no_mangle]
pub extern "C" fn fi_prov_ini() -> *mut fi_provider {
    static PROVIDER: OnceLock<Provider> = OnceLock::new();
    PROVIDER
        .get_or_init(|| {
            // libfabric keeps its own state in `context`: the struct must be writable and
            // live as long as the library is loaded, hence leaked.
            Provider(Box::into_raw(Box::new(fi_provider {
                version: PROVIDER_VERSION,
                fi_version: FI_API_VERSION,
                context: fi_context {
                    internal: [ptr::null_mut(); 4],
                },
                name: c"exanet".as_ptr(),
                getinfo: Some(getinfo),
                fabric: Some(fabric),
                cleanup: Some(cleanup),
            })))
        })
        .0
}

unsafe extern "C" fn cleanup() {}

/// A C string libfabric handed over, if set and UTF-8.
///
/// # Safety
/// `p` is null or a NUL-terminated string.
unsafe fn text(p: *const c_char) -> Option<String> {
    if p.is_null() {
        return None;
    }
    // SAFETY: non-null and NUL-terminated as the caller guarantees.
    unsafe { CStr::from_ptr(p) }
        .to_str()
        .ok()
        .map(str::to_string)
}

/// The hints, as far as the provider reads them.
///
/// # Safety
/// `h` is a valid `fi_info` whose attribute pointers are null or valid.
unsafe fn read_hints(h: &fi_info) -> Hints {
    let mut out = Hints {
        caps: h.caps,
        mode: h.mode,
        addr_format: h.addr_format,
        ..Hints::default()
    };
    // SAFETY (each block): libfabric's hints point at valid attributes or are null.
    if let Some(a) = unsafe { h.ep_attr.as_ref() } {
        out.ep_type = a.type_;
        out.protocol = a.protocol;
        out.max_msg_size = a.max_msg_size;
    }
    if let Some(a) = unsafe { h.tx_attr.as_ref() } {
        out.tx_caps = a.caps;
        out.tx_msg_order = a.msg_order;
        out.inject_size = a.inject_size;
    }
    if let Some(a) = unsafe { h.rx_attr.as_ref() } {
        out.rx_caps = a.caps;
        out.rx_msg_order = a.msg_order;
    }
    if let Some(a) = unsafe { h.fabric_attr.as_ref() } {
        out.fabric_name = unsafe { text(a.name) };
        out.prov_name = unsafe { text(a.prov_name) };
    }
    if let Some(a) = unsafe { h.domain_attr.as_ref() } {
        out.domain_name = unsafe { text(a.name) };
        out.threading = a.threading;
        out.control_progress = a.control_progress;
        out.data_progress = a.data_progress;
        out.resource_mgmt = a.resource_mgmt;
        out.av_type = a.av_type;
        out.mr_mode = a.mr_mode;
    }
    out
}

/// `calloc` of one `T`, or null.
fn zeroed<T>() -> *mut T {
    // SAFETY: calloc of a nonzero size; the result is checked by the caller.
    unsafe { libc::calloc(1, std::mem::size_of::<T>()) }.cast()
}

/// `strdup` of `s` (which has no NUL), or null.
fn dup(s: &str) -> *mut c_char {
    let Ok(c) = std::ffi::CString::new(s) else {
        return ptr::null_mut();
    };
    // SAFETY: `c` is a valid NUL-terminated string.
    unsafe { libc::strdup(c.as_ptr()) }
}

/// Frees what [`layout`] allocated, as `fi_freeinfo` would.
///
/// # Safety
/// `info` came from [`layout`] and was not handed out.
unsafe fn free_info(info: *mut fi_info) {
    // SAFETY: every pointer below is null or a calloc/strdup allocation of `layout`.
    unsafe {
        let i = &mut *info;
        libc::free(i.tx_attr.cast());
        libc::free(i.rx_attr.cast());
        libc::free(i.ep_attr.cast());
        if let Some(d) = i.domain_attr.as_mut() {
            libc::free(d.name.cast());
        }
        libc::free(i.domain_attr.cast());
        if let Some(f) = i.fabric_attr.as_mut() {
            libc::free(f.name.cast());
        }
        libc::free(i.fabric_attr.cast());
        libc::free(info.cast());
    }
}

/// `o` as a `struct fi_info` libfabric can free, or null when memory ran out.
fn layout(o: &Offer, api_version: u32) -> *mut fi_info {
    let info: *mut fi_info = zeroed();
    if info.is_null() {
        return info;
    }
    // SAFETY: `info` is a zeroed fi_info (all pointers null, which free_info accepts);
    // each attribute is a zeroed allocation checked before it is written.
    unsafe {
        let i = &mut *info;
        i.caps = o.caps;
        i.mode = o.mode;
        i.addr_format = FI_FORMAT_UNSPEC;
        i.tx_attr = zeroed();
        i.rx_attr = zeroed();
        i.ep_attr = zeroed();
        i.domain_attr = zeroed();
        i.fabric_attr = zeroed();
        let domain_name = dup(&o.domain_name);
        let fabric_name = dup(&o.fabric_name);
        if let Some(d) = i.domain_attr.as_mut() {
            d.name = domain_name;
        }
        if let Some(f) = i.fabric_attr.as_mut() {
            f.name = fabric_name;
        }
        let (Some(tx), Some(rx), Some(ep), Some(d), Some(f)) = (
            i.tx_attr.as_mut(),
            i.rx_attr.as_mut(),
            i.ep_attr.as_mut(),
            i.domain_attr.as_mut(),
            i.fabric_attr.as_mut(),
        ) else {
            libc::free(domain_name.cast());
            libc::free(fabric_name.cast());
            free_info(info);
            return ptr::null_mut();
        };
        if d.name.is_null() || f.name.is_null() {
            free_info(info);
            return ptr::null_mut();
        }
        tx.caps = o.tx_caps;
        tx.msg_order = o.msg_order;
        tx.inject_size = o.inject_size;
        tx.size = o.queue_size;
        tx.iov_limit = 1;
        rx.caps = o.rx_caps;
        rx.msg_order = o.msg_order;
        rx.size = o.queue_size;
        rx.iov_limit = 1;
        ep.type_ = FI_EP_RDM;
        ep.protocol = FI_PROTO_UNSPEC;
        ep.max_msg_size = o.max_msg_size;
        ep.mem_tag_format = o.mem_tag_format;
        ep.tx_ctx_cnt = 1;
        ep.rx_ctx_cnt = 1;
        d.threading = o.threading;
        d.control_progress = o.progress;
        d.data_progress = o.progress;
        d.resource_mgmt = o.resource_mgmt;
        d.av_type = o.av_type;
        d.mr_mode = o.mr_mode;
        d.cq_cnt = 64;
        d.ep_cnt = 64;
        d.tx_ctx_cnt = 1;
        d.rx_ctx_cnt = 1;
        d.max_ep_tx_ctx = 1;
        d.max_ep_rx_ctx = 1;
        d.cntr_cnt = 0;
        d.mr_iov_limit = 1;
        d.caps = o.caps & (FI_LOCAL_COMM | FI_REMOTE_COMM);
        d.max_err_data = 0;
        f.api_version = api_version;
    }
    info
}

/// `fi_getinfo` for this provider: one answer, for the node this process runs on, or
/// `-FI_ENODATA` (no node configured, no daemon there, or hints it cannot meet).
unsafe extern "C" fn getinfo(
    version: u32,
    _node: *const c_char,
    _service: *const c_char,
    _flags: u64,
    hints: *const fi_info,
    info: *mut *mut fi_info,
) -> c_int {
    guard(|| {
        if info.is_null() {
            return -FI_EINVAL;
        }
        // SAFETY: non-null, writable as libfabric guarantees.
        unsafe { *info = ptr::null_mut() };
        let Ok((node, socket)) = exanet::Config::from_env().node_socket() else {
            return -FI_ENODATA;
        };
        if !socket.exists() {
            return -FI_ENODATA;
        }
        // SAFETY: libfabric passes null or valid hints.
        let hints = unsafe { hints.as_ref() }.map(|h| unsafe { read_hints(h) });
        let Ok(o) = offer::offer(&node, hints.as_ref()) else {
            return -FI_ENODATA;
        };
        let out = layout(&o, version);
        if out.is_null() {
            return -FI_ENOMEM;
        }
        // SAFETY: as above.
        unsafe { *info = out };
        0
    })
}

/// The fabric object: the libfabric head first, so a `*mut fid_fabric` is a `*mut
/// Fabric`.
#[repr(C)]
struct Fabric {
    head: fid_fabric,
}

/// The domain: this process's attachment to its node's NI.
#[repr(C)]
struct Domain {
    head: fid_domain,
    endpoint: exanet::Endpoint,
}

static FABRIC_FID_OPS: fi_ops = fi_ops {
    size: std::mem::size_of::<fi_ops>(),
    close: Some(fabric_close),
    bind: Some(no_bind),
    control: Some(no_control),
    ops_open: Some(no_ops_open),
    tostr: Some(no_tostr),
    ops_set: Some(no_ops_set),
};

static FABRIC_OPS: fi_ops_fabric = fi_ops_fabric {
    size: std::mem::size_of::<fi_ops_fabric>(),
    domain: Some(domain),
    passive_ep: Some(no_passive_ep),
    eq_open: Some(no_eq_open),
    wait_open: Some(no_wait_open),
    trywait: Some(no_trywait),
    domain2: Some(domain2),
};

static DOMAIN_FID_OPS: fi_ops = fi_ops {
    size: std::mem::size_of::<fi_ops>(),
    close: Some(domain_close),
    bind: Some(no_bind),
    control: Some(no_control),
    ops_open: Some(no_ops_open),
    tostr: Some(no_tostr),
    ops_set: Some(no_ops_set),
};

static DOMAIN_OPS: fi_ops_domain = fi_ops_domain {
    size: std::mem::size_of::<fi_ops_domain>(),
    av_open: Some(no_domain_open),
    cq_open: Some(no_domain_open),
    endpoint: Some(no_endpoint),
    scalable_ep: Some(no_endpoint),
    cntr_open: Some(no_domain_open),
    poll_open: Some(no_poll_open),
    stx_ctx: Some(no_stx_ctx),
    srx_ctx: Some(no_srx_ctx),
    query_atomic: Some(no_query_atomic),
    query_collective: Some(no_query_collective),
    endpoint2: Some(no_endpoint2),
};

static MR_OPS: fi_ops_mr = fi_ops_mr {
    size: std::mem::size_of::<fi_ops_mr>(),
    reg: Some(no_mr_reg),
    regv: Some(no_mr_regv),
    regattr: Some(no_mr_regattr),
};

/// The provider's `fabric`: opens the one fabric.
unsafe extern "C" fn fabric(
    attr: *mut fi_fabric_attr,
    out: *mut *mut fid_fabric,
    context: *mut c_void,
) -> c_int {
    guard(|| {
        if out.is_null() {
            return -FI_EINVAL;
        }
        // SAFETY: libfabric passes null or a valid attribute.
        if let Some(a) = unsafe { attr.as_ref() } {
            // SAFETY: null or NUL-terminated.
            if unsafe { text(a.name) }.is_some_and(|n| n != offer::FABRIC_NAME) {
                return -FI_EINVAL;
            }
        }
        let f = Box::into_raw(Box::new(Fabric {
            head: fid_fabric {
                fid: fid {
                    fclass: FI_CLASS_FABRIC,
                    context,
                    ops: ptr::addr_of!(FABRIC_FID_OPS).cast_mut(),
                },
                ops: ptr::addr_of!(FABRIC_OPS).cast_mut(),
                api_version: FI_API_VERSION,
            },
        }));
        // SAFETY: non-null, writable; `Fabric` starts with its `fid_fabric`.
        unsafe { *out = addr_of_mut!((*f).head) };
        0
    })
}

unsafe extern "C" fn fabric_close(f: *mut fid) -> c_int {
    guard(|| {
        if f.is_null() {
            return -FI_EINVAL;
        }
        // SAFETY: `f` is the head of a `Fabric` boxed by `fabric`, closed once.
        drop(unsafe { Box::from_raw(f.cast::<Fabric>()) });
        0
    })
}

/// `fi_domain`: attaches this process to its node's NI.
unsafe extern "C" fn domain(
    fabric: *mut fid_fabric,
    info: *mut fi_info,
    out: *mut *mut fid_domain,
    context: *mut c_void,
) -> c_int {
    // SAFETY: forwarded as received.
    unsafe { domain2(fabric, info, out, 0, context) }
}

unsafe extern "C" fn domain2(
    fabric: *mut fid_fabric,
    info: *mut fi_info,
    out: *mut *mut fid_domain,
    _flags: u64,
    context: *mut c_void,
) -> c_int {
    guard(|| {
        if fabric.is_null() || out.is_null() {
            return -FI_EINVAL;
        }
        let config = exanet::Config::from_env();
        let Ok((node, _)) = config.node_socket() else {
            return -FI_ENODEV;
        };
        // SAFETY: libfabric passes null or a valid info with null or valid attributes.
        let asked = unsafe { info.as_ref().and_then(|i| i.domain_attr.as_ref()) }
            .and_then(|d| unsafe { text(d.name) });
        if asked.is_some_and(|a| !a.eq_ignore_ascii_case(&node)) {
            return -FI_EINVAL;
        }
        let endpoint = match exanet::Endpoint::attach_with(&config) {
            Ok(e) => e,
            Err(_) => return -FI_ENODEV,
        };
        let d = Box::into_raw(Box::new(Domain {
            head: fid_domain {
                fid: fid {
                    fclass: FI_CLASS_DOMAIN,
                    context,
                    ops: ptr::addr_of!(DOMAIN_FID_OPS).cast_mut(),
                },
                ops: ptr::addr_of!(DOMAIN_OPS).cast_mut(),
                mr: ptr::addr_of!(MR_OPS).cast_mut(),
            },
            endpoint,
        }));
        // SAFETY: non-null, writable; `Domain` starts with its `fid_domain`.
        unsafe { *out = addr_of_mut!((*d).head) };
        0
    })
}

unsafe extern "C" fn domain_close(d: *mut fid) -> c_int {
    guard(|| {
        if d.is_null() {
            return -FI_EINVAL;
        }
        // SAFETY: `d` is the head of a `Domain` boxed by `domain2`, closed once; dropping
        // it detaches from the NI.
        drop(unsafe { Box::from_raw(d.cast::<Domain>()) });
        0
    })
}

// What is not offered yet: every operation answers -FI_ENOSYS.
unsafe extern "C" fn no_bind(_: *mut fid, _: *mut fid, _: u64) -> c_int {
    -FI_ENOSYS
}
unsafe extern "C" fn no_control(_: *mut fid, _: c_int, _: *mut c_void) -> c_int {
    -FI_ENOSYS
}
unsafe extern "C" fn no_ops_open(
    _: *mut fid,
    _: *const c_char,
    _: u64,
    _: *mut *mut c_void,
    _: *mut c_void,
) -> c_int {
    -FI_ENOSYS
}
unsafe extern "C" fn no_tostr(_: *const fid, _: *mut c_char, _: usize) -> c_int {
    -FI_ENOSYS
}
unsafe extern "C" fn no_ops_set(
    _: *mut fid,
    _: *const c_char,
    _: u64,
    _: *mut c_void,
    _: *mut c_void,
) -> c_int {
    -FI_ENOSYS
}
unsafe extern "C" fn no_passive_ep(
    _: *mut fid_fabric,
    _: *mut fi_info,
    _: *mut Opaque,
    _: Opaque,
) -> c_int {
    -FI_ENOSYS
}
unsafe extern "C" fn no_eq_open(_: *mut fid_fabric, _: Opaque, _: *mut Opaque, _: Opaque) -> c_int {
    -FI_ENOSYS
}
unsafe extern "C" fn no_wait_open(_: *mut fid_fabric, _: Opaque, _: *mut Opaque) -> c_int {
    -FI_ENOSYS
}
unsafe extern "C" fn no_trywait(_: *mut fid_fabric, _: *mut *mut fid, _: c_int) -> c_int {
    -FI_ENOSYS
}
unsafe extern "C" fn no_domain_open(
    _: *mut fid_domain,
    _: Opaque,
    _: *mut Opaque,
    _: Opaque,
) -> c_int {
    -FI_ENOSYS
}
unsafe extern "C" fn no_endpoint(
    _: *mut fid_domain,
    _: *mut fi_info,
    _: *mut Opaque,
    _: Opaque,
) -> c_int {
    -FI_ENOSYS
}
unsafe extern "C" fn no_endpoint2(
    _: *mut fid_domain,
    _: *mut fi_info,
    _: *mut Opaque,
    _: u64,
    _: Opaque,
) -> c_int {
    -FI_ENOSYS
}
unsafe extern "C" fn no_poll_open(_: *mut fid_domain, _: Opaque, _: *mut Opaque) -> c_int {
    -FI_ENOSYS
}
unsafe extern "C" fn no_stx_ctx(
    _: *mut fid_domain,
    _: *mut fi_tx_attr,
    _: *mut Opaque,
    _: Opaque,
) -> c_int {
    -FI_ENOSYS
}
unsafe extern "C" fn no_srx_ctx(
    _: *mut fid_domain,
    _: *mut fi_rx_attr,
    _: *mut Opaque,
    _: Opaque,
) -> c_int {
    -FI_ENOSYS
}
unsafe extern "C" fn no_query_atomic(
    _: *mut fid_domain,
    _: c_int,
    _: c_int,
    _: Opaque,
    _: u64,
) -> c_int {
    -FI_ENOSYS
}
unsafe extern "C" fn no_query_collective(_: *mut fid_domain, _: c_int, _: Opaque, _: u64) -> c_int {
    -FI_ENOSYS
}
#[allow(clippy::too_many_arguments)] // libfabric's signature
unsafe extern "C" fn no_mr_reg(
    _: *mut fid,
    _: *const c_void,
    _: usize,
    _: u64,
    _: u64,
    _: u64,
    _: u64,
    _: *mut Opaque,
    _: Opaque,
) -> c_int {
    -FI_ENOSYS
}
#[allow(clippy::too_many_arguments)] // libfabric's signature
unsafe extern "C" fn no_mr_regv(
    _: *mut fid,
    _: Opaque,
    _: usize,
    _: u64,
    _: u64,
    _: u64,
    _: u64,
    _: *mut Opaque,
    _: Opaque,
) -> c_int {
    -FI_ENOSYS
}
unsafe extern "C" fn no_mr_regattr(_: *mut fid, _: Opaque, _: u64, _: *mut Opaque) -> c_int {
    -FI_ENOSYS
}
