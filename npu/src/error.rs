//! Typed errors of the npu crate. Messages are one line, name the input or file and say the fix.
//! `Error::exit_code` gives the CLI's mapping (design.md: 2 input/usage, 3 device).

use std::path::PathBuf;

pub type Result<T> = std::result::Result<T, Error>;

/// Who an error is about (issue 38): the user's flags and files (exit 2) or the device (exit 3).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Origin {
    User,
    Device,
}

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

    /// What the device answered to a run the host built inside the device's own description (a
    /// refusal, an undeclared shape, a failure mid-run): the device's behaviour, evidence for a
    /// verdict or an incomplete run (exit 3), never advice about the user's flags.
    #[error("incomplete: the device ({device}) failed at the {step}, which the host built inside the device's description: {}", cause.device_detail())]
    ByDevice {
        device: String,
        step: String,
        cause: Box<Error>,
    },

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
        match self {
            Error::ByDevice { cause, .. } => cause.is_capacity_refusal(),
            e => matches!(
                e,
                Error::PromptTooLong { .. }
                    | Error::ContextTooLong { .. }
                    | Error::ContextFull { .. }
            ),
        }
    }

    /// Who caused it: what the user gave (flags, files) or what the device did.
    pub fn origin(&self) -> Origin {
        match self {
            Error::Device(_) | Error::Candle(_) | Error::ByDevice { .. } => Origin::Device,
            _ => Origin::User,
        }
    }

    /// CLI exit code: 2 for anything the user can fix on the command line, 3 for device failures.
    pub fn exit_code(&self) -> i32 {
        match self.origin() {
            Origin::User => 2,
            Origin::Device => 3,
        }
    }

    /// The error as the device's answer to the `step` the host built within the description:
    /// from here on it is the device's behaviour, whatever its type said.
    pub fn by_device(self, device: &str, step: impl Into<String>) -> Error {
        match self {
            e @ Error::ByDevice { .. } => e,
            cause => Error::ByDevice {
                device: device.to_string(),
                step: step.into(),
                cause: Box::new(cause),
            },
        }
    }

    /// The step and what the device did there, for evidence lines.
    pub fn what_device_did(&self) -> String {
        match self {
            Error::ByDevice {
                device,
                step,
                cause,
            } => {
                format!("{device} at the {step}: {}", cause.device_detail())
            }
            e => e.device_detail(),
        }
    }

    /// What the device did, without the advice a user-caused error carries.
    pub fn device_detail(&self) -> String {
        match self {
            Error::ContextFull { max_ctx } => format!(
                "it reported its context of {max_ctx} positions full before the host's positions reached its end"
            ),
            Error::ContextTooLong { tokens, max_ctx } => format!(
                "it reported {tokens} positions past its context of {max_ctx}, more than the host sent"
            ),
            Error::PromptTooLong { tokens, cache_len } => format!(
                "it reported {tokens} tokens past its cache of {cache_len} entries, more than the host sent"
            ),
            e => e.to_string(),
        }
    }
}

pub(crate) fn one_line(s: &str) -> String {
    s.split_whitespace().collect::<Vec<_>>().join(" ")
}
