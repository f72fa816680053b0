//! An interrupt (SIGINT/SIGTERM) never leaves partial output: every write of an output file or
//! run folder holds a [`Writing`] guard, and the CLI's signal thread calls [`interrupt`], which
//! refuses new writes and waits for the running ones to finish or discard their temporary files
//! before the process exits (a kill mid-write left a hidden `.kvprobe-out-*` folder behind).

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::SeqCst};

use crate::error::{Error, Result};

static INTERRUPTED: AtomicBool = AtomicBool::new(false);
static WRITING: AtomicUsize = AtomicUsize::new(0);
static IN_PLACE: AtomicBool = AtomicBool::new(false);

/// Held while output is being written; nests (a run folder's files each take one too).
#[derive(Debug)]
pub struct Writing(());

impl Writing {
    /// Refused once an interrupt arrived. The count goes up before the flag is read and the
    /// interrupt sets the flag before it reads the count, so one of the two always sees the
    /// other: no write starts unseen after an interrupt.
    pub fn begin() -> Result<Writing> {
        WRITING.fetch_add(1, SeqCst);
        let guard = Writing(());
        if INTERRUPTED.load(SeqCst) {
            return Err(Error::Interrupted);
        }
        Ok(guard)
    }
}

impl Drop for Writing {
    fn drop(&mut self) {
        WRITING.fetch_sub(1, SeqCst);
    }
}

pub fn interrupted() -> bool {
    INTERRUPTED.load(SeqCst)
}

/// A writer calls this once its output is in place, whole, while it still holds its
/// [`Writing`]: an interrupt that waited for that write then knows the output exists.
pub fn put_in_place() {
    IN_PLACE.store(true, SeqCst);
}

/// Whether this run put an output in place (a run folder or an output file).
pub fn output_in_place() -> bool {
    IN_PLACE.load(SeqCst)
}

/// Refuse every write from now on and wait until none is under way (each one either finished or
/// removed its temporary file or folder).
pub fn interrupt() {
    INTERRUPTED.store(true, SeqCst);
    while WRITING.load(SeqCst) > 0 {
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
}

/// `Err(Interrupted)` once an interrupt arrived: checked before a temporary file or folder is
/// renamed into place.
pub fn check() -> Result<()> {
    if interrupted() {
        Err(Error::Interrupted)
    } else {
        Ok(())
    }
}
