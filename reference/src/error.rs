//! Typed errors of the reference crate. Every message is one line that names the file (or input)
//! and says the fix (design.md "Every library crate has error.rs").

use std::path::PathBuf;

pub type Result<T> = std::result::Result<T, Error>;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{}: no such file or folder; pass --model an existing Hugging Face folder or .gguf file", path.display())]
    NotFound { path: PathBuf },

    #[error("{}: could not read ({source}); check the path and its permissions", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },

    #[error("{}: missing {file}; {fix}", dir.display())]
    MissingFile {
        dir: PathBuf,
        file: String,
        fix: String,
    },

    /// A file exists but its content is malformed (truncated, corrupt, wrong JSON, ...).
    #[error("{}: {detail}", path.display())]
    Format { path: PathBuf, detail: String },

    #[error("{}: unsupported: {what}", path.display())]
    Unsupported { path: PathBuf, what: String },

    #[error("{}: tensor `{name}` is missing; the checkpoint is incomplete or not of the declared architecture, re-download or convert it again", path.display())]
    MissingTensor { path: PathBuf, name: String },

    #[error("{}: tensor `{name}` {detail}; the checkpoint does not match its config.json", path.display())]
    BadTensor {
        path: PathBuf,
        name: String,
        detail: String,
    },

    #[error("{}: tokenizer error: {detail}", path.display())]
    Tokenizer { path: PathBuf, detail: String },

    #[error("{}: token id {id} is outside the vocabulary (size {vocab}); pass ids below {vocab}", path.display())]
    TokenOutOfRange {
        path: PathBuf,
        id: u32,
        vocab: usize,
    },

    #[error("{}: position {position} is beyond the model context ({max} positions); use a prompt of at most {max} tokens", path.display())]
    TooLong {
        path: PathBuf,
        position: usize,
        max: usize,
    },

    /// Misuse of the API by a caller (wrong mask size, key index out of range, ...).
    #[error("invalid input: {0}")]
    InvalidInput(String),

    /// Internal tensor failure; kept to one line.
    #[error("tensor computation failed: {0}")]
    Candle(String),
}

impl From<candle_core::Error> for Error {
    fn from(e: candle_core::Error) -> Self {
        Error::Candle(candle_message(&e))
    }
}

/// candle's message without the backtrace it appends when RUST_BACKTRACE is set.
pub(crate) fn candle_message(e: &candle_core::Error) -> String {
    match e {
        candle_core::Error::WithBacktrace { inner, .. } => candle_message(inner),
        other => one_line(&other.to_string()),
    }
}

/// Collapse a possibly multi-line message from a dependency into one line.
pub(crate) fn one_line(s: &str) -> String {
    s.split_whitespace().collect::<Vec<_>>().join(" ")
}
