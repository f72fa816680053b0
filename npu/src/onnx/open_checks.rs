//! What opening a GenAI folder checks and derives before any run: the pairing of
//! genai_config.json with the reference model, the shared buffer's length, the cache edges'
//! format name and the QDQ cache's scales.

use kvprobe_reference::Model;

use super::config::GenaiConfig;
use super::faults::HostFault;
use super::OnnxOptions;
use crate::{Error, Result};

/// The shared buffer's length (H12), or None for separate buffers (H6). GenAI shares the buffer
/// when `search.past_present_share_buffer` is set (batch 1, greedy: what kvprobe drives, G:gen)
/// or when every past input has the same fixed sequence dim (then the buffer is that long,
/// G:kv `DetectAndConfigureFixedKvShape`); a context longer than the buffer cannot be driven.
/// A buffer sized by `search.max_length` is allocated at the driven context instead (a deliberate
/// difference, docs/onnx-genai.md H12: GroupQueryAttention reads positions below `seqlens_k + 1`
/// only, so the length past the context changes no number the graph computes).
pub(super) fn shared_length(
    cfg: &GenaiConfig,
    fixed: Option<usize>,
    ctx: usize,
) -> Result<Option<usize>> {
    match fixed {
        Some(s) if s < ctx => Err(Error::Io {
            path: cfg.path.clone(),
            detail: format!(
                "the graph's past inputs are a fixed shared buffer of {s} positions, shorter than the context of {ctx} asked; pass --max-ctx {s} or less"
            ),
        }),
        Some(s) => Ok(Some(s)),
        None if cfg.share_buffer && cfg.window.is_none() => Ok(Some(ctx)),
        None => Ok(None),
    }
}

/// How the description names the cache the device keeps.
pub(super) fn kv_format(dtype: &str, shared: Option<usize>, positions: bool) -> String {
    let buffers = match shared {
        Some(s) => format!("one shared past/present buffer [1, H, {s}, D] per K/V written in place at the request's length"),
        None => "separate past [1, H, S, D] and present [1, H, S + new, D]".into(),
    };
    format!(
        "{buffers}, {dtype}, {}; shown as [kv_heads, max_ctx, head_dim] fp16",
        if positions {
            "position_ids fed"
        } else {
            "positions implied by attention_mask (no position_ids input)"
        }
    )
}

/// The folder must be an export of `model`: every size GenAI reads from genai_config.json equals
/// the reference's, so a wrong pairing (or a lying config) is one line before anything is sized
/// from it.
pub(super) fn check_pairing(cfg: &GenaiConfig, model: &Model) -> Result<()> {
    let m = model.config();
    let (rows, hidden) = model.embedding_dims();
    let pairs = [
        ("vocab_size", cfg.vocab_size, rows),
        ("hidden_size", cfg.hidden_size, hidden),
        ("num_hidden_layers", cfg.n_layers, m.n_layers),
        ("num_attention_heads", cfg.n_heads, m.n_heads),
        ("num_key_value_heads", cfg.n_kv_heads, m.n_kv_heads),
        ("head_size", cfg.head_size, m.head_dim),
    ];
    match pairs.iter().find(|(_, a, b)| a != b) {
        None => Ok(()),
        Some((key, a, b)) => Err(Error::Io {
            path: cfg.path.clone(),
            detail: format!(
                "{key} {a} but the reference model {} has {b}; pass the --model this folder was exported from",
                model.source().display()
            ),
        }),
    }
}

/// The uint8 cache's per-layer scales from `kv_quant.json` (scripts/export-onnx.py writes it
/// next to the graph, whose QuantizeLinear / DequantizeLinear nodes hold the same numbers). GenAI
/// itself only moves bytes; kvprobe needs the scales to show the states as fp16.
pub(super) fn kv_scales(dir: &std::path::Path, layers: usize) -> Result<Vec<f32>> {
    let path = dir.join("kv_quant.json");
    let bad = |detail: String| Error::Io {
        path: path.clone(),
        detail,
    };
    let text = std::fs::read_to_string(&path).map_err(|e| {
        bad(format!("cannot read it ({e}); a uint8 windowed folder needs the cache scales (scripts/export-onnx.py --kv-dtype uint8 writes them)"))
    })?;
    let v: serde_json::Value =
        serde_json::from_str(&text).map_err(|e| bad(format!("not valid JSON ({e})")))?;
    let scales: Vec<f32> = v["scales"]
        .as_array()
        .map(|a| {
            a.iter()
                .flat_map(|kv| {
                    kv.as_array()
                        .map(|p| {
                            p.iter()
                                .filter_map(|x| x.as_f64())
                                .map(|x| x as f32)
                                .collect::<Vec<_>>()
                        })
                        .unwrap_or_default()
                })
                .collect()
        })
        .unwrap_or_default();
    if scales.len() != 2 * layers || scales.iter().any(|s| !(s.is_finite() && *s > 0.0)) {
        return Err(bad(format!(
            "`scales` must be {layers} pairs [k, v] of positive numbers; re-export the folder"
        )));
    }
    Ok(scales)
}

/// The execution providers genai_config.json declares (`decoder.session_options.
/// provider_options`, the CPU excepted) against the one this run uses: GenAI runs the model on
/// the declared one, so running it elsewhere without a word would report another stack's
/// numbers as the model's. Without `--ep`, a folder declaring another provider is refused; with
/// `--ep` naming another one, the run says so (a warning in every output).
pub(super) fn declared_provider(
    cfg: &GenaiConfig,
    ep: super::Ep,
    ep_given: bool,
) -> Result<Option<String>> {
    let declared: Vec<&str> = cfg
        .provider_options
        .iter()
        .map(|(name, _)| name.as_str())
        .filter(|n| !n.eq_ignore_ascii_case("cpu"))
        .collect();
    let runs_declared = declared
        .iter()
        .any(|d| ep.config_names().iter().any(|n| n.eq_ignore_ascii_case(d)));
    if declared.is_empty() || runs_declared {
        return Ok(None);
    }
    let names = declared.join(", ");
    if !ep_given {
        let runs_here = |d: &&&str| super::Ep::parse(d).is_ok_and(|e| e != super::Ep::Cpu);
        let fix = match declared.iter().find(runs_here) {
            Some(d) => format!("pass --ep {} to run it there, or", d.to_ascii_lowercase()),
            None => format!(
                "kvprobe has no --ep for {names} (it runs {}); pass",
                super::Ep::CHOICES
            ),
        };
        return Err(Error::Io {
            path: cfg.path.clone(),
            detail: format!(
                "decoder.session_options.provider_options declares the {names} execution provider, where GenAI runs this model, and kvprobe would run it on ONNX Runtime's CPU EP; {fix} --ep cpu to run it on the CPU knowingly (every output then says so)"
            ),
        });
    }
    Ok(Some(format!(
        "substitute execution provider: {} declares {names} (decoder.session_options.provider_options), this run used ONNX Runtime's {} EP (--ep {}): the numbers are that provider's, not {names}'s",
        cfg.path.display(),
        ep.ort_name(),
        ep.name()
    )))
}

/// `--fault`: each fault acts on its own convention (`win-*` the windowed cache, `dec-*` the
/// default decoder), and dec-layer-swap needs a second layer.
pub(super) fn check_faults(cfg: &GenaiConfig, opts: &OnnxOptions) -> Result<()> {
    if let Some(f) = opts
        .faults
        .iter()
        .find(|f| f.windowed() != cfg.window.is_some())
    {
        return Err(Error::BadOption {
            flag: "--fault".into(),
            detail: if f.windowed() {
                format!(
                    "{} is GenAI's default decoder; the win-* faults of this family act on the windowed cache (a folder exported with --window)",
                    opts.dir.display()
                )
            } else {
                format!(
                    "{} is a windowed folder; the dec-* faults act on GenAI's default decoder (a folder exported without --window, or the model builder's)",
                    opts.dir.display()
                )
            },
        });
    }
    if opts.faults.contains(&HostFault::LayerSwap) && cfg.n_layers < 2 {
        return Err(Error::BadOption {
            flag: "--fault dec-layer-swap".into(),
            detail: format!(
                "{} has one layer: no second layer to bind",
                opts.dir.display()
            ),
        });
    }
    Ok(())
}

/// ONNX Runtime refused to create a session on `model`. A file that is not an ONNX model, or a
/// model whose external data is missing or short, is the folder's (exit 2, the file named);
/// a well-formed graph whose data is all there that ONNX Runtime still refuses (a node whose
/// attributes disagree with its inputs: issue 35's KV head count baked into a builder export)
/// is the export's failure, the device's: exit 3, ONNX Runtime's message naming the node.
pub(super) fn load_failure(model: &std::path::Path, e: &ort::Error) -> Error {
    use ort::error::ErrorCode;
    let file = |detail: String| Error::Io {
        path: model.to_path_buf(),
        detail: crate::error::one_line(&detail),
    };
    if matches!(
        e.code(),
        ErrorCode::InvalidProtobuf | ErrorCode::NoSuchFile | ErrorCode::NoModel
    ) {
        return file(format!("ONNX Runtime cannot open it: {e}"));
    }
    let data =
        kvprobe_reference::onnx_proto::OnnxGraph::read(model).and_then(|g| g.check_external_data());
    match data {
        Ok(()) => {}
        Err(kvprobe_reference::Error::Format { path, detail }) => {
            return Error::Io { path, detail };
        }
        Err(bad) => return file(bad.to_string()),
    }
    Error::ByDevice {
        device: "onnx-genai".into(),
        step: "session creation (ONNX Runtime loading the graph, its files all present)".into(),
        cause: Box::new(Error::Device(crate::error::one_line(&format!(
            "ONNX Runtime refused the graph {}: {e}",
            model.display()
        )))),
    }
}
