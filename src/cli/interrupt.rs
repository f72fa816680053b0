//! SIGINT, SIGTERM, SIGHUP (the terminal closed) and SIGQUIT end a run cleanly: all four are
//! blocked in every thread and taken by one thread
//! of ours with `sigwait`, which lets the writes under way finish or discard their temporary files
//! (`kvprobe_reports::interrupt`), says the run is incomplete and exits with the device code 3.
//! The default action killed the process mid-write and left a hidden temporary folder behind
//! (SIGHUP and SIGQUIT still did until issue 38).

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::SeqCst};

use kvprobe_schema::EXIT_DEVICE;

static ANNOUNCED: AtomicBool = AtomicBool::new(false);
static SIGNALS: AtomicUsize = AtomicUsize::new(0);

/// The signals that end a run: each would otherwise kill it mid-write.
const SIGNALS_TAKEN: [libc::c_int; 4] = [libc::SIGINT, libc::SIGTERM, libc::SIGHUP, libc::SIGQUIT];

fn signal_name(sig: libc::c_int) -> &'static str {
    match sig {
        libc::SIGINT => "SIGINT",
        libc::SIGHUP => "SIGHUP",
        libc::SIGQUIT => "SIGQUIT",
        _ => "SIGTERM",
    }
}

/// Call first in `main`, before any thread exists: threads inherit the blocked mask.
pub fn install() {
    // SAFETY: plain libc calls on a local, zero-initialised signal set.
    let set = unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        for sig in SIGNALS_TAKEN {
            libc::sigaddset(&mut set, sig);
        }
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
                on_signal(signal_name(sig));
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

/// A signal refuses new writes and waits for the ones under way. If one of them put the run's
/// output in place, the run has only its verdict left to print: it ends as it would have, with
/// its own exit code (a signal landing just after the rename ended it with 3 and "no output was
/// written" beside a whole run folder). A second signal ends it at once.
fn on_signal(why: &str) {
    kvprobe_reports::interrupt::interrupt();
    if kvprobe_reports::interrupt::output_in_place() && SIGNALS.fetch_add(1, SeqCst) == 0 {
        return;
    }
    finish(why)
}

/// Wait for the writes under way, say so once, and exit 3.
pub fn finish(why: &str) -> ! {
    kvprobe_reports::interrupt::interrupt();
    if !ANNOUNCED.swap(true, SeqCst) {
        if kvprobe_reports::interrupt::output_in_place() {
            eprintln!(
                "verdict: incomplete (interrupted by {why}); the output was already written whole, only what the run prints after it is cut short"
            );
        } else {
            eprintln!(
                "verdict: incomplete (interrupted by {why}); no output was written or left half-written, run the command again"
            );
        }
    }
    std::process::exit(EXIT_DEVICE.into())
}

/// Whether an interrupt arrived (an error then is its consequence, not the input's fault).
pub fn interrupted() -> bool {
    kvprobe_reports::interrupt::interrupted()
}
