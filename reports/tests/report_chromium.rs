//! Renders report.html and compare.html in headless Chromium (Debian package `chromium`, which
//! .ci/run installs) and keeps the PNGs under target/test-output/report/. Checks that the pages
//! load without console errors and that the heatmap's <svg> is in the parsed DOM.
//! Skips, saying why, when Chromium is not installed.

use kvprobe_reports::fixtures::{faulty_results, healthy_results, large_colmap_results};
use kvprobe_reports::{render_compare, write_artifacts};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const CHROMIUM: &str = "/usr/bin/chromium";

fn out_dir() -> PathBuf {
    // CARGO_TARGET_TMPDIR is <target>/tmp; keep the pictures beside it.
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR"))
        .parent()
        .unwrap()
        .join("test-output/report");
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

struct Run {
    stdout: String,
    log: String,
}

/// One headless Chromium run with a fresh profile; killed if it hangs (a guard, not a timing test).
fn chromium(args: &[String]) -> Run {
    let profile = tempfile::tempdir().unwrap();
    let log_path = profile.path().join("chromium.log");
    let out_path = profile.path().join("stdout");
    let mut child = Command::new(CHROMIUM)
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--enable-logging=stderr",
            "--v=0",
        ])
        .arg(format!(
            "--user-data-dir={}",
            profile.path().join("p").display()
        ))
        .args(args)
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(&out_path).unwrap())
        .stderr(std::fs::File::create(&log_path).unwrap())
        .spawn()
        .expect("start chromium");
    let deadline = Instant::now() + Duration::from_secs(180);
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("chromium did not finish within 180 s");
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    let log = std::fs::read_to_string(&log_path).unwrap_or_default();
    assert!(
        status.success(),
        "chromium failed ({status}):\n{}",
        tail(&log)
    );
    Run {
        stdout: std::fs::read_to_string(&out_path).unwrap_or_default(),
        log,
    }
}

fn tail(s: &str) -> String {
    let lines: Vec<&str> = s.lines().collect();
    lines[lines.len().saturating_sub(15)..].join("\n")
}

fn console_errors(log: &str) -> Vec<&str> {
    log.lines()
        .filter(|l| l.contains("Uncaught") || l.contains("ERROR:CONSOLE") || l.contains("CONSOLE("))
        .collect()
}

/// Width and height from a PNG's IHDR chunk.
fn png_size(path: &Path) -> (u32, u32) {
    let b = std::fs::read(path).unwrap();
    assert_eq!(
        &b[..8],
        b"\x89PNG\r\n\x1a\n",
        "{} is not a PNG",
        path.display()
    );
    let be = |o: usize| u32::from_be_bytes([b[o], b[o + 1], b[o + 2], b[o + 3]]);
    (be(16), be(20))
}

fn screenshot(page: &Path, png: &Path, size: (u32, u32)) {
    let _ = std::fs::remove_file(png);
    let run = chromium(&[
        format!("--screenshot={}", png.display()),
        format!("--window-size={},{}", size.0, size.1),
        format!("file://{}", page.display()),
    ]);
    let errors = console_errors(&run.log);
    assert!(
        errors.is_empty(),
        "console errors on {}: {errors:?}",
        page.display()
    );
    assert_eq!(png_size(png), size);
    println!("screenshot: {}", png.display());
}

#[test]
fn report_renders_in_headless_chromium() {
    if !Path::new(CHROMIUM).exists() {
        println!("SKIP report_renders_in_headless_chromium: {CHROMIUM} not installed (apt-get install -y chromium)");
        return;
    }
    let out = out_dir();
    let (faulty, healthy, large) = (out.join("faulty"), out.join("healthy"), out.join("large"));
    for d in [&faulty, &healthy, &large, &out.join("compare")] {
        let _ = std::fs::remove_dir_all(d);
    }
    write_artifacts(&faulty_results(), &[], &faulty).unwrap();
    write_artifacts(&healthy_results(), &[], &healthy).unwrap();
    write_artifacts(&large_colmap_results(600), &[], &large).unwrap();
    render_compare(&faulty, &healthy, &out.join("compare")).unwrap();

    let page = faulty.join("report.html");
    // The parsed DOM holds the inline heatmap, and no script element came from the data.
    let dom = chromium(&[
        "--dump-dom".to_string(),
        format!("file://{}", page.display()),
    ]);
    assert!(dom
        .stdout
        .contains("<svg role=\"img\" aria-label=\"colmap heatmap\""));
    assert!(dom.stdout.contains("Verdict: cache-layout-mismatch"));
    assert!(!dom.stdout.to_lowercase().contains("<script"));
    assert!(
        console_errors(&dom.log).is_empty(),
        "{:?}",
        console_errors(&dom.log)
    );

    screenshot(&page, &out.join("report.png"), (1400, 3000));
    screenshot(&page, &out.join("report_full.png"), (1400, 9000));
    screenshot(
        &healthy.join("report.html"),
        &out.join("report_healthy.png"),
        (1400, 3000),
    );
    screenshot(
        &large.join("report.html"),
        &out.join("report_large.png"),
        (1400, 4000),
    );
    screenshot(
        &out.join("compare/compare.html"),
        &out.join("compare.png"),
        (1400, 4000),
    );
}
