//! The progress bar of a probe run.

use std::cell::{Cell, RefCell};
use std::io::IsTerminal;
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use kvprobe_probes::Progress;

/// A progress bar on stderr that appears only when stderr is a terminal and the run has lasted
/// about two seconds.
pub struct Bar {
    bar: ProgressBar,
    start: Instant,
    shown: Cell<bool>,
    tty: bool,
    phase: RefCell<String>,
}

impl Bar {
    pub fn new() -> Bar {
        let bar = ProgressBar::with_draw_target(Some(0), ProgressDrawTarget::hidden());
        if let Ok(style) =
            ProgressStyle::with_template("{msg:>12} [{bar:30}] {pos}/{len} ETA {eta}")
        {
            bar.set_style(style.progress_chars("=> "));
        }
        Bar {
            bar,
            start: Instant::now(),
            shown: Cell::new(false),
            tty: std::io::stderr().is_terminal(),
            phase: RefCell::new(String::new()),
        }
    }
    fn maybe_show(&self) {
        if self.tty && !self.shown.get() && self.start.elapsed() > Duration::from_secs(2) {
            self.bar.set_draw_target(ProgressDrawTarget::stderr());
            self.shown.set(true);
        }
    }
    pub fn finish(&self) {
        self.bar.finish_and_clear();
    }
}

impl Progress for Bar {
    fn phase(&self, name: &str, total: u64) {
        *self.phase.borrow_mut() = name.to_string();
        self.bar.set_message(name.to_string());
        self.bar.set_length(total);
        self.bar.set_position(0);
        self.bar.reset_eta();
        self.maybe_show();
    }
    fn inc(&self, n: u64) {
        self.bar.inc(n);
        self.maybe_show();
    }
}
