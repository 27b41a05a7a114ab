//! What the provider offers, and `fi_getinfo`'s question answered in Rust: given the
//! application's hints, the description of the one fabric, domain and endpoint type it
//! can give, or why not ([`Mismatch`], which `fi_getinfo` reports as `-FI_ENODATA`).
//!
//! One fabric (`exanet`), one domain per node (named after it: the NI of the node this
//! process runs on), reliable datagram endpoints (`FI_EP_RDM`) with tagged and untagged
//! messages, and one-sided reads and writes (`FI_RMA`) of memory the target registered
//! (carried out by the target's provider: see [`crate::msg`]). Progress is manual: the library makes progress inside the application's
//! calls, as it does for the client library's own API. Every threading level is honoured
//! (the client library is thread-safe).

use crate::abi::*;
use crate::av::{parse_service, Addr, Addressing};

/// The fabric's name.
pub const FABRIC_NAME: &str = "exanet";

/// Capabilities the provider offers (primary and secondary).
pub const CAPS: u64 = FI_MSG
    | FI_TAGGED
    | FI_SEND
    | FI_RECV
    | FI_SOURCE
    | FI_DIRECTED_RECV
    | FI_LOCAL_COMM
    | FI_REMOTE_COMM
    | FI_RMA
    | FI_READ
    | FI_WRITE
    | FI_REMOTE_READ
    | FI_REMOTE_WRITE
    | FI_MULTI_RECV;

/// Secondary capabilities: given whether or not the hints ask for them. Not
/// `FI_DIRECTED_RECV`: with it a receive honours its source address, without it the
/// address is ignored (fi_getinfo(3)), so given unasked it would change what a
/// program's receives match (fabtests post receives naming an address they removed
/// from the vector, and expect them to take the next message).
const SECONDARY: u64 = FI_SOURCE | FI_LOCAL_COMM | FI_REMOTE_COMM | FI_MULTI_RECV;

/// Tags are 64 bits, every bit matched or ignored as the application says.
pub const MEM_TAG_FORMAT: u64 = 0xAAAA_AAAA_AAAA_AAAA;

/// The largest message the protocol moves ([`crate::msg::MAX_MSG_SIZE`]).
pub use crate::msg::MAX_MSG_SIZE;

/// What `fi_inject` takes: one packetizer message's payload less the provider's header.
pub const INJECT_SIZE: usize = 48;

/// Bytes of remote CQ data a message carries.
pub const CQ_DATA_SIZE: usize = 8;

/// Default operation flags an application may ask for: completions (which
/// `FI_SELECTIVE_COMPLETION` makes selective), and when a send completes. Every send
/// completes once delivered, which is the strongest of the three.
const TX_OP_FLAGS: u64 =
    FI_COMPLETION | FI_INJECT_COMPLETE | FI_TRANSMIT_COMPLETE | FI_DELIVERY_COMPLETE;
/// `FI_MULTI_RECV` as a default receive flag: untagged receives post multi-receive
/// buffers (libfabric's `fi_multi_recv` test asks for it so).
const RX_OP_FLAGS: u64 = FI_COMPLETION | FI_MULTI_RECV;

/// Operations a transmit or receive context keeps queued.
pub const QUEUE_SIZE: usize = 1024;

/// The hints of one `fi_getinfo` call, as far as the provider reads them (`None`, `0` or
/// `*_UNSPEC`: no wish).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Hints {
    pub caps: u64,
    pub mode: u64,
    pub addr_format: u32,
    pub ep_type: i32,
    pub protocol: u32,
    pub max_msg_size: usize,
    pub tx_caps: u64,
    pub rx_caps: u64,
    pub tx_msg_order: u64,
    pub rx_msg_order: u64,
    pub tx_op_flags: u64,
    pub rx_op_flags: u64,
    pub inject_size: usize,
    pub cq_data_size: usize,
    pub fabric_name: Option<String>,
    pub prov_name: Option<String>,
    pub domain_name: Option<String>,
    pub threading: i32,
    pub control_progress: i32,
    pub data_progress: i32,
    pub resource_mgmt: i32,
    pub av_type: i32,
    pub mr_mode: i32,
    pub domain_caps: u64,
}

/// Why the provider has nothing for the hints.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Mismatch {
    #[error("capabilities {0:#x} are not offered")]
    Caps(u64),
    #[error("endpoint type {0} is not offered (only FI_EP_RDM)")]
    EpType(i32),
    #[error("endpoint protocol {0} is not offered")]
    Protocol(u32),
    #[error("address format {0} is not offered (exanet addresses are FI_FORMAT_UNSPEC)")]
    AddrFormat(u32),
    #[error("fabric {0:?} is not this provider's ({FABRIC_NAME:?})")]
    Fabric(String),
    #[error("provider {0:?} asked for")]
    Provider(String),
    #[error("domain {asked:?} is not this node's ({node:?})")]
    Domain { asked: String, node: String },
    #[error("progress mode {0} is not offered (only FI_PROGRESS_MANUAL)")]
    Progress(i32),
    #[error("threading level {0} is not a known one")]
    Threading(i32),
    #[error("address vector type {0} is not a known one")]
    AvType(i32),
    #[error("resource management {0} is not a known one")]
    ResourceMgmt(i32),
    #[error("messages of {0} B asked for; the largest is {MAX_MSG_SIZE}")]
    MsgSize(usize),
    #[error("inject size {0} asked for; the largest is {INJECT_SIZE}")]
    InjectSize(usize),
    #[error("message ordering {0:#x} is not offered")]
    MsgOrder(u64),
    #[error("default operation flags {0:#x} are not offered")]
    OpFlags(u64),
    #[error("{0} B of remote CQ data asked for; a message carries {CQ_DATA_SIZE}")]
    CqDataSize(usize),
    #[error("domain capabilities {0:#x} are not offered")]
    DomainCaps(u64),
    #[error("memory registration mode {0:#x} is not offered")]
    MrMode(i32),
    #[error("{0:?} names no node of this rack")]
    Node(String),
    #[error("source {0:?} is not this process's node: an endpoint can only be opened here")]
    NotHere(String),
    #[error("service {0:?} is not a number from 0 to 65535")]
    Service(String),
    #[error("the hints' {0} address is not an exanet address")]
    HintAddr(&'static str),
}

/// Where the endpoint is and whom it talks to: `fi_getinfo`'s `node`, `service` and
/// `FI_SOURCE`, and the hints' addresses, as the man page reads them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Addresses {
    /// Always this process's node; rank and mailbox those of the service, or any.
    pub src: Addr,
    pub dest: Option<Addr>,
}

/// The addresses of one `fi_getinfo` call. With `FI_SOURCE`, `node` and `service` name
/// the source (which must be this node); without it, `node` names the destination with
/// `service` (a service alone names the source, as libfabric's own providers read it).
/// The hints' source counts where `FI_SOURCE` does not give one.
pub fn addresses(
    addressing: &Addressing,
    node: Option<&str>,
    service: Option<&str>,
    source: bool,
    hints_src: Option<Addr>,
    hints_dest: Option<Addr>,
) -> Result<Addresses, Mismatch> {
    let service = match service {
        None => None,
        Some(s) => Some(parse_service(s).ok_or_else(|| Mismatch::Service(s.to_string()))?),
    };
    let node_id = match node {
        None => None,
        Some(n) => Some(
            addressing
                .node(n)
                .ok_or_else(|| Mismatch::Node(n.to_string()))?,
        ),
    };
    let here = addressing.here;
    let anywhere = Addr::at(here, 0);
    let local = |id: Option<u32>, name: Option<&str>| match id {
        Some(id) if id != here => Err(Mismatch::NotHere(name.unwrap_or("").to_string())),
        _ => Ok(()),
    };
    if source || (node.is_none() && service.is_some()) {
        local(node_id, node)?;
        return Ok(Addresses {
            src: Addr::at(here, service.unwrap_or(0)),
            dest: hints_dest,
        });
    }
    if let Some(s) = hints_src {
        local(Some(s.node), Some(&addressing.node_name(s.node)))?;
    }
    Ok(Addresses {
        src: hints_src.unwrap_or(anywhere),
        dest: match node_id {
            Some(id) => Some(Addr::at(id, service.unwrap_or(0))),
            None => hints_dest,
        },
    })
}

/// The one answer the provider gives, in Rust terms (`provider.rs` lays it out as a
/// `struct fi_info`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Offer {
    pub caps: u64,
    pub mode: u64,
    pub tx_caps: u64,
    pub rx_caps: u64,
    pub tx_op_flags: u64,
    pub rx_op_flags: u64,
    pub msg_order: u64,
    pub inject_size: usize,
    pub max_msg_size: usize,
    pub queue_size: usize,
    pub mem_tag_format: u64,
    pub fabric_name: String,
    pub domain_name: String,
    pub threading: i32,
    pub progress: i32,
    pub resource_mgmt: i32,
    pub av_type: i32,
    pub mr_mode: i32,
}

/// Capabilities of the domain rather than of an endpoint's transmit or receive side.
const DOMAIN_CAPS: u64 = FI_LOCAL_COMM | FI_REMOTE_COMM;

/// Capabilities a transmit context has (of those offered).
const TX_CAPS: u64 = FI_MSG | FI_TAGGED | FI_RMA | FI_SEND | FI_READ | FI_WRITE;
/// Capabilities a receive context has (of those offered).
const RX_CAPS: u64 = FI_MSG
    | FI_TAGGED
    | FI_RMA
    | FI_RECV
    | FI_REMOTE_READ
    | FI_REMOTE_WRITE
    | FI_SOURCE
    | FI_DIRECTED_RECV
    | FI_MULTI_RECV;

/// The memory registration mode answered for `asked` at API `version` (0: the
/// current one): fi_domain(3) keeps the old modes for old applications. Before 1.5 a
/// mode is `FI_MR_BASIC` or `FI_MR_SCALABLE` (unspecified: the provider's choice,
/// scalable here); from 1.5 either old mode asked for is given as it is (the regions
/// follow it: `mr.rs`, `Naming`), and of the mode bits none is required, so 0 is
/// given whatever the application says it could handle.
fn mr_mode(asked: i32, version: u32) -> Result<i32, Mismatch> {
    let old = asked & (FI_MR_BASIC | FI_MR_SCALABLE);
    if version != 0 && version < fi_version(1, 5) {
        return match asked {
            FI_MR_UNSPEC | FI_MR_SCALABLE => Ok(FI_MR_SCALABLE),
            FI_MR_BASIC => Ok(FI_MR_BASIC),
            m => Err(Mismatch::MrMode(m)),
        };
    }
    match old {
        0 => Ok(0),
        FI_MR_BASIC | FI_MR_SCALABLE => Ok(old),
        _ => Err(Mismatch::MrMode(asked)),
    }
}

/// What the provider offers on `node` (the domain's name) for `hints`, to an
/// application of API `version` (0: the current one).
pub fn offer(node: &str, hints: Option<&Hints>, version: u32) -> Result<Offer, Mismatch> {
    let mut o = Offer {
        caps: CAPS,
        mode: 0,
        tx_caps: CAPS & TX_CAPS,
        rx_caps: CAPS & RX_CAPS,
        tx_op_flags: 0,
        rx_op_flags: 0,
        msg_order: FI_ORDER_SAS,
        inject_size: INJECT_SIZE,
        max_msg_size: MAX_MSG_SIZE,
        queue_size: QUEUE_SIZE,
        mem_tag_format: MEM_TAG_FORMAT,
        fabric_name: FABRIC_NAME.to_string(),
        domain_name: node.to_string(),
        threading: FI_THREAD_SAFE,
        progress: FI_PROGRESS_MANUAL,
        resource_mgmt: FI_RM_ENABLED,
        av_type: FI_AV_TABLE,
        mr_mode: mr_mode(FI_MR_UNSPEC, version)?,
    };
    let Some(h) = hints else { return Ok(o) };
    let asked = h.caps | h.tx_caps | h.rx_caps;
    if asked & !CAPS != 0 {
        return Err(Mismatch::Caps(asked & !CAPS));
    }
    if h.domain_caps & !DOMAIN_CAPS != 0 {
        return Err(Mismatch::DomainCaps(h.domain_caps & !DOMAIN_CAPS));
    }
    o.mr_mode = mr_mode(h.mr_mode, version)?;
    if h.caps != 0 {
        // What was asked for, and what comes anyway: an application that asks for
        // tagged messages only must not be told it has untagged ones too.
        o.caps = h.caps | (CAPS & SECONDARY);
        // No direction asked for: every one of the asked operations (fi_getinfo(3)).
        const MODIFIERS: u64 =
            FI_SEND | FI_RECV | FI_READ | FI_WRITE | FI_REMOTE_READ | FI_REMOTE_WRITE;
        if h.caps & MODIFIERS == 0 {
            if h.caps & FI_RMA != 0 {
                o.caps |= FI_READ | FI_WRITE | FI_REMOTE_READ | FI_REMOTE_WRITE;
            }
            if h.caps & FI_RMA == 0 || h.caps & (FI_MSG | FI_TAGGED) != 0 {
                o.caps |= FI_SEND | FI_RECV;
            }
        }
        o.tx_caps &= o.caps;
        o.rx_caps &= o.caps;
    }
    if !matches!(h.ep_type, FI_EP_UNSPEC | FI_EP_RDM) {
        return Err(Mismatch::EpType(h.ep_type));
    }
    if h.protocol != FI_PROTO_UNSPEC {
        return Err(Mismatch::Protocol(h.protocol));
    }
    if h.addr_format != FI_FORMAT_UNSPEC {
        return Err(Mismatch::AddrFormat(h.addr_format));
    }
    if let Some(f) = h.fabric_name.as_ref().filter(|f| *f != FABRIC_NAME) {
        return Err(Mismatch::Fabric(f.clone()));
    }
    if let Some(p) = h.prov_name.as_ref().filter(|p| *p != FABRIC_NAME) {
        return Err(Mismatch::Provider(p.clone()));
    }
    if let Some(d) = h
        .domain_name
        .as_ref()
        .filter(|d| !d.eq_ignore_ascii_case(node))
    {
        return Err(Mismatch::Domain {
            asked: d.clone(),
            node: node.to_string(),
        });
    }
    for p in [h.control_progress, h.data_progress] {
        if !matches!(p, FI_PROGRESS_UNSPEC | FI_PROGRESS_MANUAL) {
            return Err(Mismatch::Progress(p));
        }
    }
    match h.threading {
        FI_THREAD_UNSPEC => {}
        t if (FI_THREAD_SAFE..=FI_THREAD_ENDPOINT).contains(&t) => o.threading = t,
        t => return Err(Mismatch::Threading(t)),
    }
    match h.av_type {
        FI_AV_UNSPEC => {}
        FI_AV_MAP | FI_AV_TABLE => o.av_type = h.av_type,
        t => return Err(Mismatch::AvType(t)),
    }
    if !matches!(h.resource_mgmt, FI_RM_UNSPEC..=FI_RM_ENABLED) {
        return Err(Mismatch::ResourceMgmt(h.resource_mgmt));
    }
    if h.max_msg_size > MAX_MSG_SIZE {
        return Err(Mismatch::MsgSize(h.max_msg_size));
    }
    if h.inject_size > INJECT_SIZE {
        return Err(Mismatch::InjectSize(h.inject_size));
    }
    if h.tx_op_flags & !TX_OP_FLAGS != 0 || h.rx_op_flags & !RX_OP_FLAGS != 0 {
        return Err(Mismatch::OpFlags(
            (h.tx_op_flags & !TX_OP_FLAGS) | (h.rx_op_flags & !RX_OP_FLAGS),
        ));
    }
    o.tx_op_flags = h.tx_op_flags;
    o.rx_op_flags = h.rx_op_flags;
    if h.cq_data_size > CQ_DATA_SIZE {
        return Err(Mismatch::CqDataSize(h.cq_data_size));
    }
    let order = h.tx_msg_order | h.rx_msg_order;
    if order & !o.msg_order != 0 {
        return Err(Mismatch::MsgOrder(order & !o.msg_order));
    }
    Ok(o)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_hints_get_everything_offered() {
        let o = offer("M1QAF2", None, 0).unwrap();
        assert_eq!(o.caps, CAPS);
        assert_eq!(o.domain_name, "M1QAF2");
        assert_eq!((o.av_type, o.progress), (FI_AV_TABLE, FI_PROGRESS_MANUAL));
    }

    #[test]
    fn asked_capabilities_are_given_with_the_secondary_ones_only() {
        let h = Hints {
            caps: FI_TAGGED,
            ..Hints::default()
        };
        let o = offer("M1QAF2", Some(&h), 0).unwrap();
        assert_eq!(o.caps & FI_MSG, 0, "untagged messages were not asked for");
        assert_ne!(o.caps & FI_TAGGED, 0);
        assert_eq!(o.caps & (FI_SEND | FI_RECV), FI_SEND | FI_RECV);
        assert_eq!(o.tx_caps & FI_MSG, 0);
    }

    #[test]
    fn what_is_not_offered_is_refused_with_the_reason() {
        let cases: Vec<(Hints, Mismatch)> = vec![
            (
                Hints {
                    caps: FI_TAGGED | FI_ATOMIC,
                    ..Hints::default()
                },
                Mismatch::Caps(FI_ATOMIC),
            ),
            (
                Hints {
                    ep_type: 1, // FI_EP_MSG
                    ..Hints::default()
                },
                Mismatch::EpType(1),
            ),
            (
                Hints {
                    addr_format: 2, // FI_SOCKADDR_IN
                    ..Hints::default()
                },
                Mismatch::AddrFormat(2),
            ),
            (
                Hints {
                    fabric_name: Some("tcp".into()),
                    ..Hints::default()
                },
                Mismatch::Fabric("tcp".into()),
            ),
            (
                Hints {
                    domain_name: Some("M1QBF3".into()),
                    ..Hints::default()
                },
                Mismatch::Domain {
                    asked: "M1QBF3".into(),
                    node: "M1QAF2".into(),
                },
            ),
            (
                Hints {
                    data_progress: FI_PROGRESS_AUTO,
                    ..Hints::default()
                },
                Mismatch::Progress(FI_PROGRESS_AUTO),
            ),
            (
                Hints {
                    threading: 42,
                    ..Hints::default()
                },
                Mismatch::Threading(42),
            ),
            (
                Hints {
                    av_type: 7,
                    ..Hints::default()
                },
                Mismatch::AvType(7),
            ),
            (
                Hints {
                    max_msg_size: MAX_MSG_SIZE + 1,
                    ..Hints::default()
                },
                Mismatch::MsgSize(MAX_MSG_SIZE + 1),
            ),
        ];
        for (h, want) in cases {
            assert_eq!(offer("M1QAF2", Some(&h), 0), Err(want), "{h:?}");
        }
    }

    #[test]
    fn default_operation_flags_asked_for_are_given_and_others_refused() {
        let h = Hints {
            tx_op_flags: FI_COMPLETION,
            rx_op_flags: FI_COMPLETION,
            cq_data_size: 4,
            ..Hints::default()
        };
        let o = offer("M1QAF2", Some(&h), 0).unwrap();
        assert_eq!(
            (o.tx_op_flags, o.rx_op_flags),
            (FI_COMPLETION, FI_COMPLETION)
        );
        let h = Hints {
            rx_op_flags: FI_PEEK,
            ..Hints::default()
        };
        assert_eq!(
            offer("M1QAF2", Some(&h), 0),
            Err(Mismatch::OpFlags(FI_PEEK))
        );
        let h = Hints {
            cq_data_size: 16,
            ..Hints::default()
        };
        assert_eq!(offer("M1QAF2", Some(&h), 0), Err(Mismatch::CqDataSize(16)));
    }

    #[test]
    fn levels_and_vector_types_asked_for_are_the_ones_given() {
        let h = Hints {
            ep_type: FI_EP_RDM,
            threading: FI_THREAD_ENDPOINT,
            av_type: FI_AV_MAP,
            domain_name: Some("m1qaf2".into()),
            ..Hints::default()
        };
        let o = offer("M1QAF2", Some(&h), 0).unwrap();
        assert_eq!((o.threading, o.av_type), (FI_THREAD_ENDPOINT, FI_AV_MAP));
    }
}
