//! Who may join a job: job keys as the rack file keeps them (their SHA-256). What a job
//! and an attached process may hold lives with the workload service that enforces it
//! ([`exanet_proto::quota`]), re-exported here for the rack file's tables.

pub use exanet_proto::quota::*;

/// The SHA-256 of a job key.
pub fn key_digest(key: &str) -> [u8; 32] {
    let d = ring::digest::digest(&ring::digest::SHA256, key.as_bytes());
    d.as_ref().try_into().expect("SHA-256 is 32 bytes")
}

/// A `key_sha256` value: 64 hex digits.
pub fn parse_digest(hex: &str) -> Option<[u8; 32]> {
    let hex = hex.trim();
    if hex.len() != 64 || !hex.is_ascii() {
        return None;
    }
    let mut out = [0u8; 32];
    for (i, b) in out.iter_mut().enumerate() {
        *b = u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).ok()?;
    }
    Some(out)
}

/// Compares a job's key digest with a presented one without an early exit, so that how long
/// a refusal takes says nothing about how much of the digest matched.
pub fn digests_equal(theirs: Option<&[u8; 32]>, presented: &[u8; 32]) -> bool {
    theirs.is_some_and(|t| {
        t.iter()
            .zip(presented)
            .fold(0u8, |acc, (a, b)| acc | (a ^ b))
            == 0
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn digests_parse_and_compare() {
        let d = key_digest("test");
        let hex: String = d.iter().map(|b| format!("{b:02x}")).collect();
        assert_eq!(
            hex,
            "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08"
        );
        assert_eq!(parse_digest(&hex), Some(d));
        assert_eq!(parse_digest(&hex.to_uppercase()), Some(d));
        assert_eq!(parse_digest(&hex[1..]), None);
        assert_eq!(parse_digest(&format!("{}zz", &hex[2..])), None);
        assert!(digests_equal(Some(&d), &d));
        assert!(!digests_equal(Some(&key_digest("tesT")), &d));
        assert!(!digests_equal(None, &d));
    }
}
