//! Allreduce from Rust over a group of ranks, one thread per member attached from this
//! process (in a real program each member is its own process on its own node).
//!
//! `cargo run -p exanet --example allreduce -- auto|accel|software NODE [NODE...]`
//!
//! Every member contributes 32 f64 (member i: i + 1 + k / 4 in element k), checks it got
//! the sums and prints its modeled clock.

use exanet::collective::{DataType, Path, ReduceOp};
use exanet::{Config, Endpoint};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (path, nodes) = match args.split_first() {
        Some((p, nodes)) if !nodes.is_empty() => (p.as_str(), nodes),
        _ => return Err("usage: allreduce auto|accel|software NODE [NODE...]".into()),
    };
    let path = match path {
        "accel" => Path::Accelerator,
        "software" => Path::Software,
        _ => Path::Auto,
    };
    let eps = nodes
        .iter()
        .map(|n| {
            Endpoint::attach_with(&Config {
                node: Some(n.clone()),
                ..Config::default()
            })
        })
        .collect::<Result<Vec<_>, _>>()?;
    let members: Vec<_> = eps.iter().map(|e| (e.node_id(), e.rank())).collect();
    let n = members.len();
    std::thread::scope(|s| -> Result<(), String> {
        let handles: Vec<_> = eps
            .iter()
            .enumerate()
            .map(|(i, ep)| {
                let members = &members;
                s.spawn(move || -> Result<(), String> {
                    let coll = ep.collectives().map_err(|e| e.to_string())?;
                    let g = coll.group(1, members).map_err(|e| e.to_string())?;
                    let data: Vec<u8> = (0..32)
                        .flat_map(|k| (i as f64 + 1.0 + f64::from(k) / 4.0).to_le_bytes())
                        .collect();
                    let out = coll
                        .allreduce(&g, ReduceOp::Sum, DataType::F64, &data, path)
                        .map_err(|e| format!("member {i}: {e}"))?;
                    for (k, b) in out.chunks(8).enumerate() {
                        let got = f64::from_le_bytes(b.try_into().expect("8 bytes"));
                        let want = (n * (n + 1) / 2) as f64 + n as f64 * (k as f64 / 4.0);
                        if got != want {
                            return Err(format!("member {i}: element {k} is {got}, not {want}"));
                        }
                    }
                    println!("member {i}: ok, modeled clock {}", ep.clock());
                    Ok(())
                })
            })
            .collect();
        for h in handles {
            h.join().map_err(|_| "a member panicked".to_string())??;
        }
        Ok(())
    })?;
    println!("{n} members agree");
    Ok(())
}
