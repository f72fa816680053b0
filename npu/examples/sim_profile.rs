//! Where the emulator's time goes on a real model (medians over repeats): model identity hash,
//! calibration, device construction, prefill, greedy tbt steps, and N trial steps looped
//! (`trial_step`) against batched (`trial_steps`, one graph run).
//! `cargo run --release -p kvprobe-npu --example sim_profile -- MODEL.gguf [REPS] [TRIALS]`

use std::sync::Arc;
use std::time::Instant;

use kvprobe_npu::sim::{calibrate, manifest, SimDevice, SimOptions};
use kvprobe_npu::MaskMode;

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn timed<T>(reps: usize, mut f: impl FnMut() -> T) -> (f64, T) {
    let mut v = Vec::new();
    let mut last = None;
    for _ in 0..reps {
        let s = Instant::now();
        last = Some(f());
        v.push(s.elapsed().as_secs_f64());
    }
    (median(v), last.expect("reps >= 1"))
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let path = args.next().ok_or("pass a model path")?;
    let reps: usize = args.next().map(|s| s.parse()).transpose()?.unwrap_or(3);
    let n_trials: usize = args.next().map(|s| s.parse()).transpose()?.unwrap_or(22);
    let m = Arc::new(kvprobe_reference::Model::load(std::path::Path::new(&path))?);

    let mut toks = 0;
    let s = Instant::now();
    for text in calibrate::CALIBRATION_PROMPTS {
        let ids = m.encode(text, None)?;
        toks += ids.len().min(96);
        let _ = m.forward(&ids[..ids.len().min(96)], &Default::default())?;
    }
    println!(
        "calibration prompts: {toks} tokens, plain forwards {:.2}s",
        s.elapsed().as_secs_f64()
    );
    let (t_id, _) = timed(reps, || manifest::model_identity(&m));
    let (t_cal, _) = timed(reps, || calibrate::measure(&m, 96));
    let (t_new, dev) = timed(reps, || SimDevice::new(m.clone(), SimOptions::default()));
    let mut dev = dev?;
    let mut drv = dev.driver()?;
    println!(
        "model identity {:.2}s, calibrate {:.2}s, SimDevice::new (default, calibrated) {:.2}s",
        t_id, t_cal, t_new
    );

    let prompt = m.encode(
        "Once upon a time there was a little girl who lived in a small house near the woods.",
        None,
    )?;
    let (t_pre, _) = timed(reps, || {
        drv.reset(&mut dev)
            .and_then(|_| drv.prefill(&mut dev, &prompt))
    });
    let (t_steps, _) = timed(reps, || -> Result<(), kvprobe_npu::Error> {
        drv.reset(&mut dev)?;
        drv.prefill(&mut dev, &prompt)?;
        let mut tok = 42;
        for _ in 0..32 {
            let out = drv.step(&mut dev, tok, &MaskMode::Ring)?;
            tok = kvprobe_npu::argmax(&out.logits);
        }
        Ok(())
    });
    println!(
        "prefill of {} tokens {:.3}s, 32 tbt steps {:.2}s ({:.1} ms/step)",
        prompt.len(),
        t_pre,
        t_steps - t_pre,
        (t_steps - t_pre) / 32.0 * 1e3
    );

    drv.reset(&mut dev)?;
    drv.prefill(&mut dev, &prompt)?;
    let modes: Vec<MaskMode> = (0..n_trials)
        .map(|j| MaskMode::SingleKey(127 - n_trials + j))
        .collect();
    let (t_loop, _) = timed(reps, || -> Result<(), kvprobe_npu::Error> {
        for md in &modes {
            drv.trial_step(&mut dev, 42, md)?;
        }
        Ok(())
    });
    let (t_batch, _) = timed(reps, || drv.trial_steps(&mut dev, 42, &modes));
    println!(
        "{n_trials} single-key trials: looped trial_step {:.2}s, batched trial_steps {:.2}s",
        t_loop, t_batch
    );
    Ok(())
}
