//! Tenant admission and quota accounting on the master state, and the
//! quota admin API (see `tenants` for the rules).

use crate::state::{Inner, MasterState, Replica};
use crate::tenants::{
    effective_quota, effective_quotas, tenant_of, valid_tenant, QuotaAdminError, Scope,
    TenantQuota, MAX_QUOTA,
};
use mooncake_common::ErrorCode;

impl Inner {
    /// The allocation tag of the tenant owning stored key `key` (0 when
    /// multi-tenancy is off).
    pub(crate) fn tenant_tag(&mut self, key: &str) -> u32 {
        if !self.tenants.enabled {
            return 0;
        }
        self.tenants.tag(tenant_of(key))
    }

    /// Charge the allocations `replicas` (of `size` bytes each) made for
    /// stored key `key` to its tenant.
    pub(crate) fn charge_replicas(&mut self, key: &str, replicas: &[Replica], size: u64) {
        let tag = self.tenant_tag(key);
        if tag == 0 {
            return;
        }
        for r in replicas {
            if let Some(s) = self.segments.by_id_mut(r.seg) {
                s.alloc.tag(r.offset, size, tag);
            }
        }
    }

    /// Bytes of all mounted segments.
    fn capacity(&self) -> u64 {
        self.segments.values().map(|s| s.alloc.capacity()).sum()
    }

    /// Bytes of memory replicas charged to `tenant`.
    fn charged(&self, tenant: &str) -> u64 {
        match self.tenants.existing_tag(tenant) {
            Some(t) => self.segments.values().map(|s| s.alloc.tagged(t)).sum(),
            None => 0,
        }
    }

    /// Whether a write of `bytes` more memory for stored key `key` is
    /// admitted: TENANT_NOT_REGISTERED for a tenant without a policy,
    /// TENANT_QUOTA_EXCEEDED when its charge would pass its effective
    /// quota. Always admitted with multi-tenancy off.
    pub(crate) fn admit_write(&self, key: &str, bytes: u64) -> Result<(), ErrorCode> {
        if !self.tenants.enabled {
            return Ok(());
        }
        let tenant = tenant_of(key);
        self.tenants.admits(tenant)?;
        let quota = effective_quota(&self.tenants.policies, self.capacity(), tenant);
        if self.charged(tenant).saturating_add(bytes) > quota {
            return Err(ErrorCode::TenantQuotaExceeded);
        }
        Ok(())
    }

    /// The quota view of every known tenant, or of `only`.
    pub(crate) fn tenant_quotas(&self, only: Option<&str>) -> Vec<TenantQuota> {
        let eff = effective_quotas(&self.tenants.policies, self.capacity());
        let names = match only {
            Some(t) => vec![t.to_string()],
            None => self.tenants.known(),
        };
        names
            .into_iter()
            .filter(|t| {
                only.is_none()
                    || self.tenants.policies.contains_key(t)
                    || self.tenants.existing_tag(t).is_some()
            })
            .map(|t| {
                let requested = self.tenants.policies.get(&t).copied();
                let effective = eff.get(&t).copied().unwrap_or(0);
                let charged = self.charged(&t);
                TenantQuota {
                    requested_quota_bytes: requested.unwrap_or(0),
                    effective_quota_bytes: effective,
                    charged_bytes: charged,
                    admission_closed: requested.is_none(),
                    over_quota: charged > effective,
                    has_explicit_policy: requested.is_some(),
                    tenant_id: t,
                }
            })
            .collect()
    }

    /// Whether `tenant` owns any object.
    fn tenant_has_objects(&self, tenant: &str) -> bool {
        self.objects.keys().any(|k| tenant_of(k) == tenant)
    }
}

impl MasterState {
    /// The scope of a connection whose client names tenant `tenant_id`.
    pub(crate) fn tenant_scope(&self, tenant_id: &str) -> Result<Scope, ErrorCode> {
        if !valid_tenant(tenant_id) {
            return Err(ErrorCode::InvalidParams);
        }
        Ok(Scope::of(tenant_id, self.cfg.enable_multi_tenants))
    }

    /// `GET /api/v1/tenant_quotas[?tenant_id=]`.
    pub fn tenant_quotas(&self, only: Option<&str>) -> Result<Vec<TenantQuota>, QuotaAdminError> {
        if !self.cfg.enable_multi_tenants {
            return Err(QuotaAdminError::Disabled);
        }
        if let Some(t) = only {
            if !valid_tenant(t) {
                return Err(QuotaAdminError::Invalid(format!("invalid tenant_id {t:?}")));
            }
        }
        let v = self.inner.lock().tenant_quotas(only);
        if only.is_some() && v.is_empty() {
            return Err(QuotaAdminError::NotFound);
        }
        Ok(v)
    }

    /// `PUT /api/v1/tenant_quotas?tenant_id=`: set the tenant's requested
    /// quota (1 to 2^63 - 1 bytes) and write the policy file.
    pub fn upsert_tenant_quota(
        &self,
        tenant: &str,
        bytes: u64,
    ) -> Result<TenantQuota, QuotaAdminError> {
        if !self.cfg.enable_multi_tenants {
            return Err(QuotaAdminError::Disabled);
        }
        if !valid_tenant(tenant) {
            return Err(QuotaAdminError::Invalid(format!(
                "invalid tenant_id {tenant:?}"
            )));
        }
        if bytes == 0 || bytes > MAX_QUOTA {
            return Err(QuotaAdminError::Invalid(
                "requested_quota_bytes must be between 1 and 2^63 - 1".into(),
            ));
        }
        let mut g = self.inner.lock();
        let old = g.tenants.policies.insert(tenant.to_string(), bytes);
        if let Err(e) = g.tenants.save() {
            match old {
                Some(q) => g.tenants.policies.insert(tenant.to_string(), q),
                None => g.tenants.policies.remove(tenant),
            };
            return Err(QuotaAdminError::Store(e));
        }
        g.tenant_quotas(Some(tenant))
            .pop()
            .ok_or(QuotaAdminError::NotFound)
    }

    /// `DELETE /api/v1/tenant_quotas?tenant_id=`: remove the tenant's
    /// policy (TENANT_NOT_EMPTY while it owns objects or charged memory)
    /// and write the policy file. Returns the view before the removal.
    pub fn delete_tenant_quota(&self, tenant: &str) -> Result<TenantQuota, QuotaAdminError> {
        if !self.cfg.enable_multi_tenants {
            return Err(QuotaAdminError::Disabled);
        }
        if !valid_tenant(tenant) {
            return Err(QuotaAdminError::Invalid(format!(
                "invalid tenant_id {tenant:?}"
            )));
        }
        let mut g = self.inner.lock();
        let Some(view) = g.tenant_quotas(Some(tenant)).pop() else {
            return Err(QuotaAdminError::NotFound);
        };
        if !view.has_explicit_policy {
            return Err(QuotaAdminError::NotFound);
        }
        if view.charged_bytes > 0 || g.tenant_has_objects(tenant) {
            return Err(QuotaAdminError::NotEmpty);
        }
        let old = g.tenants.policies.remove(tenant);
        if let Err(e) = g.tenants.save() {
            if let Some(q) = old {
                g.tenants.policies.insert(tenant.to_string(), q);
            }
            return Err(QuotaAdminError::Store(e));
        }
        Ok(view)
    }
}

#[cfg(test)]
mod tests {
    use crate::config::MasterConfig;
    use crate::metrics::MasterMetrics;
    use crate::state::MasterState;
    use crate::tenants::Scope;
    use mooncake_common::proto::{PutStartItem, SegmentDesc, WriteConfig};
    use mooncake_common::ErrorCode;
    use std::sync::Arc;

    const KIB: u64 = 1 << 10;

    fn state(policy: &str) -> Arc<MasterState> {
        let path = std::env::temp_dir().join(format!(
            "mc-quota-{}-{}.yaml",
            std::process::id(),
            rand::random::<u32>()
        ));
        std::fs::write(&path, policy).expect("policy file");
        let cfg = MasterConfig {
            enable_multi_tenants: true,
            tenant_quota_file: path.to_string_lossy().into_owned(),
            ..MasterConfig::default()
        };
        let st = MasterState::new(cfg, Arc::new(MasterMetrics::default()), None);
        let desc = SegmentDesc {
            name: "h:1".into(),
            uuid: "u1".into(),
            size: 1 << 20,
            base_addr: 0,
            host_id: "host".into(),
            pid: 1,
            endpoint: "h:1".into(),
            socket_name: String::new(),
        };
        st.mount_segment("c1", desc).expect("mount");
        st
    }

    /// Write `key` of `size` bytes as tenant `scope`; the item's code.
    fn put(st: &MasterState, scope: &Scope, key: &str, size: u64) -> Result<(), ErrorCode> {
        let k = scope.stored(key.to_string());
        let mut items = st.put_start(
            std::slice::from_ref(&k),
            &[size],
            &WriteConfig::default(),
            false,
        );
        match items.remove(0) {
            PutStartItem::Write { version, .. } => {
                st.commit_end(&[k], &[version], &["h:1".to_string()])?;
                Ok(())
            }
            PutStartItem::Err(e) => Err(e),
            PutStartItem::AlreadyExists => Err(ErrorCode::ObjectAlreadyExists),
        }
    }

    fn charged(st: &MasterState, tenant: &str) -> u64 {
        st.tenant_quotas(Some(tenant))
            .ok()
            .and_then(|mut v| v.pop())
            .map_or(0, |q| q.charged_bytes)
    }

    #[test]
    fn a_tenant_is_charged_its_replicas_until_they_are_freed() {
        let st =
            state("version: 1\ntenants:\n  - {name: a, quota: 8KB}\n  - {name: b, quota: 512KB}\n");
        let (a, b) = (Scope::of("a", true), Scope::of("b", true));
        assert_eq!(put(&st, &a, "k1", 4 * KIB), Ok(()));
        assert_eq!(put(&st, &a, "k2", 4 * KIB), Ok(()));
        assert_eq!(charged(&st, "a"), 8 * KIB);
        assert_eq!(put(&st, &a, "k3", 1), Err(ErrorCode::TenantQuotaExceeded));
        // Same key, another tenant: its own object, its own charge.
        assert_eq!(put(&st, &b, "k1", 4 * KIB), Ok(()));
        assert_eq!(charged(&st, "b"), 4 * KIB);
        // (A removal frees the space once the owner acknowledged the
        // forget: the real-process test covers it.)
        // Unregistered tenants, the default one included, write nothing.
        assert_eq!(
            put(&st, &Scope::of("c", true), "k", 1),
            Err(ErrorCode::TenantNotRegistered)
        );
        assert_eq!(
            put(&st, &Scope::of("default", true), "k", 1),
            Err(ErrorCode::TenantNotRegistered)
        );
        // An unmounted segment takes its charges with it.
        st.unmount_segment("c1", "h:1").expect("unmount");
        assert_eq!((charged(&st, "a"), charged(&st, "b")), (0, 0));
    }

    #[test]
    fn quotas_beyond_the_memory_are_shared_in_proportion() {
        // 1 MiB mounted, 3 MiB asked for: a gets 3/4 of the segment.
        let st =
            state("version: 1\ntenants:\n  - {name: a, quota: 3MB}\n  - {name: b, quota: 1MB}\n");
        let q = st.tenant_quotas(None).expect("multi-tenant");
        let eff: Vec<(String, u64)> = q
            .iter()
            .map(|t| (t.tenant_id.clone(), t.effective_quota_bytes))
            .collect();
        assert_eq!(
            eff,
            vec![("a".to_string(), 768 * KIB), ("b".to_string(), 256 * KIB)]
        );
        let a = Scope::of("a", true);
        assert_eq!(
            put(&st, &a, "big", 768 * KIB + 64),
            Err(ErrorCode::TenantQuotaExceeded)
        );
        assert_eq!(put(&st, &a, "fits", 768 * KIB), Ok(()));
    }

    #[test]
    fn the_admin_api_checks_its_input_and_keeps_non_empty_tenants() {
        let st = state("version: 1\ntenants:\n  - {name: a, quota: 1MB}\n");
        use crate::tenants::QuotaAdminError as E;
        assert!(matches!(
            st.upsert_tenant_quota("_x", 1),
            Err(E::Invalid(_))
        ));
        assert!(matches!(st.upsert_tenant_quota("x", 0), Err(E::Invalid(_))));
        assert!(matches!(
            st.upsert_tenant_quota("x", u64::MAX),
            Err(E::Invalid(_))
        ));
        assert_eq!(st.tenant_quotas(Some("x")), Err(E::NotFound));
        assert_eq!(put(&st, &Scope::of("a", true), "k", KIB), Ok(()));
        assert_eq!(st.delete_tenant_quota("a"), Err(E::NotEmpty));
        let q = st.upsert_tenant_quota("x", 5).expect("upsert");
        assert_eq!((q.requested_quota_bytes, q.has_explicit_policy), (5, true));
        assert_eq!(
            st.delete_tenant_quota("x").map(|q| q.tenant_id),
            Ok("x".to_string())
        );
        assert_eq!(st.delete_tenant_quota("x"), Err(E::NotFound));
        let off = MasterState::new(
            MasterConfig::default(),
            Arc::new(MasterMetrics::default()),
            None,
        );
        assert_eq!(off.tenant_quotas(None), Err(E::Disabled));
    }
}
