//! `send_fds` / `recv_fds`.

use std::io::{Read, Write};
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;

use exanet_shm::fdpass::MAX_FDS;
use exanet_shm::{doorbell, recv_fds, send_fds, FdPassError, Region, Ringer};

// Only the skip of what this kernel may lack is used here.
#[allow(dead_code)]
#[path = "../../tests/src/require.rs"]
mod require;

#[test]
fn region_and_doorbell_cross_the_socket() {
    let (a, b) = UnixStream::pair().unwrap();
    let region = Region::create("pass", 4096).unwrap();
    region.write(10, b"shared!").unwrap();
    let (their_end, bell) = doorbell().unwrap();
    assert_eq!(
        send_fds(&a, b"setup", &[region.as_raw_fd(), their_end.as_raw_fd()]).unwrap(),
        5
    );

    let mut buf = [0u8; 64];
    let (n, fds) = recv_fds(&b, &mut buf, 4).unwrap();
    assert_eq!(&buf[..n], b"setup");
    let [mem, bell_fd]: [_; 2] = fds.try_into().unwrap();
    let theirs = Region::from_fd_with_len(mem, 4096).unwrap();
    let mut got = [0u8; 7];
    theirs.read(10, &mut got).unwrap();
    assert_eq!(&got, b"shared!");
    let their_bell = Ringer::from_fd(bell_fd).unwrap();
    drop(their_end);
    their_bell.ring().unwrap();
    assert!(bell.drain().unwrap());
}

#[test]
fn plain_bytes_and_end_of_stream() {
    let (a, b) = UnixStream::pair().unwrap();
    send_fds(&a, b"no fds", &[]).unwrap();
    (&a).write_all(b" then plain").unwrap();
    drop(a);
    let mut buf = [0u8; 64];
    let (n, fds) = recv_fds(&b, &mut buf, 2).unwrap();
    assert!(fds.is_empty());
    let mut all = buf[..n].to_vec();
    (&b).read_to_end(&mut all).unwrap();
    assert_eq!(all, b"no fds then plain");
    assert_eq!(recv_fds(&b, &mut buf, 2).unwrap().0, 0);
}

#[test]
fn argument_checks() {
    let (a, b) = UnixStream::pair().unwrap();
    assert!(matches!(
        send_fds(&a, b"", &[a.as_raw_fd()]),
        Err(FdPassError::Empty)
    ));
    let many = vec![a.as_raw_fd(); MAX_FDS + 1];
    assert!(
        matches!(send_fds(&a, b"x", &many), Err(FdPassError::TooManyFds { count }) if count == MAX_FDS + 1)
    );
    assert!(matches!(recv_fds(&b, &mut [], 1), Err(FdPassError::Empty)));
    assert!(matches!(
        recv_fds(&b, &mut [0u8; 4], MAX_FDS + 1),
        Err(FdPassError::TooManyFds { .. })
    ));
    // A bad descriptor is the kernel's EBADF.
    match send_fds(&a, b"x", &[-1]) {
        Err(FdPassError::Io(e)) => assert_eq!(e.raw_os_error(), Some(libc::EBADF)),
        other => panic!("{other:?}"),
    }
    // The maximum is accepted.
    let max = vec![a.as_raw_fd(); MAX_FDS];
    send_fds(&a, b"y", &max).unwrap();
    let (n, fds) = recv_fds(&b, &mut [0u8; 4], MAX_FDS).unwrap();
    assert_eq!((n, fds.len()), (1, MAX_FDS));
}

/// A socket that refuses descriptors makes the peer's send fail, so none can reach our
/// receive queue; set on a listener it holds from the connect on, before the accept.
#[test]
fn refused_descriptors_never_arrive() {
    let dir = std::env::temp_dir().join(format!("exanet-refuse-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("s");
    let listener = std::os::unix::net::UnixListener::bind(&path).unwrap();
    if !exanet_shm::refuse_descriptors(&listener).unwrap() {
        std::fs::remove_dir_all(&dir).unwrap();
        require::skip_unless_required(
            "EXANET_REQUIRE_PASSRIGHTS",
            "refused_descriptors_never_arrive",
            "this kernel (< 6.16) has no SO_PASSRIGHTS",
        );
        return;
    }
    let client = UnixStream::connect(&path).unwrap();
    let payload = std::fs::File::open("/dev/null").unwrap();
    // Sent before the daemon accepts: still refused.
    let early = send_fds(&client, b"early", &[payload.as_raw_fd()]);
    let (server, _) = listener.accept().unwrap();
    let late = send_fds(&client, b"late", &[payload.as_raw_fd()]);
    for r in [early, late] {
        match r {
            Err(FdPassError::Io(e)) => assert_eq!(e.raw_os_error(), Some(libc::EPERM)),
            other => panic!("a descriptor was accepted: {other:?}"),
        }
    }
    // Plain bytes still flow.
    send_fds(&client, b"bytes", &[]).unwrap();
    let mut buf = [0u8; 16];
    let (n, fds) = recv_fds(&server, &mut buf, 4).unwrap();
    assert_eq!((&buf[..n], fds.len()), (&b"bytes"[..], 0));
    std::fs::remove_dir_all(&dir).unwrap();
}
