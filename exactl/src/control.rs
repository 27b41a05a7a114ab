//! exactl's use of the daemons' control API: one client per command, holding the rack's
//! operator credentials, and the small conventions every command shares.

use std::sync::mpsc;
use std::time::{Duration, Instant};

use exanet_control::control::{ControlError, Request, Response};
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

/// Daemons asked at once, in a wave. Every first request to a daemon is a QUIC handshake,
/// and the daemons' answers all come back to this process's one UDP socket: asking the
/// 128 of a 4x4x2 rack at once overflowed its receive buffer (about 1100 datagrams
/// dropped per `exactl status`, counted in /proc/net/snmp `RcvbufErrors`), and the lost
/// handshake packets, resent only after QUIC's probe timeout, made 2 to 32 of the 128
/// daemons miss the 3 s deadline on a busy 2-core host. In waves of 16 about 300 were
/// still dropped; in waves of 8, none, and every daemon answered, in 1.8 s.
const WAVE: usize = 8;
/// The next wave goes when the last one is answered, or after this long when it is slow:
/// daemons that do not answer (a remote rack that is down) send nothing that could
/// overflow the socket, and must not hold the others back for a whole timeout each.
const WAVE_GAP: Duration = Duration::from_millis(250);

/// Sends each request to its node, in waves of [`WAVE`], each with `timeout` from when it
/// is sent; the answers come back in order.
pub fn ask_all(
    client: &ControlClient,
    reqs: Vec<(NodeId, Request)>,
    timeout: Duration,
) -> Vec<std::result::Result<Response, ControlError>> {
    type Answers = Vec<std::result::Result<Response, ControlError>>;
    if reqs.len() <= WAVE {
        return client.request_all(reqs, timeout);
    }
    let waves: Vec<&[(NodeId, Request)]> = reqs.chunks(WAVE).collect();
    let mut done: Vec<Option<Answers>> = waves.iter().map(|_| None).collect();
    let (tx, rx) = mpsc::channel::<(usize, Answers)>();
    std::thread::scope(|s| {
        for (k, wave) in waves.iter().enumerate() {
            let tx = tx.clone();
            s.spawn(move || {
                let _ = tx.send((k, client.request_all(wave.to_vec(), timeout)));
            });
            let gap_ends = Instant::now() + WAVE_GAP;
            while done[k].is_none() {
                let left = gap_ends.saturating_duration_since(Instant::now());
                match rx.recv_timeout(left) {
                    Ok((i, answers)) => done[i] = Some(answers),
                    Err(_) => break,
                }
            }
        }
    });
    drop(tx);
    for (i, answers) in rx.try_iter() {
        done[i] = Some(answers);
    }
    let shape = client.rack().shape();
    done.into_iter()
        .zip(waves)
        .flat_map(|(answers, wave)| {
            // Every wave answers unless a request panicked, which `scope` re-raises.
            answers.unwrap_or_else(|| {
                wave.iter()
                    .map(|(id, _)| {
                        Err(ControlError::Unreachable {
                            node: shape.display(*id),
                            addr: client.rack().entry(*id).link.clone(),
                            message: "no answer".into(),
                        })
                    })
                    .collect()
            })
        })
        .collect()
}

/// Sends each request to its node ([`ask_all`]) and returns the answers in order; a node
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
    let mut answers = ask_all(client, asked, timeout).into_iter();
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
