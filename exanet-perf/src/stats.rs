//! Latency summaries and result printing.

use std::time::Duration;

use serde_json::{json, Map, Value};

/// Summary of a set of samples, in microseconds.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Summary {
    pub n: usize,
    pub min: f64,
    pub mean: f64,
    pub p50: f64,
    pub p99: f64,
    pub max: f64,
}

/// Nearest-rank percentile of sorted samples.
fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let rank = (p / 100.0 * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

pub fn summarize(samples: &[Duration]) -> Summary {
    summarize_us(samples.iter().map(|d| d.as_secs_f64() * 1e6).collect())
}

/// Summary of samples already in microseconds (modeled times).
pub fn summarize_us(mut us: Vec<f64>) -> Summary {
    us.sort_by(f64::total_cmp);
    let n = us.len();
    Summary {
        n,
        min: us.first().copied().unwrap_or(0.0),
        mean: if n == 0 {
            0.0
        } else {
            us.iter().sum::<f64>() / n as f64
        },
        p50: percentile(&us, 50.0),
        p99: percentile(&us, 99.0),
        max: us.last().copied().unwrap_or(0.0),
    }
}

/// One result line: the fixed fields plus bench-specific extras.
pub struct Row {
    pub bench: &'static str,
    pub size: u64,
    pub summary: Summary,
    pub gbps: Option<f64>,
    /// The same measurement in modeled time: what the ExaNeSt hardware would take.
    pub modeled: Option<Summary>,
    pub modeled_gbps: Option<f64>,
    pub extra: Vec<(&'static str, Value)>,
}

fn round3(x: f64) -> f64 {
    round(x, 3)
}

/// `x` to `places` decimal places, for figures in JSON.
pub(crate) fn round(x: f64, places: i32) -> f64 {
    let m = 10f64.powi(places);
    (x * m).round() / m
}

impl Row {
    pub fn json(&self) -> Value {
        let s = &self.summary;
        let mut m = Map::new();
        m.insert("bench".into(), json!(self.bench));
        m.insert("size".into(), json!(self.size));
        m.insert("iterations".into(), json!(s.n));
        m.insert("p50_us".into(), json!(round3(s.p50)));
        m.insert("p99_us".into(), json!(round3(s.p99)));
        m.insert("min_us".into(), json!(round3(s.min)));
        m.insert("mean_us".into(), json!(round3(s.mean)));
        m.insert("max_us".into(), json!(round3(s.max)));
        if let Some(g) = self.gbps {
            m.insert("gbps".into(), json!(round3(g)));
        }
        if let Some(s) = &self.modeled {
            m.insert("modeled_p50_us".into(), json!(round3(s.p50)));
            m.insert("modeled_p99_us".into(), json!(round3(s.p99)));
            m.insert("modeled_min_us".into(), json!(round3(s.min)));
            m.insert("modeled_max_us".into(), json!(round3(s.max)));
        }
        if let Some(g) = self.modeled_gbps {
            m.insert("modeled_gbps".into(), json!(round3(g)));
        }
        for (k, v) in &self.extra {
            m.insert((*k).into(), v.clone());
        }
        Value::Object(m)
    }

    pub fn print(&self, json: bool, header: &mut bool) {
        if json {
            println!("{}", self.json());
            return;
        }
        if !*header {
            *header = true;
            println!(
                "{:>10} {:>10} {:>10} {:>10} {:>10} {:>10} {:>10} {:>12} {:>12}",
                "size",
                "iters",
                "min_us",
                "p50_us",
                "p99_us",
                "mean_us",
                "gbps",
                "model_p50_us",
                "model_gbps"
            );
        }
        let s = &self.summary;
        let g = self.gbps.map_or("-".to_string(), |g| format!("{g:.3}"));
        let mp = self
            .modeled
            .map_or("-".to_string(), |m| format!("{:.3}", m.p50));
        let mg = self
            .modeled_gbps
            .map_or("-".to_string(), |g| format!("{g:.3}"));
        println!(
            "{:>10} {:>10} {:>10.2} {:>10.2} {:>10.2} {:>10.2} {:>10} {:>12} {:>12}",
            self.size, s.n, s.min, s.p50, s.p99, s.mean, g, mp, mg
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_are_nearest_rank() {
        let v: Vec<Duration> = (1..=100).map(Duration::from_micros).collect();
        let s = summarize(&v);
        assert_eq!(s.n, 100);
        assert_eq!(s.p50, 50.0);
        assert_eq!(s.p99, 99.0);
        assert_eq!(s.min, 1.0);
        assert_eq!(s.max, 100.0);
        assert!((s.mean - 50.5).abs() < 1e-9);
        let one = summarize(&[Duration::from_micros(7)]);
        assert_eq!((one.p50, one.p99), (7.0, 7.0));
        assert_eq!(summarize(&[]).n, 0);
    }
}
