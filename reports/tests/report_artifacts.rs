//! End-to-end checks of a run folder: escaping, self-containment, byte-identical re-render,
//! the before/after page, CSV and npy read back, chart legibility, and refused inputs.

use kvprobe_reports::fixtures::{faulty_results, healthy_results, large_colmap_results};
use kvprobe_reports::{
    load_results, render_compare, render_report, write_artifacts, Error, NamedArray,
};
use kvprobe_schema::SCHEMA_VERSION;
use ndarray::{Array1, Array2, Array3};
use ndarray_npy::read_npy;
use std::path::Path;

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn written(results: &kvprobe_schema::Results, arrays: &[NamedArray]) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    write_artifacts(results, arrays, dir.path()).unwrap();
    dir
}

/// Minimal RFC 4180 reader (quoted cells with doubled quotes and embedded newlines).
fn parse_csv(text: &str) -> Vec<Vec<String>> {
    let mut rows = Vec::new();
    let (mut row, mut cell) = (Vec::new(), String::new());
    let mut chars = text.chars().peekable();
    let mut quoted = false;
    while let Some(c) = chars.next() {
        match (quoted, c) {
            (true, '"') if chars.peek() == Some(&'"') => {
                chars.next();
                cell.push('"');
            }
            (true, '"') => quoted = false,
            (true, c) => cell.push(c),
            (false, '"') => quoted = true,
            (false, ',') => row.push(std::mem::take(&mut cell)),
            (false, '\n') => {
                row.push(std::mem::take(&mut cell));
                rows.push(std::mem::take(&mut row));
            }
            (false, c) => cell.push(c),
        }
    }
    assert!(
        cell.is_empty() && row.is_empty(),
        "CSV must end with a newline"
    );
    rows
}

#[test]
fn hostile_text_is_escaped_everywhere() {
    let dir = written(&faulty_results(), &[]);
    let html = read(&dir.path().join("report.html"));
    let lower = html.to_lowercase();
    assert!(
        !lower.contains("<script"),
        "a raw <script from the data reached the page"
    );
    assert!(
        !lower.contains("<img"),
        "a raw <img from a token reached the page"
    );
    assert!(
        !lower.contains("<b>"),
        "markup from a warning reached the page"
    );
    // The hostile strings are shown, escaped, where they came from.
    assert!(html.contains("&lt;script&gt;alert(1)&lt;/script&gt; &quot;&amp;&#39;"));
    assert!(html.contains("&lt;img src=x onerror=alert(2)&gt;"));
    // Control characters are spelled, not emitted (ESC from the device text, NUL from a token).
    assert!(!html.contains('\u{1b}') && !html.contains('\u{0}'));
    assert!(html.contains("\\u{1b}") && html.contains("\\u{0}"));
    // Token texts inside the heatmap's SVG <text> are escaped too, in the page and the file.
    let svg = read(&dir.path().join("colmap.svg"));
    for s in [&html, &svg] {
        assert!(!s.to_lowercase().contains("<script"));
    }
    assert!(svg.contains("&lt;script&gt;"));
    assert!(!svg.contains('\u{0}'), "an SVG file must stay valid XML");
}

#[test]
fn page_references_nothing_outside_itself() {
    for r in [healthy_results(), faulty_results()] {
        let dir = written(&r, &[]);
        let lower = read(&dir.path().join("report.html")).to_lowercase();
        for needle in [
            "http://", "https://", "src=", "<script", "<link", "@import", "url(", "<iframe",
            "<object", "<embed", "//fonts",
        ] {
            // The hostile token "<img src=x …>" is escaped, so `src=` may only occur escaped.
            let hits = lower.matches(needle).count();
            let escaped = lower.matches(&format!("&lt;img {needle}")).count();
            assert_eq!(hits, escaped, "report.html contains {needle:?}");
        }
        assert!(lower.starts_with("<!doctype html>"));
        assert!(lower.contains("<style>"));
    }
}

#[test]
fn verdict_comes_first_and_reads_right() {
    let healthy = read(&written(&healthy_results(), &[]).path().join("report.html"));
    let faulty = read(&written(&faulty_results(), &[]).path().join("report.html"));
    let first_section = |h: &str| h.find("<section").unwrap();
    let banner = |h: &str| h.find("class=\"banner").unwrap();
    assert!(banner(&healthy) < first_section(&healthy));
    assert!(healthy.contains("class=\"banner good\"") && healthy.contains("Verdict: healthy"));
    assert!(faulty.contains("class=\"banner bad\""));
    assert!(faulty.contains("Verdict: cache-layout-mismatch"));
    assert!(faulty.contains("Also found: cache-quantization"));
    // Evidence before the first probe section, provenance after every probe.
    let ev = faulty
        .find("inject: golden token-major rings still fail")
        .unwrap();
    assert!(ev < first_section(&faulty));
    assert!(faulty.find("id=\"inject\"").unwrap() < faulty.find("id=\"provenance\"").unwrap());
    for id in [
        "prefill",
        "greedy",
        "selfmask",
        "colmap",
        "ztap",
        "quant",
        "maskconv",
        "positions",
        "theta",
        "layout",
        "inject",
    ] {
        assert!(
            faulty.contains(&format!("<section id=\"{id}\">")),
            "no {id} section"
        );
    }
    // Provenance: exact command (shell-quoted, escaped), model sha, manifest, timings, host.
    assert!(faulty.contains("--prompt &#39;&lt;script&gt;alert(1)"));
    assert!(faulty.contains("3f0c2b5d9a7e6b1c4d8f0a2e5b7c9d1f3a5c7e9b0d2f4a6c8e0b2d4f6a8c0e2b"));
    assert!(faulty.contains("reader-layout=feature-major"));
    assert!(faulty.contains("&quot;cache_quant&quot;: &quot;uint8&quot;"));
    assert!(faulty.contains("linux x86_64, 2 cpus") && faulty.contains("9.250 s"));
}

#[test]
fn single_probe_run_has_no_verdict_banner() {
    let mut r = healthy_results();
    r.command = "greedy".into();
    r.verdict = None;
    r.confidence = None;
    r.probes = kvprobe_schema::ProbeFindings {
        greedy: r.probes.greedy.take(),
        ..Default::default()
    };
    let dir = written(&r, &[]);
    let html = read(&dir.path().join("report.html"));
    assert!(html.contains("class=\"banner info\"") && html.contains("Probe: greedy"));
    assert!(!html.contains("<section id=\"colmap\">"));
    assert!(!dir.path().join("colmap.svg").exists() && !dir.path().join("colmap.npy").exists());
    assert!(dir.path().join("greedy.svg").exists() && dir.path().join("greedy.csv").exists());
}

#[test]
fn rerender_is_byte_identical() {
    let logits = NamedArray::f32(
        "greedy_device_logits",
        vec![4, 10],
        (0..40).map(|i| i as f32).collect(),
    );
    let dir = written(&faulty_results(), &[logits]);
    let files = [
        "report.html",
        "colmap.svg",
        "greedy.svg",
        "layout.svg",
        "ztap_zero_map.svg",
        "positions.svg",
        "prefill.svg",
        "selfmask.svg",
    ];
    let before: Vec<Vec<u8>> = files
        .iter()
        .map(|f| std::fs::read(dir.path().join(f)).unwrap())
        .collect();
    for f in files {
        std::fs::remove_file(dir.path().join(f)).unwrap();
    }
    render_report(dir.path()).unwrap();
    for (f, old) in files.iter().zip(&before) {
        let new = std::fs::read(dir.path().join(f)).unwrap();
        assert!(new == *old, "{f} differs after re-render");
    }
    // And a copy of results.json alone in another folder renders the same page.
    let other = tempfile::tempdir().unwrap();
    std::fs::copy(
        dir.path().join("results.json"),
        other.path().join("results.json"),
    )
    .unwrap();
    render_report(other.path()).unwrap();
    assert!(std::fs::read(other.path().join("report.html")).unwrap() == before[0]);
    // No temp files left behind.
    for e in std::fs::read_dir(dir.path()).unwrap() {
        let name = e.unwrap().file_name().to_string_lossy().into_owned();
        assert!(!name.ends_with(".tmp"), "left {name}");
    }
}

#[test]
fn results_json_is_the_run_object() {
    let r = faulty_results();
    let dir = written(&r, &[]);
    let text = read(&dir.path().join("results.json"));
    let value: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert_eq!(value["schema_version"], SCHEMA_VERSION);
    assert_eq!(value["verdict"], "cache-layout-mismatch");
    assert!(text.contains("\n  \"schema_version\""), "pretty-printed");
    // Exact round trip (serde_json's float_roundtrip): no numbers drift by an ulp.
    assert!(
        load_results(dir.path()).unwrap() == r,
        "results.json does not read back as the run's Results"
    );
}

/// The theta section between its heading and the next section.
fn theta_section(page: &str) -> &str {
    let start = page
        .find("<section id=\"theta\">")
        .expect("a theta section");
    let len = page[start..].find("</section>").expect("section end");
    &page[start..start + len]
}

#[test]
fn theta_check_has_its_own_section_and_old_files_keep_it() {
    let r = faulty_results();
    let want = r.probes.theta.clone().expect("fixture has a theta check");
    let dir = written(&r, &[]);
    let page = read(&dir.path().join("report.html"));
    let sec = theta_section(&page);
    // the fixture's faulty numbers: shipped plain 0.41, the other convention 0.9999, 3 rows
    for cell in ["plain", "0.4100", "0.9999", ">3<"] {
        assert!(sec.contains(cell), "no {cell} in {sec}");
    }
    // A results.json from before the field existed holds the check under positions.
    let path = dir.path().join("results.json");
    let mut v: serde_json::Value = serde_json::from_str(&read(&path)).unwrap();
    let theta = v["probes"]
        .as_object_mut()
        .unwrap()
        .remove("theta")
        .unwrap();
    v["probes"]["positions"]["theta"] = theta;
    std::fs::write(&path, serde_json::to_string_pretty(&v).unwrap()).unwrap();
    let old = load_results(dir.path()).unwrap();
    assert_eq!(old.probes.theta, Some(want));
    render_report(dir.path()).unwrap();
    assert_eq!(
        theta_section(&read(&dir.path().join("report.html"))),
        sec,
        "an old file renders the same theta section"
    );
}

#[test]
fn compare_page_pairs_before_and_after() {
    let before = written(&faulty_results(), &[]);
    let after = written(&healthy_results(), &[]);
    let out = tempfile::tempdir().unwrap();
    let out_dir = out.path().join("cmp");
    render_compare(before.path(), after.path(), &out_dir).unwrap();
    let html = read(&out_dir.join("compare.html"));
    let b = html.find("Verdict: cache-layout-mismatch").unwrap();
    let a = html.find("Verdict: healthy").unwrap();
    assert!(b < a, "before comes first");
    assert!(html.contains("Before the fix") && html.contains("After the fix"));
    assert!(html.contains("class=\"banner bad\"") && html.contains("class=\"banner good\""));
    assert_eq!(html.matches("aria-label=\"colmap heatmap\"").count(), 2);
    assert_eq!(
        html.matches("aria-label=\"greedy cosine and top-1 per step\"")
            .count(),
        2
    );
    assert_eq!(html.matches("<section id=\"quant\">").count(), 1);
    let lower = html.to_lowercase();
    assert!(
        !lower.contains("<script") && !lower.contains("http://") && !lower.contains("https://")
    );
}

#[test]
fn compare_shows_a_probe_that_ran_on_one_side() {
    let mut only_greedy = healthy_results();
    only_greedy.probes = kvprobe_schema::ProbeFindings {
        greedy: only_greedy.probes.greedy.take(),
        ..Default::default()
    };
    let before = written(&faulty_results(), &[]);
    let after = written(&only_greedy, &[]);
    let out = tempfile::tempdir().unwrap();
    render_compare(before.path(), after.path(), out.path()).unwrap();
    let html = read(&out.path().join("compare.html"));
    assert!(html.contains("<section id=\"colmap\">"));
    assert!(html.contains("did not run"));
}

#[test]
fn csv_tables_read_back() {
    let r = faulty_results();
    let dir = written(&r, &[]);
    let greedy = parse_csv(&read(&dir.path().join("greedy.csv")));
    assert_eq!(greedy[0][0], "step");
    assert_eq!(greedy.len(), 1 + 32);
    assert!(greedy.iter().all(|row| row.len() == greedy[0].len()));
    let g = r.probes.greedy.as_ref().unwrap();
    let cos_col = greedy[0].iter().position(|h| h == "cosine").unwrap();
    for (row, step) in greedy[1..].iter().zip(&g.steps) {
        assert_eq!(row[cos_col].parse::<f64>().unwrap(), step.comparison.cosine);
    }
    // Prefill rows carry token texts: quotes, commas and newlines survive, formulas are defused.
    let prefill = parse_csv(&read(&dir.path().join("prefill.csv")));
    let tokens = &r.provenance.prompt_tokens;
    for row in &prefill[1..] {
        let pos: usize = row[0].parse().unwrap();
        let t = &tokens[pos];
        let expect = if t.starts_with(['=', '+', '-', '@']) {
            format!("'{t}")
        } else {
            t.clone()
        };
        assert_eq!(row[1], expect);
    }
    for (name, rows) in [
        ("prefill.csv", 1 + 12),
        ("selfmask.csv", 1 + 8),
        ("colmap_rows.csv", 1 + 127),
        ("ztap.csv", 1 + 8),
        ("quant.csv", 1 + 8 * 4 + 2),
        ("maskconv.csv", 1 + 5),
        ("positions.csv", 1 + 9),
        ("layout.csv", 1 + 8 * 3 * 5),
        ("inject.csv", 1 + 3),
    ] {
        let t = parse_csv(&read(&dir.path().join(name)));
        assert_eq!(t.len(), rows, "{name}");
        assert!(
            t.iter().all(|row| row.len() == t[0].len()),
            "{name} is ragged"
        );
    }
}

#[test]
fn npy_arrays_read_back_with_their_shapes() {
    let r = faulty_results();
    let logits: Vec<f32> = (0..3 * 5).map(|i| i as f32 * 0.5 - 2.0).collect();
    let ids = vec![7u32, 8, 9];
    let dir = written(
        &r,
        &[
            NamedArray::f32("greedy_device_logits", vec![3, 5], logits.clone()),
            NamedArray::u32("greedy_device_ids", vec![3], ids.clone()),
        ],
    );
    let c = r.probes.colmap.as_ref().unwrap();
    let m: Array2<f32> = read_npy(dir.path().join("colmap.npy")).unwrap();
    assert_eq!(m.shape(), &[127, 96]);
    assert_eq!(m[[5, 7]], c.matrix[5][7]);
    assert_eq!(m[[126, 95]], c.matrix[126][95]);
    let e: Array2<bool> = read_npy(dir.path().join("colmap_expected.npy")).unwrap();
    assert_eq!(e.shape(), &[127, 96]);
    // Entry j holds position j for the 96 written entries; the 31 empty ones expect nothing.
    assert_eq!(e.iter().filter(|x| **x).count(), 96);
    assert!(e[[40, 40]] && !e[[40, 41]] && !e.row(100).iter().any(|x| *x));
    let l: Array3<f64> = read_npy(dir.path().join("layout_correlations.npy")).unwrap();
    assert_eq!(l.shape(), &[8, 3, 5]);
    // Layout::ALL order (token-major first), shifts −2..=2: token-major at shift 0 = index 2.
    assert_eq!(l[[3, 0, 2]], 0.995);
    let z: Array1<bool> = read_npy(dir.path().join("ztap_zero_map_c5.npy")).unwrap();
    assert_eq!(z.len(), 192);
    assert_eq!(z.iter().filter(|x| **x).count(), 192 * 31 / 127);
    let lg: Array2<f32> = read_npy(dir.path().join("greedy_device_logits.npy")).unwrap();
    assert_eq!(lg.shape(), &[3, 5]);
    assert_eq!(lg.iter().copied().collect::<Vec<_>>(), logits);
    let id: Array1<u32> = read_npy(dir.path().join("greedy_device_ids.npy")).unwrap();
    assert_eq!(id.to_vec(), ids);
}

/// Parse `<text x=.. y=..>` positions of a kind out of plotters' SVG.
fn text_positions(svg: &str, rotated: bool, anchor: &str) -> Vec<(i64, i64)> {
    svg.lines()
        .filter(|l| l.starts_with("<text "))
        .filter(|l| l.contains("rotate(270") == rotated)
        .filter(|l| l.contains(&format!("text-anchor=\"{anchor}\"")))
        .map(|l| {
            let num = |key: &str| -> i64 {
                let start = l.find(&format!(" {key}=\"")).unwrap() + key.len() + 3;
                let end = start + l[start..].find('"').unwrap();
                l[start..end].parse().unwrap()
            };
            (num("x"), num("y"))
        })
        .collect()
}

fn min_gap(mut v: Vec<i64>) -> i64 {
    v.sort();
    v.windows(2).map(|w| w[1] - w[0]).min().unwrap_or(i64::MAX)
}

#[test]
fn heatmap_labels_never_overlap_and_the_expected_map_is_drawn() {
    for (r, rows, cols) in [
        (healthy_results(), 127, 96),
        (large_colmap_results(600), 608, 600),
    ] {
        let dir = written(&r, &[]);
        let svg = read(&dir.path().join("colmap.svg"));
        // Column labels: rotated, anchored at their end below the grid; 11 px font.
        let col = text_positions(&svg, true, "end");
        let row = text_positions(&svg, false, "end");
        assert!(
            col.len() >= 20 && row.len() >= 20,
            "{rows}x{cols}: too few labels"
        );
        assert!(
            min_gap(col.iter().map(|p| p.0).collect()) >= 12,
            "column labels overlap"
        );
        assert!(
            min_gap(row.iter().map(|p| p.1).collect()) >= 12,
            "row labels overlap"
        );
        // Expected cells outlined (plus one legend swatch); pooled blocks may merge some.
        let outlines = svg.matches("fill=\"none\" stroke=\"#000000\"").count() - 1;
        if rows <= 256 {
            assert_eq!(outlines, 96);
        } else {
            assert!(
                (600 / 3 - 1..=600).contains(&outlines),
                "{outlines} outlines"
            );
            assert!(svg.contains("shown pooled"));
        }
        assert!(svg.contains(">\ncosine\n</text>") || svg.contains("cosine"));
        assert!(svg.len() < 3_000_000, "colmap.svg is {} bytes", svg.len());
    }
}

#[test]
fn missing_unreadable_or_newer_folders_are_refused() {
    let empty = tempfile::tempdir().unwrap();
    let e = render_report(empty.path()).unwrap_err();
    assert!(matches!(e, Error::MissingResults { .. }), "{e}");
    assert!(!e.to_string().contains('\n'));
    assert!(!empty.path().join("report.html").exists());

    let gone = empty.path().join("no-such-folder");
    assert!(matches!(
        render_report(&gone).unwrap_err(),
        Error::Io { .. }
    ));

    std::fs::write(empty.path().join("results.json"), "{ not json").unwrap();
    let e = render_report(empty.path()).unwrap_err();
    assert!(matches!(e, Error::Json { .. }), "{e}");
    assert!(e.to_string().contains("results.json"));

    let mut v = serde_json::to_value(healthy_results()).unwrap();
    v["schema_version"] = serde_json::json!(SCHEMA_VERSION + 1);
    v["a_field_from_the_future"] = serde_json::json!(true);
    std::fs::write(empty.path().join("results.json"), v.to_string()).unwrap();
    let e = render_report(empty.path()).unwrap_err();
    assert!(matches!(e, Error::SchemaTooNew { .. }), "{e}");
    assert!(!e.to_string().contains('\n'));
    assert!(!empty.path().join("report.html").exists());

    let out = tempfile::tempdir().unwrap();
    let e = render_compare(empty.path(), empty.path(), out.path()).unwrap_err();
    assert!(matches!(e, Error::SchemaTooNew { .. }));
    assert!(!out.path().join("compare.html").exists());
}

#[test]
fn bad_arrays_and_nan_results_write_nothing() {
    let cases = [
        NamedArray::f32("../escape", vec![1], vec![0.0]),
        NamedArray::f32("", vec![1], vec![0.0]),
        NamedArray::f32("logits", vec![2, 3], vec![0.0; 5]),
        NamedArray::f32("colmap", vec![1], vec![0.0]),
    ];
    for a in cases {
        let dir = tempfile::tempdir().unwrap();
        let e =
            write_artifacts(&healthy_results(), std::slice::from_ref(&a), dir.path()).unwrap_err();
        assert!(matches!(e, Error::BadArray { .. }), "{}: {e}", a.name);
        assert_eq!(
            std::fs::read_dir(dir.path()).unwrap().count(),
            0,
            "{}",
            a.name
        );
    }
    let dup = NamedArray::f32("x", vec![1], vec![0.0]);
    let dir = tempfile::tempdir().unwrap();
    assert!(write_artifacts(&healthy_results(), &[dup.clone(), dup], dir.path()).is_err());

    let mut r = healthy_results();
    r.probes.greedy.as_mut().unwrap().mean_cosine = f64::NAN;
    let e = write_artifacts(&r, &[], dir.path()).unwrap_err();
    assert!(matches!(e, Error::Serialize(_)), "{e}");
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);

    let mut r = healthy_results();
    r.probes.colmap.as_mut().unwrap().matrix[3].pop();
    let e = write_artifacts(&r, &[], dir.path()).unwrap_err();
    assert!(matches!(e, Error::BadArray { .. }), "{e}");
}

#[test]
fn degenerate_findings_render_without_panicking() {
    let mut r = healthy_results();
    let c = r.probes.colmap.as_mut().unwrap();
    c.entries.clear();
    c.positions.clear();
    c.position_tokens.clear();
    c.matrix.clear();
    c.rows.clear();
    r.probes.greedy.as_mut().unwrap().steps.truncate(1);
    r.probes.selfmask.as_mut().unwrap().steps.clear();
    r.probes.ztap.as_mut().unwrap().caches.clear();
    r.probes.layout.as_mut().unwrap().caches.clear();
    r.provenance.prompt_tokens.clear();
    let dir = written(&r, &[]);
    let html = read(&dir.path().join("report.html"));
    assert!(html.contains("<section id=\"colmap\">") && html.ends_with("</html>\n"));
    let m: Array2<f32> = read_npy(dir.path().join("colmap.npy")).unwrap();
    assert_eq!(m.shape(), &[0, 0]);
}

/// compare.html keeps the report's section order: a section newer than the pinned list (stale)
/// used to sort above prefill.
#[test]
fn compare_keeps_the_report_order() {
    let mut r = faulty_results();
    let step = kvprobe_schema::StaleStep {
        step: 0,
        position: 10,
        cosine_to_clean: 1.0,
        max_abs_diff: 0.0,
        moved: false,
    };
    r.probes.stale = Some(kvprobe_schema::test_findings::stale(
        vec![1],
        vec![step],
        &[],
    ));
    let before = written(&r, &[]);
    let after = written(&healthy_results(), &[]);
    let out = tempfile::tempdir().unwrap();
    render_compare(before.path(), after.path(), out.path()).unwrap();
    let html = read(&out.path().join("compare.html"));
    let at = |id: &str| html.find(&format!("<section id=\"{id}\">")).unwrap();
    assert!(
        at("prefill") < at("greedy") && at("inject") < at("stale"),
        "order"
    );
}

/// A zero map without a single always-zero column draws as one sentence saying so, not a blank
/// grid; a map with one still draws the grid.
#[test]
fn an_empty_chart_says_why_in_one_sentence() {
    let mut r = faulty_results();
    let z = r.probes.ztap.as_mut().unwrap();
    for c in &mut z.caches {
        c.zero_map.iter_mut().for_each(|x| *x = false);
    }
    let svg = |r: &kvprobe_schema::Results| read(&written(r, &[]).path().join("ztap_zero_map.svg"));
    assert!(
        svg(&r).contains("Nothing to draw: no cell is zero in every entry"),
        "{}",
        svg(&r)
    );
    r.probes.ztap.as_mut().unwrap().caches[0].zero_map[0] = true;
    assert!(!svg(&r).contains("Nothing to draw"));
}
