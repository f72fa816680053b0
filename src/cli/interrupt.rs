//! SIGINT and SIGTERM end a run cleanly: both are blocked in every thread and taken by one thread
//! of ours with `sigwait`, which lets the writes under way finish or discard their temporary files
//! (`kvprobe_reports::interrupt`), says the run is incomplete and exits with the device code 3.
//! The default action killed the process mid-write and left a hidden temporary folder behind.

use std::sync::atomic::{AtomicBool, Ordering::SeqCst};

use kvprobe_schema::EXIT_DEVICE;

static ANNOUNCED: AtomicBool = AtomicBool::new(false);

/// Call first in `main`, before any thread exists: threads inherit the blocked mask.
pub fn install() {
    // SAFETY: plain libc calls on a local, zero-initialised signal set.
    let set = unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGINT);
        libc::sigaddset(&mut set, libc::SIGTERM);
        if libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut()) != 0 {
            return;
        }
        set
    };
    let spawned = std::thread::Builder::new()
        .name("signals".into())
        .spawn(move || loop {
            let mut sig: libc::c_int = 0;
            // SAFETY: `set` is an initialised signal set; `sig` is a valid out pointer.
            if unsafe { libc::sigwait(&set, &mut sig) } == 0 {
                let name = if sig == libc::SIGINT {
                    "SIGINT"
                } else {
                    "SIGTERM"
                };
                finish(name);
            }
        });
    if spawned.is_err() {
        // without the thread, the default action must stay (an unkillable process is worse)
        // SAFETY: as above.
        unsafe {
            libc::pthread_sigmask(libc::SIG_UNBLOCK, &set, std::ptr::null_mut());
        }
    }
}

/// Wait for the writes under way, say so once, and exit 3.
pub fn finish(why: &str) -> ! {
    kvprobe_reports::interrupt::interrupt();
    if !ANNOUNCED.swap(true, SeqCst) {
        eprintln!(
            "verdict: incomplete (interrupted by {why}); no output was written or left half-written, run the command again"
        );
    }
    std::process::exit(EXIT_DEVICE.into())
}

/// Whether an interrupt arrived (an error then is its consequence, not the input's fault).
pub fn interrupted() -> bool {
    kvprobe_reports::interrupt::interrupted()
}
