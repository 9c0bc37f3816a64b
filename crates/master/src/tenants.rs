//! Tenants: object namespaces and memory quotas.
//!
//! A client names its tenant (`tenant_id`, `default` unless set). Without
//! `--enable_multi_tenants` every tenant's requests act in one shared
//! namespace and no quota applies. With it:
//! - each tenant's keys live in a namespace of their own: a key written by
//!   one tenant is invisible to every other, and bulk removals
//!   (`remove_all`, `remove_by_regex`) touch only the caller's tenant;
//! - a write is admitted only for a tenant with a quota policy
//!   (TENANT_NOT_REGISTERED otherwise, `default` included), and only while
//!   the tenant's memory replicas (completed and in flight) plus the write's
//!   `size × replica_num` stay within its effective quota
//!   (TENANT_QUOTA_EXCEEDED otherwise);
//! - the policy comes from the file connector
//!   (`--tenant_quota_connector_uri`, YAML schema version 1) and is changed
//!   through the admin API (`/api/v1/tenant_quotas`), which writes the file
//!   back.
//!
//! A tenant's namespace is kept in the stored keys: tenant `t`'s key `k` is
//! stored as `t\0k`; the default tenant's key is stored as itself, or as
//! `\0k` when it contains a NUL (tenant names contain none, so no two
//! namespaces share a stored key). The tenant's number tags every memory
//! allocation made for its objects (see `OffsetAllocator::tag`), so its
//! charge is what the segments hold for it, freed with the space.
//!
//! Effective quota: the requested quota while the requested quotas of all
//! tenants fit in the mounted capacity; otherwise the capacity shared in
//! proportion to the requests (largest remainders first).

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;

use mooncake_common::ErrorCode;
use serde::Serialize;

/// The tenant a client has unless it names another.
pub(crate) const DEFAULT_TENANT: &str = "default";

/// Largest quota a policy may request (2^63 - 1 bytes).
pub(crate) const MAX_QUOTA: u64 = i64::MAX as u64;

pub(crate) use mooncake_common::proto::valid_tenant;

/// The namespace one connection's requests act in.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) enum Scope {
    /// Multi-tenancy off: every key as given.
    #[default]
    Shared,
    /// The default tenant with multi-tenancy on.
    Default,
    /// Another tenant with multi-tenancy on; `prefix` is `name\0`.
    Tenant { prefix: Box<str> },
}

impl Scope {
    /// The scope of `tenant` (valid) on a master with multi-tenancy
    /// `enabled`.
    pub(crate) fn of(tenant: &str, enabled: bool) -> Scope {
        if !enabled {
            Scope::Shared
        } else if tenant == DEFAULT_TENANT {
            Scope::Default
        } else {
            Scope::Tenant {
                prefix: format!("{tenant}\0").into(),
            }
        }
    }

    /// The stored key of the user key `key`.
    pub(crate) fn stored(&self, key: String) -> String {
        match self {
            Scope::Shared => key,
            Scope::Default if key.contains('\0') => format!("\0{key}"),
            Scope::Default => key,
            Scope::Tenant { prefix, .. } => {
                let mut s = String::with_capacity(prefix.len() + key.len());
                s.push_str(prefix);
                s.push_str(&key);
                s
            }
        }
    }

    /// Stored keys of `keys`.
    pub(crate) fn stored_all(&self, keys: Vec<String>) -> Vec<String> {
        if *self == Scope::Shared {
            return keys;
        }
        keys.into_iter().map(|k| self.stored(k)).collect()
    }

    /// The user key a stored key has in this scope, or `None` when it is
    /// another tenant's.
    pub(crate) fn user_key<'a>(&self, stored: &'a str) -> Option<&'a str> {
        match self {
            Scope::Shared => Some(stored),
            Scope::Default => match stored.strip_prefix('\0') {
                Some(k) => Some(k),
                None if stored.contains('\0') => None,
                None => Some(stored),
            },
            Scope::Tenant { prefix, .. } => stored.strip_prefix(&**prefix),
        }
    }
}

/// The tenant a stored key belongs to (with multi-tenancy on).
pub(crate) fn tenant_of(stored: &str) -> &str {
    match stored.find('\0') {
        Some(0) | None => DEFAULT_TENANT,
        Some(i) => &stored[..i],
    }
}

/// A quota written as a positive integer with an optional unit `B`, `KB`,
/// `MB`, `GB` or `TB` (powers of 1024), at most 2^63 - 1 bytes.
pub(crate) fn parse_quota(text: &str) -> Result<u64, String> {
    let digits = text.bytes().take_while(u8::is_ascii_digit).count();
    if digits == 0 {
        return Err(format!("quota {text:?} must start with an integer"));
    }
    let n: u64 = text[..digits]
        .parse()
        .map_err(|_| format!("quota {text:?} overflows 64 bits"))?;
    if n == 0 {
        return Err(format!("quota {text:?} must be positive"));
    }
    let shift = match &text[digits..] {
        "" | "B" => 0,
        "KB" => 10,
        "MB" => 20,
        "GB" => 30,
        "TB" => 40,
        unit => return Err(format!("quota {text:?} has an unknown unit {unit:?}")),
    };
    n.checked_mul(1u64 << shift)
        .filter(|b| *b <= MAX_QUOTA)
        .ok_or_else(|| format!("quota {text:?} exceeds 2^63 - 1 bytes"))
}

/// Parse a policy file: `version: 1` and `tenants:`, a list of
/// `{name, quota}` with unique valid names. Returns quota bytes by name.
pub(crate) fn parse_policy(text: &str) -> Result<BTreeMap<String, u64>, String> {
    use yaml_rust2::{Yaml, YamlLoader};
    let docs = YamlLoader::load_from_str(text).map_err(|e| format!("invalid YAML: {e}"))?;
    let root = docs.into_iter().next().unwrap_or(Yaml::Null);
    if root.as_hash().is_none() {
        return Err("the tenant quota policy must be a YAML map".into());
    }
    match &root["version"] {
        Yaml::Integer(1) => {}
        Yaml::BadValue => return Err("the tenant quota policy needs `version: 1`".into()),
        v => {
            return Err(format!(
                "unsupported tenant quota policy version {v:?} (only 1)"
            ))
        }
    }
    let Some(list) = root["tenants"].as_vec() else {
        return Err("`tenants` must be a YAML list".into());
    };
    let mut out = BTreeMap::new();
    for entry in list {
        let name = match &entry["name"] {
            Yaml::String(s) => s.clone(),
            Yaml::Integer(i) => i.to_string(),
            _ => return Err("every tenant entry needs a `name`".into()),
        };
        if !valid_tenant(&name) {
            return Err(format!("invalid tenant name {name:?}"));
        }
        let quota = match &entry["quota"] {
            Yaml::String(s) => s.clone(),
            Yaml::Integer(i) => i.to_string(),
            _ => return Err(format!("tenant {name:?} needs a `quota`")),
        };
        let bytes = parse_quota(&quota).map_err(|e| format!("tenant {name:?}: {e}"))?;
        if out.insert(name.clone(), bytes).is_some() {
            return Err(format!("tenant {name:?} is listed twice"));
        }
    }
    Ok(out)
}

/// The policy file text for `policies` (what `parse_policy` reads back).
pub(crate) fn format_policy(policies: &BTreeMap<String, u64>) -> String {
    if policies.is_empty() {
        return "version: 1\n\ntenants: []\n".into();
    }
    let mut s = String::from("version: 1\n\ntenants:\n");
    for (name, quota) in policies {
        // A JSON string is a YAML double-quoted scalar.
        let quoted = serde_json::to_string(name).unwrap_or_default();
        s.push_str(&format!("  - name: {quoted}\n    quota: {quota}\n"));
    }
    s
}

/// Effective quotas of `policies` in `capacity` bytes (see the module).
pub(crate) fn effective_quotas(
    policies: &BTreeMap<String, u64>,
    capacity: u64,
) -> BTreeMap<String, u64> {
    let sum: u128 = policies.values().map(|&q| q as u128).sum();
    if sum <= capacity as u128 {
        return policies.clone();
    }
    let mut shares: Vec<(&String, u64, u128)> = policies
        .iter()
        .map(|(n, &q)| {
            let p = capacity as u128 * q as u128;
            (n, (p / sum) as u64, p % sum)
        })
        .collect();
    let given: u64 = shares.iter().map(|s| s.1).sum();
    let mut left = capacity.saturating_sub(given);
    shares.sort_by(|a, b| b.2.cmp(&a.2).then(a.0.cmp(b.0)));
    for s in &mut shares {
        if left == 0 {
            break;
        }
        s.1 += 1;
        left -= 1;
    }
    shares.into_iter().map(|(n, b, _)| (n.clone(), b)).collect()
}

/// The effective quota of `tenant` alone (what [`effective_quotas`] gives
/// it), without building the whole table while the requests fit.
pub(crate) fn effective_quota(
    policies: &BTreeMap<String, u64>,
    capacity: u64,
    tenant: &str,
) -> u64 {
    let sum: u128 = policies.values().map(|&q| q as u128).sum();
    if sum <= capacity as u128 {
        return policies.get(tenant).copied().unwrap_or(0);
    }
    effective_quotas(policies, capacity)
        .get(tenant)
        .copied()
        .unwrap_or(0)
}

/// One tenant's quota as the admin API shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct TenantQuota {
    /// The tenant.
    pub tenant_id: String,
    /// Quota its policy asks for (0 without a policy).
    pub requested_quota_bytes: u64,
    /// Quota in force (see the module).
    pub effective_quota_bytes: u64,
    /// Bytes of its memory replicas, completed and in flight.
    pub charged_bytes: u64,
    /// New writes are refused (no policy).
    pub admission_closed: bool,
    /// Charged beyond the effective quota.
    pub over_quota: bool,
    /// The tenant has a policy.
    pub has_explicit_policy: bool,
}

/// Why an admin request on tenant quotas failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum QuotaAdminError {
    /// Multi-tenancy is off (HTTP 409, `UNAVAILABLE_IN_CURRENT_MODE`).
    Disabled,
    /// This master is not serving (a standby in HA; HTTP 503).
    Standby,
    /// A bad tenant name or quota (HTTP 400).
    Invalid(String),
    /// No such tenant (HTTP 404).
    NotFound,
    /// The tenant still holds objects or charged bytes (HTTP 409,
    /// `TENANT_NOT_EMPTY`).
    NotEmpty,
    /// The policy could not be written (HTTP 500).
    Store(String),
}

/// The master's tenant table (under the master lock).
#[derive(Debug, Default)]
pub(crate) struct Tenants {
    /// `--enable_multi_tenants`.
    pub enabled: bool,
    /// Requested quota per tenant with a policy.
    pub policies: BTreeMap<String, u64>,
    /// Allocation tags by tenant, from 1 (a tenant gets one when it is
    /// first charged; numbers are never reused).
    tags: HashMap<Box<str>, u32>,
    /// The policy file (the file connector's URI).
    pub file: Option<PathBuf>,
}

impl Tenants {
    /// A table with multi-tenancy on, no policy (every write refused until
    /// one is set), and the policy file `file`.
    pub(crate) fn closed(file: PathBuf) -> Tenants {
        Tenants {
            enabled: true,
            file: Some(file),
            ..Tenants::default()
        }
    }

    /// A table with multi-tenancy on and the policy in `file`, read now.
    pub(crate) fn load(file: PathBuf) -> Result<Tenants, String> {
        let text = std::fs::read_to_string(&file).map_err(|e| {
            format!(
                "cannot read the tenant quota policy {}: {e}",
                file.display()
            )
        })?;
        let policies = parse_policy(&text)
            .map_err(|e| format!("tenant quota policy {}: {e}", file.display()))?;
        Ok(Tenants {
            enabled: true,
            policies,
            tags: HashMap::new(),
            file: Some(file),
        })
    }

    /// The allocation tag of `tenant` (given one now if it has none); 0
    /// when multi-tenancy is off.
    pub(crate) fn tag(&mut self, tenant: &str) -> u32 {
        if !self.enabled {
            return 0;
        }
        if let Some(t) = self.tags.get(tenant) {
            return *t;
        }
        let t = self.tags.len() as u32 + 1;
        self.tags.insert(tenant.into(), t);
        t
    }

    /// The allocation tag of `tenant` if it has one.
    pub(crate) fn existing_tag(&self, tenant: &str) -> Option<u32> {
        self.tags.get(tenant).copied()
    }

    /// Tenants that have a policy or were charged.
    pub(crate) fn known(&self) -> Vec<String> {
        let mut v: Vec<String> = self.policies.keys().cloned().collect();
        for t in self.tags.keys() {
            if !self.policies.contains_key(&**t) {
                v.push(t.to_string());
            }
        }
        v.sort();
        v
    }

    /// Whether a write of `tenant` is admitted at all.
    pub(crate) fn admits(&self, tenant: &str) -> Result<(), ErrorCode> {
        if !self.enabled || self.policies.contains_key(tenant) {
            Ok(())
        } else {
            Err(ErrorCode::TenantNotRegistered)
        }
    }

    /// Write the policy back to its file (atomically: a temporary file
    /// renamed over it).
    pub(crate) fn save(&self) -> Result<(), String> {
        let Some(path) = &self.file else {
            return Ok(());
        };
        let tmp = path.with_extension("tmp");
        std::fs::write(&tmp, format_policy(&self.policies))
            .and_then(|()| std::fs::rename(&tmp, path))
            .map_err(|e| {
                format!(
                    "cannot write the tenant quota policy {}: {e}",
                    path.display()
                )
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tenant_names() {
        for ok in ["default", "tenant-a", "a b", "x~"] {
            assert!(valid_tenant(ok), "{ok}");
        }
        for bad in ["", "_internal", "a\0b", "tab\t", "del\x7f"] {
            assert!(!valid_tenant(bad), "{bad:?}");
        }
    }

    #[test]
    fn namespaces_never_share_a_stored_key() {
        let a = Scope::of("a", true);
        let d = Scope::of(DEFAULT_TENANT, true);
        let shared = Scope::of("a", false);
        assert_eq!(shared, Scope::Shared);
        assert_eq!(shared.stored("k".into()), "k");
        assert_eq!(a.stored("k".into()), "a\0k");
        assert_eq!(d.stored("k".into()), "k");
        // A default key that looks like a's stored key stays the default's.
        let sneaky = d.stored("a\0k".into());
        assert_eq!(sneaky, "\0a\0k");
        assert_ne!(sneaky, a.stored("k".into()));
        assert_eq!(d.user_key(&sneaky), Some("a\0k"));
        assert_eq!(a.user_key(&sneaky), None);
        assert_eq!(d.user_key("a\0k"), None, "a's key is not the default's");
        assert_eq!(a.user_key("a\0k"), Some("k"));
        assert_eq!(a.user_key("k"), None);
        assert_eq!(Scope::of("ab", true).user_key("a\0k"), None);
        assert_eq!(tenant_of("a\0k"), "a");
        assert_eq!(tenant_of("k"), DEFAULT_TENANT);
        assert_eq!(tenant_of("\0a\0k"), DEFAULT_TENANT);
        // Keys with NULs of their own survive a round trip.
        assert_eq!(a.user_key(&a.stored("x\0y".into())), Some("x\0y"));
    }

    #[test]
    fn quotas_parse_with_units() {
        assert_eq!(parse_quota("200"), Ok(200));
        assert_eq!(parse_quota("5B"), Ok(5));
        assert_eq!(parse_quota("2KB"), Ok(2048));
        assert_eq!(parse_quota("3MB"), Ok(3 << 20));
        assert_eq!(parse_quota("200GB"), Ok(200 << 30));
        assert_eq!(parse_quota("1TB"), Ok(1 << 40));
        for bad in [
            "",
            "0",
            "GB",
            "5XB",
            "-1",
            "9223372036854775808",
            "99999999TB",
        ] {
            assert!(parse_quota(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn policy_files() {
        let p = parse_policy(
            "version: 1\n\ntenants:\n  - name: tenant-a\n    quota: 200GB\n\n  - name: tenant-b\n    quota: 500\n",
        )
        .expect("valid");
        assert_eq!(p.get("tenant-a"), Some(&(200 << 30)));
        assert_eq!(p.get("tenant-b"), Some(&500));
        assert_eq!(parse_policy(&format_policy(&p)), Ok(p));
        assert_eq!(
            parse_policy("version: 1\ntenants: []\n"),
            Ok(BTreeMap::new())
        );
        assert_eq!(
            parse_policy(&format_policy(&BTreeMap::new())),
            Ok(BTreeMap::new())
        );
        for (bad, why) in [
            ("tenants: []", "version"),
            ("version: 2\ntenants: []", "version"),
            ("version: 1", "tenants"),
            ("version: 1\ntenants:\n  - name: a\n", "quota"),
            ("version: 1\ntenants:\n  - quota: 1\n", "name"),
            (
                "version: 1\ntenants:\n  - name: _a\n    quota: 1\n",
                "invalid tenant",
            ),
            (
                "version: 1\ntenants:\n  - {name: a, quota: 1}\n  - {name: a, quota: 2}\n",
                "twice",
            ),
            (
                "version: 1\ntenants:\n  - {name: a, quota: 0}\n",
                "positive",
            ),
            ("[1, 2", "YAML"),
        ] {
            let e = parse_policy(bad).expect_err(bad);
            assert!(e.contains(why), "{bad}: {e}");
        }
    }

    #[test]
    fn effective_quotas_share_the_capacity_when_oversubscribed() {
        let p: BTreeMap<String, u64> = [("a".to_string(), 300), ("b".to_string(), 100)].into();
        assert_eq!(effective_quotas(&p, 1000), p);
        let e = effective_quotas(&p, 201);
        assert_eq!(e.values().sum::<u64>(), 201);
        assert_eq!((e["a"], e["b"]), (151, 50));
        assert_eq!(effective_quotas(&p, 0).values().sum::<u64>(), 0);
        for cap in [0, 201, 400, 1000] {
            let all = effective_quotas(&p, cap);
            for t in ["a", "b", "c"] {
                assert_eq!(
                    effective_quota(&p, cap, t),
                    all.get(t).copied().unwrap_or(0),
                    "{cap} {t}"
                );
            }
        }
    }

    #[test]
    fn admission_and_tags() {
        let mut t = Tenants::default();
        assert_eq!(t.admits("anyone"), Ok(()));
        assert_eq!(t.tag("anyone"), 0, "no tags while off");
        t.enabled = true;
        t.policies.insert("a".into(), 10);
        assert_eq!(t.admits("a"), Ok(()));
        assert_eq!(
            t.admits(DEFAULT_TENANT),
            Err(ErrorCode::TenantNotRegistered)
        );
        assert_eq!(t.tag("a"), 1);
        assert_eq!(t.tag("b"), 2);
        assert_eq!(t.tag("a"), 1);
        assert_eq!(t.known(), vec!["a".to_string(), "b".to_string()]);
    }
}
