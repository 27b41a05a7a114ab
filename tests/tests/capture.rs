//! `exactl capture` and the Wireshark dissector, used as an operator would: a capture of
//! one torus link direction while a workload sends an RDMA write and a packetizer message
//! across it (and a burst of corruption flips bits on the wire), then real `tshark` with
//! `wireshark/exanet.lua` reading the file.
//!
//! The dissector is checked field by field against the project's own cell decoder over
//! every captured cell, so that a byte it reads from the wrong place cannot pass.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use exanet::Endpoint;
use exanet_proto::capture::{Direction, Record};
use exanet_proto::cell::{Cell, CellType};
use exanet_proto::Shape;
use exanet_tests::{run_with_timeout, TestRack};

/// M1QAF2 -> M1QBF3 goes through M1QAF1 and the torus link to M1QBF1 (dimension order:
/// to the QFDB's F1, along X, then inside the far QFDB).
const SHAPE: &str = "2x1x1";
const FROM: &str = "M1QAF1";
const TO: &str = "M1QBF1";
const SRC: &str = "M1QAF2";
const DST: &str = "M1QBF3";

fn tshark() -> Option<PathBuf> {
    let found = Command::new("tshark")
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if found {
        return Some(PathBuf::from("tshark"));
    }
    if std::env::var("EXANET_REQUIRE_TSHARK").is_ok_and(|v| v == "1") {
        panic!("EXANET_REQUIRE_TSHARK=1 but tshark is missing (apt-get install tshark)");
    }
    eprintln!("\n*** SKIPPED: capture dissector test: no tshark (Debian: tshark) ***\n");
    None
}

fn dissector() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .join("wireshark/exanet.lua")
}

/// Every record of a pcapng file, in order.
fn records(path: &Path) -> Vec<Record> {
    use pcap_file::pcapng::{Block, PcapNgReader};
    let mut r = PcapNgReader::new(std::fs::File::open(path).unwrap()).unwrap();
    let mut out = Vec::new();
    while let Some(b) = r.next_block() {
        if let Block::EnhancedPacket(p) = b.unwrap() {
            out.push(Record::decode(&p.data).unwrap());
        }
    }
    out
}

/// Starts `exactl capture ARGS -w FILE` and waits until the daemon of `at` has logged
/// its `nth` capture start.
fn start_capture(
    rack: &TestRack,
    file: &Path,
    args: &[&str],
    at: &str,
    nth: usize,
) -> std::process::Child {
    let mut all = vec!["capture"];
    all.extend_from_slice(args);
    all.extend(["-w", file.to_str().unwrap()]);
    let mut cap = rack
        .command(&all)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    wait_for_log(rack, at, "capture started", nth, Some(&mut cap));
    cap
}

/// Waits until `node`'s daemon log holds `what` `n` times (while `child` runs, if given).
fn wait_for_log(
    rack: &TestRack,
    node: &str,
    what: &str,
    n: usize,
    mut child: Option<&mut std::process::Child>,
) {
    let log = rack.dir.join("logs").join(format!("{node}.log"));
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        if text.matches(what).count() >= n {
            return;
        }
        if let Some(Ok(Some(st))) = child.as_mut().map(|c| c.try_wait()) {
            panic!("exactl capture exited before {node} logged {what:?}: {st}");
        }
        assert!(
            Instant::now() < deadline,
            "{node} never logged {what:?} {n} times"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Runs `send` while a `--count 1` capture into `file` runs, and returns the one record
/// it took, with its cell (which must be sound).
fn one_message_captured(
    cap: std::process::Child,
    file: &Path,
    send: impl FnOnce(),
) -> (Record, Cell) {
    send();
    let out = cap.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mut got = records(file);
    assert_eq!(got.len(), 1, "--count 1");
    let rec = got.remove(0);
    let cell = Cell::decode_strict(&bytes::Bytes::from(rec.cell.clone())).unwrap();
    (rec, cell)
}

fn interrupt(cap: &std::process::Child) {
    let st = Command::new("kill")
        .args(["-INT", &cap.id().to_string()])
        .status()
        .unwrap();
    assert!(st.success());
}

#[test]
fn a_captured_rdma_write_and_message_read_by_tshark_match_the_cells_and_a_corrupt_one_is_flagged() {
    let Some(tshark) = tshark() else { return };
    let rack = TestRack::new("cap");
    rack.up(SHAPE, 60);
    let shape: Shape = SHAPE.parse().unwrap();
    let id = |n: &str| shape.parse_node(n).unwrap().0;
    let file = rack.dir.join("link.pcapng");

    let cap = start_capture(
        &rack,
        &file,
        &["--link", FROM, TO, "--duration", "120"],
        TO,
        1,
    );

    let a = Endpoint::attach_to(&rack.dir, SRC, None).unwrap();
    let b = Endpoint::attach_to(&rack.dir, DST, None).unwrap();
    let wait = Some(Duration::from_secs(30));
    // An RDMA write of four full cells.
    let src = a.register(4096).unwrap();
    let dst = b.register(4096).unwrap();
    let data: Vec<u8> = (0..1024u32).map(|i| (i * 7 + 3) as u8).collect();
    src.write(0, &data).unwrap();
    let page = a.rdma_page().unwrap();
    let tag = page
        .write(0, &src, 0, dst.gvas(0).unwrap(), 1024, None)
        .unwrap();
    a.wait(tag, wait).unwrap();
    assert_eq!(dst.to_vec(0, 1024).unwrap(), data);
    // A packetizer message.
    let tx = a.packetizer().unwrap();
    let inbox = b.mailbox(16).unwrap();
    let inbox_addr = a.mailbox_addr(b.node_id(), b.rank(), inbox.vi()).unwrap();
    let tag = tx.send(0, inbox_addr, b"captured message").unwrap();
    a.wait(tag, wait).unwrap();
    // Bits flipped on the wire: messages sent while every cell is corrupted arrive bad
    // (and are recovered once the link is clean again).
    let r = rack.exactl(&["link", "set", FROM, TO, "--dir", "A-B", "--corrupt", "100%"]);
    assert!(r.success(), "link set: {}", r.describe());
    let tags: Vec<_> = (0..3)
        .map(|i| tx.send(1 + i, inbox_addr, b"through corruption").unwrap())
        .collect();
    std::thread::sleep(Duration::from_millis(300));
    let r = rack.exactl(&["link", "clear", FROM, TO]);
    assert!(r.success(), "link clear: {}", r.describe());
    for t in tags {
        a.wait(t, Some(Duration::from_secs(60))).unwrap();
    }

    // Ctrl-C ends a capture: the file is complete and the summary printed.
    interrupt(&cap);
    let out = cap.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "exactl capture: {stderr}");
    let recs = records(&file);
    assert!(
        stderr.contains(&format!("captured {} cell(s)", recs.len())),
        "the summary counts what the file holds ({}): {stderr}",
        recs.len()
    );

    // What the project's decoder makes of every captured cell.
    for r in &recs {
        assert_eq!(r.seen.direction, Direction::Received);
        assert_eq!((r.seen.node.0, r.seen.peer.0), (id(TO), id(FROM)));
    }
    let decoded: Vec<Option<Cell>> = recs
        .iter()
        .map(|r| Cell::decode_strict(&bytes::Bytes::from(r.cell.clone())).ok())
        .collect();
    let ours = |c: &Cell| {
        c.src.0 == id(SRC)
            && c.dst.node().0 == id(DST)
            && c.dst.pdid() == a.pdid()
            && c.kind == CellType::Write
    };
    let rdma = decoded
        .iter()
        .flatten()
        .filter(|c| ours(c) && c.txn & (1 << 31) != 0)
        .count();
    let messages = decoded
        .iter()
        .flatten()
        .filter(|c| ours(c) && c.txn & (1 << 31) == 0)
        .count();
    assert!(rdma >= 4, "the 4 cells of the RDMA write, got {rdma}");
    assert!(
        messages >= 4,
        "the message and its three corrupt-then-resent fellows, got {messages}"
    );
    let corrupt = decoded.iter().filter(|c| c.is_none()).count();
    assert!(corrupt > 0, "the corrupt burst left bad cells on the wire");

    // tshark, through the dissector, row by row.
    let fields = [
        "exanet.capture.direction",
        "exanet.capture.node",
        "exanet.capture.peer",
        "exanet.type",
        "exanet.pdid",
        "exanet.src_node",
        "exanet.dst_node",
        "exanet.seq",
        "exanet.txn",
        "exanet.len",
        "exanet.rdma",
        "exanet.hcrc.status",
        "exanet.fcrc.status",
        "exanet.pcrc.status",
    ];
    let mut cmd = Command::new(&tshark);
    cmd.arg("-X")
        .arg(format!("lua_script:{}", dissector().display()))
        .arg("-r")
        .arg(&file)
        .args(["-T", "fields", "-E", "separator=|", "-E", "occurrence=f"]);
    for f in fields {
        cmd.args(["-e", f]);
    }
    let t = run_with_timeout(cmd, Duration::from_secs(60)).unwrap();
    assert!(t.success(), "tshark: {}", t.describe());
    let rows: Vec<HashMap<&str, &str>> = t
        .stdout
        .lines()
        .map(|l| fields.iter().copied().zip(l.split('|')).collect())
        .collect();
    assert_eq!(rows.len(), recs.len(), "tshark shows every captured cell");
    let num = |s: &str| -> u64 {
        s.strip_prefix("0x")
            .map(|h| u64::from_str_radix(h, 16).unwrap())
            .unwrap_or_else(|| s.parse().unwrap_or_else(|_| panic!("not a number: {s:?}")))
    };
    let mut flagged = 0;
    for (i, (row, (rec, cell))) in rows.iter().zip(recs.iter().zip(&decoded)).enumerate() {
        let at = format!("packet {}: {row:?}", i + 1);
        assert_eq!(num(row["exanet.capture.direction"]), 0, "{at}");
        assert_eq!(num(row["exanet.capture.node"]), u64::from(id(TO)), "{at}");
        assert_eq!(num(row["exanet.capture.peer"]), u64::from(id(FROM)), "{at}");
        let crcs = [
            row["exanet.hcrc.status"],
            row["exanet.fcrc.status"],
            row["exanet.pcrc.status"],
        ];
        match cell {
            Some(c) => {
                assert_eq!(crcs, ["1", "1", "1"], "a sound cell's CRCs are good: {at}");
                assert_eq!(num(row["exanet.type"]), c.kind as u64, "{at}");
                assert_eq!(num(row["exanet.pdid"]), u64::from(c.dst.pdid().0), "{at}");
                assert_eq!(num(row["exanet.src_node"]), u64::from(c.src.0), "{at}");
                assert_eq!(
                    num(row["exanet.dst_node"]),
                    u64::from(c.dst.node().0),
                    "{at}"
                );
                assert_eq!(num(row["exanet.seq"]), u64::from(c.seq), "{at}");
                assert_eq!(num(row["exanet.txn"]), u64::from(c.txn), "{at}");
                assert_eq!(num(row["exanet.len"]), c.payload.len() as u64, "{at}");
                let rdma = matches!(row["exanet.rdma"], "1" | "True");
                assert_eq!(rdma, c.txn & (1 << 31) != 0, "{at}");
            }
            None => {
                assert!(
                    crcs.contains(&"2"),
                    "a cell the decoder refuses has a bad CRC in the dissector: {at}, {:02x?}",
                    rec.cell
                );
                flagged += 1;
            }
        }
    }
    assert_eq!(flagged, corrupt);

    // The same capture over the QUIC control API (what a rack on other hosts uses; the
    // local one above went through the daemon's control socket): one write, then it ends.
    let quic_file = rack.dir.join("quic.pcapng");
    let cap = start_capture(
        &rack,
        &quic_file,
        &[
            "--link", FROM, TO, "--via", "quic", "--type", "write", "--count", "1",
        ],
        TO,
        2,
    );
    let (_, c) = one_message_captured(cap, &quic_file, || {
        let tag = tx.send(0, inbox_addr, b"over quic").unwrap();
        a.wait(tag, wait).unwrap();
    });
    assert!(ours(&c) && c.payload.as_ref() == b"over quic", "{c:?}");

    // Cells a node sends: M1QAF1 forwards the message onto the torus link.
    let tx_file = rack.dir.join("tx.pcapng");
    let cap = start_capture(
        &rack,
        &tx_file,
        &[
            "--node",
            FROM,
            "--direction",
            "tx",
            "--type",
            "write",
            "--count",
            "1",
        ],
        FROM,
        1,
    );
    let (rec, c) = one_message_captured(cap, &tx_file, || {
        let tag = tx.send(0, inbox_addr, b"forwarded").unwrap();
        a.wait(tag, wait).unwrap();
    });
    assert_eq!(rec.seen.direction, Direction::Sent);
    assert_eq!((rec.seen.node.0, rec.seen.peer.0), (id(FROM), id(TO)));
    assert!(ours(&c) && c.payload.as_ref() == b"forwarded", "{c:?}");

    // A capture that matches nothing writes nothing, and still ends when its operator
    // goes away (its tap must not stay behind, taxing the links).
    for (via, nth) in [("socket", 3), ("quic", 4)] {
        let idle = start_capture(
            &rack,
            &rack.dir.join("idle.pcapng"),
            &["--link", FROM, TO, "--via", via, "--dst", "M1QAF4"],
            TO,
            nth,
        );
        interrupt(&idle);
        let out = idle.wait_with_output().unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        wait_for_log(&rack, TO, "capture over: the operator left", nth - 2, None);
    }
    eprintln!(
        "captured {} cells: {rdma} RDMA write cells, {messages} packetizer cells, {corrupt} corrupt (flagged by the dissector)",
        recs.len()
    );
    drop((a, b));
}
