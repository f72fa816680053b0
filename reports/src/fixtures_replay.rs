//! The faulty fixture run's typed cause and its reproducer (issue 34), apart from the findings
//! in `fixtures` so each file stays small.

/// The faulty run's cause: a reader-layout rule, its hypothesis replayed exactly.
pub fn faulty_hypothesis() -> kvprobe_schema::Hypothesis {
    kvprobe_schema::Hypothesis {
        rule: "reader-layout-repair".into(),
        decisive: vec![
            "inject: golden rings read feature-major repair the step (cosine 0.999)".into(),
            "<b>decisive</b> & second line".into(),
            "a third line stays in the evidence".into(),
        ],
        fault: Some(faulty_fault()),
    }
}

fn faulty_fault() -> kvprobe_schema::FaultHypothesis {
    kvprobe_schema::FaultHypothesis {
        name: "tbt-read-layout".into(),
        value: kvprobe_schema::FaultValue::Word("feature-major".into()),
        groups: vec![],
        kinds: vec![kvprobe_schema::CacheKind::K],
        layers: vec![],
    }
}

/// The faulty run's reproducer: replayed on the emulator, it reproduces every step exactly.
pub fn faulty_reproducer() -> kvprobe_schema::Reproducer {
    let steps: Vec<kvprobe_schema::ReplayStep> = (0..4)
        .map(|step| kvprobe_schema::ReplayStep {
            step,
            replay_miss: 0.0,
            healthy_miss: Some(0.4),
            precision: Some(2e-4),
        })
        .collect();
    kvprobe_schema::Reproducer {
        setup: Vec::new(),
        command: [
            "kvprobe",
            "greedy",
            "--sim",
            "--prompt",
            "<script>x</script>",
            "--fault",
            "tbt-read-layout=feature-major@k",
            "--steps",
            "4",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect(),
        replay: Some(kvprobe_schema::Replay {
            fault: faulty_fault(),
            steps,
            replay_miss: 0.0,
            healthy_miss: Some(0.4),
            precision: Some(2e-4),
            reproduces: true,
        }),
        tried: vec![("tbt-read-layout=feature-major@k".into(), 0.0)],
        note: None,
    }
}
