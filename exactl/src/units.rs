//! Quantities as operators type them: durations (`200us`, `1.5ms`, `2s`), rates
//! (`100Mbit`, `1Gbit`, `1.5gbps`) and percentages (`0.1%`), parsed exactly (no float
//! rounding surprises for whole numbers) and printed back the same way.
//!
//! Bare numbers are refused: `--delay 5` could be seconds or milliseconds and `--loss 0.5`
//! half a percent or half of all cells, and a wrong guess would silently run a different
//! experiment.

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

/// Parses a rate into bits per second: a number with `bit`, `kbit`, `mbit`, `gbit` or
/// `tbit` (any case; `bps`, `kbps`, ... and a trailing `/s` mean the same: bits).
pub fn parse_rate(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let (num, unit) = split_number(t);
    let unit_lc = unit.to_ascii_lowercase();
    let unit_lc = unit_lc.strip_suffix("/s").unwrap_or(&unit_lc);
    let scale: f64 = match unit_lc {
        "bit" | "bps" | "b" => 1.0,
        "kbit" | "kbps" | "kb" | "k" => 1e3,
        "mbit" | "mbps" | "mb" | "m" => 1e6,
        "gbit" | "gbps" | "gb" | "g" => 1e9,
        "tbit" | "tbps" | "tb" | "t" => 1e12,
        "" => return Err(format!("{s:?} has no unit (give one: 100Mbit, 1Gbit)")),
        u => {
            return Err(format!(
                "{s:?}: unknown unit {u:?} (use bit, kbit, Mbit, Gbit or Tbit)"
            ))
        }
    };
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
