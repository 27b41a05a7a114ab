//! exactl's use of the daemons' control API: one client per command, holding the rack's
//! operator credentials, and the small conventions every command shares.

use std::time::Duration;

use exanet_control::control::{Request, Response};
use exanet_control::control_client::ControlClient;
use exanet_control::rack::Rack;
use exanet_proto::NodeId;

use crate::error::{CliError, Result};
use crate::live::RackLiveness;

/// A control client for `rack`.
pub fn client(rack: &Rack) -> Result<ControlClient> {
    ControlClient::new(rack).map_err(|e| {
        CliError::Failed(format!(
            "{e} (the operator certificate is {}; `exactl rack up` or `exactl rack pki` creates it)",
            rack.layout().node_cert(&exanet_control::tls::OPERATOR).display()
        ))
    })
}

/// Sends each request to its node, all at once, and returns the answers in order; a node
/// of a local rack whose process is gone is not asked (it cannot answer, and waiting
/// `timeout` for it says less): its result is [`CliError::NotRunning`] at once.
pub fn request_live(
    client: &ControlClient,
    reqs: Vec<(NodeId, Request)>,
    timeout: Duration,
) -> Vec<Result<Response>> {
    let shape = client.rack().shape();
    let live = RackLiveness::of(client.rack());
    let ids: Vec<NodeId> = reqs.iter().map(|(id, _)| *id).collect();
    let asked: Vec<(NodeId, Request)> = reqs
        .into_iter()
        .filter(|(id, _)| live.gone(*id).is_none())
        .collect();
    let mut answers = client.request_all(asked, timeout).into_iter();
    ids.into_iter()
        .map(|id| {
            let node = shape.display(id);
            if let Some(why) = live.gone(id) {
                return Err(CliError::NotRunning {
                    node,
                    why: why.to_string(),
                });
            }
            match answers.next() {
                Some(Ok(r)) => Ok(r),
                Some(Err(source)) => Err(CliError::Control { node, source }),
                None => Err(CliError::Failed(format!("{node}: no answer"))),
            }
        })
        .collect()
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
    for (id, r) in ids.into_iter().zip(request_live(client, reqs, timeout)) {
        let node = shape.display(id);
        let e = match r {
            Ok(Response::Ok) => continue,
            Ok(Response::Error { message }) => CliError::Refused { node, message },
            Ok(other) => CliError::Unexpected {
                node,
                request: what,
                answer: format!("{other:?}"),
            },
            Err(e) => e,
        };
        if first.is_none() {
            first = Some(e);
        } else {
            eprintln!("exactl: {e}");
        }
    }
    first.map_or(Ok(()), Err)
}
