//! Dumps every buffer the genai driver builds, and every cache-offset call it makes, for a fixed
//! set of geometries and prompts, so they can be compared byte for byte with what HailoRT's own
//! genai pre-processing builds from the same setup (docs/hardware.md, "The driver against
//! HailoRT's code"). No device runs: a recording device answers each run with zero logits.
//!
//! Usage: `cargo run -p kvprobe-npu --example genai_dump -- OUT`
//!
//! For each case `OUT/<case>/setup/` holds what both sides read: `geometry.txt` (`P L NH NKV F D
//! VOCAB TBT`), `quant.txt` (embeddings then mask quant info: `scale zp min max`), `theta.f32`,
//! `embed.f32` (`VOCAB × F` float rows the embeddings input quantises) and `script.txt`
//! (`prefill id…`, `tbt id`, `reset`). `OUT/<case>/driver/` holds the driver's side: `table.u16`
//! (the quantised embedding rows), `m1.u8`, `calls.txt` (`init_cache R`, `update_cache_offset D`,
//! `run GROUP N`) and `NNN_<role>.bin` per run (little-endian raw buffer bytes).

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;

use kvprobe_npu::driver::theta_from_inv_freq;
use kvprobe_npu::quant::quantize_slice_u16;
use kvprobe_npu::{Buffer, Device, Driver, EmbeddingTable, MaskMode, Result, RunOutput};
use kvprobe_schema::{
    DType, DeviceDescription, GroupDescription, GroupKind, InputRole, IoDescription, ModelShape,
    QuantInfo,
};

/// One geometry and quantisation to compare.
struct Case {
    name: &'static str,
    p: usize,
    l: usize,
    nh: usize,
    nkv: usize,
    f: usize,
    d: usize,
    vocab: usize,
    tbt: bool,
    rope_base: f64,
    embed_q: QuantInfo,
    mask_q: QuantInfo,
}

/// Prompts and steps: remainder-first chunking (13 = 5 + 8), a prompt of exactly `P`, a
/// one-token prompt, `L − 1` tokens, and enough tbt steps to wrap the ring (`U > L`).
enum Op {
    Prefill(Vec<u32>),
    Tbt(u32),
    Reset,
}

fn ids(n: usize, salt: usize, vocab: usize) -> Vec<u32> {
    (0..n)
        .map(|i| ((i * 7 + salt * 13 + 3) % vocab) as u32)
        .collect()
}

fn script(c: &Case) -> Vec<Op> {
    let mut ops = Vec::new();
    let request = |ops: &mut Vec<Op>, n: usize, steps: usize, salt: usize| {
        ops.push(Op::Prefill(ids(n, salt, c.vocab)));
        for s in 0..steps {
            ops.push(Op::Tbt(((s * 5 + salt) % c.vocab) as u32));
        }
        ops.push(Op::Reset);
    };
    request(&mut ops, c.p + c.p / 2 + 1, c.l + 11, 1);
    request(&mut ops, 2 * c.p + c.p / 2, 3, 2);
    request(&mut ops, c.p, 2, 3);
    request(&mut ops, 1, 1, 4);
    request(&mut ops, c.l - 1, 5, 5);
    ops
}

/// A genai ring device that records instead of running.
struct Recorder {
    desc: DeviceDescription,
    calls: String,
    runs: Vec<Vec<(String, Buffer)>>,
}

impl Device for Recorder {
    fn describe(&self) -> &DeviceDescription {
        &self.desc
    }
    fn run(&mut self, g: GroupKind, inputs: &[(String, Buffer)]) -> Result<RunOutput> {
        let kind = if g == GroupKind::Prefill {
            "prefill"
        } else {
            "tbt"
        };
        let _ = writeln!(self.calls, "run {kind} {:03}", self.runs.len());
        self.runs.push(inputs.to_vec());
        Ok(RunOutput {
            logits: vec![0.0; self.desc.shape.vocab_size],
            taps: BTreeMap::new(),
        })
    }
    fn init_cache(&mut self, r: u32) -> Result<()> {
        let _ = writeln!(self.calls, "init_cache {r}");
        Ok(())
    }
    fn update_cache_offset(&mut self, d: i32) -> Result<()> {
        let _ = writeln!(self.calls, "update_cache_offset {d}");
        Ok(())
    }
    fn cache_buffers(&mut self) -> Result<BTreeMap<u32, Vec<u8>>> {
        Ok(BTreeMap::new())
    }
    fn write_cache_buffer(&mut self, _: u32, _: &[u8]) -> Result<()> {
        Ok(())
    }
}

/// HailoRT's input names: the server finds each input by these suffixes.
const SUFFIXES: [(InputRole, &str); 6] = [
    (InputRole::Embeddings, "input_layer1"),
    (InputRole::AttentionMask, "input_layer2"),
    (InputRole::PeQCos, "input_layer3"),
    (InputRole::PeQSin, "input_layer4"),
    (InputRole::PeKCos, "input_layer5"),
    (InputRole::PeKSin, "input_layer6"),
];

fn group(c: &Case, kind: GroupKind, rows: usize) -> GroupDescription {
    let prefix = if kind == GroupKind::Prefill {
        "m__prefill"
    } else {
        "m__tbt"
    };
    let inputs = SUFFIXES
        .iter()
        .map(|&(role, suffix)| {
            let (features, host, dev, quant) = match role {
                InputRole::Embeddings => (c.f, DType::U16, DType::U16, c.embed_q),
                InputRole::AttentionMask => (c.nh * c.l, DType::U8, DType::U8, c.mask_q),
                InputRole::PeQCos | InputRole::PeQSin => {
                    (c.nh * c.d, DType::F32, DType::U8, QuantInfo::IDENTITY)
                }
                _ => (c.nkv * c.d, DType::F32, DType::U8, QuantInfo::IDENTITY),
            };
            IoDescription {
                name: format!("{prefix}/{suffix}"),
                role: Some(role),
                shape: [1, rows, features],
                host_dtype: host,
                device_dtype: dev,
                quant,
            }
        })
        .collect();
    GroupDescription {
        name: prefix.into(),
        kind,
        rows,
        inputs,
        outputs: Vec::new(),
        cache_edges: Vec::new(),
        taps: Vec::new(),
    }
}

fn le_bytes(b: &Buffer) -> Vec<u8> {
    match b {
        Buffer::U8(v) => v.clone(),
        Buffer::U16(v) => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
        Buffer::F32(v) => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
    }
}

/// Embedding values that reach every branch of the quantiser: ties at half a step, values on and
/// past both limits, and ordinary values.
fn embed_matrix(c: &Case) -> Vec<f32> {
    let q = c.embed_q;
    (0..c.vocab * c.f)
        .map(|i| match i % 5 {
            0 => ((i as f32) * 0.37).sin() * q.max * 0.9,
            1 => ((i % 97) as f32 - 48.0 + 0.5) * q.scale,
            2 => q.max * (1.0 + (i % 3) as f32),
            3 => q.min * (1.0 + (i % 2) as f32),
            _ => ((i as f32) * 1.3).cos() * 3.0,
        })
        .collect()
}

fn run_case(c: &Case, out: &Path) -> std::result::Result<(), Box<dyn std::error::Error>> {
    let setup = out.join(c.name).join("setup");
    let dump = out.join(c.name).join("driver");
    std::fs::create_dir_all(&setup)?;
    std::fs::create_dir_all(&dump)?;
    let half = c.d / 2;
    let inv: Vec<f32> = (0..half)
        .map(|i| (c.rope_base.powf(-((2 * i) as f64) / c.d as f64)) as f32)
        .collect();
    let theta = theta_from_inv_freq(&inv);
    let mut groups = vec![group(c, GroupKind::Prefill, c.p)];
    if c.tbt {
        groups.push(group(c, GroupKind::Tbt, 1));
    }
    let desc = DeviceDescription {
        backend: "recorder".into(),
        runtime: Default::default(),
        model_name: "m".into(),
        cache_len: c.l,
        prefill_len: c.p,
        shape: ModelShape {
            vocab_size: c.vocab,
            hidden_size: c.f,
            n_layers: 1,
            n_heads: c.nh,
            n_kv_heads: c.nkv,
            head_dim: c.d,
            rope_theta: Some(theta.clone()),
        },
        groups,
        weights: Default::default(),
        arithmetic: Default::default(),
    };
    let emb = embed_matrix(c);
    let q = |q: &QuantInfo| format!("{:e} {:e} {:e} {:e}\n", q.scale, q.zero_point, q.min, q.max);
    std::fs::write(
        setup.join("geometry.txt"),
        format!(
            "{} {} {} {} {} {} {} {}\n",
            c.p, c.l, c.nh, c.nkv, c.f, c.d, c.vocab, c.tbt as u8
        ),
    )?;
    std::fs::write(
        setup.join("quant.txt"),
        format!("{}{}", q(&c.embed_q), q(&c.mask_q)),
    )?;
    std::fs::write(setup.join("theta.f32"), le_bytes(&Buffer::F32(theta)))?;
    std::fs::write(setup.join("embed.f32"), le_bytes(&Buffer::F32(emb.clone())))?;
    let ops = script(c);
    let mut text = String::new();
    for op in &ops {
        match op {
            Op::Prefill(v) => {
                let v: Vec<String> = v.iter().map(u32::to_string).collect();
                let _ = writeln!(text, "prefill {}", v.join(" "));
            }
            Op::Tbt(t) => {
                let _ = writeln!(text, "tbt {t}");
            }
            Op::Reset => text.push_str("reset\n"),
        }
    }
    std::fs::write(setup.join("script.txt"), text)?;

    let mut rec = Recorder {
        desc: desc.clone(),
        calls: String::new(),
        runs: Vec::new(),
    };
    let embeddings_input = desc.groups[0].inputs[0].clone();
    let mut codes = Vec::new();
    quantize_slice_u16(&emb, &embeddings_input.quant, &mut codes);
    std::fs::write(dump.join("table.u16"), le_bytes(&Buffer::U16(codes)))?;
    let table = EmbeddingTable::from_float(&emb, c.vocab, c.f, &embeddings_input)?;
    let mut driver = Driver::new(&rec, table)?;
    std::fs::write(dump.join("m1.u8"), [driver.m1()])?;
    for op in &ops {
        match op {
            Op::Prefill(v) => {
                driver.prefill(&mut rec, v)?;
            }
            Op::Tbt(t) => {
                driver.step(&mut rec, *t, &MaskMode::Ring)?;
            }
            Op::Reset => driver.reset(&mut rec)?,
        }
    }
    let group_of = |name: &str| {
        SUFFIXES
            .iter()
            .find(|(_, s)| name.ends_with(s))
            .map(|(_, s)| *s)
            .unwrap_or("unknown")
    };
    for (i, inputs) in rec.runs.iter().enumerate() {
        for (name, buf) in inputs {
            std::fs::write(
                dump.join(format!("{i:03}_{}.bin", group_of(name))),
                le_bytes(buf),
            )?;
        }
    }
    std::fs::write(dump.join("calls.txt"), &rec.calls)?;
    println!(
        "{}: {} runs dumped to {}",
        c.name,
        rec.runs.len(),
        dump.display()
    );
    Ok(())
}

fn main() -> std::result::Result<(), Box<dyn std::error::Error>> {
    let Some(out) = std::env::args_os().nth(1) else {
        eprintln!("usage: genai_dump OUT");
        std::process::exit(2);
    };
    let out = Path::new(&out);
    let embed_q = QuantInfo {
        scale: 1.0 / 1024.0,
        zero_point: 32768.0,
        min: -32.0,
        max: 31.999,
    };
    let cases = [
        // tbt group, GQA 3:1, a mask whose quantised 1.0 is the full code 255
        Case {
            name: "tbt",
            p: 8,
            l: 32,
            nh: 3,
            nkv: 1,
            f: 24,
            d: 64,
            vocab: 40,
            tbt: true,
            rope_base: 100000.0,
            embed_q,
            mask_q: QuantInfo {
                scale: 1.0 / 255.0,
                zero_point: 0.0,
                min: 0.0,
                max: 1.0,
            },
        },
        // no tbt group (every later token is a 1-token prefill chunk), other scales
        Case {
            name: "no-tbt",
            p: 6,
            l: 20,
            nh: 2,
            nkv: 2,
            f: 16,
            d: 32,
            vocab: 30,
            tbt: false,
            rope_base: 10000.0,
            embed_q: QuantInfo {
                scale: 0.0037,
                zero_point: 30000.0,
                min: -111.0,
                max: 131.0,
            },
            mask_q: QuantInfo {
                scale: 0.0078,
                zero_point: 3.0,
                min: -0.02,
                max: 1.97,
            },
        },
    ];
    for c in &cases {
        run_case(c, out)?;
    }
    Ok(())
}
