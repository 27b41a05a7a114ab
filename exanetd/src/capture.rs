//! Captures: taps on the node's links that copy the cells crossing them to an operator's
//! `exactl capture` ([`exanet_proto::capture`] has the record format).
//!
//! The fabric never waits for a capture. A link task offers each cell to the taps and
//! goes on: a tap that matches copies the cell into a bounded queue, and when the queue
//! is full (the operator's connection is slower than the link) the record is dropped and
//! counted, never the cell. With no capture running, the cost is one relaxed atomic load
//! per batch of frames.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{SystemTime, UNIX_EPOCH};

use exanet_proto::capture::{CaptureFilter, Direction, Record, Seen};
use exanet_proto::Port;
use tokio::sync::mpsc;

/// Records a tap queues for its operator before it drops: ~1 MiB of full cells, enough
/// for the bursts of one link while the operator's connection catches up.
pub const QUEUE_RECORDS: usize = 4096;

/// One queued record: its wall-clock time (ns since the Unix epoch) and bytes.
pub type Queued = (u64, Vec<u8>);

/// What one capture takes.
pub struct TapSpec {
    /// Ports captured; `None`: every port.
    pub ports: Option<Vec<Port>>,
    pub rx: bool,
    pub tx: bool,
    pub filter: CaptureFilter,
    /// Records to take before the tap closes itself.
    pub count: Option<u64>,
}

struct Tap {
    id: u64,
    spec: TapSpec,
    queue: mpsc::Sender<Queued>,
    /// Records queued (and so taken toward `count`).
    taken: AtomicU64,
    dropped: AtomicU64,
}

impl Tap {
    fn wants(&self, port: Port, dir: Direction) -> bool {
        let dir_ok = match dir {
            Direction::Received => self.spec.rx,
            Direction::Sent => self.spec.tx,
        };
        dir_ok && self.spec.ports.as_ref().is_none_or(|p| p.contains(&port))
    }
}

/// The node's taps. Counters survive the taps, for metrics.
#[derive(Default)]
pub struct Taps {
    active: AtomicUsize,
    taps: Mutex<Vec<Arc<Tap>>>,
    next_id: AtomicU64,
    /// Records captured and dropped over the daemon's life.
    pub captured_total: AtomicU64,
    pub dropped_total: AtomicU64,
}

/// A running capture: its records arrive on `records`; dropping it removes the tap.
pub struct Capture {
    taps: Arc<Taps>,
    tap: Arc<Tap>,
    pub records: mpsc::Receiver<Queued>,
}

impl Capture {
    /// Records dropped so far because the queue was full.
    pub fn dropped(&self) -> u64 {
        self.tap.dropped.load(Ordering::Relaxed)
    }

    /// Takes no more cells; what is queued can still be read.
    pub fn close(&self) {
        self.taps.remove(self.tap.id);
    }
}

impl Drop for Capture {
    fn drop(&mut self) {
        self.close();
    }
}

impl Taps {
    /// Whether any capture runs: the only cost the link tasks pay when none does.
    #[inline]
    pub fn any(&self) -> bool {
        self.active.load(Ordering::Relaxed) != 0
    }

    pub fn start(self: &Arc<Taps>, spec: TapSpec) -> Capture {
        let (queue, records) = mpsc::channel(QUEUE_RECORDS);
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let tap = Arc::new(Tap {
            id,
            spec,
            queue,
            taken: AtomicU64::new(0),
            dropped: AtomicU64::new(0),
        });
        let mut taps = self.taps.lock().unwrap_or_else(|p| p.into_inner());
        taps.push(tap.clone());
        self.active.store(taps.len(), Ordering::Relaxed);
        Capture {
            taps: self.clone(),
            tap,
            records,
        }
    }

    /// Whether a capture wants the cells crossing `port` in direction `dir` (before
    /// paying to read them back).
    pub fn wants(&self, port: Port, dir: Direction) -> bool {
        let taps = self.taps.lock().unwrap_or_else(|p| p.into_inner());
        taps.iter().any(|t| t.wants(port, dir))
    }

    fn remove(&self, id: u64) {
        let mut taps = self.taps.lock().unwrap_or_else(|p| p.into_inner());
        taps.retain(|t| t.id != id);
        self.active.store(taps.len(), Ordering::Relaxed);
    }

    /// Offers a cell (its wire bytes) seen crossing a link as `seen` says.
    pub fn offer(&self, seen: &Seen, cell: &[u8]) {
        let (port, dir) = (seen.port, seen.direction);
        let taps = self.taps.lock().unwrap_or_else(|p| p.into_inner());
        let mut wall = None;
        for tap in taps.iter() {
            if !tap.wants(port, dir) || !tap.spec.filter.matches(cell) {
                continue;
            }
            if tap
                .spec
                .count
                .is_some_and(|c| tap.taken.load(Ordering::Relaxed) >= c)
            {
                continue;
            }
            if tap.queue.capacity() == 0 {
                // Full: not worth encoding a record only to drop it.
                tap.dropped.fetch_add(1, Ordering::Relaxed);
                self.dropped_total.fetch_add(1, Ordering::Relaxed);
                continue;
            }
            let at = *wall.get_or_insert_with(|| {
                SystemTime::now()
                    .duration_since(UNIX_EPOCH)
                    .map_or(0, |d| d.as_nanos() as u64)
            });
            let mut bytes = Vec::new();
            Record::encode_into(seen, cell, &mut bytes);
            match tap.queue.try_send((at, bytes)) {
                Ok(()) => {
                    tap.taken.fetch_add(1, Ordering::Relaxed);
                    self.captured_total.fetch_add(1, Ordering::Relaxed);
                }
                Err(mpsc::error::TrySendError::Full(_)) => {
                    tap.dropped.fetch_add(1, Ordering::Relaxed);
                    self.dropped_total.fetch_add(1, Ordering::Relaxed);
                }
                // The operator left; the capture's owner removes the tap.
                Err(mpsc::error::TrySendError::Closed(_)) => {}
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use exanet_proto::model::ModelTime;
    use exanet_proto::routing::Vc;
    use exanet_proto::NodeId;

    fn spec(count: Option<u64>) -> TapSpec {
        TapSpec {
            ports: Some(vec![Port::from_index(0).unwrap()]),
            rx: true,
            tx: false,
            filter: CaptureFilter::default(),
            count,
        }
    }

    fn offer(taps: &Taps, port: usize, dir: Direction) {
        let seen = Seen {
            direction: dir,
            node: NodeId(1),
            peer: NodeId(2),
            port: Port::from_index(port).unwrap(),
            vc: Vc(0),
            modeled: ModelTime(5),
        };
        taps.offer(&seen, &[0u8; 32]);
    }

    #[test]
    fn a_tap_takes_its_port_and_direction_up_to_its_count_and_goes_with_its_capture() {
        let taps = Arc::new(Taps::default());
        assert!(!taps.any());
        let mut cap = taps.start(spec(Some(2)));
        assert!(taps.any());
        offer(&taps, 1, Direction::Received);
        offer(&taps, 0, Direction::Sent);
        for _ in 0..3 {
            offer(&taps, 0, Direction::Received);
        }
        let mut got = 0;
        while let Ok((wall, rec)) = cap.records.try_recv() {
            assert!(wall > 0);
            let r = Record::decode(&rec).unwrap();
            assert_eq!((r.seen.peer, r.seen.modeled), (NodeId(2), ModelTime(5)));
            got += 1;
        }
        assert_eq!(got, 2, "only port 0, received, and no more than the count");
        drop(cap);
        assert!(!taps.any());
    }

    #[test]
    fn a_full_queue_drops_records_and_counts_them() {
        let taps = Arc::new(Taps::default());
        let cap = taps.start(spec(None));
        for _ in 0..QUEUE_RECORDS + 10 {
            offer(&taps, 0, Direction::Received);
        }
        assert_eq!(cap.dropped(), 10);
        assert_eq!(taps.dropped_total.load(Ordering::Relaxed), 10);
        assert_eq!(
            taps.captured_total.load(Ordering::Relaxed),
            QUEUE_RECORDS as u64
        );
    }
}
