//! Human-readable size and boolean parsing used by dict-style `setup`.

/// Parse sizes like `"16MB"`, `"16 MB"`, `"1.5g"`, `"1024"`, `"infinite"` (1024-based units).
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
        "K" | "KB" => 1 << 10,
        "M" | "MB" => 1 << 20,
        "G" | "GB" => 1 << 30,
        "T" | "TB" => 1 << 40,
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
