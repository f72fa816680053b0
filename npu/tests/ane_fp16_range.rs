//! A checkpoint whose weights fp16 cannot hold (bf16 / f32 values beyond ±65504) is refused by
//! the fp16 ANE emulator in one line naming the model and the weight, instead of running a graph
//! full of infinities (issue 21 "bf16 on a path that cannot take it").

use std::sync::Arc;

use candle_core::{DType, Device, Tensor};
use kvprobe_npu::coreml::{AneDevice, AneOptions};
use kvprobe_reference::fixtures::{write_tiny_llama_with, FixtureOptions};
use kvprobe_reference::Model;

#[test]
fn weights_beyond_fp16_are_refused() {
    let d = tempfile::tempdir().unwrap();
    let opts = FixtureOptions {
        shards: 1,
        dtype: DType::BF16,
    };
    write_tiny_llama_with(d.path(), 2, &opts).unwrap();
    let ok = Arc::new(Model::load(d.path()).unwrap());
    AneDevice::new(ok, AneOptions::default()).unwrap();
    let st = d.path().join("model.safetensors");
    let mut w = candle_core::safetensors::load(&st, &Device::Cpu).unwrap();
    let name = "model.layers.1.mlp.up_proj.weight";
    let t = &w[name];
    let big = Tensor::full(1.0e5f32, t.dims(), &Device::Cpu)
        .unwrap()
        .to_dtype(DType::BF16)
        .unwrap();
    w.insert(name.into(), big);
    candle_core::safetensors::save(&w, &st).unwrap();
    let m = Arc::new(Model::load(d.path()).unwrap());
    let e = AneDevice::new(m, AneOptions::default())
        .err()
        .expect("refused");
    let s = e.to_string();
    assert!(!s.contains('\n'), "{s}");
    assert!(s.contains("layer 1 up") && s.contains("fp16"), "{s}");
    assert!(s.contains(&d.path().display().to_string()), "{s}");
}
