//! `exactl capture`: the cells passing a node, or one link direction, into a pcapng file
//! that Wireshark and tshark read with the project's dissector (`exactl dissector`).
//!
//! The capturing daemon taps its links and streams the cells to exactl (see
//! `exanetd::capture`); exactl writes one Enhanced Packet Block per cell, stamped with the
//! wall clock (nanoseconds) and carrying the capture header of
//! [`exanet_proto::capture`] (direction, nodes, port, VC, modeled time) before the cell.
//! The link type is `USER0` (147), which the dissector claims.
//!
//! A capture holds the payloads of every job whose cells crossed what was tapped, so the
//! file is readable by its owner only (0600), whatever the umask and whether or not it
//! existed before.

use std::borrow::Cow;
use std::fs::{File, OpenOptions};
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::time::Duration;

use clap::{Args, ValueEnum};
use exanet_control::control::{CaptureSummary, Request};
use exanet_control::rack::{Deploy, Rack};
use exanet_proto::{NodeId, NodeName};
use pcap_file::pcapng::blocks::enhanced_packet::EnhancedPacketBlock;
use pcap_file::pcapng::blocks::interface_description::{
    InterfaceDescriptionBlock, InterfaceDescriptionOption,
};
use pcap_file::pcapng::PcapNgWriter;
use pcap_file::DataLink;

use crate::error::{CliError, Result};

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Which {
    /// Cells the node receives from its links
    Rx,
    /// Cells the node sends on its links
    Tx,
    /// Both
    Both,
}

#[derive(Debug, Args)]
#[command(group(clap::ArgGroup::new("where").required(true).args(["node", "link"])))]
pub struct CaptureArgs {
    /// Capture every link of this node, e.g. M1QAF1
    #[arg(long, value_name = "NODE", value_parser = crate::parse_node_name)]
    node: Option<NodeName>,
    /// Capture what A sends to B over their link, as B receives it (cells corrupted on the
    /// wire included; cells the link lost never arrive)
    #[arg(long, num_args = 2, value_names = ["A", "B"], value_parser = crate::parse_node_name)]
    link: Vec<NodeName>,
    /// With --node: received cells, sent cells, or both
    #[arg(long, value_enum, default_value = "both", conflicts_with = "link")]
    direction: Which,
    /// Stop after this many cells
    #[arg(long, short = 'c', value_name = "N", value_parser = clap::value_parser!(u64).range(1..))]
    count: Option<u64>,
    /// Stop after this many seconds (fractions allowed); without --count or --duration,
    /// the capture runs until Ctrl-C
    #[arg(long, value_name = "SECS", value_parser = parse_secs)]
    duration: Option<Duration>,
    /// Only cells of this type: write, read_request, notify_control, notify, ack, nack,
    /// collective, probe, probe_reply, load
    #[arg(long = "type", value_name = "TYPE", value_parser = parse_cell_type)]
    cell_type: Option<String>,
    /// Only cells for this protection domain (the PDID of their destination GVAS)
    #[arg(long, value_name = "PDID")]
    pdid: Option<u16>,
    /// Only cells whose destination GVAS names this node
    #[arg(long, value_name = "NODE", value_parser = crate::parse_node_name)]
    dst: Option<NodeName>,
    /// The pcapng file to write (`-` for standard output, e.g. into `tshark -i -`)
    #[arg(long, short = 'w', value_name = "FILE")]
    write: PathBuf,
    /// How to reach the daemon: its control socket (local racks: no encryption to pay for
    /// every captured byte), the QUIC control API (any rack), or auto: the socket when
    /// the rack is local
    #[arg(long, value_enum, default_value = "auto")]
    via: Via,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Via {
    Auto,
    Socket,
    Quic,
}

fn parse_secs(s: &str) -> std::result::Result<Duration, String> {
    let v: f64 = s
        .parse()
        .map_err(|_| format!("{s:?} is not a number of seconds"))?;
    if !(v > 0.0 && v <= 86_400.0) {
        return Err(format!("{s} s is not in (0, 86400]"));
    }
    Ok(Duration::from_secs_f64(v))
}

fn parse_cell_type(s: &str) -> std::result::Result<String, String> {
    use exanet_proto::cell::CellType;
    CellType::from_label(s)
        .map(|k| k.label().to_string())
        .ok_or_else(|| {
            format!(
                "{s:?} is not a cell type (one of: {})",
                CellType::ALL.map(|k| k.label()).join(", ")
            )
        })
}

/// Where the capture runs and what it asks the daemon.
fn plan(rack: &Rack, a: &CaptureArgs) -> Result<(NodeId, String, Request)> {
    let shape = rack.shape();
    let id = |n: NodeName| shape.id_of(n).map_err(|e| CliError::Usage(e.to_string()));
    let (at, peers, rx, tx, what) = match (a.node, a.link.as_slice()) {
        (Some(n), _) => {
            let (rx, tx) = match a.direction {
                Which::Rx => (true, false),
                Which::Tx => (false, true),
                Which::Both => (true, true),
            };
            let at = id(n)?;
            (
                at,
                Vec::new(),
                rx,
                tx,
                format!("the links of {}", shape.display(at)),
            )
        }
        (None, [from, to]) => {
            let (from, to) = (id(*from)?, id(*to)?);
            if exanet_proto::topology::port_to(&shape, to, from).is_none() {
                return Err(CliError::Usage(format!(
                    "{} and {} are not linked",
                    shape.display(from),
                    shape.display(to)
                )));
            }
            (
                to,
                vec![shape.display(from)],
                true,
                false,
                format!("{} -> {}", shape.display(from), shape.display(to)),
            )
        }
        _ => {
            return Err(CliError::Usage(
                "say where to capture: --node NODE or --link A B".into(),
            ))
        }
    };
    let dst = match a.dst {
        Some(d) => Some(shape.display(id(d)?)),
        None => None,
    };
    let req = Request::Capture {
        peers,
        rx,
        tx,
        cell_type: a.cell_type.clone(),
        pdid: a.pdid,
        dst,
        count: a.count,
        duration_ms: a.duration.map(|d| d.as_millis().max(1) as u64),
    };
    Ok((at, what, req))
}

/// Opens `path` to write a capture into, empty and readable by its owner only: created
/// 0600, or, if it is a regular file already (perhaps 0644 from an earlier capture or a
/// `touch`), restricted to 0600 before it is emptied, so that no one else can open it
/// after it held nothing. Anything else (a FIFO into tshark, /dev/null) is written as it
/// is: its mode is not the capture's to change.
fn create_private(path: &Path) -> std::io::Result<File> {
    use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
    let f = OpenOptions::new()
        .write(true)
        .create(true)
        // Not yet: a file that was there is made private first (below).
        .truncate(false)
        .mode(0o600)
        .open(path)?;
    let meta = f.metadata()?;
    if meta.is_file() {
        if meta.permissions().mode() & 0o7777 != 0o600 {
            f.set_permissions(std::fs::Permissions::from_mode(0o600))?;
        }
        f.set_len(0)?;
    }
    Ok(f)
}

pub fn run(dir: &Path, a: CaptureArgs) -> Result<()> {
    let rack = Rack::load(dir)?;
    let (at, what, req) = plan(&rack, &a)?;
    let to_stdout = a.write.as_os_str() == "-";
    let out: Box<dyn Write> = if to_stdout {
        Box::new(std::io::stdout().lock())
    } else {
        Box::new(create_private(&a.write).map_err(|e| CliError::io("create", &a.write, e))?)
    };
    let mut pcap = PcapNgWriter::new(BufWriter::new(out))
        .map_err(|e| CliError::Failed(format!("cannot write the pcapng header: {e}")))?;
    pcap.write_pcapng_block(InterfaceDescriptionBlock {
        linktype: DataLink::USER0,
        snaplen: 0,
        options: vec![
            InterfaceDescriptionOption::IfName(Cow::Owned(format!("exanet {what}"))),
            InterfaceDescriptionOption::IfDescription(Cow::Borrowed(
                "ExaNet cells with the exanet capture header (dissector: exactl dissector)",
            )),
            // Timestamps in nanoseconds.
            InterfaceDescriptionOption::IfTsResol(9),
        ],
    })
    .map_err(|e| CliError::Failed(format!("cannot write the pcapng interface: {e}")))?;
    let socket = rack.layout().control_socket(&rack.shape().display(at));
    let local = matches!(
        rack.file.deploy.clone().unwrap_or(Deploy::Local),
        Deploy::Local
    ) && socket.exists();
    let via_socket = match a.via {
        Via::Auto => local,
        Via::Socket if !socket.exists() => {
            return Err(CliError::Failed(format!(
                "no control socket at {} (is the node's daemon running on this host?)",
                socket.display()
            )))
        }
        Via::Socket => true,
        Via::Quic => false,
    };
    if !to_stdout {
        eprintln!(
            "exactl: capturing {what} into {} ({})",
            a.write.display(),
            match (a.count, a.duration) {
                (None, None) => "Ctrl-C stops".to_string(),
                (Some(c), None) => format!("{c} cells"),
                (None, Some(d)) => format!("{:.1} s", d.as_secs_f64()),
                (Some(c), Some(d)) => format!("{c} cells or {:.1} s", d.as_secs_f64()),
            }
        );
    }
    let mut write_error = None;
    let stop = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    let on_record = |wall: u64, record: &[u8]| {
        let block = EnhancedPacketBlock {
            interface_id: 0,
            timestamp: Duration::from_nanos(wall),
            original_len: record.len() as u32,
            data: Cow::Borrowed(record),
            options: Vec::new(),
        };
        match pcap.write_pcapng_block(block) {
            Ok(_) => true,
            Err(e) => {
                write_error = Some(e);
                false
            }
        }
    };
    let summary = if via_socket {
        exanet_control::control_client::capture_local(&socket, &req, stop, on_record)
    } else {
        crate::control::client(&rack)?
            .capture(at, &req, stop, on_record)
            .map_err(|e| e.to_string())
    };
    let flushed = pcap.get_mut().flush();
    if let Some(e) = write_error {
        return Err(CliError::Failed(format!(
            "cannot write to {}: {e}",
            a.write.display()
        )));
    }
    flushed.map_err(|e| CliError::io("write", &a.write, e))?;
    let CaptureSummary { captured, dropped } = summary.map_err(|e| {
        CliError::Failed(format!(
            "capture of {what} at {}: {e}",
            rack.shape().display(at)
        ))
    })?;
    eprintln!(
        "exactl: captured {captured} cell(s) of {what}{}",
        if dropped > 0 {
            format!("; {dropped} more matched but were dropped by the capture (it could not keep up; the fabric did not wait)")
        } else {
            String::new()
        }
    );
    Ok(())
}

/// `exactl dissector`: the Wireshark dissector for the captures this build writes.
pub fn print_dissector() -> Result<()> {
    crate::stdout::out!("{}", exanet_proto::capture::dissector());
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn capture_files_are_private_and_start_empty() {
        use std::os::unix::fs::PermissionsExt;
        let dir = std::env::temp_dir().join(format!("exactl-capture-mode-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o7777;
        // A new file, under the common umask that would make it 0644.
        use nix::sys::stat::{umask, Mode};
        let old = umask(Mode::from_bits_truncate(0o022));
        let new = dir.join("new.pcapng");
        let made = create_private(&new);
        umask(old);
        drop(made.unwrap());
        assert_eq!(mode(&new), 0o600);
        // A file that was there, world-readable and full of an earlier capture.
        let old_file = dir.join("old.pcapng");
        std::fs::write(&old_file, b"an earlier capture's payloads").unwrap();
        std::fs::set_permissions(&old_file, std::fs::Permissions::from_mode(0o644)).unwrap();
        let mut f = create_private(&old_file).unwrap();
        assert_eq!(mode(&old_file), 0o600);
        assert_eq!(std::fs::metadata(&old_file).unwrap().len(), 0, "emptied");
        f.write_all(b"new").unwrap();
        drop(f);
        assert_eq!(std::fs::read(&old_file).unwrap(), b"new");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn durations_and_types_are_checked_where_they_are_given() {
        assert_eq!(parse_secs("1.5").unwrap(), Duration::from_millis(1500));
        for bad in ["0", "-1", "x", "1e9", "NaN"] {
            assert!(parse_secs(bad).is_err(), "{bad}");
        }
        assert_eq!(parse_cell_type("nack").unwrap(), "nack");
        assert!(parse_cell_type("nak")
            .unwrap_err()
            .contains("write, read_request"));
    }
}
