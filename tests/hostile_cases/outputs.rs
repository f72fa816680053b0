//! Corpus cases of what kvprobe writes (issue 38): `--force` replaces only a folder kvprobe can
//! prove it wrote, temporary files are never followed, an output path that is not a regular file
//! is refused before the run, `inspect --extract` never overwrites or writes through a link and
//! leaves nothing partial, and a `--out` link is never replaced. Each case names the user's files
//! it must leave as they were.

use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};

use super::{s, strings, Corpus};
use crate::hostile_corpus::hef_encoder;

pub fn data_loss(c: &mut Corpus) {
    foreign_folders(c);
    own_folders(c);
    links_as_out(c);
    report_temporaries(c);
    single_files(c);
    extract(c);
}

fn dir(c: &Corpus, name: &str) -> PathBuf {
    let d = c.root().join(name);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// `diagnose --sim` on the fixture into `out`, with `extra` flags.
fn sim_into(c: &Corpus, out: &Path, extra: &[&str]) -> Vec<String> {
    let mut a = c.sim_args("unused", extra);
    let i = a.iter().position(|x| x == "--out").unwrap();
    a[i + 1] = s(out);
    a
}

/// Folders kvprobe did not write, each holding a `results.json` of some kind: `--force` keeps them.
fn foreign_folders(c: &mut Corpus) {
    let exp = dir(c, "exp-thesis");
    std::fs::create_dir_all(exp.join("data")).unwrap();
    std::fs::write(exp.join("results.json"), br#"{"accuracy":0.93}"#).unwrap();
    std::fs::write(exp.join("thesis.tex"), b"work").unwrap();
    let a = sim_into(c, &exp, &["--force"]);
    c.guarded("force: another tool's results.json", 2, &a, &[exp], || {});

    let empty = dir(c, "exp-empty-results");
    std::fs::write(empty.join("results.json"), b"").unwrap();
    let a = sim_into(c, &empty, &["--force"]);
    c.guarded("force: an empty results.json", 2, &a, &[empty], || {});

    let victim = c.file("victim-results.json", b"{}");
    let linked = dir(c, "exp-linked-results");
    symlink(&victim, linked.join("results.json")).unwrap();
    let a = sim_into(c, &linked, &["--force"]);
    c.guarded(
        "force: results.json a link",
        2,
        &a,
        &[linked, victim],
        || {},
    );

    // the model's own folder, and a folder above it, with a stray results.json
    let m = c.model_copy("model-as-out", |d| {
        std::fs::write(d.join("results.json"), b"{}").unwrap();
    });
    let mut a = sim_into(c, &m, &["--force"]);
    let i = a.iter().position(|x| x == "--model").unwrap();
    a[i + 1] = s(&m);
    c.guarded("force: --out is the model folder", 2, &a, &[m], || {});

    let parent = dir(c, "model-parent");
    std::fs::write(parent.join("results.json"), b"{}").unwrap();
    let inner = c.model_copy("model-parent/m", |_| {});
    let mut a = sim_into(c, &parent, &["--force"]);
    let i = a.iter().position(|x| x == "--model").unwrap();
    a[i + 1] = s(&inner);
    c.guarded("force: --out holds the model", 2, &a, &[parent], || {});
}

/// A folder kvprobe wrote, then changed by someone else: replaced only while it holds nothing else.
fn own_folders(c: &mut Corpus) {
    let own = c.root().join("own-run");
    let a = sim_into(c, &own, &[]);
    c.add("own: first run", 0, None, &a);
    let a = sim_into(c, &own, &["--force"]);
    c.add("own: --force replaces kvprobe's own run", 0, None, &a);

    let notes = own.join("notes.txt");
    let (n, o) = (notes.clone(), own.clone());
    c.guarded(
        "own: a file added to kvprobe's run",
        2,
        &a,
        std::slice::from_ref(&own),
        move || {
            let _ = std::fs::write(&n, b"mine");
        },
    );
    let victim = c.file("victim-own", b"keep");
    let (v, link) = (victim.clone(), own.join("extra-link"));
    c.guarded(
        "own: a link added to kvprobe's run",
        2,
        &a,
        &[own.clone(), victim],
        move || {
            let _ = std::fs::remove_file(&notes);
            let _ = symlink(&v, &link);
        },
    );
    let link = own.join("extra-link");
    let (sub, o2) = (own.join("sub"), o.clone());
    c.guarded(
        "own: a folder added to kvprobe's run",
        2,
        &a,
        std::slice::from_ref(&own),
        move || {
            let _ = std::fs::remove_file(&link);
            let _ = std::fs::create_dir(&sub);
            let _ = std::fs::write(sub.join("data.csv"), b"1,2");
        },
    );
    let sub = own.join("sub");
    c.guarded(
        "own: results.json replaced by another file",
        2,
        &a,
        std::slice::from_ref(&own),
        move || {
            let _ = std::fs::remove_dir_all(&sub);
            let _ = std::fs::write(o2.join("results.json"), br#"{"accuracy":0.93}"#);
        },
    );

    // written by a kvprobe from before the marker: refused, the message says how to remove it
    let old = c.root().join("own-old-run");
    let a = sim_into(c, &old, &[]);
    c.add("own: run of an older kvprobe", 0, None, &a);
    let a = sim_into(c, &old, &["--force"]);
    let marker = old.join("kvprobe-run.json");
    c.guarded(
        "own: a run without the marker",
        2,
        &a,
        std::slice::from_ref(&old),
        move || {
            let _ = std::fs::remove_file(&marker);
        },
    );
    c.cases.last_mut().unwrap().needle = Some("by hand");
}

/// `--out` a link to a folder: refused, never deleted and replaced.
fn links_as_out(c: &mut Corpus) {
    let target = c.root().join("own-linked-run");
    let a = sim_into(c, &target, &[]);
    c.add("link: first run", 0, None, &a);
    let link = c.root().join("out-link-to-run");
    symlink(&target, &link).unwrap();
    let a = sim_into(c, &link, &["--force"]);
    c.guarded(
        "link: --out a link to kvprobe's run, --force",
        2,
        &a,
        &[link, target],
        || {},
    );
    let empty = dir(c, "empty-link-target");
    let link = c.root().join("out-link-to-empty");
    symlink(&empty, &link).unwrap();
    let a = sim_into(c, &link, &[]);
    c.guarded(
        "link: --out a link to an empty folder",
        2,
        &a,
        &[link, empty],
        || {},
    );
}

/// Links planted where `report` used to put its fixed-name temporary files.
fn report_temporaries(c: &mut Corpus) {
    let good = serde_json::to_string(&kvprobe_reports::fixtures::faulty_results()).unwrap();
    let run = dir(c, "planted-run");
    std::fs::write(run.join("results.json"), &good).unwrap();
    let mut intact = Vec::new();
    for name in ["report.html", "summary.md"] {
        let victim = c.file(&format!("victim-{name}"), b"keep");
        let link = run.join(format!(".{name}.tmp"));
        symlink(&victim, &link).unwrap();
        intact.extend([victim, link]);
    }
    let a = strings(&["report", &s(&run)]);
    c.guarded("report: planted temporary links", 0, &a, &intact, || {});
    let a = strings(&["report", &s(&run), "--markdown"]);
    c.guarded(
        "report --markdown: planted temporary links",
        0,
        &a,
        &intact,
        || {},
    );
    let out = dir(c, "planted-compare");
    let victim = c.file("victim-compare.html", b"keep");
    let link = out.join(".compare.html.tmp");
    symlink(&victim, &link).unwrap();
    let a = strings(&["report", "--compare", &s(&run), &s(&run), "--out", &s(&out)]);
    c.guarded(
        "report --compare: a planted temporary link",
        0,
        &a,
        &[victim, link],
        || {},
    );
}

/// `ref logits --out` and `inspect --emit-sim` on paths that are not regular files.
fn single_files(c: &mut Corpus) {
    let hef = c.file("outputs.hef", &hef_encoder::encode(&hef_encoder::healthy()));
    let victim = c.file("victim-single", b"keep");
    let folder = dir(c, "single-folder");
    std::fs::write(folder.join("keep.txt"), b"keep").unwrap();
    let model = s(c.model());
    let logits = |out: &Path| {
        strings(&[
            "ref",
            "logits",
            "--model",
            &model,
            "--ids",
            "1,5,9",
            "--out",
            &s(out),
        ])
    };
    let emit = |out: &Path| strings(&["inspect", &s(&hef), "--emit-sim", &s(out)]);
    for (what, args) in [
        ("ref logits --out", &logits as &dyn Fn(&Path) -> Vec<String>),
        ("inspect --emit-sim", &emit),
    ] {
        let fifo = c.fifo(&format!("fifo-{}", what.replace([' ', '-'], "")));
        c.guarded(&format!("{what} a FIFO"), 2, &args(&fifo), &[fifo], || {});
        let link = c
            .root()
            .join(format!("link-{}", what.replace([' ', '-'], "")));
        symlink(&victim, &link).unwrap();
        c.guarded(
            &format!("{what} a link to a file"),
            2,
            &args(&link),
            &[link, victim.clone()],
            || {},
        );
        c.guarded(
            &format!("{what} a folder"),
            2,
            &args(&folder),
            std::slice::from_ref(&folder),
            || {},
        );
    }
}

/// `inspect --extract DIR` into folders that hold the user's files.
fn extract(c: &mut Corpus) {
    let hef = c.root().join("outputs.hef");
    let extract = |d: &Path, force: bool| {
        let mut a = strings(&["inspect", &s(&hef), "--extract", &s(d)]);
        if force {
            a.push("--force".into());
        }
        a
    };
    let mine = dir(c, "extract-mine");
    std::fs::write(mine.join("tokenizer.json"), b"mine").unwrap();
    c.guarded(
        "extract: a non-empty folder",
        2,
        &extract(&mine, false),
        &[mine],
        || {},
    );
    // a resource's name is a folder there: nothing of the other resources is left behind
    let partial = dir(c, "extract-partial");
    std::fs::create_dir(partial.join("embeddings.bin")).unwrap();
    c.guarded(
        "extract: fails on one resource",
        2,
        &extract(&partial, false),
        std::slice::from_ref(&partial),
        || {},
    );
    c.guarded(
        "extract --force: fails on one resource",
        2,
        &extract(&partial, true),
        std::slice::from_ref(&partial),
        || {},
    );
    let victim = c.file("victim-extract", b"keep");
    let planted = dir(c, "extract-planted");
    symlink(&victim, planted.join("tokenizer.json")).unwrap();
    c.guarded(
        "extract --force: never through a planted link",
        0,
        &extract(&planted, true),
        &[victim],
        || {},
    );
    let target = dir(c, "extract-link-target");
    let link = c.root().join("extract-link");
    symlink(&target, &link).unwrap();
    c.guarded(
        "extract: a link to a folder",
        2,
        &extract(&link, false),
        &[link, target],
        || {},
    );
}
