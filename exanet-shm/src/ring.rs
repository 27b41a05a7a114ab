//! A single-producer single-consumer ring of fixed-size slots inside a [`Region`].
//!
//! # Layout
//!
//! A ring starts at a byte offset of the region that is a multiple of [`Ring::ALIGN`] (128)
//! and occupies [`Ring::layout_size`] bytes. All integers are `u32` in the machine's byte order
//! (little-endian on every target this crate supports); offsets are relative to the ring:
//!
//! ```text
//! offset  size  field               written by   notes
//! 0x000   4     magic               init         0x4752_5845, the bytes "EXRG"; stored last
//! 0x004   4     version             init         1
//! 0x008   4     capacity            init         number of slots, a power of two
//! 0x00c   4     slot_size           init         bytes per slot, a power of two, >= 16
//! 0x010   112   reserved            init         zero
//! 0x080   4     head                consumer     index of the next slot to read
//! 0x084   124   padding                          (head alone on its cache line)
//! 0x100   4     tail                producer     index of the next slot to write
//! 0x104   124   padding
//! 0x180   4     consumer_sleeping   both         1 = consumer about to block on its doorbell
//! 0x184   4     consumer_thread     consumer     the thread (Linux tid) that last used the
//!                                                ring's owner, 0 = not said; a hint
//! 0x188   4     consumer_asking     consumer     1 = the ring's owner waits for an answer
//!                                                of the producer's side; a hint
//! 0x18c   4     consumer_waiting    consumer     1 = the consumer waits for a message,
//!                                                spinning or asleep; a hint
//! 0x190   112   padding
//! 0x200   4     producer_sleeping   both         1 = producer about to block (ring full)
//! 0x204   124   padding
//! 0x280   capacity * slot_size      slots        slot s at 0x280 + s * slot_size
//! ...     up to a multiple of 128   padding
//! ```
//!
//! A slot holds one message:
//!
//! ```text
//! slot+0  4     stamp     ring index of the message + 1 (wrapping); stored last
//! slot+4  4     len       payload length, <= slot_size - 8
//! slot+8  len   payload
//! ```
//!
//! so a message carries at most `slot_size - 8` bytes ([`Ring::max_message_len`]).
//!
//! `head` and `tail` are free-running `u32` counters (wrapping at 2^32): message number `i`
//! lives in slot `i & (capacity - 1)`, the ring holds `tail - head` (wrapping subtraction)
//! messages, which is always in `0..=capacity`; capacity is at most 2^31 so that this
//! difference is unambiguous. [`Ring::init`] stamps every slot as if written one lap ago
//! (`i - capacity + 1` for the slot of message `i`), so a stamp equals `i + 1` only once
//! message `i` has been written.
//!
//! The stamp lets the consumer find out that the next message is there by reading the slot
//! it is going to read anyway: a message of up to `64 - 8` bytes then costs the consumer one
//! cache-line transfer, instead of one for `tail` plus one for the slot. The 128-byte spacing
//! of the header words keeps each on its own cache line (and its own pair of lines, for CPUs
//! whose adjacent-line prefetcher fetches 128 bytes): the producer writing `tail` does not
//! steal the line the consumer writes `head` on, and the `sleeping` words, which the other
//! side reads on every message, are not invalidated on every message.
//!
//! # Memory ordering
//!
//! - **Publishing a message.** The producer copies `len` and the payload into the slot (plain
//!   copies), stores the stamp with `Release`, then `tail` with `Release`. The consumer loads
//!   the stamp (or, when the stamp is not there yet, `tail`) with `Acquire` before copying
//!   the slot; Release/Acquire makes the slot bytes visible to a consumer that sees either.
//!   Because the stamp is stored before `tail`, a consumer that sees the new `tail` must see
//!   the stamp too; if not, the producer is broken ([`Corruption::Stamp`]).
//! - **Recycling a slot.** The consumer copies the slot out and then stores `head` with
//!   `Release`; the producer loads `head` with `Acquire` before overwriting the slot. This makes
//!   the consumer's reads happen before the producer's next writes to that slot, so the
//!   consumer never copies half of the next message.
//! - **Header.** [`Ring::init`] stores every field `Relaxed` and `magic` last with `Release`;
//!   attaching loads `magic` with `Acquire` first, so a ring whose magic is visible is fully
//!   initialised.
//! - **Wake-ups** use `SeqCst` fences; see [`crate::doorbell`].
//!
//! These orderings are stated in the Rust/C++ model, which describes threads; between
//! processes sharing physical pages the same instructions are used (plain `mov` on x86-64,
//! `ldar`/`stlr` and `dmb` on AArch64) and the hardware gives the same guarantees.
//!
//! # Distrusting the peer
//!
//! Each side keeps the authoritative copy of its *own* index in private memory (the shared
//! word is only a publication of it). The producer also keeps the last validated value of
//! `head` and re-reads it only when that says "full"; the consumer reads `tail` only when the
//! next slot's stamp says "not there yet". Both keep cache-line traffic down. Every value read
//! from the peer is validated before use:
//! - `tail - head > capacity` (the peer's index ran away, or went behind ours) is
//!   [`RingError::Corrupt`] with [`Corruption::Indices`]. One exception: the consumer can
//!   legitimately be one ahead of the published `tail` (it took message `tail` on the strength
//!   of its stamp before the producer's store of `tail + 1` became visible), so to the
//!   consumer `head == tail + 1` means "empty";
//! - `tail` says a message is there but its stamp does not: [`Corruption::Stamp`];
//! - a length above `slot_size - 8` is [`Corruption::SlotLength`];
//! - capacity and slot size are the values agreed at attach time, kept privately; the header
//!   is never re-read for them (a peer rewriting them changes nothing; [`Producer::check_header`]
//!   / [`Consumer::check_header`] report it).
//!
//! A producer that keeps writing correctly stamped slots is never asked about `tail`, so a
//! garbage `tail` is noticed when the ring next runs empty. That is enough: the consumer only
//! ever reads slots computed from its own index. Slot offsets come from the private capacity
//! and slot size, and every access goes through the region's bounds checks anyway, so no value
//! the peer writes can make us touch memory outside the ring. The errors are not sticky (a
//! peer that repairs the ring can go on), but the sensible reaction is to drop the peer.
//!
//! Nothing stops two `Producer`s (or `Consumer`s) for the same ring from being created, in one
//! process or two: the ring is single-producer single-consumer *by contract*. Breaking it
//! garbles messages but, everything being bounds-checked safe code, never memory.

use std::fmt;
use std::sync::atomic::{fence, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::doorbell::{
    deadline_after, take_sleeper, time_left, wake_sleeper, Doorbell, Ringer, Waiter,
};
use crate::region::{Region, RegionError, SharedU32};

const MAGIC: u32 = u32::from_le_bytes(*b"EXRG");
const VERSION: u32 = 1;

const OFF_MAGIC: usize = 0x000;
const OFF_VERSION: usize = 0x004;
const OFF_CAPACITY: usize = 0x008;
const OFF_SLOT_SIZE: usize = 0x00c;
const OFF_HEAD: usize = 0x080;
const OFF_TAIL: usize = 0x100;
const OFF_CONSUMER_SLEEPING: usize = 0x180;
const OFF_CONSUMER_THREAD: usize = 0x184;
const OFF_CONSUMER_ASKING: usize = 0x188;
const OFF_CONSUMER_WAITING: usize = 0x18c;
const OFF_PRODUCER_SLEEPING: usize = 0x200;
const OFF_SLOTS: usize = 0x280;

/// Offset of the stamp in a slot.
const SLOT_STAMP: usize = 0;
/// Offset of the length in a slot.
const SLOT_LEN: usize = 4;
/// Offset of the payload in a slot, i.e. the per-slot overhead.
const SLOT_PAYLOAD: usize = 8;

/// Errors of ring operations.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RingError {
    /// [`Producer::push`]: no free slot. Retry after the consumer made progress.
    #[error("ring is full")]
    Full,
    /// [`Producer::push`]: the message does not fit in a slot.
    #[error("message of {len} bytes exceeds the {max}-byte slot payload")]
    TooLong {
        /// Length of the message.
        len: usize,
        /// [`Ring::max_message_len`].
        max: usize,
    },
    /// [`Consumer::pop`]: the caller's buffer is too small; the message stays in the ring.
    #[error("receive buffer of {available} bytes is too small for a {needed}-byte message")]
    BufferTooSmall {
        /// Length of the next message.
        needed: usize,
        /// Length of the buffer passed.
        available: usize,
    },
    /// The ring geometry (offset, slot count, slot size) is invalid or does not fit the
    /// region.
    #[error("invalid ring layout: {0}")]
    InvalidLayout(&'static str),
    /// Attaching: the header in shared memory is not what was agreed on (or was never
    /// initialised).
    #[error("ring header field {field} is {found:#x}, expected {expected:#x}")]
    HeaderMismatch {
        /// The header field.
        field: &'static str,
        /// What was agreed on.
        expected: u32,
        /// What the header holds.
        found: u32,
    },
    /// The peer wrote values into the ring that no correct peer can write.
    #[error("ring corrupted by the peer: {0}")]
    Corrupt(Corruption),
    /// A region access failed. Cannot happen for a ring that was validated against its
    /// region; kept as an error rather than a panic.
    #[error(transparent)]
    Region(#[from] RegionError),
}

/// What exactly a corrupt peer did; carried by [`RingError::Corrupt`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Corruption {
    /// `tail - head` (wrapping) exceeds the capacity: an index ran ahead, or went back.
    Indices {
        /// Head value used (the consumer's index).
        head: u32,
        /// Tail value used (the producer's index).
        tail: u32,
        /// Capacity agreed on.
        capacity: u32,
    },
    /// `tail` says message `index` was published, but its slot's stamp disagrees.
    Stamp {
        /// Ring index of the message.
        index: u32,
        /// Stamp expected (`index + 1`).
        expected: u32,
        /// Stamp found.
        found: u32,
    },
    /// A slot's length exceeds the slot payload.
    SlotLength {
        /// Ring index of the slot.
        index: u32,
        /// Length found.
        len: u32,
        /// Maximum payload ([`Ring::max_message_len`]).
        max: u32,
    },
    /// An immutable header field changed after attaching.
    Header {
        /// The header field.
        field: &'static str,
        /// Value at attach time.
        expected: u32,
        /// Value found now.
        found: u32,
    },
}

impl fmt::Display for Corruption {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Corruption::Indices {
                head,
                tail,
                capacity,
            } => {
                write!(
                    f,
                    "head {head} and tail {tail} are more than the capacity {capacity} apart"
                )
            }
            Corruption::Stamp {
                index,
                expected,
                found,
            } => {
                write!(
                    f,
                    "message {index} is published but its slot is stamped {found}, not {expected}"
                )
            }
            Corruption::SlotLength { index, len, max } => {
                write!(f, "slot {index} claims {len} bytes, at most {max} fit")
            }
            Corruption::Header {
                field,
                expected,
                found,
            } => {
                write!(
                    f,
                    "header field {field} changed from {expected:#x} to {found:#x}"
                )
            }
        }
    }
}

/// Errors of the blocking ring operations: the ring's, or the doorbell's system calls.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum WaitError {
    /// The ring reported an error while waiting (typically [`RingError::Corrupt`]).
    #[error(transparent)]
    Ring(#[from] RingError),
    /// Polling or reading the doorbell failed (`BrokenPipe`: the other end is closed).
    #[error("doorbell: {0}")]
    Doorbell(#[from] std::io::Error),
}

impl From<RegionError> for WaitError {
    fn from(e: RegionError) -> WaitError {
        WaitError::Ring(RingError::Region(e))
    }
}

/// The geometry of one ring: where it starts in its region, how many slots, how large.
///
/// Both sides must agree on it (typically the daemon decides and tells the client); it is
/// checked against the ring header when attaching.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Ring {
    offset: usize,
    slots: u32,
    slot_size: u32,
}

impl Ring {
    /// Required alignment of a ring's offset in its region, and spacing of the header words.
    pub const ALIGN: usize = 128;
    /// Size of the header in front of the slots.
    pub const HEADER_SIZE: usize = OFF_SLOTS;
    /// Smallest slot size (8 bytes of stamp and length + 8 bytes of payload).
    pub const MIN_SLOT_SIZE: u32 = 16;
    /// Largest slot size (16 MiB; larger transfers are RDMA's business).
    pub const MAX_SLOT_SIZE: u32 = 1 << 24;
    /// Largest slot count (so that `tail - head` is unambiguous in 32 bits).
    pub const MAX_SLOTS: u32 = 1 << 31;

    /// Describes a ring of `slots` slots of `slot_size` bytes at byte `offset` of a region.
    ///
    /// `slots` must be a power of two in `1..=MAX_SLOTS`, `slot_size` a power of two in
    /// `MIN_SLOT_SIZE..=MAX_SLOT_SIZE`, `offset` a multiple of [`Ring::ALIGN`], and the whole
    /// ring must fit in `usize`.
    pub fn new(offset: usize, slots: u32, slot_size: u32) -> Result<Ring, RingError> {
        if offset % Self::ALIGN != 0 {
            return Err(RingError::InvalidLayout("offset is not a multiple of 128"));
        }
        let size = Self::layout_size(slots, slot_size)?;
        offset
            .checked_add(size)
            .ok_or(RingError::InvalidLayout("ring extends past usize::MAX"))?;
        Ok(Ring {
            offset,
            slots,
            slot_size,
        })
    }

    /// Bytes a ring of `slots` slots of `slot_size` bytes occupies: the header plus the slots,
    /// rounded up to a multiple of [`Ring::ALIGN`] so that rings can be placed back to back.
    pub fn layout_size(slots: u32, slot_size: u32) -> Result<usize, RingError> {
        if !slots.is_power_of_two() || slots > Self::MAX_SLOTS {
            return Err(RingError::InvalidLayout(
                "slot count must be a power of two, at most 2^31",
            ));
        }
        if !slot_size.is_power_of_two()
            || !(Self::MIN_SLOT_SIZE..=Self::MAX_SLOT_SIZE).contains(&slot_size)
        {
            return Err(RingError::InvalidLayout(
                "slot size must be a power of two between 16 and 2^24",
            ));
        }
        (slots as usize)
            .checked_mul(slot_size as usize)
            .and_then(|s| s.checked_add(Self::HEADER_SIZE + Self::ALIGN - 1))
            .map(|s| s / Self::ALIGN * Self::ALIGN)
            .ok_or(RingError::InvalidLayout("ring size overflows usize"))
    }

    /// Offset of the ring in its region.
    pub fn offset(&self) -> usize {
        self.offset
    }

    /// Number of slots (the capacity in messages).
    pub fn slots(&self) -> u32 {
        self.slots
    }

    /// Bytes per slot.
    pub fn slot_size(&self) -> u32 {
        self.slot_size
    }

    /// Bytes this ring occupies ([`Ring::layout_size`]).
    pub fn size(&self) -> usize {
        // Validated in `new`.
        (self.slots as usize * self.slot_size as usize + Self::HEADER_SIZE).div_ceil(Self::ALIGN)
            * Self::ALIGN
    }

    /// First byte after the ring: the offset for a ring placed right behind this one.
    pub fn end(&self) -> usize {
        self.offset + self.size()
    }

    /// Largest message a slot carries: `slot_size - 8`.
    pub fn max_message_len(&self) -> usize {
        self.slot_size as usize - SLOT_PAYLOAD
    }

    fn check_fits(&self, region: &Region) -> Result<(), RingError> {
        if self.end() > region.len() {
            return Err(RingError::InvalidLayout("ring does not fit in the region"));
        }
        Ok(())
    }

    /// Region offset of the slot for ring index `index`.
    #[inline]
    fn slot_offset(&self, index: u32) -> usize {
        self.offset + OFF_SLOTS + (index & (self.slots - 1)) as usize * self.slot_size as usize
    }

    /// Writes a fresh header (empty ring, nobody sleeping) into `region` and stamps every
    /// slot as written one lap ago.
    ///
    /// Meant for the side that created the region, before handing it to the peer. Calling it
    /// on a ring in use resets it under both sides' feet.
    pub fn init(&self, region: &Region) -> Result<(), RingError> {
        self.init_at(region, 0)
    }

    /// [`Ring::init`] with both indices starting at `index` instead of 0. The wire format
    /// does not care where the indices start; this lets tests run a ring across the `u32`
    /// wrap-around without pushing 2^32 messages first.
    pub fn init_at(&self, region: &Region, index: u32) -> Result<(), RingError> {
        self.check_fits(region)?;
        let word = |off: usize| region.atomic_u32(self.offset + off);
        word(OFF_MAGIC)?.store(0, Ordering::Relaxed);
        word(OFF_VERSION)?.store(VERSION, Ordering::Relaxed);
        word(OFF_CAPACITY)?.store(self.slots, Ordering::Relaxed);
        word(OFF_SLOT_SIZE)?.store(self.slot_size, Ordering::Relaxed);
        region.write(self.offset + 0x10, &[0u8; OFF_HEAD - 0x10])?;
        word(OFF_HEAD)?.store(index, Ordering::Relaxed);
        word(OFF_TAIL)?.store(index, Ordering::Relaxed);
        word(OFF_CONSUMER_SLEEPING)?.store(0, Ordering::Relaxed);
        word(OFF_CONSUMER_THREAD)?.store(0, Ordering::Relaxed);
        word(OFF_CONSUMER_ASKING)?.store(0, Ordering::Relaxed);
        word(OFF_CONSUMER_WAITING)?.store(0, Ordering::Relaxed);
        word(OFF_PRODUCER_SLEEPING)?.store(0, Ordering::Relaxed);
        for i in 0..self.slots {
            // Message `index + i` goes into this slot next; until then it holds the stamp of
            // message `index + i - capacity`.
            let message = index.wrapping_add(i);
            let stale = message.wrapping_sub(self.slots).wrapping_add(1);
            region
                .atomic_u32(self.slot_offset(message) + SLOT_STAMP)?
                .store(stale, Ordering::Relaxed);
            region.write(self.slot_offset(message) + SLOT_LEN, &0u32.to_le_bytes())?;
        }
        // Release: whoever sees the magic sees every field above.
        word(OFF_MAGIC)?.store(MAGIC, Ordering::Release);
        Ok(())
    }

    /// Whether messages are published and not yet taken, as the shared words say (a hint
    /// for a third party; the consumer's own count is authoritative).
    pub fn pending(&self, region: &Region) -> Result<bool, RingError> {
        self.check_fits(region)?;
        // Acquire: pairs with the producer's Release store of tail, so that whoever saw
        // something the producer did after publishing sees the message.
        let tail = region
            .atomic_u32(self.offset + OFF_TAIL)?
            .load(Ordering::Acquire);
        let head = region
            .atomic_u32(self.offset + OFF_HEAD)?
            .load(Ordering::Acquire);
        Ok(tail != head)
    }

    /// Validates the header of an initialised ring against this geometry and returns the
    /// current `(head, tail)`.
    fn attach(&self, region: &Region) -> Result<(u32, u32), RingError> {
        self.check_fits(region)?;
        let word = |off: usize| region.atomic_u32(self.offset + off);
        // Acquire: pairs with the Release store of the magic in `init`.
        let magic = word(OFF_MAGIC)?.load(Ordering::Acquire);
        let expect = |field: &'static str, expected: u32, found: u32| {
            if found == expected {
                Ok(())
            } else {
                Err(RingError::HeaderMismatch {
                    field,
                    expected,
                    found,
                })
            }
        };
        expect("magic", MAGIC, magic)?;
        expect(
            "version",
            VERSION,
            word(OFF_VERSION)?.load(Ordering::Relaxed),
        )?;
        expect(
            "capacity",
            self.slots,
            word(OFF_CAPACITY)?.load(Ordering::Relaxed),
        )?;
        expect(
            "slot_size",
            self.slot_size,
            word(OFF_SLOT_SIZE)?.load(Ordering::Relaxed),
        )?;
        // Acquire on both: the attaching side may go on to read slots or overwrite them.
        let head = word(OFF_HEAD)?.load(Ordering::Acquire);
        let tail = word(OFF_TAIL)?.load(Ordering::Acquire);
        Ok((head, tail))
    }

    /// Number of messages between `head` and `tail` as the producer sees them (its own tail
    /// is authoritative, so the consumer can never be ahead of it), or the corruption.
    #[inline]
    fn check_indices(&self, head: u32, tail: u32) -> Result<u32, RingError> {
        let used = tail.wrapping_sub(head);
        if used > self.slots {
            return Err(RingError::Corrupt(Corruption::Indices {
                head,
                tail,
                capacity: self.slots,
            }));
        }
        Ok(used)
    }

    /// Number of messages between `head` and `tail` as the consumer sees them: it may be one
    /// ahead of the published tail (it took message `tail` on the strength of its stamp before
    /// the store of `tail + 1` became visible), which counts as empty.
    #[inline]
    fn check_indices_consumer(&self, head: u32, tail: u32) -> Result<u32, RingError> {
        if head.wrapping_sub(tail) == 1 {
            return Ok(0);
        }
        self.check_indices(head, tail)
    }

    /// Re-reads the immutable header fields and reports any change.
    fn check_header(&self, region: &Region) -> Result<(), RingError> {
        let word = |off: usize| region.atomic_u32(self.offset + off);
        for (field, off, expected) in [
            ("magic", OFF_MAGIC, MAGIC),
            ("version", OFF_VERSION, VERSION),
            ("capacity", OFF_CAPACITY, self.slots),
            ("slot_size", OFF_SLOT_SIZE, self.slot_size),
        ] {
            let found = word(off)?.load(Ordering::Relaxed);
            if found != expected {
                return Err(RingError::Corrupt(Corruption::Header {
                    field,
                    expected,
                    found,
                }));
            }
        }
        Ok(())
    }

    /// Attaches the producing side to the initialised ring in `region`.
    ///
    /// Fails with [`RingError::HeaderMismatch`] if the header disagrees with this geometry
    /// (or the ring was never initialised), [`RingError::Corrupt`] if its indices are
    /// inconsistent.
    pub fn producer(&self, region: Arc<Region>) -> Result<Producer, RingError> {
        let (head, mut tail) = self.attach(&region)?;
        // A previous producer may have died between stamping message `tail` and publishing
        // `tail + 1`: the message is out (the consumer may even have taken it), so go on
        // after it rather than overwrite it.
        let stamp = region
            .atomic_u32(self.slot_offset(tail) + SLOT_STAMP)?
            .load(Ordering::Acquire);
        if stamp == tail.wrapping_add(1) {
            tail = stamp;
            region
                .atomic_u32(self.offset + OFF_TAIL)?
                .store(tail, Ordering::Release);
        }
        self.check_indices(head, tail)?;
        Ok(Producer {
            region,
            ring: *self,
            tail,
            head_cache: head,
        })
    }

    /// Attaches the consuming side to the initialised ring in `region`; see
    /// [`Ring::producer`].
    pub fn consumer(&self, region: Arc<Region>) -> Result<Consumer, RingError> {
        let (head, tail) = self.attach(&region)?;
        self.check_indices_consumer(head, tail)?;
        Ok(Consumer {
            region,
            ring: *self,
            head,
        })
    }
}

/// The writing end of a ring.
#[derive(Debug)]
pub struct Producer {
    region: Arc<Region>,
    ring: Ring,
    /// Our index, authoritative (the shared `tail` is a publication of it).
    tail: u32,
    /// Last validated value of the consumer's `head`.
    head_cache: u32,
}

impl Producer {
    /// The ring's geometry.
    pub fn ring(&self) -> &Ring {
        &self.ring
    }

    /// The region the ring lives in.
    pub fn region(&self) -> &Arc<Region> {
        &self.region
    }

    /// Largest message [`push`](Producer::push) accepts.
    pub fn max_message_len(&self) -> usize {
        self.ring.max_message_len()
    }

    fn word(&self, off: usize) -> Result<SharedU32<'_>, RegionError> {
        self.region.atomic_u32(self.ring.offset + off)
    }

    /// Loads and validates the consumer's head; returns the number of messages in the ring.
    fn refresh_head(&mut self) -> Result<u32, RingError> {
        // Acquire: pairs with the consumer's Release store of head, so its reads of the slots
        // it released happen before we overwrite them.
        let head = self.word(OFF_HEAD)?.load(Ordering::Acquire);
        let used = self.ring.check_indices(head, self.tail)?;
        self.head_cache = head;
        Ok(used)
    }

    /// Appends one message. Does not wake the consumer: call
    /// [`wake_consumer`](Producer::wake_consumer) after a push or a batch of pushes.
    ///
    /// Errors: [`RingError::TooLong`], [`RingError::Full`] (nothing written; retry later),
    /// [`RingError::Corrupt`].
    pub fn push(&mut self, msg: &[u8]) -> Result<(), RingError> {
        let max = self.ring.max_message_len();
        if msg.len() > max {
            return Err(RingError::TooLong {
                len: msg.len(),
                max,
            });
        }
        if self.tail.wrapping_sub(self.head_cache) >= self.ring.slots
            && self.refresh_head()? >= self.ring.slots
        {
            return Err(RingError::Full);
        }
        let slot = self.ring.slot_offset(self.tail);
        // `msg.len() <= max < 2^24`, fits.
        self.region
            .write(slot + SLOT_LEN, &(msg.len() as u32).to_le_bytes())?;
        self.region.write(slot + SLOT_PAYLOAD, msg)?;
        let next = self.tail.wrapping_add(1);
        // Release (both): publishes the length and payload written above to a consumer that
        // Acquire-loads either the stamp or the tail. Stamp first, so that the tail never
        // announces a slot whose stamp is not visible yet.
        self.region
            .atomic_u32(slot + SLOT_STAMP)?
            .store(next, Ordering::Release);
        self.word(OFF_TAIL)?.store(next, Ordering::Release);
        self.tail = next;
        Ok(())
    }

    /// Free slots right now (re-reads the consumer's head).
    pub fn free(&mut self) -> Result<u32, RingError> {
        Ok(self.ring.slots - self.refresh_head()?)
    }

    /// Whether the ring is empty: the consumer took every message.
    pub fn is_drained(&mut self) -> Result<bool, RingError> {
        Ok(self.refresh_head()? == 0)
    }

    /// Whether the consumer announced it sleeps on its doorbell (a hint the peer writes:
    /// anything but 1 reads as awake).
    pub fn consumer_sleeping(&self) -> Result<bool, RingError> {
        Ok(self.word(OFF_CONSUMER_SLEEPING)?.load(Ordering::Acquire) == 1)
    }

    /// Whether the consumer said it waits for a message in [`Consumer::wait_readable`],
    /// spinning or asleep (a hint the peer writes: anything but 1 reads as not waiting).
    /// Unlike [`consumer_sleeping`](Producer::consumer_sleeping), which only the sleep
    /// sets and a wake-up withdraws, it stays from the wait's start to its end.
    pub fn consumer_waiting(&self) -> Result<bool, RingError> {
        Ok(self.word(OFF_CONSUMER_WAITING)?.load(Ordering::Acquire) == 1)
    }

    /// The thread the consumer last said used the ring's owner (see
    /// [`Consumer::thread_mark`]), 0 if none: a hint the peer writes, never trusted.
    pub fn consumer_thread(&self) -> Result<u32, RingError> {
        Ok(self.word(OFF_CONSUMER_THREAD)?.load(Ordering::Relaxed))
    }

    /// Whether the consumer said its ring's owner waits for an answer of this side (see
    /// [`ThreadMark::asking`]): a hint the peer writes, never trusted.
    pub fn consumer_asking(&self) -> Result<bool, RingError> {
        Ok(self.word(OFF_CONSUMER_ASKING)?.load(Ordering::Acquire) == 1)
    }

    /// Like [`Consumer::prepare_sleep`], for a producer waiting for space: announces the
    /// sleep in `producer_sleeping`, then re-checks. `true` = a slot is free, do not sleep.
    pub fn prepare_sleep(&mut self) -> Result<bool, RingError> {
        self.word(OFF_PRODUCER_SLEEPING)?
            .store(1, Ordering::Relaxed);
        fence(Ordering::SeqCst);
        if self.refresh_head()? < self.ring.slots {
            self.word(OFF_PRODUCER_SLEEPING)?
                .store(0, Ordering::Relaxed);
            return Ok(true);
        }
        Ok(false)
    }

    /// Withdraws the announcement of [`prepare_sleep`](Producer::prepare_sleep) after waking.
    pub fn finish_sleep(&self) -> Result<(), RingError> {
        self.word(OFF_PRODUCER_SLEEPING)?
            .store(0, Ordering::Relaxed);
        Ok(())
    }

    /// Rings `bell` if the consumer announced that it is going to sleep on it. Returns whether
    /// it rang. Cheap (a fence and a load) when the consumer is awake.
    pub fn wake_consumer(&self, bell: &Ringer) -> Result<bool, WaitError> {
        Ok(wake_sleeper(self.word(OFF_CONSUMER_SLEEPING)?, bell)?)
    }

    /// [`Producer::wake_consumer`] without the ring: whether the consumer announced its
    /// sleep (the announcement is withdrawn). `true` obliges the caller to ring its bell.
    pub fn take_sleeping_consumer(&self) -> Result<bool, RingError> {
        Ok(take_sleeper(self.word(OFF_CONSUMER_SLEEPING)?))
    }

    /// Waits until at least one slot is free: spins, then announces itself in
    /// `producer_sleeping` and sleeps on `bell`, which the consumer rings from
    /// [`Consumer::wake_producer`]. Returns `Ok(false)` on timeout.
    pub fn wait_writable(
        &mut self,
        waiter: &Waiter,
        bell: &Doorbell,
        timeout: Option<Duration>,
    ) -> Result<bool, WaitError> {
        if self.tail.wrapping_sub(self.head_cache) < self.ring.slots {
            return Ok(true);
        }
        // Destructured so that the closure can update the cache while `flag` borrows the region.
        let Producer {
            region,
            ring,
            tail,
            head_cache,
        } = self;
        let flag = region.atomic_u32(ring.offset + OFF_PRODUCER_SLEEPING)?;
        waiter.wait(flag, bell, timeout, || {
            // Acquire: as in `refresh_head`.
            let head = region
                .atomic_u32(ring.offset + OFF_HEAD)?
                .load(Ordering::Acquire);
            let used = ring.check_indices(head, *tail)?;
            *head_cache = head;
            Ok::<_, WaitError>(used < ring.slots)
        })
    }

    /// [`push`](Producer::push), waiting with [`wait_writable`](Producer::wait_writable) while
    /// the ring is full. Returns `Ok(false)` (nothing pushed) on timeout.
    pub fn push_wait(
        &mut self,
        msg: &[u8],
        waiter: &Waiter,
        bell: &Doorbell,
        timeout: Option<Duration>,
    ) -> Result<bool, WaitError> {
        let deadline = deadline_after(timeout);
        loop {
            match self.push(msg) {
                Ok(()) => return Ok(true),
                Err(RingError::Full) => {}
                Err(e) => return Err(e.into()),
            }
            if !self.wait_writable(waiter, bell, time_left(deadline))? {
                return Ok(false);
            }
        }
    }

    /// Reports whether the peer rewrote the immutable header fields since attaching
    /// ([`Corruption::Header`]).
    pub fn check_header(&self) -> Result<(), RingError> {
        self.ring.check_header(&self.region)
    }
}

/// The consumer's `consumer_thread` word (see [`Consumer::thread_mark`]).
#[derive(Clone, Debug)]
pub struct ThreadMark {
    region: Arc<Region>,
    offset: usize,
}

impl ThreadMark {
    /// Says that thread `tid` uses the ring's owner now.
    pub fn set(&self, tid: u32) {
        if let Ok(w) = self.region.atomic_u32(self.offset) {
            w.store(tid, Ordering::Relaxed);
        }
    }

    /// Says whether the ring's owner waits for an answer of the producer's side (a
    /// request on another channel), which is no wait for anything else.
    pub fn asking(&self, yes: bool) {
        let at = self.offset - OFF_CONSUMER_THREAD + OFF_CONSUMER_ASKING;
        if let Ok(w) = self.region.atomic_u32(at) {
            w.store(u32::from(yes), Ordering::Release);
        }
    }
}

/// The reading end of a ring.
#[derive(Debug)]
pub struct Consumer {
    region: Arc<Region>,
    ring: Ring,
    /// Our index, authoritative (the shared `head` is a publication of it).
    head: u32,
}

/// Whether message `head` of `ring` is readable: its stamp is there, or else `tail` says
/// nothing was published (`Ok(false)`) or is inconsistent (`Err`).
fn next_readable(region: &Region, ring: &Ring, head: u32) -> Result<bool, RingError> {
    let expected = head.wrapping_add(1);
    let stamp = region.atomic_u32(ring.slot_offset(head) + SLOT_STAMP)?;
    // Acquire: pairs with the producer's Release store of the stamp, making the slot's
    // length and payload visible.
    if stamp.load(Ordering::Acquire) == expected {
        return Ok(true);
    }
    // Acquire: pairs with the producer's Release store of tail.
    let tail = region
        .atomic_u32(ring.offset + OFF_TAIL)?
        .load(Ordering::Acquire);
    if ring.check_indices_consumer(head, tail)? == 0 {
        return Ok(false);
    }
    // The producer stores the stamp before the tail, so having seen the tail we must see the
    // stamp (Acquire again, for the slot bytes).
    let found = stamp.load(Ordering::Acquire);
    if found != expected {
        return Err(RingError::Corrupt(Corruption::Stamp {
            index: head,
            expected,
            found,
        }));
    }
    Ok(true)
}

impl Consumer {
    /// The ring's geometry.
    pub fn ring(&self) -> &Ring {
        &self.ring
    }

    /// The region the ring lives in.
    pub fn region(&self) -> &Arc<Region> {
        &self.region
    }

    /// Largest message the ring carries.
    pub fn max_message_len(&self) -> usize {
        self.ring.max_message_len()
    }

    fn word(&self, off: usize) -> Result<SharedU32<'_>, RegionError> {
        self.region.atomic_u32(self.ring.offset + off)
    }

    /// Takes the next message, copying it into `buf`: `Ok(Some(len))`, or `Ok(None)` if the
    /// ring is empty.
    ///
    /// Errors: [`RingError::BufferTooSmall`] (the message stays in the ring; a buffer of
    /// [`max_message_len`](Consumer::max_message_len) bytes always suffices),
    /// [`RingError::Corrupt`].
    pub fn pop(&mut self, buf: &mut [u8]) -> Result<Option<usize>, RingError> {
        if !next_readable(&self.region, &self.ring, self.head)? {
            return Ok(None);
        }
        let slot = self.ring.slot_offset(self.head);
        let mut len = [0u8; 4];
        self.region.read(slot + SLOT_LEN, &mut len)?;
        // Read once into private memory, validated, then used: the peer changing it now
        // cannot affect us.
        let len = u32::from_le_bytes(len);
        let max = self.ring.max_message_len();
        if len as usize > max {
            return Err(RingError::Corrupt(Corruption::SlotLength {
                index: self.head,
                len,
                max: max as u32,
            }));
        }
        let len = len as usize;
        let Some(dst) = buf.get_mut(..len) else {
            return Err(RingError::BufferTooSmall {
                needed: len,
                available: buf.len(),
            });
        };
        self.region.read(slot + SLOT_PAYLOAD, dst)?;
        self.head = self.head.wrapping_add(1);
        // Release: our copies of the slot happen before the producer (Acquire-loading head)
        // overwrites it.
        self.word(OFF_HEAD)?.store(self.head, Ordering::Release);
        Ok(Some(len))
    }

    /// Messages available right now, according to the producer's tail (which may lag one
    /// message behind what [`pop`](Consumer::pop) finds through the stamps).
    pub fn available(&self) -> Result<u32, RingError> {
        // Acquire: as in `next_readable`.
        let tail = self.word(OFF_TAIL)?.load(Ordering::Acquire);
        self.ring.check_indices_consumer(self.head, tail)
    }

    /// For event loops that wait on the doorbell themselves (e.g. tokio's `AsyncFd` on
    /// the doorbell's [`AsRawFd`](std::os::fd::AsRawFd)) instead of through [`wait_readable`](Consumer::wait_readable):
    /// announces that the consumer is going to sleep, then re-checks.
    ///
    /// Returns `true` if a message is already there: the announcement is withdrawn, do not
    /// sleep. Returns `false` if the caller may sleep until the doorbell is readable; it must
    /// then drain the doorbell and call [`finish_sleep`](Consumer::finish_sleep). The order
    /// (announce, `SeqCst` fence, re-check) is what guarantees that no wake-up is lost; see
    /// [`crate::doorbell`].
    pub fn prepare_sleep(&self) -> Result<bool, RingError> {
        let flag = self.word(OFF_CONSUMER_SLEEPING)?;
        flag.store(1, Ordering::Relaxed);
        fence(Ordering::SeqCst);
        if self.next_stamped()? {
            flag.store(0, Ordering::Relaxed);
            return Ok(true);
        }
        Ok(false)
    }

    /// Whether the next slot holds a message (its stamp is the one the producer writes
    /// last). Acquire: as in `wait_readable`.
    fn next_stamped(&self) -> Result<bool, RingError> {
        let stamp = self
            .region
            .atomic_u32(self.ring.slot_offset(self.head) + SLOT_STAMP)?;
        Ok(stamp.load(Ordering::Acquire) == self.head.wrapping_add(1))
    }

    /// Withdraws the announcement of [`prepare_sleep`](Consumer::prepare_sleep) after waking.
    pub fn finish_sleep(&self) -> Result<(), RingError> {
        self.word(OFF_CONSUMER_SLEEPING)?
            .store(0, Ordering::Relaxed);
        Ok(())
    }

    /// Where the consumer says which thread last used the ring's owner
    /// ([`Producer::consumer_thread`]), as a handle any thread may write through.
    pub fn thread_mark(&self) -> Result<ThreadMark, RingError> {
        // Checked once here, so that marking cannot fail.
        self.word(OFF_CONSUMER_THREAD)?;
        self.word(OFF_CONSUMER_ASKING)?;
        Ok(ThreadMark {
            region: Arc::clone(&self.region),
            offset: self.ring.offset + OFF_CONSUMER_THREAD,
        })
    }

    /// Rings `bell` if the producer announced that it is going to sleep on it (waiting for
    /// space). Returns whether it rang. Only needed if the producer uses
    /// [`Producer::wait_writable`].
    pub fn wake_producer(&self, bell: &Ringer) -> Result<bool, WaitError> {
        Ok(wake_sleeper(self.word(OFF_PRODUCER_SLEEPING)?, bell)?)
    }

    /// Waits until the next message is available: spins, then announces itself in
    /// `consumer_sleeping` and sleeps on `bell`, which the producer rings from
    /// [`Producer::wake_consumer`]. Returns `Ok(false)` on timeout.
    ///
    /// Only the next slot's stamp is watched, so that spinning touches the one cache line the
    /// message will arrive in; a corrupt `tail` is reported by the next [`pop`](Consumer::pop)
    /// (which [`pop_wait`](Consumer::pop_wait) does first), not here.
    pub fn wait_readable(
        &self,
        waiter: &Waiter,
        bell: &Doorbell,
        timeout: Option<Duration>,
    ) -> Result<bool, WaitError> {
        let flag = self.word(OFF_CONSUMER_SLEEPING)?;
        let stamp = self
            .region
            .atomic_u32(self.ring.slot_offset(self.head) + SLOT_STAMP)?;
        let expected = self.head.wrapping_add(1);
        // Said for the whole wait, spin included: a thread spinning here (or descheduled
        // in its spin) waits for the producer as one asleep does, and a producer that
        // took it for busy elsewhere took its next command for out of order.
        let waiting = self.word(OFF_CONSUMER_WAITING)?;
        waiting.store(1, Ordering::Release);
        // Acquire: pairs with the producer's Release store of the stamp. The producer stores
        // the stamp before its SeqCst fence in `wake_consumer`, which is what the sleeping
        // protocol needs (see `crate::doorbell`).
        let r = waiter.wait(flag, bell, timeout, || {
            Ok::<_, WaitError>(stamp.load(Ordering::Acquire) == expected)
        });
        waiting.store(0, Ordering::Release);
        r
    }

    /// Spins for `waiter`'s budget, then sleeps once: returns when the next message is
    /// there, when `bell` is rung for whatever reason, or at `timeout`; `Ok(true)` when a
    /// message is there. Unlike [`wait_readable`](Consumer::wait_readable), a ring with
    /// no message ends the wait, so that a thread that must look at more than the ring
    /// (a stop flag its own side sets before ringing, a header the peer may have
    /// scribbled on) needs no timeout to poll it with.
    pub fn wait_readable_once(
        &self,
        waiter: &Waiter,
        bell: &Doorbell,
        timeout: Option<Duration>,
    ) -> Result<bool, WaitError> {
        // The spin, within the timeout, ending with an announce-and-recheck that does not
        // sleep; the sleep gets what is left of the timeout.
        let deadline = deadline_after(timeout);
        let spin = timeout.map_or(waiter.spin(), |t| waiter.spin().min(t));
        if self.wait_readable(waiter, bell, Some(spin))? {
            return Ok(true);
        }
        if self.prepare_sleep()? {
            return Ok(true);
        }
        let rung = bell.wait(time_left(deadline));
        self.finish_sleep()?;
        rung?;
        Ok(self.next_stamped()?)
    }

    /// [`pop`](Consumer::pop), waiting with [`wait_readable`](Consumer::wait_readable) while
    /// the ring is empty. Returns `Ok(None)` on timeout.
    pub fn pop_wait(
        &mut self,
        buf: &mut [u8],
        waiter: &Waiter,
        bell: &Doorbell,
        timeout: Option<Duration>,
    ) -> Result<Option<usize>, WaitError> {
        let deadline = deadline_after(timeout);
        loop {
            if let Some(n) = self.pop(buf)? {
                return Ok(Some(n));
            }
            if !self.wait_readable(waiter, bell, time_left(deadline))? {
                return Ok(None);
            }
        }
    }

    /// Reports whether the peer rewrote the immutable header fields since attaching
    /// ([`Corruption::Header`]).
    pub fn check_header(&self) -> Result<(), RingError> {
        self.ring.check_header(&self.region)
    }
}
