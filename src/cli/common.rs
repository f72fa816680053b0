//! Plumbing shared by every subcommand: exit codes, the default model, atomic output files.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

// The exit codes are part of the schema's vocabulary (the sweep and the tests read them too).
pub use kvprobe_schema::{EXIT_DEVICE, EXIT_FAULT_FOUND, EXIT_USAGE};

/// Where `scripts/fetch-model.sh` puts SmolLM2-135M-Instruct, relative to the working directory.
pub const DEFAULT_MODEL: &str = ".cache/models/smollm2-135m-instruct-q4_1.gguf";

/// An input/usage error raised by the CLI itself (not by a library).
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct UsageError(pub String);

pub fn usage(msg: impl Into<String>) -> anyhow::Error {
    UsageError(msg.into()).into()
}

/// A device error; mapped to exit code 3.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct DeviceError(pub String);

/// Writes what a command prints. A reader that went away (`| head`, `| true`) ends the output
/// quietly, as Unix tools do: nothing is left to say to it, and the command keeps its own exit
/// code (`println!` panicked). Any other failure (`> /dev/full`) is one line and exit 2.
pub fn print_stdout(bytes: &[u8]) -> anyhow::Result<()> {
    let mut out = std::io::stdout().lock();
    match out.write_all(bytes).and_then(|()| out.flush()) {
        Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => Err(usage(format!(
            "standard output: cannot write ({e}); check where it goes (a full disk, a closed file)"
        ))),
        _ => Ok(()),
    }
}

/// Print the error as one line on stderr and pick the exit code.
pub fn report_error(e: &anyhow::Error) -> ExitCode {
    if super::interrupt::interrupted() {
        super::interrupt::finish("a signal");
    }
    let msg = without_repeats(e);
    let one_line = msg.split_whitespace().collect::<Vec<_>>().join(" ");
    eprintln!("error: {one_line}");
    ExitCode::from(exit_code(e))
}

/// The error and its causes joined by ": " as `{:#}` joins them, leaving out a cause the
/// message already says: an error that names its cause in its own words and also returns it as
/// its source printed it twice ("could not read (Permission denied (os error 13)); check …:
/// Permission denied (os error 13)").
fn without_repeats(e: &anyhow::Error) -> String {
    let mut msg = e.to_string();
    for cause in e.chain().skip(1) {
        let c = cause.to_string();
        if !msg.contains(&c) {
            msg = format!("{msg}: {c}");
        }
    }
    msg
}

/// Exit code of an error chain: device errors are 3, everything else is an input/usage error (2).
pub fn exit_code(e: &anyhow::Error) -> u8 {
    if e.chain().any(|c| c.downcast_ref::<DeviceError>().is_some()) {
        EXIT_DEVICE
    } else {
        EXIT_USAGE
    }
}

/// `--model` if given, else `$KVPROBE_MODEL`, else the fetched SmolLM2: in a checkout's
/// `.cache/models` (searched from the working directory upwards, so any folder inside the checkout
/// finds it), then in the user cache `scripts/fetch-model.sh` also fills
/// (`$XDG_CACHE_HOME/kvprobe/models`, default `~/.cache/kvprobe/models`), which is what a
/// `cargo install`ed binary outside the checkout finds.
pub fn resolve_model(model: Option<&Path>) -> anyhow::Result<PathBuf> {
    if let Some(p) = model {
        return Ok(p.to_path_buf());
    }
    if let Some(p) = std::env::var_os("KVPROBE_MODEL").filter(|p| !p.is_empty()) {
        let p = PathBuf::from(p);
        if !p.exists() {
            return Err(usage(format!(
                "$KVPROBE_MODEL={}: no such file or folder; point it at a model or unset it",
                p.display()
            )));
        }
        return Ok(p);
    }
    let in_checkout = std::env::current_dir().ok().and_then(|cwd| {
        cwd.ancestors()
            .map(|d| d.join(DEFAULT_MODEL))
            .find(|p| p.is_file())
    });
    if let Some(p) = in_checkout.or_else(|| user_cache_model().filter(|p| p.exists())) {
        return Ok(p);
    }
    Err(usage(format!(
        "no --model given, $KVPROBE_MODEL unset, and the default model is neither in {DEFAULT_MODEL} nor in {}; run scripts/fetch-model.sh (or pass --model PATH)",
        user_cache_model().map_or("the user cache".into(), |p| p.display().to_string())
    )))
}

/// Where `scripts/fetch-model.sh` puts a second copy of the default model for installed binaries.
fn user_cache_model() -> Option<PathBuf> {
    let cache = std::env::var_os("XDG_CACHE_HOME")
        .filter(|p| !p.is_empty())
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))?;
    let name = Path::new(DEFAULT_MODEL).file_name()?;
    Some(cache.join("kvprobe/models").join(name))
}

/// Refuses an output file path before the run: its folder must exist, and if the path exists it
/// must be a regular file. The result is renamed over it, which turned a device node, a FIFO or a
/// link into a regular file (`--out /dev/null` replaced /dev/null).
pub fn check_out_file(path: &Path, flag: &str) -> anyhow::Result<()> {
    let shown = path.display();
    let dir = kvprobe_reports::folder_of(path);
    if !dir.is_dir() {
        return Err(usage(format!(
            "{}: the output folder does not exist; create it or choose another {flag}",
            dir.display()
        )));
    }
    match std::fs::symlink_metadata(path) {
        Ok(m) if m.file_type().is_symlink() => Err(usage(format!(
            "{shown}: is a link; kvprobe never replaces or writes through a link, pass the file itself or choose another {flag}"
        ))),
        Ok(m) if m.is_dir() => Err(usage(format!(
            "{shown}: is a folder; {flag} takes a file path, choose another"
        ))),
        Ok(m) if !m.is_file() => Err(usage(format!(
            "{shown}: is not a regular file (a device, a pipe or a socket); {flag} replaces only regular files, choose another path"
        ))),
        _ => Ok(()),
    }
}

/// Write `path` through a temporary file in the same folder, renamed into place only when `fill`
/// succeeded: a failed run never leaves a partial or stale-looking output file. `flag` names the
/// option the path came from, for the messages.
pub fn write_atomic(
    path: &Path,
    flag: &str,
    fill: impl FnOnce(&mut std::fs::File) -> anyhow::Result<()>,
) -> anyhow::Result<()> {
    check_out_file(path, flag)?;
    let dir = kvprobe_reports::folder_of(path);
    let _writing = kvprobe_reports::interrupt::Writing::begin()?;
    let mut tmp = kvprobe_reports::exclusive_temp(dir).map_err(|e| {
        usage(format!(
            "{}: cannot create a file there ({e}); choose another {flag}",
            dir.display()
        ))
    })?;
    fill(tmp.as_file_mut())?;
    tmp.as_file_mut().flush().map_err(|e| {
        usage(format!(
            "{}: write failed ({e}); check free space",
            path.display()
        ))
    })?;
    kvprobe_reports::interrupt::check()?;
    // again: the path may have been replaced while the run went on
    check_out_file(path, flag)?;
    tmp.persist(path).map_err(|e| {
        usage(format!(
            "{}: cannot write ({}); choose another {flag}",
            path.display(),
            e.error
        ))
    })?;
    kvprobe_reports::interrupt::put_in_place();
    Ok(())
}
