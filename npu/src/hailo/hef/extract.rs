//! `inspect --extract DIR`: the HEF's embedded resources written into a folder without ever
//! losing the user's files there. A non-empty folder is refused unless the caller says to write
//! into it; each resource goes to an exclusive temporary file first and is renamed into place only
//! once every one is whole, so a failure leaves nothing partial, and a rename replaces a link
//! planted under a resource's name instead of writing through it.

use std::io::Write;
use std::path::{Path, PathBuf};

use super::error::{HefError, Result};
use super::model::Hef;

impl Hef {
    /// The readable resources as (file name, bytes): names come from the file, so only their
    /// final component is kept.
    pub fn resource_files(&self) -> Vec<(std::ffi::OsString, &[u8])> {
        self.resources
            .iter()
            .filter_map(|r| {
                let bytes = self.resource(&r.name)?;
                let name = Path::new(&r.name)
                    .file_name()
                    .map(|n| n.to_os_string())
                    .unwrap_or_else(|| "resource.bin".into());
                Some((name, bytes))
            })
            .collect()
    }

    /// Writes every readable resource into `dir` (created if missing); returns the paths. A
    /// non-empty `dir` is refused unless `replace`, which replaces files of the same names and
    /// keeps every other file.
    pub fn extract(&self, dir: &Path, replace: bool) -> Result<Vec<PathBuf>> {
        let files = self.resource_files();
        check_target(dir, replace, &files)?;
        let created = first_missing(dir);
        std::fs::create_dir_all(dir).map_err(|err| HefError::Write {
            path: dir.to_path_buf(),
            err,
        })?;
        let written = write_all(dir, &files);
        if written.is_err() {
            if let Some(top) = created {
                let _ = std::fs::remove_dir_all(top);
            }
        }
        written
    }
}

fn refuse(dir: &Path, detail: String) -> HefError {
    HefError::Extract {
        dir: dir.to_path_buf(),
        detail,
    }
}

/// Everything that would make the extraction fail or lose a file, found before a byte is written.
fn check_target(dir: &Path, replace: bool, files: &[(std::ffi::OsString, &[u8])]) -> Result<()> {
    let Ok(meta) = std::fs::symlink_metadata(dir) else {
        return Ok(());
    };
    if meta.file_type().is_symlink() {
        return Err(refuse(
            dir,
            "is a link; kvprobe never writes through a link, pass the folder itself or choose another --extract folder".into(),
        ));
    }
    if !meta.is_dir() {
        return Err(refuse(
            dir,
            "is not a folder; choose another --extract folder".into(),
        ));
    }
    let non_empty = std::fs::read_dir(dir)
        .map(|mut d| d.next().is_some())
        .unwrap_or(true);
    if non_empty && !replace {
        return Err(refuse(
            dir,
            "folder is not empty; pass --force to write the resources into it (files of the same names are replaced, others kept) or choose an empty or new folder".into(),
        ));
    }
    for (name, _) in files {
        let path = dir.join(name);
        if std::fs::symlink_metadata(&path).is_ok_and(|m| m.is_dir()) {
            return Err(refuse(
                dir,
                format!(
                    "holds a folder named {}, a resource of the HEF; move it away or choose another --extract folder",
                    name.to_string_lossy()
                ),
            ));
        }
    }
    Ok(())
}

/// The outermost folder `create_dir_all(dir)` would create, if any (removed again on failure).
fn first_missing(dir: &Path) -> Option<PathBuf> {
    let mut top = None;
    for a in dir.ancestors() {
        if a.as_os_str().is_empty() || std::fs::symlink_metadata(a).is_ok() {
            break;
        }
        top = Some(a.to_path_buf());
    }
    top
}

fn write_all(dir: &Path, files: &[(std::ffi::OsString, &[u8])]) -> Result<Vec<PathBuf>> {
    let io = |path: &Path, err| HefError::Write {
        path: path.to_path_buf(),
        err,
    };
    let mut staged = Vec::new();
    for (name, bytes) in files {
        let path = dir.join(name);
        let mut b = tempfile::Builder::new();
        b.prefix(".kvprobe-").suffix(".tmp");
        #[cfg(unix)]
        {
            // a plain create's mode (0666 less the umask), not a temporary file's 0600
            use std::os::unix::fs::PermissionsExt;
            b.permissions(std::fs::Permissions::from_mode(0o666));
        }
        let mut tmp = b.tempfile_in(dir).map_err(|e| io(dir, e))?;
        tmp.write_all(bytes).map_err(|e| io(&path, e))?;
        staged.push((path, tmp));
    }
    let mut written = Vec::new();
    for (path, tmp) in staged {
        tmp.persist(&path).map_err(|e| io(&path, e.error))?;
        written.push(path);
    }
    Ok(written)
}
