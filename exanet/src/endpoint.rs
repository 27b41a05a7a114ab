//! The public Rust API: [`Endpoint`] and the interfaces it hands out.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use exanet_proto::attach::{Command, Reply, Request, Resource, PROTOCOL_VERSION};
use exanet_proto::gvas::{Gvas, Pdid};
use exanet_proto::model::ModelTime;
use exanet_proto::ni::rdma::{MAX_TRANSFER, READ_CHANNELS, WRITE_CHANNELS};
use exanet_proto::ni::{RdmaRead, RdmaWrite, SendMessage, CHANNELS, MAX_MESSAGE, RANKS};
use exanet_proto::{NodeId, Shape};
use exanet_shm::{Doorbell, Region, Ring, Ringer};

use crate::config::{read_shape, socket_path, Config};
use crate::control::Control;
use crate::engine::{
    counters_fit, Chan, Info, Message, Notification, Shared, Stats, RING_SLOT_SIZE, VA_LIMIT,
};
use crate::error::{Error, OpError, Result};

/// Largest ring region accepted from the daemon.
const MAX_RING_REGION: u64 = 1 << 30;

/// See [`Endpoint::hold`].
#[must_use = "the time counts as the library's only while the guard lives"]
pub struct Held<'a>(#[allow(dead_code)] crate::engine::Call<'a>);

/// Names a posted operation; [`Endpoint::wait`] collects its result.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Tag(pub(crate) u32);

impl Tag {
    /// The value carried in the command and echoed by its completion.
    pub fn raw(self) -> u32 {
        self.0
    }

    /// A tag from its raw value (e.g. one that went through C).
    pub fn from_raw(raw: u32) -> Tag {
        Tag(raw)
    }
}

impl std::fmt::Display for Tag {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// A workload's attachment to its node's NI.
///
/// The attachment lasts until the endpoint is dropped (or [`Endpoint::detach`]ed): then the
/// daemon frees the rank and everything it allocated, and the interfaces handed out by
/// this endpoint fail with [`Error::Broken`].
///
/// `Endpoint` and its interfaces are `Send + Sync`; see the `engine` module for how threads
/// share the completion ring.
#[derive(Debug)]
pub struct Endpoint {
    shared: Arc<Shared>,
}

impl Drop for Endpoint {
    fn drop(&mut self) {
        self.shared.detach();
    }
}

impl Endpoint {
    /// Attaches to the node named by `EXANET_NODE` of the rack in `EXANET_RACK` (else
    /// `./exanet-rack`), with the job key of `EXANET_JOB_KEY` (else the rack's default job).
    pub fn attach() -> Result<Endpoint> {
        Endpoint::attach_with(&Config::from_env())
    }

    /// Attaches to `node` of the rack in `rack_dir` with `job_key` (`None`: the rack's
    /// default job).
    pub fn attach_to(
        rack_dir: impl AsRef<Path>,
        node: &str,
        job_key: Option<&str>,
    ) -> Result<Endpoint> {
        Endpoint::attach_with(&Config {
            rack_dir: Some(rack_dir.as_ref().to_path_buf()),
            node: Some(node.to_string()),
            job_key: job_key.map(str::to_string),
            ..Config::default()
        })
    }

    /// Attaches as `config` says (unset fields from the environment, see [`Config`]).
    pub fn attach_with(config: &Config) -> Result<Endpoint> {
        let r = config.resolve()?;
        let path = socket_path(&r.rack_dir, &r.node);
        let mut ctrl = Control::connect(&path, r.control_timeout)?;
        let (reply, fds) = ctrl.request(
            &Request::Attach {
                version: PROTOCOL_VERSION,
                job_key: r.job_key.clone(),
                rank: r.rank,
            },
            &[],
        )?;
        let Reply::Attached {
            node,
            node_id,
            rank,
            pdid,
            command_slots: cmd_slots,
            completion_slots: cpl_slots,
            command_offset: cmd_off,
            completion_offset: cpl_off,
            consumed_offset,
            region_len,
            nodes,
            software_ps,
            compute_scale_ppm,
            clock_ps,
        } = reply
        else {
            return Err(match reply {
                Reply::Error { message } => Error::AttachRefused(message),
                other => Error::Protocol(format!("attach: unexpected reply {other:?}")),
            });
        };
        let bad = |what: String| Error::Protocol(format!("attach: {what}"));
        if usize::from(rank) >= RANKS {
            return Err(bad(format!("rank {rank} outside 0..{RANKS}")));
        }
        if nodes == 0 || nodes > 1 << exanet_proto::NODE_ID_BITS {
            return Err(bad(format!("{nodes} nodes")));
        }
        if node_id >= nodes {
            return Err(bad(format!("node id {node_id} outside a rack of {nodes}")));
        }
        if region_len == 0 || region_len > MAX_RING_REGION {
            return Err(bad(format!("ring region of {region_len} bytes")));
        }
        if !counters_fit(consumed_offset, region_len) {
            return Err(bad(format!(
                "consumed counters at {consumed_offset} in a region of {region_len} bytes"
            )));
        }
        let fds: [_; 3] = fds
            .try_into()
            .map_err(|v: Vec<_>| bad(format!("{} descriptors instead of 3", v.len())))?;
        let [mem, bell_in, bell_out] = fds;
        let region = Arc::new(
            Region::from_fd_with_len(mem, region_len as usize)
                .map_err(|e| bad(format!("ring region: {e}")))?,
        );
        let off = |o: u64| usize::try_from(o).map_err(|_| bad(format!("ring offset {o}")));
        let cmd_ring = Ring::new(off(cmd_off)?, cmd_slots, RING_SLOT_SIZE)
            .map_err(|e| bad(format!("command ring: {e}")))?;
        let cpl_ring = Ring::new(off(cpl_off)?, cpl_slots, RING_SLOT_SIZE)
            .map_err(|e| bad(format!("completion ring: {e}")))?;
        let producer = cmd_ring
            .producer(Arc::clone(&region))
            .map_err(|e| bad(format!("command ring: {e}")))?;
        let consumer = cpl_ring
            .consumer(region)
            .map_err(|e| bad(format!("completion ring: {e}")))?;
        let from_daemon =
            Doorbell::from_fd(bell_in).map_err(|e| bad(format!("first doorbell: {e}")))?;
        let to_daemon =
            Ringer::from_fd(bell_out).map_err(|e| bad(format!("second doorbell: {e}")))?;
        let shape = match read_shape(&r.rack_dir) {
            Ok(s) if s.nodes() == nodes => Ok(s),
            Ok(s) => Err(format!(
                "the rack file says {s} ({} nodes), the daemon says {nodes} nodes",
                s.nodes()
            )),
            Err(e) => Err(e.to_string()),
        };
        let info = Info {
            node,
            node_id: NodeId(node_id),
            rank,
            pdid: Pdid(pdid),
            nodes,
            shape,
            control_timeout: r.control_timeout,
            consumed_offset: consumed_offset as usize,
            software_ps: r.software_ps.unwrap_or(software_ps),
            compute_scale_ppm: {
                let base = r.compute_scale_ppm.unwrap_or(compute_scale_ppm);
                let f = r.compute_factor_ppm.unwrap_or(1_000_000);
                (u128::from(base) * u128::from(f) / 1_000_000).min(u128::from(u64::MAX)) as u64
            },
            clock_start: ModelTime(clock_ps),
        };
        Ok(Endpoint {
            shared: Arc::new(Shared::new(
                info,
                r.spin,
                producer,
                consumer,
                from_daemon,
                to_daemon,
                ctrl,
            )),
        })
    }

    /// Ends the attachment now (as dropping the endpoint does).
    pub fn detach(self) {}

    /// Ends the attachment now while other threads may still be inside calls on this
    /// endpoint (the C ABI's `exanet_detach`): those waiting return [`Error::Broken`], as
    /// do later calls; dropping the endpoint afterwards does nothing more.
    pub(crate) fn close(&self) {
        self.shared.detach();
    }

    /// This node's name, e.g. `M1QAF2`.
    pub fn node(&self) -> &str {
        &self.shared.info.node
    }

    pub fn node_id(&self) -> NodeId {
        self.shared.info.node_id
    }

    /// The rank (0..=7) the daemon gave this workload on its node.
    pub fn rank(&self) -> u8 {
        self.shared.info.rank
    }

    /// The protection domain of this workload's job: the NI stamps it on everything sent.
    pub fn pdid(&self) -> Pdid {
        self.shared.info.pdid
    }

    /// Number of nodes in the rack.
    pub fn nodes(&self) -> u32 {
        self.shared.info.nodes
    }

    /// The rack's shape, from the rack file (an error if it could not be read).
    pub fn shape(&self) -> Result<Shape> {
        self.shared
            .info
            .shape
            .clone()
            .map_err(|message| Error::RackFile {
                path: "rack.toml".into(),
                message,
            })
    }

    /// The id of the node called `name` (`M<blade>Q<slot>F<fpga>`, any case).
    pub fn node_by_name(&self, name: &str) -> Result<NodeId> {
        let shape = self
            .shared
            .info
            .shape
            .as_ref()
            .map_err(|m| Error::UnknownNode {
                name: name.to_string(),
                reason: format!("node names cannot be resolved: {m}"),
            })?;
        shape.parse_node(name).map_err(|e| Error::UnknownNode {
            name: name.to_string(),
            reason: e.to_string(),
        })
    }

    /// The name of node `id`.
    pub fn node_name(&self, id: NodeId) -> Result<String> {
        self.shared.check_node(id)?;
        match &self.shared.info.shape {
            Ok(s) => Ok(s.display(id)),
            Err(_) => Ok(format!("node#{}", id.0)),
        }
    }

    /// The GVAS of byte `va` of `rank` on `node`, in this workload's protection domain.
    pub fn addr(&self, node: NodeId, rank: u8, va: u64) -> Result<Gvas> {
        self.shared.gvas(node, rank, va)
    }

    pub(crate) fn shared(&self) -> &Arc<Shared> {
        &self.shared
    }

    /// The GVAS of mailbox `vi` of `rank` on `node` (what [`Packetizer::send`] takes to
    /// deliver into that mailbox).
    pub fn mailbox_addr(&self, node: NodeId, rank: u8, vi: u8) -> Result<Gvas> {
        self.shared.mailbox_gvas(node, rank, vi)
    }

    /// How long a wait spins before it sleeps on the doorbell.
    pub fn spin(&self) -> Duration {
        self.shared.spin()
    }

    /// Sets the spin budget (`Duration::ZERO`: sleep right away; longer: lower latency,
    /// more CPU). Initially `EXANET_SPIN_US` or 20 us.
    pub fn set_spin(&self, spin: Duration) {
        self.shared.set_spin(spin)
    }

    /// Registers `len` bytes of new shared memory as this rank's memory: the NI reads RDMA
    /// sources from it and writes RDMA destinations and notifications into it.
    pub fn register(&self, len: u64) -> Result<MemoryRegion> {
        MemoryRegion::register(&self.shared, len)
    }

    /// Allocates a packetizer interface (4 channels, messages of up to 64 bytes).
    pub fn packetizer(&self) -> Result<Packetizer> {
        let vi = self.shared.alloc(Resource::Packetizer, None)?;
        Ok(Packetizer {
            shared: Arc::clone(&self.shared),
            vi,
        })
    }

    /// Allocates a mailbox with room for `capacity` (1..=65536; more is taken as 65536)
    /// unread messages: a message counts from its arrival until [`Mailbox::recv`] or
    /// [`Mailbox::try_recv`] returns it, and once `capacity` are unread the next is NACKed
    /// [`NackReason::QueueFull`](crate::NackReason::QueueFull).
    pub fn mailbox(&self, capacity: u32) -> Result<Mailbox> {
        self.open_mailbox(capacity, None)
    }

    /// A mailbox at interface `vi` (0..64), refused if another has it: for services that
    /// peers address without a directory (the IP service takes the last interface).
    pub fn mailbox_at(&self, vi: u8, capacity: u32) -> Result<Mailbox> {
        self.open_mailbox(capacity, Some(vi))
    }

    fn open_mailbox(&self, capacity: u32, want: Option<u8>) -> Result<Mailbox> {
        if capacity == 0 {
            return Err(Error::BadLength {
                len: 0,
                why: "a mailbox holds at least one message",
            });
        }
        let (vi, generation) = self.shared.alloc_mailbox(capacity, want)?;
        let info = &self.shared.info;
        let mailbox = Mailbox {
            shared: Arc::clone(&self.shared),
            vi,
            generation,
            capacity,
            // Cannot fail: `alloc` checked the index, attaching checked node id and rank.
            addr: self.shared.mailbox_gvas(info.node_id, info.rank, vi)?,
        };
        self.shared.open_mailbox(vi, generation, capacity);
        Ok(mailbox)
    }

    /// Allocates an RDMA page (32 write and 32 read channels).
    pub fn rdma_page(&self) -> Result<RdmaPage> {
        RdmaPage::alloc(&self.shared)
    }

    /// Waits until the operation `tag` ended: `Ok(())` if it succeeded,
    /// [`Error::Op`] with the [`crate::OpError`] if it failed, [`Error::Timeout`] if it is
    /// still going after `timeout` (`None`: no limit; `Some(ZERO)`: just check). The result
    /// is collected: waiting for the same tag again is [`Error::UnknownTag`].
    pub fn wait(&self, tag: Tag, timeout: Option<Duration>) -> Result<()> {
        self.shared.wait(tag.0, timeout).map(drop)
    }

    /// [`Endpoint::wait`], returning when the operation completed in modeled time: what
    /// the ExaNeSt hardware would have taken (see docs/modeled-time.md).
    pub fn wait_modeled(&self, tag: Tag, timeout: Option<Duration>) -> Result<ModelTime> {
        self.shared.wait(tag.0, timeout)
    }

    /// `tag`'s result if the operation ended, with when it ended in modeled time, without
    /// waiting and without moving this endpoint's clock (`Ok(None)`: still going); the
    /// result is collected, as by [`Endpoint::wait`]. For a library that keeps track of
    /// operations the program does not wait for, such as the deliveries of messages it
    /// keeps a copy of to send again: taking those as they come in real time would move
    /// the clock as far as the host happened to have delivered them, and every later post
    /// with it, so that a figure would depend on the host's timing. Where the program
    /// does wait for the result, [`Endpoint::advance_clock`] to its time says so.
    pub fn try_result(
        &self,
        tag: Tag,
    ) -> Result<Option<(std::result::Result<(), OpError>, ModelTime)>> {
        self.shared.try_result(tag.0)
    }

    /// This endpoint's modeled clock: operations are posted at it, and each completion,
    /// message or notification the program takes moves it to that event's modeled time.
    pub fn clock(&self) -> ModelTime {
        self.shared.clock()
    }

    /// The program waits, in modeled time, until `t`: the clock moves there if it is
    /// behind, never back (after counting, as every call does, the compute since the last
    /// one); returns the clock. Each process's clock starts where its daemon
    /// says (after what earlier programs did on the rack, docs/modeled-time.md), so ranks
    /// that attached at different moments start apart until their first exchange; a
    /// program that wants them to start together (as a benchmark of competing flows
    /// does) moves each to the latest start.
    pub fn advance_clock(&self, t: ModelTime) -> ModelTime {
        self.shared.advance_clock(t)
    }

    /// The program took an event of modeled time `at` that a library on top kept for it
    /// ([`Mailbox::try_recv_unclocked`]): the clock moves there if later, plus the rack's
    /// software cost of taking a message, as [`Mailbox::try_recv`] would have moved it.
    /// Returns the clock.
    pub fn took(&self, at: ModelTime) -> ModelTime {
        self.shared.took(at)
    }

    /// Says the program has nothing to do but wait for this endpoint until its next call,
    /// as a program that polls (an MPI library's progress loop) does between polls that
    /// found nothing: that host time is waiting, not compute, and does not move the
    /// modeled clock (see docs/modeled-time.md). Without it, the CPU a polling loop burns
    /// outside the library would count as the program's compute. Said while a [`Held`]
    /// guard lives, it holds from where the last guard or call ends.
    pub fn idle(&self) {
        self.shared.idle()
    }

    /// Takes back an [`Endpoint::idle`] said earlier inside the calls (holds) the program
    /// is in: a poll found something after all, and the program computes again from where
    /// they end. A library whose call polls in vain, then finds what it waited for (an MPI
    /// receive held whole, around the polls of its progress loop), says so; otherwise the
    /// program's compute after that call would be taken for waiting.
    pub fn busy(&self) {
        self.shared.busy()
    }

    /// Marks the program as inside a library built on this one (a libfabric provider, an
    /// MPI transport) until the guard drops: that time is the library's, as the time
    /// inside this library's own calls is, not the program's compute. Holds nest; the
    /// guard ends on the thread that took it (it is not `Send`).
    pub fn hold(&self) -> Held<'_> {
        Held(self.shared.enter())
    }

    /// Drops interest in `tag`: its result is discarded when it comes (failures are counted
    /// in [`Stats::forgotten_failures`]).
    pub fn forget(&self, tag: Tag) -> Result<()> {
        self.shared.forget(tag.0)
    }

    /// Operations posted and not completed yet.
    pub fn in_flight(&self) -> usize {
        self.shared.in_flight()
    }

    /// Processes the completions that are there, without waiting; returns how many.
    pub fn poll(&self) -> Result<u64> {
        self.shared.poll()
    }

    /// How many completions (of any kind) this endpoint has processed so far.
    pub fn events(&self) -> u64 {
        self.shared.events()
    }

    /// Waits until more than `seen` completions were processed (`false` on timeout). For
    /// event loops over several mailboxes and operations, without a lost wake-up:
    ///
    /// ```no_run
    /// # fn f(ep: &exanet::Endpoint, a: &exanet::Mailbox, b: &exanet::Mailbox) -> exanet::Result<()> {
    /// loop {
    ///     let seen = ep.events();
    ///     let mut idle = true;
    ///     while let Some(m) = a.try_recv()? { idle = false; /* ... */ }
    ///     while let Some(m) = b.try_recv()? { idle = false; /* ... */ }
    ///     if idle {
    ///         // Returns at once if a completion came in while we looked at a and b.
    ///         ep.wait_events(seen, None)?;
    ///     }
    /// }
    /// # }
    /// ```
    pub fn wait_events(&self, seen: u64, timeout: Option<Duration>) -> Result<bool> {
        self.shared.wait_events(seen, timeout)
    }

    /// The oldest completion notification received, if any.
    pub fn try_notification(&self) -> Result<Option<Notification>> {
        self.shared.notification(Some(Duration::ZERO))
    }

    /// Waits for a completion notification ([`Error::Timeout`] after `timeout`).
    pub fn wait_notification(&self, timeout: Option<Duration>) -> Result<Notification> {
        self.shared.notification(timeout)?.ok_or(Error::Timeout)
    }

    pub fn stats(&self) -> Stats {
        self.shared.stats()
    }
}

/// Memory registered with the NI: this rank's bytes at VA `va()..va()+len()`.
///
/// The daemon reads and writes it at any time, so it is accessed by copies
/// ([`MemoryRegion::read`], [`MemoryRegion::write`]), never by reference. Unregistered when
/// dropped.
#[derive(Debug)]
pub struct MemoryRegion {
    shared: Arc<Shared>,
    region: Region,
    id: u32,
    va: u64,
    len: u64,
}

impl Drop for MemoryRegion {
    fn drop(&mut self) {
        let _ = self
            .shared
            .control("unregister", &Request::Unregister { region: self.id }, &[]);
    }
}

impl MemoryRegion {
    /// See [`Endpoint::register`].
    pub(crate) fn register(shared: &Arc<Shared>, len: u64) -> Result<MemoryRegion> {
        if len == 0 {
            return Err(Error::BadLength {
                len,
                why: "a memory region cannot be empty",
            });
        }
        if len >= VA_LIMIT {
            return Err(Error::BadLength {
                len,
                why: "larger than the 39-bit VA space",
            });
        }
        let size = usize::try_from(len).map_err(|_| Error::BadLength {
            len,
            why: "does not fit this machine's address space",
        })?;
        // The daemon makes the memory (so that nothing about it can fault under the
        // daemon) and hands us its memfd.
        let (reply, fds) = shared.control_with_fds("register", &Request::Register { len }, &[])?;
        let region = match <[_; 1]>::try_from(fds) {
            Ok([fd]) => Region::from_fd_with_len(fd, size)
                .map_err(|e| Error::Protocol(format!("register: the daemon's memory: {e}")))?,
            Err(v) => {
                return Err(Error::Protocol(format!(
                    "register: {} descriptors instead of 1",
                    v.len()
                )))
            }
        };
        match reply {
            Reply::Registered { region: id, va } => {
                if va.checked_add(len).is_none_or(|end| end > VA_LIMIT) {
                    return Err(Error::Protocol(format!(
                        "register: VA {va:#x}+{len} outside the 39-bit VA space"
                    )));
                }
                Ok(MemoryRegion {
                    shared: Arc::clone(shared),
                    region,
                    id,
                    va,
                    len,
                })
            }
            other => Err(Error::Protocol(format!(
                "register: unexpected reply {other:?}"
            ))),
        }
    }

    /// The VA of the first byte in this rank's memory.
    pub fn va(&self) -> u64 {
        self.va
    }

    pub fn len(&self) -> u64 {
        self.len
    }

    /// Always `false`: regions are never empty.
    pub fn is_empty(&self) -> bool {
        false
    }

    /// The daemon's id of the region.
    pub fn id(&self) -> u32 {
        self.id
    }

    /// The GVAS of byte `offset` of this region, for a peer to target.
    pub fn gvas(&self, offset: u64) -> Result<Gvas> {
        self.check(offset, 0)?;
        let info = &self.shared.info;
        self.shared.gvas(info.node_id, info.rank, self.va + offset)
    }

    fn check(&self, offset: u64, len: u64) -> Result<()> {
        match offset.checked_add(len) {
            Some(end) if end <= self.len => Ok(()),
            _ => Err(Error::OutOfBounds {
                offset,
                len,
                region_len: self.len,
            }),
        }
    }

    /// Copies `buf.len()` bytes at `offset` out of the region.
    pub fn read(&self, offset: u64, buf: &mut [u8]) -> Result<()> {
        self.check(offset, buf.len() as u64)?;
        // In bounds of a region whose length fits usize.
        self.region.read(offset as usize, buf)?;
        Ok(())
    }

    /// Copies `data` into the region at `offset`.
    pub fn write(&self, offset: u64, data: &[u8]) -> Result<()> {
        self.check(offset, data.len() as u64)?;
        self.region.write(offset as usize, data)?;
        Ok(())
    }

    /// `len` bytes at `offset`, copied out.
    pub fn to_vec(&self, offset: u64, len: u64) -> Result<Vec<u8>> {
        self.check(offset, len)?;
        let mut v = vec![0u8; len as usize];
        self.region.read(offset as usize, &mut v)?;
        Ok(v)
    }
}

/// [`Error::BadChannel`] unless `ch` is one of an interface's `count` channels.
fn check_channel(ch: u8, count: u8) -> Result<()> {
    if ch < count {
        Ok(())
    } else {
        Err(Error::BadChannel { ch, count })
    }
}

/// A packetizer interface: sends messages of up to 64 bytes, one in flight per channel.
/// Freed when dropped.
#[derive(Debug)]
pub struct Packetizer {
    shared: Arc<Shared>,
    vi: u8,
}

impl Drop for Packetizer {
    fn drop(&mut self) {
        let _ = self.shared.free(Resource::Packetizer, self.vi);
    }
}

impl Packetizer {
    pub(crate) fn shared(&self) -> &Shared {
        &self.shared
    }

    /// Its index among the node's 64 packetizer interfaces.
    pub fn vi(&self) -> u8 {
        self.vi
    }

    fn check(&self, dst: &Gvas, data: &[u8]) -> Result<()> {
        if data.len() > MAX_MESSAGE {
            return Err(Error::PayloadTooLong {
                len: data.len(),
                max: MAX_MESSAGE,
            });
        }
        self.shared.check_dst(dst)
    }

    /// Sends `data` (<= 64 bytes) to `dst` on channel `ch` (0..=3). A mailbox destination
    /// comes from [`Endpoint::mailbox_addr`]. Completes when the destination ACKs (or NACKs,
    /// or never answers): [`Endpoint::wait`]. [`Error::ChannelBusy`] while the channel's
    /// previous message is in flight.
    pub fn send(&self, ch: u8, dst: Gvas, data: &[u8]) -> Result<Tag> {
        check_channel(ch, CHANNELS as u8)?;
        self.check(&dst, data)?;
        let vi = self.vi;
        self.shared
            .post(Chan::Packetizer { vi, ch }, |tag| Command::Send {
                tag,
                op: SendMessage {
                    vi,
                    ch,
                    dst,
                    payload: data.to_vec(),
                },
                // Stamped with the workload's clock as it is posted.
                at: ModelTime::ZERO,
            })
            .map(Tag)
    }

    /// [`Packetizer::send`] on a free channel, waiting (and making progress) while all
    /// four are busy.
    pub fn send_any(&self, dst: Gvas, data: &[u8]) -> Result<Tag> {
        self.send_on_any(dst, data, true)
    }

    /// [`Packetizer::send`] on a free channel without waiting: [`Error::ChannelBusy`]
    /// while all four are busy. Of the free channels, the one freed earliest in modeled
    /// time, as [`Packetizer::send_any`] takes: a channel is free once its message's ACK
    /// came, and taking the first free one, whose ACK may be later than this endpoint's
    /// clock while an earlier one's is not yet in from the host, would move the clock
    /// to that ACK with the host's timing.
    pub fn try_send_any(&self, dst: Gvas, data: &[u8]) -> Result<Tag> {
        self.send_on_any(dst, data, false)
    }

    fn send_on_any(&self, dst: Gvas, data: &[u8], wait: bool) -> Result<Tag> {
        self.check(&dst, data)?;
        let vi = self.vi;
        self.shared
            .post_any(
                |ch| Chan::Packetizer { vi, ch },
                CHANNELS as u8,
                wait,
                |tag, ch| Command::Send {
                    tag,
                    op: SendMessage {
                        vi,
                        ch,
                        dst,
                        payload: data.to_vec(),
                    },
                    // Stamped with the workload's clock as it is posted.
                    at: ModelTime::ZERO,
                },
            )
            .map(Tag)
    }
}

/// A mailbox: a queue in the NI that any rank of the same PDID can send messages to.
/// Freed when dropped.
#[derive(Debug)]
pub struct Mailbox {
    shared: Arc<Shared>,
    vi: u8,
    generation: u32,
    capacity: u32,
    addr: Gvas,
}

impl Drop for Mailbox {
    fn drop(&mut self) {
        let _ = self.shared.free(Resource::Mailbox, self.vi);
        self.shared.close_mailbox(self.vi, self.generation);
    }
}

impl Mailbox {
    /// Its index among the node's 64 mailboxes (what senders put in the address).
    pub fn vi(&self) -> u8 {
        self.vi
    }

    pub fn capacity(&self) -> u32 {
        self.capacity
    }

    /// The GVAS senders use to reach this mailbox.
    pub fn addr(&self) -> Gvas {
        self.addr
    }

    /// The next message, if one arrived.
    pub fn try_recv(&self) -> Result<Option<Message>> {
        self.shared.recv(self.vi, Some(Duration::ZERO), true)
    }

    /// [`Mailbox::try_recv`] without moving the endpoint's clock to the message: for a
    /// library that keeps messages until the program asks for them (an MPI library's
    /// unexpected messages). Taking them as the host delivered them would move the clock
    /// before the program's next post, or not, with the host's timing; the library says
    /// when the program takes one with [`Endpoint::took`]`(message.at)`.
    pub fn try_recv_unclocked(&self) -> Result<Option<Message>> {
        self.shared.recv(self.vi, Some(Duration::ZERO), false)
    }

    /// Waits for the next message ([`Error::Timeout`] after `timeout`; `None`: no limit).
    pub fn recv(&self, timeout: Option<Duration>) -> Result<Message> {
        self.shared
            .recv(self.vi, timeout, true)?
            .ok_or(Error::Timeout)
    }

    /// Messages received and not taken yet (client side).
    pub fn queued(&self) -> usize {
        self.shared.queued(self.vi)
    }
}

/// An RDMA page: 32 write and 32 read channels, one transfer in flight per channel.
/// Freed when dropped.
#[derive(Debug)]
pub struct RdmaPage {
    shared: Arc<Shared>,
    page: u8,
}

impl Drop for RdmaPage {
    fn drop(&mut self) {
        let _ = self.shared.free(Resource::RdmaPage, self.page);
    }
}

/// Write channels per RDMA page.
pub const RDMA_WRITE_CHANNELS: u8 = WRITE_CHANNELS as u8;
/// Read channels per RDMA page.
pub const RDMA_READ_CHANNELS: u8 = READ_CHANNELS as u8;

impl RdmaPage {
    /// See [`Endpoint::rdma_page`].
    pub(crate) fn alloc(shared: &Arc<Shared>) -> Result<RdmaPage> {
        let page = shared.alloc(Resource::RdmaPage, None)?;
        Ok(RdmaPage {
            shared: Arc::clone(shared),
            page,
        })
    }

    pub(crate) fn shared(&self) -> &Shared {
        &self.shared
    }

    /// Its index among the node's 16 RDMA pages.
    pub fn page(&self) -> u8 {
        self.page
    }

    fn check_local(&self, region: &MemoryRegion, offset: u64, len: u64) -> Result<()> {
        if !Arc::ptr_eq(&region.shared, &self.shared) {
            return Err(Error::ForeignRegion);
        }
        if len == 0 || len > MAX_TRANSFER {
            return Err(Error::BadLength {
                len,
                why: "a transfer is 1 byte to 4 GiB",
            });
        }
        region.check(offset, len)
    }

    fn check_remote(&self, addr: &Gvas, len: u64) -> Result<()> {
        self.shared.check_dst(addr)?;
        if addr.va() + len > VA_LIMIT {
            return Err(Error::BadAddress(format!(
                "{addr} + {len} bytes runs past the 39-bit VA space"
            )));
        }
        Ok(())
    }

    /// RDMA-writes `len` (1..=[`crate::MAX_TRANSFER`]) bytes at `offset` of `src` to `dst`,
    /// on write channel `ch` (0..=31). With `notify`, once every block is ACKed the NI
    /// writes a completion notification at that VA of the destination rank: 16 bytes (kind
    /// 1, status 0, two zero bytes, the writer's transfer id as a big-endian u32, the
    /// length as a big-endian u64), which must lie in memory that rank registered (else the
    /// write ends NACKed `page_fault`, its data written). Completes when every block and
    /// the notification are ACKed.
    pub fn write(
        &self,
        ch: u8,
        src: &MemoryRegion,
        offset: u64,
        dst: Gvas,
        len: u64,
        notify: Option<u64>,
    ) -> Result<Tag> {
        check_channel(ch, RDMA_WRITE_CHANNELS)?;
        let build = self.write_command(src, offset, dst, len, notify)?;
        let page = self.page;
        self.shared
            .post(Chan::RdmaWrite { page, ch }, |tag| build(tag, ch))
            .map(Tag)
    }

    /// [`RdmaPage::write`] on a free write channel without waiting: [`Error::ChannelBusy`]
    /// while all are busy. Of the free channels, the one freed earliest in modeled time
    /// (see [`Packetizer::try_send_any`]).
    pub fn try_write_any(
        &self,
        src: &MemoryRegion,
        offset: u64,
        dst: Gvas,
        len: u64,
        notify: Option<u64>,
    ) -> Result<Tag> {
        let build = self.write_command(src, offset, dst, len, notify)?;
        let page = self.page;
        self.shared
            .post_any(
                |ch| Chan::RdmaWrite { page, ch },
                RDMA_WRITE_CHANNELS,
                false,
                build,
            )
            .map(Tag)
    }

    /// Checks a write's arguments; builds its command from its tag and channel.
    fn write_command(
        &self,
        src: &MemoryRegion,
        offset: u64,
        dst: Gvas,
        len: u64,
        notify: Option<u64>,
    ) -> Result<impl FnOnce(u32, u8) -> Command> {
        self.check_local(src, offset, len)?;
        self.check_remote(&dst, len)?;
        if let Some(n) = notify {
            if n >= VA_LIMIT {
                return Err(Error::BadAddress(format!(
                    "notification VA {n:#x} outside the 39-bit VA space"
                )));
            }
        }
        let page = self.page;
        let src_va = src.va + offset;
        Ok(move |tag, ch| Command::Write {
            tag,
            op: RdmaWrite {
                page,
                ch,
                src_va,
                dst,
                len,
                notify,
            },
            // Stamped with the workload's clock as it is posted.
            at: ModelTime::ZERO,
        })
    }

    /// RDMA-reads `len` (1..=[`crate::MAX_TRANSFER`]) bytes at `src` into `dst` at
    /// `offset`, on read channel `ch` (0..=31). Completes when the data is in `dst`.
    pub fn read(
        &self,
        ch: u8,
        src: Gvas,
        dst: &MemoryRegion,
        offset: u64,
        len: u64,
    ) -> Result<Tag> {
        check_channel(ch, RDMA_READ_CHANNELS)?;
        let build = self.read_command(src, dst, offset, len)?;
        let page = self.page;
        self.shared
            .post(Chan::RdmaRead { page, ch }, |tag| build(tag, ch))
            .map(Tag)
    }

    /// [`RdmaPage::read`] on a free read channel without waiting: [`Error::ChannelBusy`]
    /// while all are busy. Of the free channels, the one freed earliest in modeled time
    /// (see [`Packetizer::try_send_any`]).
    pub fn try_read_any(
        &self,
        src: Gvas,
        dst: &MemoryRegion,
        offset: u64,
        len: u64,
    ) -> Result<Tag> {
        let build = self.read_command(src, dst, offset, len)?;
        let page = self.page;
        self.shared
            .post_any(
                |ch| Chan::RdmaRead { page, ch },
                RDMA_READ_CHANNELS,
                false,
                build,
            )
            .map(Tag)
    }

    /// Checks a read's arguments; builds its command from its tag and channel.
    fn read_command(
        &self,
        src: Gvas,
        dst: &MemoryRegion,
        offset: u64,
        len: u64,
    ) -> Result<impl FnOnce(u32, u8) -> Command> {
        self.check_local(dst, offset, len)?;
        self.check_remote(&src, len)?;
        let page = self.page;
        let dst_va = dst.va + offset;
        Ok(move |tag, ch| Command::Read {
            tag,
            op: RdmaRead {
                page,
                ch,
                src,
                dst_va,
                len,
            },
            // Stamped with the workload's clock as it is posted.
            at: ModelTime::ZERO,
        })
    }
}
