//! `exactl capture` and the Wireshark dissector, used as an operator would: captures of
//! both directions of one torus link while a workload sends RDMA writes (multi-cell, with
//! a completion notification), an RDMA read and packetizer messages across it, while the
//! link loses cells (so that blocks are answered `incomplete` with their bitmap) and then
//! flips bits (so that cells arrive corrupt and are answered with CRC NACKs); then real
//! `tshark` with the dissector `exactl dissector` prints reading the files.
//!
//! Every field the dissector shows is checked, row by row, against what the project's own
//! decoders make of the same record (`Record::decode`, `Cell::decode`, and the payload
//! layouts of ACKs, NACKs, read requests and notifications), and a field the dissector
//! shows where the cell has no such field is an error too: a byte read from the wrong
//! place, a bit of the wrong mask or a field on the wrong cell type cannot pass. The test
//! also checks that the captures hold every kind of cell it is about (data of both kinds,
//! multi-cell blocks, ACKs, NACKs with their reasons, notifications, read requests), so
//! that a check of an empty set cannot pass either.
//!
//! And capture files are private: mode 0600, also when the file existed before.

use std::collections::{BTreeMap, BTreeSet};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use exanet::Endpoint;
use exanet_proto::capture::{Direction, Record};
use exanet_proto::cell::{Cell, CellError, CellType, Engine, FLAG_FIRST, FLAG_LAST, FLAG_NOTIFY};
use exanet_proto::Shape;
use exanet_tests::{pattern, run_with_timeout, skip_unless_required, TestRack};

/// M1QAF2 -> M1QBF3 goes through M1QAF1 and the torus link to M1QBF1 (dimension order:
/// to the QFDB's F1, along X, then inside the far QFDB).
const SHAPE: &str = "2x1x1";
const FROM: &str = "M1QAF1";
const TO: &str = "M1QBF1";
const SRC: &str = "M1QAF2";
const DST: &str = "M1QBF3";

fn tshark() -> Option<PathBuf> {
    if exanet_tests::runs("tshark", "--version") {
        return Some(PathBuf::from("tshark"));
    }
    skip_unless_required(
        "EXANET_REQUIRE_TSHARK",
        "the capture dissector test",
        "no tshark (Debian: apt-get install tshark)",
    );
    None
}

/// The dissector as a user gets it: `exactl dissector`.
fn dissector_lua() -> String {
    let out = Command::new(exanet_tests::bins().exactl)
        .arg("dissector")
        .output()
        .unwrap();
    assert!(out.status.success(), "exactl dissector: {out:?}");
    String::from_utf8(out.stdout).unwrap()
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

/// Every field the dissector defines. The test reads the dissector's own list and
/// fails if it differs, so a field added there must be checked here.
const FIELDS: &[&str] = &[
    "exanet.capture.magic",
    "exanet.capture.version",
    "exanet.capture.direction",
    "exanet.capture.node",
    "exanet.capture.peer",
    "exanet.capture.port",
    "exanet.capture.vc",
    "exanet.capture.modeled_ps",
    "exanet.gvas",
    "exanet.pdid",
    "exanet.dst_node",
    "exanet.dst_rank",
    "exanet.va",
    "exanet.type",
    "exanet.type_name",
    "exanet.reserved",
    "exanet.len",
    "exanet.hcrc",
    "exanet.hcrc.status",
    "exanet.payload",
    "exanet.rdma",
    "exanet.block",
    "exanet.bitmap",
    "exanet.read.dst_va",
    "exanet.read.len",
    "exanet.notify.kind",
    "exanet.notify.status",
    "exanet.notify.txn",
    "exanet.notify.len",
    "exanet.txn",
    "exanet.src_node",
    "exanet.src_rank",
    "exanet.flags",
    "exanet.flags.first",
    "exanet.flags.last",
    "exanet.flags.notify",
    "exanet.engine",
    "exanet.seq",
    "exanet.aux",
    "exanet.cell_index",
    "exanet.nack_reason",
    "exanet.fcrc",
    "exanet.fcrc.status",
    "exanet.pcrc",
    "exanet.pcrc.status",
];

const BOOL_FIELDS: &[&str] = &[
    "exanet.rdma",
    "exanet.flags.first",
    "exanet.flags.last",
    "exanet.flags.notify",
];
const BYTES_FIELDS: &[&str] = &["exanet.gvas", "exanet.payload"];
const STRING_FIELDS: &[&str] = &["exanet.type_name"];

/// A field's value, in one form whatever tshark's display base (decimal or `0x..`, `1`
/// or `True`, hex bytes with or without colons).
#[derive(Clone, Debug, PartialEq, Eq)]
enum V {
    N(u64),
    B(bool),
    Bytes(String),
    S(String),
}

fn hex(b: &[u8]) -> V {
    V::Bytes(b.iter().map(|x| format!("{x:02x}")).collect())
}

/// Reads tshark's text for `field`; `None` for an absent field.
fn parse_shown(field: &str, text: &str) -> Option<V> {
    if text.is_empty() {
        return None;
    }
    Some(if BOOL_FIELDS.contains(&field) {
        match text {
            "1" | "True" | "true" => V::B(true),
            "0" | "False" | "false" => V::B(false),
            _ => panic!("{field}: not a boolean: {text:?}"),
        }
    } else if BYTES_FIELDS.contains(&field) {
        V::Bytes(text.replace(':', "").to_lowercase())
    } else if STRING_FIELDS.contains(&field) {
        V::S(text.to_string())
    } else {
        V::N(
            text.strip_prefix("0x")
                .map(|h| u64::from_str_radix(h, 16).ok())
                .unwrap_or_else(|| text.parse().ok())
                .unwrap_or_else(|| panic!("{field}: not a number: {text:?}")),
        )
    })
}

/// What the dissector must show for `rec`, field by field (`None`: the field must be
/// absent), from the project's decoders. A record whose cell the decoder refuses (a bit
/// flipped in its header or footer) has only its capture header and the verdict of the
/// CRC that failed here: the other fields of a damaged cell have no right value.
fn expected(rec: &Record) -> BTreeMap<&'static str, Option<V>> {
    let s = &rec.seen;
    let mut m: BTreeMap<&'static str, Option<V>> = BTreeMap::new();
    let mut n = |f: &'static str, v: u64| m.insert(f, Some(V::N(v)));
    n("exanet.capture.magic", 0x584E);
    n("exanet.capture.version", 1);
    n("exanet.capture.direction", s.direction as u64);
    n("exanet.capture.node", u64::from(s.node.0));
    n("exanet.capture.peer", u64::from(s.peer.0));
    n("exanet.capture.port", s.port.index() as u64);
    n("exanet.capture.vc", u64::from(s.vc.0));
    n("exanet.capture.modeled_ps", s.modeled.0);
    let c = match Cell::decode(&bytes::Bytes::from(rec.cell.clone())) {
        Ok(c) => c,
        Err(CellError::HeaderCrc { .. }) => {
            m.insert("exanet.hcrc.status", Some(V::N(2)));
            return m;
        }
        Err(CellError::FooterCrc { .. }) => {
            m.insert("exanet.hcrc.status", Some(V::N(1)));
            m.insert("exanet.fcrc.status", Some(V::N(2)));
            return m;
        }
        Err(e) => panic!(
            "a captured cell fails otherwise than by a CRC: {e}: {:02x?}",
            rec.cell
        ),
    };
    // The project's encoder gives the same bytes back (decoding loses nothing), so the
    // CRCs below are the ones the project computes.
    let wire = c.to_bytes().unwrap();
    assert_eq!(
        &wire[..],
        &rec.cell[..],
        "decode and encode are not inverse"
    );
    let len = c.payload.len();
    let ft = 16 + len;
    let u16_at = |i: usize| u64::from(u16::from_be_bytes([wire[i], wire[i + 1]]));
    let u32_at = |i: usize| u64::from(u32::from_be_bytes(wire[i..i + 4].try_into().unwrap()));
    let p = &c.payload[..];
    let p64 = |i: usize| u64::from_be_bytes(p[i..i + 8].try_into().unwrap());
    let rdma = c.engine == Engine::Rdma;
    let some_n = |v: u64| Some(V::N(v));
    let fields: [(&'static str, Option<V>); 37] = [
        ("exanet.gvas", Some(hex(&c.dst.to_bytes()))),
        ("exanet.pdid", some_n(u64::from(c.dst.pdid().0))),
        ("exanet.dst_node", some_n(u64::from(c.dst.node().0))),
        ("exanet.dst_rank", some_n(u64::from(c.dst.rank()))),
        ("exanet.va", some_n(c.dst.va())),
        ("exanet.type", some_n(c.kind as u64)),
        ("exanet.type_name", Some(V::S(c.kind.label().to_string()))),
        ("exanet.reserved", some_n(0)),
        ("exanet.len", some_n(len as u64)),
        ("exanet.hcrc", some_n(u16_at(14))),
        ("exanet.hcrc.status", some_n(1)),
        ("exanet.payload", (len > 0).then(|| hex(p))),
        ("exanet.rdma", Some(V::B(rdma))),
        // Answers to RDMA cells carry the block they answer (ni/rdma/mod.rs); an
        // `incomplete` NACK then the bitmap of the block's cells that arrived.
        (
            "exanet.block",
            (matches!(c.kind, CellType::Ack | CellType::Nack) && len >= 8).then(|| V::N(p64(0))),
        ),
        (
            "exanet.bitmap",
            (c.kind == CellType::Nack && c.aux == 7 && len >= 16).then(|| V::N(p64(8))),
        ),
        // A read request: where the data goes in the reader's memory, how much.
        (
            "exanet.read.dst_va",
            (c.kind == CellType::ReadRequest && len >= 16).then(|| V::N(p64(0))),
        ),
        (
            "exanet.read.len",
            (c.kind == CellType::ReadRequest && len >= 16).then(|| V::N(p64(8))),
        ),
        // A notification: kind, status, two zero bytes, txn (u32), length (u64).
        (
            "exanet.notify.kind",
            (c.kind == CellType::Notify && len == 16).then(|| V::N(u64::from(p[0]))),
        ),
        (
            "exanet.notify.status",
            (c.kind == CellType::Notify && len == 16).then(|| V::N(u64::from(p[1]))),
        ),
        (
            "exanet.notify.txn",
            (c.kind == CellType::Notify && len == 16)
                .then(|| V::N(u64::from(u32::from_be_bytes(p[4..8].try_into().unwrap())))),
        ),
        (
            "exanet.notify.len",
            (c.kind == CellType::Notify && len == 16).then(|| V::N(p64(8))),
        ),
        ("exanet.txn", some_n(u64::from(c.txn))),
        ("exanet.src_node", some_n(u64::from(c.src.0))),
        ("exanet.src_rank", some_n(u64::from(c.src_rank))),
        ("exanet.flags", some_n(u64::from(c.flags))),
        ("exanet.flags.first", Some(V::B(c.flags & FLAG_FIRST != 0))),
        ("exanet.flags.last", Some(V::B(c.flags & FLAG_LAST != 0))),
        (
            "exanet.flags.notify",
            Some(V::B(c.flags & FLAG_NOTIFY != 0)),
        ),
        ("exanet.engine", some_n(u64::from(c.engine.code()))),
        ("exanet.seq", some_n(u64::from(c.seq))),
        ("exanet.aux", some_n(u64::from(c.aux))),
        (
            "exanet.cell_index",
            (c.kind == CellType::Write && rdma).then(|| V::N(u64::from(c.aux))),
        ),
        (
            "exanet.nack_reason",
            (c.kind == CellType::Nack).then(|| V::N(u64::from(c.aux))),
        ),
        ("exanet.fcrc", some_n(u64::from(wire[ft + 11]))),
        ("exanet.fcrc.status", some_n(1)),
        ("exanet.pcrc", some_n(u32_at(ft + 12))),
        (
            "exanet.pcrc.status",
            some_n(if c.corrupt_crc.is_some() { 2 } else { 1 }),
        ),
    ];
    m.extend(fields);
    assert_eq!(m.len(), FIELDS.len(), "a field without an expectation");
    m
}

/// The fields the dissector defines, read from its source.
fn dissector_fields(lua: &str) -> BTreeSet<String> {
    lua.split("ProtoField.")
        .skip(1)
        .filter_map(|t| t.split_once("(\"").and_then(|(_, r)| r.split_once('"')))
        .map(|(name, _)| name.to_string())
        .collect()
}

/// tshark through the dissector, every field of every packet of `file`.
fn dissect(tshark: &Path, lua: &Path, file: &Path) -> Vec<BTreeMap<&'static str, Option<V>>> {
    let mut cmd = Command::new(tshark);
    cmd.arg("-X")
        .arg(format!("lua_script:{}", lua.display()))
        .arg("-r")
        .arg(file)
        .args(["-T", "fields", "-E", "separator=|", "-E", "occurrence=f"]);
    for f in FIELDS {
        cmd.args(["-e", f]);
    }
    let t = run_with_timeout(cmd, Duration::from_secs(120)).unwrap();
    assert!(t.success(), "tshark: {}", t.describe());
    t.stdout
        .lines()
        .map(|l| {
            let cols: Vec<&str> = l.split('|').collect();
            assert_eq!(cols.len(), FIELDS.len(), "a row of tshark: {l:?}");
            FIELDS
                .iter()
                .zip(cols)
                .map(|(&f, text)| (f, parse_shown(f, text)))
                .collect()
        })
        .collect()
}

/// Checks every row tshark shows for `file` against the project's reading of the same
/// record; returns how many records the decoder refused (each flagged by the dissector).
fn check_file(tshark: &Path, lua: &Path, file: &Path) -> usize {
    let recs = records(file);
    let rows = dissect(tshark, lua, file);
    assert_eq!(
        rows.len(),
        recs.len(),
        "tshark shows every captured cell of {}",
        file.display()
    );
    let mut refused = 0;
    let mut wrong = Vec::new();
    for (i, (row, rec)) in rows.iter().zip(&recs).enumerate() {
        let want = expected(rec);
        if want.len() < FIELDS.len() {
            refused += 1;
        }
        for (f, w) in &want {
            if row[f] != *w {
                wrong.push(format!(
                    "{} packet {}: {f}: tshark shows {:?}, the cell has {w:?} (cell {:02x?})",
                    file.display(),
                    i + 1,
                    row[f],
                    rec.cell
                ));
            }
        }
    }
    assert!(
        wrong.is_empty(),
        "{} field(s) differ:\n{}",
        wrong.len(),
        wrong[..wrong.len().min(40)].join("\n")
    );
    refused
}

/// The kinds of cell a set of records holds, as the coverage check names them.
fn kinds(recs: &[Record]) -> BTreeSet<&'static str> {
    let mut out = BTreeSet::new();
    let mut cells_per_txn: BTreeMap<u32, (usize, bool, bool)> = BTreeMap::new();
    for r in recs {
        let Ok(c) = Cell::decode_strict(&bytes::Bytes::from(r.cell.clone())) else {
            continue;
        };
        let rdma = c.engine == Engine::Rdma;
        let p = &c.payload;
        let k = match c.kind {
            CellType::Write if rdma => {
                let e = cells_per_txn.entry(c.txn).or_default();
                e.0 += 1;
                e.1 |= c.flags & FLAG_FIRST != 0;
                e.2 |= c.flags & FLAG_LAST != 0;
                "an RDMA write cell"
            }
            CellType::Write => "a packetizer message",
            CellType::ReadRequest => "a read request",
            CellType::Notify if p.len() == 16 && p[0] == 1 => "a write-done notification",
            CellType::Notify if p.len() == 16 && p[0] == 2 => "a read-done notification",
            CellType::Ack if p.len() == 8 && p[..] == [0xFF; 8] => "the ACK of a notification",
            CellType::Ack if p.len() == 8 => "the ACK of an RDMA block",
            CellType::Ack if p.is_empty() => "the ACK of a message",
            CellType::Nack if c.aux == 3 => "a CRC NACK",
            CellType::Nack if c.aux == 7 && p.len() == 16 => "an incomplete NACK with its bitmap",
            _ => "another cell",
        };
        out.insert(k);
    }
    if cells_per_txn
        .values()
        .any(|&(n, first, last)| n >= 4 && first && last)
    {
        out.insert("a multi-cell RDMA block with its first and last cells");
    }
    out
}

fn mode(p: &Path) -> u32 {
    std::fs::metadata(p).unwrap().permissions().mode() & 0o7777
}

#[test]
fn every_field_of_every_captured_cell_reads_in_tshark_as_the_decoder_reads_it() {
    let Some(tshark) = tshark() else { return };
    let lua_text = dissector_lua();
    let defined = dissector_fields(&lua_text);
    let checked: BTreeSet<String> = FIELDS.iter().map(|f| f.to_string()).collect();
    assert_eq!(
        defined, checked,
        "the dissector's fields and the fields this test checks differ"
    );
    let rack = TestRack::new("cap");
    rack.up(SHAPE, 60);
    let lua = rack.dir.join("exanet.lua");
    std::fs::write(&lua, &lua_text).unwrap();
    let shape: Shape = SHAPE.parse().unwrap();
    let id = |n: &str| shape.parse_node(n).unwrap().0;
    // Both directions of the torus link: the data goes FROM -> TO, the answers back.
    let file = rack.dir.join("link.pcapng");
    let back_file = rack.dir.join("back.pcapng");
    let cap = start_capture(
        &rack,
        &file,
        &["--link", FROM, TO, "--duration", "180"],
        TO,
        1,
    );
    let back_cap = start_capture(
        &rack,
        &back_file,
        &["--link", TO, FROM, "--duration", "180"],
        FROM,
        1,
    );

    // Ranks whose three bits differ (0b101, 0b110), so that a rank bit the dissector
    // takes from the wrong place shows.
    let attach = |node: &str, rank: u8| {
        Endpoint::attach_with(&exanet::Config {
            rack_dir: Some(rack.dir.clone()),
            node: Some(node.into()),
            rank: Some(rank),
            ..exanet::Config::default()
        })
        .unwrap()
    };
    let (a, b) = (attach(SRC, 5), attach(DST, 6));
    let wait = Some(Duration::from_secs(60));
    const NOTE: u64 = 64 << 10;
    let src = a.register(64 << 10).unwrap();
    let back = a.register(4096).unwrap();
    let dst = b.register(NOTE + 4096).unwrap();
    let page = a.rdma_page().unwrap();
    let rdma_write = |seed: u64, at: u64, len: u64, notify: Option<u64>| {
        let data = pattern(seed, len as usize);
        src.write(at, &data).unwrap();
        let tag = page
            .write(0, &src, at, dst.gvas(at).unwrap(), len, notify)
            .unwrap();
        (tag, at, data)
    };
    let landed = |(tag, at, data): (exanet::Tag, u64, Vec<u8>)| {
        a.wait(tag, wait).unwrap();
        assert_eq!(dst.to_vec(at, data.len() as u64).unwrap(), data);
    };
    // An RDMA write of four full cells, with a completion notification.
    landed(rdma_write(1, 0, 1024, Some(dst.va() + NOTE)));
    let note = dst.to_vec(NOTE, 16).unwrap();
    assert_eq!(
        (note[0], u64::from_be_bytes(note[8..16].try_into().unwrap())),
        (1, 1024),
        "the write-done notification: {note:02x?}"
    );
    // An RDMA read of half of it back: a read request out, data and "read done" back.
    let tag = page.read(0, dst.gvas(0).unwrap(), &back, 0, 512).unwrap();
    a.wait(tag, wait).unwrap();
    assert_eq!(back.to_vec(0, 512).unwrap(), dst.to_vec(0, 512).unwrap());
    // A packetizer message.
    let tx = a.packetizer().unwrap();
    let inbox = b.mailbox(16).unwrap();
    let inbox_addr = a.mailbox_addr(b.node_id(), b.rank(), inbox.vi()).unwrap();
    let tag = tx.send(0, inbox_addr, b"captured message").unwrap();
    a.wait(tag, wait).unwrap();
    // Cells lost on the way: a block whose last cell arrives without some of the others
    // is answered `incomplete` with the bitmap of what arrived.
    let r = rack.exactl(&["link", "set", FROM, TO, "--dir", "A-B", "--loss", "25%"]);
    assert!(r.success(), "link set: {}", r.describe());
    for i in 0..8 {
        landed(rdma_write(10 + i, 4096 * i, 4096, None));
    }
    let r = rack.exactl(&["link", "clear", FROM, TO]);
    assert!(r.success(), "link clear: {}", r.describe());
    // Bits flipped on the wire: what is sent while every cell is corrupted arrives bad,
    // the destination answers CRC NACKs, and all is recovered once the link is clean.
    let r = rack.exactl(&["link", "set", FROM, TO, "--dir", "A-B", "--corrupt", "100%"]);
    assert!(r.success(), "link set: {}", r.describe());
    let corrupted_write = rdma_write(20, 32 << 10, 1024, None);
    let tags: Vec<_> = (0..3)
        .map(|i| tx.send(1 + i, inbox_addr, b"through corruption").unwrap())
        .collect();
    std::thread::sleep(Duration::from_millis(300));
    let r = rack.exactl(&["link", "clear", FROM, TO]);
    assert!(r.success(), "link clear: {}", r.describe());
    for t in tags {
        a.wait(t, wait).unwrap();
    }
    landed(corrupted_write);

    // Ctrl-C ends a capture: the file is complete and the summary printed.
    let mut all = Vec::new();
    for (cap, file) in [(cap, &file), (back_cap, &back_file)] {
        interrupt(&cap);
        let out = cap.wait_with_output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "exactl capture: {stderr}");
        let recs = records(file);
        assert!(
            stderr.contains(&format!("captured {} cell(s)", recs.len())),
            "the summary counts what {} holds ({}): {stderr}",
            file.display(),
            recs.len()
        );
        // Every job's payloads are in there: only the operator reads the file.
        assert_eq!(mode(file), 0o600, "{}", file.display());
        all.push(recs);
    }
    let (recs, back_recs) = (&all[0], &all[1]);
    for (r, (node, peer)) in recs
        .iter()
        .map(|r| (r, (TO, FROM)))
        .chain(back_recs.iter().map(|r| (r, (FROM, TO))))
    {
        assert_eq!(r.seen.direction, Direction::Received);
        assert_eq!((r.seen.node.0, r.seen.peer.0), (id(node), id(peer)));
    }

    // What the project's decoder makes of the captured cells.
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
        .filter(|c| ours(c) && c.engine == Engine::Rdma)
        .count();
    let messages = decoded
        .iter()
        .flatten()
        .filter(|c| ours(c) && c.engine == Engine::Packetizer)
        .count();
    assert!(
        rdma >= 4 + 8 * 16 + 4,
        "the cells of the RDMA writes, got {rdma}"
    );
    assert!(
        messages >= 4,
        "the message and its three corrupt-then-resent fellows, got {messages}"
    );
    let corrupt = decoded.iter().filter(|c| c.is_none()).count();
    assert!(corrupt > 0, "the corrupt burst left bad cells on the wire");
    let mut seen = kinds(recs);
    seen.extend(kinds(back_recs));
    let want = [
        "an RDMA write cell",
        "a multi-cell RDMA block with its first and last cells",
        "a packetizer message",
        "a read request",
        "a write-done notification",
        "a read-done notification",
        "the ACK of an RDMA block",
        "the ACK of a notification",
        "the ACK of a message",
        "a CRC NACK",
        "an incomplete NACK with its bitmap",
    ];
    for k in want {
        assert!(seen.contains(k), "no {k} was captured: {seen:?}");
    }

    // tshark, through the dissector, every field of every row.
    let refused = check_file(&tshark, &lua, &file);
    assert!(refused > 0, "no damaged cell was read by the dissector");
    check_file(&tshark, &lua, &back_file);

    // The same capture over the QUIC control API (what a rack on other hosts uses; the
    // local one above went through the daemon's control socket): one write, then it ends.
    // Into a file that was there, readable by all: it is made private before it is
    // emptied and written.
    let quic_file = rack.dir.join("quic.pcapng");
    std::fs::write(&quic_file, b"an older capture").unwrap();
    std::fs::set_permissions(&quic_file, std::fs::Permissions::from_mode(0o644)).unwrap();
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
    assert_eq!(mode(&quic_file), 0o600);
    check_file(&tshark, &lua, &quic_file);

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
        2,
    );
    let (rec, c) = one_message_captured(cap, &tx_file, || {
        let tag = tx.send(0, inbox_addr, b"forwarded").unwrap();
        a.wait(tag, wait).unwrap();
    });
    assert_eq!(rec.seen.direction, Direction::Sent);
    assert_eq!((rec.seen.node.0, rec.seen.peer.0), (id(FROM), id(TO)));
    assert!(ours(&c) && c.payload.as_ref() == b"forwarded", "{c:?}");
    check_file(&tshark, &lua, &tx_file);

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
        "captured {} + {} cells: {rdma} RDMA write cells, {messages} packetizer cells, \
         {corrupt} corrupt (flagged by the dissector); kinds: {seen:?}",
        recs.len(),
        back_recs.len()
    );
    drop((a, b));
}
