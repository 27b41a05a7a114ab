//! A real second process: the test binary re-executes itself as the child (selected by an
//! environment variable), receives the memfd and the child's ends of two doorbell socket pairs over a Unix socket, and plays
//! ping-pong with the parent: 100,000 round trips, both sides checking order and content.
//! The last 10,000 use a zero spin budget, so every wait goes through the doorbell.

mod common;

use std::io::ErrorKind;
use std::os::fd::AsRawFd;
use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr, UnixListener, UnixStream};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use exanet_shm::{
    doorbell, recv_fds, send_fds, Consumer, Doorbell, Producer, Region, Ring, Ringer, Waiter,
};

use common::message;

const CHILD_ENV: &str = "EXANET_SHM_TEST_CHILD_SOCKET";
const TEST_NAME: &str = "two_process_pingpong";
const COUNT: u64 = 100_000;
const SLEEPY_FROM: u64 = COUNT - 10_000;
const TIMEOUT: Duration = Duration::from_secs(30);

fn rings() -> (Ring, Ring) {
    let to_child = Ring::new(0, 64, 64).unwrap();
    let to_parent = Ring::new(to_child.end(), 64, 64).unwrap();
    (to_child, to_parent)
}

/// The child's answer to `msg`: same length, every byte flipped and rotated.
fn reply_to(msg: &[u8]) -> Vec<u8> {
    msg.iter().map(|b| (!b).rotate_left(3)).collect()
}

fn waiter_for(i: u64) -> Waiter {
    if i >= SLEEPY_FROM {
        Waiter::new(Duration::ZERO)
    } else {
        Waiter::default()
    }
}

#[test]
fn two_process_pingpong() {
    match std::env::var_os(CHILD_ENV) {
        Some(name) => child(name.to_str().expect("socket name")),
        None => parent(),
    }
}

struct KillOnDrop(Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        if matches!(self.0.try_wait(), Ok(None)) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
}

fn parent() {
    let (to_child, to_parent) = rings();
    let region = Arc::new(Region::create("exanet-shm-two-process", to_parent.end()).unwrap());
    to_child.init(&region).unwrap();
    to_parent.init(&region).unwrap();
    // The parent rings `child_bell` and waits on `parent_bell`; the child gets the other ends.
    let (child_bell, child_end_of_child_bell) = doorbell().unwrap();
    let (child_end_of_parent_bell, parent_bell) = doorbell().unwrap();
    let mut tx = to_child.producer(Arc::clone(&region)).unwrap();
    let mut rx = to_parent.consumer(Arc::clone(&region)).unwrap();

    // An abstract socket: no file to clean up, no path length to worry about.
    let name = format!(
        "exanet-shm-test-{}-{:?}",
        std::process::id(),
        thread::current().id()
    );
    let addr = SocketAddr::from_abstract_name(name.as_bytes()).unwrap();
    let listener = UnixListener::bind_addr(&addr).unwrap();
    listener.set_nonblocking(true).unwrap();
    let mut child = KillOnDrop(
        Command::new(std::env::current_exe().unwrap())
            .args([TEST_NAME, "--exact", "--nocapture", "--test-threads=1"])
            .env(CHILD_ENV, &name)
            // The child's harness summary would read like a second test run; its panics go to
            // stderr, which stays.
            .stdout(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let deadline = Instant::now() + TIMEOUT;
    let stream = loop {
        match listener.accept() {
            Ok((s, _)) => break s,
            Err(e) if e.kind() == ErrorKind::WouldBlock => {
                assert!(
                    child.0.try_wait().unwrap().is_none(),
                    "child exited before connecting"
                );
                assert!(Instant::now() < deadline, "child never connected");
                thread::sleep(Duration::from_millis(2));
            }
            Err(e) => panic!("accept: {e}"),
        }
    };
    stream.set_nonblocking(false).unwrap();
    let hello = (region.len() as u64).to_le_bytes();
    let fds = [
        region.as_raw_fd(),
        child_end_of_child_bell.as_raw_fd(),
        child_end_of_parent_bell.as_raw_fd(),
    ];
    assert_eq!(send_fds(&stream, &hello, &fds).unwrap(), hello.len());

    let started = Instant::now();
    let max = tx.max_message_len();
    let mut buf = vec![0u8; max];
    for i in 0..COUNT {
        let msg = message(i, max);
        tx.push(&msg).unwrap();
        tx.wake_consumer(&child_bell).unwrap();
        let n = rx
            .pop_wait(&mut buf, &waiter_for(i), &parent_bell, Some(TIMEOUT))
            .unwrap()
            .unwrap_or_else(|| panic!("no reply to message {i}"));
        assert_eq!(&buf[..n], &reply_to(&msg)[..], "reply to message {i}");
    }
    let elapsed = started.elapsed();
    eprintln!(
        "two-process ping-pong: {COUNT} round trips in {elapsed:?} ({:?} per round trip)",
        elapsed / COUNT as u32
    );
    let status = child.0.wait().unwrap();
    assert!(status.success(), "child failed: {status}");
    assert_eq!(rx.pop(&mut buf).unwrap(), None);
}

fn child(name: &str) {
    let addr = SocketAddr::from_abstract_name(name.as_bytes()).unwrap();
    let stream = UnixStream::connect_addr(&addr).unwrap();
    let mut hello = [0u8; 8];
    let (n, fds) = recv_fds(&stream, &mut hello, 3).unwrap();
    assert_eq!(n, 8);
    let [mem, child_bell, parent_bell]: [_; 3] = fds.try_into().expect("three descriptors");
    let len = u64::from_le_bytes(hello) as usize;
    let region = Arc::new(Region::from_fd_with_len(mem, len).unwrap());
    let child_bell = Doorbell::from_fd(child_bell).unwrap();
    let parent_bell = Ringer::from_fd(parent_bell).unwrap();
    let (to_child, to_parent) = rings();
    let mut rx: Consumer = to_child.consumer(Arc::clone(&region)).unwrap();
    let mut tx: Producer = to_parent.producer(region).unwrap();

    let max = rx.max_message_len();
    let mut buf = vec![0u8; max];
    for i in 0..COUNT {
        let n = rx
            .pop_wait(&mut buf, &waiter_for(i), &child_bell, Some(TIMEOUT))
            .unwrap()
            .unwrap_or_else(|| panic!("child: message {i} never came"));
        assert_eq!(&buf[..n], &message(i, max)[..], "child: message {i}");
        tx.push(&reply_to(&buf[..n])).unwrap();
        tx.wake_consumer(&parent_bell).unwrap();
    }
}
