//! The provider's control and eager messages, each one packetizer message (at most 64
//! bytes) into the destination endpoint's mailbox. The mailbox tells the receiver the
//! sending node and rank; the header says which of that rank's endpoints (its mailbox)
//! sent it. All integers are big-endian.
//!
//! | bytes | field |
//! |---|---|
//! | 0 | kind: 1 eager, 2 request to send (RTS), 3 finished (FIN), 7 probe |
//! | 1 | the sender's mailbox (endpoint) |
//! | 2 | flags: bit 0 tagged, bit 1 remote CQ data present |
//! | 3 | eager: payload length; FIN: status (0 done, 1 truncated, 2 refused) |
//! | 4..8 | eager, RTS: the sender's sequence number towards this endpoint; FIN: the RTS's id |
//! | 8..16 | eager, RTS: tag (0 when untagged) |
//! | 16..24 | eager, RTS: remote CQ data, when flagged |
//! | eager: then the payload | |
//! | RTS: then id (4), length (8), the staged data's VA at the sender (8) | |
//!
//! So an eager message carries up to [`EAGER_MAX`] bytes, remote CQ data or not. A probe
//! is its first two bytes and six zeros: it asks nothing; that the destination's NI takes
//! it into the endpoint's mailbox says the endpoint is still there.
//!
//! One-sided operations (`FI_RMA`) are carried out by the target's provider on memory its
//! application registered (`fi_mr_reg`), named by the region's key and an address in it:
//!
//! | bytes | field |
//! |---|---|
//! | 0 | kind: 4 RMA write, 5 RMA read, 6 RMA done |
//! | 1 | the sender's mailbox (endpoint) |
//! | 2 | write: flags, bit 2 staged (the data waits at the writer, to be read) |
//! | 3 | write: inline payload length; done: status (0 done, 1 denied, 2 failed) |
//! | 4..8 | the operation's id at its initiator |
//! | 8..16 | write, read: the region's key |
//! | 16..24 | write, read: the target address |
//! | write: then the payload, or length (8) and the staged data's VA (8) | |
//! | read: then length (8) and the VA of the reader's staging it is written into (8) | |

use thiserror::Error;

/// The largest payload of an eager message.
pub const EAGER_MAX: usize = 40;
/// Bytes of one packetizer message.
pub const PACKET_MAX: usize = 64;

const EAGER: u8 = 1;
const RTS: u8 = 2;
const FIN: u8 = 3;
const RMA_WRITE: u8 = 4;
const RMA_READ: u8 = 5;
const RMA_DONE: u8 = 6;
const PROBE: u8 = 7;
const STAGED: u8 = 4;
const TAGGED: u8 = 1;
const HAS_DATA: u8 = 2;

/// Where each header field starts (the tables above), named once for encoder and decoder.
mod at {
    pub const KIND: usize = 0;
    /// The sender's mailbox.
    pub const VI: usize = 1;
    pub const FLAGS: usize = 2;
    /// Eager and inline RMA write: the payload's length; FIN and RMA done: the status.
    pub const SMALL: usize = 3;
    /// Eager, RTS: the sequence number; FIN, RMA: the id.
    pub const ID: usize = 4;
    /// Eager, RTS: the tag; RMA: the region's key.
    pub const TAG: usize = 8;
    /// Eager, RTS: remote CQ data; RMA: the target address.
    pub const DATA: usize = 16;
    /// What FIN, RMA done and probe carry: the first two words.
    pub const SHORT: usize = 8;
    /// The full header, after which the payload or the operation's words follow.
    pub const HEADER: usize = 24;
}
use at::HEADER;

/// How a rendezvous ended, as the receiver tells the sender.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FinStatus {
    /// Read whole.
    Done = 0,
    /// Read as far as the receive buffer went.
    Truncated = 1,
    /// Not read: the receive was cancelled, or the read failed.
    Refused = 2,
}

/// How a one-sided operation ended at its target.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RmaStatus {
    Done = 0,
    /// No region with that key, outside it, or without the access asked.
    Denied = 1,
    /// The target could not carry it out (its memory or the NI failed).
    Failed = 2,
}

/// The data of an RMA write: in the message, or staged at the writer for the target to
/// read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RmaData {
    Inline(Vec<u8>),
    Staged { len: u64, va: u64 },
}

/// What a message says.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Packet {
    Eager {
        src_vi: u8,
        seq: u32,
        tag: Option<u64>,
        cq_data: Option<u64>,
        payload: Vec<u8>,
    },
    Rts {
        src_vi: u8,
        seq: u32,
        tag: Option<u64>,
        cq_data: Option<u64>,
        id: u32,
        len: u64,
        va: u64,
    },
    Fin {
        src_vi: u8,
        id: u32,
        status: FinStatus,
    },
    RmaWrite {
        src_vi: u8,
        id: u32,
        key: u64,
        addr: u64,
        data: RmaData,
    },
    RmaRead {
        src_vi: u8,
        id: u32,
        key: u64,
        addr: u64,
        len: u64,
        /// Where in the reader's registered memory the target writes the bytes.
        va: u64,
    },
    RmaDone {
        src_vi: u8,
        id: u32,
        status: RmaStatus,
    },
    /// Is this endpoint still there? Sent to a peer that owes an answer for long.
    Probe { src_vi: u8 },
}

#[derive(Clone, Debug, PartialEq, Eq, Error)]
pub enum WireError {
    #[error("message of {0} B: shorter than its header")]
    Short(usize),
    #[error("message of {len} B: an eager message of {payload} B needs {need}")]
    Length {
        len: usize,
        payload: usize,
        need: usize,
    },
    #[error("unknown message kind {0}")]
    Kind(u8),
    #[error("unknown rendezvous status {0}")]
    Status(u8),
    #[error("eager payload of {0} B: at most {EAGER_MAX}")]
    TooLong(usize),
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_be_bytes(b[at..at + 4].try_into().expect("4 bytes"))
}
fn u64_at(b: &[u8], at: usize) -> u64 {
    u64::from_be_bytes(b[at..at + 8].try_into().expect("8 bytes"))
}
fn put_u32(b: &mut [u8], at: usize, v: u32) {
    b[at..at + 4].copy_from_slice(&v.to_be_bytes());
}
fn put_u64(b: &mut [u8], at: usize, v: u64) {
    b[at..at + 8].copy_from_slice(&v.to_be_bytes());
}

impl Packet {
    pub fn encode(&self) -> Result<Vec<u8>, WireError> {
        let mut b = vec![0u8; HEADER];
        let head = |b: &mut Vec<u8>, kind, vi, tag: &Option<u64>, cq: &Option<u64>, seq: u32| {
            b[at::KIND] = kind;
            b[at::VI] = vi;
            b[at::FLAGS] =
                if tag.is_some() { TAGGED } else { 0 } | if cq.is_some() { HAS_DATA } else { 0 };
            put_u32(b, at::ID, seq);
            put_u64(b, at::TAG, tag.unwrap_or(0));
            put_u64(b, at::DATA, cq.unwrap_or(0));
        };
        // FIN, RMA done and probe: kind, mailbox, status and id, no more.
        let short = |b: &mut Vec<u8>, kind, vi, status: u8, id: u32| {
            b.truncate(at::SHORT);
            b[at::KIND] = kind;
            b[at::VI] = vi;
            b[at::SMALL] = status;
            put_u32(b, at::ID, id);
        };
        match self {
            Packet::Eager {
                src_vi,
                seq,
                tag,
                cq_data,
                payload,
            } => {
                if payload.len() > EAGER_MAX {
                    return Err(WireError::TooLong(payload.len()));
                }
                head(&mut b, EAGER, *src_vi, tag, cq_data, *seq);
                b[at::SMALL] = payload.len() as u8;
                b.extend_from_slice(payload);
            }
            Packet::Rts {
                src_vi,
                seq,
                tag,
                cq_data,
                id,
                len,
                va,
            } => {
                head(&mut b, RTS, *src_vi, tag, cq_data, *seq);
                b.extend_from_slice(&id.to_be_bytes());
                b.extend_from_slice(&len.to_be_bytes());
                b.extend_from_slice(&va.to_be_bytes());
            }
            Packet::Fin { src_vi, id, status } => short(&mut b, FIN, *src_vi, *status as u8, *id),
            Packet::RmaDone { src_vi, id, status } => {
                short(&mut b, RMA_DONE, *src_vi, *status as u8, *id)
            }
            Packet::Probe { src_vi } => short(&mut b, PROBE, *src_vi, 0, 0),
            Packet::RmaWrite {
                src_vi,
                id,
                key,
                addr,
                data,
            } => {
                rma_head(&mut b, RMA_WRITE, *src_vi, *id, *key, *addr);
                match data {
                    RmaData::Inline(payload) => {
                        if payload.len() > EAGER_MAX {
                            return Err(WireError::TooLong(payload.len()));
                        }
                        b[at::SMALL] = payload.len() as u8;
                        b.extend_from_slice(payload);
                    }
                    RmaData::Staged { len, va } => {
                        b[at::FLAGS] = STAGED;
                        b.extend_from_slice(&len.to_be_bytes());
                        b.extend_from_slice(&va.to_be_bytes());
                    }
                }
            }
            Packet::RmaRead {
                src_vi,
                id,
                key,
                addr,
                len,
                va,
            } => {
                rma_head(&mut b, RMA_READ, *src_vi, *id, *key, *addr);
                b.extend_from_slice(&len.to_be_bytes());
                b.extend_from_slice(&va.to_be_bytes());
            }
        }
        debug_assert!(b.len() <= PACKET_MAX);
        Ok(b)
    }

    pub fn decode(b: &[u8]) -> Result<Packet, WireError> {
        if b.len() < at::SHORT {
            return Err(WireError::Short(b.len()));
        }
        let (kind, src_vi, flags, small) = (b[at::KIND], b[at::VI], b[at::FLAGS], b[at::SMALL]);
        if kind == FIN {
            let status = match small {
                0 => FinStatus::Done,
                1 => FinStatus::Truncated,
                2 => FinStatus::Refused,
                s => return Err(WireError::Status(s)),
            };
            return Ok(Packet::Fin {
                src_vi,
                id: u32_at(b, at::ID),
                status,
            });
        }
        if kind == RMA_DONE {
            let status = match small {
                0 => RmaStatus::Done,
                1 => RmaStatus::Denied,
                2 => RmaStatus::Failed,
                s => return Err(WireError::Status(s)),
            };
            return Ok(Packet::RmaDone {
                src_vi,
                id: u32_at(b, at::ID),
                status,
            });
        }
        if kind == PROBE {
            return Ok(Packet::Probe { src_vi });
        }
        if b.len() < HEADER {
            return Err(WireError::Short(b.len()));
        }
        let (id, key, addr) = (u32_at(b, at::ID), u64_at(b, at::TAG), u64_at(b, at::DATA));
        // A staged write and a read end with a length and a VA.
        let len_va = || {
            if b.len() != HEADER + 16 {
                return Err(WireError::Short(b.len()));
            }
            Ok((u64_at(b, HEADER), u64_at(b, HEADER + 8)))
        };
        match kind {
            RMA_WRITE if flags & STAGED != 0 => {
                let (len, va) = len_va()?;
                return Ok(Packet::RmaWrite {
                    src_vi,
                    id,
                    key,
                    addr,
                    data: RmaData::Staged { len, va },
                });
            }
            RMA_WRITE => {
                let n = usize::from(small);
                if n > EAGER_MAX || b.len() != HEADER + n {
                    return Err(WireError::Length {
                        len: b.len(),
                        payload: n,
                        need: HEADER + n,
                    });
                }
                return Ok(Packet::RmaWrite {
                    src_vi,
                    id,
                    key,
                    addr,
                    data: RmaData::Inline(b[HEADER..].to_vec()),
                });
            }
            RMA_READ => {
                let (len, va) = len_va()?;
                return Ok(Packet::RmaRead {
                    src_vi,
                    id,
                    key,
                    addr,
                    len,
                    va,
                });
            }
            _ => {}
        }
        let seq = u32_at(b, at::ID);
        let tag = (flags & TAGGED != 0).then(|| u64_at(b, at::TAG));
        let cq_data = (flags & HAS_DATA != 0).then(|| u64_at(b, at::DATA));
        match kind {
            EAGER => {
                let n = usize::from(small);
                if n > EAGER_MAX || b.len() != HEADER + n {
                    return Err(WireError::Length {
                        len: b.len(),
                        payload: n,
                        need: HEADER + n,
                    });
                }
                Ok(Packet::Eager {
                    src_vi,
                    seq,
                    tag,
                    cq_data,
                    payload: b[HEADER..].to_vec(),
                })
            }
            RTS => {
                if b.len() != HEADER + 20 {
                    return Err(WireError::Short(b.len()));
                }
                Ok(Packet::Rts {
                    src_vi,
                    seq,
                    tag,
                    cq_data,
                    id: u32_at(b, HEADER),
                    len: u64_at(b, HEADER + 4),
                    va: u64_at(b, HEADER + 12),
                })
            }
            k => Err(WireError::Kind(k)),
        }
    }
}

/// The header of a one-sided operation's request.
fn rma_head(b: &mut [u8], kind: u8, vi: u8, id: u32, key: u64, addr: u64) {
    b[at::KIND] = kind;
    b[at::VI] = vi;
    put_u32(b, at::ID, id);
    put_u64(b, at::TAG, key);
    put_u64(b, at::DATA, addr);
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One packet of each kind and variant, with fields at their extremes.
    fn samples() -> Vec<Packet> {
        vec![
            Packet::Eager {
                src_vi: 3,
                seq: 7,
                tag: Some(u64::MAX),
                cq_data: Some(0x0123_4567_89ab_cdef),
                payload: vec![0xA5; EAGER_MAX],
            },
            Packet::Eager {
                src_vi: 0,
                seq: 0,
                tag: None,
                cq_data: None,
                payload: vec![],
            },
            Packet::Rts {
                src_vi: 63,
                seq: u32::MAX,
                tag: Some(42),
                cq_data: None,
                id: 9,
                len: 1 << 30,
                va: 0x7f_0000_1000,
            },
            Packet::Fin {
                src_vi: 1,
                id: 9,
                status: FinStatus::Truncated,
            },
            Packet::RmaWrite {
                src_vi: 2,
                id: u32::MAX,
                key: u64::MAX,
                addr: 0x7f12_3456_7000,
                data: RmaData::Inline(vec![7; EAGER_MAX]),
            },
            Packet::RmaWrite {
                src_vi: 2,
                id: 1,
                key: 3,
                addr: 4,
                data: RmaData::Inline(vec![]),
            },
            Packet::RmaWrite {
                src_vi: 2,
                id: 1,
                key: 3,
                addr: 4,
                data: RmaData::Staged {
                    len: 1 << 40,
                    va: 0x1000,
                },
            },
            Packet::RmaRead {
                src_vi: 5,
                id: 6,
                key: 7,
                addr: 8,
                len: 9,
                va: 10,
            },
            Packet::RmaDone {
                src_vi: 5,
                id: 6,
                status: RmaStatus::Denied,
            },
            Packet::Probe { src_vi: 63 },
        ]
    }

    #[test]
    fn every_kind_round_trips_within_one_packetizer_message() {
        for p in samples() {
            let b = p.encode().unwrap();
            assert!(b.len() <= PACKET_MAX, "{p:?}: {} B", b.len());
            assert_eq!(Packet::decode(&b).unwrap(), p);
        }
    }

    /// The bytes are what providers on two nodes speak: the sender's mailbox follows the
    /// kind in every packet, and every byte of the samples is pinned by a checksum, so
    /// that a change of layout shows here.
    #[test]
    fn the_layout_is_the_published_one() {
        let mut sums = Vec::new();
        for p in samples() {
            let b = p.encode().unwrap();
            let vi = match &p {
                Packet::Eager { src_vi, .. }
                | Packet::Rts { src_vi, .. }
                | Packet::Fin { src_vi, .. }
                | Packet::RmaWrite { src_vi, .. }
                | Packet::RmaRead { src_vi, .. }
                | Packet::RmaDone { src_vi, .. }
                | Packet::Probe { src_vi } => *src_vi,
            };
            assert_eq!(b[1], vi, "{p:?}");
            sums.push(crc32fast::hash(&b));
        }
        assert_eq!(sums, GOLDEN, "the packet layout changed");
    }

    /// crc32 of each sample's packet, as the provider of 2026-12-07 encodes it.
    const GOLDEN: [u32; 10] = [
        1_348_818_791,
        585_412_359,
        3_232_013_851,
        157_696_554,
        2_219_786_298,
        2_652_353_545,
        1_477_797_439,
        3_958_128_956,
        628_520_396,
        835_453_899,
    ];

    #[test]
    fn the_rack_file_bounds_the_eager_limit_by_this_format() {
        assert_eq!(EAGER_MAX, PACKET_MAX - HEADER);
        assert_eq!(EAGER_MAX, exanet_control::rack::MPI_EAGER_MAX as usize);
        assert!(
            exanet_control::rack::DEFAULT_MPI_EAGER_LIMIT as usize <= EAGER_MAX,
            "the default fits"
        );
    }

    #[test]
    fn malformed_messages_are_typed_errors() {
        assert_eq!(Packet::decode(&[1, 0, 0]), Err(WireError::Short(3)));
        let mut b = Packet::Eager {
            src_vi: 0,
            seq: 0,
            tag: None,
            cq_data: None,
            payload: vec![1, 2, 3],
        }
        .encode()
        .unwrap();
        b[3] = 41;
        assert!(matches!(Packet::decode(&b), Err(WireError::Length { .. })));
        b[0] = 9;
        assert_eq!(Packet::decode(&b), Err(WireError::Kind(9)));
        let fin = [3, 0, 0, 7, 0, 0, 0, 1];
        assert_eq!(Packet::decode(&fin), Err(WireError::Status(7)));
        let done = [6, 0, 0, 3, 0, 0, 0, 1];
        assert_eq!(Packet::decode(&done), Err(WireError::Status(3)));
        let mut read = Packet::RmaRead {
            src_vi: 0,
            id: 0,
            key: 0,
            addr: 0,
            len: 1,
            va: 0,
        }
        .encode()
        .unwrap();
        read.pop();
        assert_eq!(Packet::decode(&read), Err(WireError::Short(39)));
        let mut write = Packet::RmaWrite {
            src_vi: 0,
            id: 0,
            key: 0,
            addr: 0,
            data: RmaData::Inline(vec![1; 8]),
        }
        .encode()
        .unwrap();
        write[3] = 9;
        assert!(matches!(
            Packet::decode(&write),
            Err(WireError::Length { .. })
        ));
        assert_eq!(
            Packet::Eager {
                src_vi: 0,
                seq: 0,
                tag: None,
                cq_data: None,
                payload: vec![0; EAGER_MAX + 1],
            }
            .encode(),
            Err(WireError::TooLong(EAGER_MAX + 1))
        );
    }
}
