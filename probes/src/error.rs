//! Typed errors of the probes crate; the CLI maps them to exit codes (2 input, 3 device).

pub use kvprobe_npu::Origin;

pub type Result<T> = std::result::Result<T, Error>;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Npu(#[from] kvprobe_npu::Error),

    #[error(transparent)]
    Reference(#[from] kvprobe_reference::Error),

    /// A probe cannot run with this input (prompt too short for the probe, no tbt group, ...).
    #[error("{0}")]
    Input(String),

    /// The device does not expose what a probe needs (e.g. cache edges without K/V roles).
    #[error("device: {0}")]
    Device(String),

    #[error("tensor computation failed: {0}")]
    Candle(String),
}

impl From<candle_core::Error> for Error {
    fn from(e: candle_core::Error) -> Self {
        Error::Candle(
            e.to_string()
                .split_whitespace()
                .collect::<Vec<_>>()
                .join(" "),
        )
    }
}

impl Error {
    /// CLI exit code (README): 2 usage or input, 3 device.
    pub fn exit_code(&self) -> i32 {
        match self.origin() {
            Origin::User => 2,
            Origin::Device => 3,
        }
    }

    /// Who caused it (issue 38): the user's input, or what the device did.
    pub fn origin(&self) -> Origin {
        match self {
            Error::Npu(e) => e.origin(),
            Error::Reference(_) | Error::Input(_) => Origin::User,
            Error::Device(_) | Error::Candle(_) => Origin::Device,
        }
    }
}
