//! `get_replica_desc` / `batch_get_replica_desc` and upstream's replica
//! descriptor classes (`ReplicaDescriptor`, `MemoryDescriptor`,
//! `DiskDescriptor`, `Descriptor`). The lookup is the client's
//! ([`mooncake_client::Client::replica_descs`]).

use super::class::MooncakeDistributedStore;
use super::config::ReplicaStatus;
use crate::report::Call;
use mooncake_client::ReplicaDesc;
use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;
use pyo3::types::PyDict;

/// Where a memory replica's bytes are (upstream's
/// `AllocatedBuffer::Descriptor`).
#[pyclass(module = "mooncake.store", get_all, set_all)]
#[derive(Clone, Debug, Default)]
pub struct Descriptor {
    /// Bytes.
    size: u64,
    /// Address in the owner's address space.
    buffer_address: u64,
    /// The owner's data endpoint.
    transport_endpoint: String,
}

#[pymethods]
impl Descriptor {
    #[new]
    fn py_new() -> Self {
        Self::default()
    }

    fn __repr__(&self) -> String {
        format!(
            "<Descriptor size={} buffer_address={} transport_endpoint={}>",
            self.size, self.buffer_address, self.transport_endpoint
        )
    }
}

/// A memory replica's location.
#[pyclass(module = "mooncake.store", get_all, set_all)]
#[derive(Clone, Debug)]
pub struct MemoryDescriptor {
    /// Its buffer.
    buffer_descriptor: Descriptor,
}

/// A replica in a shared file system (this build keeps none: disk copies
/// are local-disk replicas).
#[pyclass(module = "mooncake.store", get_all, set_all)]
#[derive(Clone, Debug, Default)]
pub struct DiskDescriptor {
    /// The file.
    file_path: String,
    /// Bytes.
    object_size: u64,
}

/// One replica of an object.
#[pyclass(module = "mooncake.store", frozen)]
#[derive(Clone, Debug)]
pub struct ReplicaDescriptor(ReplicaDesc);

#[pymethods]
impl ReplicaDescriptor {
    /// Replicas a lookup returns are complete.
    #[getter]
    fn status(&self) -> ReplicaStatus {
        ReplicaStatus::Complete
    }

    /// A copy in a segment's memory.
    fn is_memory_replica(&self) -> bool {
        matches!(self.0, ReplicaDesc::Memory { .. })
    }

    /// A copy in a shared file system: never in this build.
    fn is_disk_replica(&self) -> bool {
        false
    }

    /// A copy in the disk tier of the process owning a segment.
    fn is_local_disk_replica(&self) -> bool {
        matches!(self.0, ReplicaDesc::LocalDisk { .. })
    }

    /// The memory location; `RuntimeError` for another kind of replica.
    fn get_memory_descriptor(&self) -> PyResult<MemoryDescriptor> {
        match &self.0 {
            ReplicaDesc::Memory {
                size,
                buffer_address,
                transport_endpoint,
            } => Ok(MemoryDescriptor {
                buffer_descriptor: Descriptor {
                    size: *size,
                    buffer_address: *buffer_address,
                    transport_endpoint: transport_endpoint.clone(),
                },
            }),
            _ => Err(PyRuntimeError::new_err("Expected MemoryDescriptor")),
        }
    }

    /// The shared-file-system location: `RuntimeError` (this build keeps
    /// no such replica).
    fn get_disk_descriptor(&self) -> PyResult<DiskDescriptor> {
        Err(PyRuntimeError::new_err("Expected DiskDescriptor"))
    }

    fn __repr__(&self) -> String {
        match &self.0 {
            ReplicaDesc::Memory {
                size,
                transport_endpoint,
                ..
            } => format!("<ReplicaDescriptor memory size={size} endpoint={transport_endpoint}>"),
            ReplicaDesc::LocalDisk {
                object_size,
                transport_endpoint,
            } => format!(
                "<ReplicaDescriptor local_disk size={object_size} endpoint={transport_endpoint}>"
            ),
        }
    }
}

#[pymethods]
impl MooncakeDistributedStore {
    /// `get_replica_desc(key) -> list[ReplicaDescriptor]`: the object's
    /// replicas in the order a read prefers them; `[]` (logged) when the
    /// key is missing or the lookup fails.
    fn get_replica_desc(&self, py: Python<'_>, key: String) -> Vec<ReplicaDescriptor> {
        let keys = [key];
        let r = self
            .run(py, |s| Ok(s.replica_descs(&keys)))
            .and_then(|mut v| v.pop().unwrap_or_else(|| Ok(Vec::new())));
        Call::new(py, "get_replica_desc")
            .ok(Some(&keys[0]), r)
            .unwrap_or_default()
            .into_iter()
            .map(ReplicaDescriptor)
            .collect()
    }

    /// `batch_get_replica_desc(keys) -> dict[str, list[ReplicaDescriptor]]`:
    /// the found keys only; each key that is missing or failed is logged.
    fn batch_get_replica_desc<'py>(
        &self,
        py: Python<'py>,
        keys: Vec<String>,
    ) -> PyResult<Bound<'py, PyDict>> {
        let out = PyDict::new(py);
        let call = Call::new(py, "batch_get_replica_desc");
        let Some(results) = call.ok(None, self.run(py, |s| Ok(s.replica_descs(&keys)))) else {
            return Ok(out);
        };
        for (key, r) in keys.iter().zip(results) {
            if let Some(descs) = call.ok(Some(key), r) {
                let list: Vec<ReplicaDescriptor> =
                    descs.into_iter().map(ReplicaDescriptor).collect();
                out.set_item(key, list)?;
            }
        }
        Ok(out)
    }
}

/// Add the descriptor classes to the module.
pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<ReplicaStatus>()?;
    m.add_class::<Descriptor>()?;
    m.add_class::<MemoryDescriptor>()?;
    m.add_class::<DiskDescriptor>()?;
    m.add_class::<ReplicaDescriptor>()?;
    Ok(())
}
