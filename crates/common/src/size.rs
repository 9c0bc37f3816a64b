//! Human-readable sizes and booleans: the one parser of sizes for the whole
//! project (dict-style `setup`, `MooncakeConfig`, environment settings,
//! benchmark options; exported to Python as `mooncake._native.parse_size`).

/// Parse sizes like `"16MB"`, `"16 MiB"`, `"1.5g"`, `"1024"`, `"infinite"`.
/// Units are 1024-based whatever their spelling (`K`, `KB`, `KiB`, ... up to
/// `T`), case-insensitive, with or without a space; `"infinite"` is
/// `u64::MAX`. `None` for anything else, a negative or non-finite number, or
/// a size past `u64::MAX`.
pub fn parse_size(text: &str) -> Option<u64> {
    let t = text.trim();
    if t.eq_ignore_ascii_case("infinite") {
        return Some(u64::MAX);
    }
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    if num.is_empty() {
        return None;
    }
    let value: f64 = num.parse().ok()?;
    let mult: u64 = match unit.trim().to_ascii_uppercase().as_str() {
        "" | "B" => 1,
        "K" | "KB" | "KIB" => 1 << 10,
        "M" | "MB" | "MIB" => 1 << 20,
        "G" | "GB" | "GIB" => 1 << 30,
        "T" | "TB" | "TIB" => 1 << 40,
        _ => return None,
    };
    let bytes = value * mult as f64;
    if !bytes.is_finite() || bytes < 0.0 || bytes > u64::MAX as f64 {
        return None;
    }
    Some(bytes as u64)
}

/// Parse booleans `true/false/1/0/yes/no/on/off` (case-insensitive).
pub fn parse_bool(text: &str) -> Option<bool> {
    match text.trim().to_ascii_lowercase().as_str() {
        "true" | "1" | "yes" | "on" => Some(true),
        "false" | "0" | "no" | "off" => Some(false),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes() {
        assert_eq!(parse_size("16MB"), Some(16 << 20));
        assert_eq!(parse_size("16 MB"), Some(16 << 20));
        assert_eq!(parse_size("16 mb"), Some(16 << 20));
        assert_eq!(parse_size("512 MiB"), Some(512 << 20));
        assert_eq!(parse_size("4GiB"), Some(4 << 30));
        assert_eq!(parse_size("4 GB"), Some(4 << 30));
        assert_eq!(parse_size("2t"), Some(2 << 40));
        assert_eq!(parse_size("1KIB"), Some(1024));
        assert_eq!(parse_size("1.5.2M"), None);
        assert_eq!(parse_size("-1M"), None);
        assert_eq!(parse_size("1e3"), None);
        assert_eq!(parse_size("99999999999999999999T"), None);
        assert_eq!(parse_size("1024"), Some(1024));
        assert_eq!(parse_size("1.5K"), Some(1536));
        assert_eq!(parse_size("infinite"), Some(u64::MAX));
        assert_eq!(parse_size("50%"), None);
        assert_eq!(parse_size(""), None);
        assert_eq!(parse_size("MB"), None);
    }

    #[test]
    fn bools() {
        assert_eq!(parse_bool("On"), Some(true));
        assert_eq!(parse_bool("no"), Some(false));
        assert_eq!(parse_bool("maybe"), None);
    }
}
