//! Encoding of records and meta files (the layout is described in the
//! crate documentation).

use serde::{Deserialize, Serialize};

/// First four bytes of every record.
pub const RECORD_MAGIC: &[u8; 4] = b"MCO1";
/// Bytes of a record header (before the key).
pub const RECORD_HEADER: usize = 32;
/// First line of a meta file.
pub(crate) const META_MAGIC: &str = "MCOFFLOAD-META 1";

/// A record header, decoded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Header {
    pub key_len: u32,
    pub value_len: u64,
    pub version: u64,
    pub value_crc: u32,
}

/// Header bytes plus key for a record.
pub(crate) fn encode_head(key: &str, version: u64, value: &[u8]) -> Vec<u8> {
    let mut b = Vec::with_capacity(RECORD_HEADER + key.len());
    b.extend_from_slice(RECORD_MAGIC);
    b.extend_from_slice(&(key.len() as u32).to_le_bytes());
    b.extend_from_slice(&(value.len() as u64).to_le_bytes());
    b.extend_from_slice(&version.to_le_bytes());
    b.extend_from_slice(&crc32c::crc32c(value).to_le_bytes());
    let head_crc = crc32c::crc32c_append(crc32c::crc32c(&b), key.as_bytes());
    b.extend_from_slice(&head_crc.to_le_bytes());
    b.extend_from_slice(key.as_bytes());
    b
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    let mut a = [0u8; 4];
    a.copy_from_slice(&b[at..at + 4]);
    u32::from_le_bytes(a)
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(a)
}

/// Check and decode `head` (header bytes followed by the key) for `key`.
pub(crate) fn decode_head(head: &[u8], key: &str) -> Result<Header, String> {
    if head.len() != RECORD_HEADER + key.len() {
        return Err("short record header".into());
    }
    if &head[..4] != RECORD_MAGIC {
        return Err("bad record magic".into());
    }
    let h = Header {
        key_len: u32_at(head, 4),
        value_len: u64_at(head, 8),
        version: u64_at(head, 16),
        value_crc: u32_at(head, 24),
    };
    let want = u32_at(head, 28);
    let got = crc32c::crc32c_append(crc32c::crc32c(&head[..28]), &head[RECORD_HEADER..]);
    if want != got {
        return Err("record header checksum mismatch".into());
    }
    if h.key_len as usize != key.len() || &head[RECORD_HEADER..] != key.as_bytes() {
        return Err("record holds another key".into());
    }
    Ok(h)
}

/// One live record as a meta file lists it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct MetaEntry {
    pub key: String,
    pub version: u64,
    /// Offset of the record (its header) in the bucket file.
    pub offset: u64,
    pub value_len: u64,
    pub value_crc: u32,
}

impl MetaEntry {
    /// Bytes of the whole record.
    pub(crate) fn record_len(&self) -> u64 {
        (RECORD_HEADER + self.key.len()) as u64 + self.value_len
    }

    /// Offset of the value in the bucket file.
    pub(crate) fn value_offset(&self) -> u64 {
        self.offset + (RECORD_HEADER + self.key.len()) as u64
    }
}

/// A meta file's JSON line.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Meta {
    pub bucket: u64,
    pub entries: Vec<MetaEntry>,
}

/// The bytes of a meta file.
pub(crate) fn encode_meta(m: &Meta) -> Vec<u8> {
    let json = serde_json::to_string(m).unwrap_or_else(|_| String::from("{}"));
    format!(
        "{META_MAGIC}\n{json}\n{:08x}\n",
        crc32c::crc32c(json.as_bytes())
    )
    .into_bytes()
}

/// Parse and check a meta file.
pub(crate) fn decode_meta(bytes: &[u8]) -> Result<Meta, String> {
    let text = std::str::from_utf8(bytes).map_err(|_| "meta file is not UTF-8".to_string())?;
    let mut lines = text.split('\n');
    if lines.next() != Some(META_MAGIC) {
        return Err("bad meta magic".into());
    }
    let json = lines.next().ok_or("meta file has no entries line")?;
    let crc = lines.next().ok_or("meta file has no checksum line")?;
    let want = u32::from_str_radix(crc.trim(), 16).map_err(|_| "bad meta checksum line")?;
    if crc32c::crc32c(json.as_bytes()) != want {
        return Err("meta checksum mismatch".into());
    }
    serde_json::from_str(json).map_err(|e| format!("meta JSON: {e}"))
}

/// File name of bucket `id`'s data (`ext` = "bucket") or meta (`ext` = "meta").
pub(crate) fn file_name(id: u64, ext: &str) -> String {
    format!("{id:020}.{ext}")
}

/// The bucket id of a file name `<20 digits>.<ext>`.
pub(crate) fn parse_name(name: &str) -> Option<(u64, &str)> {
    let (stem, ext) = name.split_once('.')?;
    if stem.len() != 20 || !stem.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    Some((stem.parse().ok()?, ext))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_header_roundtrips_and_any_flipped_bit_is_caught() {
        let head = encode_head("k1", 7, b"value");
        let h = decode_head(&head, "k1").expect("decode");
        assert_eq!((h.key_len, h.value_len, h.version), (2, 5, 7));
        assert_eq!(h.value_crc, crc32c::crc32c(b"value"));
        for i in 0..head.len() {
            let mut bad = head.clone();
            bad[i] ^= 0x10;
            assert!(decode_head(&bad, "k1").is_err(), "byte {i}");
        }
        assert!(decode_head(&head, "k2").is_err());
    }

    #[test]
    fn a_meta_file_roundtrips_and_damage_is_caught() {
        let m = Meta {
            bucket: 3,
            entries: vec![MetaEntry {
                key: "a".into(),
                version: 1,
                offset: 0,
                value_len: 10,
                value_crc: 5,
            }],
        };
        let b = encode_meta(&m);
        assert_eq!(decode_meta(&b).expect("decode"), m);
        assert!(decode_meta(&b[..b.len() - 4]).is_err());
        let mut bad = b.clone();
        let at = bad.iter().position(|&c| c == b'a').expect("a");
        bad[at + 20] ^= 1;
        assert!(decode_meta(&bad).is_err());
    }

    #[test]
    fn names_sort_by_id() {
        assert_eq!(file_name(42, "meta"), "00000000000000000042.meta");
        assert_eq!(
            parse_name("00000000000000000042.bucket"),
            Some((42, "bucket"))
        );
        assert_eq!(parse_name("42.bucket"), None);
        assert_eq!(parse_name(".lock"), None);
    }
}
