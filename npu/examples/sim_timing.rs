//! Wall time of the emulator on a model: build (calibration), prefill, 32 greedy tbt steps.
//! `cargo run -p kvprobe-npu --example sim_timing -- MODEL.gguf`

use std::sync::Arc;
use std::time::Instant;

use kvprobe_npu::sim::{SimDevice, SimOptions};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let path = std::env::args().nth(1).ok_or("pass a model path")?;
    let t0 = Instant::now();
    let m = Arc::new(kvprobe_reference::Model::load(std::path::Path::new(&path))?);
    let t1 = Instant::now();
    let tf = Instant::now();
    let fdev = SimDevice::new(
        m.clone(),
        SimOptions {
            cache_quant: kvprobe_npu::sim::CacheQuant::Float,
            ..SimOptions::default()
        },
    )?;
    let tf2 = Instant::now();
    let _ = fdev.driver()?;
    let tc = Instant::now();
    let _ = kvprobe_npu::sim::calibrate::measure(&m, 96)?;
    println!(
        "float build {:.2}s, driver {:.2}s, calibrate {:.2}s",
        (tf2 - tf).as_secs_f64(),
        (tc - tf2).as_secs_f64(),
        tc.elapsed().as_secs_f64()
    );
    let mut dev = SimDevice::new(m.clone(), SimOptions::default())?;
    let mut drv = dev.driver()?;
    let t2 = Instant::now();
    let prompt = m.encode("The history of the city begins in the year", None)?;
    drv.prefill(&mut dev, &prompt)?;
    let t3 = Instant::now();
    let mut tok = 42;
    for _ in 0..32 {
        let out = drv.step(&mut dev, tok, &kvprobe_npu::MaskMode::Ring)?;
        tok = kvprobe_npu::argmax(&out.logits);
    }
    let t4 = Instant::now();
    println!(
        "load {:.2}s, build+calibrate {:.2}s, prefill {:.2}s, 32 steps {:.2}s",
        (t1 - t0).as_secs_f64(),
        (t2 - t1).as_secs_f64(),
        (t3 - t2).as_secs_f64(),
        (t4 - t3).as_secs_f64()
    );
    Ok(())
}
