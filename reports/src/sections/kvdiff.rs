//! `kvdiff`: the device's K/V cache against the reference per layer × KV head × position; K and
//! V heatmaps (layer × position) after the last comparison point and the first divergent layer.
//! Arrays, CSV and heatmaps are pure functions of the finding.

use std::fmt::Write as _;
use std::path::Path;

use kvprobe_schema::{CacheKind, KvdiffFinding, Results};
use ndarray::Array2;

use crate::cells::{chart, csv6, yes};
use crate::charts::heatmap::{self, Heatmap, Scale};
use crate::charts::pooled_note;
use crate::error::{Error, Result};
use crate::html::{fold, kv_table, table};
use crate::npy::write_npy;
use crate::section::{Chart, ProbeBlock, ProbeSection};
use crate::text::{html, num};

pub const KVDIFF_K_NPY: &str = "kvdiff_k.npy";
pub const KVDIFF_V_NPY: &str = "kvdiff_v.npy";
pub const KVDIFF_K_SVG: &str = "kvdiff_k.svg";
pub const KVDIFF_V_SVG: &str = "kvdiff_v.svg";

pub struct Kvdiff;

impl ProbeSection for Kvdiff {
    fn tables(&self, r: &Results) -> Vec<(String, String)> {
        match &r.probes.kvdiff {
            Some(f) => vec![("kvdiff.csv".to_string(), kvdiff_csv(f))],
            None => Vec::new(),
        }
    }

    fn array_files(&self, r: &Results) -> Vec<String> {
        match r.probes.kvdiff {
            Some(_) => vec![KVDIFF_K_NPY.to_string(), KVDIFF_V_NPY.to_string()],
            None => Vec::new(),
        }
    }

    fn write_arrays(&self, r: &Results, dir: &Path) -> Result<()> {
        if let Some(f) = &r.probes.kvdiff {
            write_npy(&dir.join(KVDIFF_K_NPY), &map_array("kvdiff_k", &f.k_map)?)?;
            write_npy(&dir.join(KVDIFF_V_NPY), &map_array("kvdiff_v", &f.v_map)?)?;
        }
        Ok(())
    }

    fn reserved_prefixes(&self) -> &'static [&'static str] {
        &["kvdiff"]
    }

    fn charts(&self, r: &Results) -> Result<Vec<Chart>> {
        match &r.probes.kvdiff {
            Some(f) => Ok(vec![
                (KVDIFF_K_SVG, kvdiff_chart(f, CacheKind::K)?),
                (KVDIFF_V_SVG, kvdiff_chart(f, CacheKind::V)?),
            ]),
            None => Ok(Vec::new()),
        }
    }

    fn block(&self, r: &Results, charts: &[Chart]) -> Option<ProbeBlock> {
        let f = r.probes.kvdiff.as_ref()?;
        let rows: Vec<_> = f
            .steps
            .iter()
            .map(|st| {
                let worst = |m: &[Vec<f64>]| m.iter().flatten().fold(0.0, |a: f64, &b| a.max(b));
                (
                    vec![
                        st.step.to_string(),
                        st.positions.to_string(),
                        num(worst(&st.k_rel_l2), 4),
                        num(worst(&st.v_rel_l2), 4),
                        st.first_divergent.as_ref().map_or("none".into(), |d| {
                            format!("layer {} head {} {}", d.layer, d.kv_head, kind(d.kind))
                        }),
                    ],
                    Some(st.first_divergent.is_none()),
                )
            })
            .collect();
        let mut pairs = vec![
            ("cache source", html(&f.source)),
            ("writer layout", html(&f.layout)),
            ("precision band", html(&f.precision)),
            (
                "first divergent layer",
                f.first_divergent.as_ref().map_or(
                    "none: every layer and head stays inside its band".into(),
                    |d| {
                        format!(
                            "layer {}, KV head {}, {} (step {}, position {}; {} positions outside)",
                            d.layer,
                            d.kv_head,
                            kind(d.kind),
                            d.step,
                            d.position,
                            d.positions_outside
                        )
                    },
                ),
            ),
        ];
        if let Some(rot) = &f.first_layer_rotation {
            pairs.push((
                "first layer's K as a rotation of its RoPE pairs",
                format!(
                    "{} (K rel L2 {} → {} rotated, V {}, band {})",
                    yes(rot.explained),
                    num(rot.k_rel_l2, 4),
                    num(rot.rotated_rel_l2, 4),
                    num(rot.v_rel_l2, 4),
                    num(rot.band, 4)
                ),
            ));
        }
        Some(ProbeBlock {
            id: "kvdiff",
            title: "KV diff: the device's cache against the reference, per layer",
            summary: kv_table(&pairs),
            chart: format!(
                "{}{}",
                chart(charts, KVDIFF_K_SVG, "K relative L2 per layer and position"),
                chart(charts, KVDIFF_V_SVG, "V relative L2 per layer and position")
            ),
            detail: fold(
                "per comparison point",
                &table(
                    &[
                        "step",
                        "positions",
                        "max K rel L2",
                        "max V rel L2",
                        "first divergent",
                    ],
                    &rows,
                ),
                rows.len(),
            ),
        })
    }

    fn summary(&self, r: &Results) -> String {
        r.probes
            .kvdiff
            .as_ref()
            .map(|f| format!("{}\n", f.evidence()))
            .unwrap_or_default()
    }
}

fn kind(k: CacheKind) -> &'static str {
    match k {
        CacheKind::K => "K",
        CacheKind::V => "V",
    }
}

/// `[layers, positions]`; NaN where the position is not in the cache (stored as −1).
pub fn map_array(name: &str, m: &[Vec<f64>]) -> Result<Array2<f32>> {
    let cols = m.first().map_or(0, Vec::len);
    if m.iter().any(|r| r.len() != cols) {
        return Err(Error::BadArray {
            name: name.into(),
            reason: format!("rows of {name} differ in length; the finding is malformed"),
        });
    }
    let data = m
        .iter()
        .flatten()
        .map(|&x| if x < 0.0 { f32::NAN } else { x as f32 })
        .collect();
    Array2::from_shape_vec((m.len(), cols), data).map_err(|e| Error::BadArray {
        name: name.into(),
        reason: e.to_string(),
    })
}

pub fn kvdiff_csv(f: &KvdiffFinding) -> String {
    let mut s = String::from("step,layer,kv_head,kind,max_rel_l2,min_cosine\n");
    for st in &f.steps {
        for (kind, rel, cos) in [
            ("K", &st.k_rel_l2, &st.k_cosine),
            ("V", &st.v_rel_l2, &st.v_cosine),
        ] {
            for (layer, heads) in rel.iter().enumerate() {
                for (h, x) in heads.iter().enumerate() {
                    let c = cos.get(layer).and_then(|r| r.get(h)).copied();
                    let _ = writeln!(
                        s,
                        "{},{layer},{h},{kind},{},{}",
                        st.step,
                        csv6(*x),
                        c.map_or(String::new(), csv6)
                    );
                }
            }
        }
    }
    s
}

pub fn kvdiff_chart(f: &KvdiffFinding, k: CacheKind) -> Result<String> {
    let (name, m) = match k {
        CacheKind::K => ("kvdiff_k", &f.k_map),
        CacheKind::V => ("kvdiff_v", &f.v_map),
    };
    let a = map_array(name, m)?;
    let values: Vec<Vec<f64>> = a
        .outer_iter()
        .map(|r| r.iter().map(|&x| (x as f64).min(1.0)).collect())
        .collect();
    let marked = f.outside_map.clone();
    let mut notes = vec![format!(
        "shade = largest relative L2 over KV heads against the f32 reference after the last comparison point (clipped at 1); outlined = some head outside the precision band. {}",
        f.evidence()
    )];
    pooled_note(&mut notes, a.nrows(), a.ncols());
    heatmap::render(&Heatmap {
        title: format!("kvdiff: {} cache, layer × position", kind(k)),
        notes,
        marked: if marked.len() == values.len() {
            marked
        } else {
            values.iter().map(|r| vec![false; r.len()]).collect()
        },
        values,
        mark_label: Some("outside the band".into()),
        row_labels: (0..a.nrows()).map(|l| format!("layer {l}")).collect(),
        col_labels: (0..a.ncols()).map(|p| p.to_string()).collect(),
        row_class: None,
        x_title: "position".into(),
        y_title: "layer".into(),
        scale: Scale::Fraction,
        scale_label: "relative L2 vs f32".into(),
        nan_label: "not in the cache".into(),
        square: false,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missing_positions_become_nan_and_ragged_maps_are_refused() {
        let a = map_array("k", &[vec![0.5, -1.0], vec![0.25, 0.0]]).expect("rectangular");
        assert_eq!(a[[0, 0]], 0.5);
        assert!(a[[0, 1]].is_nan());
        assert_eq!(a[[1, 0]], 0.25);
        assert!(map_array("k", &[vec![0.5], vec![]]).is_err());
    }
}
