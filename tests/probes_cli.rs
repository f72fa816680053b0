//! The probe subcommands through the binary: healthy is healthy, controls behave as controls,
//! bad input exits 2 with one line and no artefacts.

use crate::common;
use common::*;

const GEOMETRIES: [[&str; 4]; 2] = [
    ["--cache-len", "24", "--prefill-len", "8"], // 13-token prompts: remainder chunk of 5
    ["--cache-len", "40", "--prefill-len", "16"], // prompts shorter than P: one padded chunk
];
const PROMPTS: [&str; 3] = [
    "1,5,9,22,41,17,3,99,150,200,12,7,8",
    "40,41,42,43,44,45,46,47,48,49,50,51,52",
    "250,3,77,128,9,201,33,64,12,180,5,99,42",
];

#[test]
fn healthy_fixtures_are_healthy_over_prompts_and_geometries() {
    let mut bad = Vec::new();
    for kind in ["llama", "gpt2"] {
        let f = fixture(kind, 7);
        for g in GEOMETRIES {
            for ids in PROMPTS {
                let mut a = vec![
                    "diagnose",
                    "--sim",
                    "--model",
                    f.to_str().unwrap(),
                    "--ids",
                    ids,
                ];
                a.extend_from_slice(&g);
                let (code, v, _) = kvprobe_json(&a);
                if verdict(&v) != "healthy" || code != 0 {
                    bad.push(format!(
                        "{kind} {g:?} {ids}: {} exit {code}: {}",
                        verdict(&v),
                        v["evidence"]
                    ));
                }
            }
        }
    }
    assert!(bad.is_empty(), "{bad:#?}");
}

#[test]
fn healthy_smollm2_is_healthy() {
    let Some(model) = smollm2() else { return };
    let m = model.to_str().unwrap();
    let cases: [(&[&str], &str); 3] = [
        (
            // 16 steps: the tbt miss (0.0031) is ≥ 20× the cache-free controls yet within the
            // cache's rounding floor (0.0036); this was a tbt-graph false alarm
            &["--cache-len", "64", "--prefill-len", "16", "--steps", "16"],
            "The capital of France is Paris. The capital of Italy is",
        ),
        (
            &["--cache-len", "48", "--prefill-len", "8"],
            "def add(a, b):\n    return",
        ),
        (
            &["--cache-len", "64", "--prefill-len", "16"],
            "Once upon a time there was a little girl who",
        ),
    ];
    par_map(&cases, |&(g, prompt)| {
        let mut a = vec!["diagnose", "--sim", "--model", m, "--prompt", prompt];
        a.extend_from_slice(g);
        if !g.contains(&"--steps") {
            a.extend_from_slice(&["--steps", "8"]);
        }
        let (code, v, _) = kvprobe_json(&a);
        assert_eq!(
            (verdict(&v).as_str(), code),
            ("healthy", 0),
            "{prompt:?} {g:?}: {}",
            v["evidence"]
        );
    });
}

fn llama_args<'a>(probe: &'a str, f: &'a str, extra: &[&'a str]) -> Vec<&'a str> {
    let mut a = vec![probe, "--sim", "--model", f, "--ids", PROMPTS[0]];
    a.extend_from_slice(&GEOMETRIES[0]);
    a.extend_from_slice(extra);
    a
}

#[test]
fn selfmask_stays_high_under_every_cache_fault() {
    let f = fixture("llama", 7);
    let f = f.to_str().unwrap();
    for fault in [
        "tbt-read-layout=feature-major",
        "prefill-write-layout=f8cr",
        "offset=after-run",
        "tbt-cache-scale=1.5",
        "tbt-position=+2",
        "kv-swap",
        "truncate-entry=16",
        "mask=left-valid",
    ] {
        let (code, v, _) = kvprobe_json(&llama_args("selfmask", f, &["--fault", fault]));
        assert_eq!(code, 0, "{fault}");
        assert!(v["verdict"].is_null());
        let min = v["probes"]["selfmask"]["min_cosine"].as_f64().unwrap();
        assert!(min > 0.99, "{fault}: selfmask min cosine {min}");
    }
}

#[test]
fn colmap_is_diagonal_and_inject_matches_on_a_healthy_device() {
    let f = fixture("llama", 7);
    let f = f.to_str().unwrap();
    let (_, v, _) = kvprobe_json(&llama_args("colmap", f, &[]));
    let c = &v["probes"]["colmap"];
    // every written entry's best position is the one the ring arithmetic predicts
    for row in c["rows"].as_array().unwrap() {
        if !row["expected_position"].is_null() {
            assert_eq!(row["best_position"], row["expected_position"], "{row}");
        }
    }
    assert_eq!(c["best_shift"], 0);
    assert_eq!(c["empty_rows_identical"], true);
    let (_, v, _) = kvprobe_json(&llama_args("inject", f, &[]));
    let i = &v["probes"]["inject"];
    assert_eq!(i["blame"], "none", "{i}");
    assert!(i["golden"]["cosine"].as_f64().unwrap() > 0.99);
    assert!(i["golden"]["top1_match"].as_bool().unwrap());
}

#[test]
fn layout_finds_the_writer_and_quant_sees_scales() {
    let f = fixture("llama", 7);
    let f = f.to_str().unwrap();
    let (_, v, _) = kvprobe_json(&llama_args(
        "layout",
        f,
        &["--fault", "prefill-write-layout=feature-major"],
    ));
    assert_eq!(v["probes"]["layout"]["writer_layout"], "feature-major");
    let (_, v, _) = kvprobe_json(&llama_args("layout", f, &[]));
    assert_eq!(v["probes"]["layout"]["writer_layout"], "token-major");
    assert_eq!(v["probes"]["layout"]["writer_shift"], 0);
    let (_, v, _) = kvprobe_json(&llama_args("quant", f, &["--fault", "tbt-cache-scale=1.5"]));
    let q = &v["probes"]["quant"];
    assert!(q["inconsistent_caches"].as_u64().unwrap() > 0);
    let ratio = q["caches"][0]["max_scale_ratio"].as_f64().unwrap();
    assert!((ratio - 1.5).abs() < 1e-3, "{ratio}");
}

#[test]
fn out_dir_gets_artefacts_and_is_not_overwritten_without_force() {
    let f = fixture("llama", 7);
    let f = f.to_str().unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("run");
    let o = out.to_str().unwrap();
    let (code, _, _) = kvprobe_json(&llama_args("diagnose", f, &["--out", o]));
    assert_eq!(code, 0);
    assert!(out.join("results.json").is_file() && out.join("report.html").is_file());
    // the compared greedy logits are written beside the findings, one row per generated token
    let results: serde_json::Value =
        serde_json::from_slice(&std::fs::read(out.join("results.json")).unwrap()).unwrap();
    let steps = results["probes"]["greedy"]["steps"]
        .as_array()
        .unwrap()
        .len();
    for side in ["device", "reference"] {
        let a: ndarray::Array2<f32> =
            ndarray_npy::read_npy(out.join(format!("greedy_{side}_logits.npy"))).unwrap();
        assert_eq!(a.nrows(), steps, "{side}");
        assert!(a.ncols() > 100 && a.iter().all(|x| x.is_finite()), "{side}");
    }
    let again = kvprobe(&llama_args("diagnose", f, &["--out", o]));
    assert_eq!(again.status.code(), Some(2));
    let (code, _, _) = kvprobe_json(&llama_args("diagnose", f, &["--out", o, "--force"]));
    assert_eq!(code, 0);
}

#[test]
fn out_dir_parents_are_created_only_by_a_successful_run() {
    let f = fixture("llama", 7);
    let f = f.to_str().unwrap();
    let tmp = tempfile::tempdir().unwrap();
    // a failing run (an unknown fault, refused when the device is built) must not create the
    // missing parents
    let failed = tmp.path().join("a/b/run");
    let o = failed.to_str().unwrap();
    let out = kvprobe(&llama_args(
        "diagnose",
        f,
        &["--fault", "no-such-fault", "--out", o],
    ));
    assert_eq!(out.status.code(), Some(2));
    assert!(!tmp.path().join("a").exists(), "a failed run left folders");
    // a successful one creates them, as `--out out/demo` in the README needs on a fresh clone
    let nested = tmp.path().join("x/y/run");
    let o = nested.to_str().unwrap();
    let (code, _, _) = kvprobe_json(&llama_args("diagnose", f, &["--out", o]));
    assert_eq!(code, 0);
    assert!(nested.join("report.html").is_file());
    // a parent that is a file is refused up front
    std::fs::write(tmp.path().join("file"), b"x").unwrap();
    let bad = tmp.path().join("file/run");
    let out = kvprobe(&llama_args(
        "diagnose",
        f,
        &["--out", bad.to_str().unwrap()],
    ));
    assert_eq!(out.status.code(), Some(2));
    assert_eq!(
        String::from_utf8_lossy(&out.stderr).trim().lines().count(),
        1
    );
}

#[test]
fn bad_input_exits_2_with_one_line_and_no_artefacts() {
    let f = fixture("llama", 7);
    let f = f.to_str().unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("never");
    let o = out.to_str().unwrap();
    let long: String = (0..30)
        .map(|i| (i % 50 + 3).to_string())
        .collect::<Vec<_>>()
        .join(",");
    let cases: Vec<Vec<&str>> = vec![
        vec![
            "diagnose", "--sim", "--model", f, "--ids", "999999", "--out", o,
        ],
        vec![
            "diagnose",
            "--sim",
            "--model",
            f,
            "--ids",
            &long,
            "--cache-len",
            "24",
            "--out",
            o,
        ],
        vec![
            "diagnose",
            "--sim",
            "--model",
            f,
            "--fault",
            "no-such-fault",
            "--out",
            o,
        ],
        vec![
            "diagnose",
            "--sim",
            "--model",
            f,
            "--cache-len",
            "8",
            "--prefill-len",
            "8",
            "--out",
            o,
        ],
        vec![
            "diagnose",
            "--sim",
            "--model",
            "/nonexistent/model",
            "--out",
            o,
        ],
        vec!["diagnose", "--model", f, "--out", o],
        vec!["greedy", "--sim", "--model", f, "--ids", "1,x"],
    ];
    for a in cases {
        let r = kvprobe(&a);
        let stderr = String::from_utf8_lossy(&r.stderr);
        assert_eq!(r.status.code(), Some(2), "{a:?}: {stderr}");
        assert_eq!(stderr.trim().lines().count(), 1, "{a:?}: {stderr}");
        assert!(!stderr.contains("panicked"), "{a:?}: {stderr}");
        assert!(!out.exists(), "{a:?} left {}", out.display());
    }
    // A default build refuses --hef with exit 3 (a `hailo` build: tests/hef_cli.rs).
    if cfg!(not(feature = "hailo")) {
        let r = kvprobe(&["diagnose", "--hef", "model.hef", "--model", f]);
        assert_eq!(r.status.code(), Some(3));
        assert!(String::from_utf8_lossy(&r.stderr).contains("--features hailo"));
    }
}

/// `quant --sim` on the Llama fixture with `--out OUT --force`, run from `cwd`.
fn forced_quant_in(cwd: &std::path::Path, out: &str) -> std::process::Output {
    let f = fixture("llama", 7);
    std::process::Command::new(env!("CARGO_BIN_EXE_kvprobe"))
        .args(["quant", "--sim", "--model", f.to_str().unwrap()])
        .args(["--out", out, "--force"])
        .current_dir(cwd)
        .output()
        .expect("run kvprobe")
}

#[test]
fn force_never_deletes_what_is_not_an_earlier_run() {
    // issue 19: `--out . --force` deleted the working folder's files and wrote nothing
    let tmp = tempfile::tempdir().unwrap();
    let work = tmp.path().join("work");
    std::fs::create_dir_all(work.join("sub")).unwrap();
    std::fs::write(work.join("notes.txt"), "mine").unwrap();
    std::fs::write(work.join("sub/data.bin"), "mine too").unwrap();
    for (cwd, out) in [
        (&work, "."),
        (&work.join("sub"), ".."),
        (&work, "sub"),
        (&work, work.to_str().unwrap()),
    ] {
        let r = forced_quant_in(cwd, out);
        let err = String::from_utf8_lossy(&r.stderr);
        assert_eq!(r.status.code(), Some(2), "--out {out}: {err}");
        assert_eq!(err.trim().lines().count(), 1, "--out {out}: {err}");
        assert!(err.contains("--force"), "--out {out}: {err}");
        assert_eq!(
            std::fs::read_to_string(work.join("notes.txt")).unwrap(),
            "mine"
        );
        assert_eq!(
            std::fs::read_to_string(work.join("sub/data.bin")).unwrap(),
            "mine too"
        );
        let leftovers: Vec<_> = std::fs::read_dir(&work)
            .unwrap()
            .filter_map(|e| e.ok())
            .filter(|e| e.file_name().to_string_lossy().starts_with(".kvprobe"))
            .collect();
        assert!(leftovers.is_empty(), "--out {out}: {leftovers:?}");
    }
    // an earlier run's folder is still replaced (when it holds only what kvprobe wrote), and
    // nothing is left beside it
    let run = tmp.path().join("run");
    let r = forced_quant_in(tmp.path(), "run");
    assert_eq!(
        r.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&r.stderr)
    );
    let r = forced_quant_in(tmp.path(), "run");
    assert_eq!(
        r.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&r.stderr)
    );
    assert!(run.join("results.json").is_file() && run.join("kvprobe-run.json").is_file());
    // issue 38: a file kvprobe did not write makes the folder someone else's too
    std::fs::write(run.join("notes.txt"), "added by the user").unwrap();
    let r = forced_quant_in(tmp.path(), "run");
    assert_eq!(r.status.code(), Some(2));
    assert!(run.join("notes.txt").is_file());
    std::fs::remove_file(run.join("notes.txt")).unwrap();
    #[cfg(unix)]
    {
        // issue 19: the run folder kept the temporary folder's 0700; the test binary runs under
        // the harness's umask, so compare with what mkdir and create give beside it
        use std::os::unix::fs::PermissionsExt;
        let mode = |p: &std::path::Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
        let plain_dir = tmp.path().join("plain");
        std::fs::create_dir(&plain_dir).unwrap();
        let plain_file = plain_dir.join("f");
        std::fs::write(&plain_file, "").unwrap();
        assert_eq!(mode(&run), mode(&plain_dir));
        assert_eq!(mode(&run.join("results.json")), mode(&plain_file));
        std::fs::remove_dir_all(&plain_dir).unwrap();
    }
    let names: Vec<String> = std::fs::read_dir(tmp.path())
        .unwrap()
        .filter_map(|e| e.ok().map(|e| e.file_name().to_string_lossy().into_owned()))
        .collect();
    assert!(
        names.iter().all(|n| !n.starts_with(".kvprobe")),
        "{names:?}"
    );
}

#[test]
fn steps_are_refused_up_front_when_no_run_can_take_them() {
    // issue 19: `--steps 0` silently became 1, and steps past the context failed late with an
    // error that blamed the prompt (the fixture's context is 256 positions)
    let f = fixture("llama", 7);
    let f = f.to_str().unwrap();
    for (probe, steps, needle) in [
        ("greedy", "0", "--steps 0"),
        ("quant", "0", "--steps 0"),
        ("greedy", "1000", "--steps 254 or fewer"),
        ("diagnose", "1000000000", "--steps 254 or fewer"),
    ] {
        one_line_exit_2(
            &[
                probe, "--sim", "--model", f, "--ids", "1,2,3", "--steps", steps,
            ],
            needle,
        );
    }
    // the largest fitting run still runs: 3 prompt tokens + 254 generated end at position 255
    let (code, v, stderr) = kvprobe_json(&[
        "greedy", "--sim", "--model", f, "--ids", "1,2,3", "--steps", "254",
    ]);
    assert_eq!(code, 0, "{stderr}");
    assert_eq!(
        v["probes"]["greedy"]["steps"].as_array().map(Vec::len),
        Some(254)
    );
}
