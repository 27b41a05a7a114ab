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
//! file is readable by its owner only (0600), whatever the umask, and always a new one:
//! never a file or link someone else made at that name (`create_private`).

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

/// Opens `path` to write a capture into, empty and readable by its owner only, and never
/// a file anyone else can read: a capture holds every job's payloads, and root's may be
/// asked into `/tmp`, where another user can make a file (or a link) of that name first and
/// keep it open. So what is there decides, looked at without following a link:
///
/// - nothing: a new file, made with `O_CREAT|O_EXCL|O_NOFOLLOW`, 0600 whatever the umask;
/// - a regular file of this user's (an earlier capture, perhaps 0644): replaced by a new
///   file (made beside it as above, then renamed over it), so that whoever still holds the
///   old one open, or a hard link to it, reads nothing of this capture;
/// - a FIFO or device of this user's or root's (into tshark, /dev/null): written as it is;
/// - a symbolic link, anything of another user's, a directory: refused, left as it is.
fn create_private(path: &Path) -> Result<File> {
    use std::os::unix::fs::MetadataExt;
    let me = nix::unistd::geteuid().as_raw();
    let refuse = |why: String| {
        CliError::Failed(format!(
            "{} {why}: a capture holds every job's payloads and goes only into a new file or \
             one of yours; remove it or choose another name (`-w -` writes to standard output)",
            path.display()
        ))
    };
    let m = match std::fs::symlink_metadata(path) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return new_private(path).map_err(|e| match e.kind() {
                // Made by someone else since it was looked at.
                std::io::ErrorKind::AlreadyExists => refuse("exists".into()),
                _ => CliError::io("create", path, e),
            });
        }
        Err(e) => return Err(CliError::io("inspect", path, e)),
        Ok(m) => m,
    };
    let kind = m.file_type();
    if kind.is_symlink() {
        return Err(refuse(format!(
            "is a symbolic link (owned by {})",
            crate::process::owner(m.uid())
        )));
    }
    if kind.is_dir() {
        return Err(CliError::Usage(format!(
            "{} is a directory; -w names the capture file",
            path.display()
        )));
    }
    // Devices are root's (/dev/null); a FIFO or file of another user's is theirs to read.
    let trusted = m.uid() == me || (m.uid() == 0 && !kind.is_file());
    if !trusted {
        return Err(refuse(format!(
            "exists and is owned by {}",
            crate::process::owner(m.uid())
        )));
    }
    if kind.is_file() {
        return replace_private(path).map_err(|e| CliError::io("replace", path, e));
    }
    open_special(path, &m).map_err(|e| CliError::io("open", path, e))
}

/// A new file at `path`, 0600 whatever the umask; fails if anything is there, a link
/// included.
fn new_private(path: &Path) -> std::io::Result<File> {
    use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
    let f = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW)
        .open(path)?;
    // A umask can take bits away (0400 under 0277); the owner must still be able to
    // rewrite or remove what it wrote. Set on the descriptor: this file, not a path.
    f.set_permissions(std::fs::Permissions::from_mode(0o600))?;
    Ok(f)
}

/// A new private file renamed over `path`.
fn replace_private(path: &Path) -> std::io::Result<File> {
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    let name = path.file_name().unwrap_or_default().to_string_lossy();
    for n in 0..100u32 {
        // Not secret: a name someone else took first fails the O_EXCL and the next is tried.
        let tmp = dir.join(format!(".{name}.{}.{n}", std::process::id()));
        match new_private(&tmp) {
            Ok(f) => {
                return match std::fs::rename(&tmp, path) {
                    Ok(()) => Ok(f),
                    Err(e) => {
                        let _ = std::fs::remove_file(&tmp);
                        Err(e)
                    }
                };
            }
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
            Err(e) => return Err(e),
        }
    }
    Err(std::io::Error::new(
        std::io::ErrorKind::AlreadyExists,
        format!("no free name for a new file in {}", dir.display()),
    ))
}

/// A FIFO or device, written as it is: opened without following a link, and only if it is
/// still what was looked at.
fn open_special(path: &Path, seen: &std::fs::Metadata) -> std::io::Result<File> {
    use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
    let f = OpenOptions::new()
        .write(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NOCTTY)
        .open(path)?;
    let now = f.metadata()?;
    if (now.dev(), now.ino()) != (seen.dev(), seen.ino()) {
        return Err(std::io::Error::other("replaced while it was being opened"));
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
        Box::new(create_private(&a.write)?)
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

    /// A scratch directory of this test's, removed when dropped.
    struct Scratch(PathBuf);
    impl Scratch {
        fn new(tag: &str) -> Scratch {
            let d =
                std::env::temp_dir().join(format!("exactl-capture-{tag}-{}", std::process::id()));
            let _ = std::fs::remove_dir_all(&d);
            std::fs::create_dir_all(&d).unwrap();
            Scratch(d)
        }
        fn names(&self) -> Vec<String> {
            let mut v: Vec<String> = std::fs::read_dir(&self.0)
                .unwrap()
                .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                .collect();
            v.sort();
            v
        }
    }
    impl Drop for Scratch {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    #[test]
    fn links_and_directories_are_refused_and_left_as_they_are() {
        use std::os::unix::fs::PermissionsExt;
        let d = Scratch::new("refused");
        let target = d.0.join("target");
        std::fs::write(&target, b"kept").unwrap();
        std::fs::set_permissions(&target, std::fs::Permissions::from_mode(0o644)).unwrap();
        let link = d.0.join("x.pcapng");
        std::os::unix::fs::symlink(&target, &link).unwrap();
        let e = create_private(&link).unwrap_err().to_string();
        assert!(e.contains("symbolic link") && e.contains("x.pcapng"), "{e}");
        // A link to nothing yet would have been created through.
        let dangling = d.0.join("dangling.pcapng");
        std::os::unix::fs::symlink(d.0.join("made-through-the-link"), &dangling).unwrap();
        assert!(create_private(&dangling).is_err());
        assert!(create_private(&d.0).is_err(), "a directory");
        assert_eq!(std::fs::read(&target).unwrap(), b"kept");
        let mode = std::fs::metadata(&target).unwrap().permissions().mode() & 0o7777;
        assert_eq!(mode, 0o644);
        assert_eq!(d.names(), ["dangling.pcapng", "target", "x.pcapng"]);
    }

    #[test]
    fn an_own_file_is_replaced_by_a_new_one_and_nothing_is_left_beside_it() {
        use std::os::unix::fs::MetadataExt;
        let d = Scratch::new("replaced");
        let file = d.0.join("x.pcapng");
        std::fs::write(&file, b"an earlier capture").unwrap();
        // Someone who opened the earlier one reads nothing of the new.
        let earlier = File::open(&file).unwrap();
        let mut f = create_private(&file).unwrap();
        f.write_all(b"new").unwrap();
        drop(f);
        assert_eq!(std::fs::read(&file).unwrap(), b"new");
        assert_ne!(
            earlier.metadata().unwrap().ino(),
            std::fs::metadata(&file).unwrap().ino()
        );
        assert_eq!(d.names(), ["x.pcapng"]);
    }

    #[test]
    fn fifos_and_devices_are_written_as_they_are() {
        use std::io::Read;
        drop(create_private(Path::new("/dev/null")).unwrap());
        let d = Scratch::new("fifo");
        let fifo = d.0.join("into-tshark");
        nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
        let reader = {
            let fifo = fifo.clone();
            std::thread::spawn(move || {
                let mut got = Vec::new();
                File::open(&fifo).unwrap().read_to_end(&mut got).unwrap();
                got
            })
        };
        let mut f = create_private(&fifo).unwrap();
        f.write_all(b"cells").unwrap();
        drop(f);
        assert_eq!(reader.join().unwrap(), b"cells");
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
