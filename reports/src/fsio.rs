//! File writes that never leave half a file behind: write a hidden temp file in the same folder,
//! then rename over the target (a rename within one folder is atomic on POSIX).

use crate::error::{Error, Result};
use std::io::Write;
use std::path::{Path, PathBuf};

pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
    let _writing = crate::interrupt::Writing::begin()?;
    let tmp = temp_path(path);
    let result = (|| -> std::io::Result<()> {
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(bytes)?;
        f.sync_all()?;
        if crate::interrupt::interrupted() {
            return Err(std::io::Error::other("interrupted"));
        }
        std::fs::rename(&tmp, path)
    })();
    if let Err(e) = result {
        let _ = std::fs::remove_file(&tmp);
        crate::interrupt::check()?;
        return Err(Error::io(path, e));
    }
    Ok(())
}

fn temp_path(path: &Path) -> PathBuf {
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    path.with_file_name(format!(".{name}.tmp"))
}

/// A regular file of at most `max` bytes, refused before reading otherwise (a pipe or a device
/// never ends, a huge file would be read whole before the JSON parser saw a byte).
pub fn read_capped(path: &Path, max: u64) -> Result<Vec<u8>> {
    use std::io::Read;
    let refuse = |detail: String| Error::Malformed {
        path: path.to_path_buf(),
        detail,
    };
    let f = std::fs::File::open(path).map_err(|e| Error::io(path, e))?;
    let meta = f.metadata().map_err(|e| Error::io(path, e))?;
    if !meta.is_file() {
        return Err(refuse("not a regular file".into()));
    }
    if meta.len() > max {
        return Err(refuse(format!(
            "{} bytes, more than the {max} kvprobe reads",
            meta.len()
        )));
    }
    let mut bytes = Vec::with_capacity(meta.len() as usize);
    f.take(max.saturating_add(1))
        .read_to_end(&mut bytes)
        .map_err(|e| Error::io(path, e))?;
    if bytes.len() as u64 > max {
        return Err(refuse(format!("grew past the {max} bytes kvprobe reads")));
    }
    Ok(bytes)
}

pub fn ensure_dir(dir: &Path) -> Result<()> {
    std::fs::create_dir_all(dir).map_err(|e| Error::io(dir, e))
}
