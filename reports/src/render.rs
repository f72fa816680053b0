//! Writing a run's folder, re-rendering it from results.json, and the before/after page.

use crate::arrays::{self, NamedArray};
use crate::error::{Error, Result};
use crate::fsio::{ensure_dir, write_atomic};
use crate::html::page;
use crate::sections::{self, charts};
use kvprobe_schema::{Results, SCHEMA_VERSION};
use std::path::Path;

pub const RESULTS_JSON: &str = "results.json";
pub const REPORT_HTML: &str = "report.html";
pub const COMPARE_HTML: &str = "compare.html";

/// Write every artefact of a run into `out_dir` (created if missing): results.json, CSV tables,
/// `.npy` arrays (derived ones plus `arrays`), SVG charts and report.html.
///
/// The page is rendered from results.json as written and read back, so `render_report` on the
/// folder later gives the same bytes. Each file is written whole or not at all; making the folder
/// itself appear atomically (temp folder + rename) is the caller's job.
pub fn write_artifacts(results: &Results, arrays: &[NamedArray], out_dir: &Path) -> Result<()> {
    arrays::validate(arrays)?;
    if results.schema_version > SCHEMA_VERSION {
        return Err(Error::SchemaTooNew {
            path: out_dir.join(RESULTS_JSON),
            found: results.schema_version as u64,
            supported: SCHEMA_VERSION,
        });
    }
    let json = serde_json::to_string_pretty(results).map_err(Error::Serialize)?;
    // JSON cannot hold NaN (serde writes null, which does not read back as a number): check the
    // round trip now, before any file exists, rather than leave an unreadable results.json.
    let reread: Results = serde_json::from_str(&json).map_err(Error::Serialize)?;
    // Charts before files: a drawing failure must not leave a folder without its page.
    let svgs = charts(&reread)?;
    let html = page::report(&reread, &svgs);

    ensure_dir(out_dir)?;
    write_atomic(&out_dir.join(RESULTS_JSON), format!("{json}\n").as_bytes())?;
    for (name, contents) in sections::tables(&reread) {
        write_atomic(&out_dir.join(name), contents.as_bytes())?;
    }
    sections::write_arrays(&reread, out_dir)?;
    arrays::write_caller_arrays(arrays, out_dir)?;
    for (name, svg) in &svgs {
        write_atomic(&out_dir.join(name), svg.as_bytes())?;
    }
    write_atomic(&out_dir.join(REPORT_HTML), html.as_bytes())
}

/// The largest results.json read: a SmolLM2 run with every probe writes about 2 MB, a
/// 2048-slot colmap a few times that.
pub const MAX_RESULTS_BYTES: u64 = 256 << 20;

/// Read and check `dir/results.json`: present, readable, valid, not from a newer kvprobe, and
/// consistent with itself (`crate::validate`).
pub fn load_results(dir: &Path) -> Result<Results> {
    let path = dir.join(RESULTS_JSON);
    if !path.is_file() {
        if dir.is_file() {
            let parent = dir.parent().filter(|p| !p.as_os_str().is_empty());
            let fix = match parent {
                Some(p) if dir.file_name().is_some_and(|n| n == RESULTS_JSON) => {
                    format!("the folder that holds it ({})", p.display())
                }
                _ => "the --out folder of a kvprobe run (it holds results.json)".into(),
            };
            return Err(Error::NotAFolder {
                path: dir.to_path_buf(),
                fix,
            });
        }
        if !dir.is_dir() {
            return Err(Error::io(
                dir,
                std::io::Error::new(std::io::ErrorKind::NotFound, "folder not found"),
            ));
        }
        return Err(Error::MissingResults {
            path: dir.to_path_buf(),
        });
    }
    let bytes = crate::fsio::read_capped(&path, MAX_RESULTS_BYTES)?;
    let mut value: serde_json::Value =
        serde_json::from_slice(&bytes).map_err(|source| Error::Json {
            path: path.clone(),
            source,
        })?;
    // Version first: a newer file may not even parse into today's types.
    if let Some(found) = value.get("schema_version").and_then(|v| v.as_u64()) {
        if found > SCHEMA_VERSION as u64 {
            return Err(Error::SchemaTooNew {
                path,
                found,
                supported: SCHEMA_VERSION,
            });
        }
    }
    lift_positions_theta(&mut value);
    let results = serde_json::from_value(value).map_err(|source| Error::Json {
        path: path.clone(),
        source,
    })?;
    crate::validate::check(&results, &path, bytes.len())?;
    Ok(results)
}

/// Files written before the theta check had its own field keep it under
/// `probes.positions.theta`; moved to `probes.theta`, their report still shows it.
fn lift_positions_theta(value: &mut serde_json::Value) {
    let Some(probes) = value.get_mut("probes").and_then(|p| p.as_object_mut()) else {
        return;
    };
    let old = probes
        .get_mut("positions")
        .and_then(|p| p.as_object_mut())
        .and_then(|p| p.remove("theta"));
    if let Some(theta) = old {
        probes.entry("theta").or_insert(theta);
    }
}

/// Re-render report.html and the SVG charts of a run folder from its results.json alone.
pub fn render_report(dir: &Path) -> Result<()> {
    let results = load_results(dir)?;
    let svgs = charts(&results)?;
    let html = page::report(&results, &svgs);
    let mut names: Vec<&str> = svgs.iter().map(|(n, _)| *n).collect();
    names.push(REPORT_HTML);
    crate::marker::add(dir, &names)?;
    for (name, svg) in &svgs {
        write_atomic(&dir.join(name), svg.as_bytes())?;
    }
    write_atomic(&dir.join(REPORT_HTML), html.as_bytes())
}

/// The Markdown bug-report summary `kvprobe report DIR --markdown` writes.
pub const SUMMARY_MD: &str = "summary.md";

/// Write `dir/summary.md` from its results.json (`crate::markdown`).
pub fn render_markdown(dir: &Path) -> Result<()> {
    let results = load_results(dir)?;
    crate::marker::add(dir, &[SUMMARY_MD])?;
    write_atomic(
        &dir.join(SUMMARY_MD),
        crate::markdown::summary(&results).as_bytes(),
    )
}

/// Write `out_dir/compare.html`: both verdicts, probe tables side by side, charts paired.
pub fn render_compare(before_dir: &Path, after_dir: &Path, out_dir: &Path) -> Result<()> {
    let before = load_results(before_dir)?;
    let after = load_results(after_dir)?;
    let html = page::compare(&before, &charts(&before)?, &after, &charts(&after)?);
    ensure_dir(out_dir)?;
    write_atomic(&out_dir.join(COMPARE_HTML), html.as_bytes())
}
