//! A run's `--out` folder: refused early when unusable, written to a temporary sibling and
//! renamed into place only when complete, so a failed run leaves nothing behind; `--force`
//! replaces a folder kvprobe can prove it wrote (`crate::marker`) and nothing else.

use std::path::{Path, PathBuf};

use kvprobe_schema::Results;

use crate::error::{Error, Result};
use crate::{write_artifacts, NamedArray};

/// Refuses an `--out` that cannot take the run: a link, a file, a non-empty folder without
/// `--force`, or with it one kvprobe cannot prove it wrote or one that holds an input of the run
/// (`inputs`: the model, the HEF, a manifest).
pub fn check_out_dir(out: &Path, force: bool, inputs: &[&Path]) -> Result<()> {
    if ends_in_dots(out) {
        // `x/.` and `x/sub/..` name a folder that cannot be renamed into place: the run failed
        // only once it was over, and left its folders behind
        return Err(Error::OutFolder(format!(
            "{}: ends in `.` or `..`; name the folder itself (--force never replaces the working folder or its parents)",
            out.display()
        )));
    }
    if std::fs::symlink_metadata(out).is_ok_and(|m| m.file_type().is_symlink()) {
        return Err(Error::OutFolder(format!(
            "{}: is a link; kvprobe never replaces or writes through a link, pass the folder itself or choose another --out",
            out.display()
        )));
    }
    if out.exists() {
        if !out.is_dir() {
            return Err(Error::OutFolder(format!(
                "{}: exists and is not a folder; choose another --out",
                out.display()
            )));
        }
        let non_empty = std::fs::read_dir(out)
            .map(|mut d| d.next().is_some())
            .unwrap_or(true);
        if non_empty && !force {
            return Err(Error::OutFolder(format!(
                "{}: folder exists and is not empty; pass --force to replace it or choose another --out",
                out.display()
            )));
        }
        if non_empty {
            check_replaceable(out, inputs)?;
        }
    }
    // Missing parents are created only once the run has succeeded (write_run_folder), so a failed run
    // leaves nothing behind; here we only check that they can be.
    let parent = parent_of(out);
    let existing = parent
        .ancestors()
        .find(|a| a.as_os_str().is_empty() || a.exists());
    if let Some(a) = existing {
        if !a.as_os_str().is_empty() && !a.is_dir() {
            return Err(Error::OutFolder(format!(
                "{}: is not a folder, so {} cannot be created; choose another --out",
                a.display(),
                out.display()
            )));
        }
    }
    Ok(())
}

/// Whether the last component of `out` as typed is `.` or `..` (`Path::components` drops a
/// trailing `.`, so the bytes are read).
fn ends_in_dots(out: &Path) -> bool {
    let text = out.as_os_str().to_string_lossy();
    let last = text.trim_end_matches('/').rsplit('/').next().unwrap_or("");
    last == "." || last == ".."
}

/// `--force` replaces an earlier run's folder, never anything else: not a folder whose marker
/// does not account for everything in it, never one that holds an input of the run (the model's
/// folder with a stray results.json used to go, weights and all), and never the working folder or
/// one of its parents (replacing `--out .` used to delete the working folder's files).
fn check_replaceable(out: &Path, inputs: &[&Path]) -> Result<()> {
    let real = out.canonicalize().map_err(|e| {
        Error::OutFolder(format!(
            "{}: cannot resolve it ({e}); choose another --out",
            out.display()
        ))
    })?;
    let cwd = std::env::current_dir().and_then(|d| d.canonicalize());
    if cwd.as_ref().is_ok_and(|cwd| cwd.starts_with(&real)) || real.parent().is_none() {
        return Err(Error::OutFolder(format!(
            "{}: is the working folder or one of its parents; --force never replaces it, choose a new --out folder",
            out.display()
        )));
    }
    for input in inputs {
        if input.canonicalize().is_ok_and(|i| i.starts_with(&real)) {
            return Err(Error::OutFolder(format!(
                "{}: holds {}, an input of this run; --force never replaces it, choose a new --out folder",
                out.display(),
                input.display()
            )));
        }
    }
    match crate::marker::not_ours(&real) {
        Some(why) => Err(Error::OutFolder(why)),
        None => Ok(()),
    }
}

/// The folder that holds `out` (resolved through links and `..` when `out` exists, so the
/// temporary folder is never made inside the folder it replaces).
fn parent_of(out: &Path) -> PathBuf {
    if let Some(parent) = out
        .canonicalize()
        .ok()
        .and_then(|r| r.parent().map(Path::to_path_buf))
    {
        return parent;
    }
    match out.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
        _ => PathBuf::from("."),
    }
}

/// Writes the artefacts (and whatever `extra` adds, e.g. the emulator's manifest) into a
/// temporary sibling folder, then puts it in place of `out`; an earlier run is moved aside, not
/// deleted, until the new one is in place.
pub fn write_run_folder<E: From<Error>>(
    out: &Path,
    force: bool,
    inputs: &[&Path],
    results: &Results,
    arrays: &[NamedArray],
    extra: impl FnOnce(&Path) -> std::result::Result<(), E>,
) -> std::result::Result<(), E> {
    let _writing = crate::interrupt::Writing::begin()?;
    check_out_dir(out, force, inputs)?;
    std::fs::create_dir_all(parent_of(out)).map_err(|e| {
        Error::OutFolder(format!(
            "{}: cannot create its parent folder ({e}); choose another --out",
            out.display()
        ))
    })?;
    let tmp = sibling(out, ".kvprobe-out-", "cannot create a folder next to it")?;
    write_artifacts(results, arrays, &tmp)
        .map_err(|e| Error::OutFolder(format!("{}: {e}", out.display())))
        .inspect_err(|_| discard(&tmp))?;
    extra(&tmp).inspect_err(|_| discard(&tmp))?;
    crate::marker::write_for(&tmp)
        .map_err(|e| Error::OutFolder(format!("{}: {e}", out.display())))
        .inspect_err(|_| discard(&tmp))?;
    crate::interrupt::check().inspect_err(|_| discard(&tmp))?;
    let old = if out.exists() {
        let aside =
            sibling(out, ".kvprobe-old-", "cannot replace it").inspect_err(|_| discard(&tmp))?;
        let moved = aside.join("run");
        if let Err(e) = std::fs::rename(out, &moved) {
            discard(&aside);
            discard(&tmp);
            return Err(Error::OutFolder(format!(
                "{}: cannot replace it ({e}); choose another --out",
                out.display()
            ))
            .into());
        }
        Some((aside, moved))
    } else {
        None
    };
    if let Err(e) = std::fs::rename(&tmp, out) {
        discard(&tmp);
        if let Some((_, moved)) = &old {
            let _ = std::fs::rename(moved, out);
        }
        return Err(Error::OutFolder(format!(
            "{}: cannot move the artefacts into place ({e})",
            out.display()
        ))
        .into());
    }
    crate::interrupt::put_in_place();
    if let Some((aside, _)) = old {
        discard(&aside);
    }
    Ok(())
}

/// A new hidden folder beside `out` (mode 0777 less the umask, like `mkdir`: the folder that
/// becomes `out` must not keep a temporary folder's 0700).
fn sibling(out: &Path, prefix: &str, what: &str) -> Result<PathBuf> {
    let mut b = tempfile::Builder::new();
    b.prefix(prefix);
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        b.permissions(std::fs::Permissions::from_mode(0o777));
    }
    b.tempdir_in(parent_of(out)).map(|d| d.keep()).map_err(|e| {
        Error::OutFolder(format!(
            "{}: {what} ({e}); choose another --out",
            out.display()
        ))
    })
}

fn discard(dir: &Path) {
    let _ = std::fs::remove_dir_all(dir);
}
