//! Typed errors of the reports crate: one line each, naming the file and the fix.

use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{}: {source}; check the path exists and is readable/writable", path.display())]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{}: no results.json here; pass the --out folder of a kvprobe run", path.display())]
    MissingResults { path: PathBuf },
    /// A file where a run folder was expected (`report FILE`): it exists, so "not found" would
    /// misname it.
    #[error("{}: a file, not a run folder; pass {fix}", path.display())]
    NotAFolder { path: PathBuf, fix: String },
    #[error("{}: not a kvprobe results file ({source}); re-run kvprobe to regenerate it", path.display())]
    Json {
        path: PathBuf,
        source: serde_json::Error,
    },
    #[error("{}: schema_version {found} is newer than this kvprobe reads ({supported}); use a newer kvprobe", path.display())]
    SchemaTooNew {
        path: PathBuf,
        found: u64,
        supported: u32,
    },
    /// results.json parses but contradicts itself: a matrix that does not match its axes, or
    /// sizes its data cannot back.
    #[error("{}: {detail}; the file is damaged or was edited, re-run kvprobe to regenerate it", path.display())]
    Malformed { path: PathBuf, detail: String },
    #[error("results cannot be stored as JSON ({0}); a probe produced a NaN or infinite number, fix the probe")]
    Serialize(serde_json::Error),
    #[error("array {name:?}: {reason}")]
    BadArray { name: String, reason: String },
    #[error("{}: writing the .npy failed ({message}); check free space", path.display())]
    Npy { path: PathBuf, message: String },
    /// An unusable `--out` folder; the message names it and says what to do.
    #[error("{0}")]
    OutFolder(String),
    /// SIGINT or SIGTERM arrived: the write was abandoned and its temporary files removed.
    #[error("interrupted; nothing was written")]
    Interrupted,
    #[error("chart {name}: drawing failed ({message})")]
    Chart { name: String, message: String },
}

pub type Result<T> = std::result::Result<T, Error>;

impl Error {
    pub(crate) fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Error {
        Error::Io {
            path: path.into(),
            source,
        }
    }
}
