//! The embedding cache: an append-only file of tool vectors, so a restart embeds nothing it has seen.

use std::collections::HashMap;
use std::io::{Read as _, Write as _};
use std::os::unix::fs::FileExt as _;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use parking_lot::Mutex;
use sha2::{Digest, Sha256};

use super::{Embedder, Hash, SemanticError, Vector, TEXT_FORMAT, TOOL_MAX_TOKENS};

/// Names the cache file: the model, the text format and the truncation, so no cache is read for another.
pub(super) fn fingerprint(embedder: &dyn Embedder) -> String {
    let mut hasher = Sha256::new();
    hasher.update(TEXT_FORMAT);
    hasher.update(TOOL_MAX_TOKENS.to_le_bytes());
    hasher.update(embedder.fingerprint());
    hasher.finalize().iter().take(8).map(|b| format!("{b:02x}")).collect()
}

/// Deletes the caches of other models or text formats in `dir` (one satellite, one model): they are never read
/// again and each holds 1.5 KiB per tool text.
fn remove_other_caches(dir: &Path, keep: &str) {
    let Ok(entries) = std::fs::read_dir(dir) else { return };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let name = name.to_string_lossy();
        if name.starts_with("embeddings-") && name.ends_with(".bin") && name != keep {
            match std::fs::remove_file(entry.path()) {
                Ok(()) => {
                    tracing::info!(path = %entry.path().display(), "removed the embedding cache of another model or text format")
                }
                Err(error) => {
                    tracing::warn!(path = %entry.path().display(), %error, "cannot remove an old embedding cache")
                }
            }
        }
    }
}

/// The append-only vector cache: records of a 32-byte hash and `dimensions` little-endian f32s, and in memory
/// only where each record starts.
pub(super) struct Cache {
    pub(super) path: PathBuf,
    pub(super) file: Mutex<CacheFile>,
    pub(super) dimensions: usize,
}

pub(super) struct CacheFile {
    pub(super) file: std::fs::File,
    /// Where each hash's vector starts.
    pub(super) offsets: HashMap<Hash, u64>,
    /// The file's length: where the next record goes.
    pub(super) end: u64,
    /// A write failed part-way: the file's end is unknown until the next start cuts the torn tail.
    pub(super) failed: bool,
}

impl Cache {
    /// Opens (or creates) the cache and indexes its whole records; a torn tail is cut off so later appends
    /// stay aligned.
    pub(super) fn open(dir: &Path, fingerprint: &str, dimensions: usize) -> Result<Cache, SemanticError> {
        let name = format!("embeddings-{fingerprint}.bin");
        let path = dir.join(&name);
        let error = |source| SemanticError::Cache { path: path.display().to_string(), source };
        std::fs::create_dir_all(dir).map_err(error)?;
        remove_other_caches(dir, &name);
        let mut file = std::fs::OpenOptions::new().create(true).read(true).append(true).open(&path).map_err(error)?;
        let record = 32 + 4 * dimensions as u64;
        let length = file.metadata().map_err(error)?.len();
        let end = length / record * record;
        if end != length {
            tracing::warn!(path = %path.display(), dropped = length - end, "embedding cache ends in a torn record; dropping it");
            file.set_len(end).map_err(error)?;
        }
        let mut offsets = HashMap::with_capacity((end / record) as usize);
        let mut reader = std::io::BufReader::new(&mut file);
        let mut hash = [0u8; 32];
        let mut skip = vec![0u8; 4 * dimensions];
        let mut offset = 0;
        while offset < end {
            reader.read_exact(&mut hash).map_err(error)?;
            reader.read_exact(&mut skip).map_err(error)?;
            offsets.insert(hash, offset + 32);
            offset += record;
        }
        Ok(Cache { path, file: Mutex::new(CacheFile { file, offsets, end, failed: false }), dimensions })
    }

    pub(super) fn records(&self) -> usize {
        self.file.lock().offsets.len()
    }

    /// The cached vectors of `work` and the work left to embed. Each record is read whole and its hash checked:
    /// a record that does not match (the file changed under this process) or cannot be read is forgotten and
    /// embedded again.
    pub(super) fn read_many(&self, work: Vec<(Hash, String)>) -> (Vec<Vector>, Vec<(Hash, String)>) {
        let mut file = self.file.lock();
        let mut record = vec![0u8; 32 + 4 * self.dimensions];
        let (mut found, mut new) = (Vec::new(), Vec::new());
        for (hash, text) in work {
            let Some(&offset) = file.offsets.get(&hash) else {
                new.push((hash, text));
                continue;
            };
            let read = file.file.read_exact_at(&mut record, offset - 32);
            if read.is_err() || record[..32] != hash {
                tracing::warn!(path = %self.path.display(), error = ?read.err(), "a cached vector is not where it was indexed; embedding it again");
                file.offsets.remove(&hash);
                new.push((hash, text));
                continue;
            }
            let vector: Arc<[f32]> =
                record[32..].chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect();
            found.push((hash, vector));
        }
        (found, new)
    }

    /// Appends the records in one write (a crash leaves at most one torn record at the end); vectors of the
    /// wrong length are skipped.
    pub(super) fn append(&self, records: &[(Hash, Arc<[f32]>)]) -> std::io::Result<()> {
        let mut bytes = Vec::new();
        let mut written = Vec::new();
        let mut file = self.file.lock();
        if file.failed {
            return Err(std::io::Error::other(
                "an earlier write failed; the cache takes no more records until restart",
            ));
        }
        let planned_start = file.end;
        for (hash, vector) in records {
            if vector.len() != self.dimensions || file.offsets.contains_key(hash) {
                continue;
            }
            written.push((*hash, file.end + bytes.len() as u64 + 32));
            bytes.extend_from_slice(hash);
            for value in vector.iter() {
                bytes.extend_from_slice(&value.to_le_bytes());
            }
        }
        if bytes.is_empty() {
            return Ok(());
        }
        if let Err(error) = file.file.write_all(&bytes) {
            // What part of the write landed is unknown: the next start cuts a torn tail, and nothing after it
            // is written here (offsets past the tail would be wrong).
            file.failed = true;
            return Err(error);
        }
        // The write went to the file's end (append mode), wherever that was: offsets follow the real length, and
        // each read checks the record's hash in case another writer interleaved.
        let length = file.file.metadata()?.len();
        let start = length.saturating_sub(bytes.len() as u64);
        file.end = length;
        file.offsets.extend(written.into_iter().map(|(hash, offset)| (hash, offset - planned_start + start)));
        Ok(())
    }
}
