//! STUB — replaced by the master-io branch at merge.
#[derive(Default)]
pub struct MetadataKv {}
impl MetadataKv {
    pub fn delete(&self, _key: &str) -> bool {
        false
    }
}
