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
use std::sync::{Arc, OnceLock};

use crate::abi::*;
use crate::av::{self, Addr, Addressing, Av};
use crate::cntr::{Cntr, WaitEnd};
use crate::cq::{Completion, Cq, Empty, Idle};
use crate::endpoint::{Completes, Endpoint, NoBuf, Probe, RecvBuf, Regions};
use crate::mr::{MrTable, Naming, RegError};
use crate::msg::{RmaRefusal, RmaTarget};
use crate::offer::{self, Addresses, Hints, Offer};

/// The provider's own version (`fi_info -p exanet -v` shows it).
const PROVIDER_VERSION: u32 = fi_version(0, 1);

/// The `fi_ops` of an object that offers nothing but its `close`.
const fn fid_ops(close: unsafe extern "C" fn(*mut fid) -> c_int) -> fi_ops {
    fi_ops {
        size: std::mem::size_of::<fi_ops>(),
        close: Some(close),
        bind: Some(no_bind),
        control: Some(no_control),
        ops_open: Some(no_ops_open),
        tostr: Some(no_tostr),
        ops_set: Some(no_ops_set),
    }
}

/// Closes the object `f` heads: a `T` boxed by its open, whose first field is the
/// libfabric object `f` points at.
///
/// # Safety
/// `f` is null or the head of a `T` boxed by this provider and not closed yet.
unsafe fn close_boxed<T>(f: *mut fid) -> c_int {
    guard(|| {
        if f.is_null() {
            return -FI_EINVAL;
        }
        // SAFETY: as the caller guarantees; closed once.
        drop(unsafe { Box::from_raw(f.cast::<T>()) });
        0
    })
}

/// Hands a new object to the application: boxed, and `*out` pointed at its head (its
/// first field, the libfabric object).
///
/// # Safety
/// `out` is non-null and writable; `T` is `#[repr(C)]` with the libfabric object first.
unsafe fn hand_out<T>(obj: T, out: *mut Opaque) -> c_int {
    // SAFETY: as the caller guarantees; the box's address is its first field's.
    unsafe { *out = Box::into_raw(Box::new(obj)).cast() };
    0
}

/// Runs `f`, turning a panic into `-FI_EIO` rather than unwinding into C.
fn guard(f: impl FnOnce() -> c_int) -> c_int {
    catch_unwind(AssertUnwindSafe(f)).unwrap_or(-FI_EIO)
}

/// What `exactl mpirun --modeled` answers the program's clocks from: the last domain
/// opened.
struct Modeled {
    attachment: std::sync::Weak<exanet::Endpoint>,
    /// The thread that opened it, the program's own: only its `gettimeofday` is modeled,
    /// so that the MPI runtime's helper threads keep their timeouts in host time.
    thread: libc::pthread_t,
    /// Host wall-clock time and the rank's modeled clock at the opening: `gettimeofday`
    /// goes on from the first by what the second has moved since.
    wall: std::time::Duration,
    model: exanet::ModelTime,
    /// [`host_seconds`] at the opening, from which `MPI_Wtime` goes on likewise.
    host: f64,
}

static MODELED: std::sync::Mutex<Option<Modeled>> = std::sync::Mutex::new(None);

fn modeled() -> std::sync::MutexGuard<'static, Option<Modeled>> {
    MODELED.lock().unwrap_or_else(|e| e.into_inner())
}

/// The attachment of the last domain opened, while it is open: what `--modeled`'s
/// interposed MPI calls hold.
pub(crate) fn modeled_attachment() -> Option<Arc<exanet::Endpoint>> {
    modeled().as_ref()?.attachment.upgrade()
}

/// How many ranks of the job run on this node, as the MPI launcher tells its ranks
/// (Open MPI's `OMPI_COMM_WORLD_LOCAL_SIZE`, Hydra's `MPI_LOCALNRANKS`); 1 otherwise.
fn ranks_on_this_node() -> u32 {
    ["OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS"]
        .iter()
        .find_map(|v| std::env::var(v).ok()?.trim().parse().ok())
        .unwrap_or(1)
}

/// The attachment's modeled clock, with the compute since the program's last call.
fn modeled_now(ep: &exanet::Endpoint) -> exanet::ModelTime {
    ep.advance_clock(exanet::ModelTime::ZERO)
}

fn remember_modeled(attachment: &Arc<exanet::Endpoint>) {
    *modeled() = Some(Modeled {
        attachment: Arc::downgrade(attachment),
        // SAFETY: pthread_self has no preconditions.
        thread: unsafe { libc::pthread_self() },
        wall: wall_clock(),
        model: modeled_now(attachment),
        host: host_seconds(),
    });
}

/// `MPI_Wtime` for `exactl mpirun --modeled`, which preloads this library ahead of the
/// MPI library: seconds that run at the rank's modeled clock (what the ExaNeSt hardware
/// would have taken, counting the compute since the program's last call as the client
/// library does) while a domain is open, so that a program's own timings are modeled;
/// before a domain is open, or after it closed, at the host's monotonic clock (counted
/// from the program's first question). They go on from that clock's reading at the
/// domain's opening rather than from the modeled clock itself: that starts at the wall clock (days of seconds), where a double
/// resolves 2 ns, and a 1 us one-way would print different last digits run after run.
/// Loaded by libfabric without the preload, these symbols interpose nothing.
#[no_mangle]
pub extern "C" fn MPI_Wtime() -> f64 {
    catch_unwind(|| {
        let m = modeled();
        let open = m
            .as_ref()
            .and_then(|m| Some((m.attachment.upgrade()?, m.model, m.host)));
        drop(m);
        match open {
            Some((ep, model, host)) => host + modeled_now(&ep).since(model) as f64 * 1e-12,
            None => host_seconds(),
        }
    })
    .unwrap_or_else(|_| host_seconds())
}

/// `MPI_Wtick` beside [`MPI_Wtime`]: modeled time counts picoseconds.
#[no_mangle]
pub extern "C" fn MPI_Wtick() -> f64 {
    1e-12
}

/// `gettimeofday` under `exactl mpirun --modeled`, for programs that time themselves with
/// it rather than `MPI_Wtime` (NetPIPE does): on the thread that opened the domain, the
/// host's time at the opening plus the modeled time since; anywhere else, or with no
/// domain open, the host's time. Interposes only when preloaded.
///
/// # Safety
/// As `gettimeofday(2)`: `tv`, if not null, points to a writable `struct timeval`; `tz`,
/// if not null, to a writable `struct timezone`.
#[no_mangle]
pub unsafe extern "C" fn gettimeofday(tv: *mut libc::timeval, tz: *mut c_void) -> c_int {
    let now = catch_unwind(|| {
        let m = modeled();
        let m = m.as_ref()?;
        // SAFETY: pthread_self has no preconditions; pthread_equal compares two ids.
        if unsafe { libc::pthread_equal(m.thread, libc::pthread_self()) } == 0 {
            return None;
        }
        let ep = m.attachment.upgrade()?;
        let since_ps = modeled_now(&ep).since(m.model);
        Some(m.wall + std::time::Duration::from_nanos(since_ps / 1000))
    })
    .ok()
    .flatten()
    .unwrap_or_else(wall_clock);
    if !tv.is_null() {
        // SAFETY: the caller's contract: `tv` points to a writable timeval.
        unsafe {
            *tv = libc::timeval {
                tv_sec: now.as_secs() as libc::time_t,
                tv_usec: now.subsec_micros() as libc::suseconds_t,
            }
        };
    }
    if !tz.is_null() {
        // SAFETY: the caller's contract: `tz` points to a writable struct timezone (two
        // ints), which Linux fills with zeros.
        unsafe { ptr::write_bytes(tz.cast::<u8>(), 0, 2 * std::mem::size_of::<c_int>()) };
    }
    0
}

/// The host's wall-clock time since the epoch.
fn wall_clock() -> std::time::Duration {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default()
}

fn host_seconds() -> f64 {
    static START: OnceLock<std::time::Instant> = OnceLock::new();
    START
        .get_or_init(std::time::Instant::now)
        .elapsed()
        .as_secs_f64()
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
            crate::log::init();
            // libfabric keeps its own state in `context`: the struct must be writable and
            // live as long as the library is loaded, hence leaked.
            Provider(Box::into_raw(Box::new(fi_provider {
                version: PROVIDER_VERSION,
                fi_version: FI_PROVIDER_API_VERSION,
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
        out.tx_op_flags = a.op_flags;
        out.inject_size = a.inject_size;
    }
    if let Some(a) = unsafe { h.rx_attr.as_ref() } {
        out.rx_caps = a.caps;
        out.rx_msg_order = a.msg_order;
        out.rx_op_flags = a.op_flags;
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
        out.cq_data_size = a.cq_data_size;
        out.domain_caps = a.caps;
    }
    out
}

/// The hints' source and destination addresses, when in the provider's format: `Err`
/// names the one that is not an exanet address.
///
/// # Safety
/// `h` is a valid `fi_info` whose address pointers are null or valid for their lengths.
unsafe fn hint_addrs(h: &fi_info) -> Result<(Option<Addr>, Option<Addr>), &'static str> {
    // SAFETY: as the caller guarantees.
    let one = |p: *mut c_void, len: usize, what| -> Result<Option<Addr>, &'static str> {
        if p.is_null() || len == 0 {
            return Ok(None);
        }
        if h.addr_format != FI_FORMAT_UNSPEC || len != av::ADDR_LEN {
            return Err(what);
        }
        // SAFETY: `len` bytes at `p`, as the caller guarantees.
        av::decode_addr(unsafe { bytes(p, len) })
            .map(Some)
            .ok_or(what)
    };
    Ok((
        one(h.src_addr, h.src_addrlen, "source")?,
        one(h.dest_addr, h.dest_addrlen, "destination")?,
    ))
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
        libc::free(i.src_addr);
        libc::free(i.dest_addr);
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

/// `a` in the provider's format, in memory libfabric frees (`malloc`), or null.
fn addr_copy(a: Addr) -> *mut c_void {
    let b = av::encode_addr(a);
    // SAFETY: a fresh allocation of b.len() bytes, checked, then filled.
    unsafe {
        let p = libc::malloc(b.len());
        if !p.is_null() {
            ptr::copy_nonoverlapping(b.as_ptr(), p.cast(), b.len());
        }
        p
    }
}

/// `o` as a `struct fi_info` libfabric can free, or null when memory ran out.
fn layout(o: &Offer, addrs: &Addresses, api_version: u32) -> *mut fi_info {
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
        // The provider's own format (libfabric's number for one is FI_FORMAT_UNSPEC).
        i.addr_format = FI_FORMAT_UNSPEC;
        i.src_addr = addr_copy(addrs.src);
        i.src_addrlen = av::ADDR_LEN;
        if let Some(d) = addrs.dest {
            i.dest_addr = addr_copy(d);
            i.dest_addrlen = av::ADDR_LEN;
        }
        if i.src_addr.is_null() || (addrs.dest.is_some() && i.dest_addr.is_null()) {
            free_info(info);
            return ptr::null_mut();
        }
        i.tx_attr = zeroed();
        i.rx_attr = zeroed();
        i.ep_attr = zeroed();
        // The 2.x size whatever the application asked: a 2.x library copies the whole
        // of it, a 1.x one its first part.
        i.domain_attr = zeroed::<fi_domain_attr_2>().cast();
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
        tx.op_flags = o.tx_op_flags;
        tx.msg_order = o.msg_order;
        tx.inject_size = o.inject_size;
        tx.size = o.queue_size;
        tx.iov_limit = 1;
        tx.rma_iov_limit = 1;
        rx.caps = o.rx_caps;
        rx.op_flags = o.rx_op_flags;
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
        d.cq_data_size = offer::CQ_DATA_SIZE;
        d.cq_cnt = 64;
        d.ep_cnt = 64;
        d.tx_ctx_cnt = 1;
        d.rx_ctx_cnt = 1;
        d.max_ep_tx_ctx = 1;
        d.max_ep_rx_ctx = 1;
        d.cntr_cnt = 64;
        d.mr_iov_limit = 1;
        d.mr_key_size = 8;
        d.caps = o.caps & (FI_LOCAL_COMM | FI_REMOTE_COMM);
        d.max_err_data = 0;
        // The 2.x tail: counters count in 64 bits (0 there reads as "none").
        let d2 = i.domain_attr.cast::<fi_domain_attr_2>();
        (*d2).max_cntr_value = u64::MAX;
        (*d2).max_err_cntr_value = u64::MAX;
        f.api_version = api_version;
    }
    info
}

/// The rack's addressing, seen from the node this process runs on (`None`: no node, or
/// no rack file that names it).
fn addressing(config: &exanet::Config, node: &str) -> Option<Addressing> {
    let rack_dir = exanet::config::rack_dir(config.rack_dir.as_deref());
    let shape = exanet::config::read_shape(&rack_dir).ok()?;
    let here = shape.parse_node(node).ok()?.0;
    Some(Addressing::load(&rack_dir, here))
}

/// `fi_getinfo` for this provider: one answer, for the node this process runs on, or
/// `-FI_ENODATA` (no node configured, no daemon there, a node or service that names no
/// endpoint, or hints it cannot meet; the reason is logged at `FI_LOG_LEVEL=info`).
unsafe extern "C" fn getinfo(
    version: u32,
    node: *const c_char,
    service: *const c_char,
    flags: u64,
    hints: *const fi_info,
    info: *mut *mut fi_info,
) -> c_int {
    guard(|| {
        if info.is_null() {
            return -FI_EINVAL;
        }
        // SAFETY: non-null, writable as libfabric guarantees.
        unsafe { *info = ptr::null_mut() };
        let config = exanet::Config::from_env();
        let Ok((here, socket)) = config.node_socket() else {
            return -FI_ENODATA;
        };
        if !socket.exists() {
            return -FI_ENODATA;
        }
        let Some(addressing) = addressing(&config, &here) else {
            tracing::info!("exanet-fi: fi_getinfo: no rack file names node {here}");
            return -FI_ENODATA;
        };
        // SAFETY: libfabric passes null or valid hints.
        let raw_hints = unsafe { hints.as_ref() };
        let hints = raw_hints.map(|h| unsafe { read_hints(h) });
        // SAFETY: as above, with addresses of the lengths they give.
        let given = match raw_hints.map(|h| unsafe { hint_addrs(h) }) {
            None => (None, None),
            Some(Ok(a)) => a,
            Some(Err(what)) => {
                tracing::info!("exanet-fi: fi_getinfo: {}", offer::Mismatch::HintAddr(what));
                return -FI_ENODATA;
            }
        };
        // SAFETY: null or NUL-terminated, as libfabric passes them.
        let (node, service) = unsafe { (text(node), text(service)) };
        let answer = offer::offer(&here, hints.as_ref(), version).and_then(|o| {
            let a = offer::addresses(
                &addressing,
                node.as_deref(),
                service.as_deref(),
                flags & FI_SOURCE != 0,
                given.0,
                given.1,
            )?;
            Ok((o, a))
        });
        let (o, addrs) = match answer {
            Ok(x) => x,
            Err(why) => {
                tracing::info!("exanet-fi: fi_getinfo: {why}");
                return -FI_ENODATA;
            }
        };
        let out = layout(&o, &addrs, version);
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

/// The domain: this process's attachment to its node's NI, shared with its endpoints.
#[repr(C)]
struct Domain {
    head: fid_domain,
    attachment: Arc<exanet::Endpoint>,
    /// The rack's `[ni] mpi_eager_limit`.
    eager_limit: usize,
    /// Rendezvous sends complete when read (`FI_EXANET_SEND_COMPLETION`, the default).
    delivery_complete: bool,
    /// The regions the application registered, shared with its endpoints.
    regions: Arc<MrTable>,
    /// Node names and addresses of the rack, for address vectors and `fi_av_straddr`.
    addressing: Arc<Addressing>,
}

/// The source address an `fi_info` names, if in the provider's format.
///
/// # Safety
/// `info` is null or a valid `fi_info` whose `src_addr` is null or valid for its length.
unsafe fn info_src(info: *const fi_info) -> Result<Option<Addr>, c_int> {
    // SAFETY: as the caller guarantees.
    let Some(i) = (unsafe { info.as_ref() }) else {
        return Ok(None);
    };
    if i.src_addr.is_null() || i.src_addrlen == 0 {
        return Ok(None);
    }
    if i.addr_format != FI_FORMAT_UNSPEC || i.src_addrlen != av::ADDR_LEN {
        return Err(-FI_EINVAL);
    }
    // SAFETY: `src_addrlen` bytes, as the caller guarantees.
    av::decode_addr(unsafe { bytes(i.src_addr, i.src_addrlen) })
        .map(Some)
        .ok_or(-FI_EINVAL)
}

/// The rack's eager limit: `[ni] mpi_eager_limit`, else ExaNet-MPI's. A rack file that
/// does not load leaves the default (attaching has found the rack already).
fn eager_limit() -> usize {
    use exanet_control::rack::{Rack, DEFAULT_MPI_EAGER_LIMIT};
    Rack::load(&exanet::config::rack_dir(None))
        .ok()
        .and_then(|r| r.file.ni.and_then(|n| n.mpi_eager_limit))
        .unwrap_or(DEFAULT_MPI_EAGER_LIMIT) as usize
}

/// The environment variable that says when a rendezvous send completes by default.
const SEND_COMPLETION_ENV: &str = "FI_EXANET_SEND_COMPLETION";

/// Whether rendezvous sends complete only once read (`delivery`, the default), as
/// ExaNet-MPI's did: its receiver read the application's own buffer, so its sender waited
/// for the FIN. This provider stages what it sends, so with `transmit` a send completes
/// when its request has arrived: one message instead of the request, the read and the
/// FIN, 10% off LAMMPS melt's wall clock, but a sender then learns nothing of the
/// delivery from its completion, and MPI libraries count on it: Open MPI's one-sided
/// component `osc pt2pt` answers a flush once its reply's send has completed, and its
/// gets returned before their data was in (19 of 20 gets of 64 B read nothing).
fn delivery_by_default() -> bool {
    match std::env::var(SEND_COMPLETION_ENV).as_deref() {
        Ok("delivery") | Err(_) => true,
        Ok("transmit") => false,
        Ok(other) => {
            tracing::warn!(
                "exanet-fi: {SEND_COMPLETION_ENV}={other:?} is neither transmit nor delivery: \
                 delivery"
            );
            true
        }
    }
}

static FABRIC_FID_OPS: fi_ops = fid_ops(fabric_close);

static FABRIC_OPS: fi_ops_fabric = fi_ops_fabric {
    size: std::mem::size_of::<fi_ops_fabric>(),
    domain: Some(domain),
    passive_ep: Some(no_passive_ep),
    eq_open: Some(eq_open),
    wait_open: Some(no_wait_open),
    trywait: Some(no_trywait),
    domain2: Some(domain2),
};

static DOMAIN_FID_OPS: fi_ops = fid_ops(domain_close);

static DOMAIN_OPS: fi_ops_domain = fi_ops_domain {
    size: std::mem::size_of::<fi_ops_domain>(),
    av_open: Some(av_open),
    cq_open: Some(cq_open),
    endpoint: Some(endpoint),
    scalable_ep: Some(no_endpoint),
    cntr_open: Some(cntr_open),
    poll_open: Some(no_poll_open),
    stx_ctx: Some(no_stx_ctx),
    srx_ctx: Some(no_srx_ctx),
    query_atomic: Some(no_query_atomic),
    query_collective: Some(no_query_collective),
    endpoint2: Some(no_endpoint2),
};

static MR_OPS: fi_ops_mr = fi_ops_mr {
    size: std::mem::size_of::<fi_ops_mr>(),
    reg: Some(mr_reg),
    regv: Some(mr_regv),
    regattr: Some(mr_regattr),
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
    // SAFETY: libfabric closes what this provider opened, once.
    unsafe { close_boxed::<Fabric>(f) }
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
        let mut config = exanet::Config::from_env();
        if !exanet::config::spin_in_env() {
            // A completion read sleeps only after a streak of empty polls (`cq`): that
            // streak is the spin. Spinning again inside the sleep took a twelfth of the
            // machine under LAMMPS, from the daemons that carry its messages.
            config.spin = Some(std::time::Duration::ZERO);
        }
        let Ok((node, _)) = config.node_socket() else {
            return -FI_ENODEV;
        };
        // Ranks of one node share its memory channel: their compute is charged longer
        // (`exactl mpirun --modeled` says how much; the MPI launcher how many share it).
        match exanet::config::memory_channel_factor_ppm(ranks_on_this_node()) {
            Ok(f) => config.compute_factor_ppm = f,
            Err(e) => tracing::warn!("exanet-fi: fi_domain: {e}; no memory contention modeled"),
        }
        // SAFETY: libfabric passes null or a valid info with null or valid attributes.
        let asked = unsafe { info.as_ref().and_then(|i| i.domain_attr.as_ref()) }
            .and_then(|d| unsafe { text(d.name) });
        if asked.is_some_and(|a| !a.eq_ignore_ascii_case(&node)) {
            return -FI_EINVAL;
        }
        let Some(addressing) = addressing(&config, &node) else {
            return -FI_ENODEV;
        };
        // A source that names a service's rank: the domain is that rank of the node.
        // SAFETY: as above.
        let src = match unsafe { info_src(info) } {
            Ok(s) => s,
            Err(e) => return e,
        };
        if let Some(a) = src {
            if a.node != addressing.here {
                tracing::info!(
                    "exanet-fi: fi_domain: source {} is not this node ({node})",
                    addressing.text(a)
                );
                return -FI_EINVAL;
            }
            if a.rank != av::ANY {
                config.rank = Some(a.rank);
            }
        }
        let attachment = match exanet::Endpoint::attach_with(&config) {
            Ok(e) => Arc::new(e),
            Err(e) => {
                tracing::warn!("exanet-fi: fi_domain: attaching to {node}: {e}");
                // The service's rank is another workload's.
                return if config.rank.is_some() {
                    -FI_EADDRINUSE
                } else {
                    -FI_ENODEV
                };
            }
        };
        remember_modeled(&attachment);
        // SAFETY: as above.
        let mr_mode =
            unsafe { info.as_ref().and_then(|i| i.domain_attr.as_ref()) }.map_or(0, |d| d.mr_mode);
        // Keys of this process's regions start where no earlier run's are likely to.
        let first_key = wall_clock().as_nanos() as u64 & 0xffff_ffff_0000;
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
            attachment,
            eager_limit: eager_limit(),
            delivery_complete: delivery_by_default(),
            regions: Arc::new(MrTable::new(Naming::of(mr_mode), first_key)),
            addressing: Arc::new(addressing),
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
        // SAFETY: `d` is the head of a `Domain` boxed by `domain2`, not closed yet.
        let dom = unsafe { &*d.cast::<Domain>() };
        if Arc::strong_count(&dom.attachment) > 1 || Arc::strong_count(&dom.regions) > 1 {
            // Its endpoints or memory regions are still open.
            return -FI_EBUSY;
        }
        // SAFETY: as above; closed once. Dropping it detaches from the NI.
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
unsafe extern "C" fn no_wait_open(_: *mut fid_fabric, _: Opaque, _: *mut Opaque) -> c_int {
    -FI_ENOSYS
}
unsafe extern "C" fn no_trywait(_: *mut fid_fabric, _: *mut *mut fid, _: c_int) -> c_int {
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
// ---- Memory of the application ----------------------------------------------------------

/// A buffer of the application's, which a receive writes into when its message comes.
/// Made only here, where the application's promise is taken: the memory stays valid and
/// untouched by it until the operation completes (libfabric's rule for posted buffers).
#[derive(Debug)]
struct UserBuf {
    addr: usize,
    len: usize,
}

impl UserBuf {
    /// # Safety
    /// `addr` is null with `len` 0, or valid for writes of `len` bytes until the receive
    /// completes.
    unsafe fn new(addr: *mut c_void, len: usize) -> UserBuf {
        UserBuf {
            addr: addr as usize,
            len: if addr.is_null() { 0 } else { len },
        }
    }
}

impl RecvBuf for UserBuf {
    fn len(&self) -> usize {
        self.len
    }

    fn addr(&self) -> usize {
        self.addr
    }

    fn write_at(&self, offset: usize, data: &[u8]) -> usize {
        let n = data.len().min(self.len.saturating_sub(offset));
        if n > 0 {
            // SAFETY: valid for `len` >= offset + n bytes, as promised at `new`.
            unsafe { ptr::copy_nonoverlapping(data.as_ptr(), (self.addr + offset) as *mut u8, n) };
        }
        n
    }
}

/// The application's bytes at `buf`.
///
/// # Safety
/// `buf` is null with `len` 0, or readable for `len` bytes for the call's duration.
unsafe fn bytes<'a>(buf: *const c_void, len: usize) -> &'a [u8] {
    if buf.is_null() || len == 0 {
        &[]
    } else {
        // SAFETY: as the caller guarantees.
        unsafe { std::slice::from_raw_parts(buf.cast(), len) }
    }
}

/// The one buffer of an iovec array (`iov_limit` is 1), or an empty one.
///
/// # Safety
/// `iov` is null with `count` 0, or points at `count` iovecs.
unsafe fn one_iov(iov: *const libc::iovec, count: usize) -> Result<(*mut c_void, usize), c_int> {
    match count {
        0 => Ok((ptr::null_mut(), 0)),
        1 if !iov.is_null() => {
            // SAFETY: one iovec, as the caller guarantees.
            let v = unsafe { &*iov };
            Ok((v.iov_base, v.iov_len))
        }
        _ => Err(-FI_EINVAL),
    }
}

fn errno(e: Result<(), c_int>) -> isize {
    match e {
        Ok(()) => 0,
        Err(n) => -(n as isize),
    }
}

// ---- Memory regions ---------------------------------------------------------------------

/// A registered region: the libfabric head first, so a `*mut fid_mr` is a `*mut MrObj`.
#[repr(C)]
struct MrObj {
    head: fid_mr,
    table: Arc<MrTable>,
}

static MR_FID_OPS: fi_ops = fid_ops(mr_close);

/// Registers `len` bytes at `buf` of the domain `fid` as a target of one-sided operations.
///
/// # Safety
/// `fid` is null or a domain of this provider; `out` null or writable.
#[allow(clippy::too_many_arguments)] // libfabric's arguments
unsafe fn register(
    fid: *mut fid,
    buf: *const c_void,
    len: usize,
    access: u64,
    offset: u64,
    requested_key: u64,
    out: *mut *mut fid_mr,
    context: *mut c_void,
) -> c_int {
    guard(|| {
        // SAFETY: as the caller guarantees.
        let Some(f) = (unsafe { fid.as_ref() }) else {
            return -FI_EINVAL;
        };
        if f.fclass != FI_CLASS_DOMAIN || out.is_null() {
            return -FI_EINVAL;
        }
        // SAFETY: a domain of this provider is a `Domain`.
        let d = unsafe { &*fid.cast::<Domain>() };
        let key = match d
            .regions
            .register(buf as usize, len, access, offset, requested_key)
        {
            Ok(k) => k,
            Err(RegError::KeyInUse(_)) => return -FI_ENOKEY,
            Err(RegError::BadBuffer) => return -FI_EINVAL,
        };
        let obj = Box::new(MrObj {
            head: fid_mr {
                fid: fid {
                    fclass: FI_CLASS_MR,
                    context,
                    ops: ptr::addr_of!(MR_FID_OPS).cast_mut(),
                },
                // What `fi_mr_desc` gives: nothing a local operation needs.
                mem_desc: ptr::null_mut(),
                key,
            },
            table: Arc::clone(&d.regions),
        });
        // SAFETY: checked non-null; the application's to write.
        unsafe { *out = Box::into_raw(obj).cast() };
        0
    })
}

#[allow(clippy::too_many_arguments)] // libfabric's signature
unsafe extern "C" fn mr_reg(
    fid: *mut fid,
    buf: *const c_void,
    len: usize,
    access: u64,
    offset: u64,
    requested_key: u64,
    _flags: u64,
    out: *mut Opaque,
    context: Opaque,
) -> c_int {
    // SAFETY: as libfabric passes them.
    unsafe {
        register(
            fid,
            buf,
            len,
            access,
            offset,
            requested_key,
            out.cast(),
            context,
        )
    }
}

#[allow(clippy::too_many_arguments)] // libfabric's signature
unsafe extern "C" fn mr_regv(
    fid: *mut fid,
    iov: Opaque,
    count: usize,
    access: u64,
    offset: u64,
    requested_key: u64,
    _flags: u64,
    out: *mut Opaque,
    context: Opaque,
) -> c_int {
    // SAFETY: an iovec array of `count`, as libfabric passes it.
    match unsafe { one_iov(iov.cast(), count) } {
        Ok((buf, len)) => unsafe {
            register(
                fid,
                buf,
                len,
                access,
                offset,
                requested_key,
                out.cast(),
                context,
            )
        },
        Err(e) => e,
    }
}

unsafe extern "C" fn mr_regattr(
    fid: *mut fid,
    attr: Opaque,
    _flags: u64,
    out: *mut Opaque,
) -> c_int {
    // SAFETY: null or a valid attribute struct, as libfabric passes it.
    let Some(a) = (unsafe { attr.cast::<fi_mr_attr>().as_ref() }) else {
        return -FI_EINVAL;
    };
    // Host memory only (`iface` FI_HMEM_SYSTEM, 0).
    if a.iface != 0 {
        return -FI_ENOSYS;
    }
    // SAFETY: as above.
    match unsafe { one_iov(a.mr_iov, a.iov_count) } {
        Ok((buf, len)) => unsafe {
            register(
                fid,
                buf,
                len,
                a.access,
                a.offset,
                a.requested_key,
                out.cast(),
                a.context,
            )
        },
        Err(e) => e,
    }
}

unsafe extern "C" fn mr_close(f: *mut fid) -> c_int {
    guard(|| {
        if f.is_null() {
            return -FI_EINVAL;
        }
        // SAFETY: an `MrObj` boxed by `register`, closed once.
        let obj = unsafe { Box::from_raw(f.cast::<MrObj>()) };
        obj.table.deregister(obj.head.key);
        0
    })
}

/// The application's regions, as endpoints copy in and out of them for the one-sided
/// operations they serve.
struct AppRegions(Arc<MrTable>);

impl Regions for AppRegions {
    fn store(&self, key: u64, addr: u64, data: &[u8]) -> Result<(), RmaRefusal> {
        self.0.with_range(key, addr, data.len(), true, |at| {
            if !data.is_empty() {
                // SAFETY: `at..at + len` lies in a buffer the application registered
                // for remote writes and has not closed (the table's lock is held); by
                // registering it the application handed it to remote writers.
                unsafe { ptr::copy_nonoverlapping(data.as_ptr(), at as *mut u8, data.len()) };
            }
        })
    }

    fn check(&self, key: u64, addr: u64, len: usize, write: bool) -> Result<(), RmaRefusal> {
        self.0.with_range(key, addr, len, write, |_| ())
    }

    fn load(&self, key: u64, addr: u64, out: &mut [u8]) -> Result<(), RmaRefusal> {
        self.0.with_range(key, addr, out.len(), false, |at| {
            if !out.is_empty() {
                // SAFETY: as in `store`, for remote reads.
                unsafe { ptr::copy_nonoverlapping(at as *const u8, out.as_mut_ptr(), out.len()) };
            }
        })
    }
}

// ---- Address vectors --------------------------------------------------------------------

#[repr(C)]
struct AvObj {
    head: fid_av,
    av: Arc<Av>,
    addressing: Arc<Addressing>,
}

static AV_FID_OPS: fi_ops = fid_ops(av_close);

static AV_OPS: fi_ops_av = fi_ops_av {
    size: std::mem::size_of::<fi_ops_av>(),
    insert: Some(av_insert),
    insertsvc: Some(av_insertsvc),
    insertsym: Some(av_insertsym),
    remove: Some(av_remove),
    lookup: Some(av_lookup),
    straddr: Some(av_straddr),
    av_set: Some(av_set),
};

unsafe extern "C" fn av_open(
    domain: *mut fid_domain,
    attr: Opaque,
    out: *mut Opaque,
    context: Opaque,
) -> c_int {
    guard(|| {
        if domain.is_null() || out.is_null() {
            return -FI_EINVAL;
        }
        // SAFETY: null or a valid fi_av_attr, as libfabric passes it.
        let kind = match unsafe { attr.cast::<fi_av_attr>().as_ref() }.map(|a| a.type_) {
            None | Some(FI_AV_UNSPEC) | Some(FI_AV_TABLE) => av::Kind::Table,
            Some(FI_AV_MAP) => av::Kind::Map,
            Some(_) => return -FI_EINVAL,
        };
        // SAFETY: the head of the `Domain` this provider opened.
        let d = unsafe { &*domain.cast::<Domain>() };
        let obj = AvObj {
            head: fid_av {
                fid: fid {
                    fclass: FI_CLASS_AV,
                    context,
                    ops: ptr::addr_of!(AV_FID_OPS).cast_mut(),
                },
                ops: ptr::addr_of!(AV_OPS).cast_mut(),
            },
            av: Arc::new(Av::new(kind)),
            addressing: Arc::clone(&d.addressing),
        };
        // SAFETY: `out` checked; `AvObj` starts with its `fid_av`.
        unsafe { hand_out(obj, out) }
    })
}

unsafe extern "C" fn av_close(f: *mut fid) -> c_int {
    // SAFETY: libfabric closes what this provider opened, once.
    unsafe { close_boxed::<AvObj>(f) }
}

/// The vector behind `av`.
///
/// # Safety
/// `av` is null or the head of an open `AvObj`.
unsafe fn av_of<'a>(av: *mut fid_av) -> Option<&'a Av> {
    // SAFETY: as the caller guarantees.
    unsafe { av.cast::<AvObj>().as_ref() }.map(|o| &*o.av)
}

unsafe extern "C" fn av_insert(
    av: *mut fid_av,
    addr: *const c_void,
    count: usize,
    fi_addr: *mut u64,
    _flags: u64,
    _context: Opaque,
) -> c_int {
    guard(|| {
        // SAFETY: libfabric passes the vector it opened.
        let Some(v) = (unsafe { av_of(av) }) else {
            return -FI_EINVAL;
        };
        if count > 0 && addr.is_null() {
            return -FI_EINVAL;
        }
        let Some(total) = count.checked_mul(av::ADDR_LEN) else {
            return -FI_EINVAL;
        };
        // SAFETY: `count` addresses of ADDR_LEN bytes, as the application passes them.
        let raw = unsafe { bytes(addr, total) };
        let peers: Vec<_> = raw.chunks_exact(av::ADDR_LEN).map(av::decode).collect();
        let ids = v.insert(&peers);
        if !fi_addr.is_null() {
            // SAFETY: room for `count` fi_addr_t, as the application passes it.
            unsafe { ptr::copy_nonoverlapping(ids.as_ptr(), fi_addr, ids.len()) };
        }
        peers.iter().filter(|p| p.is_some()).count() as c_int
    })
}

/// Inserts the endpoints of `nodes` x `services` (node-major, as fi_av(3) orders
/// `fi_av_insertsym`); `fi_addr`: null or room for all of them.
///
/// # Safety
/// `av` is null or an open `AvObj`; `fi_addr` null or valid for `nodes.len() *
/// services.len()` entries.
unsafe fn insert_named(
    av: *mut fid_av,
    nodes: &[u32],
    services: &[u32],
    fi_addr: *mut u64,
) -> c_int {
    // SAFETY: as the caller guarantees.
    let Some(o) = (unsafe { av.cast::<AvObj>().as_ref() }) else {
        return -FI_EINVAL;
    };
    let peers: Vec<_> = nodes
        .iter()
        .flat_map(|&n| services.iter().map(move |&s| Addr::at(n, s).peer()))
        .collect();
    let ids = o.av.insert(&peers);
    if !fi_addr.is_null() {
        // SAFETY: room for every entry, as the caller guarantees.
        unsafe { ptr::copy_nonoverlapping(ids.as_ptr(), fi_addr, ids.len()) };
    }
    peers.iter().filter(|p| p.is_some()).count() as c_int
}

/// `fi_av_insertsvc`: the endpoint `service` names on `node` (a node name, an IP over
/// ExaNet address or a host name, as `fi_getinfo` takes them).
unsafe extern "C" fn av_insertsvc(
    av: *mut fid_av,
    node: *const c_char,
    service: *const c_char,
    fi_addr: *mut u64,
    _flags: u64,
    _context: Opaque,
) -> c_int {
    guard(|| {
        // SAFETY: as the application passes them.
        let Some(o) = (unsafe { av.cast::<AvObj>().as_ref() }) else {
            return -FI_EINVAL;
        };
        // SAFETY: NUL-terminated strings or null, as the application passes them.
        let (Some(node), Some(service)) = (unsafe { text(node) }, unsafe { text(service) }) else {
            return -FI_EINVAL;
        };
        let (Some(n), Some(s)) = (o.addressing.node(&node), av::parse_service(&service)) else {
            // Not an address: not inserted, as fi_av_insert reports one.
            if !fi_addr.is_null() {
                // SAFETY: room for one entry.
                unsafe { *fi_addr = FI_ADDR_UNSPEC };
            }
            return 0;
        };
        // SAFETY: forwarded; one entry.
        unsafe { insert_named(av, &[n], &[s], fi_addr) }
    })
}

/// `fi_av_insertsym`: `nodecnt` nodes from `node` on, in node id order (consecutive IP
/// over ExaNet addresses are consecutive ids), each with `svccnt` services from
/// `service` on.
#[allow(clippy::too_many_arguments)] // libfabric's signature
unsafe extern "C" fn av_insertsym(
    av: *mut fid_av,
    node: *const c_char,
    nodecnt: usize,
    service: *const c_char,
    svccnt: usize,
    fi_addr: *mut u64,
    _flags: u64,
    _context: Opaque,
) -> c_int {
    guard(|| {
        // SAFETY: as the application passes them.
        let Some(o) = (unsafe { av.cast::<AvObj>().as_ref() }) else {
            return -FI_EINVAL;
        };
        // SAFETY: NUL-terminated strings or null, as the application passes them.
        let (Some(node), Some(service)) = (unsafe { text(node) }, unsafe { text(service) }) else {
            return -FI_EINVAL;
        };
        // One node has 336 distinct services, a rack at most 2^22 nodes: more than that
        // is a caller's mistake, not an allocation to try.
        if nodecnt == 0
            || svccnt == 0
            || svccnt > av::SERVICES as usize
            || nodecnt > 1 << 22
            || nodecnt.saturating_mul(svccnt) > 1 << 24
        {
            return -FI_EINVAL;
        }
        let (Some(n), Some(s)) = (o.addressing.node(&node), av::parse_service(&service)) else {
            return -FI_EINVAL;
        };
        let nodes: Vec<u32> = (0..nodecnt as u32).map(|k| n.saturating_add(k)).collect();
        let services: Vec<u32> = (0..svccnt as u32).map(|k| s + k).collect();
        if services.last().is_some_and(|&l| l > 65535) {
            return -FI_EINVAL;
        }
        // SAFETY: forwarded; `fi_addr` has room for nodecnt * svccnt, as fi_av(3) says.
        unsafe { insert_named(av, &nodes, &services, fi_addr) }
    })
}

unsafe extern "C" fn av_set(_: *mut fid_av, _: Opaque, _: *mut Opaque, _: Opaque) -> c_int {
    -FI_ENOSYS
}

unsafe extern "C" fn av_remove(av: *mut fid_av, fi_addr: *mut u64, count: usize, _: u64) -> c_int {
    guard(|| {
        // SAFETY: libfabric passes the vector it opened.
        let Some(v) = (unsafe { av_of(av) }) else {
            return -FI_EINVAL;
        };
        if count > 0 && fi_addr.is_null() {
            return -FI_EINVAL;
        }
        // SAFETY: `count` addresses, as the application passes them.
        let ids = unsafe { bytes(fi_addr.cast(), count * 8) };
        let mut bad = false;
        for id in ids.chunks_exact(8) {
            let id = u64::from_ne_bytes(id.try_into().expect("8 bytes"));
            bad |= !v.remove(id);
        }
        if bad {
            -FI_ENOENT
        } else {
            0
        }
    })
}

unsafe extern "C" fn av_lookup(
    av: *mut fid_av,
    fi_addr: u64,
    addr: *mut c_void,
    addrlen: *mut usize,
) -> c_int {
    guard(|| {
        // SAFETY: libfabric passes the vector it opened.
        let Some(v) = (unsafe { av_of(av) }) else {
            return -FI_EINVAL;
        };
        if addrlen.is_null() {
            return -FI_EINVAL;
        }
        let Some(p) = v.lookup(fi_addr) else {
            return -FI_ENOENT;
        };
        // SAFETY: non-null, readable and writable.
        let room = unsafe { *addrlen };
        let b = av::encode(p);
        if !addr.is_null() {
            // SAFETY: valid for `room` bytes; what fits is copied.
            unsafe { ptr::copy_nonoverlapping(b.as_ptr(), addr.cast(), room.min(b.len())) };
        }
        // SAFETY: as above.
        unsafe { *addrlen = b.len() };
        if room < b.len() {
            -FI_ETOOSMALL
        } else {
            0
        }
    })
}

unsafe extern "C" fn av_straddr(
    av: *mut fid_av,
    addr: *const c_void,
    buf: *mut c_char,
    len: *mut usize,
) -> *const c_char {
    let text = catch_unwind(AssertUnwindSafe(|| {
        if addr.is_null() {
            return "exanet://invalid".to_string();
        }
        // SAFETY: an address of ADDR_LEN bytes, as the application passes it.
        let raw = unsafe { bytes(addr, av::ADDR_LEN) };
        // SAFETY: null or the vector this provider opened.
        let addressing = unsafe { av.cast::<AvObj>().as_ref() }.map(|o| &o.addressing);
        match (av::decode_addr(raw), addressing) {
            (Some(a), Some(x)) => x.text(a),
            (Some(a), None) => format!("exanet://node#{}:{}", a.node, a.service()),
            (None, _) => "exanet://invalid".to_string(),
        }
    }))
    .unwrap_or_default();
    if buf.is_null() || len.is_null() {
        return buf;
    }
    // SAFETY: `*len` is the buffer's size, as the application passes it.
    let room = unsafe { *len };
    if room > 0 {
        let n = text.len().min(room - 1);
        // SAFETY: `n + 1 <= room` bytes of the buffer.
        unsafe {
            ptr::copy_nonoverlapping(text.as_ptr(), buf.cast(), n);
            *buf.add(n) = 0;
        }
    }
    // SAFETY: as above.
    unsafe { *len = text.len() + 1 };
    buf
}

// ---- Counters ---------------------------------------------------------------------------

#[repr(C)]
struct CntrObj {
    head: fid_cntr,
    cntr: Arc<Cntr>,
}

static CNTR_FID_OPS: fi_ops = fid_ops(cntr_close);

static CNTR_OPS: fi_ops_cntr = fi_ops_cntr {
    size: std::mem::size_of::<fi_ops_cntr>(),
    read: Some(cntr_read),
    readerr: Some(cntr_readerr),
    add: Some(cntr_add),
    set: Some(cntr_set),
    wait: Some(cntr_wait),
    adderr: Some(cntr_adderr),
    seterr: Some(cntr_seterr),
};

unsafe extern "C" fn cntr_open(
    domain: *mut fid_domain,
    attr: Opaque,
    out: *mut Opaque,
    context: Opaque,
) -> c_int {
    guard(|| {
        if domain.is_null() || out.is_null() {
            return -FI_EINVAL;
        }
        // SAFETY: null or a valid fi_cntr_attr, as libfabric passes it.
        if let Some(a) = unsafe { attr.cast::<fi_cntr_attr>().as_ref() } {
            if a.events != FI_CNTR_EVENTS_COMP || a.flags != 0 {
                return -FI_EINVAL;
            }
            // Nothing to wait on but progress, as for completion queues.
            if !matches!(a.wait_obj, FI_WAIT_NONE | FI_WAIT_UNSPEC) {
                return -FI_ENOSYS;
            }
        }
        let obj = CntrObj {
            head: fid_cntr {
                fid: fid {
                    fclass: FI_CLASS_CNTR,
                    context,
                    ops: ptr::addr_of!(CNTR_FID_OPS).cast_mut(),
                },
                ops: ptr::addr_of!(CNTR_OPS).cast_mut(),
            },
            cntr: Arc::new(Cntr::default()),
        };
        // SAFETY: `out` checked; `CntrObj` starts with its `fid_cntr`.
        unsafe { hand_out(obj, out) }
    })
}

unsafe extern "C" fn cntr_close(f: *mut fid) -> c_int {
    // SAFETY: libfabric closes what this provider opened, once.
    unsafe { close_boxed::<CntrObj>(f) }
}

/// The counter behind `c`.
///
/// # Safety
/// `c` is null or a counter this provider opened and has not closed.
unsafe fn cntr_of<'a>(c: *mut fid_cntr) -> Option<&'a Arc<Cntr>> {
    // SAFETY: as the caller guarantees.
    unsafe { c.cast::<CntrObj>().as_ref() }.map(|o| &o.cntr)
}

/// Runs `f` on the counter `c`; `bad` for a null one or a panic.
///
/// # Safety
/// As [`cntr_of`].
unsafe fn with_cntr<R>(c: *mut fid_cntr, bad: R, f: impl FnOnce(&Cntr) -> R) -> R {
    // SAFETY: as the caller guarantees.
    match unsafe { cntr_of(c) } {
        Some(c) => catch_unwind(AssertUnwindSafe(|| f(c))).unwrap_or(bad),
        None => bad,
    }
}

// `fi_cntr_read` has no way to say an error: an invalid counter reads 0.
unsafe extern "C" fn cntr_read(c: *mut fid_cntr) -> u64 {
    // SAFETY: forwarded as libfabric passed it.
    unsafe { with_cntr(c, 0, Cntr::read) }
}

unsafe extern "C" fn cntr_readerr(c: *mut fid_cntr) -> u64 {
    // SAFETY: forwarded as libfabric passed it.
    unsafe { with_cntr(c, 0, Cntr::read_errors) }
}

/// `fi_cntr_add`, `set`, `adderr`, `seterr`: `f` on the counter `c`.
///
/// # Safety
/// As [`cntr_of`].
unsafe fn cntr_change(c: *mut fid_cntr, f: impl FnOnce(&Cntr)) -> c_int {
    // SAFETY: as the caller guarantees.
    unsafe {
        with_cntr(c, -FI_EINVAL, |c| {
            f(c);
            0
        })
    }
}

unsafe extern "C" fn cntr_add(c: *mut fid_cntr, v: u64) -> c_int {
    // SAFETY: forwarded as libfabric passed it.
    unsafe { cntr_change(c, |c| c.add(v)) }
}

unsafe extern "C" fn cntr_set(c: *mut fid_cntr, v: u64) -> c_int {
    // SAFETY: forwarded as libfabric passed it.
    unsafe { cntr_change(c, |c| c.set(v)) }
}

unsafe extern "C" fn cntr_adderr(c: *mut fid_cntr, v: u64) -> c_int {
    // SAFETY: forwarded as libfabric passed it.
    unsafe { cntr_change(c, |c| c.add_errors(v)) }
}

unsafe extern "C" fn cntr_seterr(c: *mut fid_cntr, v: u64) -> c_int {
    // SAFETY: forwarded as libfabric passed it.
    unsafe { cntr_change(c, |c| c.set_errors(v)) }
}

/// Waits until the counter reaches `threshold` (`timeout` ms; negative: no limit),
/// making progress: `-FI_ETIMEDOUT` when the time ran out, `-FI_EAVAIL` when an
/// operation it counts failed meanwhile.
unsafe extern "C" fn cntr_wait(c: *mut fid_cntr, threshold: u64, timeout: c_int) -> c_int {
    let timeout = u64::try_from(timeout)
        .ok()
        .map(std::time::Duration::from_millis);
    // SAFETY: forwarded as libfabric passed it.
    unsafe {
        with_cntr(c, -FI_EINVAL, |c| match c.wait(threshold, timeout) {
            Ok(()) => 0,
            Err(WaitEnd::TimedOut) => -FI_ETIMEDOUT,
            Err(WaitEnd::Failed) => -FI_EAVAIL,
        })
    }
}

// ---- Completion queues ------------------------------------------------------------------

#[repr(C)]
struct CqObj {
    head: fid_cq,
    cq: Arc<Cq>,
}

static CQ_FID_OPS: fi_ops = fid_ops(cq_close);

static CQ_OPS: fi_ops_cq = fi_ops_cq {
    size: std::mem::size_of::<fi_ops_cq>(),
    read: Some(cq_read),
    readfrom: Some(cq_readfrom),
    readerr: Some(cq_readerr),
    sread: Some(cq_sread),
    sreadfrom: Some(cq_sreadfrom),
    signal: Some(cq_signal),
    strerror: Some(cq_strerror),
};

/// Bytes of one entry of a completion format.
fn entry_size(format: c_int) -> usize {
    match format {
        FI_CQ_FORMAT_CONTEXT => 8,
        FI_CQ_FORMAT_MSG => 24,
        FI_CQ_FORMAT_DATA => 40,
        _ => std::mem::size_of::<fi_cq_tagged_entry>(),
    }
}

unsafe extern "C" fn cq_open(
    domain: *mut fid_domain,
    attr: Opaque,
    out: *mut Opaque,
    context: Opaque,
) -> c_int {
    guard(|| {
        if domain.is_null() || out.is_null() {
            return -FI_EINVAL;
        }
        // SAFETY: null or a valid fi_cq_attr, as libfabric passes it.
        let attr = unsafe { attr.cast::<fi_cq_attr>().as_ref() };
        let format = match attr.map_or(FI_CQ_FORMAT_UNSPEC, |a| a.format) {
            FI_CQ_FORMAT_UNSPEC => FI_CQ_FORMAT_CONTEXT,
            f @ FI_CQ_FORMAT_CONTEXT..=FI_CQ_FORMAT_TAGGED => f,
            _ => return -FI_EINVAL,
        };
        // Nothing to wait on but progress: reads poll, and `fi_cq_sread` polls too.
        if !matches!(
            attr.map_or(FI_WAIT_NONE, |a| a.wait_obj),
            FI_WAIT_NONE | FI_WAIT_UNSPEC
        ) {
            return -FI_ENOSYS;
        }
        let obj = CqObj {
            head: fid_cq {
                fid: fid {
                    fclass: FI_CLASS_CQ,
                    context,
                    ops: ptr::addr_of!(CQ_FID_OPS).cast_mut(),
                },
                ops: ptr::addr_of!(CQ_OPS).cast_mut(),
            },
            cq: Arc::new(Cq::new(format, Idle::from_env())),
        };
        // SAFETY: `out` checked; `CqObj` starts with its `fid_cq`.
        unsafe { hand_out(obj, out) }
    })
}

unsafe extern "C" fn cq_close(f: *mut fid) -> c_int {
    // SAFETY: libfabric closes what this provider opened, once.
    unsafe { close_boxed::<CqObj>(f) }
}

/// The queue behind `cq`.
///
/// # Safety
/// `cq` is null or the head of an open `CqObj`.
unsafe fn cq_of<'a>(cq: *mut fid_cq) -> Option<&'a Arc<Cq>> {
    // SAFETY: as the caller guarantees.
    unsafe { cq.cast::<CqObj>().as_ref() }.map(|o| &o.cq)
}

/// Writes `c` in `format` at `buf`.
///
/// # Safety
/// `buf` is valid for one entry of `format`.
unsafe fn put_entry(buf: *mut u8, format: c_int, c: &Completion) {
    let full = fi_cq_tagged_entry {
        op_context: c.context as *mut c_void,
        flags: c.flags,
        len: c.len,
        buf: c.buf as *mut c_void,
        data: c.data,
        tag: c.tag,
    };
    // SAFETY: the formats are prefixes of the tagged entry; `buf` holds one entry.
    unsafe { ptr::copy_nonoverlapping(ptr::addr_of!(full).cast::<u8>(), buf, entry_size(format)) };
}

/// Reads up to `count` completions into `buf`, and their sources into `src`; `blocked`:
/// for a caller blocked in the provider until something comes ([`Cq::read`]).
///
/// # Safety
/// `buf` holds `count` entries of the queue's format; `src` is null or holds `count`.
unsafe fn read_into(
    cq: *mut fid_cq,
    buf: *mut c_void,
    count: usize,
    src: *mut u64,
    blocked: bool,
) -> isize {
    // SAFETY: libfabric passes the queue it opened.
    let Some(q) = (unsafe { cq_of(cq) }) else {
        return -(FI_EINVAL as isize);
    };
    if buf.is_null() && count > 0 {
        return -(FI_EINVAL as isize);
    }
    match q.read(count, blocked) {
        Ok(entries) => {
            let size = entry_size(q.format);
            for (k, c) in entries.iter().enumerate() {
                // SAFETY: entry k of `count` >= entries.len().
                unsafe {
                    put_entry(buf.cast::<u8>().add(k * size), q.format, c);
                    if !src.is_null() {
                        *src.add(k) = c.src;
                    }
                }
            }
            entries.len() as isize
        }
        Err(Empty::Again) => -(FI_EAGAIN as isize),
        Err(Empty::Failure) => -(FI_EAVAIL as isize),
    }
}

unsafe extern "C" fn cq_read(cq: *mut fid_cq, buf: *mut c_void, count: usize) -> isize {
    // SAFETY: forwarded as libfabric passed them.
    catch_unwind(AssertUnwindSafe(|| unsafe {
        read_into(cq, buf, count, ptr::null_mut(), false)
    }))
    .unwrap_or(-(FI_EIO as isize))
}

unsafe extern "C" fn cq_readfrom(
    cq: *mut fid_cq,
    buf: *mut c_void,
    count: usize,
    src: *mut u64,
) -> isize {
    // SAFETY: forwarded as libfabric passed them.
    catch_unwind(AssertUnwindSafe(|| unsafe {
        read_into(cq, buf, count, src, false)
    }))
    .unwrap_or(-(FI_EIO as isize))
}

/// Polls for up to `timeout` ms (negative: no limit) until something completes.
///
/// # Safety
/// As [`read_into`].
unsafe fn sread_into(
    cq: *mut fid_cq,
    buf: *mut c_void,
    count: usize,
    src: *mut u64,
    timeout: c_int,
) -> isize {
    let start = std::time::Instant::now();
    loop {
        // SAFETY: forwarded as the caller guarantees.
        let n = unsafe { read_into(cq, buf, count, src, true) };
        if n != -(FI_EAGAIN as isize) {
            return n;
        }
        // SAFETY: as above (`read_into` checked it is a queue of this provider).
        if unsafe { cq_of(cq) }.is_some_and(|q| q.take_signal()) {
            return -(FI_EAGAIN as isize);
        }
        if timeout >= 0 && start.elapsed().as_millis() >= timeout as u128 {
            return -(FI_EAGAIN as isize);
        }
        std::thread::sleep(std::time::Duration::from_micros(20));
    }
}

unsafe extern "C" fn cq_sread(
    cq: *mut fid_cq,
    buf: *mut c_void,
    count: usize,
    _cond: *const c_void,
    timeout: c_int,
) -> isize {
    // SAFETY: forwarded as libfabric passed them.
    catch_unwind(AssertUnwindSafe(|| unsafe {
        sread_into(cq, buf, count, ptr::null_mut(), timeout)
    }))
    .unwrap_or(-(FI_EIO as isize))
}

unsafe extern "C" fn cq_sreadfrom(
    cq: *mut fid_cq,
    buf: *mut c_void,
    count: usize,
    src: *mut u64,
    _cond: *const c_void,
    timeout: c_int,
) -> isize {
    // SAFETY: forwarded as libfabric passed them.
    catch_unwind(AssertUnwindSafe(|| unsafe {
        sread_into(cq, buf, count, src, timeout)
    }))
    .unwrap_or(-(FI_EIO as isize))
}

unsafe extern "C" fn cq_readerr(cq: *mut fid_cq, buf: *mut fi_cq_err_entry, _flags: u64) -> isize {
    catch_unwind(AssertUnwindSafe(|| {
        // SAFETY: libfabric passes the queue it opened.
        let Some(q) = (unsafe { cq_of(cq) }) else {
            return -(FI_EINVAL as isize);
        };
        // SAFETY: null or a valid error entry.
        let Some(out) = (unsafe { buf.as_mut() }) else {
            return -(FI_EINVAL as isize);
        };
        let Some(f) = q.read_failure() else {
            return -(FI_EAGAIN as isize);
        };
        out.op_context = f.entry.context as *mut c_void;
        out.flags = f.entry.flags;
        out.len = f.entry.len;
        out.buf = f.entry.buf as *mut c_void;
        out.data = f.entry.data;
        out.tag = f.entry.tag;
        out.olen = f.olen;
        out.err = f.err;
        out.prov_errno = f.err;
        // No provider data: a caller's own err_data buffer is left as it gave it.
        out.err_data_size = 0;
        1
    }))
    .unwrap_or(-(FI_EIO as isize))
}

unsafe extern "C" fn cq_signal(cq: *mut fid_cq) -> c_int {
    guard(|| {
        // SAFETY: libfabric passes the queue it opened.
        let Some(q) = (unsafe { cq_of(cq) }) else {
            return -FI_EINVAL;
        };
        q.signal();
        0
    })
}

unsafe extern "C" fn cq_strerror(
    _: *mut fid_cq,
    prov_errno: c_int,
    _: *const c_void,
    buf: *mut c_char,
    len: usize,
) -> *const c_char {
    // The provider's error numbers are libfabric's.
    let text = std::io::Error::from_raw_os_error(prov_errno).to_string();
    if buf.is_null() || len == 0 {
        return c"exanet provider error".as_ptr();
    }
    let n = text.len().min(len - 1);
    // SAFETY: `buf` holds `len` bytes, as the caller passes it.
    unsafe {
        ptr::copy_nonoverlapping(text.as_ptr(), buf.cast(), n);
        *buf.add(n) = 0;
    }
    buf
}

// ---- Event queues -----------------------------------------------------------------------

/// An event queue: an `FI_EP_RDM` endpoint of this provider raises no events (address
/// vectors insert synchronously), but applications open one with the fabric.
#[repr(C)]
struct EqObj {
    head: fid_eq,
}

static EQ_FID_OPS: fi_ops = fid_ops(eq_close);

static EQ_OPS: fi_ops_eq = fi_ops_eq {
    size: std::mem::size_of::<fi_ops_eq>(),
    read: Some(eq_read),
    readerr: Some(eq_readerr),
    write: Some(eq_write),
    sread: Some(eq_sread),
    strerror: Some(eq_strerror),
};

unsafe extern "C" fn eq_open(
    fabric: *mut fid_fabric,
    _attr: Opaque,
    out: *mut Opaque,
    context: Opaque,
) -> c_int {
    guard(|| {
        if fabric.is_null() || out.is_null() {
            return -FI_EINVAL;
        }
        let obj = EqObj {
            head: fid_eq {
                fid: fid {
                    fclass: FI_CLASS_EQ,
                    context,
                    ops: ptr::addr_of!(EQ_FID_OPS).cast_mut(),
                },
                ops: ptr::addr_of!(EQ_OPS).cast_mut(),
            },
        };
        // SAFETY: `out` checked; `EqObj` starts with its `fid_eq`.
        unsafe { hand_out(obj, out) }
    })
}

unsafe extern "C" fn eq_close(f: *mut fid) -> c_int {
    // SAFETY: libfabric closes what this provider opened, once.
    unsafe { close_boxed::<EqObj>(f) }
}

unsafe extern "C" fn eq_read(
    _: *mut fid_eq,
    _: *mut u32,
    _: *mut c_void,
    _: usize,
    _: u64,
) -> isize {
    -(FI_EAGAIN as isize)
}
unsafe extern "C" fn eq_readerr(_: *mut fid_eq, _: Opaque, _: u64) -> isize {
    -(FI_EAGAIN as isize)
}
unsafe extern "C" fn eq_write(_: *mut fid_eq, _: u32, _: *const c_void, _: usize, _: u64) -> isize {
    -(FI_ENOSYS as isize)
}
unsafe extern "C" fn eq_sread(
    _: *mut fid_eq,
    _: *mut u32,
    _: *mut c_void,
    _: usize,
    timeout: c_int,
    _: u64,
) -> isize {
    // Nothing ever comes: wait out a finite timeout, then say so.
    if timeout > 0 {
        std::thread::sleep(std::time::Duration::from_millis(timeout as u64));
    }
    -(FI_EAGAIN as isize)
}
unsafe extern "C" fn eq_strerror(
    _: *mut fid_eq,
    _: c_int,
    _: *const c_void,
    _: *mut c_char,
    _: usize,
) -> *const c_char {
    c"exanet provider: no event queue errors".as_ptr()
}

// ---- Endpoints --------------------------------------------------------------------------

#[repr(C)]
struct EpObj {
    head: fid_ep,
    ep: Arc<Endpoint>,
    /// Untagged receives post multi-receive buffers (`FI_MULTI_RECV` in the receive
    /// attributes' default flags).
    multi_by_default: bool,
}

static EP_FID_OPS: fi_ops = fi_ops {
    size: std::mem::size_of::<fi_ops>(),
    close: Some(ep_close),
    bind: Some(ep_bind),
    control: Some(ep_control),
    ops_open: Some(no_ops_open),
    tostr: Some(no_tostr),
    ops_set: Some(no_ops_set),
};

static EP_OPS: fi_ops_ep = fi_ops_ep {
    size: std::mem::size_of::<fi_ops_ep>(),
    cancel: Some(ep_cancel),
    getopt: Some(ep_getopt),
    setopt: Some(ep_setopt),
    tx_ctx: Some(ep_no_tx_ctx),
    rx_ctx: Some(ep_no_rx_ctx),
    rx_size_left: Some(ep_size_left),
    tx_size_left: Some(ep_size_left),
};

static EP_CM: fi_ops_cm = fi_ops_cm {
    size: std::mem::size_of::<fi_ops_cm>(),
    setname: Some(ep_setname),
    getname: Some(ep_getname),
    getpeer: Some(ep_getpeer),
    connect: Some(ep_connect),
    listen: Some(ep_listen),
    accept: Some(ep_accept),
    reject: Some(ep_reject),
    shutdown: Some(ep_shutdown),
    join: Some(ep_join),
};

static EP_MSG: fi_ops_msg = fi_ops_msg {
    size: std::mem::size_of::<fi_ops_msg>(),
    recv: Some(msg_recv),
    recvv: Some(msg_recvv),
    recvmsg: Some(msg_recvmsg),
    send: Some(msg_send),
    sendv: Some(msg_sendv),
    sendmsg: Some(msg_sendmsg),
    inject: Some(msg_inject),
    senddata: Some(msg_senddata),
    injectdata: Some(msg_injectdata),
};

static EP_TAGGED: fi_ops_tagged = fi_ops_tagged {
    size: std::mem::size_of::<fi_ops_tagged>(),
    recv: Some(tagged_recv),
    recvv: Some(tagged_recvv),
    recvmsg: Some(tagged_recvmsg),
    send: Some(tagged_send),
    sendv: Some(tagged_sendv),
    sendmsg: Some(tagged_sendmsg),
    inject: Some(tagged_inject),
    senddata: Some(tagged_senddata),
    injectdata: Some(tagged_injectdata),
};

unsafe extern "C" fn not_offered() -> isize {
    -(FI_ENOSYS as isize)
}

static EP_RMA: fi_ops_rma = fi_ops_rma {
    size: std::mem::size_of::<fi_ops_rma>(),
    read: Some(rma_read),
    readv: Some(rma_readv),
    readmsg: Some(rma_readmsg),
    write: Some(rma_write),
    writev: Some(rma_writev),
    writemsg: Some(rma_writemsg),
    inject: Some(rma_inject),
    writedata: Some(rma_writedata),
    injectdata: Some(rma_injectdata),
};
static EP_ATOMIC: fi_ops_atomic = fi_ops_none {
    size: std::mem::size_of::<fi_ops_atomic>(),
    ops: [Some(not_offered); 13],
};
static EP_COLLECTIVE: fi_ops_collective = fi_ops_none {
    size: std::mem::size_of::<fi_ops_collective>(),
    ops: [Some(not_offered); 11],
};

unsafe extern "C" fn endpoint(
    domain: *mut fid_domain,
    info: *mut fi_info,
    out: *mut Opaque,
    context: Opaque,
) -> c_int {
    guard(|| {
        if domain.is_null() || out.is_null() {
            return -FI_EINVAL;
        }
        // SAFETY: null or a valid info with null or valid attributes.
        let info = unsafe { info.as_ref() };
        if let Some(a) = info.and_then(|i| unsafe { i.ep_attr.as_ref() }) {
            if !matches!(a.type_, FI_EP_UNSPEC | FI_EP_RDM) {
                return -FI_EINVAL;
            }
        }
        let rx = info.and_then(|i| unsafe { i.rx_attr.as_ref() });
        let tx = info.and_then(|i| unsafe { i.tx_attr.as_ref() });
        let directed =
            (info.map_or(0, |i| i.caps) | rx.map_or(0, |a| a.caps)) & FI_DIRECTED_RECV != 0;
        let default_completion = (
            tx.is_some_and(|a| a.op_flags & FI_COMPLETION != 0),
            rx.is_some_and(|a| a.op_flags & FI_COMPLETION != 0),
        );
        let asked_delivery = tx.is_some_and(|a| a.op_flags & FI_DELIVERY_COMPLETE != 0);
        let multi_by_default = rx.is_some_and(|a| a.op_flags & FI_MULTI_RECV != 0);
        // SAFETY: the head of the `Domain` this provider opened.
        let d = unsafe { &*domain.cast::<Domain>() };
        // The mailbox a service names (`fi_getinfo` with FI_SOURCE): the endpoint is
        // where its peers were told it is, or it is not opened.
        // SAFETY: null or a valid info, as above.
        let vi = match unsafe { info_src(info.map_or(ptr::null(), |i| i as *const fi_info)) } {
            Err(e) => return e,
            Ok(None) => None,
            Ok(Some(a)) => {
                let me = (d.addressing.here, d.attachment.rank());
                if a.node != me.0 || (a.rank != av::ANY && a.rank != me.1) {
                    tracing::info!(
                        "exanet-fi: fi_endpoint: source {} is not this domain's (rank {} of {})",
                        d.addressing.text(a),
                        me.1,
                        d.addressing.node_name(me.0)
                    );
                    return -FI_EINVAL;
                }
                (a.vi != av::ANY).then_some(a.vi)
            }
        };
        let ep = match Endpoint::open(
            Arc::clone(&d.attachment),
            vi,
            directed,
            default_completion,
            asked_delivery || d.delivery_complete,
            d.eager_limit,
            Arc::new(AppRegions(Arc::clone(&d.regions))),
        ) {
            Ok(ep) => ep,
            Err(e) => {
                tracing::info!("exanet-fi: fi_endpoint: {e}");
                // The service's mailbox is another endpoint's.
                return if vi.is_some() {
                    -FI_EADDRINUSE
                } else {
                    -FI_ENOMEM
                };
            }
        };
        let obj = EpObj {
            head: fid_ep {
                fid: fid {
                    fclass: FI_CLASS_EP,
                    context,
                    ops: ptr::addr_of!(EP_FID_OPS).cast_mut(),
                },
                ops: ptr::addr_of!(EP_OPS).cast_mut(),
                cm: ptr::addr_of!(EP_CM).cast_mut(),
                msg: ptr::addr_of!(EP_MSG).cast_mut(),
                rma: ptr::addr_of!(EP_RMA).cast_mut(),
                tagged: ptr::addr_of!(EP_TAGGED).cast_mut(),
                atomic: ptr::addr_of!(EP_ATOMIC).cast_mut(),
                collective: ptr::addr_of!(EP_COLLECTIVE).cast_mut(),
            },
            ep,
            multi_by_default,
        };
        // SAFETY: `out` checked; `EpObj` starts with its `fid_ep`.
        unsafe { hand_out(obj, out) }
    })
}

/// The endpoint behind `f` (a `fid` or `fid_ep` head).
///
/// # Safety
/// `f` is null or the head of an open `EpObj`.
unsafe fn ep_of<'a, T>(f: *mut T) -> Option<&'a Arc<Endpoint>> {
    // SAFETY: as the caller guarantees.
    unsafe { f.cast::<EpObj>().as_ref() }.map(|o| &o.ep)
}

unsafe extern "C" fn ep_close(f: *mut fid) -> c_int {
    // SAFETY: libfabric closes what this provider opened, once; until then it is ours.
    if let Some(ep) = unsafe { ep_of(f) } {
        let _ = catch_unwind(AssertUnwindSafe(|| ep.linger()));
    }
    // SAFETY: as above.
    unsafe { close_boxed::<EpObj>(f) }
}

unsafe extern "C" fn ep_bind(f: *mut fid, b: *mut fid, flags: u64) -> c_int {
    guard(|| {
        // SAFETY: libfabric passes an endpoint of this provider and an object to bind.
        let (Some(ep), Some(obj)) = (unsafe { ep_of(f) }, unsafe { b.as_ref() }) else {
            return -FI_EINVAL;
        };
        match obj.fclass {
            FI_CLASS_AV => {
                // SAFETY: an object of class AV of this provider is an `AvObj`.
                let av = unsafe { &*b.cast::<AvObj>() };
                ep.bind_av(Arc::clone(&av.av));
                0
            }
            FI_CLASS_CQ => {
                // SAFETY: an object of class CQ of this provider is a `CqObj`.
                let cq = unsafe { &*b.cast::<CqObj>() };
                let (tx, rx) = (flags & FI_TRANSMIT != 0, flags & FI_RECV != 0);
                if !tx && !rx {
                    return -FI_EINVAL;
                }
                let selective = flags & FI_SELECTIVE_COMPLETION != 0;
                ep.bind_cq(Arc::clone(&cq.cq), tx, rx, selective);
                0
            }
            FI_CLASS_CNTR => {
                // SAFETY: an object of class CNTR of this provider is a `CntrObj`.
                let c = unsafe { &*b.cast::<CntrObj>() };
                match ep.bind_cntr(Arc::clone(&c.cntr), flags) {
                    Ok(()) => 0,
                    Err(e) => -e,
                }
            }
            FI_CLASS_EQ => 0,
            _ => -FI_ENOSYS,
        }
    })
}

unsafe extern "C" fn ep_control(f: *mut fid, command: c_int, _arg: *mut c_void) -> c_int {
    guard(|| {
        // SAFETY: libfabric passes an endpoint of this provider.
        let Some(ep) = (unsafe { ep_of(f) }) else {
            return -FI_EINVAL;
        };
        match command {
            FI_ENABLE => match ep.enable() {
                Ok(()) => 0,
                Err(e) => -e,
            },
            _ => -FI_ENOSYS,
        }
    })
}

unsafe extern "C" fn ep_cancel(f: *mut fid, context: *mut c_void) -> isize {
    catch_unwind(AssertUnwindSafe(|| {
        // SAFETY: libfabric passes an endpoint of this provider.
        let Some(ep) = (unsafe { ep_of(f) }) else {
            return -(FI_EINVAL as isize);
        };
        if ep.cancel(context as usize) {
            0
        } else {
            -(FI_ENOENT as isize)
        }
    }))
    .unwrap_or(-(FI_EIO as isize))
}

unsafe extern "C" fn ep_getopt(
    f: *mut fid,
    level: c_int,
    name: c_int,
    val: *mut c_void,
    len: *mut usize,
) -> c_int {
    guard(|| {
        // SAFETY: libfabric passes an endpoint of this provider.
        let Some(ep) = (unsafe { ep_of(f) }) else {
            return -FI_EINVAL;
        };
        if (level, name) != (FI_OPT_ENDPOINT, FI_OPT_MIN_MULTI_RECV) {
            return -FI_ENOPROTOOPT;
        }
        if val.is_null() || len.is_null() {
            return -FI_EINVAL;
        }
        // SAFETY: non-null, as the application passes it.
        if unsafe { *len } < size_of::<usize>() {
            return -FI_ETOOSMALL;
        }
        // SAFETY: room for a size_t, checked above; the caller's alignment.
        unsafe {
            val.cast::<usize>().write_unaligned(ep.min_multi_recv());
            *len = size_of::<usize>();
        }
        0
    })
}
unsafe extern "C" fn ep_setopt(
    f: *mut fid,
    level: c_int,
    name: c_int,
    val: *const c_void,
    len: usize,
) -> c_int {
    guard(|| {
        // SAFETY: libfabric passes an endpoint of this provider.
        let Some(ep) = (unsafe { ep_of(f) }) else {
            return -FI_EINVAL;
        };
        if (level, name) != (FI_OPT_ENDPOINT, FI_OPT_MIN_MULTI_RECV) {
            return -FI_ENOPROTOOPT;
        }
        if val.is_null() || len != size_of::<usize>() {
            return -FI_EINVAL;
        }
        // SAFETY: a size_t, as the length says; the caller's alignment.
        ep.set_min_multi_recv(unsafe { val.cast::<usize>().read_unaligned() });
        0
    })
}
unsafe extern "C" fn ep_no_tx_ctx(
    _: *mut fid_ep,
    _: c_int,
    _: *mut fi_tx_attr,
    _: *mut *mut fid_ep,
    _: Opaque,
) -> c_int {
    -FI_ENOSYS
}
unsafe extern "C" fn ep_no_rx_ctx(
    _: *mut fid_ep,
    _: c_int,
    _: *mut fi_rx_attr,
    _: *mut *mut fid_ep,
    _: Opaque,
) -> c_int {
    -FI_ENOSYS
}
unsafe extern "C" fn ep_size_left(_: *mut fid_ep) -> isize {
    offer::QUEUE_SIZE as isize
}

unsafe extern "C" fn ep_getname(f: *mut fid, addr: *mut c_void, addrlen: *mut usize) -> c_int {
    guard(|| {
        // SAFETY: libfabric passes an endpoint of this provider.
        let Some(ep) = (unsafe { ep_of(f) }) else {
            return -FI_EINVAL;
        };
        if addrlen.is_null() {
            return -FI_EINVAL;
        }
        let b = av::encode(ep.name());
        // SAFETY: non-null, readable and writable.
        let room = unsafe { *addrlen };
        // SAFETY: as above.
        unsafe { *addrlen = b.len() };
        if room < b.len() || addr.is_null() {
            return -FI_ETOOSMALL;
        }
        // SAFETY: room for the address.
        unsafe { ptr::copy_nonoverlapping(b.as_ptr(), addr.cast(), b.len()) };
        0
    })
}

unsafe extern "C" fn ep_setname(_: *mut fid, _: *mut c_void, _: usize) -> c_int {
    -FI_ENOSYS
}
unsafe extern "C" fn ep_getpeer(_: *mut fid_ep, _: *mut c_void, _: *mut usize) -> c_int {
    -FI_ENOSYS
}
unsafe extern "C" fn ep_connect(
    _: *mut fid_ep,
    _: *const c_void,
    _: *const c_void,
    _: usize,
) -> c_int {
    -FI_ENOSYS
}
unsafe extern "C" fn ep_listen(_: Opaque) -> c_int {
    -FI_ENOSYS
}
unsafe extern "C" fn ep_accept(_: *mut fid_ep, _: *const c_void, _: usize) -> c_int {
    -FI_ENOSYS
}
unsafe extern "C" fn ep_reject(_: Opaque, _: *mut fid, _: *const c_void, _: usize) -> c_int {
    -FI_ENOSYS
}
unsafe extern "C" fn ep_shutdown(_: *mut fid_ep, _: u64) -> c_int {
    -FI_ENOSYS
}
unsafe extern "C" fn ep_join(
    _: *mut fid_ep,
    _: *const c_void,
    _: u64,
    _: *mut Opaque,
    _: Opaque,
) -> c_int {
    -FI_ENOSYS
}

/// A send of `len` bytes at `buf`.
///
/// # Safety
/// `ep` is an endpoint of this provider; `buf` is null with `len` 0 or readable for `len`.
#[allow(clippy::too_many_arguments)] // the union of libfabric's send calls
unsafe fn do_send(
    ep: *mut fid_ep,
    buf: *const c_void,
    len: usize,
    dest: u64,
    tag: Option<u64>,
    data: Option<u64>,
    context: *mut c_void,
    completes: Completes,
) -> isize {
    catch_unwind(AssertUnwindSafe(|| {
        // SAFETY: as the caller guarantees.
        let Some(e) = (unsafe { ep_of(ep) }) else {
            return -(FI_EINVAL as isize);
        };
        if completes == Completes::Never && len > offer::INJECT_SIZE {
            return -(FI_EMSGSIZE as isize);
        }
        if len > offer::MAX_MSG_SIZE {
            return -(FI_EMSGSIZE as isize);
        }
        // SAFETY: as the caller guarantees; copied before the call returns.
        let bytes = unsafe { bytes(buf, len) };
        errno(e.send(dest, bytes, tag, data, context as usize, completes))
    }))
    .unwrap_or(-(FI_EIO as isize))
}

/// A receive into `len` bytes at `buf`.
///
/// # Safety
/// `ep` is an endpoint of this provider; `buf` is null with `len` 0, or writable for
/// `len` bytes until the receive completes.
unsafe fn do_recv(
    ep: *mut fid_ep,
    buf: *mut c_void,
    len: usize,
    src: u64,
    tag: Option<(u64, u64)>,
    context: *mut c_void,
    completes: Completes,
) -> isize {
    catch_unwind(AssertUnwindSafe(|| {
        // SAFETY: as the caller guarantees.
        let Some(o) = (unsafe { ep.cast::<EpObj>().as_ref() }) else {
            return -(FI_EINVAL as isize);
        };
        // SAFETY: as the caller guarantees.
        let ub = unsafe { UserBuf::new(buf, len) };
        if tag.is_none() && o.multi_by_default && matches!(completes, Completes::ByDefault) {
            return errno(o.ep.recv_multi(src, Box::new(ub), context as usize, completes));
        }
        errno(o.ep.recv(src, Box::new(ub), tag, context as usize, completes))
    }))
    .unwrap_or(-(FI_EIO as isize))
}

unsafe extern "C" fn msg_recv(
    ep: *mut fid_ep,
    buf: *mut c_void,
    len: usize,
    _desc: Opaque,
    src: u64,
    context: Opaque,
) -> isize {
    // SAFETY: as the application passes them.
    unsafe { do_recv(ep, buf, len, src, None, context, Completes::ByDefault) }
}

unsafe extern "C" fn msg_recvv(
    ep: *mut fid_ep,
    iov: *const libc::iovec,
    _desc: *mut Opaque,
    count: usize,
    src: u64,
    context: Opaque,
) -> isize {
    // SAFETY: as the application passes them.
    match unsafe { one_iov(iov, count) } {
        Ok((buf, len)) => unsafe {
            do_recv(ep, buf, len, src, None, context, Completes::ByDefault)
        },
        Err(e) => e as isize,
    }
}

unsafe extern "C" fn msg_recvmsg(ep: *mut fid_ep, msg: *const fi_msg, flags: u64) -> isize {
    // SAFETY: null or a valid message, as the application passes it.
    let Some(m) = (unsafe { msg.as_ref() }) else {
        return -(FI_EINVAL as isize);
    };
    // SAFETY: as the application passes them.
    let (buf, len) = match unsafe { one_iov(m.msg_iov, m.iov_count) } {
        Ok(b) => b,
        Err(e) => return e as isize,
    };
    if flags & FI_MULTI_RECV != 0 {
        return catch_unwind(AssertUnwindSafe(|| {
            // SAFETY: libfabric passes an endpoint of this provider.
            let Some(e) = (unsafe { ep_of(ep) }) else {
                return -(FI_EINVAL as isize);
            };
            // SAFETY: as the application passes them.
            let ub = unsafe { UserBuf::new(buf, len) };
            errno(e.recv_multi(
                m.addr,
                Box::new(ub),
                m.context as usize,
                Completes::Flagged(flags),
            ))
        }))
        .unwrap_or(-(FI_EIO as isize));
    }
    // SAFETY: as the application passes them.
    unsafe {
        do_recv(
            ep,
            buf,
            len,
            m.addr,
            None,
            m.context,
            Completes::Flagged(flags),
        )
    }
}

unsafe extern "C" fn msg_send(
    ep: *mut fid_ep,
    buf: *const c_void,
    len: usize,
    _desc: Opaque,
    dest: u64,
    context: Opaque,
) -> isize {
    // SAFETY: as the application passes them.
    unsafe {
        do_send(
            ep,
            buf,
            len,
            dest,
            None,
            None,
            context,
            Completes::ByDefault,
        )
    }
}

unsafe extern "C" fn msg_sendv(
    ep: *mut fid_ep,
    iov: *const libc::iovec,
    _desc: *mut Opaque,
    count: usize,
    dest: u64,
    context: Opaque,
) -> isize {
    // SAFETY: as the application passes them.
    match unsafe { one_iov(iov, count) } {
        Ok((buf, len)) => unsafe {
            do_send(
                ep,
                buf,
                len,
                dest,
                None,
                None,
                context,
                Completes::ByDefault,
            )
        },
        Err(e) => e as isize,
    }
}

unsafe extern "C" fn msg_sendmsg(ep: *mut fid_ep, msg: *const fi_msg, flags: u64) -> isize {
    // SAFETY: null or a valid message, as the application passes it.
    let Some(m) = (unsafe { msg.as_ref() }) else {
        return -(FI_EINVAL as isize);
    };
    let data = (flags & FI_REMOTE_CQ_DATA != 0).then_some(m.data);
    // SAFETY: as the application passes them.
    match unsafe { one_iov(m.msg_iov, m.iov_count) } {
        Ok((buf, len)) => unsafe {
            do_send(
                ep,
                buf,
                len,
                m.addr,
                None,
                data,
                m.context,
                msg_completes(flags),
            )
        },
        Err(e) => e as isize,
    }
}

unsafe extern "C" fn msg_inject(
    ep: *mut fid_ep,
    buf: *const c_void,
    len: usize,
    dest: u64,
) -> isize {
    // SAFETY: as the application passes them.
    unsafe {
        do_send(
            ep,
            buf,
            len,
            dest,
            None,
            None,
            ptr::null_mut(),
            Completes::Never,
        )
    }
}

unsafe extern "C" fn msg_senddata(
    ep: *mut fid_ep,
    buf: *const c_void,
    len: usize,
    _desc: Opaque,
    data: u64,
    dest: u64,
    context: Opaque,
) -> isize {
    // SAFETY: as the application passes them.
    unsafe {
        do_send(
            ep,
            buf,
            len,
            dest,
            None,
            Some(data),
            context,
            Completes::ByDefault,
        )
    }
}

unsafe extern "C" fn msg_injectdata(
    ep: *mut fid_ep,
    buf: *const c_void,
    len: usize,
    data: u64,
    dest: u64,
) -> isize {
    // SAFETY: as the application passes them.
    unsafe {
        do_send(
            ep,
            buf,
            len,
            dest,
            None,
            Some(data),
            ptr::null_mut(),
            Completes::Never,
        )
    }
}

#[allow(clippy::too_many_arguments)] // libfabric's signature
unsafe extern "C" fn tagged_recv(
    ep: *mut fid_ep,
    buf: *mut c_void,
    len: usize,
    _desc: Opaque,
    src: u64,
    tag: u64,
    ignore: u64,
    context: Opaque,
) -> isize {
    // SAFETY: as the application passes them.
    unsafe {
        do_recv(
            ep,
            buf,
            len,
            src,
            Some((tag, ignore)),
            context,
            Completes::ByDefault,
        )
    }
}

#[allow(clippy::too_many_arguments)] // libfabric's signature
unsafe extern "C" fn tagged_recvv(
    ep: *mut fid_ep,
    iov: *const libc::iovec,
    _desc: *mut Opaque,
    count: usize,
    src: u64,
    tag: u64,
    ignore: u64,
    context: Opaque,
) -> isize {
    // SAFETY: as the application passes them.
    match unsafe { one_iov(iov, count) } {
        Ok((buf, len)) => unsafe {
            do_recv(
                ep,
                buf,
                len,
                src,
                Some((tag, ignore)),
                context,
                Completes::ByDefault,
            )
        },
        Err(e) => e as isize,
    }
}

unsafe extern "C" fn tagged_recvmsg(
    ep: *mut fid_ep,
    msg: *const fi_msg_tagged,
    flags: u64,
) -> isize {
    catch_unwind(AssertUnwindSafe(|| {
        // SAFETY: null or a valid message, as the application passes it.
        let Some(m) = (unsafe { msg.as_ref() }) else {
            return -(FI_EINVAL as isize);
        };
        // SAFETY: libfabric passes an endpoint of this provider.
        let Some(e) = (unsafe { ep_of(ep) }) else {
            return -(FI_EINVAL as isize);
        };
        let tag = Some((m.tag, m.ignore));
        let completes = Completes::Flagged(flags);
        // A claim travels in the application's `struct fi_context` (libfabric's rule for
        // FI_CLAIM), as its number plus one in the first word.
        let ctx = m.context.cast::<fi_context>();
        if flags & FI_PEEK != 0 {
            let probe = match (flags & FI_CLAIM != 0, flags & FI_DISCARD != 0) {
                (true, _) => Probe::Claim,
                (false, true) => Probe::Discard,
                (false, false) => Probe::Peek,
            };
            if probe == Probe::Claim && ctx.is_null() {
                return -(FI_EINVAL as isize);
            }
            return match e.probe(m.addr, tag, m.context as usize, probe) {
                Ok(Some(claim)) => {
                    // SAFETY: a `struct fi_context`, as FI_CLAIM requires.
                    unsafe { (*ctx).internal[0] = (claim + 1) as *mut c_void };
                    0
                }
                Ok(None) => 0,
                Err(n) => -(n as isize),
            };
        }
        if flags & FI_CLAIM != 0 {
            if ctx.is_null() {
                return -(FI_EINVAL as isize);
            }
            // SAFETY: the `struct fi_context` the claiming probe wrote.
            let claim = unsafe { (*ctx).internal[0] } as u64;
            if claim == 0 {
                return -(FI_EINVAL as isize);
            }
            let buf: Box<dyn RecvBuf> = if flags & FI_DISCARD != 0 {
                Box::new(NoBuf)
            } else {
                // SAFETY: as the application passes them.
                match unsafe { one_iov(m.msg_iov, m.iov_count) } {
                    Ok((buf, len)) => Box::new(unsafe { UserBuf::new(buf, len) }),
                    Err(n) => return n as isize,
                }
            };
            return errno(e.recv_claimed(claim - 1, buf, true, m.context as usize, completes));
        }
        // SAFETY: as the application passes them.
        match unsafe { one_iov(m.msg_iov, m.iov_count) } {
            Ok((buf, len)) => unsafe { do_recv(ep, buf, len, m.addr, tag, m.context, completes) },
            Err(n) => n as isize,
        }
    }))
    .unwrap_or(-(FI_EIO as isize))
}

/// Whether a `*msg` send asks for a completion.
fn msg_completes(flags: u64) -> Completes {
    if flags & FI_INJECT != 0 {
        Completes::Never
    } else {
        Completes::Flagged(flags)
    }
}

#[allow(clippy::too_many_arguments)] // libfabric's signature
unsafe extern "C" fn tagged_send(
    ep: *mut fid_ep,
    buf: *const c_void,
    len: usize,
    _desc: Opaque,
    dest: u64,
    tag: u64,
    context: Opaque,
) -> isize {
    // SAFETY: as the application passes them.
    unsafe {
        do_send(
            ep,
            buf,
            len,
            dest,
            Some(tag),
            None,
            context,
            Completes::ByDefault,
        )
    }
}

#[allow(clippy::too_many_arguments)] // libfabric's signature
unsafe extern "C" fn tagged_sendv(
    ep: *mut fid_ep,
    iov: *const libc::iovec,
    _desc: *mut Opaque,
    count: usize,
    dest: u64,
    tag: u64,
    context: Opaque,
) -> isize {
    // SAFETY: as the application passes them.
    match unsafe { one_iov(iov, count) } {
        Ok((buf, len)) => unsafe {
            do_send(
                ep,
                buf,
                len,
                dest,
                Some(tag),
                None,
                context,
                Completes::ByDefault,
            )
        },
        Err(e) => e as isize,
    }
}

unsafe extern "C" fn tagged_sendmsg(
    ep: *mut fid_ep,
    msg: *const fi_msg_tagged,
    flags: u64,
) -> isize {
    // SAFETY: null or a valid message, as the application passes it.
    let Some(m) = (unsafe { msg.as_ref() }) else {
        return -(FI_EINVAL as isize);
    };
    let data = (flags & FI_REMOTE_CQ_DATA != 0).then_some(m.data);
    // SAFETY: as the application passes them.
    match unsafe { one_iov(m.msg_iov, m.iov_count) } {
        Ok((buf, len)) => unsafe {
            do_send(
                ep,
                buf,
                len,
                m.addr,
                Some(m.tag),
                data,
                m.context,
                msg_completes(flags),
            )
        },
        Err(e) => e as isize,
    }
}

unsafe extern "C" fn tagged_inject(
    ep: *mut fid_ep,
    buf: *const c_void,
    len: usize,
    dest: u64,
    tag: u64,
) -> isize {
    // SAFETY: as the application passes them.
    unsafe {
        do_send(
            ep,
            buf,
            len,
            dest,
            Some(tag),
            None,
            ptr::null_mut(),
            Completes::Never,
        )
    }
}

#[allow(clippy::too_many_arguments)] // libfabric's signature
unsafe extern "C" fn tagged_senddata(
    ep: *mut fid_ep,
    buf: *const c_void,
    len: usize,
    _desc: Opaque,
    data: u64,
    dest: u64,
    tag: u64,
    context: Opaque,
) -> isize {
    // SAFETY: as the application passes them.
    unsafe {
        do_send(
            ep,
            buf,
            len,
            dest,
            Some(tag),
            Some(data),
            context,
            Completes::ByDefault,
        )
    }
}

unsafe extern "C" fn tagged_injectdata(
    ep: *mut fid_ep,
    buf: *const c_void,
    len: usize,
    data: u64,
    dest: u64,
    tag: u64,
) -> isize {
    // SAFETY: as the application passes them.
    unsafe {
        do_send(
            ep,
            buf,
            len,
            dest,
            Some(tag),
            Some(data),
            ptr::null_mut(),
            Completes::Never,
        )
    }
}

// ---- One-sided operations ---------------------------------------------------------------

/// An RMA write of `len` bytes at `buf` to `target` of `dest`.
///
/// # Safety
/// `ep` is an endpoint of this provider; `buf` null with `len` 0, or readable for `len`
/// bytes for the call (the bytes are copied before it returns).
unsafe fn do_write(
    ep: *mut fid_ep,
    buf: *const c_void,
    len: usize,
    dest: u64,
    target: RmaTarget,
    context: *mut c_void,
    completes: Completes,
) -> isize {
    catch_unwind(AssertUnwindSafe(|| {
        // SAFETY: as the caller guarantees.
        let Some(e) = (unsafe { ep_of(ep) }) else {
            return -(FI_EINVAL as isize);
        };
        if (completes == Completes::Never && len > offer::INJECT_SIZE) || len > offer::MAX_MSG_SIZE
        {
            return -(FI_EMSGSIZE as isize);
        }
        // SAFETY: as the caller guarantees.
        let bytes = unsafe { bytes(buf, len) };
        errno(e.rma_write(dest, bytes, target, context as usize, completes))
    }))
    .unwrap_or(-(FI_EIO as isize))
}

/// An RMA read of `len` bytes at `target` of `src` into `buf`.
///
/// # Safety
/// `ep` is an endpoint of this provider; `buf` null with `len` 0, or writable for `len`
/// bytes until the read completes.
unsafe fn do_read(
    ep: *mut fid_ep,
    buf: *mut c_void,
    len: usize,
    src: u64,
    target: RmaTarget,
    context: *mut c_void,
    completes: Completes,
) -> isize {
    catch_unwind(AssertUnwindSafe(|| {
        // SAFETY: as the caller guarantees.
        let Some(e) = (unsafe { ep_of(ep) }) else {
            return -(FI_EINVAL as isize);
        };
        if len > offer::MAX_MSG_SIZE {
            return -(FI_EMSGSIZE as isize);
        }
        // SAFETY: as the caller guarantees: writable until the read completes.
        let dst = Box::new(unsafe { UserBuf::new(buf, len) });
        errno(e.rma_read(src, dst, target, context as usize, completes))
    }))
    .unwrap_or(-(FI_EIO as isize))
}

/// What an RMA `*msg` call names: its message, its one local buffer and its one target
/// (`iov_limit` and `rma_iov_limit` are 1), of the same length.
///
/// # Safety
/// `msg` is null or a valid message whose iovec arrays hold the counts it gives.
unsafe fn rma_msg<'a>(
    msg: *const fi_msg_rma,
) -> Result<(&'a fi_msg_rma, *mut c_void, usize, RmaTarget), isize> {
    // SAFETY: as the caller guarantees.
    let m = unsafe { msg.as_ref() }.ok_or(-(FI_EINVAL as isize))?;
    if m.rma_iov_count != 1 || m.rma_iov.is_null() {
        return Err(-(FI_EINVAL as isize));
    }
    // SAFETY: one entry, as the caller guarantees.
    let r = unsafe { &*m.rma_iov };
    // SAFETY: as the caller guarantees.
    let (buf, len) = unsafe { one_iov(m.msg_iov, m.iov_count) }.map_err(|e| e as isize)?;
    if r.len != len {
        return Err(-(FI_EINVAL as isize));
    }
    let target = RmaTarget {
        key: r.key,
        addr: r.addr,
    };
    Ok((m, buf, len, target))
}

#[allow(clippy::too_many_arguments)] // libfabric's signature
unsafe extern "C" fn rma_read(
    ep: *mut fid_ep,
    buf: *mut c_void,
    len: usize,
    _desc: Opaque,
    src: u64,
    addr: u64,
    key: u64,
    context: Opaque,
) -> isize {
    let target = RmaTarget { key, addr };
    // SAFETY: as the application passes them.
    unsafe { do_read(ep, buf, len, src, target, context, Completes::ByDefault) }
}

#[allow(clippy::too_many_arguments)] // libfabric's signature
unsafe extern "C" fn rma_readv(
    ep: *mut fid_ep,
    iov: *const libc::iovec,
    _desc: *mut Opaque,
    count: usize,
    src: u64,
    addr: u64,
    key: u64,
    context: Opaque,
) -> isize {
    let target = RmaTarget { key, addr };
    // SAFETY: as the application passes them.
    match unsafe { one_iov(iov, count) } {
        Ok((buf, len)) => unsafe {
            do_read(ep, buf, len, src, target, context, Completes::ByDefault)
        },
        Err(e) => e as isize,
    }
}

unsafe extern "C" fn rma_readmsg(ep: *mut fid_ep, msg: *const fi_msg_rma, flags: u64) -> isize {
    // SAFETY: as the application passes it.
    match unsafe { rma_msg(msg) } {
        // SAFETY: as the application passes them.
        Ok((m, buf, len, target)) => unsafe {
            do_read(
                ep,
                buf,
                len,
                m.addr,
                target,
                m.context,
                msg_completes(flags),
            )
        },
        Err(e) => e,
    }
}

#[allow(clippy::too_many_arguments)] // libfabric's signature
unsafe extern "C" fn rma_write(
    ep: *mut fid_ep,
    buf: *mut c_void,
    len: usize,
    _desc: Opaque,
    dest: u64,
    addr: u64,
    key: u64,
    context: Opaque,
) -> isize {
    let target = RmaTarget { key, addr };
    // SAFETY: as the application passes them.
    unsafe { do_write(ep, buf, len, dest, target, context, Completes::ByDefault) }
}

#[allow(clippy::too_many_arguments)] // libfabric's signature
unsafe extern "C" fn rma_writev(
    ep: *mut fid_ep,
    iov: *const libc::iovec,
    _desc: *mut Opaque,
    count: usize,
    dest: u64,
    addr: u64,
    key: u64,
    context: Opaque,
) -> isize {
    let target = RmaTarget { key, addr };
    // SAFETY: as the application passes them.
    match unsafe { one_iov(iov, count) } {
        Ok((buf, len)) => unsafe {
            do_write(ep, buf, len, dest, target, context, Completes::ByDefault)
        },
        Err(e) => e as isize,
    }
}

unsafe extern "C" fn rma_writemsg(ep: *mut fid_ep, msg: *const fi_msg_rma, flags: u64) -> isize {
    if flags & FI_REMOTE_CQ_DATA != 0 {
        // Remote CQ data with a write is not offered (nor in what fi_getinfo says).
        return -(FI_ENOSYS as isize);
    }
    // SAFETY: as the application passes it.
    match unsafe { rma_msg(msg) } {
        // SAFETY: as the application passes them.
        Ok((m, buf, len, target)) => unsafe {
            do_write(
                ep,
                buf,
                len,
                m.addr,
                target,
                m.context,
                msg_completes(flags),
            )
        },
        Err(e) => e,
    }
}

unsafe extern "C" fn rma_inject(
    ep: *mut fid_ep,
    buf: *const c_void,
    len: usize,
    dest: u64,
    addr: u64,
    key: u64,
) -> isize {
    let target = RmaTarget { key, addr };
    // SAFETY: as the application passes them.
    unsafe {
        do_write(
            ep,
            buf,
            len,
            dest,
            target,
            ptr::null_mut(),
            Completes::Never,
        )
    }
}

// Remote CQ data with a write is not offered: these answer -FI_ENOSYS.
#[allow(clippy::too_many_arguments)] // libfabric's signature
unsafe extern "C" fn rma_writedata(
    _: *mut fid_ep,
    _: *const c_void,
    _: usize,
    _: Opaque,
    _: u64,
    _: u64,
    _: u64,
    _: u64,
    _: Opaque,
) -> isize {
    -(FI_ENOSYS as isize)
}
unsafe extern "C" fn rma_injectdata(
    _: *mut fid_ep,
    _: *const c_void,
    _: usize,
    _: u64,
    _: u64,
    _: u64,
    _: u64,
) -> isize {
    -(FI_ENOSYS as isize)
}
