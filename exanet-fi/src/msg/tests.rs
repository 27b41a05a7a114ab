//! The message engine between endpoints of a simulated fabric: packets delivered in any
//! order, refused and sent again, rendezvous read from the sender's staged bytes.

use std::collections::HashMap;

use super::wire::{FinStatus, RmaStatus};
use super::*;

fn peer(node: u32, vi: u8) -> Peer {
    Peer { node, rank: 0, vi }
}

fn any(tag: u64) -> Accepts {
    Accepts {
        from: None,
        tagged: true,
        tag,
        ignore: 0,
    }
}

/// Endpoints, what their staged sends hold, and the packets on the wire.
struct Net {
    eps: Vec<Engine>,
    /// Staged bytes by (node, rank, va).
    staged: HashMap<(u32, u8, u64), Vec<u8>>,
    /// Fetched bytes by (endpoint index, fetch id).
    fetched: HashMap<(usize, u64), Vec<u8>>,
    wire: Vec<(usize, Transmit)>,
    events: Vec<(usize, Event)>,
    next_va: u64,
    rng: u64,
    /// When staged sends complete.
    complete: Complete,
    /// Registered regions: (endpoint index, key) -> (first address, bytes, remote
    /// writes allowed).
    regions: HashMap<(usize, u64), (u64, Vec<u8>, bool)>,
    /// What served reads wrote, by (node, rank, va) of the reader.
    pushed: HashMap<(u32, u8, u64), Vec<u8>>,
    /// The drivers' clock, in ns: a microsecond a packet, and when the wire is empty, on
    /// to when the next refused packet is due again.
    now: u64,
}

impl Net {
    fn new(peers: &[Peer], cfg: Config) -> Net {
        Net {
            eps: peers.iter().map(|&p| Engine::new(p, cfg)).collect(),
            staged: HashMap::new(),
            fetched: HashMap::new(),
            wire: Vec::new(),
            events: Vec::new(),
            next_va: 0x1000,
            rng: 0x9E37_79B9_7F4A_7C15,
            complete: Complete::Transmit,
            regions: HashMap::new(),
            pushed: HashMap::new(),
            now: 0,
        }
    }

    /// What region `key` of endpoint `i` allows for `len` bytes at `addr`.
    fn range(
        &mut self,
        i: usize,
        key: u64,
        addr: u64,
        len: usize,
        write: bool,
    ) -> Result<&mut [u8], RmaRefusal> {
        let (start, mem, writable) = self.regions.get_mut(&(i, key)).ok_or(RmaRefusal::Denied)?;
        if write && !*writable {
            return Err(RmaRefusal::Denied);
        }
        let off = addr.checked_sub(*start).ok_or(RmaRefusal::Denied)? as usize;
        mem.get_mut(off..off + len).ok_or(RmaRefusal::Denied)
    }

    fn index(&self, p: Peer) -> usize {
        self.eps
            .iter()
            .position(|e| e.me() == p)
            .expect("known endpoint")
    }

    fn random(&mut self) -> u64 {
        self.rng ^= self.rng << 13;
        self.rng ^= self.rng >> 7;
        self.rng ^= self.rng << 17;
        self.rng
    }

    /// Sends as a driver would: eager when it fits, else staged.
    fn send(&mut self, from: usize, to: Peer, tag: Option<u64>, data: &[u8], ctx: u64) {
        let e = &mut self.eps[from];
        let out = if data.len() <= e.eager_limit() {
            Outgoing::Inline(data.to_vec())
        } else {
            let va = self.next_va;
            self.next_va += 1 << 20;
            let me = e.me();
            self.staged.insert((me.node, me.rank, va), data.to_vec());
            Outgoing::Staged {
                va,
                len: data.len() as u64,
                complete: self.complete,
            }
        };
        e.send(to, tag, None, out, ctx).unwrap();
    }

    /// Carries out every endpoint's actions; packets go onto the wire.
    fn act(&mut self) {
        for i in 0..self.eps.len() {
            while let Some(a) = self.eps[i].poll_action() {
                match a {
                    Action::Transmit(t) => self.wire.push((i, t)),
                    Action::Fetch(f) => {
                        if let Some(t) = f.into {
                            if self.range(i, t.key, t.addr, f.len as usize, true).is_err() {
                                self.eps[i].fetch_denied(f.id);
                                continue;
                            }
                        }
                        let src = &self.staged[&(f.node, f.rank, f.va)];
                        self.fetched
                            .insert((i, f.id), src[..f.len as usize].to_vec());
                        self.eps[i].fetch_done(f.id, Ok(())).unwrap();
                    }
                    Action::Store(st) => {
                        let data = match st.data {
                            Data::Inline(b) => b,
                            Data::Fetched { fetch, .. } => {
                                self.fetched.remove(&(i, fetch)).unwrap()
                            }
                        };
                        let r = self
                            .range(i, st.key, st.addr, data.len(), true)
                            .map(|m| m.copy_from_slice(&data));
                        self.eps[i].rma_served(st.reply, r);
                    }
                    Action::Push(p) => {
                        let r = self
                            .range(i, p.key, p.addr, p.len as usize, false)
                            .map(|m| m.to_vec());
                        let r = r.map(|b| {
                            self.pushed.insert((p.node, p.rank, p.va), b);
                        });
                        self.eps[i].rma_served(p.reply, r);
                    }
                }
            }
            while let Some(ev) = self.eps[i].poll_event() {
                self.events.push((i, ev));
            }
        }
    }

    /// Delivers everything on the wire, `shuffle`d or in order, each packet refused for a
    /// full mailbox with probability `refuse`/8 (then sent again).
    fn run(&mut self, shuffle: bool, refuse: u64) {
        self.act();
        loop {
            self.carry(shuffle, refuse);
            // Refused packets wait to go again: let their time come.
            self.now += Config::default().resend_max_ns;
            for e in &mut self.eps {
                e.handle_timeout(self.now);
            }
            self.act();
            if self.wire.is_empty() {
                return;
            }
        }
    }

    /// Carries what is on the wire until nothing is.
    fn carry(&mut self, shuffle: bool, refuse: u64) {
        while !self.wire.is_empty() {
            self.now += 1_000;
            let k = if shuffle {
                (self.random() % self.wire.len() as u64) as usize
            } else {
                0
            };
            let (from, t) = self.wire.remove(k);
            let me = self.eps[from].me();
            if self.random() % 8 < refuse {
                self.eps[from]
                    .packet_done(t.token, Delivery::Refused)
                    .unwrap();
            } else {
                let to = self.index(t.to);
                self.eps[to]
                    .on_packet(me.node, me.rank, &t.bytes, 0)
                    .unwrap();
                self.eps[from]
                    .packet_done(t.token, Delivery::Delivered { at: 0 })
                    .unwrap();
            }
            self.act();
        }
    }

    /// What receive `ctx` of endpoint `i` got, as bytes.
    fn received(&self, i: usize, ctx: u64) -> Option<(Peer, Option<u64>, u64, Vec<u8>)> {
        self.events.iter().find_map(|(at, ev)| match ev {
            Event::Received {
                ctx: c,
                from,
                tag,
                len,
                data,
                ..
            } if *at == i && *c == ctx => {
                let bytes = match data {
                    Data::Inline(b) => b.clone(),
                    Data::Fetched { fetch, .. } => self.fetched[&(i, *fetch)].clone(),
                };
                Some((*from, *tag, *len, bytes))
            }
            _ => None,
        })
    }

    /// Whether endpoint `i` released the staging of send `ctx`.
    fn released(&self, i: usize, ctx: u64) -> bool {
        self.events
            .iter()
            .any(|(at, ev)| *at == i && *ev == Event::Released { ctx })
    }

    fn rma_done(&self, i: usize, ctx: u64) -> Option<Result<(), Failure>> {
        self.events.iter().find_map(|(at, ev)| match ev {
            Event::RmaDone { ctx: c, result, .. } if *at == i && *c == ctx => Some(result.clone()),
            _ => None,
        })
    }

    fn sent(&self, i: usize, ctx: u64) -> Option<Result<(), Failure>> {
        self.events.iter().find_map(|(at, ev)| match ev {
            Event::Sent { ctx: c, result, .. } if *at == i && *c == ctx => Some(result.clone()),
            _ => None,
        })
    }
}

fn bytes(seed: u64, n: usize) -> Vec<u8> {
    (0..n as u64)
        .map(|i| (i.wrapping_mul(31) ^ seed.wrapping_mul(0x9E37)) as u8)
        .collect()
}

#[test]
fn eager_and_rendezvous_messages_arrive_whole_posted_before_or_after() {
    let (a, b) = (peer(1, 0), peer(6, 2));
    let mut net = Net::new(&[a, b], Config::default());
    let sizes = [0usize, 1, 32, 33, 4096, 1 << 20];
    // Half the receives before the messages, half after.
    for (k, &n) in sizes.iter().enumerate() {
        if k % 2 == 0 {
            net.eps[1].post_recv(any(k as u64), 1 << 20, 100 + k as u64);
        }
        net.send(0, b, Some(k as u64), &bytes(k as u64, n), k as u64);
    }
    net.run(false, 0);
    for (k, _) in sizes.iter().enumerate() {
        if k % 2 == 1 {
            net.eps[1].post_recv(any(k as u64), 1 << 20, 100 + k as u64);
        }
    }
    net.run(false, 0);
    for (k, &n) in sizes.iter().enumerate() {
        let (from, tag, len, got) = net.received(1, 100 + k as u64).expect("received");
        assert_eq!(
            (from, tag, len),
            (a, Some(k as u64), n as u64),
            "message {k}"
        );
        assert_eq!(got, bytes(k as u64, n), "message {k}");
        assert_eq!(net.sent(0, k as u64), Some(Ok(())), "send {k}");
    }
    let s = net.eps[0].stats();
    assert_eq!((s.eager_sent, s.rendezvous_sent), (3, 3));
    assert_eq!(net.eps[1].stats().unexpected, 3);
}

#[test]
fn messages_match_in_the_order_sent_whatever_order_they_arrive_in() {
    let (a, b) = (peer(1, 0), peer(2, 0));
    for seed in 1..20u64 {
        let mut net = Net::new(&[a, b], Config::default());
        net.rng ^= seed;
        for k in 0..12u64 {
            net.eps[1].post_recv(any(7), 64, k);
        }
        // Same tag: only the order tells the receives apart. Mixed eager and rendezvous,
        // delivered shuffled, a quarter refused and sent again.
        for k in 0..12u64 {
            let n = if k % 3 == 0 { 100 } else { 8 };
            net.send(0, b, Some(7), &bytes(k, n), k);
        }
        net.run(true, 2);
        for k in 0..12u64 {
            let n = if k % 3 == 0 { 100 } else { 8 };
            let (_, _, len, got) = net.received(1, k).unwrap();
            assert_eq!(
                (len, got.len()),
                (n, 64.min(n as usize)),
                "seed {seed} k {k}"
            );
            assert_eq!(
                got[..],
                bytes(k, n as usize)[..got.len()],
                "seed {seed} k {k}"
            );
        }
    }
}

#[test]
fn tags_ignore_bits_sources_and_untagged_messages_match_as_libfabric_says() {
    let (a, b, c) = (peer(1, 0), peer(2, 0), peer(3, 5));
    let mut net = Net::new(&[a, b, c], Config::default());
    // From c only; from anyone with the low byte ignored; untagged.
    net.eps[1].post_recv(
        Accepts {
            from: Some(c),
            tagged: true,
            tag: 0x10,
            ignore: 0,
        },
        64,
        1,
    );
    net.eps[1].post_recv(
        Accepts {
            from: None,
            tagged: true,
            tag: 0xAB00,
            ignore: 0xFF,
        },
        64,
        2,
    );
    net.eps[1].post_recv(
        Accepts {
            from: None,
            tagged: false,
            tag: 0,
            ignore: 0,
        },
        64,
        3,
    );
    net.send(0, b, Some(0x10), b"from a, tag 0x10", 10); // not for 1 (wrong source)
    net.send(0, b, None, b"untagged", 11);
    net.send(0, b, Some(0xAB42), b"low byte ignored", 12);
    net.send(2, b, Some(0x10), b"from c", 13);
    net.run(false, 0);
    assert_eq!(net.received(1, 1).unwrap().3, b"from c");
    assert_eq!(net.received(1, 2).unwrap().1, Some(0xAB42));
    assert_eq!(net.received(1, 3).unwrap().3, b"untagged");
    // The first message waits, unexpected, for a receive that accepts it.
    let p = net.eps[1].peek(&any(0x10)).unwrap();
    assert_eq!((p.from, p.tag, p.len), (a, Some(0x10), 16));
    net.eps[1].post_recv(any(0x10), 64, 4);
    net.act();
    assert_eq!(net.received(1, 4).unwrap().0, a);
    assert_eq!(net.eps[1].peek(&any(0x10)), None);
}

#[test]
fn a_claimed_message_goes_only_to_the_receive_that_names_it() {
    let (a, b) = (peer(1, 0), peer(2, 0));
    let mut net = Net::new(&[a, b], Config::default());
    net.send(0, b, Some(5), &bytes(5, 3000), 1);
    net.send(0, b, Some(5), b"second", 2);
    net.run(false, 0);
    let (claim, p) = net.eps[1].claim(&any(5)).unwrap();
    assert_eq!((p.from, p.len), (a, 3000));
    // A receive for the same tag takes the next one, not the claimed one.
    net.eps[1].post_recv(any(5), 64, 10);
    net.act();
    assert_eq!(net.received(1, 10).unwrap().3, b"second");
    assert!(net.eps[1].recv_claimed(claim, 4096, 11));
    assert!(!net.eps[1].recv_claimed(claim, 4096, 12));
    net.run(false, 0);
    assert_eq!(net.received(1, 11).unwrap().3, bytes(5, 3000));
    assert_eq!(net.sent(0, 1), Some(Ok(())));
}

#[test]
fn a_short_receive_gets_what_fits_and_the_message_length() {
    let (a, b) = (peer(1, 0), peer(2, 0));
    let mut net = Net::new(&[a, b], Config::default());
    net.eps[1].post_recv(any(1), 10, 1);
    net.eps[1].post_recv(any(2), 1000, 2);
    net.eps[1].post_recv(any(3), 0, 3);
    net.send(0, b, Some(1), &bytes(1, 30), 1);
    net.send(0, b, Some(2), &bytes(2, 5000), 2);
    net.send(0, b, Some(3), &bytes(3, 5000), 3);
    net.run(false, 0);
    let r1 = net.received(1, 1).unwrap();
    assert_eq!((r1.2, r1.3), (30, bytes(1, 30)[..10].to_vec()));
    let r2 = net.received(1, 2).unwrap();
    assert_eq!((r2.2, r2.3), (5000, bytes(2, 5000)[..1000].to_vec()));
    let r3 = net.received(1, 3).unwrap();
    assert_eq!((r3.2, r3.3.len()), (5000, 0));
    // Truncation is the receiver's: every send completed.
    for k in 1..=3 {
        assert_eq!(net.sent(0, k), Some(Ok(())));
    }
}

#[test]
fn cancelled_refused_and_failed_operations_end_with_their_reason() {
    let (a, b) = (peer(1, 0), peer(2, 0));
    let mut net = Net::new(&[a, b], Config::default());
    net.eps[1].post_recv(any(9), 64, 1);
    assert!(net.eps[1].cancel_recv(1));
    assert!(!net.eps[1].cancel_recv(1));
    net.act();
    assert!(net.events.contains(&(
        1,
        Event::RecvFailed {
            ctx: 1,
            error: Failure::Cancelled
        }
    )));
    // A destination that cannot be reached fails the send (eager and rendezvous).
    net.send(0, b, Some(1), b"x", 5);
    net.send(0, b, Some(1), &bytes(0, 500), 6);
    net.act();
    for (_, t) in std::mem::take(&mut net.wire) {
        net.eps[0]
            .packet_done(t.token, Delivery::Failed("unreachable".into()))
            .unwrap();
    }
    net.act();
    for ctx in [5, 6] {
        assert!(matches!(
            net.sent(0, ctx),
            Some(Err(Failure::Unreachable(_)))
        ));
    }
    // A read that fails: the receive fails; a sender that asked for delivery completion
    // hears it was refused, one with transmit completion had completed when the request
    // arrived (the failure is counted); both free their staging.
    for complete in [Complete::Delivery, Complete::Transmit] {
        let mut net = Net::new(&[a, b], Config::default());
        net.complete = complete;
        net.eps[1].post_recv(any(1), 1 << 20, 1);
        net.send(0, b, Some(1), &bytes(0, 5000), 1);
        net.act();
        let (_, rts) = net.wire.remove(0);
        net.eps[1].on_packet(1, 0, &rts.bytes, 0).unwrap();
        let Some(Action::Fetch(f)) = net.eps[1].poll_action() else {
            panic!("a fetch")
        };
        net.eps[1]
            .fetch_done(f.id, Err("page fault".into()))
            .unwrap();
        net.eps[0]
            .packet_done(rts.token, Delivery::Delivered { at: 0 })
            .unwrap();
        net.run(false, 0);
        assert!(matches!(
            net.events.iter().find(|(i, _)| *i == 1).map(|(_, e)| e),
            Some(Event::RecvFailed {
                ctx: 1,
                error: Failure::ReadFailed(_)
            })
        ));
        let (sent, late) = match complete {
            Complete::Delivery => (Err(Failure::Refused), 0),
            Complete::Transmit => (Ok(()), 1),
        };
        assert_eq!(net.sent(0, 1), Some(sent));
        assert_eq!(net.eps[0].stats().refused_after_completion, late);
        assert!(net.released(0, 1));
    }
}

#[test]
fn hostile_or_confused_peers_get_typed_errors_and_change_nothing() {
    let (a, b) = (peer(1, 0), peer(2, 0));
    let mut e = Engine::new(b, Config::default());
    assert!(matches!(
        e.on_packet(1, 0, &[1, 2], 0),
        Err(MsgError::Malformed { .. })
    ));
    let far = Packet::Eager {
        src_vi: 0,
        seq: 1000,
        tag: Some(1),
        cq_data: None,
        payload: vec![],
    }
    .encode()
    .unwrap();
    assert!(matches!(
        e.on_packet(1, 0, &far, 0),
        Err(MsgError::TooFarAhead { seq: 1000, .. })
    ));
    assert_eq!(
        e.packet_done(77, Delivery::Delivered { at: 0 }),
        Err(MsgError::UnknownToken(77))
    );
    assert_eq!(e.fetch_done(5, Ok(())), Err(MsgError::UnknownFetch(5)));
    // A FIN from another endpoint than the request went to ends nothing.
    let mut s = Engine::new(a, Config::default());
    let staged = Outgoing::Staged {
        va: 0,
        len: 100,
        complete: Complete::Delivery,
    };
    s.send(b, Some(1), None, staged, 1).unwrap();
    let fin = Packet::Fin {
        src_vi: 9,
        id: 0,
        status: FinStatus::Done,
    }
    .encode()
    .unwrap();
    s.on_packet(2, 0, &fin, 0).unwrap();
    assert_eq!(s.poll_event(), None);
    assert_eq!(e.stats().malformed, 1);
    // An eager send over the limit is refused before anything is sent.
    assert_eq!(
        s.send(b, None, None, Outgoing::Inline(vec![0; 33]), 2),
        Err(MsgError::TooLongForEager { len: 33, limit: 32 })
    );
}

#[test]
fn unexpected_messages_are_bounded_by_what_the_endpoint_takes_in() {
    let (a, b) = (peer(1, 0), peer(2, 0));
    let cfg = Config {
        max_unexpected: 3,
        ..Config::default()
    };
    let mut net = Net::new(&[a, b], cfg);
    for k in 0..3 {
        net.send(0, b, Some(k), b"m", k);
    }
    net.run(false, 0);
    assert!(!net.eps[1].has_room());
    net.eps[1].post_recv(any(1), 8, 1);
    net.act();
    assert!(net.eps[1].has_room());
    assert_eq!(net.received(1, 1).unwrap().1, Some(1));
}

#[test]
fn one_sided_writes_and_reads_reach_the_registered_region_only() {
    let (a, b) = (peer(1, 0), peer(6, 2));
    let mut net = Net::new(&[a, b], Config::default());
    // Endpoint b registers 64 KiB from address 0x9000 for remote writes (key 7) and
    // another region for reads only (key 8).
    net.regions
        .insert((1, 7), (0x9000, vec![0; 64 << 10], true));
    net.regions.insert((1, 8), (0, bytes(8, 4096), false));
    let sizes = [1usize, 40, 41, 4096, 60 << 10];
    for (k, &n) in sizes.iter().enumerate() {
        let data = bytes(k as u64, n);
        let out = if n <= EAGER_MAX {
            RmaData::Inline(data)
        } else {
            let va = 0x100_0000 * (k as u64 + 1);
            net.staged.insert((a.node, a.rank, va), data);
            RmaData::Staged { len: n as u64, va }
        };
        let target = RmaTarget {
            key: 7,
            addr: 0x9000 + 17 * k as u64,
        };
        net.eps[0].rma_write(b, target, out, k as u64);
        net.run(true, 2);
        assert_eq!(net.rma_done(0, k as u64), Some(Ok(())), "write of {n} B");
        let at = 17 * k;
        assert_eq!(
            net.regions[&(1, 7)].1[at..at + n],
            bytes(k as u64, n)[..],
            "write of {n} B"
        );
    }
    // Reads land where the reader asked.
    net.eps[0].rma_read(b, RmaTarget { key: 8, addr: 100 }, 1000, 0x5000, 50);
    net.run(true, 2);
    assert_eq!(net.rma_done(0, 50), Some(Ok(())));
    assert_eq!(net.pushed[&(1, 0, 0x5000)], bytes(8, 4096)[100..1100]);
    // Refused: a read-only region written, an unknown key, past the end, before the start.
    let refused = [
        (RmaTarget { key: 8, addr: 0 }, true, 8u64),
        (RmaTarget { key: 9, addr: 0 }, false, 8),
        (RmaTarget { key: 8, addr: 4000 }, false, 97),
        (
            RmaTarget {
                key: 7,
                addr: 0x8fff,
            },
            true,
            2,
        ),
    ];
    let before = net.regions.clone();
    for (k, &(target, write, len)) in refused.iter().enumerate() {
        let ctx = 60 + k as u64;
        if write {
            net.eps[0].rma_write(b, target, RmaData::Inline(vec![1; len as usize]), ctx);
        } else {
            net.eps[0].rma_read(b, target, len, 0x6000, ctx);
        }
        net.run(true, 0);
        assert_eq!(
            net.rma_done(0, ctx),
            Some(Err(Failure::RmaDenied)),
            "{target:?}"
        );
    }
    assert_eq!(net.regions, before, "a refused operation changed nothing");
    assert!(!net.pushed.contains_key(&(1, 0, 0x6000)));
    assert_eq!(net.eps[1].stats().rma_refused, 4);
    assert_eq!(net.eps[1].stats().rma_served, 10);
}

#[test]
fn an_answer_from_another_endpoint_does_not_end_an_operation() {
    let (a, b, c) = (peer(1, 0), peer(6, 2), peer(7, 0));
    let mut net = Net::new(&[a, b, c], Config::default());
    net.eps[0].rma_read(b, RmaTarget { key: 1, addr: 0 }, 8, 0x5000, 1);
    // c forges b's answer (same id 0, as the first operation's).
    let forged = Packet::RmaDone {
        src_vi: c.vi,
        id: 0,
        status: RmaStatus::Done,
    }
    .encode()
    .unwrap();
    net.eps[0].on_packet(c.node, c.rank, &forged, 0).unwrap();
    net.act();
    assert_eq!(net.rma_done(0, 1), None, "ended by a stranger");
    net.run(false, 0);
    assert_eq!(
        net.rma_done(0, 1),
        Some(Err(Failure::RmaDenied)),
        "b has no region 1"
    );
}

#[test]
fn a_target_serving_too_many_operations_takes_no_more_messages() {
    let (a, b) = (peer(1, 0), peer(6, 2));
    let mut e = Engine::new(b, Config::default());
    for id in 0..RMA_SERVED_MAX as u32 {
        assert!(e.has_room());
        let p = Packet::RmaRead {
            src_vi: a.vi,
            id,
            key: 1,
            addr: 0,
            len: 8,
            va: 0,
        }
        .encode()
        .unwrap();
        e.on_packet(a.node, a.rank, &p, 0).unwrap();
    }
    assert!(!e.has_room(), "served without bound");
    let Some(Action::Push(p)) = e.poll_action() else {
        panic!("no push")
    };
    e.rma_served(p.reply, Ok(()));
    assert!(e.has_room(), "an answered one frees its place");
}

#[test]
fn a_request_longer_than_any_operation_is_refused_before_anything_is_set_aside() {
    let (a, b) = (peer(1, 0), peer(6, 2));
    let mut e = Engine::new(b, Config::default());
    for p in [
        Packet::RmaRead {
            src_vi: a.vi,
            id: 1,
            key: 1,
            addr: 0,
            len: u64::MAX,
            va: 0,
        },
        Packet::RmaWrite {
            src_vi: a.vi,
            id: 2,
            key: 1,
            addr: 0,
            data: RmaData::Staged {
                len: RMA_MAX + 1,
                va: 0,
            },
        },
    ] {
        e.on_packet(a.node, a.rank, &p.encode().unwrap(), 0)
            .unwrap();
    }
    let mut answers = 0;
    while let Some(act) = e.poll_action() {
        let Action::Transmit(t) = act else {
            panic!("{act:?}: something was to be read or loaded")
        };
        assert!(matches!(
            Packet::decode(&t.bytes),
            Ok(Packet::RmaDone {
                status: RmaStatus::Denied,
                ..
            })
        ));
        answers += 1;
    }
    assert_eq!(answers, 2);
    assert!(e.has_room(), "refused ones hold no place");
}

#[test]
fn a_staged_write_its_region_does_not_allow_is_never_read() {
    let (a, b) = (peer(1, 0), peer(6, 2));
    let mut net = Net::new(&[a, b], Config::default());
    net.regions.insert((1, 7), (0, vec![0; 100], true));
    // Longer than the region: refused without the data being read (the harness would
    // panic reading a staged buffer it does not have).
    net.eps[0].rma_write(
        b,
        RmaTarget { key: 7, addr: 0 },
        RmaData::Staged {
            len: 4096,
            va: 0xdead_0000,
        },
        1,
    );
    net.run(false, 0);
    assert_eq!(net.rma_done(0, 1), Some(Err(Failure::RmaDenied)));
    assert!(net.fetched.is_empty());
}

/// A request that timed out unanswered may still reach its destination: the memory it
/// names (a read's landing place, staged data) stays until the destination answers, and
/// an answer that comes late completes nothing twice. One never posted frees it at once.
#[test]
fn memory_a_request_names_stays_while_its_destination_may_still_use_it() {
    let (a, b) = (peer(1, 0), peer(6, 2));
    let released = |e: &mut Engine| {
        let mut done = Vec::new();
        let mut rel = Vec::new();
        while let Some(ev) = e.poll_event() {
            match ev {
                Event::RmaDone { ctx, result, .. } => done.push((ctx, result.is_ok())),
                Event::RmaReleased { ctx } | Event::Released { ctx } => rel.push(ctx),
                Event::Sent { ctx, result, .. } => done.push((ctx, result.is_ok())),
                _ => {}
            }
        }
        (done, rel)
    };
    let mut e = Engine::new(a, Config::default());
    e.rma_read(b, RmaTarget { key: 1, addr: 0 }, 64, 0x5000, 1);
    e.rma_read(b, RmaTarget { key: 1, addr: 0 }, 64, 0x6000, 2);
    e.send(
        b,
        Some(3),
        None,
        Outgoing::Staged {
            va: 0x7000,
            len: 100,
            complete: Complete::Transmit,
        },
        3,
    )
    .unwrap();
    let mut tokens = Vec::new();
    while let Some(Action::Transmit(t)) = e.poll_action() {
        tokens.push(t.token);
    }
    assert_eq!(tokens.len(), 3);
    e.packet_done(tokens[0], Delivery::Failed("timed out".into()))
        .unwrap();
    e.packet_done(tokens[1], Delivery::NotSent("no route".into()))
        .unwrap();
    e.packet_done(tokens[2], Delivery::Failed("timed out".into()))
        .unwrap();
    let (done, rel) = released(&mut e);
    assert_eq!(done, vec![(1, false), (2, false), (3, false)]);
    assert_eq!(rel, vec![2], "only what was never sent is freed");
    assert_eq!(e.stats().memory_kept, 2);
    // The destination had them after all: its answers release the memory, and complete
    // nothing again.
    late_answers(&mut e, b);
    let (done, rel) = released(&mut e);
    assert!(done.is_empty(), "completed twice: {done:?}");
    assert_eq!(rel, vec![1, 3]);
}

/// `from` answers the first RMA operation and the first rendezvous it was sent (id 0)
/// after all: done and read.
fn late_answers(e: &mut Engine, from: Peer) {
    let answer = Packet::RmaDone {
        src_vi: from.vi,
        id: 0,
        status: RmaStatus::Done,
    };
    e.on_packet(from.node, from.rank, &answer.encode().unwrap(), 0)
        .unwrap();
    let fin = Packet::Fin {
        src_vi: from.vi,
        id: 0,
        status: FinStatus::Done,
    };
    e.on_packet(from.node, from.rank, &fin.encode().unwrap(), 0)
        .unwrap();
}

fn transmits(e: &mut Engine) -> Vec<Transmit> {
    let mut out = Vec::new();
    while let Some(a) = e.poll_action() {
        match a {
            Action::Transmit(t) => out.push(t),
            other => panic!("not a transmit: {other:?}"),
        }
    }
    out
}

fn events(e: &mut Engine) -> Vec<Event> {
    std::iter::from_fn(|| e.poll_event()).collect()
}

/// A peer that owes answers (an RMA answer, a FIN that completes a send) is probed once
/// it has owed them for `probe_after_ns`. A peer that is only slow takes the probe and
/// its operations keep waiting; one that is gone (no endpoint there for the engine's
/// patience) fails them, with their memory kept in case it answers after all.
#[test]
fn operations_a_gone_peer_owes_an_answer_fail_after_a_probe_finds_it_gone() {
    let (a, b) = (peer(1, 0), peer(6, 2));
    let cfg = Config {
        patience_ns: 10_000,
        probe_after_ns: 1_000,
        resend_first_ns: 500,
        resend_max_ns: 2_000,
        ..Config::default()
    };
    let mut e = Engine::new(a, cfg);
    e.handle_timeout(100);
    e.rma_read(b, RmaTarget { key: 1, addr: 0 }, 64, 0x5000, 1);
    e.send(
        b,
        Some(3),
        None,
        Outgoing::Staged {
            va: 0x7000,
            len: 100,
            complete: Complete::Delivery,
        },
        2,
    )
    .unwrap();
    for t in transmits(&mut e) {
        e.packet_done(t.token, Delivery::Delivered { at: 0 })
            .unwrap();
    }
    e.handle_timeout(1_099);
    assert!(
        transmits(&mut e).is_empty(),
        "probed before it owed for long"
    );
    // The engine looks every half of probe_after_ns.
    e.handle_timeout(1_598);
    assert!(transmits(&mut e).is_empty(), "looked again too soon");
    e.handle_timeout(1_599);
    let probe = transmits(&mut e);
    assert_eq!(probe.len(), 1, "one probe per peer: {probe:?}");
    assert_eq!(probe[0].to, b);
    assert_eq!(
        Packet::decode(&probe[0].bytes).unwrap(),
        Packet::Probe { src_vi: a.vi }
    );
    e.handle_timeout(5_000);
    assert!(transmits(&mut e).is_empty(), "a second probe in flight");
    // Slow, not gone: a full mailbox says its endpoint is there.
    e.packet_done(probe[0].token, Delivery::Refused).unwrap();
    assert!(events(&mut e).is_empty());
    // Then gone: the next probe finds no endpoint, and is sent again until the engine's
    // patience runs out.
    let mut now = 6_000;
    e.handle_timeout(now);
    let mut probe = transmits(&mut e);
    let first_absent = now;
    let mut tries = 0;
    let ended = loop {
        if let [p] = &probe[..] {
            tries += 1;
            e.packet_done(p.token, Delivery::Absent).unwrap();
            let ended = events(&mut e);
            if !ended.is_empty() {
                break ended;
            }
        } else {
            assert!(probe.is_empty(), "{probe:?}");
        }
        // At once after the first refusal, then waiting: 500, 1000, 2000, 2000... ns.
        probe = transmits(&mut e);
        if probe.is_empty() {
            now += 100;
            e.handle_timeout(now);
            probe = transmits(&mut e);
        }
    };
    // Tried at 0, 0, 0.5, 1.5, 3.5, 5.5, 7.5, 9.5 and 11.5 us after the first.
    assert_eq!((tries, now - first_absent), (9, 11_500));
    assert_eq!(ended.len(), 3, "{ended:?}");
    // The driver is told, to name the peer's node: an MPI library reports only a code.
    assert!(
        matches!(&ended[2], Event::PeerGone { peer, why, failed: 2 } if *peer == b && why.contains("gone")),
        "{ended:?}"
    );
    for ev in &ended[..2] {
        match ev {
            Event::RmaDone {
                ctx: 1,
                result: Err(Failure::Unreachable(why)),
                at: None,
            }
            | Event::Sent {
                ctx: 2,
                result: Err(Failure::Unreachable(why)),
                delivered: None,
            } => assert!(why.contains("gone"), "{why}"),
            other => panic!("{other:?}"),
        }
    }
    let s = e.stats();
    assert_eq!((s.probes, s.lost_to_gone_peers, s.memory_kept), (2, 2, 2));
    // Nothing owed any more: no more probes.
    e.handle_timeout(100_000);
    assert!(transmits(&mut e).is_empty());
    // It answers after all: the memory is released, nothing completes twice.
    late_answers(&mut e, b);
    assert_eq!(
        events(&mut e),
        vec![Event::RmaReleased { ctx: 1 }, Event::Released { ctx: 2 }]
    );
}

/// A message to an address with no endpoint is sent again for the engine's patience (the
/// peer may open it yet), then fails; one to a full mailbox waits for as long as it takes.
#[test]
fn a_message_to_no_endpoint_fails_after_the_patience_one_to_a_full_mailbox_waits() {
    let (a, b, c) = (peer(1, 0), peer(6, 2), peer(7, 1));
    let cfg = Config {
        patience_ns: 10_000,
        ..Config::default()
    };
    let mut e = Engine::new(a, cfg);
    e.send(b, Some(1), None, Outgoing::Inline(vec![1; 8]), 1)
        .unwrap();
    e.send(c, Some(1), None, Outgoing::Inline(vec![2; 8]), 2)
        .unwrap();
    let mut now = 0;
    let mut sent = Vec::new();
    let mut to_c = Vec::new();
    while now <= 1_000_000 {
        e.handle_timeout(now);
        // A refusal's first resend goes at once: carry those within the same instant.
        loop {
            let ts = transmits(&mut e);
            if ts.is_empty() {
                break;
            }
            for t in ts {
                let how = if t.to == b {
                    Delivery::Absent
                } else {
                    to_c.push(now);
                    Delivery::Refused
                };
                e.packet_done(t.token, how).unwrap();
            }
        }
        sent.extend(events(&mut e));
        now += 500;
    }
    match &sent[..] {
        [Event::Sent {
            ctx: 1,
            result: Err(Failure::Unreachable(why)),
            delivered: None,
        }] => assert!(
            why.contains("no endpoint at node 6 rank 0 mailbox 2"),
            "{why}"
        ),
        other => panic!("{other:?}"),
    }
    // The full mailbox's message is sent again as long as it takes, at once the first
    // time, then after 20 us, doubling, up to a millisecond (not at network speed: it
    // went 2,000 times in this millisecond before).
    assert_eq!(
        to_c,
        [0, 0, 20_000, 60_000, 140_000, 300_000, 620_000],
        "when the refused message went"
    );
    e.handle_timeout(1_259_999);
    assert!(transmits(&mut e).is_empty(), "waits 640 us now");
    e.handle_timeout(1_260_000);
    // The mailbox takes it at last.
    let t = transmits(&mut e);
    assert_eq!(t.len(), 1);
    assert_eq!(t[0].to, c);
    e.packet_done(t[0].token, Delivery::Delivered { at: 1_260_700 })
        .unwrap();
    // The delivery's time comes back with the send's completion: the caller's, which
    // only where the program is told of the completion becomes the program's.
    assert_eq!(
        events(&mut e),
        vec![Event::Sent {
            ctx: 2,
            result: Ok(()),
            delivered: Some(1_260_700),
        }]
    );
}

/// A message its destination's full mailbox refuses again and again waits longer each
/// time, and the ones after it, refused less, would overtake it: the sender keeps them
/// within what the receiver holds for an earlier one ([`HELD_MAX`]), so none arrives
/// out of protocol, and all are received in order once it goes through.
#[test]
fn a_message_refused_again_and_again_is_not_overtaken_past_what_the_receiver_holds() {
    let (a, b) = (peer(1, 0), peer(6, 2));
    let mut net = Net::new(&[a, b], Config::default());
    const N: u64 = 400;
    for k in 0..N {
        net.send(0, b, Some(k), &k.to_le_bytes(), k);
        net.eps[1].post_recv(any(k), 8, 1000 + k);
    }
    let first = 0u64.to_le_bytes();
    let mut refusals = 0;
    let mut furthest = 0usize;
    net.act();
    for _ in 0..10_000 {
        while !net.wire.is_empty() {
            net.now += 1_000;
            furthest = furthest.max(net.wire.len());
            let (from, t) = net.wire.remove(0);
            let is_first = t.bytes.ends_with(&first) && refusals < 12;
            if is_first {
                refusals += 1;
                net.eps[from]
                    .packet_done(t.token, Delivery::Refused)
                    .unwrap();
            } else {
                net.eps[1]
                    .on_packet(a.node, a.rank, &t.bytes, 0)
                    .expect("within what the receiver holds");
                net.eps[from]
                    .packet_done(t.token, Delivery::Delivered { at: 0 })
                    .unwrap();
            }
            net.act();
        }
        if (0..N).all(|k| net.received(1, 1000 + k).is_some()) {
            break;
        }
        net.now += Config::default().resend_max_ns;
        for e in &mut net.eps {
            e.handle_timeout(net.now);
        }
        net.act();
    }
    assert_eq!(refusals, 12, "the first message was refused");
    for k in 0..N {
        let (from, tag, len, data) = net.received(1, 1000 + k).expect("received");
        assert_eq!(
            (from, tag, len, data),
            (a, Some(k), 8, k.to_le_bytes().to_vec())
        );
    }
    assert!(
        furthest <= HELD_MAX,
        "{furthest} messages on the wire at once"
    );
    assert_eq!(net.eps[0].unfinished(), (0, 0, 0, 0));
}

/// A message kept for a receive becomes the caller's at its arrival time only when a
/// receive or a probe hands it over, and a rendezvous read starts after its request
/// came; an answer to a one-sided operation comes back with its completion; what the
/// engine acts on at once (a request to serve) is the caller's at once. Taking messages
/// early as the host delivers them must not move the program's time.
#[test]
fn a_kept_message_hands_its_arrival_time_to_the_receive_that_takes_it() {
    let (a, b) = (peer(1, 0), peer(2, 0));
    let mut s = Engine::new(a, Config::default());
    let mut r = Engine::new(b, Config::default());
    s.send(b, Some(7), None, Outgoing::Inline(b"early".to_vec()), 1)
        .unwrap();
    let t = transmits(&mut s);
    assert_eq!(
        r.on_packet(a.node, a.rank, &t[0].bytes, 5_000),
        Ok(Arrived::Kept)
    );
    assert!(events(&mut r).is_empty(), "nobody asked for it yet");
    assert_eq!(r.peek(&any(7)).map(|p| p.at), Some(5_000));
    r.post_recv(any(7), 64, 9);
    match &events(&mut r)[..] {
        [Event::Received {
            ctx: 9,
            at: Some(5_000),
            data: Data::Inline(d),
            ..
        }] => assert_eq!(d, b"early"),
        other => panic!("{other:?}"),
    }
    // A rendezvous request matched by a receive posted before it: its read starts after
    // it came; the receive ends with the read, whose completion the caller takes.
    r.post_recv(any(8), 100_000, 10);
    let staged = Outgoing::Staged {
        va: 0x1000,
        len: 100_000,
        complete: Complete::Delivery,
    };
    s.send(b, Some(8), None, staged, 2).unwrap();
    let t = transmits(&mut s);
    assert_eq!(
        r.on_packet(a.node, a.rank, &t[0].bytes, 9_000),
        Ok(Arrived::Kept)
    );
    let fetch = match r.poll_action() {
        Some(Action::Fetch(f)) => f,
        other => panic!("{other:?}"),
    };
    assert_eq!((fetch.after, fetch.len), (9_000, 100_000));
    r.fetch_done(fetch.id, Ok(())).unwrap();
    assert!(events(&mut r).iter().any(|e| matches!(
        e,
        Event::Received {
            ctx: 10,
            at: None,
            ..
        }
    )));
    // Its FIN completes the send (delivery completion): the time comes back on it.
    let fin = transmits(&mut r);
    assert_eq!(
        s.on_packet(b.node, b.rank, &fin[0].bytes, 12_000),
        Ok(Arrived::Kept)
    );
    assert!(
        events(&mut s).iter().any(|e| matches!(
            e,
            Event::Sent {
                ctx: 2,
                result: Ok(()),
                delivered: Some(12_000)
            }
        )),
        "the FIN's time on the send's completion"
    );
    // A one-sided request is served at once; its answer is the initiator's when the
    // operation's completion or a counter tells the program of it.
    s.rma_write(
        b,
        RmaTarget { key: 1, addr: 0 },
        RmaData::Inline(b"put".to_vec()),
        11,
    );
    let req = transmits(&mut s);
    assert_eq!(
        r.on_packet(a.node, a.rank, &req[0].bytes, 13_000),
        Ok(Arrived::Acted)
    );
    let done = Packet::RmaDone {
        src_vi: b.vi,
        id: 0,
        status: RmaStatus::Done,
    };
    assert_eq!(
        s.on_packet(b.node, b.rank, &done.encode().unwrap(), 14_000),
        Ok(Arrived::Kept)
    );
    assert!(
        events(&mut s).iter().any(|e| matches!(
            e,
            Event::RmaDone {
                ctx: 11,
                result: Ok(()),
                at: Some(14_000)
            }
        )),
        "the answer's time on the operation's completion"
    );
}

/// The rest of a multi-receive buffer keeps the buffer's place among the posted
/// receives, and takes only what it can hold whole: a message longer than it ends it
/// (`Event::Unfit`) and goes to the next receive, whole, whether it arrives after the
/// rest was posted or was waiting before.
#[test]
fn a_receive_of_whole_messages_keeps_its_place_and_gives_way_to_what_it_cannot_hold() {
    let (a, b) = (peer(1, 0), peer(2, 0));
    let untagged = Accepts {
        from: None,
        tagged: false,
        tag: 0,
        ignore: 0,
    };
    let mut s = Engine::new(a, Config::default());
    let mut r = Engine::new(b, Config::default());
    let send = |s: &mut Engine, r: &mut Engine, len: usize, ctx: u64| {
        s.send(b, None, None, Outgoing::Inline(vec![7; len]), ctx)
            .unwrap();
        for t in transmits(s) {
            assert_eq!(r.on_packet(a.node, a.rank, &t.bytes, 0), Ok(Arrived::Kept));
        }
    };
    let received = |evs: &[Event]| -> Vec<(u64, u64)> {
        evs.iter()
            .filter_map(|e| match e {
                Event::Received { ctx, len, .. } => Some((*ctx, *len)),
                _ => None,
            })
            .collect()
    };
    // A buffer's first part (place 1), then an ordinary receive behind it.
    let place = r.post_recv_whole(untagged, 24, 1, None);
    r.post_recv(untagged, 64, 2);
    send(&mut s, &mut r, 10, 1);
    assert_eq!(received(&events(&mut r)), [(1, 10)]);
    // Its rest, posted after the ordinary receive, still comes first.
    assert_eq!(r.post_recv_whole(untagged, 14, 3, Some(place)), place);
    send(&mut s, &mut r, 8, 2);
    assert_eq!(received(&events(&mut r)), [(3, 8)]);
    // 6 bytes left: a message of 10 does not fit; the buffer ends, the message goes
    // whole to the ordinary receive.
    r.post_recv_whole(untagged, 6, 4, Some(place));
    send(&mut s, &mut r, 10, 3);
    let evs = events(&mut r);
    assert!(matches!(evs[0], Event::Unfit { ctx: 4 }), "{evs:?}");
    assert_eq!(received(&evs), [(2, 10)]);
    // A message waiting before the buffer's rest is posted, too long for it: the rest
    // ends at once and leaves the message for the next receive.
    send(&mut s, &mut r, 30, 4);
    assert!(events(&mut r).is_empty(), "unexpected");
    r.post_recv_whole(untagged, 16, 5, None);
    assert!(matches!(events(&mut r)[..], [Event::Unfit { ctx: 5 }]));
    r.post_recv(untagged, 64, 6);
    assert_eq!(received(&events(&mut r)), [(6, 30)]);
}

/// A receive that names its source (`FI_DIRECTED_RECV`, as MPI libraries post them) and
/// has waited long has that source probed: a source that is there (its NI takes the
/// probe) keeps it waiting, one whose node does not answer fails it with
/// `Unreachable`, and says so once (`PeerGone`). A receive from anyone waits on, unprobed:
/// no peer in particular owes it.
#[test]
fn a_receive_from_a_peer_whose_node_died_fails_after_a_probe() {
    let (a, b, c) = (peer(1, 0), peer(6, 2), peer(7, 1));
    let cfg = Config {
        probe_after_ns: 1_000,
        ..Config::default()
    };
    let mut e = Engine::new(a, cfg);
    e.handle_timeout(100);
    let from = |p: Peer| Accepts {
        from: Some(p),
        ..any(5)
    };
    e.post_recv(from(b), 64, 1);
    e.post_recv(any(5), 64, 2);
    e.post_recv(from(c), 64, 3);
    e.post_recv(from(b), 64, 4);
    e.handle_timeout(1_099);
    assert!(transmits(&mut e).is_empty(), "probed before it waited long");
    // The engine looks every half of probe_after_ns.
    e.handle_timeout(1_599);
    let probes = transmits(&mut e);
    let mut to: Vec<Peer> = probes.iter().map(|t| t.to).collect();
    to.sort_unstable();
    assert_eq!(to, vec![b, c], "one probe per source: {probes:?}");
    for t in &probes {
        assert_eq!(
            Packet::decode(&t.bytes).unwrap(),
            Packet::Probe { src_vi: a.vi }
        );
        if t.to == c {
            // There: it only has not sent yet.
            e.packet_done(t.token, Delivery::Delivered { at: 0 })
                .unwrap();
        } else {
            // Its node does not answer: the NI gave up on the probe.
            e.packet_done(t.token, Delivery::Failed("timed out in the network".into()))
                .unwrap();
        }
    }
    let ended = events(&mut e);
    assert_eq!(ended.len(), 3, "{ended:?}");
    for (ev, ctx) in ended.iter().zip([1, 4]) {
        assert!(
            matches!(ev, Event::RecvFailed { ctx: c, error: Failure::Unreachable(why) }
                if *c == ctx && why.contains("timed out")),
            "{ev:?}"
        );
    }
    assert!(
        matches!(&ended[2], Event::PeerGone { peer, failed: 2, .. } if *peer == b),
        "{ended:?}"
    );
    // The others still wait, and take their messages.
    let msg = |tag| Packet::Eager {
        src_vi: c.vi,
        seq: 0,
        tag: Some(tag),
        cq_data: None,
        payload: b"hi".to_vec(),
    };
    e.on_packet(c.node, c.rank, &msg(5).encode().unwrap(), 0)
        .unwrap();
    let got = events(&mut e);
    assert!(
        matches!(&got[..], [Event::Received { ctx: 2, .. }]),
        "the receive from anyone takes it first: {got:?}"
    );
}
