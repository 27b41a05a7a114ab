//! The rack's IPv4 addressing: node id `n` has the `n + 1`-th address of the rack's
//! subnet, so an address says which node it is and nothing lists them.

use std::net::Ipv4Addr;

use exanet_proto::NodeId;

/// A rack's subnet and how many nodes it addresses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RackSubnet {
    network: u32,
    prefix: u8,
    nodes: u32,
}

impl RackSubnet {
    /// `network`/`prefix` (host bits are ignored) for a rack of `nodes` nodes.
    pub fn new(network: Ipv4Addr, prefix: u8, nodes: u32) -> RackSubnet {
        let prefix = prefix.min(32);
        RackSubnet {
            network: u32::from(network) & mask(prefix),
            prefix,
            nodes,
        }
    }

    pub fn network(&self) -> Ipv4Addr {
        Ipv4Addr::from(self.network)
    }

    pub fn prefix(&self) -> u8 {
        self.prefix
    }

    /// How many nodes the rack has.
    pub fn nodes(&self) -> u32 {
        self.nodes
    }

    /// Addresses the subnet can give nodes: all but its network and broadcast ones.
    pub fn room(&self) -> u64 {
        room(self.prefix)
    }

    /// Node `id`'s address; `None` when the subnet has no room for it.
    pub fn node_addr(&self, id: NodeId) -> Option<Ipv4Addr> {
        let offset = u64::from(id.0) + 1;
        if offset > self.room() {
            return None;
        }
        u32::try_from(u64::from(self.network) + offset)
            .ok()
            .map(Ipv4Addr::from)
    }

    /// The node whose address `addr` is, if it is one of the rack's.
    pub fn node_of(&self, addr: Ipv4Addr) -> Option<NodeId> {
        let a = u32::from(addr);
        if a & mask(self.prefix) != self.network {
            return None;
        }
        let id = (a - self.network).checked_sub(1)?;
        (id < self.nodes && u64::from(id) < self.room()).then_some(NodeId(id))
    }
}

fn mask(prefix: u8) -> u32 {
    match prefix {
        0 => 0,
        p => u32::MAX << (32 - u32::from(p.min(32))),
    }
}

/// Addresses a subnet of prefix `p` gives nodes.
pub fn room(p: u8) -> u64 {
    (1u64 << (32 - u32::from(p.min(32)))).saturating_sub(2)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_and_nodes_map_one_to_one() {
        let s = RackSubnet::new(Ipv4Addr::new(10, 200, 0, 0), 16, 300);
        assert_eq!(s.node_addr(NodeId(0)), Some(Ipv4Addr::new(10, 200, 0, 1)));
        assert_eq!(s.node_addr(NodeId(255)), Some(Ipv4Addr::new(10, 200, 1, 0)));
        for id in 0..300 {
            let a = s.node_addr(NodeId(id)).unwrap();
            assert_eq!(s.node_of(a), Some(NodeId(id)));
        }
        for a in [
            Ipv4Addr::new(10, 200, 0, 0),
            Ipv4Addr::new(10, 200, 255, 255),
            Ipv4Addr::new(10, 200, 1, 45), // node 300: past the rack
            Ipv4Addr::new(10, 201, 0, 1),
            Ipv4Addr::new(8, 8, 8, 8),
        ] {
            assert_eq!(s.node_of(a), None, "{a}");
        }
    }

    #[test]
    fn a_small_subnet_has_no_address_past_its_room() {
        let s = RackSubnet::new(Ipv4Addr::new(192, 168, 7, 0), 30, 8);
        assert_eq!(s.room(), 2);
        assert!(s.node_addr(NodeId(1)).is_some());
        assert_eq!(s.node_addr(NodeId(2)), None);
        // The broadcast address is not a node even though id 2 < nodes.
        assert_eq!(s.node_of(Ipv4Addr::new(192, 168, 7, 3)), None);
    }
}
