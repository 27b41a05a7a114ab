//! `exactl hosts`: the rack's IP over ExaNet addresses as an `/etc/hosts` fragment, one
//! line per node (its address, derived from its node id in the rack's subnet, and its
//! name), so that programs on the nodes can name their peers.

use std::fmt::Write as _;
use std::path::Path;

use exanet_control::rack::Rack;

use crate::error::{CliError, Result};

pub fn run(dir: &Path) -> Result<()> {
    let rack = Rack::load(dir)?;
    crate::stdout::out!("{}", fragment(&rack)?);
    Ok(())
}

/// The fragment: a comment naming the rack and its subnet, then `ADDRESS<TAB>NODE`.
pub fn fragment(rack: &Rack) -> Result<String> {
    let shape = rack.shape();
    let mut out = format!(
        "# exanet rack {}: IP over ExaNet addresses (subnet {})\n",
        rack.file.name,
        rack.ip_subnet()
    );
    for id in shape.node_ids() {
        // A loaded rack's subnet holds every node (checked when the rack file is read).
        let addr = rack.ip_addr(id).ok_or_else(|| {
            CliError::Failed(format!(
                "subnet {} has no address for node {}",
                rack.ip_subnet(),
                shape.display(id)
            ))
        })?;
        let _ = writeln!(out, "{addr}\t{}", shape.display(id));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use exanet_control::rack::{write_rack_file, RackFile};

    #[test]
    fn one_line_per_node_in_the_racks_subnet() {
        let dir = std::env::temp_dir().join(format!("exactl-hosts-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let mut file = RackFile::loopback("h", "2x1x1".parse().unwrap(), |id| {
            (20_000 + id.0 as u16, 21_000 + id.0 as u16)
        });
        file.ip = Some(toml::from_str("subnet = \"192.168.77.0/24\"").unwrap());
        write_rack_file(&dir, &file).unwrap();
        let text = fragment(&Rack::load(&dir).unwrap()).unwrap();
        let _ = std::fs::remove_dir_all(&dir);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 1 + 8, "{text}");
        assert!(lines[0].starts_with('#') && lines[0].contains("192.168.77.0/24"));
        assert_eq!(lines[1], "192.168.77.1\tM1QAF1");
        assert_eq!(lines[8], "192.168.77.8\tM1QBF4");
    }
}
