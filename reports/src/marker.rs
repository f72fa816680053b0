//! The marker kvprobe writes into every run folder it makes (`kvprobe-run.json`): the names of
//! the files it wrote there and results.json's SHA-256. `--force` replaces a folder only when
//! the marker accounts for everything in it: a folder that merely holds a file named
//! results.json (another tool's, an empty one, a link) used to be deleted whole, with the
//! user's files and even the model beside it.

use std::collections::BTreeSet;
use std::path::Path;

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::error::{Error, Result};
use crate::RESULTS_JSON;

pub const MARKER: &str = "kvprobe-run.json";

/// A marker is a few kilobytes; anything larger is not ours.
const MAX_MARKER_BYTES: u64 = 1 << 20;

const WRITTEN_BY: &str = "kvprobe";

#[derive(Debug, Serialize, Deserialize)]
struct Marker {
    written_by: String,
    kvprobe_version: String,
    /// Every file kvprobe put in the folder (names, no paths: a run folder is flat).
    files: BTreeSet<String>,
    /// results.json as kvprobe wrote it.
    results_sha256: Option<String>,
}

fn sha256(path: &Path) -> Result<String> {
    let bytes = std::fs::read(path).map_err(|e| Error::io(path, e))?;
    Ok(Sha256::digest(&bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect())
}

/// Writes the marker of `dir`, a folder kvprobe has just filled (a fresh temporary folder, so
/// every regular file in it is kvprobe's).
pub(crate) fn write_for(dir: &Path) -> Result<()> {
    let mut files = BTreeSet::new();
    for e in std::fs::read_dir(dir).map_err(|e| Error::io(dir, e))? {
        let e = e.map_err(|e| Error::io(dir, e))?;
        if e.file_type().is_ok_and(|t| t.is_file()) {
            files.insert(e.file_name().to_string_lossy().into_owned());
        }
    }
    files.remove(MARKER);
    let results = dir.join(RESULTS_JSON);
    let results_sha256 = if files.contains(RESULTS_JSON) {
        Some(sha256(&results)?)
    } else {
        None
    };
    save(
        dir,
        &Marker {
            written_by: WRITTEN_BY.into(),
            kvprobe_version: env!("CARGO_PKG_VERSION").into(),
            files,
            results_sha256,
        },
    )
}

fn save(dir: &Path, m: &Marker) -> Result<()> {
    let json = serde_json::to_string_pretty(m).map_err(Error::Serialize)?;
    crate::fsio::write_atomic(&dir.join(MARKER), format!("{json}\n").as_bytes())
}

/// The marker of `dir` when it is a regular file kvprobe wrote (never read through a link).
fn read(dir: &Path) -> Option<Marker> {
    let path = dir.join(MARKER);
    let meta = std::fs::symlink_metadata(&path).ok()?;
    if !meta.is_file() {
        return None;
    }
    let bytes = crate::fsio::read_capped(&path, MAX_MARKER_BYTES).ok()?;
    let m: Marker = serde_json::from_slice(&bytes).ok()?;
    (m.written_by == WRITTEN_BY).then_some(m)
}

/// Before `report` writes `names` into a run folder: the marker lists them first, so the folder
/// stays replaceable. A folder without a marker stays without one.
pub(crate) fn add(dir: &Path, names: &[&str]) -> Result<()> {
    let Some(mut m) = read(dir) else {
        return Ok(());
    };
    let before = m.files.len();
    m.files.extend(names.iter().map(|n| n.to_string()));
    if m.files.len() == before {
        return Ok(());
    }
    save(dir, &m)
}

/// Why `dir` is not provably a folder kvprobe wrote (None when it is): its marker must be a
/// regular file, list every entry (each a regular file, not a link or a folder), and results.json
/// must be the one kvprobe wrote.
pub fn not_ours(dir: &Path) -> Option<String> {
    let shown = dir.display();
    let Some(m) = read(dir) else {
        return Some(format!(
            "{shown}: no {MARKER} (written by an older kvprobe, or not by kvprobe), so kvprobe cannot prove it wrote what is there; --force never replaces it: check its contents and remove it by hand (rm -r {shown}), or choose a new --out folder"
        ));
    };
    let refuse = |what: String| {
        Some(format!(
            "{shown}: {what}; --force replaces only a folder whose {MARKER} accounts for everything in it: move that away or remove the folder by hand, or choose a new --out folder"
        ))
    };
    let entries = match std::fs::read_dir(dir) {
        Ok(d) => d,
        Err(e) => {
            return Some(format!(
                "{shown}: cannot list it ({e}); choose a new --out folder"
            ))
        }
    };
    for e in entries {
        let Ok(e) = e else {
            return Some(format!(
                "{shown}: cannot list it; choose a new --out folder"
            ));
        };
        let name = e.file_name().to_string_lossy().into_owned();
        if name == MARKER {
            continue;
        }
        match e.file_type() {
            Ok(t) if t.is_symlink() => return refuse(format!("holds a link, {name}")),
            Ok(t) if t.is_dir() => {
                return refuse(format!("holds a folder kvprobe did not write, {name}"))
            }
            Ok(t) if !t.is_file() => return refuse(format!("holds a special file, {name}")),
            Err(_) => return refuse(format!("holds {name}, of unknown kind")),
            Ok(_) if !m.files.contains(&name) => {
                return refuse(format!("holds {name}, which kvprobe did not write"))
            }
            Ok(_) => {}
        }
    }
    let results = dir.join(RESULTS_JSON);
    if results.is_file() && m.results_sha256 != sha256(&results).ok() {
        return refuse(format!("its {RESULTS_JSON} is not the one kvprobe wrote"));
    }
    None
}
