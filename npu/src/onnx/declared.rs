//! What an ONNX folder's graph declares it computes, for the precision-matched reference: the
//! weights (a QDQ export's grids, issue 35), the arithmetic inside the graph (HTP's fp16, issue
//! 36), and what the device computes that the reference does not (HTP's integer QDQ kernels).

use super::config::GenaiConfig;
use super::OnnxOptions;
use crate::Result;
use kvprobe_schema::DeviceDescription;

/// Fills `desc.weights` and `desc.arithmetic` from the folder's graph (a static folder's prefill
/// graph: a QDQ export's grids differ from the float model.onnx) and returns what the device
/// computes that the matched reference does not (`Device::unmodelled_precision`).
pub(super) fn precision(
    desc: &mut DeviceDescription,
    cfg: &GenaiConfig,
    opts: &OnnxOptions,
    fp16_kv: bool,
) -> Result<Option<String>> {
    let graph_file = match super::static_graphs::StaticGraphs::load(
        &opts.dir,
        cfg.window.as_ref().map(|w| w.window_size),
        cfg.context_length,
    )? {
        Some(g) => g.prefill,
        None => opts.dir.join(&cfg.filename),
    };
    let qdq = kvprobe_reference::onnx_qdq_model::declared(&graph_file)?;
    let is_qdq = qdq.is_some();
    if let Some(summary) = qdq {
        desc.weights = kvprobe_schema::DeclaredWeights::Blocks {
            model: graph_file.clone(),
            summary,
        };
    }
    let qnn = match opts.ep {
        super::Ep::Qnn => Some(super::qnn::QnnOptions::resolve(
            &super::qnn::plugin_dir(),
            &opts.ep_options,
        )?),
        _ => None,
    };
    let htp_fp16 = qnn.as_ref().is_some_and(|q| q.htp_fp16());
    desc.arithmetic = super::graph_ops::declared_arithmetic(&graph_file, htp_fp16, fp16_kv)?;
    // HTP runs a QDQ graph in its own integer kernels (requantisation between ops, its
    // fixed-point softmax), not as the reference fake-quantises in float32: the same SmolLM2 QDQ
    // prefill on HTP and on the CPU EP differ by rows down to 0.958, and healthy HTP prefill rows
    // sit at 2.2-2.8 of the jitter band (docs/qnn.md), so its controls are judged by their
    // floors, as OpenVINO's bf16 is
    let htp = qnn.is_some_and(|q| q.backend == super::qnn::QnnBackend::Htp);
    Ok((is_qdq && htp).then(|| {
        "QNN HTP computes the QDQ graph in its integer kernels (requantisation between ops, a \
         fixed-point softmax), which the reference's float32 fake-quantisation does not"
            .to_string()
    }))
}
