//! Staging memory: where a rendezvous send's data waits for the receiver to read it, and
//! where a receiver's read lands before it is copied to the application's buffer. The NI
//! reads and writes only memory registered with it, and registering asks the daemon (a
//! round trip and a new shared-memory region), so an endpoint registers a few large
//! regions and hands out pieces of them; only a message larger than a region gets one of
//! its own, for as long as it needs it.

use std::collections::BTreeMap;

use exanet::{Endpoint, MemoryRegion};

/// Bytes of one pooled region.
const REGION: u64 = 8 << 20;
/// Pooled regions an endpoint keeps at most; past them, pieces get regions of their own.
const MAX_REGIONS: usize = 8;
/// Pieces start on a cell's payload boundary: the RDMA engine cuts a misaligned first
/// cell short, which costs a cell for nothing.
const ALIGN: u64 = 256;

/// A piece of staging memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Slot {
    /// The pooled region, or `None`: a region of its own.
    pooled: Option<usize>,
    pub offset: u64,
    pub len: u64,
    own: u64,
}

struct Pooled {
    region: MemoryRegion,
    /// Free pieces by offset.
    free: BTreeMap<u64, u64>,
}

/// One endpoint's staging memory.
#[derive(Default)]
pub struct Staging {
    pooled: Vec<Pooled>,
    own: BTreeMap<u64, MemoryRegion>,
    next_own: u64,
}

fn round_up(n: u64) -> u64 {
    n.div_ceil(ALIGN).max(1) * ALIGN
}

impl Staging {
    /// A piece of `len` bytes.
    pub fn alloc(&mut self, ep: &Endpoint, len: u64) -> exanet::Result<Slot> {
        let need = round_up(len);
        if need <= REGION {
            for (i, p) in self.pooled.iter_mut().enumerate() {
                if let Some(offset) = take(&mut p.free, need) {
                    return Ok(Slot {
                        pooled: Some(i),
                        offset,
                        len,
                        own: 0,
                    });
                }
            }
            if self.pooled.len() < MAX_REGIONS {
                let region = ep.register(REGION)?;
                let mut free = BTreeMap::new();
                free.insert(0, REGION);
                self.pooled.push(Pooled { region, free });
                let i = self.pooled.len() - 1;
                let offset = take(&mut self.pooled[i].free, need).expect("a fresh region");
                return Ok(Slot {
                    pooled: Some(i),
                    offset,
                    len,
                    own: 0,
                });
            }
        }
        let region = ep.register(len.max(1))?;
        let own = self.next_own;
        self.next_own += 1;
        self.own.insert(own, region);
        Ok(Slot {
            pooled: None,
            offset: 0,
            len,
            own,
        })
    }

    /// The region a piece lives in.
    pub fn region(&self, s: &Slot) -> &MemoryRegion {
        match s.pooled {
            Some(i) => &self.pooled[i].region,
            None => &self.own[&s.own],
        }
    }

    /// The piece's virtual address in the rank's registered memory.
    pub fn va(&self, s: &Slot) -> u64 {
        self.region(s).va() + s.offset
    }

    pub fn write(&self, s: &Slot, data: &[u8]) -> exanet::Result<()> {
        self.region(s).write(s.offset, data)
    }

    pub fn read(&self, s: &Slot, buf: &mut [u8]) -> exanet::Result<()> {
        self.region(s).read(s.offset, buf)
    }

    /// Gives a piece back.
    pub fn free(&mut self, s: Slot) {
        match s.pooled {
            Some(i) => give(&mut self.pooled[i].free, s.offset, round_up(s.len)),
            None => {
                self.own.remove(&s.own);
            }
        }
    }
}

/// Takes `need` bytes from the first free piece that holds them.
fn take(free: &mut BTreeMap<u64, u64>, need: u64) -> Option<u64> {
    let (&at, &len) = free.iter().find(|(_, &len)| len >= need)?;
    free.remove(&at);
    if len > need {
        free.insert(at + need, len - need);
    }
    Some(at)
}

/// Gives `[at, at + len)` back, merged with free neighbours.
fn give(free: &mut BTreeMap<u64, u64>, mut at: u64, mut len: u64) {
    if let Some((&before, &blen)) = free.range(..at).next_back() {
        if before + blen == at {
            free.remove(&before);
            at = before;
            len += blen;
        }
    }
    if let Some(&alen) = free.get(&(at + len)) {
        free.remove(&(at + len));
        len += alen;
    }
    free.insert(at, len);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pieces_are_taken_first_fit_and_merge_when_given_back() {
        let mut free = BTreeMap::from([(0, 4096)]);
        let a = take(&mut free, 1024).unwrap();
        let b = take(&mut free, 1024).unwrap();
        let c = take(&mut free, 2048).unwrap();
        assert_eq!((a, b, c), (0, 1024, 2048));
        assert_eq!(take(&mut free, 256), None);
        give(&mut free, b, 1024);
        assert_eq!(take(&mut free, 2048), None, "1024 B free, not 2048");
        give(&mut free, a, 1024);
        give(&mut free, c, 2048);
        assert_eq!(free, BTreeMap::from([(0, 4096)]));
        assert_eq!(round_up(0), 256);
        assert_eq!(round_up(257), 512);
    }
}
