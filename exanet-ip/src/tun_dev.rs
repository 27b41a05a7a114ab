//! The node's TUN device: created in the node's network namespace when one is named, so
//! that the node's programs (started there by `exactl exec`) see it as their only
//! interface besides loopback, while this process stays in the host's namespace (where
//! its metrics listen and its daemon's socket is).

use std::fs::File;
use std::net::Ipv4Addr;
use std::path::Path;

use thiserror::Error;

#[derive(Debug, Error)]
pub enum TunError {
    #[error("cannot open network namespace {path}: {source}")]
    Netns {
        path: String,
        source: std::io::Error,
    },
    #[error("cannot enter network namespace {path}: {source}")]
    Setns { path: String, source: nix::Error },
    #[error("cannot create TUN device {name}: {source}")]
    Create { name: String, source: tun::Error },
    #[error("the thread creating the TUN device panicked")]
    Thread,
}

/// What the device looks like.
pub struct TunSpec<'a> {
    pub name: &'a str,
    pub addr: Ipv4Addr,
    pub prefix: u8,
    pub mtu: u16,
}

/// Creates and configures the device (address, netmask, MTU, up), in `netns` if given.
pub fn create(spec: &TunSpec<'_>, netns: Option<&Path>) -> Result<tun::Device, TunError> {
    let make = || {
        let mask = match spec.prefix {
            0 => 0,
            p => u32::MAX << (32 - u32::from(p.min(32))),
        };
        let mut cfg = tun::Configuration::default();
        cfg.tun_name(spec.name)
            .address(spec.addr)
            .netmask(Ipv4Addr::from(mask))
            .mtu(spec.mtu)
            .up();
        tun::create(&cfg).map_err(|source| TunError::Create {
            name: spec.name.to_string(),
            source,
        })
    };
    let Some(ns) = netns else {
        return make();
    };
    // setns changes the calling thread only: a thread of its own enters the namespace,
    // creates the device there (its configuration socket too), and ends. The device's
    // descriptor then works from any thread.
    std::thread::scope(|s| {
        s.spawn(|| {
            let path = ns.display().to_string();
            let f = File::open(ns).map_err(|source| TunError::Netns {
                path: path.clone(),
                source,
            })?;
            nix::sched::setns(&f, nix::sched::CloneFlags::CLONE_NEWNET)
                .map_err(|source| TunError::Setns { path, source })?;
            make()
        })
        .join()
        .map_err(|_| TunError::Thread)?
    })
}
