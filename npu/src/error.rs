//! Typed errors of the npu crate. Messages are one line, name the input or file and say the fix.
//! `Error::exit_code` gives the CLI's mapping (design.md: 2 input/usage, 3 device).

use std::path::PathBuf;

pub type Result<T> = std::result::Result<T, Error>;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Geometry the device or the contract cannot hold (P ≥ L, zero lengths, ...).
    #[error("invalid geometry: {0}")]
    Geometry(String),

    /// A prompt the genai server would not fit: `n ≥ L` tokens (contract §2.9 keeps `U < L` for
    /// the prompt so the first tbt window still sees it).
    #[error("prompt of {tokens} tokens does not fit a cache of {cache_len} entries; use fewer than {cache_len} tokens or a larger --cache-len")]
    PromptTooLong { tokens: usize, cache_len: usize },

    #[error("empty prompt; give at least one token")]
    EmptyPrompt,

    #[error("unknown fault `{name}`; known faults: {known}")]
    UnknownFault { name: String, known: String },

    /// A fault of the other emulator family (Hailo `--sim` vs `--device ane-sim`).
    #[error("fault `{fault}` belongs to {device}, not {here}; faults of {here}: {known}")]
    WrongDeviceFault {
        fault: String,
        device: &'static str,
        here: &'static str,
        known: String,
    },

    /// A stateful device's context ends at max_ctx: no wrap (issue 9).
    #[error("prompt of {tokens} tokens does not fit a context of {max_ctx} positions; use fewer than {max_ctx} tokens or a larger --max-ctx")]
    ContextTooLong { tokens: usize, max_ctx: usize },

    #[error("generation reached the end of the context at position {max_ctx} (a stateful device does not wrap); use a larger --max-ctx or fewer --steps")]
    ContextFull { max_ctx: usize },

    #[error("fault `{fault}`: {detail}")]
    BadFault { fault: String, detail: String },

    #[error("fault `{fault}` does not take scope `{scope}`; it takes: {allowed}")]
    FaultScope {
        fault: String,
        scope: String,
        allowed: String,
    },

    #[error("fault `{fault}` would change nothing on this model ({why}); drop it or pick a value that changes the computation")]
    NoOpFault { fault: String, why: String },

    /// A bad command-line value for the emulator (`--sim-*`, `--cache-len`, ...).
    #[error("{flag}: {detail}")]
    BadOption { flag: String, detail: String },

    #[error("{}: {detail}", path.display())]
    Manifest { path: PathBuf, detail: String },

    #[error("{}: {detail}", path.display())]
    Io { path: PathBuf, detail: String },

    /// A caller handed a buffer of the wrong size/type, an unknown input, a bad offset.
    #[error("invalid argument: {0}")]
    InvalidArgument(String),

    /// What HailoRT would answer HAILO_INVALID_OPERATION / a failed run.
    #[error("device error: {0}")]
    Device(String),

    #[error("reference model: {0}")]
    Reference(#[from] kvprobe_reference::Error),

    #[error("tensor computation failed: {0}")]
    Candle(String),

    /// A family registered as a skeleton (`Family::implemented == false`).
    #[error("{family}: {what} is not implemented yet")]
    NotImplemented { family: &'static str, what: String },
}

impl From<candle_core::Error> for Error {
    fn from(e: candle_core::Error) -> Self {
        Error::Candle(one_line(&e.to_string()))
    }
}

impl Error {
    /// A typed refusal of a request past a declared limit (issue 20): the prompt or the context
    /// does not fit. The `capacity` probe counts these as the runtime refusing, not garbling.
    pub fn is_capacity_refusal(&self) -> bool {
        matches!(
            self,
            Error::PromptTooLong { .. } | Error::ContextTooLong { .. } | Error::ContextFull { .. }
        )
    }

    /// CLI exit code: 2 for anything the user can fix on the command line, 3 for device failures.
    pub fn exit_code(&self) -> i32 {
        match self {
            Error::Device(_) | Error::Candle(_) => 3,
            Error::Reference(_) => 2,
            _ => 2,
        }
    }
}

pub(crate) fn one_line(s: &str) -> String {
    s.split_whitespace().collect::<Vec<_>>().join(" ")
}
