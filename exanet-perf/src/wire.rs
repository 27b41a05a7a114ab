//! The rendezvous messages between `exanet-perf ... run` and `exanet-perf ... serve`
//! (see the crate docs for the protocol). Every message is one packetizer message of at
//! most 64 bytes: `"XPRF"`, version 1, kind, then the kind's fields, big-endian.

pub const MAGIC: &[u8; 4] = b"XPRF";
pub const VERSION: u8 = 1;

pub const BENCH_PINGPONG: u8 = 1;
pub const BENCH_RDMA: u8 = 2;

pub const ST_OK: u8 = 0;
pub const ST_TOO_BIG: u8 = 1;
pub const ST_FAILED: u8 = 2;
pub const ST_MISMATCH: u8 = 3;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Msg {
    /// Client -> server control mailbox: open a session. `buffer`: bytes of server memory
    /// the client wants to target (RDMA), 0 for none.
    Hello {
        bench: u8,
        client_vi: u8,
        buffer: u64,
    },
    /// Server -> client: the session is open (or not: `status`). Pings go to mailbox
    /// `data_vi`; RDMA targets `buf_va..buf_va+buf_len`, notifications `notify_va`.
    Welcome {
        status: u8,
        data_vi: u8,
        buf_va: u64,
        buf_len: u64,
        notify_va: u64,
    },
    /// Client -> server: the session is over.
    Bye,
    /// Client -> server: write `pattern(seed)` over `len` bytes at `offset` of the buffer.
    Fill { seed: u64, offset: u64, len: u64 },
    /// Client -> server: check that `len` bytes at `offset` hold `pattern(seed)`.
    Check { seed: u64, offset: u64, len: u64 },
    /// Server -> client: a fill or check ended; `detail` = first bad offset on mismatch.
    Done { status: u8, detail: u64 },
}

const K_HELLO: u8 = 1;
const K_WELCOME: u8 = 2;
const K_BYE: u8 = 3;
const K_FILL: u8 = 4;
const K_CHECK: u8 = 5;
const K_DONE: u8 = 6;

fn put(b: &mut Vec<u8>, v: u64) {
    b.extend_from_slice(&v.to_be_bytes());
}

fn get(b: &[u8], at: usize) -> Option<u64> {
    Some(u64::from_be_bytes(b.get(at..at + 8)?.try_into().ok()?))
}

impl Msg {
    pub fn encode(&self) -> Vec<u8> {
        let mut b = Vec::with_capacity(40);
        b.extend_from_slice(MAGIC);
        b.push(VERSION);
        match *self {
            Msg::Hello {
                bench,
                client_vi,
                buffer,
            } => {
                b.extend_from_slice(&[K_HELLO, bench, client_vi]);
                put(&mut b, buffer);
            }
            Msg::Welcome {
                status,
                data_vi,
                buf_va,
                buf_len,
                notify_va,
            } => {
                b.extend_from_slice(&[K_WELCOME, status, data_vi]);
                put(&mut b, buf_va);
                put(&mut b, buf_len);
                put(&mut b, notify_va);
            }
            Msg::Bye => b.extend_from_slice(&[K_BYE, 0, 0]),
            Msg::Fill { seed, offset, len } | Msg::Check { seed, offset, len } => {
                let k = if matches!(self, Msg::Fill { .. }) {
                    K_FILL
                } else {
                    K_CHECK
                };
                b.extend_from_slice(&[k, 0, 0]);
                put(&mut b, seed);
                put(&mut b, offset);
                put(&mut b, len);
            }
            Msg::Done { status, detail } => {
                b.extend_from_slice(&[K_DONE, status, 0]);
                put(&mut b, detail);
            }
        }
        b
    }

    pub fn decode(b: &[u8]) -> Option<Msg> {
        if b.len() < 8 || &b[..4] != MAGIC || b[4] != VERSION {
            return None;
        }
        Some(match b[5] {
            K_HELLO => Msg::Hello {
                bench: b[6],
                client_vi: b[7],
                buffer: get(b, 8)?,
            },
            K_WELCOME => Msg::Welcome {
                status: b[6],
                data_vi: b[7],
                buf_va: get(b, 8)?,
                buf_len: get(b, 16)?,
                notify_va: get(b, 24)?,
            },
            K_BYE => Msg::Bye,
            K_FILL => Msg::Fill {
                seed: get(b, 8)?,
                offset: get(b, 16)?,
                len: get(b, 24)?,
            },
            K_CHECK => Msg::Check {
                seed: get(b, 8)?,
                offset: get(b, 16)?,
                len: get(b, 24)?,
            },
            K_DONE => Msg::Done {
                status: b[6],
                detail: get(b, 8)?,
            },
            _ => return None,
        })
    }
}

/// Byte `i` of the test pattern `seed`: cheap, and no short period.
#[inline]
pub fn pattern_byte(seed: u64, i: u64) -> u8 {
    let x = i.wrapping_add(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15));
    (x ^ (x >> 8) ^ (x >> 19) ^ (x >> 31) ^ (x >> 47)) as u8
}

/// Fills `buf` with the pattern `seed`, starting at pattern offset `start`.
pub fn fill(buf: &mut [u8], seed: u64, start: u64) {
    for (i, b) in buf.iter_mut().enumerate() {
        *b = pattern_byte(seed, start + i as u64);
    }
}

/// The first offset of `buf` that does not hold the pattern, if any.
pub fn first_mismatch(buf: &[u8], seed: u64, start: u64) -> Option<u64> {
    buf.iter()
        .enumerate()
        .find(|&(i, &b)| b != pattern_byte(seed, start + i as u64))
        .map(|(i, _)| i as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_round_trip_and_fit_a_packet() {
        let all = [
            Msg::Hello {
                bench: BENCH_RDMA,
                client_vi: 3,
                buffer: 1 << 22,
            },
            Msg::Welcome {
                status: ST_OK,
                data_vi: 1,
                buf_va: 0x4000_0000,
                buf_len: 1 << 22,
                notify_va: 0x4040_0000,
            },
            Msg::Bye,
            Msg::Fill {
                seed: 9,
                offset: 4096,
                len: 100,
            },
            Msg::Check {
                seed: 9,
                offset: 4096,
                len: 100,
            },
            Msg::Done {
                status: ST_MISMATCH,
                detail: 17,
            },
        ];
        for m in all {
            let b = m.encode();
            assert!(b.len() <= 64);
            assert_eq!(Msg::decode(&b), Some(m));
        }
        assert_eq!(Msg::decode(b"XPRF"), None);
        assert_eq!(Msg::decode(&[0u8; 40]), None);
        let mut short = Msg::Bye.encode();
        short[5] = K_WELCOME;
        assert_eq!(Msg::decode(&short), None);
    }

    #[test]
    fn pattern_detects_shifts_and_seeds() {
        let mut a = vec![0u8; 10_000];
        fill(&mut a, 5, 0);
        assert_eq!(first_mismatch(&a, 5, 0), None);
        assert!(first_mismatch(&a, 6, 0).is_some());
        assert!(first_mismatch(&a[1..], 5, 0).is_some());
        a[7777] ^= 1;
        assert_eq!(first_mismatch(&a, 5, 0), Some(7777));
    }
}
