//! Property tests of the encodings: GVAS, node names/ids/coordinates, cells and link frames.
//! Every encoding must round-trip, and every decoder must survive arbitrary input.

use bytes::{Bytes, BytesMut};
use proptest::prelude::*;

use exanet_proto::cell::{
    Cell, CellType, Engine, FLAG_FIRST, FLAG_LAST, FLAG_NOTIFY, MAX_CELL, MAX_PAYLOAD, OVERHEAD,
};
use exanet_proto::frame::{self, Frame, FrameDecoder, Hello};
use exanet_proto::gvas::{Gvas, GvasError, Pdid, GVAS_LEN};
use exanet_proto::model::{ModelTime, Stamp};
use exanet_proto::routing::Vc;
use exanet_proto::topology::Port;
use exanet_proto::{Coord, NameError, NodeId, NodeName, Shape};

const NODE_LIMIT: u32 = 1 << 22;
const VA_LIMIT: u64 = 1 << 39;

fn gvas_fields() -> impl Strategy<Value = (u16, u32, u8, u64)> {
    (any::<u16>(), 0..NODE_LIMIT, 0u8..8, 0..VA_LIMIT)
}

/// Any GVAS: every 80-bit pattern is one.
fn any_gvas() -> impl Strategy<Value = Gvas> {
    any::<[u8; GVAS_LEN]>().prop_map(Gvas::from_bytes)
}

fn any_cell() -> impl Strategy<Value = Cell> {
    (
        any_gvas(),
        proptest::sample::select(&CellType::ALL[..]),
        any::<u32>(),
        0..NODE_LIMIT,
        0u8..8,
        proptest::sample::subsequence(vec![FLAG_FIRST, FLAG_LAST, FLAG_NOTIFY], 0..=3),
        (any::<u16>(), proptest::sample::select(&Engine::ALL[..])),
        any::<u8>(),
        proptest::collection::vec(any::<u8>(), 0..=MAX_PAYLOAD),
    )
        .prop_map(
            |(dst, kind, txn, src, src_rank, flags, (seq, engine), aux, payload)| Cell {
                dst,
                kind,
                txn,
                src: NodeId(src),
                src_rank,
                flags: flags.into_iter().fold(0, |a, f| a | f),
                engine,
                seq,
                aux,
                payload: Bytes::from(payload),
                corrupt_crc: None,
                // The stamp travels in the framing, not in the cell's own bytes.
                stamp: Stamp::default(),
            },
        )
}

/// Small rack shapes: up to 26 slots, a few blades and groups.
fn small_shape() -> impl Strategy<Value = Shape> {
    (1u32..=26, 1u32..=6, 1u32..=5).prop_map(|(x, y, z)| Shape::new(x, y, z).unwrap())
}

fn any_port() -> impl Strategy<Value = Port> {
    (0usize..11).prop_map(|i| Port::from_index(i).unwrap())
}

fn any_frame() -> impl Strategy<Value = Frame> {
    prop_oneof![
        (
            any::<u32>(),
            any_port(),
            any::<(u16, u16, u16)>(),
            any::<u64>(),
            any::<[u32; 4]>(),
            any::<u8>()
        )
            .prop_map(|(node, port, shape, rack, grant, version)| {
                Frame::Hello(Hello {
                    version,
                    node: NodeId(node),
                    port,
                    shape,
                    rack,
                    grant,
                })
            }),
        (0u8..4, any_cell(), any::<u64>(), any::<u64>()).prop_map(|(vc, mut c, h, t)| {
            c.stamp = Stamp {
                head: ModelTime(h),
                tail: ModelTime(t),
            };
            Frame::Cell(Vc(vc), c)
        }),
        (0u8..4, any::<u32>(), any::<u64>()).prop_map(|(vc, n, t)| Frame::Credit(
            Vc(vc),
            n,
            ModelTime(t)
        )),
        any::<u64>().prop_map(Frame::Marker),
    ]
}

fn encode_frame(f: &Frame, out: &mut BytesMut) {
    match f {
        Frame::Hello(h) => frame::encode_hello(h, out),
        Frame::Cell(vc, c) => frame::encode_cell(*vc, c, out).unwrap(),
        Frame::Credit(vc, n, t) => frame::encode_credit(*vc, *n, *t, out),
        Frame::Marker(epoch) => frame::encode_marker(*epoch, out),
    }
}

/// Feeds `data` to a decoder in pieces cut at `cuts` and collects what comes out.
fn decode_in_pieces(data: &[u8], cuts: &[usize]) -> Vec<Result<Frame, frame::FrameError>> {
    let mut cuts: Vec<usize> = cuts.iter().map(|c| c % (data.len() + 1)).collect();
    cuts.push(0);
    cuts.push(data.len());
    cuts.sort_unstable();
    let mut d = FrameDecoder::new();
    let mut out = Vec::new();
    for w in cuts.windows(2) {
        d.push(&data[w[0]..w[1]]);
        while let Some(f) = d.next_frame() {
            out.push(f);
        }
    }
    out
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn gvas_fields_round_trip((pdid, node, rank, va) in gvas_fields()) {
        let g = Gvas::new(Pdid(pdid), NodeId(node), rank, va).unwrap();
        prop_assert_eq!(g.pdid(), Pdid(pdid));
        prop_assert_eq!(g.node(), NodeId(node));
        prop_assert_eq!(g.rank(), rank);
        prop_assert_eq!(g.va(), va);
        prop_assert_eq!(g.node_va(), (u64::from(rank) << 39) | va);
        // Bytes: 10 of them, big-endian, PDID first.
        let b = g.to_bytes();
        prop_assert_eq!(&b[..2], &pdid.to_be_bytes()[..]);
        prop_assert_eq!(Gvas::from_bytes(b), g);
        // Text, as displayed and with every field in hex.
        let text = g.to_string();
        prop_assert_eq!(text.parse::<Gvas>(), Ok(g));
        let hex = format!("{pdid:#x}:{node:#X}:{rank:#x}:{va:#x}");
        prop_assert_eq!(hex.parse::<Gvas>(), Ok(g));
        // Another VA keeps the rest.
        let g2 = g.with_va(va ^ 1).unwrap();
        prop_assert_eq!((g2.pdid(), g2.node(), g2.rank(), g2.va()), (g.pdid(), g.node(), g.rank(), va ^ 1));
    }

    #[test]
    fn every_80_bit_pattern_is_a_gvas(b in any::<[u8; GVAS_LEN]>()) {
        let g = Gvas::from_bytes(b);
        prop_assert_eq!(g.to_bytes(), b);
        prop_assert_eq!(Gvas::new(g.pdid(), g.node(), g.rank(), g.va()), Ok(g));
        prop_assert_eq!(g.to_string().parse::<Gvas>(), Ok(g));
    }

    #[test]
    fn out_of_range_gvas_fields_are_refused(
        node in NODE_LIMIT..=u32::MAX,
        rank in 8u8..,
        va in VA_LIMIT..=u64::MAX,
    ) {
        prop_assert_eq!(Gvas::new(Pdid(0), NodeId(node), 0, 0), Err(GvasError::Node(node)));
        prop_assert_eq!(Gvas::new(Pdid(0), NodeId(0), rank, 0), Err(GvasError::Rank(rank)));
        prop_assert_eq!(Gvas::new(Pdid(0), NodeId(0), 0, va), Err(GvasError::Va(va)));
        let text = format!("0:{node}:0:0");
        prop_assert!(text.parse::<Gvas>().is_err());
        let text = format!("0:0:0:{va}");
        prop_assert!(text.parse::<Gvas>().is_err());
    }

    #[test]
    fn gvas_parser_survives_any_text(s in "\\PC{0,40}", t in "[0-9a-fxX:+ -]{0,40}") {
        for text in [&s, &t] {
            if let Ok(g) = text.parse::<Gvas>() {
                // Whatever parses is canonical once displayed.
                prop_assert_eq!(g.to_string().parse::<Gvas>(), Ok(g));
            }
        }
    }

    #[test]
    fn node_names_ids_and_coords_round_trip(shape in small_shape(), pick in any::<u32>()) {
        prop_assert_eq!(shape.to_string().parse::<Shape>(), Ok(shape));
        let id = NodeId(pick % shape.nodes());
        let c = shape.coord(id).unwrap();
        // SPEC §2: id = ((z*Y + y)*X + x)*4 + (fpga-1).
        prop_assert_eq!(id.0, ((c.z * shape.y() + c.y) * shape.x() + c.x) * 4 + (c.fpga - 1));
        prop_assert!(c.x < shape.x() && c.y < shape.y() && c.z < shape.z());
        prop_assert!((1..=4).contains(&c.fpga));
        prop_assert_eq!(shape.id(c), Some(id));
        // SPEC §1: blade = z*Y + y + 1, slot letter = A + x.
        let n = shape.name(id).unwrap();
        prop_assert_eq!(n, NodeName { blade: c.z * shape.y() + c.y + 1, slot: c.x, fpga: c.fpga });
        let text = n.to_string();
        let slot = char::from(b'A' + c.x as u8);
        prop_assert_eq!(&text, &format!("M{}Q{}F{}", n.blade, slot, c.fpga));
        prop_assert_eq!(text.parse::<NodeName>(), Ok(n));
        prop_assert_eq!(shape.parse_node(&text), Ok(id));
        prop_assert_eq!(shape.parse_node(&text.to_lowercase()), Ok(id));
        prop_assert_eq!(shape.id_of(n), Ok(id));
        prop_assert_eq!(shape.display(id), text);
    }

    #[test]
    fn every_node_of_a_small_rack_has_its_own_name(shape in small_shape()) {
        let mut names = std::collections::HashSet::new();
        for id in shape.node_ids() {
            let text = shape.name(id).unwrap().to_string();
            prop_assert_eq!(shape.parse_node(&text), Ok(id));
            prop_assert!(names.insert(text));
        }
        // One past the end is no node, and neither is a name beyond the last blade or slot.
        let past = NodeId(shape.nodes());
        prop_assert!(shape.coord(past).is_err());
        prop_assert!(shape.name(past).is_err());
        let beyond_blade = format!("M{}QAF1", shape.blades() + 1);
        let is_out_of_rack = matches!(shape.parse_node(&beyond_blade), Err(NameError::OutOfRack { .. }));
        prop_assert!(is_out_of_rack);
        if shape.x() < 26 {
            let beyond_slot = format!("M1Q{}F1", char::from(b'A' + shape.x() as u8));
            let is_out_of_rack = matches!(shape.parse_node(&beyond_slot), Err(NameError::OutOfRack { .. }));
            prop_assert!(is_out_of_rack);
        }
        prop_assert_eq!(shape.id(Coord { x: shape.x(), y: 0, z: 0, fpga: 1 }), None);
        prop_assert_eq!(shape.id(Coord { x: 0, y: 0, z: 0, fpga: 5 }), None);
    }

    #[test]
    fn name_parser_survives_any_text(s in "\\PC{0,20}", t in "[mMqQfF0-9A-Za-z]{0,12}") {
        let shape = Shape::PROTOTYPE;
        for text in [&s, &t] {
            if let Ok(id) = shape.parse_node(text) {
                prop_assert_eq!(shape.parse_node(&shape.name(id).unwrap().to_string()), Ok(id));
            }
            let _ = text.parse::<Shape>();
        }
    }

    #[test]
    fn cells_round_trip(cell in any_cell()) {
        let wire = cell.to_bytes().unwrap();
        prop_assert_eq!(wire.len(), cell.wire_len());
        prop_assert_eq!(wire.len(), OVERHEAD + cell.payload.len());
        prop_assert_eq!(Cell::peek_len(&wire), Ok(Some(wire.len())));
        let back = Cell::decode(&wire).unwrap();
        prop_assert_eq!(&back, &cell);
        // Encoding appends: two cells back to back split where the first says it ends.
        let mut two = BytesMut::new();
        cell.encode(&mut two).unwrap();
        cell.encode(&mut two).unwrap();
        let two = two.freeze();
        let n = Cell::peek_len(&two).unwrap().unwrap();
        prop_assert_eq!(Cell::decode(&two.slice(..n)), Ok(cell.clone()));
        prop_assert_eq!(Cell::decode(&two.slice(n..)), Ok(cell));
    }

    #[test]
    fn decoding_arbitrary_bytes_never_panics(b in proptest::collection::vec(any::<u8>(), 0..400)) {
        let b = Bytes::from(b);
        let _ = Cell::peek_len(&b);
        if let Ok(c) = Cell::decode(&b) {
            // Whatever decodes re-encodes to exactly the same bytes.
            prop_assert_eq!(c.to_bytes().unwrap(), b);
        }
    }

    #[test]
    fn damaged_cells_never_panic_and_decode_canonically(
        cell in any_cell(),
        damage in proptest::collection::vec((any::<usize>(), any::<u8>()), 1..6),
        cut in any::<usize>(),
    ) {
        // Start from a valid cell so that the decoder gets past its first checks.
        let mut v = cell.to_bytes().unwrap().to_vec();
        for (at, x) in damage {
            let i = at % v.len();
            v[i] ^= x;
        }
        let cut = cut % (v.len() + 2);
        if cut <= v.len() {
            v.truncate(cut.max(v.len() / 2));
        }
        let b = Bytes::from(v);
        if let Ok(c) = Cell::decode(&b) {
            prop_assert_eq!(c.to_bytes().unwrap(), b);
        }
    }

    #[test]
    fn any_single_bit_flip_is_detected(cell in any_cell(), bit in any::<usize>()) {
        let mut v = cell.to_bytes().unwrap().to_vec();
        let bit = bit % (v.len() * 8);
        v[bit / 8] ^= 1 << (bit % 8);
        let r = Cell::decode(&Bytes::from(v));
        // Refused outright, or (a payload flip) decoded but marked corrupt.
        prop_assert!(
            r.as_ref().map_or(true, Cell::is_corrupt),
            "flip of bit {} of a {}-byte cell went unnoticed: {:?}", bit, cell.wire_len(), r
        );
    }

    #[test]
    fn frame_decoder_survives_arbitrary_chunks(
        chunks in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..64), 0..24),
    ) {
        let mut d = FrameDecoder::new();
        let mut fatal = false;
        for c in &chunks {
            d.push(c);
            while let Some(f) = d.next_frame() {
                prop_assert!(!fatal, "frames after a fatal error");
                if let Err(e) = f {
                    fatal |= e.is_fatal();
                }
            }
            if fatal {
                prop_assert_eq!(d.buffered(), 0);
            }
        }
    }

    #[test]
    fn frame_decoder_survives_damaged_streams(
        frames in proptest::collection::vec(any_frame(), 1..6),
        damage in proptest::collection::vec((any::<usize>(), any::<u8>()), 0..4),
        cuts in proptest::collection::vec(any::<usize>(), 0..8),
    ) {
        let mut out = BytesMut::new();
        for f in &frames {
            encode_frame(f, &mut out);
        }
        let mut v = out.to_vec();
        for (at, x) in damage {
            let i = at % v.len();
            v[i] ^= x;
        }
        for f in decode_in_pieces(&v, &cuts) {
            if let Ok(Frame::Cell(_, c)) = f {
                prop_assert!(c.wire_len() <= MAX_CELL);
            }
        }
    }

    #[test]
    fn frames_round_trip_in_any_pieces(
        frames in proptest::collection::vec(any_frame(), 0..8),
        cuts in proptest::collection::vec(any::<usize>(), 0..12),
    ) {
        let mut out = BytesMut::new();
        for f in &frames {
            encode_frame(f, &mut out);
        }
        let got: Vec<Frame> = decode_in_pieces(&out, &cuts)
            .into_iter()
            .collect::<Result<_, _>>()
            .unwrap();
        prop_assert_eq!(got, frames);
    }
}
