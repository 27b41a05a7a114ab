//! The MPI calls themselves, interposed under `exactl mpirun --modeled` (which preloads
//! this library ahead of the MPI library; loaded by libfabric alone, these symbols
//! interpose nothing): each holds the rank's attachment for its whole call
//! (`exanet::Endpoint::hold`), so that the MPI library's own processing between its calls
//! into the provider is the library's time, modeled by the rack's `software_ns` per call,
//! and not the application's compute. Without it, Open MPI's processing counted at this
//! host's CPU time on top of `software_ns`: an 8 B ping-pong modeled 2.8 to 3.8 us one-way
//! against 1.31 without compute (docs/mpi.md).
//!
//! Each wrapper forwards its arguments untouched to the `PMPI_` entry point the MPI
//! library exports (MPI's profiling interface, found with `dlsym(RTLD_NEXT)`). The
//! arguments are passed as machine words: every argument of these calls is a pointer or
//! an integer handle (`MPI_Comm` is a pointer in Open MPI and an `int` in MPICH), which
//! the C calling conventions of x86-64 and AArch64 pass in a register or an 8-byte stack
//! slot alike, so one wrapper serves both libraries. Calls not listed here are not held:
//! their processing counts as compute, as before. A program whose threads call MPI at
//! once (`MPI_THREAD_MULTIPLE`): while one thread is inside a held call, another's
//! compute is not counted (the client library counts compute where no call is under way).

use std::ffi::{c_int, CStr};
use std::sync::OnceLock;

/// `MPI_ERR_OTHER` is 16 in Open MPI and 15 in MPICH; any nonzero code is an error. It
/// is returned only where the MPI library's `PMPI_` entry cannot be found from here: an
/// MPI library loaded privately (`dlopen` with `RTLD_LOCAL`, as some language bindings
/// do) is not searched by `RTLD_NEXT`. Said once on standard error.
const NO_PMPI: c_int = 16;

/// The next definition of `name` (NUL-terminated) after this library's: the MPI
/// library's.
fn next(name: &'static [u8]) -> Option<usize> {
    let name = CStr::from_bytes_with_nul(name).ok()?;
    // SAFETY: `name` is NUL-terminated; RTLD_NEXT searches the objects loaded after
    // this one, which dlsym allows from any shared object.
    let f = unsafe { libc::dlsym(libc::RTLD_NEXT, name.as_ptr()) };
    (!f.is_null()).then_some(f as usize)
}

/// Found once; not found, looked for again at the next call (and said once).
fn entry(cache: &OnceLock<usize>, name: &'static [u8]) -> Option<usize> {
    if let Some(&f) = cache.get() {
        return Some(f);
    }
    match next(name) {
        Some(f) => Some(*cache.get_or_init(|| f)),
        None => {
            static SAID: std::sync::Once = std::sync::Once::new();
            SAID.call_once(|| {
                let name = String::from_utf8_lossy(&name[..name.len() - 1]);
                eprintln!(
                    "exanet-fi: no {name} after this library (an MPI library loaded \
                     privately?): MPI calls made through it fail"
                );
            });
            None
        }
    }
}

/// The attachment held for an MPI call, if a domain is open; none if holding fails
/// (a thread whose thread-locals are gone, at its exit): the call then goes on unheld
/// rather than abort the program.
fn hold(attachment: &Option<std::sync::Arc<exanet::Endpoint>>) -> Option<exanet::Held<'_>> {
    let a = attachment.as_ref()?;
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| a.hold())).ok()
}

macro_rules! interpose {
    ($($name:ident => $pmpi:literal ($($a:ident),*);)*) => {$(
        // "C-unwind": a C++ MPI library's error handler may throw through the call.
        #[no_mangle]
        pub extern "C-unwind" fn $name($($a: usize),*) -> c_int {
            type Pmpi = unsafe extern "C-unwind" fn($(interpose!(@word $a)),*) -> c_int;
            static PMPI: OnceLock<usize> = OnceLock::new();
            let Some(f) = entry(&PMPI, $pmpi) else {
                return NO_PMPI;
            };
            // SAFETY: `f` is the MPI library's entry point of the same name with a `P`
            // before it, which MPI defines with the same parameters as this one; each is
            // a pointer or an integer, passed as a machine word in the same place.
            let pmpi: Pmpi = unsafe { std::mem::transmute::<usize, Pmpi>(f) };
            let attachment = crate::provider::modeled_attachment();
            let _held = hold(&attachment);
            // SAFETY: the program's arguments, untouched, to the call it made.
            unsafe { pmpi($($a),*) }
        }
    )*};
    (@word $a:ident) => { usize };
}

interpose! {
    MPI_Send => b"PMPI_Send\0" (buf, count, datatype, dest, tag, comm);
    MPI_Ssend => b"PMPI_Ssend\0" (buf, count, datatype, dest, tag, comm);
    MPI_Rsend => b"PMPI_Rsend\0" (buf, count, datatype, dest, tag, comm);
    MPI_Bsend => b"PMPI_Bsend\0" (buf, count, datatype, dest, tag, comm);
    MPI_Isend => b"PMPI_Isend\0" (buf, count, datatype, dest, tag, comm, request);
    MPI_Issend => b"PMPI_Issend\0" (buf, count, datatype, dest, tag, comm, request);
    MPI_Recv => b"PMPI_Recv\0" (buf, count, datatype, source, tag, comm, status);
    MPI_Irecv => b"PMPI_Irecv\0" (buf, count, datatype, source, tag, comm, request);
    MPI_Sendrecv => b"PMPI_Sendrecv\0" (
        sendbuf, sendcount, sendtype, dest, sendtag, recvbuf, recvcount, recvtype, source,
        recvtag, comm, status
    );
    MPI_Sendrecv_replace => b"PMPI_Sendrecv_replace\0" (
        buf, count, datatype, dest, sendtag, source, recvtag, comm, status
    );
    MPI_Probe => b"PMPI_Probe\0" (source, tag, comm, status);
    MPI_Iprobe => b"PMPI_Iprobe\0" (source, tag, comm, flag, status);
    MPI_Wait => b"PMPI_Wait\0" (request, status);
    MPI_Waitall => b"PMPI_Waitall\0" (count, requests, statuses);
    MPI_Waitany => b"PMPI_Waitany\0" (count, requests, index, status);
    MPI_Waitsome => b"PMPI_Waitsome\0" (incount, requests, outcount, indices, statuses);
    MPI_Test => b"PMPI_Test\0" (request, flag, status);
    MPI_Testall => b"PMPI_Testall\0" (count, requests, flag, statuses);
    MPI_Testany => b"PMPI_Testany\0" (count, requests, index, flag, status);
    MPI_Testsome => b"PMPI_Testsome\0" (incount, requests, outcount, indices, statuses);
    MPI_Start => b"PMPI_Start\0" (request);
    MPI_Startall => b"PMPI_Startall\0" (count, requests);
    MPI_Barrier => b"PMPI_Barrier\0" (comm);
    MPI_Bcast => b"PMPI_Bcast\0" (buf, count, datatype, root, comm);
    MPI_Reduce => b"PMPI_Reduce\0" (sendbuf, recvbuf, count, datatype, op, root, comm);
    MPI_Allreduce => b"PMPI_Allreduce\0" (sendbuf, recvbuf, count, datatype, op, comm);
    MPI_Reduce_scatter => b"PMPI_Reduce_scatter\0" (
        sendbuf, recvbuf, recvcounts, datatype, op, comm
    );
    MPI_Scan => b"PMPI_Scan\0" (sendbuf, recvbuf, count, datatype, op, comm);
    MPI_Gather => b"PMPI_Gather\0" (
        sendbuf, sendcount, sendtype, recvbuf, recvcount, recvtype, root, comm
    );
    MPI_Gatherv => b"PMPI_Gatherv\0" (
        sendbuf, sendcount, sendtype, recvbuf, recvcounts, displs, recvtype, root, comm
    );
    MPI_Scatter => b"PMPI_Scatter\0" (
        sendbuf, sendcount, sendtype, recvbuf, recvcount, recvtype, root, comm
    );
    MPI_Scatterv => b"PMPI_Scatterv\0" (
        sendbuf, sendcounts, displs, sendtype, recvbuf, recvcount, recvtype, root, comm
    );
    MPI_Allgather => b"PMPI_Allgather\0" (
        sendbuf, sendcount, sendtype, recvbuf, recvcount, recvtype, comm
    );
    MPI_Allgatherv => b"PMPI_Allgatherv\0" (
        sendbuf, sendcount, sendtype, recvbuf, recvcounts, displs, recvtype, comm
    );
    MPI_Alltoall => b"PMPI_Alltoall\0" (
        sendbuf, sendcount, sendtype, recvbuf, recvcount, recvtype, comm
    );
    MPI_Alltoallv => b"PMPI_Alltoallv\0" (
        sendbuf, sendcounts, sdispls, sendtype, recvbuf, recvcounts, rdispls, recvtype, comm
    );
}

/// How far past the latest rank's clock, at the end of `MPI_Init`, every rank's clock
/// starts: more than the aligning allreduce itself takes in modeled time (tens of
/// microseconds at 128 ranks), so that every rank lands on the same origin.
const START_SLACK: exanet::ModelTime = exanet::ModelTime(1_000_000_000);

/// The handles the aligning allreduce needs, in the MPI library's own representation:
/// Open MPI's are the addresses of its predefined objects, MPICH's fixed integers
/// (`mpi.h` of MPICH 4 and 5 alike).
struct Handles {
    world: usize,
    u64_type: usize,
    max: usize,
}

fn handles() -> Option<Handles> {
    let sym = |name: &'static [u8]| -> Option<usize> {
        let name = CStr::from_bytes_with_nul(name).ok()?;
        // SAFETY: `name` is NUL-terminated; RTLD_DEFAULT searches the global scope.
        let f = unsafe { libc::dlsym(libc::RTLD_DEFAULT, name.as_ptr()) };
        (!f.is_null()).then_some(f as usize)
    };
    match sym(b"ompi_mpi_comm_world\0") {
        Some(world) => Some(Handles {
            world,
            u64_type: sym(b"ompi_mpi_unsigned_long_long\0")?,
            max: sym(b"ompi_mpi_op_max\0")?,
        }),
        None => sym(b"MPIR_Init_thread\0")
            .or_else(|| sym(b"MPICH_Init\0"))
            .or_else(|| sym(b"MPIR_Err_return_comm\0"))
            .map(|_| Handles {
                world: 0x4400_0000,
                u64_type: 0x4c00_0819,
                max: 0x5800_0001,
            }),
    }
}

/// Starts every rank's modeled clock at one origin once `MPI_Init` is over: the latest
/// rank's clock then, and [`START_SLACK`]. A rank's clock starts at its attachment's
/// (the host time it attached at, so that it starts after what earlier programs left on
/// the rack), so without this, host launch skew (ranks attaching tens of milliseconds
/// apart) entered the first figures a program timed: a 16-rank program timing 100
/// allreduces without a barrier first measured 3.3 us to 5.3 ms per operation, different
/// every run. Nothing is done where the program is not on the NI or the MPI library is
/// not one this knows (said once).
fn start_together() {
    let Some(attachment) = crate::provider::modeled_attachment() else {
        return;
    };
    static ALLREDUCE: OnceLock<usize> = OnceLock::new();
    let (Some(h), Some(f)) = (handles(), entry(&ALLREDUCE, b"PMPI_Allreduce\0")) else {
        eprintln!(
            "exanet-fi: an MPI library this does not know: the ranks' modeled clocks start \
             where each attached (launch skew counts until their first exchange)"
        );
        return;
    };
    type Allreduce = unsafe extern "C-unwind" fn(usize, usize, usize, usize, usize, usize) -> c_int;
    // SAFETY: PMPI_Allreduce(sendbuf, recvbuf, count, datatype, op, comm), each a machine
    // word as in the wrappers above.
    let allreduce: Allreduce = unsafe { std::mem::transmute::<usize, Allreduce>(f) };
    let attachment = Some(attachment);
    let _held = hold(&attachment);
    let Some(attachment) = attachment.as_ref() else {
        return;
    };
    let mine: u64 = attachment.advance_clock(exanet::ModelTime::ZERO).ps();
    let mut latest: u64 = 0;
    // SAFETY: two live u64s, one element of the library's unsigned long long (64 bits on
    // the targets this builds for), MPI_MAX, MPI_COMM_WORLD.
    let rc = unsafe {
        allreduce(
            &mine as *const u64 as usize,
            &mut latest as *mut u64 as usize,
            1,
            h.u64_type,
            h.max,
            h.world,
        )
    };
    if rc != 0 {
        eprintln!(
            "exanet-fi: the allreduce that starts the ranks' modeled clocks together \
             failed ({rc}): they start where each attached"
        );
        return;
    }
    let origin = exanet::ModelTime(latest.saturating_add(START_SLACK.ps()));
    let now = attachment.advance_clock(origin);
    if now != origin {
        eprintln!(
            "exanet-fi: this rank's modeled clock ({} ps) was past the job's origin ({} ps) \
             when MPI_Init ended: it starts late by the difference",
            now.ps(),
            origin.ps()
        );
    }
}

/// `MPI_Init`, then the ranks' modeled clocks start together ([`start_together`]).
#[no_mangle]
pub extern "C-unwind" fn MPI_Init(argc: usize, argv: usize) -> c_int {
    type Pmpi = unsafe extern "C-unwind" fn(usize, usize) -> c_int;
    static PMPI: OnceLock<usize> = OnceLock::new();
    let Some(f) = entry(&PMPI, b"PMPI_Init\0") else {
        return NO_PMPI;
    };
    // SAFETY: as in the wrappers above: PMPI_Init(argc, argv), the program's arguments.
    let rc = unsafe { std::mem::transmute::<usize, Pmpi>(f)(argc, argv) };
    if rc == 0 {
        start_together();
    }
    rc
}

/// `MPI_Init_thread`, then as [`MPI_Init`].
#[no_mangle]
pub extern "C-unwind" fn MPI_Init_thread(
    argc: usize,
    argv: usize,
    required: usize,
    provided: usize,
) -> c_int {
    type Pmpi = unsafe extern "C-unwind" fn(usize, usize, usize, usize) -> c_int;
    static PMPI: OnceLock<usize> = OnceLock::new();
    let Some(f) = entry(&PMPI, b"PMPI_Init_thread\0") else {
        return NO_PMPI;
    };
    // SAFETY: as in the wrappers above: PMPI_Init_thread(argc, argv, required,
    // provided), the program's arguments.
    let rc = unsafe { std::mem::transmute::<usize, Pmpi>(f)(argc, argv, required, provided) };
    if rc == 0 {
        start_together();
    }
    rc
}
