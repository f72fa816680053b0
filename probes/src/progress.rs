//! Progress reporting seam: the CLI draws a bar, tests and libraries pass [`NoProgress`].

pub trait Progress {
    /// A new phase with `total` units of work (device runs, mostly).
    fn phase(&self, name: &str, total: u64);
    /// `n` units done in the current phase.
    fn inc(&self, n: u64);
}

/// Draws nothing.
pub struct NoProgress;

impl Progress for NoProgress {
    fn phase(&self, _name: &str, _total: u64) {}
    fn inc(&self, _n: u64) {}
}
