//! Property test: any sequence of pushes and pops behaves like a bounded `VecDeque`.

mod common;

use std::collections::VecDeque;

use exanet_shm::RingError;
use proptest::prelude::*;

#[derive(Clone, Debug)]
enum Op {
    /// Push a message of `len` bytes (may exceed the slot) filled from `seed`.
    Push { len: usize, seed: u8 },
    /// Pop into a buffer of `buf` bytes (may be too small).
    Pop { buf: usize },
    /// Query the free slots / available messages.
    Levels,
}

fn op(max: usize) -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (0..=max + 2, any::<u8>()).prop_map(|(len, seed)| Op::Push { len, seed }),
        3 => prop_oneof![Just(max), 0..=max].prop_map(|buf| Op::Pop { buf }),
        1 => Just(Op::Levels),
    ]
}

fn geometry_and_ops() -> impl Strategy<Value = (u32, u32, Vec<Op>)> {
    (0u32..=4, prop::sample::select(vec![16u32, 32, 64])).prop_flat_map(|(log_slots, slot_size)| {
        let max = slot_size as usize - 8;
        (
            Just(1 << log_slots),
            Just(slot_size),
            prop::collection::vec(op(max), 0..400),
        )
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn ring_matches_vecdeque((slots, slot_size, ops) in geometry_and_ops()) {
        let (mut tx, mut rx) = common::pair(slots, slot_size);
        let max = slot_size as usize - 8;
        let mut model: VecDeque<Vec<u8>> = VecDeque::new();
        for op in ops {
            match op {
                Op::Push { len, seed } => {
                    let msg: Vec<u8> = (0..len).map(|i| seed.wrapping_add(i as u8)).collect();
                    let got = tx.push(&msg);
                    if len > max {
                        prop_assert!(matches!(got, Err(RingError::TooLong { len: l, max: m }) if l == len && m == max), "{got:?}");
                    } else if model.len() == slots as usize {
                        prop_assert!(matches!(got, Err(RingError::Full)), "{got:?}");
                    } else {
                        prop_assert!(got.is_ok(), "{got:?}");
                        model.push_back(msg);
                    }
                }
                Op::Pop { buf } => {
                    let mut b = vec![0u8; buf];
                    let got = rx.pop(&mut b);
                    match model.front() {
                        None => prop_assert!(matches!(got, Ok(None)), "{got:?}"),
                        Some(front) if front.len() > buf => prop_assert!(
                            matches!(got, Err(RingError::BufferTooSmall { needed, available }) if needed == front.len() && available == buf),
                            "{got:?}"
                        ),
                        Some(_) => {
                            let expected = model.pop_front().unwrap();
                            let n = match got {
                                Ok(Some(n)) => n,
                                other => return Err(TestCaseError::fail(format!("{other:?}"))),
                            };
                            prop_assert_eq!(&b[..n], &expected[..]);
                        }
                    }
                }
                Op::Levels => {
                    prop_assert_eq!(tx.free().unwrap() as usize, slots as usize - model.len());
                    prop_assert_eq!(rx.available().unwrap() as usize, model.len());
                }
            }
        }
    }
}
