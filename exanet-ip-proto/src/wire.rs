//! The formats of IP over ExaNet on the fabric.
//!
//! Control messages go by packetizer to the peer's service mailbox (at most 64 bytes):
//! - `Open { stream }`: "I start writing stream `stream` into your ring for me; forget what
//!   you read of an earlier stream". A sender opens a new stream when it starts and after
//!   any write it could not complete, since it cannot know what of that write landed.
//! - `Ring { stream, ring_va, ring_len, notify_va }`: the answer: where the ring for the
//!   sender is and where to put completion notifications.
//! - `Credit { stream, consumed }`: how many bytes of that stream the receiver has taken
//!   out of the ring (padding included), so the sender may reuse them.
//!
//! Batches are RDMA-written into the ring: a 20-byte header (magic, stream, sequence
//! number, the batch's length, packet count) and the packets, each after its length
//! (big-endian u16). The reader checks the length against the notification's, so a
//! notification that does not belong to the batch at the reader's position is refused
//! instead of moving the position by a wrong amount.

use thiserror::Error;

const MSG_MAGIC: [u8; 4] = *b"XIPc";
const BATCH_MAGIC: [u8; 4] = *b"XIPb";

/// Bytes of a batch header.
pub const BATCH_HEADER: usize = 20;
/// Bytes before each packet in a batch.
pub const PACKET_PREFIX: usize = 2;

/// A control message between two IP services.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Control {
    Open {
        stream: u32,
    },
    Ring {
        stream: u32,
        ring_va: u64,
        ring_len: u32,
        notify_va: u64,
    },
    Credit {
        stream: u32,
        consumed: u64,
    },
    /// Sent right after the write of batch `seq` when the path was idle: the reader takes
    /// the batch as soon as its bytes (checked by `crc`, CRC-32 of the whole batch) are in
    /// the ring, one fabric crossing after it was written instead of the three a
    /// completion notification takes (the blocks, their ACKs, the notification).
    Batch {
        stream: u32,
        seq: u32,
        len: u32,
        crc: u32,
    },
}

/// Why bytes from the fabric are not a message or batch of the service.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Error)]
pub enum WireError {
    #[error("{0} bytes are too short")]
    Short(usize),
    #[error("bad magic")]
    Magic,
    #[error("unknown message kind {0}")]
    Kind(u8),
    #[error("batch of stream {got}, the current stream is {want}")]
    Stream { got: u32, want: u32 },
    #[error("batch number {got}, expected {want}")]
    Sequence { got: u32, want: u32 },
    #[error("the batch says it is {said} bytes, the notification {got}")]
    Length { said: u32, got: usize },
    #[error("packet {index} of the batch runs past its end")]
    Truncated { index: usize },
    #[error("the batch says {said} packets and holds {held}")]
    Count { said: u16, held: usize },
}

impl Control {
    pub fn encode(&self) -> Vec<u8> {
        let mut b = Vec::with_capacity(32);
        b.extend_from_slice(&MSG_MAGIC);
        match *self {
            Control::Open { stream } => {
                b.extend_from_slice(&[1, 0, 0, 0]);
                b.extend_from_slice(&stream.to_be_bytes());
            }
            Control::Ring {
                stream,
                ring_va,
                ring_len,
                notify_va,
            } => {
                b.extend_from_slice(&[2, 0, 0, 0]);
                b.extend_from_slice(&stream.to_be_bytes());
                b.extend_from_slice(&ring_va.to_be_bytes());
                b.extend_from_slice(&ring_len.to_be_bytes());
                b.extend_from_slice(&notify_va.to_be_bytes());
            }
            Control::Credit { stream, consumed } => {
                b.extend_from_slice(&[3, 0, 0, 0]);
                b.extend_from_slice(&stream.to_be_bytes());
                b.extend_from_slice(&consumed.to_be_bytes());
            }
            Control::Batch {
                stream,
                seq,
                len,
                crc,
            } => {
                b.extend_from_slice(&[4, 0, 0, 0]);
                b.extend_from_slice(&stream.to_be_bytes());
                b.extend_from_slice(&seq.to_be_bytes());
                b.extend_from_slice(&len.to_be_bytes());
                b.extend_from_slice(&crc.to_be_bytes());
            }
        }
        b
    }

    pub fn decode(b: &[u8]) -> Result<Control, WireError> {
        let need = |n: usize| {
            if b.len() < n {
                Err(WireError::Short(b.len()))
            } else {
                Ok(())
            }
        };
        need(12)?;
        if b[..4] != MSG_MAGIC {
            return Err(WireError::Magic);
        }
        let stream = be32(&b[8..12]);
        match b[4] {
            1 => Ok(Control::Open { stream }),
            2 => {
                need(32)?;
                Ok(Control::Ring {
                    stream,
                    ring_va: be64(&b[12..20]),
                    ring_len: be32(&b[20..24]),
                    notify_va: be64(&b[24..32]),
                })
            }
            3 => {
                need(20)?;
                Ok(Control::Credit {
                    stream,
                    consumed: be64(&b[12..20]),
                })
            }
            4 => {
                need(24)?;
                Ok(Control::Batch {
                    stream,
                    seq: be32(&b[12..16]),
                    len: be32(&b[16..20]),
                    crc: be32(&b[20..24]),
                })
            }
            k => Err(WireError::Kind(k)),
        }
    }
}

fn be32(b: &[u8]) -> u32 {
    u32::from_be_bytes([b[0], b[1], b[2], b[3]])
}

fn be64(b: &[u8]) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[..8]);
    u64::from_be_bytes(a)
}

/// Bytes a batch of `packets` (their lengths) takes.
pub fn batch_len(packets: impl IntoIterator<Item = usize>) -> usize {
    BATCH_HEADER
        + packets
            .into_iter()
            .map(|l| PACKET_PREFIX + l)
            .sum::<usize>()
}

/// Lays out a batch.
pub fn encode_batch<'a>(
    stream: u32,
    seq: u32,
    packets: impl ExactSizeIterator<Item = &'a [u8]> + Clone,
) -> Vec<u8> {
    let mut b = Vec::with_capacity(batch_len(packets.clone().map(<[u8]>::len)));
    b.extend_from_slice(&BATCH_MAGIC);
    b.extend_from_slice(&stream.to_be_bytes());
    b.extend_from_slice(&seq.to_be_bytes());
    let len = batch_len(packets.clone().map(<[u8]>::len)) as u32;
    b.extend_from_slice(&len.to_be_bytes());
    b.extend_from_slice(&(packets.len() as u16).to_be_bytes());
    b.extend_from_slice(&[0, 0]);
    for p in packets {
        b.extend_from_slice(&(p.len() as u16).to_be_bytes());
        b.extend_from_slice(p);
    }
    b
}

/// The stream a batch says it belongs to (checked before anything else, so that a batch
/// of an earlier stream is told apart from a corrupt one).
pub fn batch_stream(b: &[u8]) -> Result<u32, WireError> {
    if b.len() < BATCH_HEADER {
        return Err(WireError::Short(b.len()));
    }
    if b[..4] != BATCH_MAGIC {
        return Err(WireError::Magic);
    }
    Ok(be32(&b[4..8]))
}

/// The packets of batch `b`, which must be number `seq` of `stream`.
pub fn decode_batch(b: &[u8], stream: u32, seq: u32) -> Result<Vec<&[u8]>, WireError> {
    let got = batch_stream(b)?;
    if got != stream {
        return Err(WireError::Stream { got, want: stream });
    }
    let got = be32(&b[8..12]);
    if got != seq {
        return Err(WireError::Sequence { got, want: seq });
    }
    let said_len = be32(&b[12..16]);
    if said_len as usize != b.len() {
        return Err(WireError::Length {
            said: said_len,
            got: b.len(),
        });
    }
    let said = u16::from_be_bytes([b[16], b[17]]);
    let mut out = Vec::with_capacity(usize::from(said));
    let mut at = BATCH_HEADER;
    while at < b.len() {
        let index = out.len();
        if at + PACKET_PREFIX > b.len() {
            return Err(WireError::Truncated { index });
        }
        let len = usize::from(u16::from_be_bytes([b[at], b[at + 1]]));
        at += PACKET_PREFIX;
        let p = b.get(at..at + len).ok_or(WireError::Truncated { index })?;
        out.push(p);
        at += len;
    }
    if out.len() != usize::from(said) {
        return Err(WireError::Count {
            said,
            held: out.len(),
        });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_round_trip_and_fit_a_packetizer_message() {
        for m in [
            Control::Open { stream: 7 },
            Control::Ring {
                stream: u32::MAX,
                ring_va: 0x7f_0000_1000,
                ring_len: 1 << 18,
                notify_va: 0x7f_0004_1000,
            },
            Control::Credit {
                stream: 3,
                consumed: u64::MAX - 1,
            },
            Control::Batch {
                stream: 1,
                seq: 2,
                len: 3,
                crc: 0xdead_beef,
            },
        ] {
            let b = m.encode();
            assert!(b.len() <= exanet_proto::ni::MAX_MESSAGE);
            assert_eq!(Control::decode(&b), Ok(m));
            assert!(Control::decode(&b[..b.len() - 1]).is_err());
        }
        assert_eq!(
            Control::decode(b"XIPc\x09\0\0\0\0\0\0\0"),
            Err(WireError::Kind(9))
        );
        assert_eq!(Control::decode(b"nope nope nope"), Err(WireError::Magic));
    }

    #[test]
    fn batches_round_trip_and_refuse_what_does_not_add_up() {
        let pkts: Vec<&[u8]> = vec![b"one", b"", b"three"];
        let b = encode_batch(5, 9, pkts.iter().copied());
        assert_eq!(b.len(), batch_len(pkts.iter().map(|p| p.len())));
        assert_eq!(decode_batch(&b, 5, 9).unwrap(), pkts);
        assert_eq!(
            decode_batch(&b, 6, 9),
            Err(WireError::Stream { got: 5, want: 6 })
        );
        assert_eq!(
            decode_batch(&b, 5, 8),
            Err(WireError::Sequence { got: 9, want: 8 })
        );
        let mut long = b.clone();
        long[28] += 1; // "three" says 6 bytes
        assert!(matches!(
            decode_batch(&long, 5, 9),
            Err(WireError::Truncated { index: 2 })
        ));
        assert!(matches!(
            decode_batch(&b[..b.len() - 1], 5, 9),
            Err(WireError::Length { .. })
        ));
        let mut lie = b.clone();
        lie[17] = 4;
        assert!(matches!(
            decode_batch(&lie, 5, 9),
            Err(WireError::Count { said: 4, held: 3 })
        ));
    }
}
