//! The control connection: JSON lines over the attach socket, one request then its reply,
//! descriptors passed alongside (`exanet_proto::attach`).

use std::io::{self, Read, Write};
use std::os::fd::{OwnedFd, RawFd};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::Duration;

use exanet_proto::attach::{Reply, Request};
use exanet_shm::{recv_fds, send_fds, FdPassError};

use crate::error::{Error, Result};

/// Longest reply line accepted.
const MAX_LINE: usize = 64 * 1024;
/// Most descriptors any reply carries (attach: 3).
const MAX_FDS: usize = 3;

#[derive(Debug)]
pub(crate) struct Control {
    stream: UnixStream,
    timeout: Duration,
    /// Set once the connection failed: the framing is lost, nothing more can be said.
    dead: bool,
}

fn op_name(req: &Request) -> &'static str {
    match req {
        Request::Attach { .. } => "attach",
        Request::Register { .. } => "register",
        Request::Unregister { .. } => "unregister",
        Request::Alloc { .. } => "alloc",
        Request::Free { .. } => "free",
        Request::CollectiveCounts { .. } => "collective report",
    }
}

impl Control {
    pub fn connect(path: &Path, timeout: Duration) -> Result<Control> {
        let stream = UnixStream::connect(path).map_err(|source| Error::Unreachable {
            path: path.to_path_buf(),
            source,
        })?;
        // For the life of the connection (`check_alive` only toggles O_NONBLOCK).
        stream
            .set_write_timeout(Some(timeout))
            .map_err(Error::io("setting the control socket timeout"))?;
        stream
            .set_read_timeout(Some(timeout))
            .map_err(Error::io("setting the control socket timeout"))?;
        Ok(Control {
            stream,
            timeout,
            dead: false,
        })
    }

    /// Sends `req` (with `fds`) and returns the reply and the descriptors that came with it.
    /// A `Reply::Error` is returned as a reply, not as an error: the caller knows what it
    /// means.
    pub fn request(&mut self, req: &Request, fds: &[RawFd]) -> Result<(Reply, Vec<OwnedFd>)> {
        if self.dead {
            return Err(Error::Disconnected);
        }
        let op = op_name(req);
        let r = self.exchange(req, fds, op);
        if matches!(
            r,
            Err(Error::Disconnected
                | Error::Protocol(_)
                | Error::ControlTimeout { .. }
                | Error::Io { .. })
        ) {
            self.dead = true;
        }
        r
    }

    fn exchange(
        &mut self,
        req: &Request,
        fds: &[RawFd],
        op: &'static str,
    ) -> Result<(Reply, Vec<OwnedFd>)> {
        let mut line = serde_json::to_vec(req)
            .map_err(|e| Error::Protocol(format!("cannot encode {op} request: {e}")))?;
        line.push(b'\n');
        let timed_out = |e: &io::Error| {
            matches!(
                e.kind(),
                io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
            )
        };
        let gone = |e: &io::Error| {
            matches!(
                e.kind(),
                io::ErrorKind::BrokenPipe
                    | io::ErrorKind::ConnectionReset
                    | io::ErrorKind::ConnectionAborted
                    | io::ErrorKind::UnexpectedEof
            )
        };
        let secs = self.timeout.as_secs().max(1);
        let map_io = |e: io::Error| {
            if timed_out(&e) {
                Error::ControlTimeout { op, secs }
            } else if gone(&e) {
                Error::Disconnected
            } else {
                Error::Io {
                    op: "control socket",
                    source: e,
                }
            }
        };
        let map_pass = |e: FdPassError| match e {
            FdPassError::Io(e) => map_io(e),
            other => Error::Protocol(format!("{op}: passing descriptors: {other}")),
        };
        // The descriptors travel with the first bytes; the rest (if the kernel took only a
        // part) follows in plain writes.
        let sent = send_fds(&self.stream, &line, fds).map_err(map_pass)?;
        if sent < line.len() {
            self.stream.write_all(&line[sent..]).map_err(map_io)?;
        }
        // Read up to the newline, collecting descriptors from every receive.
        let mut buf = Vec::with_capacity(512);
        let mut got_fds = Vec::new();
        let mut chunk = [0u8; 4096];
        loop {
            let (n, fds) = recv_fds(&self.stream, &mut chunk, MAX_FDS).map_err(map_pass)?;
            got_fds.extend(fds);
            if got_fds.len() > MAX_FDS {
                return Err(Error::Protocol(format!(
                    "{op}: the daemon sent {} descriptors",
                    got_fds.len()
                )));
            }
            if n == 0 {
                return Err(Error::Disconnected);
            }
            buf.extend_from_slice(&chunk[..n]);
            if let Some(end) = buf.iter().position(|&b| b == b'\n') {
                if end + 1 != buf.len() {
                    return Err(Error::Protocol(format!(
                        "{op}: the daemon sent more than one line"
                    )));
                }
                buf.truncate(end);
                break;
            }
            if buf.len() > MAX_LINE {
                return Err(Error::Protocol(format!(
                    "{op}: reply longer than {MAX_LINE} bytes"
                )));
            }
        }
        let reply: Reply = serde_json::from_slice(&buf).map_err(|e| {
            Error::Protocol(format!(
                "{op}: bad reply {:?}: {e}",
                String::from_utf8_lossy(&buf[..buf.len().min(200)])
            ))
        })?;
        Ok((reply, got_fds))
    }

    /// Whether the daemon is still there, without blocking: `Err(Disconnected)` when it
    /// closed the connection. The daemon never speaks unasked, so any byte is a protocol
    /// error.
    pub fn check_alive(&mut self) -> Result<()> {
        if self.dead {
            return Err(Error::Disconnected);
        }
        self.stream
            .set_nonblocking(true)
            .map_err(Error::io("control socket"))?;
        let mut b = [0u8; 1];
        let r = (&self.stream).read(&mut b);
        let restore = self.stream.set_nonblocking(false);
        let out = match r {
            Ok(0) => Err(Error::Disconnected),
            Ok(_) => Err(Error::Protocol("the daemon spoke unasked".into())),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => Ok(()),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => Ok(()),
            Err(e) if e.kind() == io::ErrorKind::ConnectionReset => Err(Error::Disconnected),
            Err(e) => Err(Error::Io {
                op: "control socket",
                source: e,
            }),
        };
        if out.is_err() {
            self.dead = true;
        }
        restore.map_err(Error::io("control socket"))?;
        out
    }

    /// Closes the connection: the daemon detaches the workload.
    pub fn shutdown(&mut self) {
        self.dead = true;
        let _ = self.stream.shutdown(std::net::Shutdown::Both);
    }
}
