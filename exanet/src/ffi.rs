//! The C ABI (`include/exanet.h` documents it for C programmers).
//!
//! Conventions:
//! - every function that can fail returns an `int`: 0 (or a non-negative count) on success,
//!   a negative `EXANET_E*` code ([`crate::error::codes`]) on failure; `exanet_last_error()`
//!   then describes the failure in words (per thread);
//! - handles are created by `*_open` / `exanet_attach` / `exanet_register` and released by
//!   the matching `*_close` / `exanet_detach` / `exanet_region_free`; passing NULL is always
//!   an `EXANET_EINVAL` error (or a no-op for the release functions);
//! - nothing hands out pointers into shared memory: region contents are copied in and out;
//! - no Rust panic crosses the boundary (each entry point runs under `catch_unwind`, a
//!   panic becomes `EXANET_EINTERNAL`).
//!
//! # Handles
//! A handle is not an address: it is a process-wide id (never 0, never reused) cast to the
//! opaque pointer type, and the library never dereferences it. A registry per handle kind
//! maps live ids to `Arc`s of the objects. Every entry point looks its handle up under a
//! read lock, clones the `Arc`, drops the lock and works on the clone; a release removes the
//! id (so later calls with it are `EXANET_EINVAL` naming the stale kind, and a second release
//! is a no-op) and drops the registry's `Arc`: the object is freed when the last call that
//! still uses it returns. So a release may race with calls on the same handle in other
//! threads without undefined behaviour.
//!
//! A release must not leave those calls blocked: `exanet_detach` ends the attachment at once
//! (`Endpoint::close`), which wakes the threads waiting on the endpoint, and marks the
//! `Attachment` that the endpoint's other handles share as detached: calls in progress or
//! made later on any handle of that attachment fail with `EXANET_EDISCONNECTED`. A closed
//! mailbox wakes a thread in `exanet_recv` on it within `RELEASE_CHECK`.
//!
//! The handle types are lower-case like their C names.
#![allow(non_camel_case_types)]

use std::cell::RefCell;
use std::collections::HashMap;
use std::ffi::{c_char, c_int, c_void, CStr, CString};
use std::hash::{BuildHasherDefault, Hasher};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock, PoisonError, RwLock};
use std::time::{Duration, Instant};

use exanet_proto::gvas::Gvas;
use exanet_proto::ni::MAX_MESSAGE;
use exanet_proto::ModelTime;
use exanet_proto::NodeId;

use crate::collective::{Collectives, DataType, Group, Path, ReduceOp};
use crate::error::{codes, Error, OpError};
use crate::{Config, Endpoint, Mailbox, MemoryRegion, Packetizer, RdmaPage, Tag};

/// How often a thread blocked in `exanet_recv` checks whether its mailbox was closed.
const RELEASE_CHECK: Duration = Duration::from_millis(100);

/// What the handles of one attachment share: whether `exanet_detach` ran on its endpoint.
#[derive(Debug, Default)]
struct Attachment {
    detached: AtomicBool,
}

impl Attachment {
    fn detached(&self) -> bool {
        self.detached.load(Ordering::Acquire)
    }
}

/// An attachment (`exanet_endpoint*` in C).
pub struct exanet_endpoint {
    ep: Endpoint,
    att: Arc<Attachment>,
}

/// A registered memory region.
pub struct exanet_region {
    region: MemoryRegion,
    att: Arc<Attachment>,
}

/// A packetizer interface.
pub struct exanet_packetizer {
    p: Packetizer,
    att: Arc<Attachment>,
}

/// A mailbox.
pub struct exanet_mailbox {
    m: Mailbox,
    att: Arc<Attachment>,
    /// `exanet_mailbox_close` ran: a thread waiting in `exanet_recv` gives up.
    closed: AtomicBool,
}

/// An RDMA page.
pub struct exanet_rdma_page {
    p: RdmaPage,
    att: Arc<Attachment>,
}

/// A rank's collectives (its collective mailbox, a packetizer, scratch memory).
pub struct exanet_collectives {
    c: Collectives,
    att: Arc<Attachment>,
}

/// A group of ranks for collectives.
pub struct exanet_group {
    g: Group,
    att: Arc<Attachment>,
}

/// A member of a group: node id and rank.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct exanet_member_t {
    pub node: u32,
    pub rank: u8,
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
    /// When the reader could see it, in modeled picoseconds.
    pub at_ps: u64,
}

/// A completion notification.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct exanet_notification_t {
    pub va: u64,
    pub len: u64,
    pub src_node: u32,
    /// When it was written, in modeled picoseconds.
    pub at_ps: u64,
}

enum Fail {
    Lib(Error),
    Invalid(String),
    /// Another code, with its message.
    Code(c_int, String),
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
        Ok(Err(Fail::Code(code, m))) => {
            set_last(&m, 0);
            code
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

/// `&T` from a pointer to a value of the caller (not a handle), or an EINVAL naming it.
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

// ---- handles ----

/// Hashes handle ids (distinct integers from a counter) with one multiplication.
#[derive(Default)]
struct IdHasher(u64);

impl Hasher for IdHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0.rotate_left(8) ^ u64::from(b)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        }
    }

    fn write_usize(&mut self, n: usize) {
        self.0 = (n as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    }
}

/// The live handles of one kind: id -> object.
type Table<T> = RwLock<HashMap<usize, Arc<T>, BuildHasherDefault<IdHasher>>>;

const fn table<T>() -> Table<T> {
    RwLock::new(HashMap::with_hasher(BuildHasherDefault::new()))
}

static ENDPOINTS: Table<exanet_endpoint> = table();
static REGIONS: Table<exanet_region> = table();
static PACKETIZERS: Table<exanet_packetizer> = table();
static MAILBOXES: Table<exanet_mailbox> = table();
static RDMA_PAGES: Table<exanet_rdma_page> = table();
static COLLECTIVES: Table<exanet_collectives> = table();
static GROUPS: Table<exanet_group> = table();

/// The next handle id; ids are never reused, so a stale handle never names a new object.
static NEXT_ID: AtomicUsize = AtomicUsize::new(1);

/// An object C holds by handle.
trait Handle: Sized + 'static {
    /// What C calls it, for messages ("endpoint", "mailbox"...).
    const KIND: &'static str;
    fn table() -> &'static Table<Self>;
    /// The attachment it belongs to.
    fn attachment(&self) -> &Attachment;
    /// C released the handle; calls in progress may still use the object.
    fn released(&self) {}
}

impl Handle for exanet_endpoint {
    const KIND: &'static str = "endpoint";
    fn table() -> &'static Table<Self> {
        &ENDPOINTS
    }
    fn attachment(&self) -> &Attachment {
        &self.att
    }
    fn released(&self) {
        // First the flag, so that a call this wakes up reports the detach, then the
        // attachment itself: the daemon frees the rank, waiting threads return.
        self.att.detached.store(true, Ordering::Release);
        self.ep.close();
    }
}

impl Handle for exanet_region {
    const KIND: &'static str = "region";
    fn table() -> &'static Table<Self> {
        &REGIONS
    }
    fn attachment(&self) -> &Attachment {
        &self.att
    }
}

impl Handle for exanet_packetizer {
    const KIND: &'static str = "packetizer";
    fn table() -> &'static Table<Self> {
        &PACKETIZERS
    }
    fn attachment(&self) -> &Attachment {
        &self.att
    }
}

impl Handle for exanet_mailbox {
    const KIND: &'static str = "mailbox";
    fn table() -> &'static Table<Self> {
        &MAILBOXES
    }
    fn attachment(&self) -> &Attachment {
        &self.att
    }
    fn released(&self) {
        self.closed.store(true, Ordering::Release);
    }
}

impl Handle for exanet_rdma_page {
    const KIND: &'static str = "RDMA page";
    fn table() -> &'static Table<Self> {
        &RDMA_PAGES
    }
    fn attachment(&self) -> &Attachment {
        &self.att
    }
}

impl Handle for exanet_collectives {
    const KIND: &'static str = "collectives";
    fn table() -> &'static Table<Self> {
        &COLLECTIVES
    }
    fn attachment(&self) -> &Attachment {
        &self.att
    }
}

impl Handle for exanet_group {
    const KIND: &'static str = "group";
    fn table() -> &'static Table<Self> {
        &GROUPS
    }
    fn attachment(&self) -> &Attachment {
        &self.att
    }
}

/// Files `obj` under a new id and returns that id as C's handle.
fn insert<T: Handle>(obj: T) -> Result<*mut T, Fail> {
    let id = NEXT_ID
        .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_add(1))
        .map_err(|_| Fail::Code(codes::SYSTEM, "out of handle ids".into()))?;
    let obj = Arc::new(obj);
    T::table()
        .write()
        .unwrap_or_else(PoisonError::into_inner)
        .insert(id, obj);
    Ok(std::ptr::without_provenance_mut(id))
}

/// The object behind handle `h` (`what`: the parameter's name, for messages).
fn lookup<T: Handle>(h: *const T, what: &str) -> Result<Arc<T>, Fail> {
    if h.is_null() {
        return Err(invalid(&format!("{what} is NULL")));
    }
    let found = T::table()
        .read()
        .unwrap_or_else(PoisonError::into_inner)
        .get(&h.addr())
        .cloned();
    found.ok_or_else(|| stale::<T>(h.addr(), what))
}

fn stale<T: Handle>(id: usize, what: &str) -> Fail {
    invalid(&format!(
        "{what} is a stale {} handle ({id:#x}): already released, or not made by this library",
        T::KIND
    ))
}

/// The error of a call on a handle whose endpoint was detached.
fn detached<T: Handle>() -> Fail {
    Fail::Code(
        codes::DISCONNECTED,
        if T::KIND == "endpoint" {
            "the endpoint was detached (exanet_detach) during this call".into()
        } else {
            format!(
                "the endpoint of this {} was detached (exanet_detach)",
                T::KIND
            )
        },
    )
}

/// Refuses objects of a detached attachment.
fn live<T: Handle>(obj: &T) -> Result<(), Fail> {
    if obj.attachment().detached() {
        Err(detached::<T>())
    } else {
        Ok(())
    }
}

/// What a call on `obj` returns: a library error caused by a detach in the meantime is
/// reported as that.
fn settle<T: Handle, R>(obj: &T, r: Result<R, Fail>) -> Result<R, Fail> {
    match r {
        Err(Fail::Lib(_)) if obj.attachment().detached() => Err(detached::<T>()),
        r => r,
    }
}

/// Runs `f` on the live object behind handle `h`.
fn with<T: Handle, R>(
    h: *const T,
    what: &str,
    f: impl FnOnce(&T) -> Result<R, Fail>,
) -> Result<R, Fail> {
    let obj = lookup(h, what)?;
    live(&*obj)?;
    let r = f(&obj);
    settle(&*obj, r)
}

/// Takes handle `h` out of its registry (NULL: nothing happens; a stale handle: nothing
/// happens but the calling thread's last error says so). The object goes when the last call
/// using it returns.
fn release<T: Handle>(h: *mut T) {
    if h.is_null() {
        return;
    }
    let _ = catch_unwind(AssertUnwindSafe(|| {
        // The lock is not held while the object is released or dropped: that may talk to
        // the daemon.
        let removed = T::table()
            .write()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(&h.addr());
        match removed {
            Some(obj) => {
                obj.released();
                drop(obj);
            }
            None => {
                if let Fail::Invalid(m) = stale::<T>(h.addr(), "the released handle") {
                    set_last(&m, 0);
                }
            }
        }
    }));
}

/// Makes a handle of `ep`'s attachment and hands it to C in `*out` (every `*_open`).
///
/// # Safety
/// `out` is NULL or valid for a write.
unsafe fn open_handle<T: Handle>(
    ep: *const exanet_endpoint,
    out: *mut *mut T,
    make: impl FnOnce(&Endpoint, Arc<Attachment>) -> Result<T, Fail>,
) -> c_int {
    guard(|| {
        if out.is_null() {
            return Err(invalid("out is NULL"));
        }
        let obj = with(ep, "ep", |e| make(&e.ep, Arc::clone(&e.att)))?;
        let h = insert(obj)?;
        // SAFETY: checked non-NULL; writable as the caller guarantees.
        unsafe { put(out, h, "out") }?;
        Ok(0)
    })
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
        let h = insert(exanet_endpoint {
            ep,
            att: Arc::default(),
        })?;
        // SAFETY: checked above.
        unsafe { put(out, h, "out") }?;
        Ok(0)
    })
}

/// Detaches (NULL or a released handle: nothing happens). The daemon frees the rank at once;
/// calls on the endpoint in other threads return, the endpoint's other handles only fail
/// from now on (`EXANET_EDISCONNECTED`), and the handle is stale (`EXANET_EINVAL`).
#[no_mangle]
pub extern "C" fn exanet_detach(ep: *mut exanet_endpoint) {
    release(ep)
}

/// Fills `*info` with this attachment's node, rank and PDID.
///
/// # Safety
/// `info` is valid for a write.
#[no_mangle]
pub unsafe extern "C" fn exanet_info(
    ep: *const exanet_endpoint,
    info: *mut exanet_info_t,
) -> c_int {
    guard(|| {
        with(ep, "ep", |e| {
            let e = &e.ep;
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
            // SAFETY: the caller guarantees `info` is NULL (refused) or writable.
            unsafe { put(info, v, "info") }?;
            Ok(0)
        })
    })
}

/// Resolves a node name (`M1QBF3`) to its id.
///
/// # Safety
/// `name` is NULL or NUL-terminated, `id` valid for a write.
#[no_mangle]
pub unsafe extern "C" fn exanet_node_by_name(
    ep: *const exanet_endpoint,
    name: *const c_char,
    id: *mut u32,
) -> c_int {
    guard(|| {
        with(ep, "ep", |e| {
            // SAFETY: NULL or NUL-terminated, as the caller guarantees.
            let name = unsafe { opt_str(name, "name") }?.ok_or_else(|| invalid("name is empty"))?;
            let n = e.ep.node_by_name(&name)?;
            // SAFETY: the caller guarantees `id` is NULL (refused) or writable.
            unsafe { put(id, n.0, "id") }?;
            Ok(0)
        })
    })
}

/// Sets the spin budget of waits, in microseconds (0: sleep right away).
#[no_mangle]
pub extern "C" fn exanet_set_spin(ep: *const exanet_endpoint, spin_us: u64) -> c_int {
    guard(|| {
        with(ep, "ep", |e| {
            e.ep.set_spin(Duration::from_micros(spin_us));
            Ok(0)
        })
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
/// `out` is valid for a write.
#[no_mangle]
pub unsafe extern "C" fn exanet_register(
    ep: *const exanet_endpoint,
    len: u64,
    out: *mut *mut exanet_region,
) -> c_int {
    // SAFETY: forwarded from this function's own contract.
    unsafe {
        open_handle(ep, out, |e, att| {
            Ok(exanet_region {
                region: e.register(len)?,
                att,
            })
        })
    }
}

/// Unregisters a region (NULL or a released handle: nothing happens; copies in progress in
/// other threads end first).
#[no_mangle]
pub extern "C" fn exanet_region_free(r: *mut exanet_region) {
    release(r)
}

/// The VA of the region's first byte (0 for NULL or a released handle).
#[no_mangle]
pub extern "C" fn exanet_region_va(r: *const exanet_region) -> u64 {
    lookup(r, "region").map_or(0, |r| r.region.va())
}

/// The region's length in bytes (0 for NULL or a released handle).
#[no_mangle]
pub extern "C" fn exanet_region_len(r: *const exanet_region) -> u64 {
    lookup(r, "region").map_or(0, |r| r.region.len())
}

/// Copies `len` bytes from `src` into the region at `offset`.
///
/// # Safety
/// `src` is valid for `len` bytes of reads (may be NULL if `len` is 0).
#[no_mangle]
pub unsafe extern "C" fn exanet_region_write(
    r: *const exanet_region,
    offset: u64,
    src: *const c_void,
    len: usize,
) -> c_int {
    guard(|| {
        with(r, "region", |r| {
            // SAFETY: valid for `len` bytes, as the caller guarantees; private memory of
            // the caller, not the shared region.
            let data = unsafe { bytes_in(src, len, "src") }?;
            if len > 0 {
                r.region.write(offset, data)?;
            }
            Ok(0)
        })
    })
}

/// Copies `len` bytes at `offset` of the region into `dst`.
///
/// # Safety
/// `dst` is valid for `len` bytes of writes (may be NULL if `len` is 0).
#[no_mangle]
pub unsafe extern "C" fn exanet_region_read(
    r: *const exanet_region,
    offset: u64,
    dst: *mut c_void,
    len: usize,
) -> c_int {
    guard(|| {
        with(r, "region", |r| {
            // SAFETY: valid for `len` bytes of writes, as the caller guarantees.
            let buf = unsafe { bytes_mut(dst, len, "dst") }?;
            if len > 0 {
                r.region.read(offset, buf)?;
            }
            Ok(0)
        })
    })
}

/// Allocates a packetizer interface.
///
/// # Safety
/// `out` is valid for a write.
#[no_mangle]
pub unsafe extern "C" fn exanet_packetizer_open(
    ep: *const exanet_endpoint,
    out: *mut *mut exanet_packetizer,
) -> c_int {
    // SAFETY: forwarded from this function's own contract.
    unsafe {
        open_handle(ep, out, |e, att| {
            Ok(exanet_packetizer {
                p: e.packetizer()?,
                att,
            })
        })
    }
}

/// Frees a packetizer interface (NULL or a released handle: nothing happens).
#[no_mangle]
pub extern "C" fn exanet_packetizer_close(p: *mut exanet_packetizer) {
    release(p)
}

/// Allocates a mailbox holding up to `capacity` messages.
///
/// # Safety
/// `out` is valid for a write.
#[no_mangle]
pub unsafe extern "C" fn exanet_mailbox_open(
    ep: *const exanet_endpoint,
    capacity: u32,
    out: *mut *mut exanet_mailbox,
) -> c_int {
    // SAFETY: forwarded from this function's own contract.
    unsafe {
        open_handle(ep, out, |e, att| {
            Ok(exanet_mailbox {
                m: e.mailbox(capacity)?,
                att,
                closed: AtomicBool::new(false),
            })
        })
    }
}

/// Frees a mailbox (NULL or a released handle: nothing happens). A thread waiting in
/// `exanet_recv` on it returns `EXANET_EINVAL`.
#[no_mangle]
pub extern "C" fn exanet_mailbox_close(m: *mut exanet_mailbox) {
    release(m)
}

/// The mailbox's index (0..63), or a negative error code.
#[no_mangle]
pub extern "C" fn exanet_mailbox_vi(m: *const exanet_mailbox) -> c_int {
    guard(|| with(m, "mailbox", |m| Ok(c_int::from(m.m.vi()))))
}

/// Allocates an RDMA page.
///
/// # Safety
/// `out` is valid for a write.
#[no_mangle]
pub unsafe extern "C" fn exanet_rdma_page_open(
    ep: *const exanet_endpoint,
    out: *mut *mut exanet_rdma_page,
) -> c_int {
    // SAFETY: forwarded from this function's own contract.
    unsafe {
        open_handle(ep, out, |e, att| {
            Ok(exanet_rdma_page {
                p: e.rdma_page()?,
                att,
            })
        })
    }
}

/// Frees an RDMA page (NULL or a released handle: nothing happens).
#[no_mangle]
pub extern "C" fn exanet_rdma_page_close(p: *mut exanet_rdma_page) {
    release(p)
}

/// Sends `len` (<= 64) bytes at `buf` to `*dst` on channel `ch` (0..3; negative: the first
/// free channel, waiting for one). Stores the operation's tag at `*tag` (may be NULL: the
/// result is then discarded, as with `exanet_forget`).
///
/// # Safety
/// `dst` is valid for a read, `buf` valid for `len` bytes (NULL if `len` is 0 is fine),
/// `tag` NULL or valid for a write.
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
        with(p, "packetizer", |p| {
            let p = &p.p;
            // SAFETY: as this function's caller guarantees.
            let (g, data) = unsafe { message_args(p, dst, buf, len) }?;
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
    })
}

/// A message's destination and bytes from C arguments, checked.
///
/// # Safety
/// `dst` is NULL or valid for a read, `buf` valid for `len` bytes (NULL if `len` is 0).
unsafe fn message_args<'a>(
    p: &Packetizer,
    dst: *const exanet_addr_t,
    buf: *const c_void,
    len: usize,
) -> Result<(Gvas, &'a [u8]), Fail> {
    // SAFETY: the caller guarantees `dst` is NULL or readable.
    let dst = unsafe { obj(dst, "dst") }?;
    if len > MAX_MESSAGE {
        return Err(Error::PayloadTooLong {
            len,
            max: MAX_MESSAGE,
        }
        .into());
    }
    // SAFETY: valid for `len` (<= 64) bytes as the caller guarantees.
    let data = unsafe { bytes_in(buf, len, "buf") }?;
    Ok((gvas_of(p.shared(), dst)?, data))
}

/// Receives the next message of mailbox `m` into `*msg`, waiting up to `timeout_us`
/// microseconds (negative: forever; 0: just check). `EXANET_ETIMEDOUT` if none came.
///
/// # Safety
/// `msg` is valid for a write.
#[no_mangle]
pub unsafe extern "C" fn exanet_recv(
    m: *const exanet_mailbox,
    timeout_us: i64,
    msg: *mut exanet_message_t,
) -> c_int {
    guard(|| {
        with(m, "mailbox", |m| {
            if msg.is_null() {
                return Err(invalid("msg is NULL"));
            }
            let got = recv_until_closed(m, timeout(timeout_us))?;
            // SAFETY: non-NULL, writable as the caller guarantees.
            unsafe { msg.write(message_of(&got)) };
            Ok(0)
        })
    })
}

/// Sends like `exanet_send` on a free channel without waiting: `EXANET_EBUSY` while all
/// four are busy. Of the free channels, the one freed earliest in modeled time.
///
/// # Safety
/// As `exanet_send`.
#[no_mangle]
pub unsafe extern "C" fn exanet_try_send(
    p: *const exanet_packetizer,
    dst: *const exanet_addr_t,
    buf: *const c_void,
    len: usize,
    tag: *mut u32,
) -> c_int {
    guard(|| {
        with(p, "packetizer", |p| {
            let p = &p.p;
            // SAFETY: as this function's caller guarantees.
            let (g, data) = unsafe { message_args(p, dst, buf, len) }?;
            // SAFETY: the caller guarantees a writable pointer or NULL.
            let tag = unsafe { OutPtr::new(tag, "tag") }?;
            tag.put(p.try_send_any(g, data)?.raw());
            Ok(0)
        })
    })
}

/// Takes the next message of mailbox `m` if one is there, without moving the endpoint's
/// clock (`exanet_took_ps` says when the program takes it); `EXANET_ETIMEDOUT` if none.
///
/// # Safety
/// `msg` is valid for a write.
#[no_mangle]
pub unsafe extern "C" fn exanet_recv_unclocked(
    m: *const exanet_mailbox,
    msg: *mut exanet_message_t,
) -> c_int {
    guard(|| {
        with(m, "mailbox", |m| {
            // SAFETY: the caller guarantees a writable pointer or NULL.
            let out = unsafe { OutPtr::new(msg, "msg") }?;
            let got = m.m.try_recv_unclocked()?.ok_or(Error::Timeout)?;
            out.put(message_of(&got));
            Ok(0)
        })
    })
}

/// The C form of a received message (payloads are at most `MAX_MESSAGE` bytes).
fn message_of(got: &crate::Message) -> exanet_message_t {
    let mut out = exanet_message_t {
        src_node: got.src_node.0,
        src_rank: got.src_rank,
        vi: got.vi,
        len: got.payload.len().min(MAX_MESSAGE) as u8,
        payload: [0; MAX_MESSAGE],
        at_ps: got.at.ps(),
    };
    let n = usize::from(out.len);
    out.payload[..n].copy_from_slice(&got.payload[..n]);
    out
}

/// [`Mailbox::recv`] in slices of at most [`RELEASE_CHECK`], giving up when the mailbox is
/// closed meanwhile (a detach wakes the wait by itself).
fn recv_until_closed(
    m: &exanet_mailbox,
    timeout: Option<Duration>,
) -> Result<crate::Message, Fail> {
    let deadline = timeout.and_then(|t| Instant::now().checked_add(t));
    loop {
        let slice = match deadline {
            Some(d) => d
                .saturating_duration_since(Instant::now())
                .min(RELEASE_CHECK),
            None => RELEASE_CHECK,
        };
        match m.m.recv(Some(slice)) {
            Err(Error::Timeout) if deadline.is_none_or(|d| Instant::now() < d) => {
                if m.closed.load(Ordering::Acquire) {
                    return Err(invalid(
                        "the mailbox was closed (exanet_mailbox_close) during exanet_recv",
                    ));
                }
            }
            r => return Ok(r?),
        }
    }
}

/// RDMA-writes `len` bytes at `offset` of `src` to `*dst` on write channel `ch` (0..31).
/// `notify_va`: NULL, or the VA at the destination rank where a completion notification is
/// written. Stores the tag at `*tag`.
///
/// # Safety
/// `dst` readable; `notify_va` NULL or readable; `tag` valid for a write.
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
    // SAFETY: as this function's caller guarantees.
    unsafe {
        rdma_write_with(p, src, dst, notify_va, tag, |p, r, g, n| {
            p.write(ch, r, offset, g, len, n)
        })
    }
}

/// `exanet_rdma_write` and `exanet_rdma_try_write`, posting with `post(page, source
/// region, destination, notification VA)`.
///
/// # Safety
/// As `exanet_rdma_write`.
unsafe fn rdma_write_with(
    p: *const exanet_rdma_page,
    src: *const exanet_region,
    dst: *const exanet_addr_t,
    notify_va: *const u64,
    tag: *mut u32,
    post: impl FnOnce(&RdmaPage, &MemoryRegion, Gvas, Option<u64>) -> crate::Result<Tag>,
) -> c_int {
    guard(|| {
        let src = lookup(src, "src")?;
        live(&*src)?;
        let r = with(p, "page", |p| {
            let p = &p.p;
            // SAFETY (two derefs): the caller guarantees readable pointers or NULL.
            let dst = unsafe { obj(dst, "dst") }?;
            let notify = unsafe { notify_va.as_ref() }.copied();
            // SAFETY: the caller guarantees a writable pointer or NULL.
            let tag = unsafe { OutPtr::new(tag, "tag") }?;
            let g = gvas_of(p.shared(), dst)?;
            let t = post(p, &src.region, g, notify)?;
            tag.put(t.raw());
            Ok(0)
        });
        settle(&*src, r)
    })
}

/// RDMA-reads `len` bytes at `*src` into `dst` at `offset`, on read channel `ch` (0..31).
/// Stores the tag at `*tag`.
///
/// # Safety
/// `src` readable; `tag` valid for a write.
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
    // SAFETY: as this function's caller guarantees.
    unsafe { rdma_read_with(p, src, dst, tag, |p, g, r| p.read(ch, g, r, offset, len)) }
}

/// `exanet_rdma_read` and `exanet_rdma_try_read`, posting with `post(page, source,
/// destination region)`.
///
/// # Safety
/// As `exanet_rdma_read`.
unsafe fn rdma_read_with(
    p: *const exanet_rdma_page,
    src: *const exanet_addr_t,
    dst: *const exanet_region,
    tag: *mut u32,
    post: impl FnOnce(&RdmaPage, Gvas, &MemoryRegion) -> crate::Result<Tag>,
) -> c_int {
    guard(|| {
        let dst = lookup(dst, "dst")?;
        live(&*dst)?;
        let r = with(p, "page", |p| {
            let p = &p.p;
            // SAFETY: the caller guarantees a readable pointer or NULL.
            let src = unsafe { obj(src, "src") }?;
            // SAFETY: the caller guarantees a writable pointer or NULL.
            let tag = unsafe { OutPtr::new(tag, "tag") }?;
            let g = gvas_of(p.shared(), src)?;
            let t = post(p, g, &dst.region)?;
            tag.put(t.raw());
            Ok(0)
        });
        settle(&*dst, r)
    })
}

/// `exanet_rdma_write` on a free write channel without waiting: `EXANET_EBUSY` while all
/// are busy. Of the free channels, the one freed earliest in modeled time.
///
/// # Safety
/// As `exanet_rdma_write`.
#[no_mangle]
pub unsafe extern "C" fn exanet_rdma_try_write(
    p: *const exanet_rdma_page,
    src: *const exanet_region,
    offset: u64,
    dst: *const exanet_addr_t,
    len: u64,
    notify_va: *const u64,
    tag: *mut u32,
) -> c_int {
    // SAFETY: as this function's caller guarantees.
    unsafe {
        rdma_write_with(p, src, dst, notify_va, tag, |p, r, g, n| {
            p.try_write_any(r, offset, g, len, n)
        })
    }
}

/// `exanet_rdma_read` on a free read channel without waiting: `EXANET_EBUSY` while all are
/// busy. Of the free channels, the one freed earliest in modeled time.
///
/// # Safety
/// As `exanet_rdma_read`.
#[no_mangle]
pub unsafe extern "C" fn exanet_rdma_try_read(
    p: *const exanet_rdma_page,
    src: *const exanet_addr_t,
    dst: *const exanet_region,
    offset: u64,
    len: u64,
    tag: *mut u32,
) -> c_int {
    // SAFETY: as this function's caller guarantees.
    unsafe {
        rdma_read_with(p, src, dst, tag, |p, g, r| {
            p.try_read_any(g, r, offset, len)
        })
    }
}

/// Waits up to `timeout_us` (negative: forever; 0: just check) for operation `tag`:
/// 0 if it succeeded, its failure code (`EXANET_ENACKED`, `EXANET_ENETTIMEDOUT`, ...), or
/// `EXANET_ETIMEDOUT` if it is still going (wait again later). After a NACK,
/// `exanet_last_nack_reason()` says why. `EXANET_EDISCONNECTED` if the endpoint is detached
/// meanwhile.
#[no_mangle]
pub extern "C" fn exanet_wait(ep: *const exanet_endpoint, tag: u32, timeout_us: i64) -> c_int {
    guard(|| {
        with(ep, "ep", |e| {
            e.ep.wait(Tag::from_raw(tag), timeout(timeout_us))?;
            Ok(0)
        })
    })
}

/// [`exanet_wait`], also storing at `*at_ps` (when not NULL) the modeled time the
/// operation completed at, in picoseconds.
///
/// # Safety
/// `at_ps` is NULL or valid for a write.
#[no_mangle]
pub unsafe extern "C" fn exanet_wait_modeled(
    ep: *const exanet_endpoint,
    tag: u32,
    timeout_us: i64,
    at_ps: *mut u64,
) -> c_int {
    guard(|| {
        with(ep, "ep", |e| {
            let at = e.ep.wait_modeled(Tag::from_raw(tag), timeout(timeout_us))?;
            if !at_ps.is_null() {
                // SAFETY: non-NULL, writable as the caller guarantees.
                unsafe { at_ps.write(at.ps()) };
            }
            Ok(0)
        })
    })
}

/// The endpoint's modeled clock in picoseconds (0 for NULL or a released handle).
#[no_mangle]
pub extern "C" fn exanet_clock_ps(ep: *const exanet_endpoint) -> u64 {
    lookup(ep, "ep").map_or(0, |e| e.ep.clock().ps())
}

/// The program waits, in modeled time, until `ps`: the clock moves there if it is behind,
/// never back. Returns the clock (0 for NULL or a released handle).
#[no_mangle]
pub extern "C" fn exanet_advance_clock_ps(ep: *const exanet_endpoint, ps: u64) -> u64 {
    lookup(ep, "ep").map_or(0, |e| e.ep.advance_clock(ModelTime(ps)).ps())
}

/// Operation `tag`'s result if it ended, without waiting and without moving the clock:
/// 0 or its failure, with the modeled time it ended at stored at `*at_ps` (unless NULL);
/// `EXANET_ETIMEDOUT` while it is still going. The result is collected.
///
/// # Safety
/// `at_ps` is NULL or valid for a write.
#[no_mangle]
pub unsafe extern "C" fn exanet_result(
    ep: *const exanet_endpoint,
    tag: u32,
    at_ps: *mut u64,
) -> c_int {
    guard(|| {
        with(ep, "ep", |e| {
            let (r, at) = e.ep.try_result(Tag::from_raw(tag))?.ok_or(Error::Timeout)?;
            if !at_ps.is_null() {
                // SAFETY: non-NULL, writable as the caller guarantees.
                unsafe { at_ps.write(at.ps()) };
            }
            r.map_err(|error| Error::Op { tag, error })?;
            Ok(0)
        })
    })
}

/// The program took an event of modeled time `at_ps` that it kept (a message taken by
/// `exanet_recv_unclocked`, a result by `exanet_result`): the clock moves there if later,
/// plus the rack's software cost of taking a message. Returns the clock (0 for NULL or a
/// released handle).
#[no_mangle]
pub extern "C" fn exanet_took_ps(ep: *const exanet_endpoint, at_ps: u64) -> u64 {
    lookup(ep, "ep").map_or(0, |e| e.ep.took(ModelTime(at_ps)).ps())
}

/// Runs `f` on the endpoint `ep`: 0, or what was wrong with the handle.
fn on_endpoint(ep: *const exanet_endpoint, f: impl FnOnce(&Endpoint)) -> c_int {
    guard(|| {
        with(ep, "ep", |e| {
            f(&e.ep);
            Ok(0)
        })
    })
}

/// The program has nothing to do but wait for this endpoint until its next call (a
/// progress loop between polls that found nothing): that time is not compute.
#[no_mangle]
pub extern "C" fn exanet_idle(ep: *const exanet_endpoint) -> c_int {
    on_endpoint(ep, |e| e.idle())
}

/// Takes back an `exanet_idle` said inside the holds the thread is in.
#[no_mangle]
pub extern "C" fn exanet_busy(ep: *const exanet_endpoint) -> c_int {
    on_endpoint(ep, |e| e.busy())
}

/// The calling thread is inside a library built on this one (an MPI transport) until it
/// calls `exanet_unhold`: that time is the library's, not the program's compute. Holds
/// nest; each ends on the thread that began it.
#[no_mangle]
pub extern "C" fn exanet_hold(ep: *const exanet_endpoint) -> c_int {
    on_endpoint(ep, |e| e.shared().hold())
}

/// Ends this thread's innermost `exanet_hold` of `ep`; `EXANET_EINVAL` if it has none.
#[no_mangle]
pub extern "C" fn exanet_unhold(ep: *const exanet_endpoint) -> c_int {
    guard(|| {
        // A detached endpoint's hold still ends: it only keeps the thread's account.
        let e = lookup(ep, "ep")?;
        if e.ep.shared().unhold() {
            Ok(0)
        } else {
            Err(invalid(
                "exanet_unhold without an exanet_hold of this endpoint on this thread",
            ))
        }
    })
}

/// Opens the rank's collectives: its collective mailbox (interface 48 + rank), a
/// packetizer and scratch memory. Stores the handle at `*out`.
///
/// # Safety
/// `out` is valid for a write.
#[no_mangle]
pub unsafe extern "C" fn exanet_collectives_open(
    ep: *const exanet_endpoint,
    out: *mut *mut exanet_collectives,
) -> c_int {
    // SAFETY: forwarded from this function's own contract.
    unsafe {
        open_handle(ep, out, |e, att| {
            Ok(exanet_collectives {
                c: e.collectives()?,
                att,
            })
        })
    }
}

/// Closes the collectives (NULL or a released handle: nothing happens).
#[no_mangle]
pub extern "C" fn exanet_collectives_close(c: *mut exanet_collectives) {
    release(c)
}

/// Sends steps of software collectives of up to `bytes` (default 32, at most 65535) as
/// packetizer messages and longer ones by rendezvous over RDMA.
#[no_mangle]
pub extern "C" fn exanet_collectives_set_eager_limit(
    c: *const exanet_collectives,
    bytes: u32,
) -> c_int {
    guard(|| {
        with(c, "c", |c| {
            c.c.set_eager_limit(bytes as usize);
            Ok(0)
        })
    })
}

/// Makes group `id` of `count` members (in rank order, this rank among them); every
/// member must make it with the same id and members. Stores the handle at `*out`.
///
/// # Safety
/// `members` is readable for `count` entries; `out` is valid for a write.
#[no_mangle]
pub unsafe extern "C" fn exanet_group_create(
    c: *const exanet_collectives,
    id: u16,
    members: *const exanet_member_t,
    count: u32,
    out: *mut *mut exanet_group,
) -> c_int {
    guard(|| {
        if out.is_null() {
            return Err(invalid("out is NULL"));
        }
        // SAFETY: readable for `count` entries as the caller guarantees.
        let list: Vec<(NodeId, u8)> = unsafe { slice_in(members, count as usize, "members") }?
            .iter()
            .map(|m| (NodeId(m.node), m.rank))
            .collect();
        let obj = with(c, "c", |c| {
            Ok(exanet_group {
                g: c.c.group(id, &list)?,
                att: Arc::clone(&c.att),
            })
        })?;
        let h = insert(obj)?;
        // SAFETY: checked non-NULL; writable as the caller guarantees.
        unsafe { put(out, h, "out") }?;
        Ok(0)
    })
}

/// Frees a group (NULL or a released handle: nothing happens).
#[no_mangle]
pub extern "C" fn exanet_group_free(g: *mut exanet_group) {
    release(g)
}

fn reduce_args(op: c_int, ty: c_int) -> Result<(ReduceOp, DataType), Fail> {
    let op = u8::try_from(op)
        .ok()
        .and_then(ReduceOp::from_u8)
        .ok_or_else(|| invalid(&format!("op {op}: EXANET_OP_SUM, _MIN or _MAX")))?;
    let ty = u8::try_from(ty)
        .ok()
        .and_then(DataType::from_u8)
        .ok_or_else(|| invalid(&format!("type {ty}: EXANET_TYPE_I32, _I64, _F32 or _F64")))?;
    Ok((op, ty))
}

/// `len` bytes at `p`, or an empty slice for `len` 0.
///
/// # Safety
/// `p` is readable for `len` bytes when `len` > 0.
unsafe fn bytes_in<'a>(p: *const c_void, len: usize, what: &str) -> Result<&'a [u8], Fail> {
    // SAFETY: forwarded from this function's own contract.
    unsafe { slice_in(p.cast::<u8>(), len, what) }
}

/// `len` values at `p`, or an empty slice for `len` 0 (`p` may then be NULL).
///
/// # Safety
/// `p` is readable for `len` values of `T` when `len` > 0, for `'a`.
unsafe fn slice_in<'a, T>(p: *const T, len: usize, what: &str) -> Result<&'a [T], Fail> {
    if len == 0 {
        return Ok(&[]);
    }
    if p.is_null() {
        return Err(invalid(&format!("{what} is NULL")));
    }
    // SAFETY: non-NULL, readable for `len` values as the caller guarantees.
    Ok(unsafe { std::slice::from_raw_parts(p, len) })
}

/// `len` writable bytes at `p`, or an empty slice for `len` 0.
///
/// # Safety
/// `p` is writable for `len` bytes when `len` > 0, for `'a`, and nothing else uses them.
unsafe fn bytes_mut<'a>(p: *mut c_void, len: usize, what: &str) -> Result<&'a mut [u8], Fail> {
    if len == 0 {
        return Ok(&mut []);
    }
    if p.is_null() {
        return Err(invalid(&format!("{what} is NULL")));
    }
    // SAFETY: non-NULL, writable for `len` bytes and not aliased, as the caller guarantees.
    Ok(unsafe { std::slice::from_raw_parts_mut(p.cast::<u8>(), len) })
}

/// Where a call stores a result for C, checked non-NULL before the call does anything, so
/// that a bad pointer never leaves an operation started and its result lost.
struct OutPtr<T>(*mut T);

impl<T> OutPtr<T> {
    /// # Safety
    /// `p` is NULL (refused) or valid for a write of `T` until the result is put.
    unsafe fn new(p: *mut T, what: &str) -> Result<OutPtr<T>, Fail> {
        if p.is_null() {
            return Err(invalid(&format!("{what} is NULL")));
        }
        Ok(OutPtr(p))
    }

    fn put(self, v: T) {
        // SAFETY: non-NULL (checked in `new`) and writable, as `new`'s caller guaranteed.
        unsafe { self.0.write(v) }
    }
}

/// Copies `v` (exactly `len` bytes) to `p`.
///
/// # Safety
/// `p` is writable for `len` bytes when `len` > 0.
unsafe fn bytes_out(p: *mut c_void, len: u32, v: &[u8], what: &str) -> Result<(), Fail> {
    if v.len() != len as usize {
        return Err(Fail::Code(
            codes::INTERNAL,
            format!("{what}: {} B for a buffer of {len}", v.len()),
        ));
    }
    if len == 0 {
        return Ok(());
    }
    if p.is_null() {
        return Err(invalid(&format!("{what} is NULL")));
    }
    // SAFETY: non-NULL, writable for `len` bytes as the caller guarantees.
    unsafe { std::ptr::copy_nonoverlapping(v.as_ptr(), p.cast::<u8>(), v.len()) };
    Ok(())
}

/// Runs `f` with the live collectives `c` and group `g`.
fn with_group<R>(
    c: *const exanet_collectives,
    g: *const exanet_group,
    f: impl FnOnce(&Collectives, &Group) -> Result<R, Fail>,
) -> Result<R, Fail> {
    let group = lookup(g, "g")?;
    live(&*group)?;
    with(c, "c", |c| f(&c.c, &group.g))
}

/// Allreduce of `len` bytes of `type` elements at `in` over group `g`, the result at
/// `out` (which may be `in`). `path`: EXANET_PATH_AUTO (the NI's accelerator when the group
/// and vector allow it), EXANET_PATH_ACCELERATOR or EXANET_PATH_SOFTWARE.
///
/// # Safety
/// `in` readable and `out` writable for `len` bytes.
#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn exanet_allreduce(
    c: *const exanet_collectives,
    g: *const exanet_group,
    op: c_int,
    r#type: c_int,
    r#in: *const c_void,
    out: *mut c_void,
    len: u32,
    path: c_int,
) -> c_int {
    guard(|| {
        let (op, ty) = reduce_args(op, r#type)?;
        let path = match path {
            0 => Path::Auto,
            1 => Path::Accelerator,
            2 => Path::Software,
            p => {
                return Err(invalid(&format!(
                    "path {p}: EXANET_PATH_AUTO, _ACCELERATOR or _SOFTWARE"
                )))
            }
        };
        // SAFETY: forwarded from this function's own contract.
        let data = unsafe { bytes_in(r#in, len as usize, "in") }?.to_vec();
        let v = with_group(c, g, |c, g| Ok(c.allreduce(g, op, ty, &data, path)?))?;
        // SAFETY: forwarded from this function's own contract.
        unsafe { bytes_out(out, len, &v, "out") }?;
        Ok(0)
    })
}

/// Reduction of `len` bytes at `in` over group `g` to member `root`, whose `out` gets it
/// (the others' `out` is left alone).
///
/// # Safety
/// `in` readable for `len` bytes; `out` writable for `len` bytes at the root.
#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn exanet_reduce(
    c: *const exanet_collectives,
    g: *const exanet_group,
    root: u32,
    op: c_int,
    r#type: c_int,
    r#in: *const c_void,
    out: *mut c_void,
    len: u32,
) -> c_int {
    guard(|| {
        let (op, ty) = reduce_args(op, r#type)?;
        // SAFETY: forwarded from this function's own contract.
        let data = unsafe { bytes_in(r#in, len as usize, "in") }?.to_vec();
        let (v, at_root) = with_group(c, g, |c, g| {
            Ok((
                c.reduce(g, root as usize, op, ty, &data)?,
                g.me() == root as usize,
            ))
        })?;
        if at_root {
            // SAFETY: forwarded from this function's own contract.
            unsafe { bytes_out(out, len, &v, "out") }?;
        }
        Ok(0)
    })
}

/// Broadcast of `len` bytes at member `root`'s `buf` into every member's `buf`.
///
/// # Safety
/// `buf` readable and writable for `len` bytes.
#[no_mangle]
pub unsafe extern "C" fn exanet_bcast(
    c: *const exanet_collectives,
    g: *const exanet_group,
    root: u32,
    buf: *mut c_void,
    len: u32,
) -> c_int {
    guard(|| {
        // SAFETY: forwarded from this function's own contract.
        let data = unsafe { bytes_in(buf, len as usize, "buf") }?.to_vec();
        let v = with_group(c, g, |c, g| Ok(c.bcast(g, root as usize, &data)?))?;
        // SAFETY: forwarded from this function's own contract.
        unsafe { bytes_out(buf, len, &v, "buf") }?;
        Ok(0)
    })
}

/// Returns once every member of `g` has entered it.
#[no_mangle]
pub extern "C" fn exanet_barrier(c: *const exanet_collectives, g: *const exanet_group) -> c_int {
    guard(|| {
        with_group(c, g, |c, g| Ok(c.barrier(g)?))?;
        Ok(0)
    })
}

/// Discards the result of operation `tag` (now, or when it completes).
#[no_mangle]
pub extern "C" fn exanet_forget(ep: *const exanet_endpoint, tag: u32) -> c_int {
    guard(|| {
        with(ep, "ep", |e| {
            e.ep.forget(Tag::from_raw(tag))?;
            Ok(0)
        })
    })
}

/// Processes pending completions without waiting; returns how many (>= 0) or an error.
#[no_mangle]
pub extern "C" fn exanet_poll(ep: *const exanet_endpoint) -> c_int {
    guard(|| {
        with(ep, "ep", |e| {
            Ok(c_int::try_from(e.ep.poll()?).unwrap_or(c_int::MAX))
        })
    })
}

/// Waits up to `timeout_us` for a completion notification and stores it at `*out`.
///
/// # Safety
/// `out` is valid for a write.
#[no_mangle]
pub unsafe extern "C" fn exanet_wait_notification(
    ep: *const exanet_endpoint,
    timeout_us: i64,
    out: *mut exanet_notification_t,
) -> c_int {
    guard(|| {
        with(ep, "ep", |e| {
            // SAFETY: the caller guarantees a writable pointer or NULL.
            let out = unsafe { OutPtr::new(out, "out") }?;
            let n = e.ep.wait_notification(timeout(timeout_us))?;
            let v = exanet_notification_t {
                va: n.va,
                len: n.len,
                src_node: n.src_node.0,
                at_ps: n.at.ps(),
            };
            out.put(v);
            Ok(0)
        })
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
