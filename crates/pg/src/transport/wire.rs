//! Frame header shared by TCP frames and shared-memory ring slots (the
//! connection preambles that precede the frames are in `handshake`).
//!
//! Layout (40 bytes, little-endian): `kind u8, flags u8, pad [u8;2],
//! phase u32, seq u64, total u64, offset u64, len u32, aux u32`.
//!
//! Pulls (a rank that must recompute a reduction
//! pulls the survivors' original inputs for that `seq`): [`KIND_PULL_REQ`]
//! carries the pull id in `phase`, the op in `seq`, the byte range in
//! `offset`/`total`; each [`KIND_PULL_RESP`] carries the same id and seq, and
//! `len` payload bytes at `offset`, or `aux` = [`PULL_NOT_HELD`].
//! Acknowledgements (completed-seq watermarks) ride in the `seq` field of
//! PONGs, and a collective piece of op `seq` implies the sender completed
//! every earlier op.

use std::io::{Read, Write};

/// Encoded header length in bytes.
pub(crate) const HDR_LEN: usize = 40;

/// Collective data piece.
pub(crate) const KIND_COLL: u8 = 1;
/// Point-to-point data frame.
pub(crate) const KIND_P2P: u8 = 2;
/// "I have mapped your shared-memory segment."
pub(crate) const KIND_MAPPED: u8 = 3;
/// Orderly goodbye at shutdown.
pub(crate) const KIND_BYE: u8 = 4;
/// The sender aborted collective `seq` (for example on a size mismatch).
pub(crate) const KIND_ABORT: u8 = 5;
/// Liveness probe; the peer's reader answers with [`KIND_PONG`].
pub(crate) const KIND_PING: u8 = 6;
/// Answer to [`KIND_PING`]; `seq` is the sender's completed-op watermark
/// (it finished every collective below `seq`).
pub(crate) const KIND_PONG: u8 = 7;
/// Asks the peer for a byte range of its retained input of op `seq`.
pub(crate) const KIND_PULL_REQ: u8 = 8;
/// A piece of a pulled range, or a refusal (`aux` = [`PULL_NOT_HELD`]).
pub(crate) const KIND_PULL_RESP: u8 = 9;
/// The receiver took in every P2P message of this link up to message
/// number `seq` (a running count from 1): what makes a send successful.
pub(crate) const KIND_P2P_ACK: u8 = 10;
/// `aux` of a [`KIND_PULL_RESP`]: the input of that op is not (or no
/// longer) held.
pub(crate) const PULL_NOT_HELD: u32 = 1;
/// Flag of a reduced piece (the fused all-gather of the two-phase
/// all_reduce): the sender's reduction lost a contribution during the op,
/// so the chunk may exclude, or partly include, a failed rank.
pub(crate) const FLAG_TAINT: u8 = 1;

/// Decoded frame header.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Hdr {
    /// Frame kind (`KIND_*`).
    pub(crate) kind: u8,
    /// Frame flags (`FLAG_*`).
    pub(crate) flags: u8,
    /// Algorithm phase within the collective.
    pub(crate) phase: u32,
    /// Collective sequence number, or P2P message number.
    pub(crate) seq: u64,
    /// Total message length in bytes.
    pub(crate) total: u64,
    /// Offset of this piece within the message.
    pub(crate) offset: u64,
    /// Payload length of this piece.
    pub(crate) len: u32,
    /// Op signature (collectives) or reason code (abort).
    pub(crate) aux: u32,
}

impl Hdr {
    /// Serialises the header.
    pub(crate) fn encode(&self) -> [u8; HDR_LEN] {
        let mut b = [0u8; HDR_LEN];
        b[0] = self.kind;
        b[1] = self.flags;
        b[4..8].copy_from_slice(&self.phase.to_le_bytes());
        b[8..16].copy_from_slice(&self.seq.to_le_bytes());
        b[16..24].copy_from_slice(&self.total.to_le_bytes());
        b[24..32].copy_from_slice(&self.offset.to_le_bytes());
        b[32..36].copy_from_slice(&self.len.to_le_bytes());
        b[36..40].copy_from_slice(&self.aux.to_le_bytes());
        b
    }

    /// Parses a header.
    pub(crate) fn decode(b: &[u8; HDR_LEN]) -> Self {
        let u32_at = |i: usize| u32::from_le_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]);
        let u64_at = |i: usize| {
            let mut a = [0u8; 8];
            a.copy_from_slice(&b[i..i + 8]);
            u64::from_le_bytes(a)
        };
        Hdr {
            kind: b[0],
            flags: b[1],
            phase: u32_at(4),
            seq: u64_at(8),
            total: u64_at(16),
            offset: u64_at(24),
            len: u32_at(32),
            aux: u32_at(36),
        }
    }

    /// Reads one header from a stream.
    pub(crate) fn read_from(r: &mut impl Read) -> std::io::Result<Self> {
        let mut b = [0u8; HDR_LEN];
        r.read_exact(&mut b)?;
        Ok(Self::decode(&b))
    }
}

/// Writes a header and its payload as one frame.
pub(crate) fn write_frame(w: &mut impl Write, hdr: &Hdr, payload: &[u8]) -> std::io::Result<()> {
    let h = hdr.encode();
    if payload.is_empty() {
        return w.write_all(&h);
    }
    let bufs = [std::io::IoSlice::new(&h), std::io::IoSlice::new(payload)];
    let total = h.len() + payload.len();
    let mut written = w.write_vectored(&bufs)?;
    if written == 0 {
        return Err(std::io::ErrorKind::WriteZero.into());
    }
    if written < h.len() {
        w.write_all(&h[written..])?;
        written = h.len();
    }
    if written < total {
        w.write_all(&payload[written - h.len()..])?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_round_trips() {
        let h = Hdr {
            kind: KIND_COLL,
            flags: FLAG_TAINT,
            phase: 3,
            seq: 1 << 40,
            total: 12345,
            offset: 4096,
            len: 77,
            aux: 0xdead,
        };
        assert_eq!(Hdr::decode(&h.encode()), h);
    }
}
