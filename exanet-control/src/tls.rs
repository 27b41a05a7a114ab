//! Rack TLS: a rack CA signs one certificate per node, valid for the node's DNS name
//! (lower-case node name, e.g. `m1qaf2`) for both server and client use. Links use mutual
//! TLS: each end proves it is the node it claims to be, and a peer without a certificate
//! from this rack's CA is refused.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyPair, KeyUsagePurpose,
};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use rustls::RootCertStore;
use thiserror::Error;

use crate::rack::{dns_name, Layout};

/// ALPN of exanet links, so that nothing else speaking QUIC is mistaken for a peer.
pub const ALPN: &[u8] = b"exanet-link/1";
/// ALPN of the control API on the same endpoint (served by exanetd's `control_server`).
pub const ALPN_CONTROL: &[u8] = b"exanet-control/1";
/// ALPN of a daemon's connection to the rack's cut coordinator (exanetd's `cuts`).
pub const ALPN_CUTS: &[u8] = b"exanet-cuts/4";
/// The identity the control API accepts: the operator certificate `tls/exactl.pem`,
/// signed by the rack CA like the nodes' but for this name, which no node has. A node's
/// certificate proves it is a node, not that its holder may operate the rack.
pub const OPERATOR: &str = "exactl";

#[derive(Debug, Error)]
pub enum TlsError {
    #[error("cannot read {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("cannot write {path}: {source}")]
    Write {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path} holds no {what}")]
    Empty { path: PathBuf, what: &'static str },
    #[error("bad TLS material in {path}: {message}")]
    Bad { path: PathBuf, message: String },
    #[error("certificate generation failed: {0}")]
    Generate(#[from] rcgen::Error),
    #[error("TLS configuration: {0}")]
    Config(String),
}

fn read(path: &Path) -> Result<Vec<u8>, TlsError> {
    std::fs::read(path).map_err(|source| TlsError::Read {
        path: path.to_path_buf(),
        source,
    })
}

fn write(path: &Path, data: &str, private: bool) -> Result<(), TlsError> {
    let werr = |source| TlsError::Write {
        path: path.to_path_buf(),
        source,
    };
    std::fs::write(path, data).map_err(werr)?;
    if private {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600)).map_err(werr)?;
    }
    Ok(())
}

pub fn load_certs(path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let data = read(path)?;
    let certs = rustls_pemfile::certs(&mut &data[..])
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| TlsError::Bad {
            path: path.to_path_buf(),
            message: e.to_string(),
        })?;
    if certs.is_empty() {
        return Err(TlsError::Empty {
            path: path.to_path_buf(),
            what: "certificate",
        });
    }
    Ok(certs)
}

pub fn load_key(path: &Path) -> Result<PrivateKeyDer<'static>, TlsError> {
    let data = read(path)?;
    rustls_pemfile::private_key(&mut &data[..])
        .map_err(|e| TlsError::Bad {
            path: path.to_path_buf(),
            message: e.to_string(),
        })?
        .ok_or_else(|| TlsError::Empty {
            path: path.to_path_buf(),
            what: "private key",
        })
}

fn ca_params() -> Result<CertificateParams, TlsError> {
    let mut p = CertificateParams::new(Vec::<String>::new())?;
    let mut dn = DistinguishedName::new();
    dn.push(DnType::CommonName, "exanet rack CA");
    p.distinguished_name = dn;
    p.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    p.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    Ok(p)
}

/// Creates the rack CA unless it exists; then issues a certificate for every node in
/// `nodes` that has none, and the operator's ([`OPERATOR`]) if it has none. Returns how
/// many certificates were issued, the operator's included.
pub fn ensure_rack_pki(layout: &Layout, nodes: &[String]) -> Result<usize, TlsError> {
    let dir = layout.tls_dir();
    std::fs::create_dir_all(&dir).map_err(|source| TlsError::Write {
        path: dir.clone(),
        source,
    })?;
    let (ca_cert_path, ca_key_path) = (layout.ca_cert(), layout.ca_key());
    let ca_key = if ca_key_path.exists() {
        let pem = String::from_utf8_lossy(&read(&ca_key_path)?).into_owned();
        KeyPair::from_pem(&pem).map_err(|e| TlsError::Bad {
            path: ca_key_path.clone(),
            message: e.to_string(),
        })?
    } else {
        let k = KeyPair::generate()?;
        write(&ca_key_path, &k.serialize_pem(), true)?;
        k
    };
    // Re-deriving the CA certificate from its fixed parameters and key gives an issuer
    // with the same name and key, so node certificates chain to the stored ca.pem.
    let ca = ca_params()?.self_signed(&ca_key)?;
    if !ca_cert_path.exists() {
        write(&ca_cert_path, &ca.pem(), false)?;
    }
    let mut issued = 0;
    for name in nodes.iter().map(String::as_str).chain([OPERATOR]) {
        let (cert_path, key_path) = (layout.node_cert(&name), layout.node_key(&name));
        if cert_path.exists() && key_path.exists() {
            continue;
        }
        let mut p = CertificateParams::new(vec![dns_name(&name)])?;
        let mut dn = DistinguishedName::new();
        dn.push(DnType::CommonName, name);
        p.distinguished_name = dn;
        p.extended_key_usages = vec![
            ExtendedKeyUsagePurpose::ServerAuth,
            ExtendedKeyUsagePurpose::ClientAuth,
        ];
        let key = KeyPair::generate()?;
        let cert = p.signed_by(&key, &ca, &ca_key)?;
        write(&key_path, &key.serialize_pem(), true)?;
        write(&cert_path, &cert.pem(), false)?;
        issued += 1;
    }
    Ok(issued)
}

/// TLS material of one node.
pub struct NodeTls {
    pub ca: Vec<CertificateDer<'static>>,
    pub certs: Vec<CertificateDer<'static>>,
    pub key: PrivateKeyDer<'static>,
}

impl NodeTls {
    pub fn load(layout: &Layout, node: &str) -> Result<NodeTls, TlsError> {
        Ok(NodeTls {
            ca: load_certs(&layout.ca_cert())?,
            certs: load_certs(&layout.node_cert(&node))?,
            key: load_key(&layout.node_key(&node))?,
        })
    }

    fn roots(&self) -> Result<Arc<RootCertStore>, TlsError> {
        let mut roots = RootCertStore::empty();
        for c in &self.ca {
            roots
                .add(c.clone())
                .map_err(|e| TlsError::Config(format!("rack CA: {e}")))?;
        }
        Ok(Arc::new(roots))
    }

    /// A client configuration presenting this identity, speaking `alpn`, with the default
    /// link timeout (control connections; links take the rack's, from [`Self::quic_configs`]).
    pub fn client_config(&self, alpn: &[u8]) -> Result<quinn::ClientConfig, TlsError> {
        self.client_config_with(alpn, DEFAULT_LINK_TIMEOUT)
    }

    fn client_config_with(
        &self,
        alpn: &[u8],
        link_timeout: Duration,
    ) -> Result<quinn::ClientConfig, TlsError> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut client = rustls::ClientConfig::builder_with_provider(provider)
            .with_protocol_versions(&[&rustls::version::TLS13])
            .map_err(|e| TlsError::Config(e.to_string()))?
            .with_root_certificates(self.roots()?)
            .with_client_auth_cert(self.certs.clone(), self.key.clone_key())
            .map_err(|e| TlsError::Config(e.to_string()))?;
        client.alpn_protocols = vec![alpn.to_vec()];
        let qc = quinn::crypto::rustls::QuicClientConfig::try_from(client)
            .map_err(|e| TlsError::Config(e.to_string()))?;
        let mut cc = quinn::ClientConfig::new(Arc::new(qc));
        cc.transport_config(Arc::new(transport_config(link_timeout)));
        Ok(cc)
    }

    /// QUIC server and client configurations for this node's endpoint, its links down
    /// after `link_timeout` of silence from the peer (the rack file's `link_timeout_s`).
    pub fn quic_configs(
        &self,
        link_timeout: Duration,
    ) -> Result<(quinn::ServerConfig, quinn::ClientConfig), TlsError> {
        let cfg = |e: rustls::Error| TlsError::Config(e.to_string());
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let roots = self.roots()?;
        let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
            roots.clone(),
            provider.clone(),
        )
        .build()
        .map_err(|e| TlsError::Config(e.to_string()))?;
        let mut server = rustls::ServerConfig::builder_with_provider(provider.clone())
            .with_protocol_versions(&[&rustls::version::TLS13])
            .map_err(cfg)?
            .with_client_cert_verifier(verifier)
            .with_single_cert(self.certs.clone(), self.key.clone_key())
            .map_err(cfg)?;
        server.alpn_protocols = vec![ALPN.to_vec(), ALPN_CONTROL.to_vec(), ALPN_CUTS.to_vec()];
        let qs = quinn::crypto::rustls::QuicServerConfig::try_from(server)
            .map_err(|e| TlsError::Config(e.to_string()))?;
        let mut sc = quinn::ServerConfig::with_crypto(Arc::new(qs));
        sc.transport_config(Arc::new(transport_config(link_timeout)));
        Ok((sc, self.client_config_with(ALPN, link_timeout)?))
    }
}

/// QUIC transport settings of a link: generous flow-control windows so that QUIC never
/// limits a link below its credit window, keep-alives so that a dead peer is noticed
/// within `link_timeout`, and MTU discovery so loopback links use large datagrams.
/// The keep-alive period is the idle rack's main CPU cost (a 4x4x2 rack has 272 links).
fn transport_config(link_timeout: Duration) -> quinn::TransportConfig {
    let mut t = quinn::TransportConfig::default();
    t.stream_receive_window((8u32 << 20).into());
    t.receive_window((16u32 << 20).into());
    t.send_window(16 << 20);
    t.max_concurrent_uni_streams(0u8.into());
    t.max_concurrent_bidi_streams(4u8.into());
    t.keep_alive_interval(Some(keep_alive(link_timeout)));
    // Handshake retransmissions are paced by the initial RTT estimate; quinn's default
    // (333 ms) made a dial to a neighbour that starts a moment later wait about a second.
    t.initial_rtt(Duration::from_millis(10));
    // Rack files hold at most LINK_TIMEOUT_S's end (600 s), far below QUIC's limit
    // (2^62 ms); were it ever over, the link would never time out rather than fail.
    t.max_idle_timeout(link_timeout.try_into().ok());
    let mut mtu = quinn::MtuDiscoveryConfig::default();
    mtu.upper_bound(MAX_UDP_PAYLOAD);
    t.mtu_discovery_config(Some(mtu));
    let mut ack = quinn::AckFrequencyConfig::default();
    ack.ack_eliciting_threshold(ACK_ELICITING_THRESHOLD.into());
    t.ack_frequency_config(Some(ack));
    t
}

/// How many ack-eliciting packets a link's peer may take before it acknowledges them in a
/// packet of its own (QUIC's ACK frequency extension; quinn's default is 1).
pub const ACK_ELICITING_THRESHOLD: u32 = 8;

pub use crate::rack::{DEFAULT_LINK_TIMEOUT, LINK_TIMEOUT_S};

/// Keep-alive period of an idle link: under a third of the timeout, so that a lost
/// keep-alive is sent again (QUIC's loss recovery) well before the peer gives up. Each
/// keep-alive wakes both ends twice (the ping and its delayed acknowledgement), which is
/// what an idle rack costs: a longer timeout is less idle CPU and a slower notice of a
/// dead peer.
pub fn keep_alive(link_timeout: Duration) -> Duration {
    link_timeout * 3 / 10
}

/// Largest UDP payload a link uses once MTU discovery has found the path allows it
/// (loopback does; a 1500-byte container network settles near 1472). Measured on
/// loopback here: 1472 gives ~1.9 Gb/s of 256 B cells on one link, 4096 ~2.4 Gb/s; with
/// 8192 or more, quinn's black-hole detection dropped the MTU back to 1200.
pub const MAX_UDP_PAYLOAD: u16 = 4096;

impl NodeTls {
    /// Endpoint settings. Datagrams up to [`MAX_UDP_PAYLOAD`] are advertised, or the
    /// peer's MTU discovery stops at quinn's default of 1472.
    ///
    /// The stateless-reset key and the connection-ID key are derived from the node's
    /// private key instead of drawn at random, so a restarted daemon still recognises its
    /// previous run's connection IDs and answers their packets with a reset its
    /// neighbours accept: they drop the dead link at their next keep-alive and redial,
    /// instead of waiting out the idle timeout. Only the holder of the node's key can
    /// forge such a reset.
    pub fn endpoint_config(&self) -> quinn::EndpointConfig {
        use ring::hmac;
        let derive = hmac::Key::new(hmac::HMAC_SHA256, self.key.secret_der());
        let secret = hmac::sign(&derive, b"exanet QUIC stateless reset");
        let reset = hmac::Key::new(hmac::HMAC_SHA256, secret.as_ref());
        let cid_key = hmac::sign(&derive, b"exanet QUIC connection ids");
        let mut cid_bytes = [0u8; 8];
        cid_bytes.copy_from_slice(&cid_key.as_ref()[..8]);
        let cid_key = u64::from_le_bytes(cid_bytes);
        let mut e = quinn::EndpointConfig::new(Arc::new(reset));
        e.cid_generator(move || {
            Box::new(quinn_proto::HashedConnectionIdGenerator::from_key(cid_key))
        });
        e.max_udp_payload_size(MAX_UDP_PAYLOAD)
            .expect("16 KiB is a valid UDP payload size");
        e
    }
}

/// Checks that a verified peer certificate chain was issued for node `name`.
pub fn cert_is_for(certs: &[CertificateDer<'_>], name: &str) -> bool {
    let Some(leaf) = certs.first() else {
        return false;
    };
    let Ok(ee) = webpki::EndEntityCert::try_from(leaf) else {
        return false;
    };
    let Ok(sn) = ServerName::try_from(dns_name(&name)) else {
        return false;
    };
    ee.verify_is_valid_for_subject_name(&sn).is_ok()
}
