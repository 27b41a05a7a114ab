//! Generators for racks run by container engines and cluster managers, and `rack pki`.
//!
//! - `exactl rack compose`: a docker compose project, one container per node, plus a swarm
//!   stack file, a Prometheus scrape configuration with the rack's console pages and
//!   Grafana dashboards ([`compose`], [`consoles`], [`grafana`], both drawn from
//!   [`views`]).
//! - `exactl rack k8s`: a Kubernetes StatefulSet and its kustomization ([`k8s`]).
//! - `exactl rack pki`: the rack CA and every missing node certificate, for racks whose
//!   daemons are not started by `exactl rack up` (a one-shot compose service runs it).
//!
//! Every generator builds all its files in memory first and writes nothing when an option
//! cannot be honoured, so bad input leaves the output directory as it was.

#![forbid(unsafe_code)]

pub mod compose;
pub mod consoles;
pub mod error;
pub mod grafana;
pub mod k8s;
pub mod views;
pub mod yaml;

pub use error::DeployError;

use std::fmt;
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};

use exanet_control::rack::{Deploy, Layout, NodeEntry, Rack, RackFile};
use exanet_proto::Shape;

use crate::error::Result;

/// UDP port of every node's QUIC link endpoint inside its container or pod. One node per
/// network namespace, so every node uses the same ports.
pub const LINK_PORT: u16 = 7700;
/// TCP port of every node's HTTP endpoint (/metrics, /health, /ready).
pub const METRICS_PORT: u16 = 9700;
/// Where the rack directory is mounted in containers and pods.
pub const RACK_MOUNT: &str = "/rack";
/// Image of the daemons and workloads when `--image` is not given (`docker/build.sh`).
pub const DEFAULT_IMAGE: &str = "exanet:latest";
/// Most nodes of a generated rack. A compose rack puts every container on one Linux
/// bridge, which takes at most 1024 ports (BR_MAX_PORTS); the same bound keeps generated
/// Kubernetes Secrets (two PEM files per node, ~1.3 KB) well under their 1 MiB limit.
pub const MAX_NODES: u32 = 1000;

/// One generated file: its path relative to the output directory and its text.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GenFile {
    pub path: PathBuf,
    pub text: String,
}

impl GenFile {
    pub fn new(path: impl Into<PathBuf>, text: impl Into<String>) -> GenFile {
        GenFile {
            path: path.into(),
            text: text.into(),
        }
    }
}

/// An IPv4 network (`10.213.0.0/16`) whose addresses a generator hands out.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Subnet {
    pub base: Ipv4Addr,
    pub prefix: u8,
}

impl Subnet {
    /// Number of addresses in the subnet.
    pub fn size(&self) -> u64 {
        1u64 << (32 - u32::from(self.prefix))
    }

    /// The address `offset` into the subnet. Callers check `offset < size()`.
    pub fn host(&self, offset: u32) -> Ipv4Addr {
        Ipv4Addr::from(u32::from(self.base) + offset)
    }

    /// The upper half of the subnet, as a CIDR: docker hands addresses of containers
    /// without a static one (`docker compose run`, workload containers) from there, so
    /// they never take a node's static address.
    pub fn upper_half(&self) -> Subnet {
        let half = (self.size() / 2) as u32;
        Subnet {
            base: Ipv4Addr::from(u32::from(self.base) + half),
            prefix: self.prefix + 1,
        }
    }
}

impl fmt::Display for Subnet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.base, self.prefix)
    }
}

/// Smallest subnet prefix accepted: /8. Largest: /28 (16 addresses; the upper half is
/// then 8, still room for a few workload containers).
const MIN_PREFIX: u8 = 8;
const MAX_PREFIX: u8 = 28;

impl std::str::FromStr for Subnet {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Subnet, String> {
        let (addr, prefix) = s
            .split_once('/')
            .ok_or_else(|| "expected an IPv4 network such as 10.213.0.0/16".to_string())?;
        let base: Ipv4Addr = addr
            .parse()
            .map_err(|_| format!("{addr:?} is not an IPv4 address"))?;
        let prefix: u8 = prefix
            .parse()
            .map_err(|_| format!("{prefix:?} is not a prefix length"))?;
        if !(MIN_PREFIX..=MAX_PREFIX).contains(&prefix) {
            return Err(format!(
                "the prefix length must be {MIN_PREFIX} to {MAX_PREFIX}"
            ));
        }
        let mask = u32::MAX << (32 - u32::from(prefix));
        if u32::from(base) & !mask != 0 {
            return Err(format!(
                "{base} has host bits set for a /{prefix}; the network is {}/{prefix}",
                Ipv4Addr::from(u32::from(base) & mask)
            ));
        }
        if !base.is_private() {
            return Err(
                "use a private network (10/8, 172.16/12, 192.168/16): the rack's addresses \
                 must not shadow real hosts"
                    .into(),
            );
        }
        Ok(Subnet { base, prefix })
    }
}

/// The name of a generated rack (and of its compose project, stack or Kubernetes objects):
/// `--name`, else `exanet-<shape>`.
pub fn rack_name(name: Option<&str>, shape: Shape) -> String {
    name.map_or_else(|| format!("exanet-{shape}"), str::to_string)
}

/// The checks every generator makes of its common options, in this order, before it
/// builds anything: the name (`--name`), the shape and the image.
pub fn check_options(name: &str, shape: Shape, image: &str) -> Result<()> {
    check_name("--name", name)?;
    check_shape(shape)?;
    check_image(image)
}

/// Checks the shape of a generated rack.
pub fn check_shape(shape: Shape) -> Result<()> {
    if shape.nodes() > MAX_NODES {
        return Err(DeployError::BadValue {
            what: "--shape",
            value: shape.to_string(),
            message: format!(
                "a generated rack has at most {MAX_NODES} nodes (one container or pod per node); \
                 this shape has {}",
                shape.nodes()
            ),
        });
    }
    Ok(())
}

/// Checks a name used for a compose project, a Kubernetes object and the rack: lower-case
/// letters, digits and '-', starting with a letter, at most 40 characters (a DNS label,
/// with room for the `-<ordinal>` of a pod name, and a valid compose project name).
pub fn check_name(what: &'static str, name: &str) -> Result<()> {
    let ok = !name.is_empty()
        && name.len() <= 40
        && name.starts_with(|c: char| c.is_ascii_lowercase())
        && !name.ends_with('-')
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-');
    if ok {
        Ok(())
    } else {
        Err(DeployError::BadValue {
            what,
            value: format!("{name:?}"),
            message: "must be 1 to 40 lower-case letters, digits or '-', starting with a letter \
                      and not ending with '-' (it names containers, pods and DNS records)"
                .into(),
        })
    }
}

/// Checks an image reference: no whitespace or quotes (it is written into YAML and shell
/// lines), not empty.
pub fn check_image(image: &str) -> Result<()> {
    let ok = !image.is_empty()
        && image.len() <= 255
        && image
            .chars()
            .all(|c| c.is_ascii_graphic() && !matches!(c, '"' | '\'' | '\\' | '$' | '`'));
    if ok {
        Ok(())
    } else {
        Err(DeployError::BadValue {
            what: "--image",
            value: format!("{image:?}"),
            message: "is not an image reference (such as exanet:latest or \
                      registry.example/exanet:1.0)"
                .into(),
        })
    }
}

/// The rack file's text with a header saying where it came from.
pub fn rack_toml(file: &RackFile, header: &str) -> Result<String> {
    // Validate exactly as the daemons will, so a generated rack never fails to load.
    Rack::new(Path::new("."), file.clone()).map_err(|message| DeployError::BadValue {
        what: "generated rack file",
        value: file.name.clone(),
        message,
    })?;
    let body = toml_text(file)?;
    let mut out = String::new();
    for line in header.lines() {
        out.push_str("# ");
        out.push_str(line);
        out.push('\n');
    }
    out.push('\n');
    out.push_str(&body);
    Ok(out)
}

/// A rack file for daemons in containers or pods: every node listens on all addresses of
/// its own network namespace, and others reach node `i` (in id order) at `host(i)`.
pub fn rack_file(
    name: &str,
    shape: Shape,
    host: impl Fn(usize) -> String,
    deploy: Deploy,
) -> RackFile {
    let nodes = shape
        .node_ids()
        .enumerate()
        .map(|(i, id)| {
            let host = host(i);
            (
                shape.display(id),
                NodeEntry {
                    link: format!("{host}:{LINK_PORT}"),
                    metrics: format!("{host}:{METRICS_PORT}"),
                    listen: Some(format!("0.0.0.0:{LINK_PORT}")),
                    metrics_listen: Some(format!("0.0.0.0:{METRICS_PORT}")),
                },
            )
        })
        .collect();
    RackFile {
        deploy: Some(deploy),
        ..RackFile::new(name, shape, nodes)
    }
}

fn toml_text(file: &RackFile) -> Result<String> {
    toml::to_string(file)
        .map_err(|e| DeployError::Render(format!("cannot render the rack file: {e}")))
}

/// Writes generated files under `out`, creating directories. Files outside the list (the
/// rack's certificates, logs) are left alone.
pub fn write_files(out: &Path, files: &[GenFile]) -> Result<()> {
    if out.exists() && !out.is_dir() {
        return Err(DeployError::BadValue {
            what: "--out",
            value: out.display().to_string(),
            message: "exists and is not a directory".into(),
        });
    }
    for f in files {
        let path = out.join(&f.path);
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent)
                .map_err(|e| DeployError::io("create the directory", parent, e))?;
        }
        std::fs::write(&path, &f.text).map_err(|e| DeployError::io("write", &path, e))?;
    }
    Ok(())
}

/// `exactl rack pki`: creates the rack CA if missing and a certificate for every node of
/// the rack file that has none. Idempotent: a rack whose certificates exist is unchanged.
/// Returns what was done, for the operator.
pub fn pki(dir: &Path) -> Result<String> {
    let mut rack = Rack::load(dir)?;
    // The IP services' key, in the rack file before the daemons read it.
    rack.ensure_ip_key()
        .map_err(|e| crate::error::DeployError::Io {
            action: "make the IP service's key",
            path: rack.layout().ip_key(),
            source: e,
        })?;
    let shape = rack.shape();
    let names: Vec<String> = shape.node_ids().map(|id| shape.display(id)).collect();
    let layout = Layout::new(dir);
    let issued = exanet_control::tls::ensure_rack_pki(&layout, &names)?;
    // `issued` counts the operator's certificate too (exactl's, for the control API).
    Ok(format!(
        "rack {:?}: {issued} certificate(s) issued; {} has the CA and the certificates of \
         all {} nodes and the operator",
        rack.file.name,
        layout.tls_dir().display(),
        names.len()
    ))
}

/// The `.gitignore` placed in a generated rack directory: certificates and keys are made
/// at deployment (`rack pki`), never committed; sockets and logs are run-time state.
pub const RACK_GITIGNORE: &str =
    "# Made at deployment by `exactl rack pki`, or at run time: never commit them.\n\
                                  tls/\nrun/\nlogs/\n";

/// The text of the generated file at `path`; panics when there is none.
#[cfg(test)]
pub fn text<'a>(files: &'a [GenFile], path: &str) -> &'a str {
    &files
        .iter()
        .find(|f| f.path == Path::new(path))
        .unwrap_or_else(|| panic!("{path} not generated"))
        .text
}

/// Asserts that the committed example under `root` is exactly `files`, so that it cannot
/// drift from its generator; `regenerate` is the command that brings it up to date.
#[cfg(test)]
pub fn assert_committed(root: &Path, files: &[GenFile], regenerate: &str) {
    for f in files {
        let path = root.join(&f.path);
        let text =
            std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        assert!(
            text == f.text,
            "{} is stale: regenerate with `{regenerate}`",
            path.display()
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn subnets_parse_and_refuse() {
        let s: Subnet = "10.213.0.0/16".parse().unwrap();
        assert_eq!(s.size(), 65536);
        assert_eq!(s.host(16), Ipv4Addr::new(10, 213, 0, 16));
        assert_eq!(s.upper_half().to_string(), "10.213.128.0/17");
        for bad in [
            "10.213.0.1/16",
            "10.213.0.0",
            "10.213.0.0/4",
            "10.213.0.0/30",
            "8.8.0.0/16",
            "10.213.0/16",
            "10.213.0.0/x",
        ] {
            assert!(bad.parse::<Subnet>().is_err(), "{bad}");
        }
    }

    #[test]
    fn names_and_images() {
        assert!(check_name("--name", "exanet-2x2x1").is_ok());
        for bad in ["", "Exanet", "1rack", "rack-", "a_b", &"a".repeat(41)] {
            let e = check_name("--name", bad).unwrap_err();
            assert!(e.is_bad_input());
            assert!(!e.to_string().contains('\n'));
        }
        assert!(check_image("registry.example:5000/exanet:1.0").is_ok());
        assert!(check_image("a b").is_err());
        assert!(check_image("x\"y").is_err());
        assert!(check_image("${X}").is_err());
    }

    #[test]
    fn pki_issues_missing_certificates_only() {
        let d = std::env::temp_dir().join(format!("exactl-pki-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        // No rack file: bad input.
        assert!(pki(&d).unwrap_err().is_bad_input());
        std::fs::create_dir_all(&d).unwrap();
        let shape: Shape = "1x1x1".parse().unwrap();
        let file = RackFile::loopback("t", shape, |id| (20000 + id.0 as u16, 21000 + id.0 as u16));
        exanet_control::rack::write_rack_file(&d, &file).unwrap();
        pki(&d).unwrap();
        let layout = Layout::new(&d);
        let cert = layout.node_cert(&"M1QAF3");
        let before = std::fs::read(&cert).unwrap();
        std::fs::remove_file(layout.node_cert(&"M1QAF1")).unwrap();
        pki(&d).unwrap();
        assert!(layout.node_cert(&"M1QAF1").exists());
        assert!(layout.node_key(&"M1QAF1").exists());
        assert_eq!(std::fs::read(&cert).unwrap(), before, "existing certs kept");
        std::fs::remove_dir_all(&d).unwrap();
    }
}
