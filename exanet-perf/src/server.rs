//! `exanet-perf <bench> serve`: the passive side of every benchmark (crate docs).

use std::collections::HashMap;
use std::time::Duration;

use exanet::{Endpoint, Gvas, MemoryRegion, Message, NodeId, Packetizer};

use crate::wire::{self, Msg};

pub struct Options {
    pub sessions: u64,
    pub max_buffer: u64,
}

/// Mailbox capacity of the server's mailboxes.
const CAPACITY: u32 = 256;
/// The notification page behind a session's buffer.
const NOTIFY_AREA: u64 = 4096;
/// Fill/check in chunks of this many bytes.
const CHUNK: u64 = 1 << 20;
/// How long the server waits for the ACK of a control reply.
const REPLY_TIMEOUT: Duration = Duration::from_secs(5);

struct Session {
    /// The client's mailbox.
    addr: Gvas,
    /// The client's buffer, followed by [`NOTIFY_AREA`] bytes for notifications.
    buf: Option<MemoryRegion>,
}

pub fn serve(ep: &Endpoint, opts: &Options) -> Result<(), String> {
    let ctrl = ep
        .mailbox(CAPACITY)
        .map_err(|e| format!("control mailbox: {e}"))?;
    let data = ep
        .mailbox(CAPACITY)
        .map_err(|e| format!("data mailbox: {e}"))?;
    let tx = ep.packetizer().map_err(|e| format!("packetizer: {e}"))?;
    println!(
        "ready node={} rank={} mailbox={} data_mailbox={} pdid={}",
        ep.node(),
        ep.rank(),
        ctrl.vi(),
        data.vi(),
        ep.pdid()
    );
    if ctrl.vi() != 0 || ep.rank() != 0 {
        eprintln!(
            "exanet-perf: clients must use --peer {}:{} --peer-mailbox {}",
            ep.node(),
            ep.rank(),
            ctrl.vi()
        );
    }
    let mut sessions: HashMap<(NodeId, u8), Session> = HashMap::new();
    let mut ended = 0u64;
    loop {
        // Completions processed before looking at the queues: a message drained into one
        // queue while we look at another still ends the wait below at once.
        let seen = ep.events();
        let mut busy = false;
        while let Some(m) = data.try_recv().map_err(|e| e.to_string())? {
            busy = true;
            if let Some(s) = sessions.get(&(m.src_node, m.src_rank)) {
                match tx.send_any(s.addr, &m.payload) {
                    Ok(tag) => {
                        let _ = ep.forget(tag);
                    }
                    Err(e) => eprintln!("exanet-perf: echo to {}: {e}", s.addr),
                }
            }
        }
        while let Some(m) = ctrl.try_recv().map_err(|e| e.to_string())? {
            busy = true;
            if control(ep, &tx, &mut sessions, &m, data.vi(), opts)? {
                ended += 1;
                if opts.sessions > 0 && ended >= opts.sessions {
                    eprintln!("exanet-perf: {ended} session(s) served, exiting");
                    return Ok(());
                }
            }
        }
        // Notifications of --notify writes: nothing to do with them but collect them.
        while ep.try_notification().map_err(|e| e.to_string())?.is_some() {}
        if !busy {
            ep.wait_events(seen, Some(Duration::from_millis(500)))
                .map_err(|e| e.to_string())?;
        }
    }
}

fn reply(ep: &Endpoint, tx: &Packetizer, to: Gvas, m: Msg) {
    let r = tx
        .send_any(to, &m.encode())
        .and_then(|tag| ep.wait(tag, Some(REPLY_TIMEOUT)));
    if let Err(e) = r {
        eprintln!("exanet-perf: reply {m:?} to {to}: {e}");
    }
}

/// Handles one control message; `true` when it ended a session.
fn control(
    ep: &Endpoint,
    tx: &Packetizer,
    sessions: &mut HashMap<(NodeId, u8), Session>,
    m: &Message,
    data_vi: u8,
    opts: &Options,
) -> Result<bool, String> {
    let key = (m.src_node, m.src_rank);
    let who = format!(
        "{}:{}",
        ep.node_name(m.src_node)
            .unwrap_or_else(|_| m.src_node.to_string()),
        m.src_rank
    );
    let Some(msg) = Msg::decode(&m.payload) else {
        eprintln!(
            "exanet-perf: ignoring a {}-byte message from {who}",
            m.payload.len()
        );
        return Ok(false);
    };
    match msg {
        Msg::Hello {
            bench,
            client_vi,
            buffer,
        } => {
            let addr = match ep.mailbox_addr(m.src_node, m.src_rank, client_vi) {
                Ok(a) => a,
                Err(e) => {
                    eprintln!("exanet-perf: hello from {who}: {e}");
                    return Ok(false);
                }
            };
            // A new hello replaces the client's previous session.
            sessions.remove(&key);
            let (status, buf) = if buffer > opts.max_buffer {
                (wire::ST_TOO_BIG, None)
            } else if buffer == 0 {
                (wire::ST_OK, None)
            } else {
                match ep.register(buffer + NOTIFY_AREA) {
                    Ok(r) => (wire::ST_OK, Some(r)),
                    Err(e) => {
                        eprintln!("exanet-perf: registering {buffer} B for {who}: {e}");
                        (wire::ST_FAILED, None)
                    }
                }
            };
            let welcome = Msg::Welcome {
                status,
                data_vi,
                buf_va: buf.as_ref().map_or(0, MemoryRegion::va),
                buf_len: match status {
                    wire::ST_OK => buffer,
                    wire::ST_TOO_BIG => opts.max_buffer,
                    _ => 0,
                },
                notify_va: buf.as_ref().map_or(0, |r| r.va() + buffer),
            };
            eprintln!(
                "exanet-perf: session from {who} (bench {bench}, mailbox {client_vi}, {buffer} B)"
            );
            reply(ep, tx, addr, welcome);
            if status == wire::ST_OK {
                sessions.insert(key, Session { addr, buf });
            }
            Ok(false)
        }
        Msg::Bye => {
            if sessions.remove(&key).is_some() {
                eprintln!("exanet-perf: session from {who} ended");
                Ok(true)
            } else {
                Ok(false)
            }
        }
        Msg::Fill { seed, offset, len } | Msg::Check { seed, offset, len } => {
            let Some(s) = sessions.get(&key) else {
                return Ok(false);
            };
            let check = matches!(msg, Msg::Check { .. });
            let done = match (&s.buf, offset.checked_add(len)) {
                (Some(buf), Some(end)) if end <= buf.len() - NOTIFY_AREA => {
                    match fill_or_check(buf, seed, offset, len, check) {
                        Ok(None) => Msg::Done {
                            status: wire::ST_OK,
                            detail: 0,
                        },
                        Ok(Some(bad)) => Msg::Done {
                            status: wire::ST_MISMATCH,
                            detail: bad,
                        },
                        Err(e) => {
                            eprintln!("exanet-perf: {e}");
                            Msg::Done {
                                status: wire::ST_FAILED,
                                detail: 0,
                            }
                        }
                    }
                }
                _ => Msg::Done {
                    status: wire::ST_FAILED,
                    detail: 0,
                },
            };
            reply(ep, tx, s.addr, done);
            Ok(false)
        }
        Msg::Welcome { .. } | Msg::Done { .. } => Ok(false),
    }
}

/// Fills the buffer range with the pattern, or checks it; `Some(offset)`: first bad byte
/// (relative to `offset`).
fn fill_or_check(
    buf: &MemoryRegion,
    seed: u64,
    offset: u64,
    len: u64,
    check: bool,
) -> Result<Option<u64>, String> {
    let mut chunk = vec![0u8; CHUNK.min(len) as usize];
    let mut done = 0;
    while done < len {
        let n = CHUNK.min(len - done) as usize;
        let c = &mut chunk[..n];
        if check {
            buf.read(offset + done, c).map_err(|e| e.to_string())?;
            if let Some(bad) = wire::first_mismatch(c, seed, done) {
                return Ok(Some(done + bad));
            }
        } else {
            wire::fill(c, seed, done);
            buf.write(offset + done, c).map_err(|e| e.to_string())?;
        }
        done += n as u64;
    }
    Ok(None)
}
