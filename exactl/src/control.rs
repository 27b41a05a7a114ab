//! exactl's use of the daemons' control API: one client per command, holding the rack's
//! operator credentials, and the small conventions every command shares.

use std::time::Duration;

use exanet_proto::NodeId;
use exanetd::control::{Request, Response};
use exanetd::control_client::ControlClient;
use exanetd::rack::Rack;

use crate::error::{CliError, Result};

/// A control client for `rack`.
pub fn client(rack: &Rack) -> Result<ControlClient> {
    ControlClient::new(rack).map_err(|e| {
        CliError::Failed(format!(
            "{e} (the operator certificate is {}; `exactl rack up` or `exactl rack pki` creates it)",
            rack.layout().node_cert(&exanetd::tls::OPERATOR).display()
        ))
    })
}

/// Sends each request and checks that every daemon answered `ok`; the first failure is
/// the error, after all requests were sent (one unreachable node does not stop the rest).
pub fn all_ok(
    client: &ControlClient,
    reqs: Vec<(NodeId, Request)>,
    timeout: Duration,
    what: &'static str,
) -> Result<()> {
    let shape = client.rack().shape();
    let ids: Vec<NodeId> = reqs.iter().map(|(id, _)| *id).collect();
    let mut first = None;
    for (id, r) in ids.into_iter().zip(client.request_all(reqs, timeout)) {
        let node = shape.display(id);
        let e = match r {
            Ok(Response::Ok) => continue,
            Ok(Response::Error { message }) => CliError::Refused { node, message },
            Ok(other) => CliError::Unexpected {
                node,
                request: what,
                answer: format!("{other:?}"),
            },
            Err(source) => CliError::Control { node, source },
        };
        if first.is_none() {
            first = Some(e);
        } else {
            eprintln!("exactl: {e}");
        }
    }
    first.map_or(Ok(()), Err)
}
