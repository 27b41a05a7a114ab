//! References the collective and accelerator tests compare with, written apart from the
//! code under test (`ni::allreduce::combine`), so that a mistake there fails the tests
//! instead of moving their expectations with it; and the inputs they draw.
//!
//! Shared by `exanet-collective`'s unit tests (`exanet-collective/src/lib.rs`) and the simulator's
//! (`tests/allreduce_sim.rs`), which include it by path: the importing module brings
//! `DataType`, `ReduceOp` and `SplitMix64` into scope.

use super::{DataType, ReduceOp, SplitMix64};

/// Values of varied magnitudes and both zeros, so that any change of the order of
/// the operations shows in the bits.
pub fn value(rng: &mut SplitMix64) -> f64 {
    match rng.below(16) {
        0 => 0.0,
        1 => -0.0,
        _ => {
            let mantissa = 1.0 + (rng.next_u64() >> 11) as f64 / (1u64 << 53) as f64;
            let sign = if rng.below(2) == 0 { 1.0 } else { -1.0 };
            sign * mantissa * 2f64.powi(rng.below(41) as i32 - 20)
        }
    }
}

pub fn vector(rng: &mut SplitMix64, ty: DataType, elements: usize) -> Vec<u8> {
    let mut v = Vec::with_capacity(elements * ty.size());
    for _ in 0..elements {
        match ty {
            DataType::I32 => v.extend((rng.next_u64() as i32).to_le_bytes()),
            DataType::I64 => v.extend((rng.next_u64() as i64).to_le_bytes()),
            DataType::F32 => v.extend((value(rng) as f32).to_le_bytes()),
            DataType::F64 => v.extend(value(rng).to_le_bytes()),
        }
    }
    v
}

/// `a op b` element by element, written apart from `combine` (which the collectives
/// use) so that a mistake there fails these tests instead of moving the expectation
/// with it: integer sums wrap, min and max compare signed values, and on a float tie
/// (0.0 against -0.0) the first operand stays.
pub fn combined(op: ReduceOp, ty: DataType, a: &[u8], b: &[u8]) -> Vec<u8> {
    fn each<T: Copy, const N: usize>(
        a: &[u8],
        b: &[u8],
        from: fn([u8; N]) -> T,
        to: fn(T) -> [u8; N],
        f: impl Fn(T, T) -> T,
    ) -> Vec<u8> {
        let get = |c: &[u8]| from(c.try_into().unwrap());
        a.chunks_exact(N)
            .zip(b.chunks_exact(N))
            .flat_map(|(x, y)| to(f(get(x), get(y))))
            .collect()
    }
    // f32::min and f64::min may return either zero on a tie.
    fn first_on_tie<T: PartialEq + Copy>(f: fn(T, T) -> T) -> impl Fn(T, T) -> T {
        move |x, y| if x == y { x } else { f(x, y) }
    }
    use DataType::*;
    use ReduceOp::*;
    match (ty, op) {
        (I32, Sum) => each(
            a,
            b,
            i32::from_le_bytes,
            i32::to_le_bytes,
            i32::wrapping_add,
        ),
        (I32, Min) => each(a, b, i32::from_le_bytes, i32::to_le_bytes, i32::min),
        (I32, Max) => each(a, b, i32::from_le_bytes, i32::to_le_bytes, i32::max),
        (I64, Sum) => each(
            a,
            b,
            i64::from_le_bytes,
            i64::to_le_bytes,
            i64::wrapping_add,
        ),
        (I64, Min) => each(a, b, i64::from_le_bytes, i64::to_le_bytes, i64::min),
        (I64, Max) => each(a, b, i64::from_le_bytes, i64::to_le_bytes, i64::max),
        (F32, Sum) => each(a, b, f32::from_le_bytes, f32::to_le_bytes, |x, y| x + y),
        (F32, Min) => each(
            a,
            b,
            f32::from_le_bytes,
            f32::to_le_bytes,
            first_on_tie(f32::min),
        ),
        (F32, Max) => each(
            a,
            b,
            f32::from_le_bytes,
            f32::to_le_bytes,
            first_on_tie(f32::max),
        ),
        (F64, Sum) => each(a, b, f64::from_le_bytes, f64::to_le_bytes, |x, y| x + y),
        (F64, Min) => each(
            a,
            b,
            f64::from_le_bytes,
            f64::to_le_bytes,
            first_on_tie(f64::min),
        ),
        (F64, Max) => each(
            a,
            b,
            f64::from_le_bytes,
            f64::to_le_bytes,
            first_on_tie(f64::max),
        ),
    }
}
