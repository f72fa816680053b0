//! Device manifests: written with every emulator run, accepted back (`--sim-manifest FILE`) to
//! reproduce it; shared by every family (each writes its own `device` name).

use std::io::Read;
use std::path::Path;

use kvprobe_reference::Model;
use kvprobe_schema::{ModelIdentity, SimManifest, SCHEMA_VERSION};
use sha2::{Digest, Sha256};

use crate::{Error, Result};

fn io_err(path: &Path, e: std::io::Error) -> Error {
    Error::Io {
        path: path.to_path_buf(),
        detail: format!("could not read ({e}); check the path"),
    }
}

fn hash_file(h: &mut Sha256, path: &Path) -> Result<()> {
    let mut f = std::fs::File::open(path).map_err(|e| io_err(path, e))?;
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = f.read(&mut buf).map_err(|e| io_err(path, e))?;
        if n == 0 {
            return Ok(());
        }
        h.update(&buf[..n]);
    }
}

/// Identity of the weights a device was built for: sha256 of the `.gguf` file, or of a folder's
/// `config.json` and `*.safetensors` files in name order. A digest is remembered for the process
/// by each file's path, length and modification time: a diagnosis builds one emulator per
/// replayed hypothesis (issue 34), and hashing SmolLM2's 98 MB for each of them cost more than
/// a replay's own prefill.
pub fn model_identity(model: &Model) -> Result<ModelIdentity> {
    let path = model.source();
    let sha256 = if path.is_file() {
        remembered_digest(&[path.to_path_buf()], false)?
    } else if path.is_dir() {
        let mut files: Vec<_> = std::fs::read_dir(path)
            .map_err(|e| io_err(path, e))?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| {
                p.file_name().is_some_and(|n| n == "config.json")
                    || p.extension().is_some_and(|x| x == "safetensors")
            })
            .collect();
        files.sort();
        remembered_digest(&files, true)?
    } else {
        // in-memory weights: identity by configuration only
        let mut h = Sha256::new();
        h.update(format!("{:?}", model.config()).as_bytes());
        hex(&h.finalize())
    };
    Ok(ModelIdentity {
        path: path.display().to_string(),
        sha256,
        architecture: model.config().architecture.clone(),
    })
}

fn hex(digest: &[u8]) -> String {
    digest.iter().map(|b| format!("{b:02x}")).collect()
}

/// What a file's digest is remembered by: its path, length and modification time.
type Stamp = Vec<(std::path::PathBuf, u64, Option<std::time::SystemTime>)>;

/// sha256 of `files` in order (each name first when `named`), remembered by their stamps.
fn remembered_digest(files: &[std::path::PathBuf], named: bool) -> Result<String> {
    use std::collections::HashMap;
    use std::sync::{Mutex, OnceLock};
    static DIGESTS: OnceLock<Mutex<HashMap<(Stamp, bool), String>>> = OnceLock::new();
    let mut stamp: Stamp = Vec::with_capacity(files.len());
    for f in files {
        let m = std::fs::metadata(f).map_err(|e| io_err(f, e))?;
        stamp.push((f.clone(), m.len(), m.modified().ok()));
    }
    let key = (stamp, named);
    let memo = DIGESTS.get_or_init(|| Mutex::new(HashMap::new()));
    if let Some(d) = memo.lock().ok().and_then(|m| m.get(&key).cloned()) {
        return Ok(d);
    }
    let mut h = Sha256::new();
    for f in files {
        if named {
            h.update(
                f.file_name()
                    .map(|n| n.to_string_lossy().into_owned())
                    .unwrap_or_default()
                    .as_bytes(),
            );
        }
        hash_file(&mut h, f)?;
    }
    let d = hex(&h.finalize());
    if let Ok(mut m) = memo.lock() {
        m.insert(key, d.clone());
    }
    Ok(d)
}

pub fn write(m: &SimManifest, path: &Path) -> Result<()> {
    let text = serde_json::to_string_pretty(m).map_err(|e| Error::Manifest {
        path: path.to_path_buf(),
        detail: format!("could not serialise ({e})"),
    })?;
    std::fs::write(path, text).map_err(|e| Error::Io {
        path: path.to_path_buf(),
        detail: format!("could not write the sim manifest ({e}); check the output folder"),
    })
}

/// The largest manifest read: a real one is tens of kilobytes (a quant info per edge).
pub const MAX_MANIFEST_BYTES: u64 = 16 << 20;

/// Why [`read_capped`] would not read a file.
#[derive(Debug, thiserror::Error)]
pub enum CappedReadError {
    #[error("cannot read it ({0}); check the path")]
    Io(#[from] std::io::Error),
    #[error("it is {0}, not a regular file; pass the file itself")]
    NotAFile(&'static str),
    #[error("it is {len} bytes, more than the {max} kvprobe reads for it; pass the right file")]
    TooLarge { len: u64, max: u64 },
}

fn kind_of(t: std::fs::FileType) -> &'static str {
    use std::os::unix::fs::FileTypeExt;
    if t.is_dir() {
        "a folder"
    } else if t.is_fifo() {
        "a pipe"
    } else if t.is_char_device() || t.is_block_device() {
        "a device"
    } else if t.is_socket() {
        "a socket"
    } else {
        "not a regular file"
    }
}

/// The bytes of a regular file of at most `max` bytes. The type is checked before opening (a
/// FIFO would block the open) and again on the handle (the path may have changed), and the read
/// stops at `max + 1` bytes, so a pipe, `/dev/zero`, a folder or a huge sparse file is refused
/// before memory grows.
pub fn read_capped(path: &Path, max: u64) -> std::result::Result<Vec<u8>, CappedReadError> {
    let meta = std::fs::metadata(path)?;
    if !meta.is_file() {
        return Err(CappedReadError::NotAFile(kind_of(meta.file_type())));
    }
    let f = std::fs::File::open(path)?;
    let meta = f.metadata()?;
    if !meta.is_file() {
        return Err(CappedReadError::NotAFile(kind_of(meta.file_type())));
    }
    if meta.len() > max {
        return Err(CappedReadError::TooLarge {
            len: meta.len(),
            max,
        });
    }
    let mut bytes = Vec::with_capacity(meta.len() as usize);
    f.take(max.saturating_add(1)).read_to_end(&mut bytes)?;
    if bytes.len() as u64 > max {
        // it grew while being read
        return Err(CappedReadError::TooLarge {
            len: bytes.len() as u64,
            max,
        });
    }
    Ok(bytes)
}

pub fn read(path: &Path) -> Result<SimManifest> {
    let bytes = read_capped(path, MAX_MANIFEST_BYTES).map_err(|e| Error::Manifest {
        path: path.to_path_buf(),
        detail: format!("not read as a sim manifest: {e}"),
    })?;
    let m: SimManifest = serde_json::from_slice(&bytes).map_err(|e| Error::Manifest {
        path: path.to_path_buf(),
        detail: format!(
            "not a sim manifest ({}); pass the sim-manifest.json a previous run wrote",
            crate::error::one_line(&e.to_string())
        ),
    })?;
    if m.schema_version > SCHEMA_VERSION {
        return Err(Error::Manifest {
            path: path.to_path_buf(),
            detail: format!(
                "schema version {} is newer than this kvprobe's {SCHEMA_VERSION}; upgrade kvprobe",
                m.schema_version
            ),
        });
    }
    check_values(&m).map_err(|detail| Error::Manifest {
        path: path.to_path_buf(),
        detail: format!("{detail}; write a new manifest (a run records one)"),
    })?;
    Ok(m)
}

/// Values no emulated compile produces: a quant scale that is not a positive finite number would
/// quantise every value to one level (or to NaN) and steer the diagnosis to a wrong verdict.
fn check_values(m: &SimManifest) -> std::result::Result<(), String> {
    for n in &m.quant {
        let q = &n.quant;
        if !(q.scale.is_finite() && q.scale > 0.0) {
            return Err(format!(
                "quant info `{}` has scale {}, not a positive finite number",
                n.name, q.scale
            ));
        }
        for (what, x) in [("zero_point", q.zero_point), ("min", q.min), ("max", q.max)] {
            if !x.is_finite() {
                return Err(format!("quant info `{}` has {what} {x}", n.name));
            }
        }
    }
    Ok(())
}

/// Refuse a manifest made for other weights.
pub fn check_model(m: &SimManifest, id: &ModelIdentity, path: &Path) -> Result<()> {
    if m.model.sha256 != id.sha256 || m.model.architecture != id.architecture {
        return Err(Error::Manifest {
            path: path.to_path_buf(),
            detail: format!(
                "made for {} ({}, sha256 {}…), not for {} ({}, sha256 {}…); pass the model the manifest was written with",
                m.model.path,
                m.model.architecture,
                &m.model.sha256.get(..12).unwrap_or(""),
                id.path,
                id.architecture,
                &id.sha256.get(..12).unwrap_or("")
            ),
        });
    }
    Ok(())
}

/// Group prefix from a model path: the file stem, lower case, `[a-z0-9_]` only.
pub fn scope_name(path: &Path) -> String {
    let stem = path
        .file_stem()
        .map(|s| s.to_string_lossy().to_lowercase())
        .unwrap_or_default();
    let s: String = stem
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
        .collect();
    if s.is_empty() || s.chars().all(|c| c == '_') {
        "model".into()
    } else {
        s
    }
}
