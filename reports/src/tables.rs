//! CSV tables, one per probe that has rows. Plain RFC 4180; floats in shortest round-trip form.

use crate::error::Result;
use crate::fsio::write_atomic;
use crate::text::csv_text;
use kvprobe_schema::{CacheKind, ColumnMatch, LogitComparison, QuantInfo, Results};
use std::fmt::Write as _;
use std::path::Path;

const CMP_HEADER: &str = "cosine,kl,device_top1,reference_top1,top1_match";

fn cmp(c: &LogitComparison) -> String {
    format!(
        "{},{},{},{},{}",
        c.cosine, c.kl, c.device_top1, c.reference_top1, c.top1_match
    )
}

fn opt<T: std::fmt::Display>(v: Option<T>) -> String {
    v.map(|x| x.to_string()).unwrap_or_default()
}

pub fn kind_name(k: Option<CacheKind>) -> &'static str {
    match k {
        Some(CacheKind::K) => "K",
        Some(CacheKind::V) => "V",
        None => "",
    }
}

pub fn class_name(c: ColumnMatch) -> &'static str {
    match c {
        ColumnMatch::Clean => "clean",
        ColumnMatch::Mixture => "mixture",
        ColumnMatch::None => "none",
    }
}

/// (file name, contents) of every table `results` has data for, in a fixed order.
pub fn tables(results: &Results) -> Vec<(String, String)> {
    let p = &results.probes;
    let tokens = &results.provenance.prompt_tokens;
    let mut out = Vec::new();
    if let Some(f) = &p.prefill {
        let mut s = format!("position,token,{CMP_HEADER}\n");
        for r in &f.rows {
            let tok = tokens.get(r.position).map(String::as_str).unwrap_or("");
            let _ = writeln!(s, "{},{},{}", r.position, csv_text(tok), cmp(&r.comparison));
        }
        out.push(("prefill.csv".to_string(), s));
    }
    if let Some(f) = &p.greedy {
        let mut s = format!("step,position,input_token,visible_keys,{CMP_HEADER}\n");
        for r in &f.steps {
            let _ = writeln!(
                s,
                "{},{},{},{},{}",
                r.step,
                r.position,
                r.input_token,
                r.visible_keys,
                cmp(&r.comparison)
            );
        }
        out.push(("greedy.csv".to_string(), s));
    }
    if let Some(f) = &p.selfmask {
        let mut s = format!("step,position,input_token,{CMP_HEADER}\n");
        for r in &f.steps {
            let _ = writeln!(
                s,
                "{},{},{},{}",
                r.step,
                r.position,
                r.input_token,
                cmp(&r.comparison)
            );
        }
        out.push(("selfmask.csv".to_string(), s));
    }
    if let Some(f) = &p.colmap {
        let mut s =
            "entry,expected_position,best_position,best_cosine,second_cosine,class\n".to_string();
        for r in &f.rows {
            let _ = writeln!(
                s,
                "{},{},{},{},{},{}",
                r.entry,
                opt(r.expected_position),
                opt(r.best_position),
                r.best_cosine,
                r.second_cosine,
                class_name(r.class)
            );
        }
        out.push(("colmap_rows.csv".to_string(), s));
    }
    if let Some(f) = &p.ztap {
        let mut s = "source,cache_id,layer,kind,entries,width,zero_columns,empty_entries,expected_transposed_zero_columns,interpretation\n".to_string();
        for c in &f.caches {
            let _ = writeln!(
                s,
                "{},{},{},{},{},{},{},{},{},{}",
                csv_text(&f.source),
                c.cache_id,
                opt(c.layer),
                kind_name(c.kind),
                c.entries,
                c.width,
                c.zero_columns,
                c.empty_entries,
                c.expected_transposed_zero_columns,
                csv_text(&c.interpretation)
            );
        }
        out.push(("ztap.csv".to_string(), s));
    }
    if let Some(f) = &p.quant {
        let mut s =
            "cache_id,layer,kind,edge,scale,zero_point,min,max,consistent,max_scale_ratio\n"
                .to_string();
        let mut row = |id: String,
                       layer: String,
                       kind: &str,
                       edge: &str,
                       q: &Option<QuantInfo>,
                       tail: String| {
            let qs = match q {
                Some(q) => format!("{},{},{},{}", q.scale, q.zero_point, q.min, q.max),
                None => ",,,".to_string(),
            };
            let _ = writeln!(s, "{id},{layer},{kind},{edge},{qs},{tail}");
        };
        for c in &f.caches {
            let tail = format!("{},{}", c.consistent, c.max_scale_ratio);
            for (edge, q) in [
                ("prefill_input", &c.prefill_input),
                ("prefill_output", &c.prefill_output),
                ("tbt_input", &c.tbt_input),
                ("tbt_output", &c.tbt_output),
            ] {
                row(
                    c.cache_id.to_string(),
                    opt(c.layer),
                    kind_name(c.kind),
                    edge,
                    q,
                    tail.clone(),
                );
            }
        }
        row(
            String::new(),
            String::new(),
            "",
            "mask",
            &f.mask,
            ",".into(),
        );
        row(
            String::new(),
            String::new(),
            "",
            "embeddings",
            &f.embeddings,
            ",".into(),
        );
        out.push(("quant.csv".to_string(), s));
    }
    if let Some(f) = &p.maskconv {
        let mut s = format!("variant,{CMP_HEADER},reproduces\n");
        for v in &f.variants {
            let _ = writeln!(
                s,
                "{},{},{}",
                csv_text(&v.name),
                cmp(&v.comparison),
                v.reproduces
            );
        }
        out.push(("maskconv.csv".to_string(), s));
    }
    if let Some(f) = &p.positions {
        let mut s = format!("delta,{CMP_HEADER}\n");
        for pt in &f.points {
            let _ = writeln!(s, "{},{}", pt.delta, cmp(&pt.comparison));
        }
        out.push(("positions.csv".to_string(), s));
    }
    if let Some(f) = &p.layout {
        let mut s = "cache_id,layer,kind,layout,shift,score,best\n".to_string();
        for c in &f.caches {
            for sc in &c.scores {
                let best = sc.layout == c.best_layout && sc.shift == c.best_shift;
                let _ = writeln!(
                    s,
                    "{},{},{},{},{},{},{}",
                    c.cache_id,
                    opt(c.layer),
                    kind_name(c.kind),
                    sc.layout.name(),
                    sc.shift,
                    sc.score,
                    best
                );
            }
        }
        out.push(("layout.csv".to_string(), s));
    }
    if let Some(f) = &p.layout_infer {
        out.push((
            crate::layout_infer::CSV.to_string(),
            crate::layout_infer::csv(f),
        ));
    }
    if let Some(f) = &p.inject {
        let mut s = format!("rings,{CMP_HEADER},blame\n");
        for (name, c) in [
            ("device", &f.device_rings),
            ("golden", &f.golden),
            ("golden-swapped", &f.golden_swapped),
        ] {
            let _ = writeln!(s, "{name},{},{}", cmp(c), csv_text(&f.blame));
        }
        out.push(("inject.csv".to_string(), s));
    }
    if let Some(f) = &p.stale {
        out.push(("stale.csv".to_string(), crate::issue10::stale_csv(f)));
    }
    if let Some(f) = &p.causality {
        out.push((
            "causality.csv".to_string(),
            crate::issue10::causality_csv(f),
        ));
    }
    if let Some(f) = &p.splits {
        out.push(("splits.csv".to_string(), crate::issue10::splits_csv(f)));
    }
    out
}

pub fn write_tables(results: &Results, dir: &Path) -> Result<()> {
    for (name, contents) in tables(results) {
        write_atomic(&dir.join(name), contents.as_bytes())?;
    }
    Ok(())
}
