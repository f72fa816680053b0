//! Corpus cases of the run's other inputs: sim manifests, results.json, command-line values and
//! output folders.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde_json::{json, Value};

use super::{s, strings, Corpus};

/// A named change to a JSON document.
type Edit = Box<dyn Fn(&mut Value)>;

/// `diagnose --sim` on the fixture with some defaults replaced and `extra` flags.
fn sim(c: &mut Corpus, name: &str, code: i32, over: &[(&str, &str)], extra: &[&str]) {
    let mut a = c.sim_args(&name.replace([' ', '/'], "-"), &[]);
    for (flag, value) in over {
        let i = a.iter().position(|x| x == flag).expect("a default flag");
        a[i + 1] = value.to_string();
    }
    a.extend(strings(extra));
    c.add(&format!("cli {name}"), code, None, &a);
}

/// The manifest the emulator writes for the fixture at L 32, P 8, as JSON.
fn manifest_of(model: &Path) -> Value {
    let m = Arc::new(kvprobe_reference::Model::load(model).unwrap());
    let o = kvprobe_npu::sim::SimOptions {
        cache_len: 32,
        prefill_len: 8,
        ..Default::default()
    };
    let dev = kvprobe_npu::sim::SimDevice::new(m, o).unwrap();
    serde_json::to_value(dev.manifest()).unwrap()
}

fn with_manifest(c: &mut Corpus, name: &str, path: &Path) {
    let a = c.sim_args(&format!("manifest-{name}"), &["--sim-manifest", &s(path)]);
    c.add(&format!("manifest {name}"), 2, None, &a);
}

pub fn manifests(c: &mut Corpus) {
    let good = manifest_of(c.model());
    let p = c.file("good-manifest.json", good.to_string().as_bytes());
    let a = c.sim_args("manifest-good", &["--sim-manifest", &s(&p)]);
    c.add("manifest written by a run (control)", 0, None, &a);
    let edits: Vec<(&str, Edit)> = vec![
        (
            "scale 0",
            Box::new(|v| v["quant"][0]["quant"]["scale"] = json!(0.0)),
        ),
        (
            "scale -1",
            Box::new(|v| v["quant"][2]["quant"]["scale"] = json!(-1.0)),
        ),
        (
            "scale 1e39",
            Box::new(|v| v["quant"][3]["quant"]["scale"] = json!(1e39)),
        ),
        ("schema 999", Box::new(|v| v["schema_version"] = json!(999))),
        (
            "cache_len 2^64-1",
            Box::new(|v| v["cache_len"] = json!(u64::MAX)),
        ),
        ("prefill_len 0", Box::new(|v| v["prefill_len"] = json!(0))),
        (
            "unknown cache_quant",
            Box::new(|v| v["cache_quant"] = json!("uint3")),
        ),
        (
            "conflicting faults",
            Box::new(|v| v["faults"] = json!(["tbt-position=+1", "tbt-position=-1"])),
        ),
        (
            "100k faults",
            Box::new(|v| v["faults"] = json!(vec!["kv-swap"; 100_000])),
        ),
        ("no quant list", Box::new(|v| v["quant"] = json!([]))),
    ];
    for (name, edit) in edits {
        let mut v = good.clone();
        edit(&mut v);
        let p = c.file(
            &format!("manifest-{}.json", name.replace(' ', "-")),
            v.to_string().as_bytes(),
        );
        with_manifest(c, name, &p);
    }
    let p = c.file("manifest-garbage.json", b"{\"schema_version\": 1, ");
    with_manifest(c, "not JSON", &p);
    let p = c.fifo("manifest-pipe.json");
    with_manifest(c, "a pipe", &p);
    with_manifest(c, "/dev/zero", Path::new("/dev/zero"));
    let p = c.sparse("manifest-sparse.json", 10 << 30);
    with_manifest(c, "10 GB sparse", &p);
    let d = c.root().join("manifest-folder");
    std::fs::create_dir(&d).unwrap();
    with_manifest(c, "a folder", &d);
}

/// A run folder holding `results` as its results.json.
fn run_folder(c: &Corpus, name: &str, results: &[u8]) -> PathBuf {
    let d = c.root().join(format!("results-{name}"));
    std::fs::create_dir(&d).unwrap();
    std::fs::write(d.join("results.json"), results).unwrap();
    d
}

fn report(c: &mut Corpus, name: &str, code: i32, dir: &Path) {
    c.add(
        &format!("results {name}"),
        code,
        None,
        &strings(&["report", &s(dir)]),
    );
}

pub fn results(c: &mut Corpus) {
    let good = serde_json::to_value(kvprobe_reports::fixtures::faulty_results()).unwrap();
    let d = run_folder(c, "good", good.to_string().as_bytes());
    report(c, "faulty fixture (control)", 0, &d);
    let edits: Vec<(&str, Edit)> = vec![
        (
            "colmap extra row",
            Box::new(|v| {
                let row = v["probes"]["colmap"]["matrix"][0].clone();
                v["probes"]["colmap"]["matrix"]
                    .as_array_mut()
                    .unwrap()
                    .push(row);
            }),
        ),
        (
            "splits a billion tokens",
            Box::new(|v| {
                v["probes"]["splits"] = json!({"prompt_len": 1_000_000_000u64, "prefill_len": 2, "rows": [],
                "whole_prefill": v["probes"]["greedy"]["steps"][0]["compared"].clone(),
                "pure_decode_min": 0.9, "mixed_decode_min": 0.9, "prefill_continue_min": 0.9, "failing_splits": []});
            }),
        ),
        ("schema 999", Box::new(|v| v["schema_version"] = json!(999))),
        (
            "verdict unknown word",
            Box::new(|v| v["verdict"] = json!("exploded")),
        ),
        ("probes a string", Box::new(|v| v["probes"] = json!("nope"))),
    ];
    for (name, edit) in edits {
        let mut v = good.clone();
        edit(&mut v);
        let d = run_folder(c, &name.replace(' ', "-"), v.to_string().as_bytes());
        report(c, name, 2, &d);
    }
    let mut v = good.clone();
    v["provenance"]["cache_len"] = json!(u64::MAX);
    let d = run_folder(c, "cache-len-max", v.to_string().as_bytes());
    // no ring-sized section in this run: the value is shown, nothing is sized by it
    report(c, "cache_len 2^64-1 without a ring section", 0, &d);
    let d = run_folder(c, "not-json", b"{\"schema_version\": 1,");
    report(c, "not JSON", 2, &d);
    let d = run_folder(c, "empty", b"");
    report(c, "empty file", 2, &d);
    let d = c.root().join("results-none");
    std::fs::create_dir(&d).unwrap();
    report(c, "no results.json", 2, &d);
    report(c, "missing folder", 2, &c.root().join("results-missing"));
    let d = c.root().join("results-pipe");
    std::fs::create_dir(&d).unwrap();
    assert!(std::process::Command::new("mkfifo")
        .arg(d.join("results.json"))
        .status()
        .unwrap()
        .success());
    report(c, "a pipe", 2, &d);
    let d = c.root().join("results-sparse");
    std::fs::create_dir(&d).unwrap();
    std::fs::File::create(d.join("results.json"))
        .unwrap()
        .set_len(10 << 30)
        .unwrap();
    report(c, "10 GB sparse", 2, &d);
}

pub fn cli_values(c: &mut Corpus) {
    sim(c, "healthy (control)", 0, &[], &[]);
    sim(
        c,
        "fault (control)",
        1,
        &[],
        &["--fault", "tbt-read-layout=feature-major"],
    );
    let huge = "1".repeat(30);
    let many_ids = vec!["1"; 20_000].join(",");
    for (name, over) in [
        ("steps 0", vec![("--steps", "0")]),
        ("steps 10^30", vec![("--steps", huge.as_str())]),
        ("steps a billion", vec![("--steps", "1000000000")]),
        ("steps -1", vec![("--steps", "-1")]),
        ("cache-len 0", vec![("--cache-len", "0")]),
        (
            "cache-len 2^64",
            vec![("--cache-len", "18446744073709551616")],
        ),
        ("cache-len 70000", vec![("--cache-len", "70000")]),
        ("prefill-len past the cache", vec![("--prefill-len", "40")]),
        ("ids not numbers", vec![("--ids", "1,x,3")]),
        ("ids past the vocabulary", vec![("--ids", "1,99999")]),
        ("ids 2^32", vec![("--ids", "4294967296")]),
        ("ids empty", vec![("--ids", "")]),
        ("ids 20000 tokens", vec![("--ids", many_ids.as_str())]),
    ] {
        sim(c, name, 2, &over, &[]);
    }
    for (name, extra) in [
        ("fault unknown", vec!["--fault", "flip-all-bits"]),
        ("fault bad value", vec!["--fault", "tbt-cache-scale=-1"]),
        ("fault nan", vec!["--fault", "tbt-attn-scale=NaN"]),
        (
            "fault layer 2^64",
            vec!["--fault", "kv-swap@layer=18446744073709551616"],
        ),
        (
            "faults conflicting",
            vec!["--fault", "tbt-position=+1", "--fault", "tbt-position=-2"],
        ),
        ("sim-cache-bits 7", vec!["--sim-cache-bits", "7"]),
        ("sim-quant bogus", vec!["--sim-quant", "bogus"]),
        ("unknown flag", vec!["--frobnicate"]),
    ] {
        sim(c, name, 2, &[], &extra);
    }
}

pub fn out_folders(c: &mut Corpus) {
    let file = c.file("out-a-file", b"mine");
    sim(c, "out is a file", 2, &[("--out", &s(&file))], &[]);
    let mine = c.root().join("out-mine");
    std::fs::create_dir(&mine).unwrap();
    std::fs::write(mine.join("notes.txt"), b"keep").unwrap();
    sim(c, "out non-empty", 2, &[("--out", "out-mine")], &[]);
    sim(
        c,
        "out not a run, --force",
        2,
        &[("--out", "out-mine")],
        &["--force"],
    );
    sim(c, "out ., --force", 2, &[("--out", ".")], &["--force"]);
    sim(c, "out .., --force", 2, &[("--out", "..")], &["--force"]);
    sim(
        c,
        "out under a file",
        2,
        &[("--out", "out-a-file/run")],
        &[],
    );
    sim(c, "out /, --force", 2, &[("--out", "/")], &["--force"]);
    // refused before the run (they failed only after it, and left their folders)
    sim(c, "out ends in /.", 2, &[("--out", "out-dot/.")], &[]);
    sim(
        c,
        "out ends in sub/..",
        2,
        &[("--out", "out-dotdot/sub/..")],
        &[],
    );
}
