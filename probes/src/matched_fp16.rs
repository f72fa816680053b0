//! The fp16 arithmetic a device declares (issue 36), as the precision-matched reference computes
//! it: the reference's [`Arithmetic`], fp16 weights, and the words results.json carries.

use std::sync::Arc;

use kvprobe_reference::arith::Sites;
use kvprobe_reference::{Arithmetic, Fp16, Model, NormStatistic, Overflow, OverflowAt};
use kvprobe_schema::{DeclaredArithmetic, DeclaredNorm};

use crate::Result;

/// The reference's arithmetic for what the device declares; a rounded site the reference does
/// not know is refused (one line naming it).
pub fn arithmetic_of(a: &DeclaredArithmetic) -> Result<Arithmetic> {
    Ok(match a {
        DeclaredArithmetic::Float32 => Arithmetic::F32,
        DeclaredArithmetic::Fp16 {
            saturate_at,
            norm,
            rounded,
            norm_reads_f32_sum,
            rope_tables_fp16,
            fp16_sums,
        } => Arithmetic::Fp16(Fp16 {
            overflow: saturate_at.map_or(Overflow::Infinite, Overflow::Saturate),
            norm: match norm {
                DeclaredNorm::Squares => NormStatistic::Squares,
                DeclaredNorm::MaxScaled => NormStatistic::MaxScaled,
                DeclaredNorm::Fused => NormStatistic::Fused,
                DeclaredNorm::MaxDivided => NormStatistic::MaxDivided,
            },
            sites: rounded
                .as_deref()
                .map(Sites::of)
                .transpose()
                .map_err(|site| {
                    crate::Error::Device(format!(
                        "it declares fp16 at `{site}`, a site the precision-matched reference does not compute"
                    ))
                })?,
            skip_sum_f32: *norm_reads_f32_sum,
            rope_tables_fp16: *rope_tables_fp16,
            fp16_sums: *fp16_sums,
        }),
    })
}

/// The arithmetic, the weights (the checkpoint's rounded to fp16 when the device declares fp16
/// and no weights of its own) and `said` extended with what that adds.
pub(crate) fn declared(
    a: &DeclaredArithmetic,
    model: &Model,
    weights: Option<Arc<Model>>,
    said: String,
) -> Result<(Arithmetic, Option<Arc<Model>>, String)> {
    let arithmetic = arithmetic_of(a)?;
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
    let rounded = match a {
        DeclaredArithmetic::Fp16 {
            rounded: Some(sites),
            ..
        } => format!("fp16 only at {}", sites.join(", ")),
        _ => "op outputs rounded".to_string(),
    };
    let mut habits = String::new();
    if f.skip_sum_f32 {
        habits.push_str(", norms after a residual add read its float32 sum");
    }
    if f.rope_tables_fp16 {
        habits.push_str(", fp16 RoPE tables");
    }
    let accumulation = if f.fp16_sums {
        "f32 accumulation in products, fp16 in norm means and softmax sums"
    } else {
        "f32 accumulation"
    };
    said.push_str(&format!(
        ", fp16 arithmetic inside the graph ({rounded}, {accumulation}, {}, norm statistic {:?}{habits})",
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
            arithmetic_of(&DeclaredArithmetic::Fp16 {
                saturate_at: Some(131_008.0),
                norm: DeclaredNorm::Squares,
                rounded: None,
                norm_reads_f32_sum: false,
                rope_tables_fp16: false,
                fp16_sums: false,
            })
            .unwrap(),
            Arithmetic::Fp16(Fp16::every_op(
                Overflow::Saturate(131_008.0),
                NormStatistic::Squares
            ))
        );
        let ort = |sites: &[&str]| DeclaredArithmetic::Fp16 {
            saturate_at: None,
            norm: DeclaredNorm::Fused,
            rounded: Some(sites.iter().map(|s| s.to_string()).collect()),
            norm_reads_f32_sum: true,
            rope_tables_fp16: true,
            fp16_sums: false,
        };
        let Ok(Arithmetic::Fp16(f)) = arithmetic_of(&ort(&["norm output", "logits"])) else {
            panic!("fp16")
        };
        let sites = f.sites.unwrap();
        assert!(sites.holds("logits") && sites.holds("norm output") && !sites.holds("q_proj"));
        assert!(f.skip_sum_f32 && f.rope_tables_fp16);
        let e = arithmetic_of(&ort(&["logits", "cosine"])).unwrap_err();
        assert!(e.to_string().contains("`cosine`"), "{e}");
    }
}
