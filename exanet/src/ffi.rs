//! The C ABI (`include/exanet.h` documents it for C programmers).
//!
//! Conventions:
//! - every function that can fail returns an `int`: 0 (or a non-negative count) on success,
//!   a negative `EXANET_E*` code ([`crate::error::codes`]) on failure; `exanet_last_error()`
//!   then describes the failure in words (per thread);
//! - handles are opaque pointers created by `*_open` / `exanet_attach` / `exanet_register`
//!   and released by the matching `*_close` / `exanet_detach` / `exanet_region_free`;
//!   passing NULL is always an `EXANET_EINVAL` error (or a no-op for the release functions);
//! - nothing hands out pointers into shared memory: region contents are copied in and out;
//! - no Rust panic crosses the boundary (each entry point runs under `catch_unwind`, a
//!   panic becomes `EXANET_EINTERNAL`).
//!
//! The handle types are lower-case like their C names.
#![allow(non_camel_case_types)]

use std::cell::RefCell;
use std::collections::HashMap;
use std::ffi::{c_char, c_int, c_void, CStr, CString};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::OnceLock;
use std::time::Duration;

use exanet_proto::gvas::Gvas;
use exanet_proto::ni::MAX_MESSAGE;
use exanet_proto::shape::NodeId;

use crate::error::{codes, Error, OpError};
use crate::{Config, Endpoint, Mailbox, MemoryRegion, Packetizer, RdmaPage, Tag};

/// An attachment (`exanet_endpoint*` in C).
pub struct exanet_endpoint {
    ep: Endpoint,
}

/// A registered memory region.
pub struct exanet_region {
    region: MemoryRegion,
}

/// A packetizer interface.
pub struct exanet_packetizer {
    p: Packetizer,
}

/// A mailbox.
pub struct exanet_mailbox {
    m: Mailbox,
}

/// An RDMA page.
pub struct exanet_rdma_page {
    p: RdmaPage,
}

/// What `exanet_info` fills in.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct exanet_info_t {
    pub node_id: u32,
    pub nodes: u32,
    pub pdid: u16,
    pub rank: u8,
    /// NUL-terminated node name, e.g. "M1QAF2".
    pub node_name: [c_char; 16],
}

/// A destination or source in this workload's protection domain: node, rank, VA.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct exanet_addr_t {
    pub node: u32,
    pub rank: u8,
    pub va: u64,
}

/// A received message.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct exanet_message_t {
    pub src_node: u32,
    pub src_rank: u8,
    /// The mailbox it arrived in.
    pub vi: u8,
    /// Payload bytes (0..=64).
    pub len: u8,
    pub payload: [u8; MAX_MESSAGE],
}

/// A completion notification.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct exanet_notification_t {
    pub va: u64,
    pub len: u64,
    pub src_node: u32,
}

enum Fail {
    Lib(Error),
    Invalid(String),
}

impl From<Error> for Fail {
    fn from(e: Error) -> Fail {
        Fail::Lib(e)
    }
}

fn invalid(what: &str) -> Fail {
    Fail::Invalid(format!("invalid argument: {what}"))
}

struct Last {
    message: CString,
    nack: c_int,
}

thread_local! {
    static LAST: RefCell<Last> = RefCell::new(Last { message: CString::default(), nack: 0 });
}

fn set_last(message: &str, nack: c_int) {
    let message = CString::new(message.replace('\0', " ")).unwrap_or_default();
    LAST.with(|l| *l.borrow_mut() = Last { message, nack });
}

/// Runs `f`, mapping errors and panics to codes and recording the last error.
fn guard(f: impl FnOnce() -> Result<c_int, Fail>) -> c_int {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(v)) => v,
        Ok(Err(Fail::Lib(e))) => {
            let nack = match e.op_error() {
                Some(OpError::Nacked { code, .. }) => c_int::from(code),
                _ => 0,
            };
            set_last(&e.to_string(), nack);
            e.code()
        }
        Ok(Err(Fail::Invalid(m))) => {
            set_last(&m, 0);
            codes::INVALID_ARGUMENT
        }
        Err(_) => {
            set_last("internal error (a panic in the exanet library)", 0);
            codes::INTERNAL
        }
    }
}

fn timeout(us: i64) -> Option<Duration> {
    u64::try_from(us).ok().map(Duration::from_micros)
}

/// `&T` from a handle pointer, or an EINVAL naming it.
///
/// # Safety
/// `p` is NULL or points to a live `T` that outlives `'a`.
unsafe fn obj<'a, T>(p: *const T, what: &str) -> Result<&'a T, Fail> {
    // SAFETY: the caller guarantees `p` is NULL (refused by as_ref) or valid for 'a.
    unsafe { p.as_ref() }.ok_or_else(|| invalid(&format!("{what} is NULL")))
}

/// An optional C string: NULL or empty is `None`.
///
/// # Safety
/// `p` is NULL or a NUL-terminated string.
unsafe fn opt_str(p: *const c_char, what: &str) -> Result<Option<String>, Fail> {
    if p.is_null() {
        return Ok(None);
    }
    // SAFETY: non-NULL, and the caller guarantees NUL termination.
    let s = unsafe { CStr::from_ptr(p) }
        .to_str()
        .map_err(|_| invalid(&format!("{what} is not UTF-8")))?;
    Ok((!s.is_empty()).then(|| s.to_string()))
}

/// Stores `v` at `out`.
///
/// # Safety
/// `out` is NULL (refused) or valid for a write of `T`.
unsafe fn put<T>(out: *mut T, v: T, what: &str) -> Result<(), Fail> {
    if out.is_null() {
        return Err(invalid(&format!("{what} is NULL")));
    }
    // SAFETY: non-NULL and, as the caller guarantees, valid for writes.
    unsafe { out.write(v) };
    Ok(())
}

/// Makes a handle from the endpoint and hands it to C in `*out` (every `*_open`).
///
/// # Safety
/// `ep` is NULL or a live endpoint, `out` NULL or valid for a write.
unsafe fn open_handle<T>(
    ep: *const exanet_endpoint,
    out: *mut *mut T,
    make: impl FnOnce(&Endpoint) -> Result<T, Fail>,
) -> c_int {
    guard(|| {
        // SAFETY: the caller guarantees a live endpoint or NULL.
        let e = &unsafe { obj(ep, "ep") }?.ep;
        if out.is_null() {
            return Err(invalid("out is NULL"));
        }
        let h = Box::into_raw(Box::new(make(e)?));
        // SAFETY: checked non-NULL; writable as the caller guarantees.
        unsafe { put(out, h, "out") }?;
        Ok(0)
    })
}

/// Takes back and drops a handle C got from [`open_handle`] (NULL: nothing happens).
///
/// # Safety
/// `h` is NULL or came from `Box::into_raw` and was not freed yet.
unsafe fn free_handle<T>(h: *mut T) {
    if h.is_null() {
        return;
    }
    let _ = catch_unwind(AssertUnwindSafe(|| {
        // SAFETY: the caller hands back ownership of a pointer made by Box::into_raw.
        drop(unsafe { Box::from_raw(h) });
    }));
}

fn gvas_of(shared: &crate::engine::Shared, a: &exanet_addr_t) -> Result<Gvas, Fail> {
    Ok(shared.gvas(NodeId(a.node), a.rank, a.va)?)
}

/// Attaches to `node` of the rack in `rack` with `job_key`; any of the three may be NULL:
/// `EXANET_RACK` (else `./exanet-rack`), `EXANET_NODE`, `EXANET_JOB_KEY` (else the default
/// job). Stores the endpoint at `*out`.
///
/// # Safety
/// The strings are NULL or NUL-terminated; `out` is valid for a write.
#[no_mangle]
pub unsafe extern "C" fn exanet_attach(
    rack: *const c_char,
    node: *const c_char,
    job_key: *const c_char,
    out: *mut *mut exanet_endpoint,
) -> c_int {
    guard(|| {
        if out.is_null() {
            return Err(invalid("out is NULL"));
        }
        // SAFETY: out checked non-NULL; the caller guarantees it is writable.
        unsafe { out.write(std::ptr::null_mut()) };
        let config = Config {
            // SAFETY (three calls): the caller guarantees NULL or NUL-terminated strings.
            rack_dir: unsafe { opt_str(rack, "rack") }?.map(Into::into),
            node: unsafe { opt_str(node, "node") }?,
            job_key: unsafe { opt_str(job_key, "job_key") }?,
            ..Config::default()
        };
        let ep = Endpoint::attach_with(&config)?;
        let h = Box::into_raw(Box::new(exanet_endpoint { ep }));
        // SAFETY: checked above.
        unsafe { put(out, h, "out") }?;
        Ok(0)
    })
}

/// Detaches and frees the endpoint (NULL: nothing happens).
///
/// # Safety
/// `ep` is NULL or was returned by `exanet_attach` and not detached yet.
#[no_mangle]
pub unsafe extern "C" fn exanet_detach(ep: *mut exanet_endpoint) {
    // SAFETY: forwarded from this function's own contract.
    unsafe { free_handle(ep) }
}

/// Fills `*info` with this attachment's node, rank and PDID.
///
/// # Safety
/// `ep` is a live endpoint, `info` is valid for a write.
#[no_mangle]
pub unsafe extern "C" fn exanet_info(
    ep: *const exanet_endpoint,
    info: *mut exanet_info_t,
) -> c_int {
    guard(|| {
        // SAFETY: the caller guarantees a live endpoint or NULL.
        let e = &unsafe { obj(ep, "ep") }?.ep;
        let mut name = [0 as c_char; 16];
        for (d, s) in name.iter_mut().zip(e.node().bytes().take(15)) {
            *d = s as c_char;
        }
        let v = exanet_info_t {
            node_id: e.node_id().0,
            nodes: e.nodes(),
            pdid: e.pdid().0,
            rank: e.rank(),
            node_name: name,
        };
        // SAFETY: the caller guarantees `info` is writable.
        unsafe { put(info, v, "info") }?;
        Ok(0)
    })
}

/// Resolves a node name (`M1QBF3`) to its id.
///
/// # Safety
/// `ep` is a live endpoint, `name` NUL-terminated, `id` valid for a write.
#[no_mangle]
pub unsafe extern "C" fn exanet_node_by_name(
    ep: *const exanet_endpoint,
    name: *const c_char,
    id: *mut u32,
) -> c_int {
    guard(|| {
        // SAFETY: the caller guarantees a live endpoint or NULL.
        let e = &unsafe { obj(ep, "ep") }?.ep;
        // SAFETY: NULL or NUL-terminated.
        let name = unsafe { opt_str(name, "name") }?.ok_or_else(|| invalid("name is empty"))?;
        let n = e.node_by_name(&name)?;
        // SAFETY: the caller guarantees `id` is writable.
        unsafe { put(id, n.0, "id") }?;
        Ok(0)
    })
}

/// Sets the spin budget of waits, in microseconds (0: sleep right away).
///
/// # Safety
/// `ep` is a live endpoint.
#[no_mangle]
pub unsafe extern "C" fn exanet_set_spin(ep: *const exanet_endpoint, spin_us: u64) -> c_int {
    guard(|| {
        // SAFETY: the caller guarantees a live endpoint or NULL.
        let e = &unsafe { obj(ep, "ep") }?.ep;
        e.set_spin(Duration::from_micros(spin_us));
        Ok(0)
    })
}

/// The address of mailbox `vi` of `rank` on `node` (checked when used).
#[no_mangle]
pub extern "C" fn exanet_mailbox_addr(node: u32, rank: u8, vi: u8) -> exanet_addr_t {
    exanet_addr_t {
        node,
        rank,
        va: crate::MAILBOX_WINDOW | u64::from(vi),
    }
}

/// Registers `len` bytes of new shared memory as this rank's memory.
///
/// # Safety
/// `ep` is a live endpoint, `out` valid for a write.
#[no_mangle]
pub unsafe extern "C" fn exanet_register(
    ep: *const exanet_endpoint,
    len: u64,
    out: *mut *mut exanet_region,
) -> c_int {
    // SAFETY: forwarded from this function's own contract.
    unsafe {
        open_handle(ep, out, |e| {
            Ok(exanet_region {
                region: e.register(len)?,
            })
        })
    }
}

/// Unregisters and frees a region (NULL: nothing happens).
///
/// # Safety
/// `r` is NULL or a region from `exanet_register`, not freed yet.
#[no_mangle]
pub unsafe extern "C" fn exanet_region_free(r: *mut exanet_region) {
    // SAFETY: forwarded from this function's own contract.
    unsafe { free_handle(r) }
}

/// The VA of the region's first byte (0 for NULL).
///
/// # Safety
/// `r` is NULL or a live region.
#[no_mangle]
pub unsafe extern "C" fn exanet_region_va(r: *const exanet_region) -> u64 {
    // SAFETY: NULL or live, as the caller guarantees.
    unsafe { r.as_ref() }.map_or(0, |r| r.region.va())
}

/// The region's length in bytes (0 for NULL).
///
/// # Safety
/// `r` is NULL or a live region.
#[no_mangle]
pub unsafe extern "C" fn exanet_region_len(r: *const exanet_region) -> u64 {
    // SAFETY: NULL or live, as the caller guarantees.
    unsafe { r.as_ref() }.map_or(0, |r| r.region.len())
}

/// Copies `len` bytes from `src` into the region at `offset`.
///
/// # Safety
/// `r` is a live region; `src` is valid for `len` bytes of reads (may be NULL if `len` is 0).
#[no_mangle]
pub unsafe extern "C" fn exanet_region_write(
    r: *const exanet_region,
    offset: u64,
    src: *const c_void,
    len: usize,
) -> c_int {
    guard(|| {
        // SAFETY: the caller guarantees a live region or NULL.
        let r = &unsafe { obj(r, "region") }?.region;
        if len == 0 {
            return Ok(0);
        }
        if src.is_null() {
            return Err(invalid("src is NULL"));
        }
        // SAFETY: non-NULL and valid for `len` bytes, as the caller guarantees; private
        // memory of the caller, not the shared region.
        let data = unsafe { std::slice::from_raw_parts(src.cast::<u8>(), len) };
        r.write(offset, data)?;
        Ok(0)
    })
}

/// Copies `len` bytes at `offset` of the region into `dst`.
///
/// # Safety
/// `r` is a live region; `dst` is valid for `len` bytes of writes (may be NULL if `len` is 0).
#[no_mangle]
pub unsafe extern "C" fn exanet_region_read(
    r: *const exanet_region,
    offset: u64,
    dst: *mut c_void,
    len: usize,
) -> c_int {
    guard(|| {
        // SAFETY: the caller guarantees a live region or NULL.
        let r = &unsafe { obj(r, "region") }?.region;
        if len == 0 {
            return Ok(0);
        }
        if dst.is_null() {
            return Err(invalid("dst is NULL"));
        }
        // SAFETY: non-NULL and valid for `len` bytes of writes, as the caller guarantees.
        let buf = unsafe { std::slice::from_raw_parts_mut(dst.cast::<u8>(), len) };
        r.read(offset, buf)?;
        Ok(0)
    })
}

/// Allocates a packetizer interface.
///
/// # Safety
/// `ep` is a live endpoint, `out` valid for a write.
#[no_mangle]
pub unsafe extern "C" fn exanet_packetizer_open(
    ep: *const exanet_endpoint,
    out: *mut *mut exanet_packetizer,
) -> c_int {
    // SAFETY: forwarded from this function's own contract.
    unsafe { open_handle(ep, out, |e| Ok(exanet_packetizer { p: e.packetizer()? })) }
}

/// Frees a packetizer interface (NULL: nothing happens).
///
/// # Safety
/// `p` is NULL or from `exanet_packetizer_open`, not closed yet.
#[no_mangle]
pub unsafe extern "C" fn exanet_packetizer_close(p: *mut exanet_packetizer) {
    // SAFETY: forwarded from this function's own contract.
    unsafe { free_handle(p) }
}

/// Allocates a mailbox holding up to `capacity` messages.
///
/// # Safety
/// `ep` is a live endpoint, `out` valid for a write.
#[no_mangle]
pub unsafe extern "C" fn exanet_mailbox_open(
    ep: *const exanet_endpoint,
    capacity: u32,
    out: *mut *mut exanet_mailbox,
) -> c_int {
    // SAFETY: forwarded from this function's own contract.
    unsafe {
        open_handle(ep, out, |e| {
            Ok(exanet_mailbox {
                m: e.mailbox(capacity)?,
            })
        })
    }
}

/// Frees a mailbox (NULL: nothing happens).
///
/// # Safety
/// `m` is NULL or from `exanet_mailbox_open`, not closed yet.
#[no_mangle]
pub unsafe extern "C" fn exanet_mailbox_close(m: *mut exanet_mailbox) {
    // SAFETY: forwarded from this function's own contract.
    unsafe { free_handle(m) }
}

/// The mailbox's index (0..63), or a negative error code.
///
/// # Safety
/// `m` is NULL or a live mailbox.
#[no_mangle]
pub unsafe extern "C" fn exanet_mailbox_vi(m: *const exanet_mailbox) -> c_int {
    guard(|| {
        // SAFETY: the caller guarantees a live mailbox or NULL.
        Ok(c_int::from(unsafe { obj(m, "mailbox") }?.m.vi()))
    })
}

/// Allocates an RDMA page.
///
/// # Safety
/// `ep` is a live endpoint, `out` valid for a write.
#[no_mangle]
pub unsafe extern "C" fn exanet_rdma_page_open(
    ep: *const exanet_endpoint,
    out: *mut *mut exanet_rdma_page,
) -> c_int {
    // SAFETY: forwarded from this function's own contract.
    unsafe { open_handle(ep, out, |e| Ok(exanet_rdma_page { p: e.rdma_page()? })) }
}

/// Frees an RDMA page (NULL: nothing happens).
///
/// # Safety
/// `p` is NULL or from `exanet_rdma_page_open`, not closed yet.
#[no_mangle]
pub unsafe extern "C" fn exanet_rdma_page_close(p: *mut exanet_rdma_page) {
    // SAFETY: forwarded from this function's own contract.
    unsafe { free_handle(p) }
}

/// Sends `len` (<= 64) bytes at `buf` to `*dst` on channel `ch` (0..3; negative: the first
/// free channel, waiting for one). Stores the operation's tag at `*tag` (may be NULL: the
/// result is then discarded, as with `exanet_forget`).
///
/// # Safety
/// `p` is a live packetizer, `dst` valid for a read, `buf` valid for `len` bytes (NULL if
/// `len` is 0 is fine), `tag` NULL or valid for a write.
#[no_mangle]
pub unsafe extern "C" fn exanet_send(
    p: *const exanet_packetizer,
    ch: c_int,
    dst: *const exanet_addr_t,
    buf: *const c_void,
    len: usize,
    tag: *mut u32,
) -> c_int {
    guard(|| {
        // SAFETY: the caller guarantees a live packetizer or NULL.
        let p = &unsafe { obj(p, "packetizer") }?.p;
        // SAFETY: the caller guarantees `dst` is NULL or readable.
        let dst = unsafe { obj(dst, "dst") }?;
        if len > MAX_MESSAGE {
            return Err(Error::PayloadTooLong {
                len,
                max: MAX_MESSAGE,
            }
            .into());
        }
        let data: &[u8] = if len == 0 {
            &[]
        } else if buf.is_null() {
            return Err(invalid("buf is NULL"));
        } else {
            // SAFETY: non-NULL, valid for `len` (<= 64) bytes as the caller guarantees.
            unsafe { std::slice::from_raw_parts(buf.cast::<u8>(), len) }
        };
        let g = gvas_of(p.shared(), dst)?;
        let t = if ch < 0 {
            p.send_any(g, data)?
        } else {
            let ch = u8::try_from(ch).map_err(|_| invalid("ch out of range"))?;
            p.send(ch, g, data)?
        };
        if tag.is_null() {
            let _ = p.shared().forget(t.raw());
        } else {
            // SAFETY: non-NULL, writable as the caller guarantees.
            unsafe { tag.write(t.raw()) };
        }
        Ok(0)
    })
}

/// Receives the next message of mailbox `m` into `*msg`, waiting up to `timeout_us`
/// microseconds (negative: forever; 0: just check). `EXANET_ETIMEDOUT` if none came.
///
/// # Safety
/// `m` is a live mailbox, `msg` valid for a write.
#[no_mangle]
pub unsafe extern "C" fn exanet_recv(
    m: *const exanet_mailbox,
    timeout_us: i64,
    msg: *mut exanet_message_t,
) -> c_int {
    guard(|| {
        // SAFETY: the caller guarantees a live mailbox or NULL.
        let m = &unsafe { obj(m, "mailbox") }?.m;
        if msg.is_null() {
            return Err(invalid("msg is NULL"));
        }
        let got = m.recv(timeout(timeout_us))?;
        let mut out = exanet_message_t {
            src_node: got.src_node.0,
            src_rank: got.src_rank,
            vi: got.vi,
            len: got.payload.len().min(MAX_MESSAGE) as u8,
            payload: [0; MAX_MESSAGE],
        };
        let n = usize::from(out.len);
        out.payload[..n].copy_from_slice(&got.payload[..n]);
        // SAFETY: non-NULL, writable as the caller guarantees.
        unsafe { msg.write(out) };
        Ok(0)
    })
}

/// RDMA-writes `len` bytes at `offset` of `src` to `*dst` on write channel `ch` (0..31).
/// `notify_va`: NULL, or the VA at the destination rank where a completion notification is
/// written. Stores the tag at `*tag`.
///
/// # Safety
/// `p`, `src` live handles of the same endpoint; `dst` readable; `notify_va` NULL or
/// readable; `tag` valid for a write.
#[no_mangle]
pub unsafe extern "C" fn exanet_rdma_write(
    p: *const exanet_rdma_page,
    ch: u8,
    src: *const exanet_region,
    offset: u64,
    dst: *const exanet_addr_t,
    len: u64,
    notify_va: *const u64,
    tag: *mut u32,
) -> c_int {
    guard(|| {
        // SAFETY (four derefs): the caller guarantees live handles / readable pointers or NULL.
        let p = &unsafe { obj(p, "page") }?.p;
        let src = &unsafe { obj(src, "src") }?.region;
        let dst = unsafe { obj(dst, "dst") }?;
        let notify = unsafe { notify_va.as_ref() }.copied();
        if tag.is_null() {
            return Err(invalid("tag is NULL"));
        }
        let g = gvas_of(p.shared(), dst)?;
        let t = p.write(ch, src, offset, g, len, notify)?;
        // SAFETY: non-NULL, writable as the caller guarantees.
        unsafe { tag.write(t.raw()) };
        Ok(0)
    })
}

/// RDMA-reads `len` bytes at `*src` into `dst` at `offset`, on read channel `ch` (0..31).
/// Stores the tag at `*tag`.
///
/// # Safety
/// `p`, `dst` live handles of the same endpoint; `src` readable; `tag` valid for a write.
#[no_mangle]
pub unsafe extern "C" fn exanet_rdma_read(
    p: *const exanet_rdma_page,
    ch: u8,
    src: *const exanet_addr_t,
    dst: *const exanet_region,
    offset: u64,
    len: u64,
    tag: *mut u32,
) -> c_int {
    guard(|| {
        // SAFETY (three derefs): the caller guarantees live handles / readable pointers or NULL.
        let p = &unsafe { obj(p, "page") }?.p;
        let src = unsafe { obj(src, "src") }?;
        let dst = &unsafe { obj(dst, "dst") }?.region;
        if tag.is_null() {
            return Err(invalid("tag is NULL"));
        }
        let g = gvas_of(p.shared(), src)?;
        let t = p.read(ch, g, dst, offset, len)?;
        // SAFETY: non-NULL, writable as the caller guarantees.
        unsafe { tag.write(t.raw()) };
        Ok(0)
    })
}

/// Waits up to `timeout_us` (negative: forever; 0: just check) for operation `tag`:
/// 0 if it succeeded, its failure code (`EXANET_ENACKED`, `EXANET_ENETTIMEDOUT`, ...), or
/// `EXANET_ETIMEDOUT` if it is still going (wait again later). After a NACK,
/// `exanet_last_nack_reason()` says why.
///
/// # Safety
/// `ep` is a live endpoint.
#[no_mangle]
pub unsafe extern "C" fn exanet_wait(
    ep: *const exanet_endpoint,
    tag: u32,
    timeout_us: i64,
) -> c_int {
    guard(|| {
        // SAFETY: the caller guarantees a live endpoint or NULL.
        let e = &unsafe { obj(ep, "ep") }?.ep;
        e.wait(Tag::from_raw(tag), timeout(timeout_us))?;
        Ok(0)
    })
}

/// Discards the result of operation `tag` (now, or when it completes).
///
/// # Safety
/// `ep` is a live endpoint.
#[no_mangle]
pub unsafe extern "C" fn exanet_forget(ep: *const exanet_endpoint, tag: u32) -> c_int {
    guard(|| {
        // SAFETY: the caller guarantees a live endpoint or NULL.
        let e = &unsafe { obj(ep, "ep") }?.ep;
        e.forget(Tag::from_raw(tag))?;
        Ok(0)
    })
}

/// Processes pending completions without waiting; returns how many (>= 0) or an error.
///
/// # Safety
/// `ep` is a live endpoint.
#[no_mangle]
pub unsafe extern "C" fn exanet_poll(ep: *const exanet_endpoint) -> c_int {
    guard(|| {
        // SAFETY: the caller guarantees a live endpoint or NULL.
        let e = &unsafe { obj(ep, "ep") }?.ep;
        Ok(c_int::try_from(e.poll()?).unwrap_or(c_int::MAX))
    })
}

/// Waits up to `timeout_us` for a completion notification and stores it at `*out`.
///
/// # Safety
/// `ep` is a live endpoint, `out` valid for a write.
#[no_mangle]
pub unsafe extern "C" fn exanet_wait_notification(
    ep: *const exanet_endpoint,
    timeout_us: i64,
    out: *mut exanet_notification_t,
) -> c_int {
    guard(|| {
        // SAFETY: the caller guarantees a live endpoint or NULL.
        let e = &unsafe { obj(ep, "ep") }?.ep;
        if out.is_null() {
            return Err(invalid("out is NULL"));
        }
        let n = e.wait_notification(timeout(timeout_us))?;
        let v = exanet_notification_t {
            va: n.va,
            len: n.len,
            src_node: n.src_node.0,
        };
        // SAFETY: non-NULL, writable as the caller guarantees.
        unsafe { put(out, v, "out") }?;
        Ok(0)
    })
}

fn descriptions() -> &'static HashMap<i32, CString> {
    static TABLE: OnceLock<HashMap<i32, CString>> = OnceLock::new();
    TABLE.get_or_init(|| {
        codes::ALL
            .iter()
            .map(|&c| (c, CString::new(codes::describe(c)).unwrap_or_default()))
            .collect()
    })
}

/// A static description of an error code (never NULL).
#[no_mangle]
pub extern "C" fn exanet_strerror(code: c_int) -> *const c_char {
    descriptions()
        .get(&code)
        .map_or(c"unknown error code".as_ptr(), |s| s.as_ptr())
}

/// The message of the last error on this thread (never NULL; valid until the next exanet
/// call on this thread).
#[no_mangle]
pub extern "C" fn exanet_last_error() -> *const c_char {
    LAST.with(|l| l.borrow().message.as_ptr())
}

/// The NACK reason (1..6, see `exanet.h`) of the last `EXANET_ENACKED` on this thread, 0
/// otherwise.
#[no_mangle]
pub extern "C" fn exanet_last_nack_reason() -> c_int {
    LAST.with(|l| l.borrow().nack)
}
