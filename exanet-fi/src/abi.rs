//! libfabric 1.17's ABI as this provider sees it: the structs it fills or reads and the
//! constants it answers with, mirrored from `<rdma/fabric.h>`, `<rdma/fi_domain.h>` and
//! `<rdma/fi_errno.h>` (`#[repr(C)]`, field for field, in the headers' order). Only what
//! the provider touches is here. `tests/abi.rs` compiles a C file against the installed
//! headers that asserts every size, alignment and offset below, and every constant.
//!
//! Function pointers are `Option<unsafe extern "C" fn ..>`: a null pointer is `None`,
//! which libfabric reads as "not supported" for optional operations.

#![allow(non_camel_case_types)]

use std::ffi::{c_char, c_int, c_void};

/// `FI_VERSION(major, minor)`.
pub const fn fi_version(major: u32, minor: u32) -> u32 {
    (major << 16) | minor
}

/// The API whose headers the structures here are checked against at test time
/// (Debian's libfabric-dev, `tests/abi.rs`).
pub const FI_API_VERSION: u32 = fi_version(1, 17);

/// The API version the provider declares: libfabric leaves out of `fi_getinfo` every
/// provider older than what the application asks for, and MPICH 5's ch4:ofi (PyPI's
/// `mpich`, with libfabric 2.5) asks for 2.5. Of what 2.x changed in the structures a
/// provider fills, only `fi_domain_attr` grew (four fields at its end,
/// [`fi_domain_attr_2`]); what a 1.x application or library reads is the same.
pub const FI_PROVIDER_API_VERSION: u32 = fi_version(2, 5);

// Capabilities and operation flags (`fabric.h`).
pub const FI_MSG: u64 = 1 << 1;
pub const FI_RMA: u64 = 1 << 2;
pub const FI_TAGGED: u64 = 1 << 3;
pub const FI_ATOMIC: u64 = 1 << 4;
pub const FI_READ: u64 = 1 << 8;
pub const FI_WRITE: u64 = 1 << 9;
pub const FI_RECV: u64 = 1 << 10;
pub const FI_SEND: u64 = 1 << 11;
pub const FI_REMOTE_READ: u64 = 1 << 12;
pub const FI_REMOTE_WRITE: u64 = 1 << 13;
pub const FI_REMOTE_CQ_DATA: u64 = 1 << 17;
pub const FI_MULTI_RECV: u64 = 1 << 16;
pub const FI_PEEK: u64 = 1 << 19;
pub const FI_COMPLETION: u64 = 1 << 24;
pub const FI_INJECT: u64 = 1 << 25;
pub const FI_INJECT_COMPLETE: u64 = 1 << 26;
pub const FI_TRANSMIT_COMPLETE: u64 = 1 << 27;
pub const FI_DELIVERY_COMPLETE: u64 = 1 << 28;
pub const FI_LOCAL_COMM: u64 = 1 << 51;
pub const FI_REMOTE_COMM: u64 = 1 << 52;
pub const FI_SOURCE: u64 = 1 << 57;
pub const FI_DIRECTED_RECV: u64 = 1 << 59;

// Modes: what a provider may require of its user.
pub const FI_CONTEXT: u64 = 1 << 59;
pub const FI_CONTEXT2: u64 = 1 << 52;

// Memory registration modes (`int mr_mode`).
pub const FI_MR_LOCAL: c_int = 1 << 2;
pub const FI_MR_VIRT_ADDR: c_int = 1 << 4;
pub const FI_MR_ALLOCATED: c_int = 1 << 5;
pub const FI_MR_PROV_KEY: c_int = 1 << 6;
pub const FI_MR_ENDPOINT: c_int = 1 << 9;
/// The old modes, before the bits: `FI_MR_BASIC` is `FI_MR_VIRT_ADDR | FI_MR_ALLOCATED |
/// FI_MR_PROV_KEY`, `FI_MR_SCALABLE` none of them.
pub const FI_MR_UNSPEC: c_int = 0;
pub const FI_MR_BASIC: c_int = 1;
pub const FI_MR_SCALABLE: c_int = 2;

// Message ordering.
pub const FI_ORDER_SAS: u64 = 1 << 8;

/// `FI_ADDR_UNSPEC`: no address (a receive from anyone).
pub const FI_ADDR_UNSPEC: u64 = u64::MAX;

// enum fi_ep_type
pub const FI_EP_UNSPEC: c_int = 0;
pub const FI_EP_RDM: c_int = 3;

// Endpoint options (`fi_setopt`): the level, and the only option offered (a `size_t`).
pub const FI_OPT_ENDPOINT: c_int = 0;
pub const FI_OPT_MIN_MULTI_RECV: c_int = 0;

// enum fi_av_type
pub const FI_AV_UNSPEC: c_int = 0;
pub const FI_AV_MAP: c_int = 1;
pub const FI_AV_TABLE: c_int = 2;

// enum fi_progress
pub const FI_PROGRESS_UNSPEC: c_int = 0;
pub const FI_PROGRESS_AUTO: c_int = 1;
pub const FI_PROGRESS_MANUAL: c_int = 2;

// enum fi_threading
pub const FI_THREAD_UNSPEC: c_int = 0;
pub const FI_THREAD_SAFE: c_int = 1;
pub const FI_THREAD_ENDPOINT: c_int = 5;

// enum fi_resource_mgmt
pub const FI_RM_UNSPEC: c_int = 0;
pub const FI_RM_ENABLED: c_int = 2;

// Address formats (anonymous enum): ours is an opaque byte string.
pub const FI_FORMAT_UNSPEC: u32 = 0;
// Endpoint protocols (anonymous enum).
pub const FI_PROTO_UNSPEC: u32 = 0;

// enum fi_class (the `fclass` of a `struct fid`).
pub const FI_CLASS_FABRIC: usize = 1;
pub const FI_CLASS_DOMAIN: usize = 2;
pub const FI_CLASS_EP: usize = 3;
pub const FI_CLASS_AV: usize = 11;
pub const FI_CLASS_MR: usize = 12;
pub const FI_CLASS_EQ: usize = 13;
pub const FI_CLASS_CQ: usize = 14;
pub const FI_CLASS_CNTR: usize = 15;

// enum fi_cntr_events
pub const FI_CNTR_EVENTS_COMP: c_int = 0;

// enum fi_cq_format
pub const FI_CQ_FORMAT_UNSPEC: c_int = 0;
pub const FI_CQ_FORMAT_CONTEXT: c_int = 1;
pub const FI_CQ_FORMAT_MSG: c_int = 2;
pub const FI_CQ_FORMAT_DATA: c_int = 3;
pub const FI_CQ_FORMAT_TAGGED: c_int = 4;

// enum fi_wait_obj
pub const FI_WAIT_NONE: c_int = 0;
pub const FI_WAIT_UNSPEC: c_int = 1;

// Error numbers (`fi_errno.h`): returned negated.
pub const FI_EINVAL: c_int = libc::EINVAL;
pub const FI_ENOMEM: c_int = libc::ENOMEM;
pub const FI_ENOSYS: c_int = libc::ENOSYS;
pub const FI_ENODATA: c_int = libc::ENODATA;
pub const FI_EBUSY: c_int = libc::EBUSY;
pub const FI_EIO: c_int = libc::EIO;
pub const FI_ENODEV: c_int = libc::ENODEV;
pub const FI_EAGAIN: c_int = libc::EAGAIN;
pub const FI_ECANCELED: c_int = libc::ECANCELED;
pub const FI_EHOSTUNREACH: c_int = libc::EHOSTUNREACH;
pub const FI_ECONNREFUSED: c_int = libc::ECONNREFUSED;
pub const FI_ENOPROTOOPT: c_int = libc::ENOPROTOOPT;
pub const FI_ENOENT: c_int = libc::ENOENT;
pub const FI_EACCES: c_int = libc::EACCES;
pub const FI_EADDRINUSE: c_int = libc::EADDRINUSE;
pub const FI_ETIMEDOUT: c_int = libc::ETIMEDOUT;
pub const FI_EOPBADSTATE: c_int = 258;
pub const FI_EAVAIL: c_int = 259;
pub const FI_ENOCQ: c_int = 263;
pub const FI_ETRUNC: c_int = 265;
pub const FI_ENOKEY: c_int = 266;
pub const FI_ENOAV: c_int = 267;
pub const FI_ETOOSMALL: c_int = 257;
pub const FI_ENOMSG: c_int = libc::ENOMSG;
pub const FI_EMSGSIZE: c_int = libc::EMSGSIZE;

/// `fi_control` command of `fi_enable`.
pub const FI_ENABLE: c_int = 6;
/// Bind flag: only operations flagged `FI_COMPLETION` complete.
pub const FI_SELECTIVE_COMPLETION: u64 = 1 << 59;
pub const FI_TRANSMIT: u64 = FI_SEND;
pub const FI_CLAIM: u64 = 1 << 59;
pub const FI_DISCARD: u64 = 1 << 58;

#[repr(C)]
pub struct fi_context {
    pub internal: [*mut c_void; 4],
}

/// The head of every libfabric object.
#[repr(C)]
pub struct fid {
    pub fclass: usize,
    pub context: *mut c_void,
    pub ops: *mut fi_ops,
}

#[repr(C)]
pub struct fi_ops {
    pub size: usize,
    pub close: Option<unsafe extern "C" fn(*mut fid) -> c_int>,
    pub bind: Option<unsafe extern "C" fn(*mut fid, *mut fid, u64) -> c_int>,
    pub control: Option<unsafe extern "C" fn(*mut fid, c_int, *mut c_void) -> c_int>,
    pub ops_open: Option<
        unsafe extern "C" fn(*mut fid, *const c_char, u64, *mut *mut c_void, *mut c_void) -> c_int,
    >,
    pub tostr: Option<unsafe extern "C" fn(*const fid, *mut c_char, usize) -> c_int>,
    pub ops_set: Option<
        unsafe extern "C" fn(*mut fid, *const c_char, u64, *mut c_void, *mut c_void) -> c_int,
    >,
}

#[repr(C)]
pub struct fi_tx_attr {
    pub caps: u64,
    pub mode: u64,
    pub op_flags: u64,
    pub msg_order: u64,
    pub comp_order: u64,
    pub inject_size: usize,
    pub size: usize,
    pub iov_limit: usize,
    pub rma_iov_limit: usize,
    pub tclass: u32,
}

#[repr(C)]
pub struct fi_rx_attr {
    pub caps: u64,
    pub mode: u64,
    pub op_flags: u64,
    pub msg_order: u64,
    pub comp_order: u64,
    pub total_buffered_recv: usize,
    pub size: usize,
    pub iov_limit: usize,
}

#[repr(C)]
pub struct fi_ep_attr {
    pub type_: c_int,
    pub protocol: u32,
    pub protocol_version: u32,
    pub max_msg_size: usize,
    pub msg_prefix_size: usize,
    pub max_order_raw_size: usize,
    pub max_order_war_size: usize,
    pub max_order_waw_size: usize,
    pub mem_tag_format: u64,
    pub tx_ctx_cnt: usize,
    pub rx_ctx_cnt: usize,
    pub auth_key_size: usize,
    pub auth_key: *mut u8,
}

#[repr(C)]
pub struct fi_domain_attr {
    pub domain: *mut fid_domain,
    pub name: *mut c_char,
    pub threading: c_int,
    pub control_progress: c_int,
    pub data_progress: c_int,
    pub resource_mgmt: c_int,
    pub av_type: c_int,
    pub mr_mode: c_int,
    pub mr_key_size: usize,
    pub cq_data_size: usize,
    pub cq_cnt: usize,
    pub ep_cnt: usize,
    pub tx_ctx_cnt: usize,
    pub rx_ctx_cnt: usize,
    pub max_ep_tx_ctx: usize,
    pub max_ep_rx_ctx: usize,
    pub max_ep_stx_ctx: usize,
    pub max_ep_srx_ctx: usize,
    pub cntr_cnt: usize,
    pub mr_iov_limit: usize,
    pub caps: u64,
    pub mode: u64,
    pub auth_key: *mut u8,
    pub auth_key_size: usize,
    pub max_err_data: usize,
    pub mr_cnt: usize,
    pub tclass: u32,
}

/// `struct fi_domain_attr` of libfabric 2.x: 1.17's and what 2.0 added at its end, which
/// a 2.x library copies and reads from what a provider hands it. Laid out as libfabric
/// 2.5.1's `fabric.h` has it (offsets 192, 200, 208, 216, size 224 on x86-64 Linux, from
/// `offsetof` against those headers; checked in `tests/abi.rs`); a 1.x library reads the
/// first part only.
#[repr(C)]
pub struct fi_domain_attr_2 {
    pub v1: fi_domain_attr,
    pub max_ep_auth_key: usize,
    pub max_group_id: u32,
    pub max_cntr_value: u64,
    pub max_err_cntr_value: u64,
}

#[repr(C)]
pub struct fi_fabric_attr {
    pub fabric: *mut fid_fabric,
    pub name: *mut c_char,
    pub prov_name: *mut c_char,
    pub prov_version: u32,
    pub api_version: u32,
}

#[repr(C)]
pub struct fi_info {
    pub next: *mut fi_info,
    pub caps: u64,
    pub mode: u64,
    pub addr_format: u32,
    pub src_addrlen: usize,
    pub dest_addrlen: usize,
    pub src_addr: *mut c_void,
    pub dest_addr: *mut c_void,
    pub handle: *mut fid,
    pub tx_attr: *mut fi_tx_attr,
    pub rx_attr: *mut fi_rx_attr,
    pub ep_attr: *mut fi_ep_attr,
    pub domain_attr: *mut fi_domain_attr,
    pub fabric_attr: *mut fi_fabric_attr,
    /// `struct fid_nic *`: never set by this provider.
    pub nic: *mut c_void,
}

/// What `fi_prov_ini` returns (`<rdma/providers/fi_prov.h>`).
#[repr(C)]
pub struct fi_provider {
    pub version: u32,
    pub fi_version: u32,
    pub context: fi_context,
    pub name: *const c_char,
    pub getinfo: Option<
        unsafe extern "C" fn(
            u32,
            *const c_char,
            *const c_char,
            u64,
            *const fi_info,
            *mut *mut fi_info,
        ) -> c_int,
    >,
    pub fabric: Option<
        unsafe extern "C" fn(*mut fi_fabric_attr, *mut *mut fid_fabric, *mut c_void) -> c_int,
    >,
    pub cleanup: Option<unsafe extern "C" fn()>,
}

/// Opaque pointer arguments this provider does not look into yet.
pub type Opaque = *mut c_void;

#[repr(C)]
pub struct fi_ops_fabric {
    pub size: usize,
    pub domain: Option<
        unsafe extern "C" fn(*mut fid_fabric, *mut fi_info, *mut *mut fid_domain, Opaque) -> c_int,
    >,
    pub passive_ep:
        Option<unsafe extern "C" fn(*mut fid_fabric, *mut fi_info, *mut Opaque, Opaque) -> c_int>,
    pub eq_open:
        Option<unsafe extern "C" fn(*mut fid_fabric, Opaque, *mut Opaque, Opaque) -> c_int>,
    pub wait_open: Option<unsafe extern "C" fn(*mut fid_fabric, Opaque, *mut Opaque) -> c_int>,
    pub trywait: Option<unsafe extern "C" fn(*mut fid_fabric, *mut *mut fid, c_int) -> c_int>,
    pub domain2: Option<
        unsafe extern "C" fn(
            *mut fid_fabric,
            *mut fi_info,
            *mut *mut fid_domain,
            u64,
            Opaque,
        ) -> c_int,
    >,
}

#[repr(C)]
pub struct fid_fabric {
    pub fid: fid,
    pub ops: *mut fi_ops_fabric,
    pub api_version: u32,
}

/// `struct fi_ops_domain`. libfabric's inline wrappers call these without a null check,
/// so every one is set: what the provider does not offer answers `-FI_ENOSYS`.
#[repr(C)]
pub struct fi_ops_domain {
    pub size: usize,
    pub av_open:
        Option<unsafe extern "C" fn(*mut fid_domain, Opaque, *mut Opaque, Opaque) -> c_int>,
    pub cq_open:
        Option<unsafe extern "C" fn(*mut fid_domain, Opaque, *mut Opaque, Opaque) -> c_int>,
    pub endpoint:
        Option<unsafe extern "C" fn(*mut fid_domain, *mut fi_info, *mut Opaque, Opaque) -> c_int>,
    pub scalable_ep:
        Option<unsafe extern "C" fn(*mut fid_domain, *mut fi_info, *mut Opaque, Opaque) -> c_int>,
    pub cntr_open:
        Option<unsafe extern "C" fn(*mut fid_domain, Opaque, *mut Opaque, Opaque) -> c_int>,
    pub poll_open: Option<unsafe extern "C" fn(*mut fid_domain, Opaque, *mut Opaque) -> c_int>,
    pub stx_ctx: Option<
        unsafe extern "C" fn(*mut fid_domain, *mut fi_tx_attr, *mut Opaque, Opaque) -> c_int,
    >,
    pub srx_ctx: Option<
        unsafe extern "C" fn(*mut fid_domain, *mut fi_rx_attr, *mut Opaque, Opaque) -> c_int,
    >,
    pub query_atomic:
        Option<unsafe extern "C" fn(*mut fid_domain, c_int, c_int, Opaque, u64) -> c_int>,
    pub query_collective:
        Option<unsafe extern "C" fn(*mut fid_domain, c_int, Opaque, u64) -> c_int>,
    pub endpoint2: Option<
        unsafe extern "C" fn(*mut fid_domain, *mut fi_info, *mut Opaque, u64, Opaque) -> c_int,
    >,
}

/// `struct fi_ops_mr`.
#[repr(C)]
pub struct fi_ops_mr {
    pub size: usize,
    pub reg: Option<
        unsafe extern "C" fn(
            *mut fid,
            *const c_void,
            usize,
            u64,
            u64,
            u64,
            u64,
            *mut Opaque,
            Opaque,
        ) -> c_int,
    >,
    pub regv: Option<
        unsafe extern "C" fn(
            *mut fid,
            Opaque,
            usize,
            u64,
            u64,
            u64,
            u64,
            *mut Opaque,
            Opaque,
        ) -> c_int,
    >,
    pub regattr: Option<unsafe extern "C" fn(*mut fid, Opaque, u64, *mut Opaque) -> c_int>,
}

#[repr(C)]
pub struct fid_domain {
    pub fid: fid,
    pub ops: *mut fi_ops_domain,
    pub mr: *mut fi_ops_mr,
}

#[repr(C)]
pub struct fi_ops_ep {
    pub size: usize,
    pub cancel: Option<unsafe extern "C" fn(*mut fid, *mut c_void) -> isize>,
    pub getopt:
        Option<unsafe extern "C" fn(*mut fid, c_int, c_int, *mut c_void, *mut usize) -> c_int>,
    pub setopt: Option<unsafe extern "C" fn(*mut fid, c_int, c_int, *const c_void, usize) -> c_int>,
    pub tx_ctx: Option<
        unsafe extern "C" fn(
            *mut fid_ep,
            c_int,
            *mut fi_tx_attr,
            *mut *mut fid_ep,
            Opaque,
        ) -> c_int,
    >,
    pub rx_ctx: Option<
        unsafe extern "C" fn(
            *mut fid_ep,
            c_int,
            *mut fi_rx_attr,
            *mut *mut fid_ep,
            Opaque,
        ) -> c_int,
    >,
    pub rx_size_left: Option<unsafe extern "C" fn(*mut fid_ep) -> isize>,
    pub tx_size_left: Option<unsafe extern "C" fn(*mut fid_ep) -> isize>,
}

#[repr(C)]
pub struct fi_ops_cm {
    pub size: usize,
    pub setname: Option<unsafe extern "C" fn(*mut fid, *mut c_void, usize) -> c_int>,
    pub getname: Option<unsafe extern "C" fn(*mut fid, *mut c_void, *mut usize) -> c_int>,
    pub getpeer: Option<unsafe extern "C" fn(*mut fid_ep, *mut c_void, *mut usize) -> c_int>,
    pub connect:
        Option<unsafe extern "C" fn(*mut fid_ep, *const c_void, *const c_void, usize) -> c_int>,
    pub listen: Option<unsafe extern "C" fn(Opaque) -> c_int>,
    pub accept: Option<unsafe extern "C" fn(*mut fid_ep, *const c_void, usize) -> c_int>,
    pub reject: Option<unsafe extern "C" fn(Opaque, *mut fid, *const c_void, usize) -> c_int>,
    pub shutdown: Option<unsafe extern "C" fn(*mut fid_ep, u64) -> c_int>,
    pub join:
        Option<unsafe extern "C" fn(*mut fid_ep, *const c_void, u64, *mut Opaque, Opaque) -> c_int>,
}

#[repr(C)]
pub struct fi_msg {
    pub msg_iov: *const libc::iovec,
    pub desc: *mut *mut c_void,
    pub iov_count: usize,
    pub addr: u64,
    pub context: *mut c_void,
    pub data: u64,
}

#[repr(C)]
pub struct fi_msg_tagged {
    pub msg_iov: *const libc::iovec,
    pub desc: *mut *mut c_void,
    pub iov_count: usize,
    pub addr: u64,
    pub tag: u64,
    pub ignore: u64,
    pub context: *mut c_void,
    pub data: u64,
}

#[repr(C)]
pub struct fi_ops_msg {
    pub size: usize,
    pub recv:
        Option<unsafe extern "C" fn(*mut fid_ep, *mut c_void, usize, Opaque, u64, Opaque) -> isize>,
    pub recvv: Option<
        unsafe extern "C" fn(
            *mut fid_ep,
            *const libc::iovec,
            *mut Opaque,
            usize,
            u64,
            Opaque,
        ) -> isize,
    >,
    pub recvmsg: Option<unsafe extern "C" fn(*mut fid_ep, *const fi_msg, u64) -> isize>,
    pub send: Option<
        unsafe extern "C" fn(*mut fid_ep, *const c_void, usize, Opaque, u64, Opaque) -> isize,
    >,
    pub sendv: Option<
        unsafe extern "C" fn(
            *mut fid_ep,
            *const libc::iovec,
            *mut Opaque,
            usize,
            u64,
            Opaque,
        ) -> isize,
    >,
    pub sendmsg: Option<unsafe extern "C" fn(*mut fid_ep, *const fi_msg, u64) -> isize>,
    pub inject: Option<unsafe extern "C" fn(*mut fid_ep, *const c_void, usize, u64) -> isize>,
    pub senddata: Option<
        unsafe extern "C" fn(*mut fid_ep, *const c_void, usize, Opaque, u64, u64, Opaque) -> isize,
    >,
    pub injectdata:
        Option<unsafe extern "C" fn(*mut fid_ep, *const c_void, usize, u64, u64) -> isize>,
}

#[repr(C)]
pub struct fi_ops_tagged {
    pub size: usize,
    pub recv: Option<
        unsafe extern "C" fn(
            *mut fid_ep,
            *mut c_void,
            usize,
            Opaque,
            u64,
            u64,
            u64,
            Opaque,
        ) -> isize,
    >,
    pub recvv: Option<
        unsafe extern "C" fn(
            *mut fid_ep,
            *const libc::iovec,
            *mut Opaque,
            usize,
            u64,
            u64,
            u64,
            Opaque,
        ) -> isize,
    >,
    pub recvmsg: Option<unsafe extern "C" fn(*mut fid_ep, *const fi_msg_tagged, u64) -> isize>,
    pub send: Option<
        unsafe extern "C" fn(*mut fid_ep, *const c_void, usize, Opaque, u64, u64, Opaque) -> isize,
    >,
    pub sendv: Option<
        unsafe extern "C" fn(
            *mut fid_ep,
            *const libc::iovec,
            *mut Opaque,
            usize,
            u64,
            u64,
            Opaque,
        ) -> isize,
    >,
    pub sendmsg: Option<unsafe extern "C" fn(*mut fid_ep, *const fi_msg_tagged, u64) -> isize>,
    pub inject: Option<unsafe extern "C" fn(*mut fid_ep, *const c_void, usize, u64, u64) -> isize>,
    pub senddata: Option<
        unsafe extern "C" fn(
            *mut fid_ep,
            *const c_void,
            usize,
            Opaque,
            u64,
            u64,
            u64,
            Opaque,
        ) -> isize,
    >,
    pub injectdata:
        Option<unsafe extern "C" fn(*mut fid_ep, *const c_void, usize, u64, u64, u64) -> isize>,
}

/// An operation table the provider does not offer at all (RMA, atomics, collectives):
/// `N` entries, each answering `-FI_ENOSYS`. The entries are declared without
/// parameters: they read none, and on the ABIs this runs on (x86-64 and AArch64, where
/// the caller owns its arguments) a call with arguments to a function that takes none is
/// a call that ignores them.
#[repr(C)]
pub struct fi_ops_none<const N: usize> {
    pub size: usize,
    pub ops: [Option<unsafe extern "C" fn() -> isize>; N],
}

#[repr(C)]
pub struct fi_rma_iov {
    pub addr: u64,
    pub len: usize,
    pub key: u64,
}

#[repr(C)]
pub struct fi_msg_rma {
    pub msg_iov: *const libc::iovec,
    pub desc: *mut *mut c_void,
    pub iov_count: usize,
    pub addr: u64,
    pub rma_iov: *const fi_rma_iov,
    pub rma_iov_count: usize,
    pub context: *mut c_void,
    pub data: u64,
}

/// `read`, `write`: (ep, buf, len, desc, peer, addr, key, context).
pub type RmaFn =
    unsafe extern "C" fn(*mut fid_ep, *mut c_void, usize, Opaque, u64, u64, u64, Opaque) -> isize;
/// `readv`, `writev`: (ep, iov, desc, count, peer, addr, key, context).
pub type RmaVFn = unsafe extern "C" fn(
    *mut fid_ep,
    *const libc::iovec,
    *mut Opaque,
    usize,
    u64,
    u64,
    u64,
    Opaque,
) -> isize;

#[repr(C)]
pub struct fi_ops_rma {
    pub size: usize,
    pub read: Option<RmaFn>,
    pub readv: Option<RmaVFn>,
    pub readmsg: Option<unsafe extern "C" fn(*mut fid_ep, *const fi_msg_rma, u64) -> isize>,
    pub write: Option<RmaFn>,
    pub writev: Option<RmaVFn>,
    pub writemsg: Option<unsafe extern "C" fn(*mut fid_ep, *const fi_msg_rma, u64) -> isize>,
    pub inject:
        Option<unsafe extern "C" fn(*mut fid_ep, *const c_void, usize, u64, u64, u64) -> isize>,
    pub writedata: Option<
        unsafe extern "C" fn(
            *mut fid_ep,
            *const c_void,
            usize,
            Opaque,
            u64,
            u64,
            u64,
            u64,
            Opaque,
        ) -> isize,
    >,
    pub injectdata: Option<
        unsafe extern "C" fn(*mut fid_ep, *const c_void, usize, u64, u64, u64, u64) -> isize,
    >,
}

#[repr(C)]
pub struct fid_mr {
    pub fid: fid,
    pub mem_desc: *mut c_void,
    pub key: u64,
}

#[repr(C)]
pub struct fi_mr_attr {
    pub mr_iov: *const libc::iovec,
    pub iov_count: usize,
    pub access: u64,
    pub offset: u64,
    pub requested_key: u64,
    pub context: *mut c_void,
    pub auth_key_size: usize,
    pub auth_key: *mut u8,
    pub iface: c_int,
    /// A union of the device's id (`uint64_t reserved`, `int cuda`, ...).
    pub device: u64,
}
/// `struct fi_ops_atomic`: 13 operations.
pub type fi_ops_atomic = fi_ops_none<13>;
/// `struct fi_ops_collective`: 11 operations.
pub type fi_ops_collective = fi_ops_none<11>;

#[repr(C)]
pub struct fid_ep {
    pub fid: fid,
    pub ops: *mut fi_ops_ep,
    pub cm: *mut fi_ops_cm,
    pub msg: *mut fi_ops_msg,
    pub rma: *mut fi_ops_rma,
    pub tagged: *mut fi_ops_tagged,
    pub atomic: *mut fi_ops_atomic,
    pub collective: *mut fi_ops_collective,
}

#[repr(C)]
pub struct fi_av_attr {
    pub type_: c_int,
    pub rx_ctx_bits: c_int,
    pub count: usize,
    pub ep_per_node: usize,
    pub name: *const c_char,
    pub map_addr: *mut c_void,
    pub flags: u64,
}

#[repr(C)]
pub struct fi_ops_av {
    pub size: usize,
    pub insert: Option<
        unsafe extern "C" fn(*mut fid_av, *const c_void, usize, *mut u64, u64, Opaque) -> c_int,
    >,
    pub insertsvc: Option<
        unsafe extern "C" fn(
            *mut fid_av,
            *const c_char,
            *const c_char,
            *mut u64,
            u64,
            Opaque,
        ) -> c_int,
    >,
    pub insertsym: Option<
        unsafe extern "C" fn(
            *mut fid_av,
            *const c_char,
            usize,
            *const c_char,
            usize,
            *mut u64,
            u64,
            Opaque,
        ) -> c_int,
    >,
    pub remove: Option<unsafe extern "C" fn(*mut fid_av, *mut u64, usize, u64) -> c_int>,
    pub lookup: Option<unsafe extern "C" fn(*mut fid_av, u64, *mut c_void, *mut usize) -> c_int>,
    pub straddr: Option<
        unsafe extern "C" fn(*mut fid_av, *const c_void, *mut c_char, *mut usize) -> *const c_char,
    >,
    pub av_set: Option<unsafe extern "C" fn(*mut fid_av, Opaque, *mut Opaque, Opaque) -> c_int>,
}

#[repr(C)]
pub struct fid_av {
    pub fid: fid,
    pub ops: *mut fi_ops_av,
}

#[repr(C)]
pub struct fi_cq_attr {
    pub size: usize,
    pub flags: u64,
    pub format: c_int,
    pub wait_obj: c_int,
    pub signaling_vector: c_int,
    pub wait_cond: c_int,
    pub wait_set: Opaque,
}

#[repr(C)]
pub struct fi_cq_tagged_entry {
    pub op_context: *mut c_void,
    pub flags: u64,
    pub len: usize,
    pub buf: *mut c_void,
    pub data: u64,
    pub tag: u64,
}

#[repr(C)]
pub struct fi_cq_err_entry {
    pub op_context: *mut c_void,
    pub flags: u64,
    pub len: usize,
    pub buf: *mut c_void,
    pub data: u64,
    pub tag: u64,
    pub olen: usize,
    pub err: c_int,
    pub prov_errno: c_int,
    pub err_data: *mut c_void,
    pub err_data_size: usize,
}

#[repr(C)]
pub struct fi_ops_cq {
    pub size: usize,
    pub read: Option<unsafe extern "C" fn(*mut fid_cq, *mut c_void, usize) -> isize>,
    pub readfrom: Option<unsafe extern "C" fn(*mut fid_cq, *mut c_void, usize, *mut u64) -> isize>,
    pub readerr: Option<unsafe extern "C" fn(*mut fid_cq, *mut fi_cq_err_entry, u64) -> isize>,
    pub sread: Option<
        unsafe extern "C" fn(*mut fid_cq, *mut c_void, usize, *const c_void, c_int) -> isize,
    >,
    pub sreadfrom: Option<
        unsafe extern "C" fn(
            *mut fid_cq,
            *mut c_void,
            usize,
            *mut u64,
            *const c_void,
            c_int,
        ) -> isize,
    >,
    pub signal: Option<unsafe extern "C" fn(*mut fid_cq) -> c_int>,
    pub strerror: Option<
        unsafe extern "C" fn(
            *mut fid_cq,
            c_int,
            *const c_void,
            *mut c_char,
            usize,
        ) -> *const c_char,
    >,
}

#[repr(C)]
pub struct fid_cq {
    pub fid: fid,
    pub ops: *mut fi_ops_cq,
}

#[repr(C)]
pub struct fi_cntr_attr {
    pub events: c_int,
    pub wait_obj: c_int,
    pub wait_set: Opaque,
    pub flags: u64,
}

#[repr(C)]
pub struct fi_ops_cntr {
    pub size: usize,
    pub read: Option<unsafe extern "C" fn(*mut fid_cntr) -> u64>,
    pub readerr: Option<unsafe extern "C" fn(*mut fid_cntr) -> u64>,
    pub add: Option<unsafe extern "C" fn(*mut fid_cntr, u64) -> c_int>,
    pub set: Option<unsafe extern "C" fn(*mut fid_cntr, u64) -> c_int>,
    pub wait: Option<unsafe extern "C" fn(*mut fid_cntr, u64, c_int) -> c_int>,
    pub adderr: Option<unsafe extern "C" fn(*mut fid_cntr, u64) -> c_int>,
    pub seterr: Option<unsafe extern "C" fn(*mut fid_cntr, u64) -> c_int>,
}

#[repr(C)]
pub struct fid_cntr {
    pub fid: fid,
    pub ops: *mut fi_ops_cntr,
}

#[repr(C)]
pub struct fi_eq_attr {
    pub size: usize,
    pub flags: u64,
    pub wait_obj: c_int,
    pub signaling_vector: c_int,
    pub wait_set: Opaque,
}

#[repr(C)]
pub struct fi_ops_eq {
    pub size: usize,
    pub read: Option<unsafe extern "C" fn(*mut fid_eq, *mut u32, *mut c_void, usize, u64) -> isize>,
    pub readerr: Option<unsafe extern "C" fn(*mut fid_eq, Opaque, u64) -> isize>,
    pub write: Option<unsafe extern "C" fn(*mut fid_eq, u32, *const c_void, usize, u64) -> isize>,
    pub sread: Option<
        unsafe extern "C" fn(*mut fid_eq, *mut u32, *mut c_void, usize, c_int, u64) -> isize,
    >,
    pub strerror: Option<
        unsafe extern "C" fn(
            *mut fid_eq,
            c_int,
            *const c_void,
            *mut c_char,
            usize,
        ) -> *const c_char,
    >,
}

#[repr(C)]
pub struct fid_eq {
    pub fid: fid,
    pub ops: *mut fi_ops_eq,
}
