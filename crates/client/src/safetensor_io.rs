//! `save_tensor_to_safetensor` / `load_tensor_from_safetensor`: a stored
//! tensor object to a safetensors file and back. The format rules are
//! `mooncake_tensor`'s (`object_to_safetensors`, `tensor_from_safetensors`);
//! this module moves the bytes: the object is read whole into memory, the
//! file is mapped and its payload written straight from the mapping (one
//! batched write of header and payload).

use crate::client::Client;
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

impl Client {
    /// Write the tensor object `key` to `path` as a safetensors file holding
    /// it under the name `key`. OBJECT_NOT_FOUND when the key is missing.
    pub fn save_safetensor(&self, key: &str, path: &Path) -> Result<()> {
        let size = self.get_size(key)?;
        let mut object =
            vec![0u8; usize::try_from(size).map_err(|_| Error::invalid("object too large"))?];
        // SAFETY: `object` is a live, writable allocation of `size` bytes.
        let got = unsafe { self.get_into(key, object.as_mut_ptr() as usize, object.len())? };
        object.truncate(got as usize);
        let file = object_to_safetensors(key, &object).map_err(Error::from)?;
        std::fs::write(path, file)
            .map_err(|e| Error::invalid(format!("cannot write {}: {e}", path.display())))
    }

    /// Store the tensor of safetensors file `path` under `key` (the path
    /// when `None`): the tensor named `key` in the file, else the first name
    /// in sorted order.
    pub fn load_safetensor(&self, key: Option<&str>, path: &Path) -> Result<LoadedTensor> {
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
            self.batch_put_from_multi_buffers(
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
}
