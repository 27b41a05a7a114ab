//! What the IP service checks of a packet: only IPv4 crosses the rack (the TUN device
//! hands over raw IP packets, no link-layer header), and its header must agree with the
//! bytes the device returned.

use std::net::Ipv4Addr;

/// Why a frame is not an IPv4 packet the service can carry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NotIpv4 {
    /// IPv6 or anything else: the version nibble is not 4.
    Version(u8),
    /// Shorter than an IPv4 header, or a header/total length that disagrees with the bytes.
    Malformed,
}

/// The destination address of `pkt`, if it is a well-formed IPv4 packet.
pub fn ipv4_destination(pkt: &[u8]) -> Result<Ipv4Addr, NotIpv4> {
    let first = *pkt.first().ok_or(NotIpv4::Malformed)?;
    if first >> 4 != 4 {
        return Err(NotIpv4::Version(first >> 4));
    }
    let ihl = usize::from(first & 0x0f) * 4;
    if ihl < 20 || pkt.len() < ihl {
        return Err(NotIpv4::Malformed);
    }
    let total = usize::from(u16::from_be_bytes([pkt[2], pkt[3]]));
    // The device returns exactly one packet; the kernel never pads one.
    if total != pkt.len() {
        return Err(NotIpv4::Malformed);
    }
    Ok(Ipv4Addr::new(pkt[16], pkt[17], pkt[18], pkt[19]))
}

/// A minimal IPv4 packet (no options, protocol 253: "experimental") from `src` to `dst`
/// with `payload`, for the service's tests.
#[cfg(test)]
pub(crate) fn test_packet(src: Ipv4Addr, dst: Ipv4Addr, payload: &[u8]) -> Vec<u8> {
    let total = 20 + payload.len();
    let mut p = vec![0u8; 20];
    p[0] = 0x45;
    p[2..4].copy_from_slice(&(total as u16).to_be_bytes());
    p[8] = 64;
    p[9] = 253;
    p[12..16].copy_from_slice(&src.octets());
    p[16..20].copy_from_slice(&dst.octets());
    p.extend_from_slice(payload);
    p
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_whole_ipv4_packets_pass() {
        let a = Ipv4Addr::new(10, 200, 0, 1);
        let b = Ipv4Addr::new(10, 200, 0, 2);
        let p = test_packet(a, b, b"hello");
        assert_eq!(ipv4_destination(&p), Ok(b));
        let mut v6 = p.clone();
        v6[0] = 0x60;
        assert_eq!(ipv4_destination(&v6), Err(NotIpv4::Version(6)));
        assert_eq!(ipv4_destination(&p[..p.len() - 1]), Err(NotIpv4::Malformed));
        assert_eq!(ipv4_destination(&p[..10]), Err(NotIpv4::Malformed));
        assert_eq!(ipv4_destination(&[]), Err(NotIpv4::Malformed));
        let mut short_ihl = p.clone();
        short_ihl[0] = 0x44;
        assert_eq!(ipv4_destination(&short_ihl), Err(NotIpv4::Malformed));
    }
}
