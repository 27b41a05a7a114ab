//! Where the provider's log lines go: the process's standard error, at the level
//! libfabric's own `FI_LOG_LEVEL` names (`warn`, `trace`, `info`, `debug`; warnings when
//! unset, so that malformed messages and lost peers are never silent), and not at all when
//! `FI_LOG_PROV` names other providers only. The provider lives inside somebody else's
//! program: it installs a subscriber only if the program has none.

/// The filter for `FI_LOG_LEVEL` and `FI_LOG_PROV`, or `None` for no logging.
fn filter(level: Option<&str>, prov: Option<&str>) -> Option<&'static str> {
    if let Some(p) = prov {
        // libfabric's syntax: a list of names, or `^name` to exclude one.
        let names: Vec<&str> = p.split(',').map(str::trim).collect();
        let excluded = names.iter().any(|n| n.strip_prefix('^') == Some("exanet"));
        let included = names.iter().any(|n| !n.starts_with('^'));
        if excluded || (included && !names.contains(&"exanet")) {
            return None;
        }
    }
    Some(match level.map(str::to_ascii_lowercase).as_deref() {
        // libfabric's trace sits between warn and info.
        Some("trace") | Some("info") => "exanet_fi=info,exanet=info",
        Some("debug") => "exanet_fi=debug,exanet=debug",
        _ => "exanet_fi=warn,exanet=warn",
    })
}

/// Sends the provider's log lines to standard error (once; a no-op when the program set
/// up its own subscriber).
pub fn init() {
    let level = std::env::var("FI_LOG_LEVEL").ok();
    let prov = std::env::var("FI_LOG_PROV").ok();
    let Some(f) = filter(level.as_deref(), prov.as_deref()) else {
        return;
    };
    use std::io::IsTerminal;
    let _ = tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        // Colour codes only where someone reads them: an MPI launcher gathers its ranks'
        // standard error into pipes and files.
        .with_ansi(std::io::stderr().is_terminal())
        .with_env_filter(tracing_subscriber::EnvFilter::new(f))
        .try_init();
}

#[cfg(test)]
mod tests {
    use super::filter;

    #[test]
    fn levels_and_providers_as_libfabric_names_them() {
        assert_eq!(filter(None, None), Some("exanet_fi=warn,exanet=warn"));
        assert_eq!(
            filter(Some("INFO"), None),
            Some("exanet_fi=info,exanet=info")
        );
        assert_eq!(
            filter(Some("trace"), None),
            Some("exanet_fi=info,exanet=info")
        );
        assert_eq!(
            filter(Some("debug"), Some("exanet")),
            Some("exanet_fi=debug,exanet=debug")
        );
        assert_eq!(
            filter(Some("debug"), Some("tcp,exanet")),
            Some("exanet_fi=debug,exanet=debug")
        );
        assert_eq!(filter(Some("debug"), Some("tcp")), None);
        assert_eq!(filter(None, Some("^exanet")), None);
        assert_eq!(
            filter(None, Some("^tcp")),
            Some("exanet_fi=warn,exanet=warn")
        );
    }
}
