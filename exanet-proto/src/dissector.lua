-- Wireshark dissector for ExaNet cells captured by `exactl capture` (pcapng, link type
-- USER0 = 147). This is the template `exanet_proto::capture::dissector` renders, with the
-- tables of wire codes (cell types, NACK reasons, engines) filled in from the Rust
-- declarations, so that a dissector always names the codes of the build that wrote the
-- capture. Get it from exactl and load it with
--
--     exactl dissector > exanet.lua
--     wireshark -X lua_script:exanet.lua capture.pcapng
--     tshark -X lua_script:exanet.lua -r capture.pcapng -V
--
-- or write it into Wireshark's personal plugins folder. docs/capture.md documents every
-- field. Each packet is:
--
--   capture header (24 B): magic "XN", version, direction, capturing node, peer node,
--                          port, VC, reserved, modeled time in picoseconds (u64)
--   cell header    (16 B): destination GVAS (PDID 16 / node 22 / rank 3 / VA 39), type,
--                          reserved, payload length, CRC-16/IBM-3740 over bytes 0..14
--   payload   (0..256 B)
--   cell footer    (16 B): transaction id, source node (24 bits), rank/flags/engine, sequence
--                          number, aux (cell index or NACK reason), CRC-8/SMBUS over the
--                          footer without its own byte, CRC-32 (IEEE) over the payload
--
-- All integers are big-endian. The CRCs are verified: a bad one is flagged in the tree
-- (field *.status = "Bad") and as an expert warning.

local exanet = Proto("exanet", "ExaNet cell")

-- Bit operations that work in the Lua of every Wireshark: 5.2 (bit32), LuaJIT/BitOp
-- builds (bit), 5.3+ (native operators).
local bxor, band, shr, shl
if bit32 then
  bxor, band, shr, shl = bit32.bxor, bit32.band, bit32.rshift, bit32.lshift
elseif bit then
  local u = function(x) return x % 4294967296 end
  bxor = function(a, b) return u(bit.bxor(a, b)) end
  band = function(a, b) return u(bit.band(a, b)) end
  shr = function(a, n) return u(bit.rshift(a, n)) end
  shl = function(a, n) return u(bit.lshift(a, n)) end
else
  bxor = load("return function(a, b) return (a ~ b) & 0xffffffff end")()
  band = load("return function(a, b) return (a & b) & 0xffffffff end")()
  shr = load("return function(a, n) return (a & 0xffffffff) >> n end")()
  shl = load("return function(a, n) return (a << n) & 0xffffffff end")()
end

local CELL_TYPES = { @CELL_TYPES@ }
local NACK_REASONS = { @NACK_REASONS@ }
local DIRECTIONS = { [0] = "received", [1] = "sent" }
local CRC_STATUS = { [1] = "Good", [2] = "Bad" }
local ENGINES = { @ENGINES@ }
local NOTE_KINDS = { [1] = "write done", [2] = "read done" }

local f = {
  magic = ProtoField.uint16("exanet.capture.magic", "Magic", base.HEX),
  version = ProtoField.uint8("exanet.capture.version", "Record version"),
  direction = ProtoField.uint8("exanet.capture.direction", "Direction", base.DEC, DIRECTIONS),
  node = ProtoField.uint32("exanet.capture.node", "Capturing node"),
  peer = ProtoField.uint32("exanet.capture.peer", "Peer node (other end of the link)"),
  port = ProtoField.uint8("exanet.capture.port", "Port index"),
  vc = ProtoField.uint8("exanet.capture.vc", "Virtual channel"),
  modeled = ProtoField.uint64("exanet.capture.modeled_ps", "Modeled time (ps)"),

  gvas = ProtoField.bytes("exanet.gvas", "Destination GVAS"),
  pdid = ProtoField.uint16("exanet.pdid", "PDID"),
  dst_node = ProtoField.uint32("exanet.dst_node", "Destination node"),
  dst_rank = ProtoField.uint8("exanet.dst_rank", "Destination rank"),
  va = ProtoField.uint64("exanet.va", "Virtual address", base.HEX),
  type = ProtoField.uint8("exanet.type", "Cell type", base.HEX, CELL_TYPES),
  type_name = ProtoField.string("exanet.type_name", "Cell type name"),
  reserved = ProtoField.uint8("exanet.reserved", "Reserved"),
  len = ProtoField.uint16("exanet.len", "Payload length"),
  hcrc = ProtoField.uint16("exanet.hcrc", "Header CRC-16", base.HEX),
  hcrc_status = ProtoField.uint8("exanet.hcrc.status", "Header CRC status", base.DEC, CRC_STATUS),

  payload = ProtoField.bytes("exanet.payload", "Payload"),
  rdma = ProtoField.bool("exanet.rdma", "RDMA transfer"),
  engine = ProtoField.uint8("exanet.engine", "NI engine", base.DEC, ENGINES),
  block = ProtoField.uint64("exanet.block", "RDMA block answered"),
  bitmap = ProtoField.uint64("exanet.bitmap", "Cells of the block that arrived", base.HEX),
  read_dst_va = ProtoField.uint64("exanet.read.dst_va", "Read: reader's VA", base.HEX),
  read_len = ProtoField.uint64("exanet.read.len", "Read: length"),
  note_kind = ProtoField.uint8("exanet.notify.kind", "Notification", base.DEC, NOTE_KINDS),
  note_status = ProtoField.uint8("exanet.notify.status", "Notification status"),
  note_txn = ProtoField.uint32("exanet.notify.txn", "Notified transaction", base.HEX),
  note_len = ProtoField.uint64("exanet.notify.len", "Transfer length"),

  txn = ProtoField.uint32("exanet.txn", "Transaction id", base.HEX),
  src_node = ProtoField.uint32("exanet.src_node", "Source node"),
  src_rank = ProtoField.uint8("exanet.src_rank", "Source rank"),
  flags = ProtoField.uint8("exanet.flags", "Flags", base.HEX),
  first = ProtoField.bool("exanet.flags.first", "First cell"),
  last = ProtoField.bool("exanet.flags.last", "Last cell"),
  notify = ProtoField.bool("exanet.flags.notify", "Notify"),
  seq = ProtoField.uint16("exanet.seq", "Sequence number"),
  aux = ProtoField.uint8("exanet.aux", "Aux"),
  cell_index = ProtoField.uint8("exanet.cell_index", "Cell index in its RDMA block"),
  nack_reason = ProtoField.uint8("exanet.nack_reason", "NACK reason", base.DEC, NACK_REASONS),
  fcrc = ProtoField.uint8("exanet.fcrc", "Footer CRC-8", base.HEX),
  fcrc_status = ProtoField.uint8("exanet.fcrc.status", "Footer CRC status", base.DEC, CRC_STATUS),
  pcrc = ProtoField.uint32("exanet.pcrc", "Payload CRC-32", base.HEX),
  pcrc_status = ProtoField.uint8("exanet.pcrc.status", "Payload CRC status", base.DEC, CRC_STATUS),
}
local plist = {}
for _, v in pairs(f) do plist[#plist + 1] = v end
exanet.fields = plist

local ex_bad_crc = ProtoExpert.new("exanet.bad_crc", "CRC mismatch", expert.group.CHECKSUM, expert.severity.WARN)
local ex_short = ProtoExpert.new("exanet.short", "Truncated cell", expert.group.MALFORMED, expert.severity.ERROR)
local ex_magic = ProtoExpert.new("exanet.not_capture", "Not an exanet capture record", expert.group.MALFORMED, expert.severity.ERROR)
exanet.experts = { ex_bad_crc, ex_short, ex_magic }

-- CRC-16/IBM-3740 (CCITT-FALSE): poly 0x1021, init 0xFFFF, not reflected.
local function crc16(tvb, off, n)
  local crc = 0xFFFF
  for i = off, off + n - 1 do
    crc = bxor(crc, shl(tvb(i, 1):uint(), 8))
    for _ = 1, 8 do
      if band(crc, 0x8000) ~= 0 then crc = band(bxor(shl(crc, 1), 0x1021), 0xFFFF)
      else crc = band(shl(crc, 1), 0xFFFF) end
    end
  end
  return crc
end

-- CRC-8/SMBUS: poly 0x07, init 0, not reflected; over the given (offset, length) runs.
local function crc8(tvb, runs)
  local crc = 0
  for _, r in ipairs(runs) do
    for i = r[1], r[1] + r[2] - 1 do
      crc = bxor(crc, tvb(i, 1):uint())
      for _ = 1, 8 do
        if band(crc, 0x80) ~= 0 then crc = band(bxor(shl(crc, 1), 0x07), 0xFF)
        else crc = band(shl(crc, 1), 0xFF) end
      end
    end
  end
  return crc
end

-- CRC-32 (IEEE 802.3): reflected poly 0xEDB88320, init and final xor 0xFFFFFFFF.
local CRC32 = {}
for i = 0, 255 do
  local c = i
  for _ = 1, 8 do
    if band(c, 1) ~= 0 then c = bxor(shr(c, 1), 0xEDB88320) else c = shr(c, 1) end
  end
  CRC32[i] = c
end
local function crc32(tvb, off, n)
  local crc = 0xFFFFFFFF
  for i = off, off + n - 1 do
    crc = bxor(shr(crc, 8), CRC32[band(bxor(crc, tvb(i, 1):uint()), 0xFF)])
  end
  return bxor(crc, 0xFFFFFFFF)
end

local function check(tree, field, status_field, range, carried, computed)
  local item = tree:add(field, range)
  local good = carried == computed
  local st = tree:add(status_field, range, good and 1 or 2)
  st:set_generated()
  if not good then
    item:append_text(string.format(" [computed 0x%x]", computed))
    item:add_proto_expert_info(ex_bad_crc, string.format("CRC mismatch: carried 0x%x, computed 0x%x", carried, computed))
  end
  return good
end


function exanet.dissector(tvb, pinfo, tree)
  if tvb:len() < 24 then return 0 end
  pinfo.cols.protocol = "ExaNet"
  local root = tree:add(exanet, tvb())

  -- Capture header.
  local ch = root:add(exanet, tvb(0, 24), "Capture header")
  ch:set_text("Capture header")
  ch:add(f.magic, tvb(0, 2))
  if tvb(0, 2):uint() ~= 0x584E then
    ch:add_proto_expert_info(ex_magic)
    return 0
  end
  ch:add(f.version, tvb(2, 1))
  ch:add(f.direction, tvb(3, 1))
  ch:add(f.node, tvb(4, 4))
  ch:add(f.peer, tvb(8, 4))
  ch:add(f.port, tvb(12, 1))
  ch:add(f.vc, tvb(13, 1))
  ch:add(f.modeled, tvb(16, 8))
  local dir = tvb(3, 1):uint()
  local at, peer = tvb(4, 4):uint(), tvb(8, 4):uint()

  local c = 24
  if tvb:len() < c + 32 then
    root:add_proto_expert_info(ex_short, "shorter than a cell's header and footer")
    return tvb:len()
  end

  -- Cell header.
  local h = root:add(exanet, tvb(c, 16), "Cell header")
  h:set_text("Cell header")
  local g = h:add(f.gvas, tvb(c, 10))
  local b2, b3, b4, b5 = tvb(c + 2, 1):uint(), tvb(c + 3, 1):uint(), tvb(c + 4, 1):uint(), tvb(c + 5, 1):uint()
  local pdid = tvb(c, 2):uint()
  local dst = math.floor((b2 * 65536 + b3 * 256 + b4) / 4)
  local rank = (b4 % 4) * 2 + math.floor(b5 / 128)
  g:add(f.pdid, tvb(c, 2))
  g:add(f.dst_node, tvb(c + 2, 3), dst)
  g:add(f.dst_rank, tvb(c + 4, 2), rank)
  g:add(f.va, tvb(c + 5, 5), UInt64.new(tvb(c + 6, 4):uint(), b5 % 128))
  local kind = tvb(c + 10, 1):uint()
  h:add(f.type, tvb(c + 10, 1))
  h:add(f.type_name, tvb(c + 10, 1), CELL_TYPES[kind] or string.format("unknown 0x%02x", kind)):set_generated()
  h:add(f.reserved, tvb(c + 11, 1))
  local len = tvb(c + 12, 2):uint()
  h:add(f.len, tvb(c + 12, 2))
  local hgood = check(h, f.hcrc, f.hcrc_status, tvb(c + 14, 2), tvb(c + 14, 2):uint(), crc16(tvb, c, 14))

  local p = c + 16
  if len > 256 or tvb:len() < p + len + 16 then
    root:add_proto_expert_info(ex_short, string.format("payload length %d does not fit the %d captured bytes", len, tvb:len() - 24))
    return tvb:len()
  end
  local ft = p + len

  -- Footer first: the payload's meaning depends on its fields.
  local txn = tvb(ft, 4):uint()
  local src = tvb(ft + 4, 3):uint()
  local fb = tvb(ft + 7, 1):uint()
  local seq = tvb(ft + 8, 2):uint()
  local aux = tvb(ft + 10, 1):uint()
  -- Bits 6-7 of footer byte 7: the NI engine the cell belongs to (an answer: the engine
  -- of the cell it answers).
  local engine = shr(fb, 6)
  local is_rdma = engine == 1

  if len > 0 then
    local pt = root:add(f.payload, tvb(p, len))
    if (kind == 5 or kind == 6) and len >= 8 then
      pt:add(f.block, tvb(p, 8))
      if kind == 6 and aux == 7 and len >= 16 then pt:add(f.bitmap, tvb(p + 8, 8)) end
    elseif kind == 2 and len >= 16 then
      pt:add(f.read_dst_va, tvb(p, 8))
      pt:add(f.read_len, tvb(p + 8, 8))
    elseif kind == 4 and len == 16 then
      pt:add(f.note_kind, tvb(p, 1))
      pt:add(f.note_status, tvb(p + 1, 1))
      pt:add(f.note_txn, tvb(p + 4, 4))
      pt:add(f.note_len, tvb(p + 8, 8))
    end
  end

  local fo = root:add(exanet, tvb(ft, 16), "Cell footer")
  fo:set_text("Cell footer")
  fo:add(f.txn, tvb(ft, 4))
  fo:add(f.rdma, tvb(ft, 4), is_rdma):set_generated()
  fo:add(f.src_node, tvb(ft + 4, 3))
  fo:add(f.src_rank, tvb(ft + 7, 1), fb % 8)
  local fl = fo:add(f.flags, tvb(ft + 7, 1), band(fb, 0x38))
  fl:add(f.first, tvb(ft + 7, 1), band(fb, 0x08) ~= 0)
  fl:add(f.last, tvb(ft + 7, 1), band(fb, 0x10) ~= 0)
  fl:add(f.notify, tvb(ft + 7, 1), band(fb, 0x20) ~= 0)
  fo:add(f.engine, tvb(ft + 7, 1), engine)
  fo:add(f.seq, tvb(ft + 8, 2))
  fo:add(f.aux, tvb(ft + 10, 1))
  if kind == 6 then
    fo:add(f.nack_reason, tvb(ft + 10, 1))
  elseif kind == 1 and is_rdma then
    fo:add(f.cell_index, tvb(ft + 10, 1))
  end
  local fgood = check(fo, f.fcrc, f.fcrc_status, tvb(ft + 11, 1), tvb(ft + 11, 1):uint(),
    crc8(tvb, { { ft, 11 }, { ft + 12, 4 } }))
  local pgood = check(fo, f.pcrc, f.pcrc_status, tvb(ft + 12, 4), tvb(ft + 12, 4):uint(), crc32(tvb, p, len))

  pinfo.cols.src = string.format("node %d", src)
  pinfo.cols.dst = string.format("node %d r%d", dst, rank)
  local what = CELL_TYPES[kind] or string.format("type 0x%02x", kind)
  if kind == 1 then what = is_rdma and "RDMA write" or "packetizer write" end
  if kind == 6 then what = "nack " .. (NACK_REASONS[aux] or tostring(aux)) end
  local info = string.format("%s pdid %d seq %d len %d, %s %d %s %d",
    what, pdid, seq, len, DIRECTIONS[dir] or "?", at, dir == 0 and "from" or "to", peer)
  if not (hgood and fgood and pgood) then info = info .. " [BAD CRC]" end
  pinfo.cols.info = info
  root:append_text(string.format(", %s, node %d -> node %d", what, src, dst))
  return tvb:len()
end

local encap = (wtap_encaps and wtap_encaps.USER0) or wtap.USER0
DissectorTable.get("wtap_encap"):add(encap, exanet)
