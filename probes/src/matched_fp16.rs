//! The fp16 arithmetic a device declares (issue 36), as the precision-matched reference computes
//! it: the reference's [`Arithmetic`], fp16 weights, and the words results.json carries.

use std::sync::Arc;

use kvprobe_reference::{Arithmetic, Fp16, Model, NormStatistic, Overflow, OverflowAt};
use kvprobe_schema::{DeclaredArithmetic, DeclaredNorm};

use crate::Result;

/// The reference's arithmetic for what the device declares.
pub fn arithmetic_of(a: DeclaredArithmetic) -> Arithmetic {
    match a {
        DeclaredArithmetic::Float32 => Arithmetic::F32,
        DeclaredArithmetic::Fp16 { saturate_at, norm } => Arithmetic::Fp16(Fp16 {
            overflow: saturate_at.map_or(Overflow::Infinite, Overflow::Saturate),
            norm: match norm {
                DeclaredNorm::Squares => NormStatistic::Squares,
                DeclaredNorm::MaxScaled => NormStatistic::MaxScaled,
                DeclaredNorm::Fused => NormStatistic::Fused,
            },
        }),
    }
}

/// The arithmetic, the weights (the checkpoint's rounded to fp16 when the device declares fp16
/// and no weights of its own) and `said` extended with what that adds.
pub(crate) fn declared(
    a: DeclaredArithmetic,
    model: &Model,
    weights: Option<Arc<Model>>,
    said: String,
) -> Result<(Arithmetic, Option<Arc<Model>>, String)> {
    let arithmetic = arithmetic_of(a);
    let Arithmetic::Fp16(f) = arithmetic else {
        return Ok((arithmetic, weights, said));
    };
    let (weights, mut said) = match weights {
        None => (
            Some(Arc::new(model.with_fp16_weights()?)),
            format!("{said}, fp16 weights"),
        ),
        w => (w, said),
    };
    said.push_str(&format!(
        ", fp16 arithmetic inside the graph (op outputs rounded, f32 accumulation, {}, norm statistic {:?})",
        match f.overflow {
            Overflow::Infinite => "±inf beyond 65504".to_string(),
            Overflow::Saturate(l) => format!("saturating at ±{l}"),
        },
        f.norm
    ));
    Ok((arithmetic, weights, said))
}

/// "fp16 overflow at layer L <norm> <op>: value V" (the matched reference's first lost value).
pub fn overflow_text(o: &OverflowAt) -> String {
    let layer = o.layer.map_or("after the last layer".to_string(), |l| {
        format!("at layer {l}")
    });
    let within = o.within.map_or(String::new(), |w| format!("{w} "));
    format!(
        "fp16 overflow {layer} {within}{}: value {:.4e}",
        o.op, o.value
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_overflow_is_named_by_layer_norm_op_and_value() {
        let o = OverflowAt {
            layer: Some(3),
            within: Some("input_layernorm"),
            op: "x·x",
            value: 5.92e5,
        };
        assert_eq!(
            overflow_text(&o),
            "fp16 overflow at layer 3 input_layernorm x·x: value 5.9200e5"
        );
        assert_eq!(
            arithmetic_of(DeclaredArithmetic::Fp16 {
                saturate_at: Some(131_008.0),
                norm: DeclaredNorm::Squares
            }),
            Arithmetic::Fp16(Fp16 {
                overflow: Overflow::Saturate(131_008.0),
                norm: NormStatistic::Squares
            })
        );
    }
}
