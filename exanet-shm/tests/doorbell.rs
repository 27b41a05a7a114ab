//! `Doorbell` and `Waiter` on their own.

use nix::fcntl::{fcntl, FcntlArg, OFlag};
use std::os::fd::AsFd;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use exanet_shm::doorbell::wake_sleeper;
use exanet_shm::{doorbell, Doorbell, Region, Ringer, Waiter};

#[test]
fn ring_then_wait() {
    let (ringer, bell) = doorbell().unwrap();
    assert!(!bell.wait(Some(Duration::ZERO)).unwrap());
    ringer.ring().unwrap();
    ringer.ring().unwrap();
    // Rings coalesce: one wait consumes them all.
    assert!(bell.wait(Some(Duration::ZERO)).unwrap());
    assert!(!bell.drain().unwrap());
    let t = Instant::now();
    assert!(!bell.wait(Some(Duration::from_millis(20))).unwrap());
    assert!(t.elapsed() >= Duration::from_millis(20));
}

#[test]
fn ends_survive_being_handed_over_and_wake_across_threads() {
    let (ringer, bell) = doorbell().unwrap();
    let bell = Doorbell::from_fd(bell.into_fd()).unwrap();
    let ringer = Ringer::from_fd(ringer.into_fd()).unwrap();
    let waiter = thread::spawn(move || bell.wait(Some(Duration::from_secs(20))).unwrap());
    thread::sleep(Duration::from_millis(10));
    ringer.ring().unwrap();
    assert!(waiter.join().unwrap());
}

#[test]
fn from_fd_refuses_other_descriptors_and_the_wrong_end() {
    let region = Region::create("not-a-doorbell", 4096).unwrap();
    let err = Doorbell::from_fd(region.try_clone_fd().unwrap()).unwrap_err();
    assert_eq!(err.kind(), std::io::ErrorKind::InvalidInput);
    let err = Ringer::from_fd(region.try_clone_fd().unwrap()).unwrap_err();
    assert_eq!(err.kind(), std::io::ErrorKind::InvalidInput);
    // A pipe (what doorbells once were) is refused: a peer holding its other end can hold
    // the mutex every call on it takes.
    let (r, w) = nix::unistd::pipe().unwrap();
    assert!(Doorbell::from_fd(r).is_err());
    assert!(Ringer::from_fd(w).is_err());
    let udp = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    assert!(Doorbell::from_fd(udp.as_fd().try_clone_to_owned().unwrap()).is_err());
    // Each end is only accepted as what it is.
    let (ringer, bell) = doorbell().unwrap();
    let (ringer_fd, bell_fd) = (ringer.into_fd(), bell.into_fd());
    let err = Doorbell::from_fd(ringer_fd.try_clone().unwrap()).unwrap_err();
    assert!(err.to_string().contains("a ringer"), "{err}");
    let err = Ringer::from_fd(bell_fd.try_clone().unwrap()).unwrap_err();
    assert!(err.to_string().contains("shut down for sending"), "{err}");
    // The right ends are accepted.
    let ringer = Ringer::from_fd(ringer_fd).unwrap();
    let bell = Doorbell::from_fd(bell_fd).unwrap();
    ringer.ring().unwrap();
    assert!(bell.drain().unwrap());
}

/// A peer that makes its end blocking and never reads cannot make a ring block.
#[test]
fn a_peer_that_never_reads_and_clears_o_nonblock_cannot_block_a_ring() {
    let (ringer, theirs) = doorbell().unwrap();
    let theirs = theirs.into_fd();
    // The peer clears O_NONBLOCK on its end: that is its own open file description, ours
    // stays non-blocking.
    let flags = OFlag::from_bits_retain(fcntl(&theirs, FcntlArg::F_GETFL).unwrap());
    fcntl(&theirs, FcntlArg::F_SETFL(flags & !OFlag::O_NONBLOCK)).unwrap();
    let start = Instant::now();
    // Far more rings than any pipe holds.
    for _ in 0..2_000_000 {
        ringer.ring().unwrap();
    }
    assert!(start.elapsed() < Duration::from_secs(60));
    drop(theirs);
    let err = ringer.ring().unwrap_err();
    assert_eq!(err.kind(), std::io::ErrorKind::BrokenPipe);
}

/// A waiter learns that every ringer is gone, instead of waking for ever on a hung-up pipe.
#[test]
fn closing_every_ringer_ends_a_wait() {
    let (ringer, bell) = doorbell().unwrap();
    let second = ringer.try_clone().unwrap();
    drop(ringer);
    // One ringer is left: a wait times out.
    assert!(!bell.wait(Some(Duration::from_millis(10))).unwrap());
    let waiter = thread::spawn(move || {
        let t = Instant::now();
        let r = bell.wait(Some(Duration::from_secs(30)));
        (r.map_err(|e| e.kind()), t.elapsed())
    });
    thread::sleep(Duration::from_millis(20));
    drop(second);
    let (r, took) = waiter.join().unwrap();
    assert_eq!(r, Err(std::io::ErrorKind::BrokenPipe));
    assert!(took < Duration::from_secs(30));
}

/// Ringing a doorbell whose waiter is gone fails with `BrokenPipe` and does not kill the
/// process, even where SIGPIPE has its default action (a C program using the library): run
/// in a child process of this test binary where SIGPIPE kills the process.
#[test]
fn ringing_a_closed_doorbell_raises_no_sigpipe() {
    if std::env::var_os("EXANET_SIGPIPE_CHILD").is_some() {
        // Rust programs start with SIGPIPE ignored; a C program has its default action,
        // which signal-hook carries out (the process dies) should one come.
        let always = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(true));
        signal_hook::flag::register_conditional_default(signal_hook::consts::SIGPIPE, always)
            .unwrap();
        for _ in 0..3 {
            let (ringer, bell) = doorbell().unwrap();
            drop(bell);
            let err = ringer.ring().unwrap_err();
            assert_eq!(err.kind(), std::io::ErrorKind::BrokenPipe);
        }
        println!("survived");
        return;
    }
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "ringing_a_closed_doorbell_raises_no_sigpipe",
            "--nocapture",
            "--test-threads=1",
        ])
        .env("EXANET_SIGPIPE_CHILD", "1")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && stdout.contains("survived"),
        "the child died: {:?}\n{stdout}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn waiter_spins_then_sleeps_and_is_woken() {
    let region = Arc::new(Region::create("waiter", 4096).unwrap());
    let (ringer, bell) = doorbell().unwrap();
    let bell = Arc::new(bell);
    // Word 0: the condition ("data"), word 64: the sleeping flag.
    let (r2, b2) = (Arc::clone(&region), Arc::clone(&bell));
    let sleeper = thread::spawn(move || {
        let flag = r2.atomic_u32(64).unwrap();
        let data = r2.atomic_u32(0).unwrap();
        let ready = Waiter::new(Duration::from_micros(50))
            .wait(flag, &b2, Some(Duration::from_secs(20)), || {
                Ok::<_, std::io::Error>(data.load(Ordering::Acquire) != 0)
            })
            .unwrap();
        (ready, flag.load(Ordering::Relaxed))
    });
    // Wait until it sleeps, then publish and wake.
    let flag = region.atomic_u32(64).unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    while flag.load(Ordering::Acquire) == 0 {
        assert!(Instant::now() < deadline);
        thread::sleep(Duration::from_millis(1));
    }
    region.atomic_u32(0).unwrap().store(1, Ordering::Release);
    assert!(wake_sleeper(flag, &ringer).unwrap());
    // The sleeper clears its flag when it wakes.
    assert_eq!(sleeper.join().unwrap(), (true, 0));
    assert!(!wake_sleeper(flag, &ringer).unwrap());
}

#[test]
fn waiter_propagates_condition_errors_and_clears_the_flag() {
    let region = Region::create("waiter-err", 128).unwrap();
    let (_ringer, bell) = doorbell().unwrap();
    let flag = region.atomic_u32(0).unwrap();
    let calls = AtomicU32::new(0);
    let got = Waiter::new(Duration::ZERO).wait(flag, &bell, None, || {
        // Fail on the re-check after announcing sleep.
        if calls.fetch_add(1, Ordering::Relaxed) == 1 {
            Err(std::io::Error::other("boom"))
        } else {
            Ok(false)
        }
    });
    assert_eq!(got.unwrap_err().to_string(), "boom");
    assert_eq!(flag.load(Ordering::Relaxed), 0);
}

#[test]
fn waiter_defaults() {
    assert_eq!(Waiter::default().spin(), Duration::from_micros(20));
    assert_eq!(Waiter::new(Duration::ZERO).spin(), Duration::ZERO);
}

/// Runs `f` on a thread of its own and says whether it returned within `within` (a call
/// that blocks leaves its thread behind, and the test fails instead of hanging).
fn returns_within(within: Duration, f: impl FnOnce() + Send + 'static) -> bool {
    let (tx, rx) = std::sync::mpsc::channel();
    thread::spawn(move || {
        f();
        let _ = tx.send(());
    });
    rx.recv_timeout(within).is_ok()
}

/// Fills `fd` until it would block, then makes it blocking again.
fn fill(fd: &impl AsFd) {
    let flags = OFlag::from_bits_retain(fcntl(fd, FcntlArg::F_GETFL).unwrap());
    fcntl(fd, FcntlArg::F_SETFL(flags | OFlag::O_NONBLOCK)).unwrap();
    while nix::unistd::write(fd, &[0u8; 4096]).is_ok() {}
    fcntl(fd, FcntlArg::F_SETFL(flags & !OFlag::O_NONBLOCK)).unwrap();
}

/// A peer blocked in `splice(2)` on its end, from it into a full pipe or into it from an
/// empty one, holds nothing our ring, drain or close takes. First, why doorbells are not
/// pipes: the same peer on a pipe (its read end spliced into a full socket) holds the
/// pipe's mutex, and a write on the other end sleeps behind it.
#[test]
fn a_peer_splicing_its_end_cannot_block_a_ring_a_drain_or_a_close() {
    use nix::fcntl::{splice, SpliceFFlags};
    {
        let (pr, pw) = nix::unistd::pipe().unwrap();
        let (full, peer) = std::os::unix::net::UnixStream::pair().unwrap();
        fill(&full);
        let holder = thread::spawn(move || {
            let _ = splice(&pr, None, &full, None, 1 << 16, SpliceFFlags::empty());
        });
        let pw = std::sync::Arc::new(pw);
        let w = std::sync::Arc::clone(&pw);
        // The first byte wakes the splice, which then holds the mutex in its blocked send.
        let _ = nix::unistd::write(&*w, &[1]);
        thread::sleep(Duration::from_millis(100));
        let flags = OFlag::from_bits_retain(fcntl(&*pw, FcntlArg::F_GETFL).unwrap());
        fcntl(&*pw, FcntlArg::F_SETFL(flags | OFlag::O_NONBLOCK)).unwrap();
        assert!(
            !returns_within(Duration::from_millis(500), move || {
                let _ = nix::unistd::write(&*w, &[1]);
            }),
            "a non-blocking write on a held pipe did not block: the hold below proves nothing"
        );
        // Let it go: the socket is read, the send and then the write finish.
        peer.set_nonblocking(true).unwrap();
        let t0 = Instant::now();
        while !holder.is_finished() && t0.elapsed() < Duration::from_secs(20) {
            let _ = std::io::Read::read(&mut &peer, &mut [0u8; 1 << 16]);
            thread::sleep(Duration::from_millis(5));
        }
        assert!(holder.is_finished(), "the pipe's hold did not end");
    }
    // The peer reads our rings: it splices from its doorbell into a pipe that is full.
    let (ringer, theirs) = doorbell().unwrap();
    let theirs = theirs.into_fd();
    let (full_r, full_w) = nix::unistd::pipe().unwrap();
    fill(&full_w);
    let hold_a = thread::spawn(move || {
        let _ = splice(&theirs, None, &full_w, None, 1 << 16, SpliceFFlags::empty());
    });
    // The peer rings us: it splices into its ringer from a pipe that never has data.
    let (theirs, bell) = doorbell().unwrap();
    let theirs = theirs.into_fd();
    let (empty_r, empty_w) = nix::unistd::pipe().unwrap();
    let hold_b = thread::spawn(move || {
        let _ = splice(
            &empty_r,
            None,
            &theirs,
            None,
            1 << 16,
            SpliceFFlags::empty(),
        );
    });
    thread::sleep(Duration::from_millis(100));
    assert!(
        returns_within(Duration::from_secs(5), move || {
            for _ in 0..1000 {
                ringer.ring().unwrap();
            }
            drop(ringer);
        }),
        "rings or the close of a ringer blocked behind the peer's splice"
    );
    assert!(
        returns_within(Duration::from_secs(5), move || {
            let _ = bell.drain();
            drop(bell);
        }),
        "a drain or the close of a doorbell blocked behind the peer's splice"
    );
    // Release the holds: the full pipe is read, the empty one ends.
    drop(empty_w);
    let flags = OFlag::from_bits_retain(fcntl(&full_r, FcntlArg::F_GETFL).unwrap());
    fcntl(&full_r, FcntlArg::F_SETFL(flags | OFlag::O_NONBLOCK)).unwrap();
    let t0 = Instant::now();
    while !(hold_a.is_finished() && hold_b.is_finished()) {
        let _ = nix::unistd::read(&full_r, &mut [0u8; 1 << 16]);
        assert!(
            t0.elapsed() < Duration::from_secs(20),
            "the holds did not end"
        );
        thread::sleep(Duration::from_millis(5));
    }
}

/// Descriptors a peer sends along with its rings never reach a doorbell where the kernel
/// can refuse them (`EPERM` in the peer), and elsewhere are handed to the caller of
/// `drain_with`, not closed by the drain.
#[test]
fn descriptors_sent_to_a_doorbell_are_refused_or_handed_over() {
    let (theirs, bell) = doorbell().unwrap();
    let theirs = std::os::unix::net::UnixStream::from(theirs.into_fd());
    let (smuggled, _keep) = std::os::unix::net::UnixStream::pair().unwrap();
    let sent = exanet_shm::send_fds(&theirs, b"x", &[std::os::fd::AsRawFd::as_raw_fd(&smuggled)]);
    let probe = std::os::unix::net::UnixStream::pair().unwrap().0;
    if exanet_shm::refuse_descriptors(&probe).unwrap() {
        match sent {
            Err(exanet_shm::FdPassError::Io(e)) => {
                assert_eq!(e.raw_os_error(), Some(libc::EPERM), "{e}")
            }
            other => panic!("a descriptor reached a doorbell: {other:?}"),
        }
        assert!(!bell.drain().unwrap());
    } else {
        sent.unwrap();
        let mut strays = Vec::new();
        assert!(bell.drain_with(&mut |fd| strays.push(fd)).unwrap());
        assert_eq!(
            strays.len(),
            1,
            "the smuggled descriptor was not handed over"
        );
    }
}

/// An out-of-band byte is a ring like any other: the doorbell reads it inline, so that no
/// receive frees it (with whatever descriptors it carried, on kernels that cannot refuse
/// them) behind the drain's back, and no ring is missed.
#[test]
fn an_out_of_band_ring_is_a_ring() {
    let (theirs, bell) = doorbell().unwrap();
    let theirs = std::os::unix::net::UnixStream::from(theirs.into_fd());
    let sent = nix::sys::socket::send(
        std::os::fd::AsRawFd::as_raw_fd(&theirs),
        b"!",
        nix::sys::socket::MsgFlags::MSG_OOB,
    );
    assert_eq!(sent, Ok(1));
    assert!(bell.drain().unwrap(), "an out-of-band ring was not seen");
    assert!(!bell.drain().unwrap());
}
