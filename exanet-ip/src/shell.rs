//! The I/O around the core's [`IpService`]: the TUN device on one side, the node's NI
//! (through the client library) on the other.
//!
//! Two threads share the service behind a mutex. The host thread blocks on the TUN
//! device and posts what a packet makes ready; the fabric thread sleeps on the
//! endpoint's events and handles completions, notifications (batches in: packets to the
//! TUN device) and control messages. Both post through [`Shell::pump`]: RDMA writes while
//! a write channel is free, messages while a packetizer channel is.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant as WallInstant};

use exanet::{Endpoint, Error, Mailbox, MemoryRegion, Packetizer, RdmaPage, Tag};
use exanet_ip_proto::{IpService, Outgoing, PeerOp, IP_MAILBOX_VI, IP_RANK};
use exanet_proto::{Instant, NodeId};
use tracing::{debug, warn};

use crate::metrics::Snapshot;

/// The NI resources the service posts with.
pub struct Ni {
    pub ep: Endpoint,
    pub staging: MemoryRegion,
    pub page: RdmaPage,
    pub tx: Packetizer,
    pub mailbox: Mailbox,
}

struct State {
    svc: IpService,
    /// The receive area's slabs registered so far (see [`IpService::poll_register`]).
    slabs: Vec<Option<MemoryRegion>>,
    writes: HashMap<Tag, (NodeId, u32, u8)>,
    free_channels: Vec<u8>,
    messages: HashMap<Tag, (NodeId, PeerOp)>,
}

pub struct Shell {
    ni: Ni,
    dev: tun::Device,
    max_batch: u64,
    state: Mutex<State>,
    origin: WallInstant,
}

/// Messages in flight at once: one per packetizer channel.
const MESSAGE_SLOTS: usize = exanet::PACKETIZER_CHANNELS as usize;

impl Shell {
    pub fn new(ni: Ni, dev: tun::Device, svc: IpService) -> Shell {
        let max_batch = u64::from(svc.config().max_batch);
        Shell {
            ni,
            dev,
            max_batch,
            state: Mutex::new(State {
                slabs: (0..svc.config().slabs()).map(|_| None).collect(),
                svc,
                writes: HashMap::new(),
                free_channels: (0..exanet::RDMA_WRITE_CHANNELS).rev().collect(),
                messages: HashMap::new(),
            }),
            origin: WallInstant::now(),
        }
    }

    fn now(&self) -> Instant {
        Instant(self.origin.elapsed().as_nanos() as u64)
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn snapshot(&self) -> Snapshot {
        let st = self.lock();
        Snapshot {
            stats: st.svc.stats().clone(),
            ring_occupancy: st.svc.ring_occupancy(),
            queued: st.svc.queued_bytes(),
            registered: st.svc.registered_bytes(),
        }
    }

    /// Posts what the service has ready, as far as channels allow.
    fn pump(&self, st: &mut State) {
        let now = self.now();
        while let Some(&ch) = st.free_channels.last() {
            let Some(Outgoing::Write {
                peer,
                seq,
                dst_va,
                notify_va,
                batch,
            }) = st.svc.poll_write()
            else {
                break;
            };
            let off = u64::from(ch) * self.max_batch;
            let posted = self
                .ni
                .staging
                .write(off, &batch)
                .and_then(|()| self.ni.ep.addr(peer, IP_RANK, dst_va))
                .and_then(|dst| {
                    self.ni.page.write(
                        ch,
                        &self.ni.staging,
                        off,
                        dst,
                        batch.len() as u64,
                        Some(notify_va),
                    )
                });
            match posted {
                Ok(tag) => {
                    st.free_channels.pop();
                    st.writes.insert(tag, (peer, seq, ch));
                }
                Err(e) => {
                    warn!(peer = peer.0, error = %e, "cannot post a batch");
                    st.svc.write_done(peer, seq, false, now);
                }
            }
        }
        while st.messages.len() < MESSAGE_SLOTS {
            let Some(Outgoing::Message { peer, op, bytes }) = st.svc.poll_message() else {
                break;
            };
            let posted = self
                .ni
                .ep
                .mailbox_addr(peer, IP_RANK, IP_MAILBOX_VI)
                .and_then(|dst| self.ni.tx.send_any(dst, &bytes));
            match posted {
                Ok(tag) => {
                    st.messages.insert(tag, (peer, op));
                }
                Err(e) => {
                    warn!(peer = peer.0, error = %e, "cannot post a message");
                    st.svc.message_done(peer, op, false, now);
                }
            }
        }
    }

    /// Reads the host's packets until the device fails.
    pub fn host_loop(self: &Arc<Self>) -> std::io::Error {
        let mut buf = vec![0u8; 65536];
        loop {
            let n = match self.dev.recv(&mut buf) {
                Ok(n) => n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) => return e,
            };
            let now = self.now();
            let mut st = self.lock();
            if let Err(why) = st.svc.from_host(&buf[..n], now) {
                debug!(
                    reason = why.label(),
                    len = n,
                    "packet from the host dropped"
                );
            }
            self.pump(&mut st);
        }
    }

    /// Handles the fabric's side until the endpoint breaks.
    pub fn fabric_loop(self: &Arc<Self>) -> Error {
        let mut deliver: Vec<Vec<u8>> = Vec::new();
        let mut wake_at;
        loop {
            let seen = self.ni.ep.events();
            let mut busy = false;
            {
                let now = self.now();
                let mut st = self.lock();
                let st = &mut *st;
                // Posted operations that ended.
                let done: Vec<(Tag, Result<(), Error>)> = st
                    .writes
                    .keys()
                    .chain(st.messages.keys())
                    .filter_map(|&t| match self.ni.ep.wait(t, Some(Duration::ZERO)) {
                        Err(Error::Timeout) => None,
                        r => Some((t, r)),
                    })
                    .collect();
                for (tag, r) in done {
                    busy = true;
                    match r {
                        Err(e @ (Error::Broken(_) | Error::Corrupt(_))) => return e,
                        Err(ref e) => debug!(error = %e, "an operation failed"),
                        Ok(()) => {}
                    }
                    if let Some((peer, seq, ch)) = st.writes.remove(&tag) {
                        st.free_channels.push(ch);
                        st.svc.write_done(peer, seq, r.is_ok(), now);
                    } else if let Some((peer, op)) = st.messages.remove(&tag) {
                        st.svc.message_done(peer, op, r.is_ok(), now);
                    }
                }
                loop {
                    match self.ni.ep.try_notification() {
                        Ok(Some(n)) => {
                            busy = true;
                            let slabs = &st.slabs;
                            let span = st.svc.config().slab_span();
                            deliver.extend(st.svc.on_notification(
                                n.src_node,
                                n.va,
                                n.len,
                                |off, buf| read_area(slabs, span, off, buf),
                            ));
                        }
                        Ok(None) => break,
                        Err(e) => return e,
                    }
                }
                loop {
                    match self.ni.mailbox.try_recv() {
                        Ok(Some(m)) => {
                            busy = true;
                            let slabs = &st.slabs;
                            let span = st.svc.config().slab_span();
                            match st.svc.on_message(m.src_node, &m.payload, |off, buf| {
                                read_area(slabs, span, off, buf)
                            }) {
                                Ok(pk) => deliver.extend(pk),
                                Err(why) => {
                                    debug!(
                                        reason = why.label(),
                                        src = m.src_node.0,
                                        "message dropped"
                                    )
                                }
                            }
                        }
                        Ok(None) => break,
                        Err(e) => return e,
                    }
                }
                // Rings for peers that opened their first stream to us.
                while let Some((slab, len)) = st.svc.poll_register() {
                    busy = true;
                    match self.ni.ep.register(len) {
                        Ok(r) => {
                            st.svc.registered(slab, Some(r.va()));
                            st.slabs[slab as usize] = Some(r);
                        }
                        Err(e) => {
                            warn!(slab, error = %e, "cannot register receive rings");
                            st.svc.registered(slab, None);
                        }
                    }
                }
                st.svc.on_tick(now);
                self.pump(st);
                wake_at = st.svc.next_tick();
            }
            for p in deliver.drain(..) {
                if let Err(e) = self.dev.send(&p) {
                    // The host's stack refusing a packet (e.g. the device went down) is
                    // the host's business; the service goes on.
                    debug!(error = %e, "the TUN device refused a packet");
                }
            }
            if !busy {
                // Until something happens, or the service's next retry: an idle service
                // does not wake on a period.
                let timeout =
                    wake_at.map(|at| Duration::from_nanos(at.0.saturating_sub(self.now().0)));
                match self.ni.ep.wait_events(seen, timeout) {
                    Ok(_) => {}
                    Err(e) => return e,
                }
            }
        }
    }
}

/// Reads bytes of the receive area at `off` (offsets as if every slab were registered,
/// `span` apart) from the slab that holds them; false if that slab is not registered or
/// the bytes cross its end (no ring does).
fn read_area(slabs: &[Option<MemoryRegion>], span: u64, off: u64, buf: &mut [u8]) -> bool {
    let (slab, at) = (off / span, off % span);
    match slabs.get(slab as usize) {
        Some(Some(r)) => r.read(at, buf).is_ok(),
        _ => false,
    }
}
