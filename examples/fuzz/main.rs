//! Seeded mutation fuzzer over kvprobe's parsers of untrusted bytes (issue 19):
//!
//! `cargo run --release --example fuzz -- --parser hef --seed 1 --iterations 1000000`
//!
//! Each input is a mutation of a valid seed file (`mutate.rs`), handed to the parser as kvprobe
//! reads it (`targets.rs`). A panic, or an input during which the live heap grows by more than
//! 64 MiB plus 64 times the input's size, is a finding: the input is saved under
//! `--crashes DIR` and the run exits 1. One allocation past 4 GiB is refused (the process then
//! aborts, which `scripts/fuzz.sh` reports). The same seed gives the same inputs.

#[path = "../../reference/tests/gguf_support/mod.rs"]
mod gguf_support;
#[path = "../../npu/tests/hef_encoder.rs"]
mod hef_encoder;
mod mutate;
mod targets;

use std::alloc::{GlobalAlloc, Layout, System};
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
use std::time::{Duration, Instant};

/// The system allocator, counting live bytes and their peak (reset before each input).
struct Counting;

static LIVE: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);
const REFUSED_ALLOCATION: usize = 4 << 30;

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if layout.size() > REFUSED_ALLOCATION {
            return std::ptr::null_mut();
        }
        // SAFETY: forwarded with the caller's layout.
        let p = unsafe { System.alloc(layout) };
        if !p.is_null() {
            let now = LIVE.fetch_add(layout.size(), Relaxed) + layout.size();
            PEAK.fetch_max(now, Relaxed);
        }
        p
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: forwarded with the caller's pointer and layout.
        unsafe { System.dealloc(ptr, layout) };
        LIVE.fetch_sub(layout.size(), Relaxed);
    }
}

#[global_allocator]
static ALLOC: Counting = Counting;

struct Args {
    parser: String,
    seed: u64,
    iterations: u64,
    seconds: Option<f64>,
    crashes: PathBuf,
    /// Run this one saved input (with the panic message shown) instead of fuzzing.
    replay: Option<PathBuf>,
}

fn args() -> Result<Args, String> {
    let mut a = Args {
        parser: String::new(),
        seed: 1,
        iterations: 10_000,
        seconds: None,
        crashes: PathBuf::from("fuzz-crashes"),
        replay: None,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || it.next().ok_or(format!("{flag} needs a value"));
        let bad = |e: std::num::ParseIntError| e.to_string();
        match flag.as_str() {
            "--parser" => a.parser = value()?,
            "--seed" => a.seed = value()?.parse().map_err(bad)?,
            "--iterations" => a.iterations = value()?.parse().map_err(bad)?,
            "--seconds" => a.seconds = Some(value()?.parse().map_err(|_| "--seconds: a number")?),
            "--crashes" => a.crashes = PathBuf::from(value()?),
            "--replay" => a.replay = Some(PathBuf::from(value()?)),
            other => return Err(format!("unknown flag {other}")),
        }
    }
    if !targets::NAMES.contains(&a.parser.as_str()) {
        return Err(format!(
            "--parser {:?}: one of {}",
            a.parser,
            targets::NAMES.join(", ")
        ));
    }
    Ok(a)
}

fn main() -> std::process::ExitCode {
    let a = match args() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("fuzz: {e}");
            return std::process::ExitCode::from(2);
        }
    };
    let shm = std::path::Path::new("/dev/shm");
    let scratch = if shm.is_dir() {
        tempfile::tempdir_in(shm)
    } else {
        tempfile::tempdir()
    }
    .expect("scratch folder");
    let t = targets::target(&a.parser, scratch.path()).expect("checked");
    if let Some(p) = &a.replay {
        let bytes = std::fs::read(p).expect("the saved input");
        let i = p
            .to_string_lossy()
            .rsplit('-')
            .next()
            .and_then(|x| x.trim_end_matches(".bin").parse().ok());
        (t.run)(&bytes, i.unwrap_or(0));
        println!("{}: replayed {} without a panic", t.name, p.display());
        return std::process::ExitCode::SUCCESS;
    }
    // the findings are counted and saved; FUZZ_VERBOSE=1 shows each panic's message and place
    if std::env::var_os("FUZZ_VERBOSE").is_none() {
        std::panic::set_hook(Box::new(|_| {}));
    }
    let mut rng = mutate::Rng::new(a.seed);
    let (mut panics, mut heavy) = (0u64, 0u64);
    let start = Instant::now();
    let limit = a.seconds.map(Duration::from_secs_f64);
    let mut done = 0u64;
    for i in 0..a.iterations {
        if limit.is_some_and(|l| start.elapsed() > l) {
            break;
        }
        let seed = &t.seeds[rng.below(t.seeds.len())];
        let input = mutate::mutate(&mut rng, seed, &t.seeds, t.json);
        let base = LIVE.load(Relaxed);
        PEAK.store(base, Relaxed);
        let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| (t.run)(&input, i)));
        let grew = PEAK.load(Relaxed).saturating_sub(base);
        let bound = (64 << 20) + 64 * input.len();
        let finding = match (&outcome, grew > bound) {
            (Err(_), _) => {
                panics += 1;
                Some("panic")
            }
            (Ok(()), true) => {
                heavy += 1;
                Some("alloc")
            }
            _ => None,
        };
        if let Some(kind) = finding {
            let _ = std::fs::create_dir_all(&a.crashes);
            let p = a
                .crashes
                .join(format!("{}-{kind}-{}-{i}.bin", t.name, a.seed));
            let _ = std::fs::write(&p, &input);
            eprintln!(
                "{}: {kind} at iteration {i} (grew {grew} bytes), saved {}",
                t.name,
                p.display()
            );
        }
        done += 1;
        if done.is_multiple_of(100_000) {
            eprintln!(
                "{}: {done} inputs, {:.0}/s",
                t.name,
                done as f64 / start.elapsed().as_secs_f64()
            );
        }
    }
    let secs = start.elapsed().as_secs_f64();
    println!(
        "{}: seed {} inputs {done} panics {panics} over-allocations {heavy} in {secs:.1} s ({:.0}/s)",
        t.name,
        a.seed,
        done as f64 / secs.max(1e-9)
    );
    if panics + heavy > 0 {
        std::process::ExitCode::from(1)
    } else {
        std::process::ExitCode::SUCCESS
    }
}
