//! Why a HEF could not be read at all (as opposed to lint findings about a readable one).

use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum HefError {
    #[error("{path}: not read as a HEF: {reason}")]
    Read {
        path: PathBuf,
        reason: crate::contract::manifest::CappedReadError,
    },
    #[error("HEF is {len} bytes, shorter than its {need}-byte header; the file is truncated, copy it again")]
    Truncated { len: usize, need: usize },
    #[error(
        "HEF magic is {found:#010x}, expected 0x01484546 (\"\\x01HEF\"); this is not a HEF file"
    )]
    BadMagic { found: u32 },
    #[error("HEF container version {0} is unknown (0-3 are defined); use a HEF from a supported Dataflow Compiler")]
    UnknownVersion(u32),
    #[error("HEF header says the protobuf is {proto_size} bytes but only {available} follow the header; the file is truncated")]
    ProtoOutOfRange { proto_size: u64, available: u64 },
    #[error("HEF {what} check failed (header {expected}, computed {computed}); the file is corrupted, copy it again")]
    HashMismatch {
        what: &'static str,
        expected: String,
        computed: String,
    },
    #[error("HEF protobuf is malformed at byte {offset} of {message}: {reason}; the file is corrupted or not a HEF")]
    Proto {
        message: &'static str,
        offset: usize,
        reason: &'static str,
    },
    #[error(
        "HEF cannot drive a genai device: {0}; run `kvprobe inspect` on it and fix the errors"
    )]
    NotDescribable(String),
    #[error("{path}: cannot write extracted resource: {err}; check the directory")]
    Write { path: PathBuf, err: std::io::Error },
    /// An `--extract` folder refused before anything is written; the detail says why and what to do.
    #[error("{}: {detail}", dir.display())]
    Extract { dir: PathBuf, detail: String },
}

pub type Result<T> = std::result::Result<T, HefError>;
