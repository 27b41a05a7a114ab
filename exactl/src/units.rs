//! Quantities as operators type them: durations (`200us`, `1.5ms`, `2s`), rates
//! (`100Mbit`, `1Gbit`, `1.5Gbps` in bits, `12.5MB/s`, `1GiB/s` in bytes) and percentages (`0.1%`), parsed exactly (no float
//! rounding surprises for whole numbers) and printed back the same way.
//!
//! Bare numbers are refused: `--delay 5` could be seconds or milliseconds and `--loss 0.5`
//! half a percent or half of all cells, and a wrong guess would silently run a different
//! experiment.

use exanet_proto::fault::{FaultKind, FaultUnit, FaultValue};

/// Parses a duration into nanoseconds: a number with `ns`, `us` (or `µs`), `ms`, `s` or
/// `m`. `0` alone is allowed, since it is zero in every unit.
pub fn parse_duration(s: &str) -> Result<u64, String> {
    let t = s.trim();
    if t == "0" {
        return Ok(0);
    }
    let (num, unit) = split_number(t);
    let scale: f64 = match unit {
        "ns" => 1.0,
        "us" | "µs" => 1e3,
        "ms" => 1e6,
        "s" | "sec" => 1e9,
        "m" | "min" => 60e9,
        "" => return Err(format!("{s:?} has no unit (give one: 200us, 1.5ms, 2s)")),
        u => {
            return Err(format!(
                "{s:?}: unknown unit {u:?} (use ns, us, ms, s or m)"
            ))
        }
    };
    let v = parse_number(num, s)?;
    let ns = v * scale;
    if ns > u64::MAX as f64 / 2.0 {
        return Err(format!("{s:?} is too long"));
    }
    Ok(ns.round() as u64)
}

/// The rate units `parse_rate` takes, for its error messages.
const RATE_UNITS: &str = "accepted: bit, kbit, Mbit, Gbit, Tbit, also Mbps, Mbit/s, Mibit, \
     for bits per second; B/s, kB/s, MB/s, GB/s, TB/s, also MiB/s, GiB/s, for bytes per second";

/// Parses a rate into bits per second. Bits: `bit` with a prefix (`kbit`, `Mbit`, `Gbit`,
/// `Tbit`, binary `Kibit`, `Mibit`, `Gibit`, `Tibit`), also `bps`/`kbps`/`Mbps`/... and
/// `bit/s`, any case. Bytes per second (8 bits each): `B/s` with a prefix (`kB/s`, `MB/s`,
/// `GB/s`, `TB/s`, binary `KiB/s`, `MiB/s`, ...), the `B` upper case.
///
/// What could be read either way is refused rather than guessed: a bare prefix (`100M`),
/// an amount without `/s` (`100MB`, `5B`), a lower-case `b` (`100Mb`, `100Mb/s`: bits to
/// some, bytes to others) and `Bps`/`MBps` (bytes to some tools, bits to others).
pub fn parse_rate(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let (num, unit) = split_number(t);
    let scale = rate_unit(num, unit).map_err(|why| format!("{s:?} {why} ({RATE_UNITS})"))?;
    let v = parse_number(num, s)?;
    let bps = v * scale;
    if bps < 1.0 {
        return Err(format!("{s:?} is below 1 bit/s"));
    }
    if bps > 1e15 {
        return Err(format!("{s:?} is beyond any link"));
    }
    Ok(bps.round() as u64)
}

/// Bits per second per unit of `unit`, or why `unit` is refused (a phrase that follows
/// the value in the message, suggesting both readings with the operator's own number).
fn rate_unit(num: &str, unit: &str) -> Result<f64, String> {
    let (scale, prefix, base) = rate_prefix(unit);
    let readings = |p: &str| {
        let n = if num.is_empty() { "100" } else { num };
        format!("write {n}{p}bit for bits per second or {n}{p}B/s for bytes per second")
    };
    let lc = base.to_ascii_lowercase();
    match base {
        "" if prefix.is_empty() => Err("has no unit".into()),
        "" => Err(format!("has no bit or byte unit: {}", readings(prefix))),
        "B/s" => Ok(scale * 8.0),
        "B" => Err(format!(
            "is an amount of data, not a rate: {}",
            readings(prefix)
        )),
        _ if matches!(lc.as_str(), "bit" | "bits" | "bit/s" | "bits/s") => Ok(scale),
        "bps" => Ok(scale),
        "b" | "b/s" | "Bps" | "BPS" | "bPS" => {
            Err(format!("could mean bits or bytes: {}", readings(prefix)))
        }
        _ => Err(format!("has an unknown unit {unit:?}")),
    }
}

/// Splits a rate unit into its prefix's scale, the prefix as typed, and the rest:
/// `k`/`K` 1e3, `M` 1e6, `G` 1e9, `T` 1e12 (any case), `Ki` 2^10 ... `Ti` 2^40.
fn rate_prefix(unit: &str) -> (f64, &str, &str) {
    let mut chars = unit.chars();
    let decimal = match chars.next().map(|c| c.to_ascii_lowercase()) {
        Some('k') => 1e3,
        Some('m') => 1e6,
        Some('g') => 1e9,
        Some('t') => 1e12,
        _ => return (1.0, "", unit),
    };
    let binary = 1024f64.powi(match unit.as_bytes()[0].to_ascii_lowercase() {
        b'k' => 1,
        b'm' => 2,
        b'g' => 3,
        _ => 4,
    });
    if unit[1..].starts_with('i') {
        (binary, &unit[..2], &unit[2..])
    } else {
        (decimal, &unit[..1], &unit[1..])
    }
}

/// Parses a percentage (`0.1%`, `30%`) into a probability 0..=1.
pub fn parse_percent(s: &str) -> Result<f64, String> {
    let t = s.trim();
    let Some(num) = t.strip_suffix('%') else {
        return Err(format!(
            "{s:?} is not a percentage (write it with %, e.g. 0.1% or 30%)"
        ));
    };
    let v = parse_number(num.trim(), s)?;
    if !(0.0..=100.0).contains(&v) {
        return Err(format!("{s:?} is outside 0% to 100%"));
    }
    Ok(v / 100.0)
}

fn split_number(t: &str) -> (&str, &str) {
    let end = t
        .char_indices()
        .find(|(_, c)| !(c.is_ascii_digit() || *c == '.'))
        .map_or(t.len(), |(i, _)| i);
    (&t[..end], t[end..].trim())
}

fn parse_number(num: &str, whole: &str) -> Result<f64, String> {
    if num.is_empty() {
        return Err(format!("{whole:?} does not start with a number"));
    }
    // Plain decimals only: Rust's float syntax would also take `1e2`, `inf` or `NaN`.
    if !num.chars().all(|c| c.is_ascii_digit() || c == '.') {
        return Err(format!("{whole:?}: {num:?} is not a plain decimal number"));
    }
    let v: f64 = num
        .parse()
        .map_err(|_| format!("{whole:?}: {num:?} is not a number"))?;
    if !v.is_finite() || v < 0.0 {
        return Err(format!("{whole:?} is not a usable number"));
    }
    Ok(v)
}

/// `1.5ms`, `200us`, `2s`: the largest unit that keeps the number readable.
pub fn format_duration(ns: u64) -> String {
    let f = ns as f64;
    if ns == 0 {
        "0".into()
    } else if ns >= 1_000_000_000 {
        format!("{}s", trim(f / 1e9))
    } else if ns >= 1_000_000 {
        format!("{}ms", trim(f / 1e6))
    } else if ns >= 1_000 {
        format!("{}us", trim(f / 1e3))
    } else {
        format!("{ns}ns")
    }
}

/// `100Mbit`, `1.5Gbit`.
pub fn format_rate(bps: u64) -> String {
    let f = bps as f64;
    if bps >= 1_000_000_000 {
        format!("{}Gbit", trim(f / 1e9))
    } else if bps >= 1_000_000 {
        format!("{}Mbit", trim(f / 1e6))
    } else if bps >= 1_000 {
        format!("{}kbit", trim(f / 1e3))
    } else {
        format!("{bps}bit")
    }
}

/// `0.1%`, `30%`.
pub fn format_percent(p: f64) -> String {
    format!("{}%", trim(p * 100.0))
}

/// At most three decimals, without trailing zeros.
fn trim(v: f64) -> String {
    let s = format!("{v:.3}");
    let s = s.trim_end_matches('0').trim_end_matches('.');
    s.to_string()
}

/// A fault value as operators write it, in the unit of its kind (`exactl link set` flags
/// and fault plans). A switch has no text form: it is a flag or a plan's `true`/`false`.
pub fn parse_fault(unit: FaultUnit, s: &str) -> Result<FaultValue, String> {
    match unit {
        FaultUnit::Duration => parse_duration(s).map(FaultValue::Duration),
        FaultUnit::Rate => parse_rate(s).map(FaultValue::Rate),
        FaultUnit::Probability => parse_percent(s).map(FaultValue::Probability),
        FaultUnit::Switch => Err(format!("{s:?}: this fault is set with true or false")),
    }
}

/// A fault value as it was written: `200us`, `100Mbit`, `0.1%`; a rate of 0 is `off`
/// (an unshaped link, not a link that sends nothing).
pub fn format_fault(v: FaultValue) -> String {
    match v {
        FaultValue::Duration(ns) => format_duration(ns),
        FaultValue::Rate(0) => "off".into(),
        FaultValue::Rate(bps) => format_rate(bps),
        FaultValue::Probability(p) => format_percent(p),
        FaultValue::Switch(on) => if on { "on" } else { "off" }.into(),
    }
}

/// A fault in command-line words: `delay 200us`, `rate off`, `down`, `up`.
pub fn fault_words(kind: FaultKind, v: FaultValue) -> String {
    match v {
        FaultValue::Switch(true) => kind.name().to_string(),
        FaultValue::Switch(false) => match kind.off_flag() {
            Some((off, _)) => off.to_string(),
            None => format!("no {}", kind.name()),
        },
        v => format!("{} {}", kind.name(), format_fault(v)),
    }
}

/// The placeholder of a flag taking a value of `unit`.
pub fn value_name(unit: FaultUnit) -> &'static str {
    match unit {
        FaultUnit::Duration => "DURATION",
        FaultUnit::Rate => "RATE",
        FaultUnit::Probability => "PERCENT",
        FaultUnit::Switch => "BOOL",
    }
}

/// A value of `unit` as a fault plan writes it, for error messages.
pub fn plan_example(unit: FaultUnit) -> &'static str {
    match unit {
        FaultUnit::Duration => "\"1.5s\" (a number needs its unit)",
        FaultUnit::Rate => "\"100Mbit\"",
        FaultUnit::Probability => "\"5%\"",
        FaultUnit::Switch => "true",
    }
}

/// A range of `unit` as a fault plan's random block writes it, for error messages.
pub fn range_example(unit: FaultUnit) -> &'static str {
    match unit {
        FaultUnit::Duration => "\"0ms..2ms\"",
        FaultUnit::Rate => "\"100Mbit..1Gbit\"",
        FaultUnit::Probability => "\"1%..10%\"",
        FaultUnit::Switch => "true",
    }
}

/// `a, b or c`.
pub fn one_of<S: AsRef<str>>(words: &[S]) -> String {
    match words {
        [] => String::new(),
        [one] => one.as_ref().to_string(),
        [init @ .., last] => format!(
            "{} or {}",
            init.iter()
                .map(AsRef::as_ref)
                .collect::<Vec<_>>()
                .join(", "),
            last.as_ref()
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_as_typed() {
        assert_eq!(parse_duration("200us"), Ok(200_000));
        assert_eq!(parse_duration("200µs"), Ok(200_000));
        assert_eq!(parse_duration("1.5ms"), Ok(1_500_000));
        assert_eq!(parse_duration("2s"), Ok(2_000_000_000));
        assert_eq!(parse_duration("1 ms"), Ok(1_000_000));
        assert_eq!(parse_duration("0"), Ok(0));
        assert_eq!(parse_duration("750ns"), Ok(750));
        for bad in ["5", "1.5mss", "ms", "-1ms", "1..5ms", "", "1e3ms"] {
            assert!(parse_duration(bad).is_err(), "{bad} accepted");
        }
        assert!(parse_duration("5").unwrap_err().contains("no unit"));
    }

    #[test]
    fn rates_as_typed() {
        assert_eq!(parse_rate("100Mbit"), Ok(100_000_000));
        assert_eq!(parse_rate("100mbit"), Ok(100_000_000));
        assert_eq!(parse_rate("1Gbit"), Ok(1_000_000_000));
        assert_eq!(parse_rate("1.5gbps"), Ok(1_500_000_000));
        assert_eq!(parse_rate("10kbit/s"), Ok(10_000));
        for bad in ["100", "100Mbyte", "Gbit", "0.1bit", "0bit"] {
            assert!(parse_rate(bad).is_err(), "{bad} accepted");
        }
    }

    /// Issue 10, defect 5: `100MB` and `100MB/s` were 100 Mbit/s and `5B` 5 bit/s.
    #[test]
    fn byte_rates_are_eight_bits_each() {
        assert_eq!(parse_rate("100MB/s"), Ok(800_000_000));
        assert_eq!(parse_rate("12.5MB/s"), Ok(100_000_000));
        assert_eq!(parse_rate("1GB/s"), Ok(8_000_000_000));
        assert_eq!(parse_rate("500kB/s"), Ok(4_000_000));
        assert_eq!(parse_rate("500KB/s"), Ok(4_000_000));
        assert_eq!(parse_rate("2TB/s"), Ok(16_000_000_000_000));
        assert_eq!(parse_rate("1MiB/s"), Ok(8 * 1024 * 1024));
        assert_eq!(parse_rate("1.5GiB/s"), Ok(12 * 1024 * 1024 * 1024));
        assert_eq!(parse_rate("1KiB/s"), Ok(8192));
        assert_eq!(parse_rate("100B/s"), Ok(800));
        assert_eq!(parse_rate("100 MB/s"), Ok(800_000_000));
    }

    #[test]
    fn bit_rates_in_every_usual_spelling() {
        for (s, bps) in [
            ("100bit", 100),
            ("100bps", 100),
            ("100bit/s", 100),
            ("5kbit", 5_000),
            ("5Kbit", 5_000),
            ("5kbps", 5_000),
            ("100Mbit", 100_000_000),
            ("100Mbit/s", 100_000_000),
            ("100Mbits/s", 100_000_000),
            ("100Mbps", 100_000_000),
            ("100mbps", 100_000_000),
            ("100MBit", 100_000_000),
            ("2Gbit", 2_000_000_000),
            ("2Gbps", 2_000_000_000),
            ("2gbit/s", 2_000_000_000),
            ("1Tbit", 1_000_000_000_000),
            ("1Mibit", 1 << 20),
            ("1Gibit", 1 << 30),
        ] {
            assert_eq!(parse_rate(s), Ok(bps), "{s}");
        }
    }

    #[test]
    fn rates_that_could_be_bits_or_bytes_are_refused() {
        for (bad, why) in [
            ("100MB", "amount of data, not a rate"),
            ("5B", "amount of data, not a rate"),
            ("1GiB", "amount of data, not a rate"),
            ("100M", "no bit or byte unit"),
            ("1G", "no bit or byte unit"),
            ("10k", "no bit or byte unit"),
            ("100Mb", "bits or bytes"),
            ("100Mb/s", "bits or bytes"),
            ("100kb", "bits or bytes"),
            ("100MBps", "bits or bytes"),
            ("100Bps", "bits or bytes"),
            ("100", "no unit"),
            ("100MB/s/s", "unknown unit"),
            ("100Mbps/s", "unknown unit"),
            ("100Mbyte", "unknown unit"),
            ("5ms", "unknown unit"),
        ] {
            let e = parse_rate(bad).expect_err(bad);
            assert!(e.contains(why), "{bad}: {e}");
            // One line that says what is accepted.
            assert!(!e.contains('\n'), "{bad}: {e}");
            assert!(
                e.contains("Mbit") && e.contains("MB/s") && e.contains("Mbps"),
                "{bad}: {e}"
            );
        }
        // The readings offered use the operator's own number and prefix.
        let e = parse_rate("100MB").unwrap_err();
        assert!(e.contains("100MB/s") && e.contains("100Mbit"), "{e}");
    }

    #[test]
    fn percentages_as_typed() {
        assert_eq!(parse_percent("0.1%"), Ok(0.001));
        assert_eq!(parse_percent("30%"), Ok(0.3));
        assert_eq!(parse_percent("100%"), Ok(1.0));
        assert_eq!(parse_percent("0%"), Ok(0.0));
        for bad in ["0.5", "101%", "-1%", "%", "abc%", "1e2%"] {
            assert!(parse_percent(bad).is_err(), "{bad} accepted");
        }
        assert!(parse_percent("101%").unwrap_err().contains("outside"));
    }

    #[test]
    fn printed_back_as_typed() {
        assert_eq!(format_duration(1_500_000), "1.5ms");
        assert_eq!(format_duration(200_000), "200us");
        assert_eq!(format_duration(0), "0");
        assert_eq!(format_rate(100_000_000), "100Mbit");
        assert_eq!(format_rate(1_500_000_000), "1.5Gbit");
        assert_eq!(format_percent(0.001), "0.1%");
        assert_eq!(format_percent(0.3), "30%");
        for s in ["1.5ms", "200us", "2s"] {
            assert_eq!(format_duration(parse_duration(s).unwrap()), s);
        }
    }
}
