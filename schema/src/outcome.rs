//! How a run ends and the exit code a script reads for it (README "Exit codes"): part of the
//! stable vocabulary, like the verdicts, so the CLI, the sweep and the tests agree on it.

use crate::Verdict;

/// Exit code: healthy, or a single probe that ran.
pub const EXIT_OK: u8 = 0;
/// Exit code: a fault diagnosed, or `unknown`; for `inspect`, an error-level lint.
pub const EXIT_FAULT_FOUND: u8 = 1;
/// Exit code: usage or input error (bad flag, missing or malformed file, refused model feature).
pub const EXIT_USAGE: u8 = 2;
/// Exit code: the device failed (runtime error, missing device or execution provider).
pub const EXIT_DEVICE: u8 = 3;

/// The end of one run, before it is turned into an exit code.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RunOutcome {
    /// A diagnosis found the device healthy, or a single probe ran to the end.
    Done,
    /// A diagnosis named a fault (or `unknown`), or `inspect` found an error-level lint.
    FaultFound,
    /// The input or the command line was refused.
    Refused,
    /// The device failed.
    DeviceFailed,
}

impl RunOutcome {
    /// What a diagnosis with this verdict returns (`None`: a probe that names no verdict).
    pub fn of_verdict(verdict: Option<Verdict>) -> Self {
        match verdict {
            Some(v) if v != Verdict::Healthy => RunOutcome::FaultFound,
            _ => RunOutcome::Done,
        }
    }

    pub fn exit_code(self) -> u8 {
        match self {
            RunOutcome::Done => EXIT_OK,
            RunOutcome::FaultFound => EXIT_FAULT_FOUND,
            RunOutcome::Refused => EXIT_USAGE,
            RunOutcome::DeviceFailed => EXIT_DEVICE,
        }
    }

    /// The outcome an exit code stands for (`None`: not one of kvprobe's codes, e.g. a crash).
    pub fn from_exit_code(code: i32) -> Option<Self> {
        [
            RunOutcome::Done,
            RunOutcome::FaultFound,
            RunOutcome::Refused,
            RunOutcome::DeviceFailed,
        ]
        .into_iter()
        .find(|o| i32::from(o.exit_code()) == code)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_are_the_readme_table() {
        // README "Exit codes": 0 healthy / probe ran, 1 fault or unknown, 2 input, 3 device
        assert_eq!(
            RunOutcome::of_verdict(Some(Verdict::Healthy)).exit_code(),
            0
        );
        assert_eq!(RunOutcome::of_verdict(None).exit_code(), 0);
        assert_eq!(
            RunOutcome::of_verdict(Some(Verdict::Unknown)).exit_code(),
            1
        );
        assert_eq!(RunOutcome::Refused.exit_code(), 2);
        assert_eq!(RunOutcome::DeviceFailed.exit_code(), 3);
        assert_eq!(RunOutcome::from_exit_code(2), Some(RunOutcome::Refused));
        assert_eq!(RunOutcome::from_exit_code(101), None);
    }
}
