//! What a receiver remembers for a while of what it took (delivered messages, finished
//! blocks, served reads), so that a late copy is told from new data: kept by key, and
//! forgotten oldest first from a queue in arrival order, so that expiring costs what
//! expires, not a scan of everything remembered.

use std::collections::{BTreeMap, VecDeque};

use crate::time::Instant;

#[derive(Debug)]
pub(crate) struct Recent<K, V> {
    map: BTreeMap<K, (V, Instant)>,
    order: VecDeque<(Instant, K)>,
}

impl<K: Ord + Copy, V> Default for Recent<K, V> {
    fn default() -> Self {
        Recent {
            map: BTreeMap::new(),
            order: VecDeque::new(),
        }
    }
}

impl<K: Ord + Copy, V> Recent<K, V> {
    /// Remembers `key` with `value` from `now` (again, from now, if it was already).
    pub(crate) fn insert(&mut self, key: K, value: V, now: Instant) {
        self.map.insert(key, (value, now));
        self.order.push_back((now, key));
    }

    pub(crate) fn get(&self, key: &K) -> Option<&V> {
        self.map.get(key).map(|(v, _)| v)
    }

    pub(crate) fn contains_key(&self, key: &K) -> bool {
        self.map.contains_key(key)
    }

    /// When the oldest is to be forgotten, each kept `keep` ns.
    pub(crate) fn next_deadline(&self, keep: u64) -> Option<Instant> {
        self.order.front().map(|(t, _)| *t + keep)
    }

    /// Forgets what was remembered `keep` ns or more before `now`; a key remembered
    /// again since stays until its newer time is as old.
    pub(crate) fn expire(&mut self, now: Instant, keep: u64) {
        while let Some(&(t, key)) = self.order.front() {
            if now.since(t) < keep {
                break;
            }
            self.order.pop_front();
            if self.map.get(&key).is_some_and(|(_, w)| *w == t) {
                self.map.remove(&key);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_oldest_are_forgotten_first_and_a_key_seen_again_lives_from_then() {
        let mut r: Recent<u32, u8> = Recent::default();
        r.insert(1, 10, Instant::ZERO + 0);
        r.insert(2, 20, Instant::ZERO + 5);
        r.insert(1, 11, Instant::ZERO + 8);
        assert_eq!(r.next_deadline(10), Some(Instant::ZERO + 10));
        r.expire(Instant::ZERO + 10, 10);
        assert_eq!(r.get(&1), Some(&11), "remembered again at 8");
        assert!(r.contains_key(&2));
        r.expire(Instant::ZERO + 15, 10);
        assert!(!r.contains_key(&2));
        assert_eq!(r.get(&1), Some(&11));
        r.expire(Instant::ZERO + 18, 10);
        assert_eq!(r.get(&1), None);
        assert_eq!(r.next_deadline(10), None);
    }
}
