//! The messages software collectives send to collective mailboxes.
//!
//! Every message starts with a kind byte and the collective it belongs to: group u16,
//! sequence u16, step u16 (big-endian). Then, by kind:
//! - [`Body::Data`] (kind 0): offset u16, total length u16, then up to [`CHUNK`] bytes of
//!   the step's data: a step sent eagerly, in as many messages as it takes;
//! - [`Body::Rts`] (kind 1, "ready to send"): the step's length u64. Its data waits in the
//!   sender's memory for the receiver to say where it goes;
//! - [`Body::Cts`] (kind 2, "clear to send"): the receiver's buffer VA u64 and the VA of
//!   the completion notification u64: the sender RDMA-writes the step there;
//! - [`Body::Abort`] (kind 3, step 0): the sender gave the collective up; the rest is its
//!   reason, UTF-8, cut to fit.
//!
//! This is ExaNet-MPI's rendezvous (report §5.1, Fig. 11): RTS by packetizer, CTS with the
//! receive buffer and notification address, RDMA write, completion notification.

/// Bytes before a data message's body.
pub(super) const DATA_HEADER: usize = 11;
/// Bytes of step data per data message.
pub(super) const CHUNK: usize = exanet_proto::ni::MAX_MESSAGE - DATA_HEADER;
/// The largest step sent eagerly: its offset and length are u16.
pub(super) const MAX_EAGER: usize = u16::MAX as usize;

const DATA: u8 = 0;
const RTS: u8 = 1;
const CTS: u8 = 2;
const ABORT: u8 = 3;
/// Bytes before any body.
const HEAD: usize = 7;

/// Which collective and step a message is for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Call {
    pub group: u16,
    pub seq: u16,
    pub step: u16,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Body<'a> {
    Data {
        offset: usize,
        total: usize,
        bytes: &'a [u8],
    },
    Rts {
        len: u64,
    },
    Cts {
        buf: u64,
        notify: u64,
    },
    Abort {
        reason: &'a [u8],
    },
}

fn head(kind: u8, c: Call, cap: usize) -> Vec<u8> {
    let mut m = Vec::with_capacity(cap);
    m.push(kind);
    for v in [c.group, c.seq, c.step] {
        m.extend_from_slice(&v.to_be_bytes());
    }
    m
}

/// A data message: `bytes` at `offset` of a step of `total` bytes (at most
/// [`MAX_EAGER`]; `bytes` at most [`CHUNK`]).
pub(super) fn data(c: Call, offset: usize, total: usize, bytes: &[u8]) -> Vec<u8> {
    debug_assert!(total <= MAX_EAGER && bytes.len() <= CHUNK && offset + bytes.len() <= total);
    let mut m = head(DATA, c, DATA_HEADER + bytes.len());
    m.extend_from_slice(&(offset as u16).to_be_bytes());
    m.extend_from_slice(&(total as u16).to_be_bytes());
    m.extend_from_slice(bytes);
    m
}

pub(super) fn rts(c: Call, len: u64) -> Vec<u8> {
    let mut m = head(RTS, c, 15);
    m.extend_from_slice(&len.to_be_bytes());
    m
}

pub(super) fn cts(c: Call, buf: u64, notify: u64) -> Vec<u8> {
    let mut m = head(CTS, c, 23);
    m.extend_from_slice(&buf.to_be_bytes());
    m.extend_from_slice(&notify.to_be_bytes());
    m
}

/// An abort of collective `c` for `reason`, cut at a character boundary to fit a message.
pub(super) fn abort(c: Call, reason: &str) -> Vec<u8> {
    let room = exanet_proto::ni::MAX_MESSAGE - HEAD;
    let mut end = reason.len().min(room);
    while !reason.is_char_boundary(end) {
        end -= 1;
    }
    let mut m = head(ABORT, c, HEAD + end);
    m.extend_from_slice(&reason.as_bytes()[..end]);
    m
}

/// The collective and body of a message, if it is a well-formed one.
pub(super) fn parse(p: &[u8]) -> Option<(Call, Body<'_>)> {
    let u16_at = |i: usize| Some(u16::from_be_bytes(p.get(i..i + 2)?.try_into().ok()?));
    let u64_at = |i: usize| Some(u64::from_be_bytes(p.get(i..i + 8)?.try_into().ok()?));
    let call = Call {
        group: u16_at(1)?,
        seq: u16_at(3)?,
        step: u16_at(5)?,
    };
    let body = match *p.first()? {
        DATA => {
            let offset = usize::from(u16_at(7)?);
            let total = usize::from(u16_at(9)?);
            let bytes = &p[DATA_HEADER..];
            if offset + bytes.len() > total {
                return None;
            }
            Body::Data {
                offset,
                total,
                bytes,
            }
        }
        RTS if p.len() == 15 => Body::Rts { len: u64_at(7)? },
        CTS if p.len() == 23 => Body::Cts {
            buf: u64_at(7)?,
            notify: u64_at(15)?,
        },
        ABORT => Body::Abort { reason: &p[HEAD..] },
        _ => return None,
    };
    Some((call, body))
}

#[cfg(test)]
mod tests {
    use super::*;

    const C: Call = Call {
        group: 0x0102,
        seq: 0xFFFE,
        step: 0x5003,
    };

    #[test]
    fn every_kind_reads_back_as_written() {
        let d = data(C, 54, 200, &[7; CHUNK]);
        assert_eq!(
            d.len(),
            exanet_proto::ni::MAX_MESSAGE,
            "a full chunk fills a message"
        );
        assert_eq!(
            parse(&d),
            Some((
                C,
                Body::Data {
                    offset: 54,
                    total: 200,
                    bytes: &[7; CHUNK]
                }
            ))
        );
        assert_eq!(
            parse(&data(C, 0, 0, &[])),
            Some((
                C,
                Body::Data {
                    offset: 0,
                    total: 0,
                    bytes: &[]
                }
            ))
        );
        assert_eq!(
            parse(&rts(C, 1 << 40)),
            Some((C, Body::Rts { len: 1 << 40 }))
        );
        assert_eq!(
            parse(&cts(C, 0x7F_0000_1000, 0x7F_0000_0FF0)),
            Some((
                C,
                Body::Cts {
                    buf: 0x7F_0000_1000,
                    notify: 0x7F_0000_0FF0
                }
            ))
        );
    }

    #[test]
    fn malformed_messages_are_none() {
        assert_eq!(parse(&[]), None);
        assert_eq!(parse(&[DATA, 0, 1]), None, "short header");
        // Data past its stated length.
        assert!(parse(&data(C, 0, 3, &[1, 2, 3])).is_some());
        let mut m = data(C, 0, 3, &[1, 2, 3]);
        m.push(4);
        assert_eq!(parse(&m), None);
        // RTS and CTS of the wrong length, and an unknown kind.
        let mut r = rts(C, 5);
        r.push(0);
        assert_eq!(parse(&r), None);
        assert_eq!(parse(&cts(C, 1, 2)[..22]), None);
        let mut k = rts(C, 5);
        k[0] = 9;
        assert_eq!(parse(&k), None);
        // An abort's reason is cut to fit, at a character boundary.
        let long = "é".repeat(60);
        let a = abort(C, &long);
        assert!(a.len() <= exanet_proto::ni::MAX_MESSAGE);
        match parse(&a) {
            Some((c, Body::Abort { reason })) => {
                assert_eq!(c, C);
                let r = std::str::from_utf8(reason).unwrap();
                assert!(!r.is_empty() && long.starts_with(r));
            }
            other => panic!("{other:?}"),
        }
        // Every prefix of every kind is refused or read, never a panic.
        for m in [data(C, 1, 60, &[9; 40]), rts(C, 77), cts(C, 3, 4)] {
            for n in 0..=m.len() {
                let _ = parse(&m[..n]);
            }
        }
    }
}
