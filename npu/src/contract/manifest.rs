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
/// `config.json` and `*.safetensors` files in name order.
pub fn model_identity(model: &Model) -> Result<ModelIdentity> {
    let path = model.source();
    let mut h = Sha256::new();
    if path.is_file() {
        hash_file(&mut h, path)?;
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
        for f in files {
            h.update(
                f.file_name()
                    .map(|n| n.to_string_lossy().into_owned())
                    .unwrap_or_default()
                    .as_bytes(),
            );
            hash_file(&mut h, &f)?;
        }
    } else {
        // in-memory weights: identity by configuration only
        h.update(format!("{:?}", model.config()).as_bytes());
    }
    let digest = h.finalize();
    Ok(ModelIdentity {
        path: path.display().to_string(),
        sha256: digest.iter().map(|b| format!("{b:02x}")).collect(),
        architecture: model.config().architecture.clone(),
    })
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

pub fn read(path: &Path) -> Result<SimManifest> {
    let text = std::fs::read_to_string(path).map_err(|e| io_err(path, e))?;
    let m: SimManifest = serde_json::from_str(&text).map_err(|e| Error::Manifest {
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
    Ok(m)
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
