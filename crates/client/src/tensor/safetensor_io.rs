//! `save_tensor_to_safetensor` / `load_tensor_from_safetensor`: a stored
//! tensor object to a safetensors file and back. The format rules are
//! `mooncake_tensor`'s (`object_to_safetensors`, `tensor_from_safetensors`);
//! this module moves the bytes: the object is read whole into memory, the
//! file is mapped and its payload written straight from the mapping (one
//! batched write of header and payload).

use crate::config::ReplicateConfig;
use crate::error::{Error, Result};
use mooncake_tensor::{object_to_safetensors, tensor_from_safetensors, TensorHeader, HEADER_SIZE};
use std::path::Path;

/// A tensor loaded from a file into the store.
#[derive(Debug)]
pub struct LoadedTensor {
    /// The store key it was written under.
    pub key: String,
    /// The file's tensor name that was used.
    pub name: String,
    /// Whether that name was the key asked for.
    pub matched: bool,
    /// Its header (dtype, shape).
    pub header: TensorHeader,
    map: memmap2::Mmap,
    start: usize,
}

impl LoadedTensor {
    /// The payload bytes (in the file's mapping).
    pub fn data(&self) -> &[u8] {
        &self.map[self.start..self.start + self.header.data_bytes as usize]
    }
}

/// The object calls a safetensors export or import needs; every store
/// (`StoreApi`) has them.
pub trait ObjectIo {
    /// Size of the object stored under `key`.
    fn object_size(&self, key: &str) -> Result<u64>;

    /// Read the object `key` into `ptr..ptr+size`; returns bytes read.
    ///
    /// # Safety
    /// `ptr..ptr+size` must be writable for the duration of the call.
    unsafe fn read_object_into(&self, key: &str, ptr: usize, size: usize) -> Result<u64>;

    /// Store each key from its list of buffers.
    ///
    /// # Safety
    /// Every buffer must be readable for the duration of the call.
    unsafe fn write_objects_from(
        &self,
        keys: &[String],
        all_ptrs: &[Vec<usize>],
        all_sizes: &[Vec<usize>],
        cfg: &ReplicateConfig,
    ) -> Result<Vec<Result<()>>>;

    /// Write the tensor object `key` to `path` as a safetensors file holding
    /// it under the name `key`. OBJECT_NOT_FOUND when the key is missing.
    fn save_safetensor(&self, key: &str, path: &Path) -> Result<()> {
        save_safetensor(self, key, path)
    }

    /// Store the tensor of safetensors file `path` under `key` (the path
    /// when `None`): the tensor named `key` in the file, else the first name
    /// in sorted order.
    fn load_safetensor(&self, key: Option<&str>, path: &Path) -> Result<LoadedTensor> {
        load_safetensor(self, key, path)
    }
}

fn save_safetensor<S: ObjectIo + ?Sized>(s: &S, key: &str, path: &Path) -> Result<()> {
    let size = s.object_size(key)?;
    let mut object =
        vec![0u8; usize::try_from(size).map_err(|_| Error::invalid("object too large"))?];
    // SAFETY: `object` is a live, writable allocation of `size` bytes.
    let got = unsafe { s.read_object_into(key, object.as_mut_ptr() as usize, object.len())? };
    object.truncate(got as usize);
    let file = object_to_safetensors(key, &object).map_err(Error::from)?;
    std::fs::write(path, file)
        .map_err(|e| Error::invalid(format!("cannot write {}: {e}", path.display())))
}

fn load_safetensor<S: ObjectIo + ?Sized>(
    s: &S,
    key: Option<&str>,
    path: &Path,
) -> Result<LoadedTensor> {
    let store_key = key.map_or_else(|| path.to_string_lossy().into_owned(), str::to_string);
    let file = std::fs::File::open(path)
        .map_err(|e| Error::invalid(format!("cannot open {}: {e}", path.display())))?;
    // SAFETY: the mapping is read-only and private to this call; a file
    // changed underneath by another process yields wrong bytes, not UB
    // in safe code that copies out of it.
    let map = unsafe { memmap2::Mmap::map(&file) }
        .map_err(|e| Error::invalid(format!("cannot map {}: {e}", path.display())))?;
    let (name, matched, header, start) = {
        let t = tensor_from_safetensors(&map, key).map_err(Error::from)?;
        let start = t.data.as_ptr() as usize - map.as_ptr() as usize;
        (t.name, t.matched, t.header, start)
    };
    let head: [u8; HEADER_SIZE] = header.encode();
    let loaded = LoadedTensor {
        key: store_key,
        name,
        matched,
        header,
        map,
        start,
    };
    let data = loaded.data();
    let ptrs = vec![vec![head.as_ptr() as usize, data.as_ptr() as usize]];
    let sizes = vec![vec![HEADER_SIZE, data.len()]];
    // SAFETY: `head` and the mapping outlive the call and are readable.
    let mut r = unsafe {
        s.write_objects_from(
            std::slice::from_ref(&loaded.key),
            &ptrs,
            &sizes,
            &ReplicateConfig::default(),
        )?
    };
    r.pop()
        .unwrap_or_else(|| Err(Error::internal("no result")))?;
    Ok(loaded)
}
