//! The rack's IPv4 addresses for IP over ExaNet (`[ip]` in `rack.toml`): every node has
//! one, derived from its node id in a private subnet of the rack's, so that an address
//! says which node it is and no configuration lists them. The addresses live only inside
//! the rack (the nodes' own network namespaces or containers): the subnet must be one of
//! the private ranges (RFC 1918), which no router forwards, so nothing given to a node
//! can route out.

use std::net::Ipv4Addr;

use exanet_ip_proto::RackSubnet;
use exanet_proto::{NodeId, Shape};
use ipnet::Ipv4Net;
use serde::{Deserialize, Serialize};
use thiserror::Error;

/// The subnet when the rack file names none: private, and out of the way of the 10.0.x and
/// 192.168.x networks hosts and container engines usually take.
pub const DEFAULT_SUBNET: Ipv4Net = match Ipv4Net::new(Ipv4Addr::new(10, 200, 0, 0), 16) {
    Ok(n) => n,
    Err(_) => panic!("a /16 is a valid prefix"),
};

/// The TUN device's name on every node: the same everywhere (each node has a network
/// namespace or container of its own), so one interface setting of an MPI library or a
/// launcher fits them all.
pub const DEVICE: &str = "exanet0";

/// `[ip]` in the rack file; absent fields keep their defaults.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct IpSettings {
    /// The rack's subnet (`"10.200.0.0/16"`): node id `n` gets its `n + 1`-th address.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub subnet: Option<Ipv4Net>,
    /// The MTU of the nodes' TUN devices ([`DEFAULT_MTU`] when absent).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mtu: Option<u32>,
    /// SHA-256 (hex) of the key that admits the IP service to its own job; `exactl rack
    /// up` makes one (the key itself is in `tls/ip.key`, readable by the rack's owner).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key_sha256: Option<String>,
    /// The IP service's protection domain ([`DEFAULT_PDID`] when absent).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pdid: Option<u16>,
}

/// The IP service's PDID when the rack file names none: the last one, out of the way of
/// jobs numbered from 1.
pub const DEFAULT_PDID: u16 = u16::MAX;

/// The job name the IP service's workloads are counted under.
pub const JOB_NAME: &str = "ip";

/// The IP service's PDID.
pub fn pdid(settings: Option<&IpSettings>) -> u16 {
    settings.and_then(|s| s.pdid).unwrap_or(DEFAULT_PDID)
}

/// The nodes' MTU when the rack file names none (see the README for why this size).
pub const DEFAULT_MTU: u32 = 65000;

/// The rack's MTU: the file's, else [`DEFAULT_MTU`].
pub fn mtu(settings: Option<&IpSettings>) -> u32 {
    settings.and_then(|s| s.mtu).unwrap_or(DEFAULT_MTU)
}

/// Why the rack's subnet cannot hold its nodes.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum IpError {
    #[error("ip.subnet {0} is not private (10.0.0.0/8, 172.16.0.0/12 or 192.168.0.0/16): the rack's addresses must never route out of it")]
    NotPrivate(Ipv4Net),
    #[error("ip.subnet {subnet} has host bits set: write it as {network}")]
    HostBits { subnet: Ipv4Net, network: Ipv4Net },
    #[error("ip.mtu {0} is outside 68..=65535 (the smallest IPv4 MTU, the largest IPv4 packet)")]
    Mtu(u32),
    #[error("ip.subnet {subnet} has room for {room} nodes and the rack has {nodes}: a /{prefix} or wider would do")]
    TooSmall {
        subnet: Ipv4Net,
        room: u64,
        nodes: u32,
        prefix: u8,
    },
}

/// The rack's subnet: the file's, else [`DEFAULT_SUBNET`].
pub fn subnet(settings: Option<&IpSettings>) -> Ipv4Net {
    settings.and_then(|s| s.subnet).unwrap_or(DEFAULT_SUBNET)
}

/// Whether `subnet` can give every node of `shape` an address of its own (the network
/// and broadcast addresses stay unused) and keeps them inside the machine.
pub fn check(subnet: Ipv4Net, shape: &Shape) -> Result<(), IpError> {
    let private = [
        Ipv4Net::new(Ipv4Addr::new(10, 0, 0, 0), 8),
        Ipv4Net::new(Ipv4Addr::new(172, 16, 0, 0), 12),
        Ipv4Net::new(Ipv4Addr::new(192, 168, 0, 0), 16),
    ];
    if !private
        .iter()
        .flatten()
        .any(|p| p.contains(&subnet.network()) && p.contains(&subnet.broadcast()))
    {
        return Err(IpError::NotPrivate(subnet));
    }
    if subnet.addr() != subnet.network() {
        return Err(IpError::HostBits {
            subnet,
            network: subnet.trunc(),
        });
    }
    let nodes = shape.nodes();
    let room = room(subnet.prefix_len());
    if u64::from(nodes) > room {
        // The longest prefix whose room holds the nodes.
        let prefix = (0..=30u8).rev().find(|&p| room_fits(p, nodes)).unwrap_or(0);
        return Err(IpError::TooSmall {
            subnet,
            room,
            nodes,
            prefix,
        });
    }
    Ok(())
}

fn room(p: u8) -> u64 {
    exanet_ip_proto::addr::room(p)
}

fn room_fits(p: u8, nodes: u32) -> bool {
    room(p) >= u64::from(nodes)
}

/// The rack's addressing in the core's terms (what the IP service works with).
pub fn rack_subnet(subnet: Ipv4Net, shape: &Shape) -> RackSubnet {
    RackSubnet::new(subnet.network(), subnet.prefix_len(), shape.nodes())
}

/// Node `id`'s address in `subnet` (the network address plus `id + 1`); `None` when the
/// subnet has no room for it (see [`check`]).
pub fn node_addr(subnet: Ipv4Net, id: NodeId) -> Option<Ipv4Addr> {
    RackSubnet::new(
        subnet.network(),
        subnet.prefix_len(),
        id.0.saturating_add(1),
    )
    .node_addr(id)
}

/// The node whose address `addr` is, if it is one of the rack's.
pub fn node_of(subnet: Ipv4Net, shape: &Shape, addr: Ipv4Addr) -> Option<NodeId> {
    rack_subnet(subnet, shape).node_of(addr)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shape(s: &str) -> Shape {
        s.parse().unwrap()
    }

    #[test]
    fn every_node_has_its_own_address_and_each_address_names_its_node() {
        let s = shape("4x4x2");
        let net = subnet(None);
        check(net, &s).unwrap();
        let mut seen = std::collections::HashSet::new();
        for id in s.node_ids() {
            let a = node_addr(net, id).unwrap();
            assert!(net.contains(&a) && a != net.network() && a != net.broadcast());
            assert!(seen.insert(a), "{a} twice");
            assert_eq!(node_of(net, &s, a), Some(id));
        }
        assert_eq!(
            node_addr(net, NodeId(0)),
            Some(Ipv4Addr::new(10, 200, 0, 1))
        );
        assert_eq!(
            node_addr(net, NodeId(255)),
            Some(Ipv4Addr::new(10, 200, 1, 0))
        );
        // Not a node: the network, the broadcast, past the rack, outside the subnet.
        for a in [
            net.network(),
            net.broadcast(),
            Ipv4Addr::new(10, 200, 0, 129),
            Ipv4Addr::new(10, 201, 0, 1),
        ] {
            assert_eq!(node_of(net, &s, a), None, "{a}");
        }
    }

    #[test]
    fn a_subnet_that_could_route_out_or_is_too_small_is_refused_saying_why() {
        let s = shape("4x4x2"); // 128 nodes
        let net = |t: &str| t.parse::<Ipv4Net>().unwrap();
        assert!(matches!(
            check(net("8.8.0.0/16"), &s),
            Err(IpError::NotPrivate(_))
        ));
        // Wider than the private range it starts in.
        assert!(matches!(
            check(net("172.16.0.0/11"), &s),
            Err(IpError::NotPrivate(_))
        ));
        let e = check(net("10.1.2.3/16"), &s).unwrap_err();
        assert!(e.to_string().contains("10.1.0.0/16"), "{e}");
        let e = check(net("192.168.7.0/25"), &s).unwrap_err();
        assert_eq!(
            e,
            IpError::TooSmall {
                subnet: net("192.168.7.0/25"),
                room: 126,
                nodes: 128,
                prefix: 24
            }
        );
        check(net("192.168.7.0/24"), &s).unwrap();
        check(net("172.31.0.0/16"), &s).unwrap();
        assert_eq!(node_addr(net("192.168.7.0/25"), NodeId(126)), None);
    }

    #[test]
    fn the_rack_file_names_its_subnet_or_keeps_the_default() {
        let s: IpSettings = toml::from_str("subnet = \"192.168.40.0/24\"").unwrap();
        assert_eq!(subnet(Some(&s)).to_string(), "192.168.40.0/24");
        assert_eq!(subnet(Some(&IpSettings::default())), DEFAULT_SUBNET);
        assert!(toml::from_str::<IpSettings>("subnet = \"10.0.0.0/33\"").is_err());
        assert!(toml::from_str::<IpSettings>("mask = 1").is_err());
    }
}
