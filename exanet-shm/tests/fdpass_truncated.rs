//! `recv_fds` with too little room for the descriptors sent: a typed error, and every
//! descriptor that did arrive is closed. Alone in its test binary (one test, one thread) so
//! that counting this process's open descriptors is reliable.

use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;

use exanet_shm::{doorbell, recv_fds, send_fds, Doorbell, FdPassError};

fn open_fds() -> usize {
    std::fs::read_dir("/proc/self/fd").unwrap().count()
}

#[test]
fn truncated_control_message_is_an_error_and_leaks_nothing() {
    let (a, b) = UnixStream::pair().unwrap();
    let bells: Vec<Doorbell> = (0..5).map(|_| doorbell().unwrap().1).collect();
    let raw: Vec<_> = bells.iter().map(|d| d.as_raw_fd()).collect();
    let before = open_fds();
    for max_fds in [0, 1, 4] {
        send_fds(&a, b"five", &raw).unwrap();
        let mut buf = [0u8; 16];
        match recv_fds(&b, &mut buf, max_fds) {
            Err(FdPassError::Truncated { max_fds: m }) => assert_eq!(m, max_fds),
            other => panic!("max_fds {max_fds}: {other:?}"),
        }
        assert_eq!(
            open_fds(),
            before,
            "received descriptors leaked (max_fds {max_fds})"
        );
    }
    // Enough room: all five arrive.
    send_fds(&a, b"five", &raw).unwrap();
    let (n, fds) = recv_fds(&b, &mut [0u8; 16], 5).unwrap();
    assert_eq!((n, fds.len()), (4, 5));
    assert_eq!(open_fds(), before + 5);
    drop(fds);
    assert_eq!(open_fds(), before);
}
