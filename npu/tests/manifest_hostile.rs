//! Hostile sim manifests and HEF paths (issue 19): files that are not regular or are far too
//! large are refused before they are read, values no compile produces are refused on load, and
//! conflicting repeated faults are refused naming both.

mod common;
use common::*;

use std::path::{Path, PathBuf};

use kvprobe_npu::ane::{AneDevice, AneOptions};
use kvprobe_npu::contract::manifest::{self, CappedReadError};
use kvprobe_npu::hef::{Hef, HefError};
use kvprobe_npu::sim::{SimDevice, SimOptions};
use kvprobe_npu::Error;

fn fifo(dir: &Path) -> PathBuf {
    let p = dir.join("pipe");
    let ok = std::process::Command::new("mkfifo")
        .arg(&p)
        .status()
        .expect("mkfifo runs")
        .success();
    assert!(ok, "mkfifo failed");
    p
}

fn sparse(dir: &Path, len: u64) -> PathBuf {
    let p = dir.join("sparse");
    std::fs::File::create(&p).unwrap().set_len(len).unwrap();
    p
}

/// A pipe would block the open, /dev/zero never ends, a folder is no file, a sparse 10 GB file
/// would be read whole: all refused up front with one line.
#[test]
fn not_regular_or_too_large_is_refused_before_reading() {
    let dir = tempfile::tempdir().unwrap();
    let pipe = fifo(dir.path());
    let big = sparse(dir.path(), 10 << 30);
    for (p, what) in [
        (pipe.as_path(), "a pipe"),
        (Path::new("/dev/zero"), "a device"),
        (dir.path(), "a folder"),
    ] {
        let e = manifest::read(p).unwrap_err();
        let s = e.to_string();
        assert!(s.contains(what) && !s.contains('\n'), "{s}");
        assert_eq!(e.exit_code(), 2);
        let e = Hef::open(p).unwrap_err();
        assert!(
            matches!(&e, HefError::Read { reason: CappedReadError::NotAFile(w), .. } if *w == what),
            "{e}"
        );
    }
    let e = manifest::read(&big).unwrap_err().to_string();
    assert!(e.contains("10737418240 bytes"), "{e}");
    let e = Hef::open(&big).unwrap_err();
    assert!(
        matches!(
            &e,
            HefError::Read {
                reason: CappedReadError::TooLarge { .. },
                ..
            }
        ),
        "{e}"
    );
    assert!(!e.to_string().contains('\n'));
}

fn written_manifest(
    dir: &Path,
) -> (
    std::sync::Arc<kvprobe_reference::Model>,
    PathBuf,
    tempfile::TempDir,
) {
    let (d, m) = tiny_llama(44);
    let path = dir.join("sim-manifest.json");
    let dev = SimDevice::new(m.clone(), float_opts(24, 8)).unwrap();
    dev.write_manifest(&path).unwrap();
    (m, path, d)
}

/// A scale of 0, below 0 or not finite quantises every value to one level (or NaN): exit 0 and a
/// wrong verdict before; refused on load now.
#[test]
fn manifest_quant_scales_must_be_positive_finite() {
    let dir = tempfile::tempdir().unwrap();
    let (m, path, _d) = written_manifest(dir.path());
    let good = std::fs::read_to_string(&path).unwrap();
    let mut v: serde_json::Value = serde_json::from_str(&good).unwrap();
    assert!(!v["quant"].as_array().unwrap().is_empty());
    for scale in [
        serde_json::json!(0.0),
        serde_json::json!(-0.5),
        serde_json::json!(1e39),
    ] {
        v["quant"][1]["quant"]["scale"] = scale.clone();
        std::fs::write(&path, v.to_string()).unwrap();
        let o = SimOptions {
            manifest: Some(path.clone()),
            ..SimOptions::default()
        };
        let e = SimDevice::new(m.clone(), o).err().expect("refused");
        let s = e.to_string();
        assert!(matches!(e, Error::Manifest { .. }), "{s}");
        // 1e39 does not fit the manifest's f32: serde refuses it while parsing (out of range)
        assert!(
            (s.contains("not a positive finite number") || s.contains("out of range"))
                && !s.contains('\n'),
            "{s}"
        );
        assert!(s.contains(&path.display().to_string()), "{s}");
    }
}

fn sim_err(faults: &[&str]) -> Option<Error> {
    let (_d, m) = tiny_llama(46);
    let mut o = float_opts(24, 8);
    o.faults = faults.iter().map(|f| f.to_string()).collect();
    SimDevice::new(m, o).err()
}

/// The same fault twice with values that differ where both apply: which one ran depended on the
/// order; refused naming both now. Disjoint scopes and exact repeats stay accepted.
#[test]
fn conflicting_repeated_faults_are_refused_naming_both() {
    for pair in [
        ["tbt-position=+1", "tbt-position=-2"],
        ["tbt-read-layout=f8cr@k", "tbt-read-layout=feature-major"],
        [
            "truncate-entry=8@layer=0",
            "truncate-entry=4@layer=0,layer=1",
        ],
    ] {
        let e = sim_err(&pair).expect("refused");
        let s = e.to_string();
        assert!(s.contains(pair[0]) && s.contains(pair[1]), "{s}");
        assert!(s.contains("conflicts") && !s.contains('\n'), "{s}");
        assert_eq!(e.exit_code(), 2);
    }
    for ok in [
        ["tbt-read-layout=f8cr@k", "tbt-read-layout=feature-major@v"],
        ["tbt-position=+1", "tbt-position=+1"],
        ["truncate-entry=8@layer=0", "truncate-entry=4@layer=1"],
    ] {
        assert!(sim_err(&ok).is_none(), "{ok:?} refused");
    }
    let (_d, m) = tiny_llama(47);
    let o = AneOptions {
        faults: vec!["ane-scale-after-qk=2".into(), "ane-scale-after-qk=4".into()],
        ..AneOptions::default()
    };
    let s = AneDevice::new(m, o).err().expect("refused").to_string();
    assert!(
        s.contains("=2") && s.contains("=4") && s.contains("conflicts"),
        "{s}"
    );
}
