//! Bad input gives typed one-line errors with exit code 2, never a panic; the manifest round-trips.

mod common;
use common::*;

use std::path::PathBuf;

use kvprobe_npu::sim::{SimDevice, SimFlags, SimOptions};
use kvprobe_npu::{Device, Error, MaskMode};

fn err_of(m: &std::sync::Arc<kvprobe_reference::Model>, o: SimOptions) -> Error {
    match SimDevice::new(m.clone(), o) {
        Ok(_) => panic!("expected an error"),
        Err(e) => e,
    }
}

fn one_line_exit2(e: &Error) {
    let s = e.to_string();
    assert!(!s.contains('\n'), "{s}");
    assert_eq!(e.exit_code(), 2, "{s}");
}

fn with_fault(f: &str) -> SimOptions {
    let mut o = float_opts(24, 16);
    o.faults = vec![f.into()];
    o
}

#[test]
fn geometry_and_flags() {
    let (_d, m) = tiny_llama(41);
    for (l, p) in [(24, 24), (24, 30), (24, 0), (1, 1)] {
        let e = err_of(&m, float_opts(l, p));
        one_line_exit2(&e);
    }
    let flags = SimFlags {
        cache_len: Some(16),
        prefill_len: Some(16),
        ..Default::default()
    };
    one_line_exit2(&SimOptions::from_flags(&flags).unwrap_err());
    for bad in [
        SimFlags {
            sim_quant: Some("fp8".into()),
            ..Default::default()
        },
        SimFlags {
            sim_cache_bits: Some(4),
            ..Default::default()
        },
        SimFlags {
            sim_cache: Some("sideways".into()),
            ..Default::default()
        },
        SimFlags {
            sim_weights: Some("int4".into()),
            ..Default::default()
        },
        SimFlags {
            sim_quant: Some("none".into()),
            sim_cache_bits: Some(16),
            ..Default::default()
        },
    ] {
        let e = SimOptions::from_flags(&bad).unwrap_err();
        one_line_exit2(&e);
        assert!(matches!(e, Error::BadOption { .. }));
    }
    let ok = SimOptions::from_flags(&SimFlags {
        cache_len: Some(64),
        prefill_len: Some(8),
        faults: vec!["kv-swap".into()],
        sim_cache_bits: Some(16),
        sim_cache: Some("expanded".into()),
        sim_weights: Some("int8".into()),
        sim_taps: true,
        ..Default::default()
    })
    .unwrap();
    assert_eq!((ok.cache_len, ok.prefill_len, ok.taps), (64, 8, true));
    assert_eq!(ok.cache_quant, kvprobe_npu::sim::CacheQuant::U16);
}

#[test]
fn faults_unknown_scoped_and_noop() {
    let (_d, m) = tiny_llama(42);
    let (_g, gpt2) = tiny_gpt2(42);
    type Case<'a> = (
        &'a std::sync::Arc<kvprobe_reference::Model>,
        &'a str,
        fn(&Error) -> bool,
    );
    let cases: Vec<Case> = vec![
        (&m, "flip-bits", |e| matches!(e, Error::UnknownFault { .. })),
        (&m, "kv-swap@k", |e| matches!(e, Error::FaultScope { .. })),
        (&m, "tbt-position=+1@layer=0", |e| {
            matches!(e, Error::FaultScope { .. })
        }),
        (&m, "truncate-entry=8@layer=7", |e| {
            matches!(e, Error::BadFault { .. })
        }),
        (&m, "tbt-attn-scale=1.0", |e| {
            matches!(e, Error::NoOpFault { .. })
        }),
        (&m, "tbt-cache-scale=1", |e| {
            matches!(e, Error::NoOpFault { .. })
        }),
        (&m, "tbt-position=+0", |e| {
            matches!(e, Error::NoOpFault { .. })
        }),
        (&m, "truncate-entry=128", |e| {
            matches!(e, Error::NoOpFault { .. })
        }),
        (&m, "tbt-read-layout=token-major", |e| {
            matches!(e, Error::NoOpFault { .. })
        }),
        (&gpt2, "gqa-repeat=block", |e| {
            matches!(e, Error::NoOpFault { .. })
        }),
        // the table already has the graph's (default plain) convention
        (&m, "rope-theta=plain", |e| {
            matches!(e, Error::NoOpFault { .. })
        }),
        // learned positions: no theta table to get wrong
        (&gpt2, "rope-theta=sign-folded", |e| {
            matches!(e, Error::NoOpFault { .. })
        }),
        (&m, "rope-theta=folded", |e| {
            matches!(e, Error::BadFault { .. })
        }),
        (&m, "rope-theta=plain@tbt", |e| {
            matches!(e, Error::FaultScope { .. })
        }),
    ];
    for (model, f, is) in cases {
        let e = err_of(model, with_fault(f));
        one_line_exit2(&e);
        assert!(is(&e), "{f}: {e}");
    }
    // feature-major with a one-entry window equals token-major: P = 1 makes the writer fault a no-op
    let mut o = float_opts(24, 1);
    o.faults = vec!["prefill-write-layout=feature-major".into()];
    assert!(matches!(err_of(&m, o), Error::NoOpFault { .. }));
}

#[test]
fn prompt_too_long_and_bad_tokens() {
    let (_d, m) = tiny_llama(43);
    let (mut dev, mut drv) = sim(&m, float_opts(24, 16));
    let e = drv
        .prefill(&mut dev, &ids(30, m.config().vocab_size, 0))
        .unwrap_err();
    one_line_exit2(&e);
    one_line_exit2(&drv.prefill(&mut dev, &[]).unwrap_err());
    one_line_exit2(&drv.prefill(&mut dev, &[100_000]).unwrap_err());
    drv.prefill(&mut dev, &[1, 2, 3]).unwrap();
    one_line_exit2(&drv.step(&mut dev, 1, &MaskMode::SingleKey(23)).unwrap_err());
    one_line_exit2(
        &drv.step(&mut dev, 1, &MaskMode::Custom(vec![vec![true; 5]]))
            .unwrap_err(),
    );
    // a wrong buffer straight to the device
    let e = dev
        .run(
            kvprobe_schema::GroupKind::Tbt,
            &[("nope".into(), kvprobe_npu::Buffer::U8(vec![]))],
        )
        .unwrap_err();
    one_line_exit2(&e);
}

#[test]
fn manifest_round_trip_and_mismatch() {
    let (_d, m) = tiny_llama(44);
    let (_d2, other) = tiny_llama(45);
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("sim-manifest.json");
    let o = SimOptions {
        cache_len: 24,
        prefill_len: 8,
        faults: vec![
            "tbt-read-layout=feature-major@k".into(),
            "tbt-cache-scale=1.5".into(),
        ],
        ..SimOptions::default()
    };
    let dev = SimDevice::new(m.clone(), o).unwrap();
    dev.write_manifest(&path).unwrap();
    let man = dev.manifest().clone();
    assert_eq!(
        man.calibration_prompts.len(),
        kvprobe_npu::sim::calibrate::CALIBRATION_PROMPTS.len()
    );
    assert_eq!(man.quant.len(), 5 + 2 * m.config().n_layers);
    assert!(man
        .layouts
        .iter()
        .any(|l| l.layout == kvprobe_schema::Layout::FeatureMajor));

    // accepted back: same description, same outputs
    let back = SimDevice::new(
        m.clone(),
        SimOptions {
            manifest: Some(path.clone()),
            ..SimOptions::default()
        },
    )
    .unwrap();
    assert_eq!(back.describe(), dev.describe());
    assert_eq!(back.manifest(), &man);
    let prompt = ids(12, m.config().vocab_size, 1);
    let run = |d: SimDevice| {
        let mut d = d;
        let mut drv = d.driver().unwrap();
        drv.generate_greedy(&mut d, &prompt, 4).unwrap()
    };
    assert_eq!(run(back), run(dev));

    // another model's weights are refused
    let e = err_of(
        &other,
        SimOptions {
            manifest: Some(path.clone()),
            ..SimOptions::default()
        },
    );
    one_line_exit2(&e);
    assert!(matches!(e, Error::Manifest { .. }), "{e}");
    // garbage file
    std::fs::write(&path, "{not json").unwrap();
    let e = err_of(
        &m,
        SimOptions {
            manifest: Some(path),
            ..SimOptions::default()
        },
    );
    one_line_exit2(&e);
}

/// A manifest given as a value (a HEF's description, a replay's device) with faults that replace
/// its own: the layouts follow from the new faults, the quant infos stay the manifest's even
/// where the emulator would calibrate others, and the run is the flags' run with those faults.
#[test]
fn a_manifest_value_takes_replacing_faults_and_keeps_its_quant_infos() {
    let (_d, m) = tiny_llama(44);
    let geometry = |faults: &[&str]| SimOptions {
        cache_len: 24,
        prefill_len: 8,
        faults: faults.iter().map(|f| f.to_string()).collect(),
        ..SimOptions::default()
    };
    let faulty = SimDevice::new(m.clone(), geometry(&["tbt-read-layout=feature-major@k"])).unwrap();
    let recorded = faulty.manifest().clone();
    let path = PathBuf::from("recorded.json");
    let replay = |man: &kvprobe_schema::SimManifest, faults: &[&str]| {
        SimDevice::new(
            m.clone(),
            SimOptions {
                manifest_value: Some((man.clone(), path.clone())),
                faults: faults.iter().map(|f| f.to_string()).collect(),
                faults_replace_manifest: true,
                ..SimOptions::default()
            },
        )
        .unwrap()
    };
    let flags = SimDevice::new(m.clone(), geometry(&["offset=after-run"])).unwrap();
    let swapped = replay(&recorded, &["offset=after-run"]);
    assert_eq!(swapped.manifest(), flags.manifest());
    assert_ne!(swapped.manifest().layouts, recorded.layouts);
    let prompt = ids(12, m.config().vocab_size, 1);
    let run = |d: SimDevice| {
        let mut d = d;
        let mut drv = d.driver().unwrap();
        drv.generate_greedy(&mut d, &prompt, 4).unwrap()
    };
    assert_eq!(run(swapped), run(flags));
    // the healthy hypothesis: no fault at all, not the manifest's
    assert!(replay(&recorded, &[]).manifest().faults.is_empty());
    // quant infos the emulator would not calibrate are kept, not recalibrated
    let mut edited = recorded.clone();
    edited.quant[0].quant.scale *= 1.01;
    assert_eq!(
        replay(&edited, &["offset=after-run"]).manifest().quant,
        edited.quant
    );
    // without replacing, a value is the file: its faults and layouts must agree
    let back = SimDevice::new(
        m.clone(),
        SimOptions {
            manifest_value: Some((recorded.clone(), path.clone())),
            ..SimOptions::default()
        },
    )
    .unwrap();
    assert_eq!(back.manifest(), &recorded);
}
