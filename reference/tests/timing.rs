//! Timings, printed not asserted (`cargo test -p kvprobe-reference --test timing -- --ignored
//! --nocapture`). Set KVPROBE_TIMING_MODEL to a model folder or .gguf to time it as well.

mod common;

use std::time::Instant;

use kvprobe_reference::{ForwardOptions, KeySet, Model};

fn time(name: &str, m: &Model) {
    let c = m.config();
    let t = 128.min(c.max_position - 12);
    let x = common::ids(t, c.vocab_size.min(5000), 1);
    let _ = m.forward(&x[..8], &ForwardOptions::default()).unwrap(); // warm-up
    let s = Instant::now();
    let out = m.forward(&x, &ForwardOptions::default()).unwrap();
    let full = s.elapsed();
    assert_eq!(out.rows, t);
    let mut st = m.prefix_state(&x, &(0..t).collect::<Vec<_>>()).unwrap();
    let s = Instant::now();
    let n = 10;
    for (i, &tok) in x.iter().take(n).enumerate() {
        m.decode_step(&mut st, tok, t + i).unwrap();
    }
    let step = s.elapsed() / n as u32;
    let sets: Vec<KeySet> = (0..t).map(|j| KeySet::Subset(vec![j])).collect();
    let s = Instant::now();
    let many = m.step_many(&st, x[0], t + n, &sets).unwrap();
    let colmap = s.elapsed();
    assert_eq!(many.len(), t);
    println!(
        "{name}: {t}-token forward {:.1} ms ({:.0} tok/s); decode step {:.2} ms ({:.0} tok/s); step_many x{t} single-key {:.1} ms",
        full.as_secs_f64() * 1e3,
        t as f64 / full.as_secs_f64(),
        step.as_secs_f64() * 1e3,
        1.0 / step.as_secs_f64(),
        colmap.as_secs_f64() * 1e3
    );
}

#[test]
#[ignore = "timing, run by hand"]
fn timings() {
    time("tiny llama", &common::llama(1).model);
    time("tiny gpt2", &common::gpt2(1).model);
    if let Ok(p) = std::env::var("KVPROBE_TIMING_MODEL") {
        let s = Instant::now();
        let m = Model::load(std::path::Path::new(&p)).unwrap();
        println!("load {p}: {:.2} s", s.elapsed().as_secs_f64());
        time(&p, &m);
    }
}
