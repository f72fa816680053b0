//! File writes that never leave half a file behind and never follow a link: the bytes go to a
//! temporary file created exclusively (`O_EXCL`, a random name) in the target's folder, then
//! renamed over the target (a rename within one folder is atomic on POSIX, and replaces a link
//! rather than writing through it). A fixed temporary name (`.report.html.tmp`) let whoever could
//! write into a run folder plant a link there and have `kvprobe report` overwrite any file.

use crate::error::{Error, Result};
use std::io::Write;
use std::path::Path;

/// The folder that holds `path` (`.` for a bare name).
pub fn folder_of(path: &Path) -> &Path {
    match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    }
}

/// A new temporary file in `dir`: created exclusively under a random hidden name, with what a
/// plain create gives (0666 less the umask; a temporary file's 0600 would survive the rename).
pub fn exclusive_temp(dir: &Path) -> std::io::Result<tempfile::NamedTempFile> {
    let mut builder = tempfile::Builder::new();
    builder.prefix(".kvprobe-").suffix(".tmp");
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        builder.permissions(std::fs::Permissions::from_mode(0o666));
    }
    builder.tempfile_in(dir)
}

pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
    let _writing = crate::interrupt::Writing::begin()?;
    let dir = folder_of(path);
    let result = (|| -> std::io::Result<()> {
        let mut tmp = exclusive_temp(dir)?;
        tmp.write_all(bytes)?;
        tmp.as_file().sync_all()?;
        if crate::interrupt::interrupted() {
            return Err(std::io::Error::other("interrupted"));
        }
        tmp.persist(path).map(drop).map_err(|e| e.error)
    })();
    if let Err(e) = result {
        // the temporary file is gone: NamedTempFile removes it when dropped unpersisted
        crate::interrupt::check()?;
        return Err(Error::io(path, e));
    }
    Ok(())
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
