//! `exactl ping SRC DST`: probes DST from SRC's switch and shows the path hop by hop (like
//! ibtracert) and the round trips (like ibping), beside the modeled one-way latency of the
//! path: what the ExaNeSt hardware would take, from the rack's `[model]`.

use std::fmt::Write as _;
use std::path::Path;
use std::time::Duration;

use exanet_control::control::{PingReport, Request, Response};
use exanet_control::rack::Rack;
use exanet_proto::model::Model;
use exanet_proto::ProbeBody;
use exanet_proto::{cell, routing, NodeId, NodeName, Shape};

use crate::error::NOT_RUNNING;
use crate::error::{CliError, Result};
use crate::fabric;
use crate::live::RackLiveness;

#[derive(Clone, Debug)]
pub struct PingOptions {
    pub src: NodeName,
    pub dst: NodeName,
    pub count: u32,
    pub timeout_ms: u64,
    pub json: bool,
}

/// `exactl ping`. Fails (exit 1) when no probe came back.
pub fn run(dir: &Path, opts: &PingOptions) -> Result<()> {
    let rack = Rack::load(dir)?;
    let shape = rack.shape();
    let src = shape.id_of(opts.src)?;
    let dst = shape.id_of(opts.dst)?;
    let (src_name, dst_name) = (shape.display(src), shape.display(dst));
    let req = Request::Ping {
        dst: dst_name.clone(),
        count: opts.count,
        timeout_ms: opts.timeout_ms,
    };
    // The daemon sends the probes one after the other, each waiting up to timeout_ms.
    let wait = Duration::from_millis(opts.timeout_ms.saturating_mul(u64::from(opts.count)))
        .saturating_add(Duration::from_secs(5));
    // A node of a local rack whose process is gone neither sends nor answers a probe:
    // say so at once rather than after the probes' time.
    let live = RackLiveness::of(&rack);
    for (id, role) in [(src, "send"), (dst, "answer")] {
        if let Some(why) = live.gone(id) {
            let rack_state = if live.all_gone() {
                "; no daemon of the rack runs (`exactl rack up` starts it)"
            } else {
                ""
            };
            return Err(CliError::Failed(format!(
                "{}: {NOT_RUNNING} ({why}); it cannot {role} probes{rack_state}",
                shape.display(id)
            )));
        }
    }
    let client = crate::control::client(&rack)
        .map_err(|e| CliError::Failed(format!("cannot ask {src_name}: {e}")))?;
    let report = match client.request(src, &req, wait) {
        Ok(Response::Ping(r)) => r,
        Ok(Response::Error { message }) => {
            return Err(CliError::Refused {
                node: src_name,
                message,
            })
        }
        Ok(other) => {
            return Err(CliError::Unexpected {
                node: src_name,
                request: "ping",
                answer: format!("{other:?}"),
            })
        }
        Err(source) => {
            return Err(CliError::Control {
                node: src_name,
                source,
            })
        }
    };
    let modeled = modeled_one_way_ps(&rack.model(), &shape, src, dst);
    if opts.json {
        let encode = |e: serde_json::Error| {
            CliError::Failed(format!("cannot encode the report as JSON: {e}"))
        };
        let mut v = serde_json::to_value(&report).map_err(encode)?;
        if let Some(obj) = v.as_object_mut() {
            obj.insert(
                "modeled_one_way_ns".into(),
                modeled.map_or(serde_json::Value::Null, |ps| (ps as f64 / 1000.0).into()),
            );
        }
        let text = serde_json::to_string_pretty(&v).map_err(encode)?;
        crate::stdout::outln!("{text}");
    } else {
        crate::stdout::out!(
            "{}",
            render(&shape, src, dst, &report, opts.timeout_ms, modeled)
        );
    }
    if report.received == 0 {
        return Err(CliError::Failed(format!(
            "no probe came back from {dst_name} ({} sent from {src_name}, {} ms each)",
            report.sent, opts.timeout_ms
        )));
    }
    Ok(())
}

/// Bytes of a probe cell on the wire as its source sends it: header, footer and the probe
/// body before any hop is recorded (each switch that forwards it appends 4 bytes, a few
/// nanoseconds a hop at the links' rates, left out here).
pub fn probe_wire_len() -> usize {
    cell::OVERHEAD + ProbeBody::new(0).encode().len()
}

/// The modeled one-way latency, picoseconds, of a probe from `src` to `dst` along the
/// route the fabric takes, with no queueing (`None` for nodes outside the shape).
pub fn modeled_one_way_ps(model: &Model, shape: &Shape, src: NodeId, dst: NodeId) -> Option<u64> {
    model.path_latency(shape, src, dst, probe_wire_len()).ok()
}

/// The human report: the path, hop by hop, then one line per probe and the statistics,
/// with the modeled one-way latency of the path (`modeled_ps`) beside the round trips.
pub fn render(
    shape: &Shape,
    src: NodeId,
    dst: NodeId,
    r: &PingReport,
    timeout_ms: u64,
    modeled_ps: Option<u64>,
) -> String {
    let mut out = String::new();
    let (src_name, dst_name) = (shape.display(src), shape.display(dst));
    let recorded = !r.path.is_empty();
    let path: Vec<String> = if recorded {
        r.path.clone()
    } else {
        // No probe came back to record it: show where the fabric routes, marked as such.
        routing::path(shape, src, dst)
            .map(|p| p.into_iter().map(|(n, _)| shape.display(n)).collect())
            .unwrap_or_default()
    };
    let hops = if recorded {
        r.hops
    } else {
        path.len().saturating_sub(1)
    };
    let _ = writeln!(
        out,
        "From {src_name} to {dst_name}: {hops} hop{}{}",
        if hops == 1 { "" } else { "s" },
        if recorded {
            ""
        } else {
            " (expected route; no probe came back to record it)"
        }
    );
    out.push_str(&hop_lines(shape, &path));
    if r.truncated {
        out.push_str("  ... (the path record was truncated)\n");
    }
    let back = squeeze(&r.back);
    if !back.is_empty() {
        let mut reversed = squeeze(&r.path);
        reversed.reverse();
        if back == reversed {
            out.push_str("Return path: the same links, reversed\n");
        } else {
            let _ = writeln!(out, "Return path: {}", back.join(" -> "));
            out.push_str(&hop_lines(shape, &back));
        }
    }
    out.push('\n');
    for (i, rtt) in r.rtts_us.iter().enumerate() {
        let _ = writeln!(
            out,
            "Pong from {dst_name}: probe {} time {rtt:.1} us",
            i + 1
        );
    }
    let lost = r.sent.saturating_sub(r.received);
    let loss = if r.sent == 0 {
        0.0
    } else {
        100.0 * f64::from(lost) / f64::from(r.sent)
    };
    let _ = writeln!(out, "--- {src_name} -> {dst_name} ping statistics ---");
    let _ = writeln!(
        out,
        "{} probes sent, {} received, {loss:.0}% loss (timeout {timeout_ms} ms)",
        r.sent, r.received
    );
    let modeled = modeled_ps.map(|ps| format!("modeled one-way {:.3} us", ps as f64 / 1e6));
    if let (Some(min), Some(max)) = (
        r.rtts_us.iter().copied().reduce(f64::min),
        r.rtts_us.iter().copied().reduce(f64::max),
    ) {
        let _ = write!(
            out,
            "rtt min/median/max = {min:.1}/{:.1}/{max:.1} us",
            r.rtt_us
        );
        if let Some(m) = &modeled {
            let _ = write!(out, ", {m}");
        }
        out.push('\n');
    } else if let Some(m) = &modeled {
        let _ = writeln!(out, "{m}");
    }
    out
}

/// The path without a node recorded twice in a row (which is no hop).
fn squeeze(path: &[String]) -> Vec<String> {
    let mut v = path.to_vec();
    v.dedup_by(|a, b| a.eq_ignore_ascii_case(b));
    v
}

/// `  [f1] -> M1QAF1 [f2]  qfdb 16 Gb/s`, one line per hop of `path`.
fn hop_lines(shape: &Shape, path: &[String]) -> String {
    let path = squeeze(path);
    let mut out = String::new();
    let Some(first) = path.first() else {
        return out;
    };
    let _ = writeln!(out, "  {first}");
    let width = path.iter().map(String::len).max().unwrap_or(0);
    for pair in path.windows(2) {
        let ids = (shape.parse_node(&pair[0]), shape.parse_node(&pair[1]));
        let link = match ids {
            (Ok(a), Ok(b)) => fabric::link_between(shape, a, b).map(|l| (a, b, l)),
            _ => None,
        };
        let line = match link {
            Some((a, b, l)) => format!(
                "  [{}] -> {:<width$} [{}]  {} {} Gb/s",
                port(l.port_of(a)),
                pair[1],
                port(l.port_of(b)),
                l.kind.label(),
                l.kind.gbps()
            ),
            None => format!("  [?] -> {:<width$} [?]  (no direct link)", pair[1]),
        };
        let _ = writeln!(out, "{}", line.trim_end());
    }
    out
}

fn port(p: Option<exanet_proto::Port>) -> String {
    p.map_or_else(|| "?".into(), |p| p.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report(shape: &Shape, src: &str, dst: &str, rtts: &[f64]) -> PingReport {
        let (s, d) = (
            shape.parse_node(src).unwrap(),
            shape.parse_node(dst).unwrap(),
        );
        let path: Vec<String> = routing::path(shape, s, d)
            .unwrap()
            .into_iter()
            .map(|(n, _)| shape.display(n))
            .collect();
        let back: Vec<String> = path.iter().rev().cloned().collect();
        PingReport {
            src: src.into(),
            dst: dst.into(),
            hops: path.len() - 1,
            path: if rtts.is_empty() { vec![] } else { path },
            back: if rtts.is_empty() { vec![] } else { back },
            rtt_us: rtts.get(rtts.len() / 2).copied().unwrap_or(0.0),
            rtts_us: rtts.to_vec(),
            sent: 3,
            received: rtts.len() as u32,
            truncated: false,
        }
    }

    #[test]
    fn shows_each_hop_with_ports_and_kind() {
        let shape = Shape::PROTOTYPE;
        let r = report(&shape, "M1QAF2", "M1QBF3", &[100.0, 110.0, 130.0]);
        let (s, d) = (
            shape.parse_node("M1QAF2").unwrap(),
            shape.parse_node("M1QBF3").unwrap(),
        );
        let text = render(&shape, s, d, &r, 1000, None);
        assert!(
            text.starts_with("From M1QAF2 to M1QBF3: 3 hops\n"),
            "{text}"
        );
        assert!(text.contains("[f1] -> M1QAF1 [f2]  qfdb 16 Gb/s"), "{text}");
        assert!(
            text.contains("[x+] -> M1QBF1 [x-]  torus_x 10 Gb/s"),
            "{text}"
        );
        assert!(text.contains("[f3] -> M1QBF3 [f1]  qfdb 16 Gb/s"), "{text}");
        assert!(text.contains("the same links, reversed"), "{text}");
        assert!(
            text.contains("3 probes sent, 3 received, 0% loss"),
            "{text}"
        );
        assert!(
            text.contains("rtt min/median/max = 100.0/110.0/130.0 us"),
            "{text}"
        );
    }

    #[test]
    fn lost_probes_show_the_expected_route() {
        let shape: Shape = "2x2x1".parse().unwrap();
        let r = report(&shape, "M1QAF1", "M2QBF1", &[]);
        let (s, d) = (
            shape.parse_node("M1QAF1").unwrap(),
            shape.parse_node("M2QBF1").unwrap(),
        );
        let text = render(&shape, s, d, &r, 200, None);
        assert!(text.contains("2 hops (expected route"), "{text}");
        assert!(text.contains("torus_y"), "{text}");
        assert!(text.contains("100% loss"), "{text}");
        assert!(!text.contains("rtt min"), "{text}");
    }

    /// The report's latency model: a torus hop costs a link (~120 ns) and two router
    /// traversals (~145 ns each), a hop inside a QFDB a link and two 13.3 ns switches.
    #[test]
    fn the_modeled_one_way_latency_is_shown_beside_the_round_trip() {
        let shape: Shape = "2x1x1".parse().unwrap();
        let m = Model::default();
        let n = |s: &str| shape.parse_node(s).unwrap();
        let one_way = |a, b| modeled_one_way_ps(&m, &shape, n(a), n(b)).unwrap();
        // 6 bytes of probe body behind the 32 of header and footer.
        assert_eq!(probe_wire_len(), 38);
        let intra = one_way("M1QAF1", "M1QAF2");
        let torus = one_way("M1QAF1", "M1QBF1");
        // NI serialisation of 38 B at 19.2 Gb/s, then per element its traversal; the
        // slowest element's serialisation counts once (cut-through).
        let ni = m.ni_rate.ps(38);
        assert_eq!(
            intra,
            ni + 2 * m.switch + 120_000 + (m.qfdb_rate.ps(38) - ni)
        );
        assert_eq!(
            torus,
            ni + 2 * 145_000 + 120_000 + (m.torus_rate.ps(38) - ni)
        );
        assert!(torus > intra + 250_000, "{torus} vs {intra}");

        let r = report(&shape, "M1QAF1", "M1QBF1", &[90.0, 100.0, 120.0]);
        let text = render(&shape, n("M1QAF1"), n("M1QBF1"), &r, 1000, Some(torus));
        let want = format!(
            "rtt min/median/max = 90.0/100.0/120.0 us, modeled one-way {:.3} us\n",
            torus as f64 / 1e6
        );
        assert!(text.ends_with(&want), "{text}");
        assert!(text.contains("modeled one-way 0.440 us"), "{text}");
        // With no probe back, the model still says what the path would take.
        let lost = report(&shape, "M1QAF1", "M1QAF2", &[]);
        let text = render(&shape, n("M1QAF1"), n("M1QAF2"), &lost, 200, Some(intra));
        assert!(text.ends_with("modeled one-way 0.166 us\n"), "{text}");
    }

    #[test]
    fn a_node_recorded_twice_is_not_a_hop() {
        let shape: Shape = "1x1x1".parse().unwrap();
        let mut r = report(&shape, "M1QAF2", "M1QAF2", &[0.5]);
        r.back = vec!["M1QAF2".into(), "M1QAF2".into()];
        let text = render(&shape, NodeId(1), NodeId(1), &r, 100, None);
        assert!(
            text.starts_with("From M1QAF2 to M1QAF2: 0 hops\n"),
            "{text}"
        );
        assert!(text.contains("the same links, reversed"), "{text}");
        assert!(!text.contains("[?]"), "{text}");
    }

    #[test]
    fn nonadjacent_or_garbled_path_entries_do_not_panic() {
        let shape: Shape = "1x1x1".parse().unwrap();
        let mut r = report(&shape, "M1QAF1", "M1QAF2", &[50.0]);
        r.path = vec!["M1QAF1".into(), "bogus".into(), "M9QZF9".into()];
        r.back = vec!["x".into()];
        r.truncated = true;
        let text = render(&shape, NodeId(0), NodeId(1), &r, 100, None);
        assert!(text.contains("[?] -> bogus"), "{text}");
        assert!(text.contains("truncated"), "{text}");
    }
}
