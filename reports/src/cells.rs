//! Cells the probe sections share: logit comparisons (HTML and CSV), cache names, yes/no,
//! percentages, prompt tokens, and a chart looked up by file name.

use kvprobe_schema::{CacheKind, LogitComparison};

use crate::html::inline_svg;
use crate::section::Chart;
use crate::text::{html_visible, num};

pub(crate) fn tok(tokens: &[String], i: usize) -> String {
    match tokens.get(i) {
        Some(t) => format!("<code class=\"tok\">{}</code>", html_visible(t)),
        None => String::new(),
    }
}

pub(crate) fn yes(b: bool) -> String {
    if b { "yes" } else { "no" }.to_string()
}

pub(crate) fn cmp_cells(c: &LogitComparison) -> Vec<String> {
    vec![
        num(c.cosine, 4),
        num(c.kl, 4),
        c.device_top1.to_string(),
        c.reference_top1.to_string(),
        yes(c.top1_match),
    ]
}

/// An id with its readable piece, when the finding carries one.
pub(crate) fn id_text(id: u32, texts: &std::collections::BTreeMap<u32, String>) -> String {
    match texts.get(&id) {
        Some(t) => format!("{id} <code class=\"tok\">{}</code>", html_visible(t)),
        None => id.to_string(),
    }
}

/// [`cmp_cells`] with the top-1 ids' text.
pub(crate) fn cmp_cells_texts(
    c: &LogitComparison,
    texts: &std::collections::BTreeMap<u32, String>,
) -> Vec<String> {
    let mut cells = cmp_cells(c);
    cells[2] = id_text(c.device_top1, texts);
    cells[3] = id_text(c.reference_top1, texts);
    cells
}

const CMP_HEAD: [&str; 5] = [
    "cosine",
    "KL (nats)",
    "device top-1",
    "reference top-1",
    "top-1 match",
];

/// Table headers: `first`, then the comparison's.
pub(crate) fn with_cmp<'a>(first: &[&'a str]) -> Vec<&'a str> {
    first.iter().copied().chain(CMP_HEAD).collect()
}

/// The inlined chart `name` of this run, or nothing when it was not drawn.
pub(crate) fn chart(charts: &[Chart], name: &str, label: &str) -> String {
    charts
        .iter()
        .find(|(n, _)| *n == name)
        .map(|(_, svg)| inline_svg(svg, label))
        .unwrap_or_default()
}

pub(crate) fn pct(x: f64) -> String {
    if x.is_finite() {
        format!("{:.1} %", x * 100.0)
    } else {
        num(x, 3)
    }
}

/// CSV header of a comparison's columns.
pub(crate) const CMP_HEADER: &str = "cosine,kl,device_top1,reference_top1,top1_match";

/// A comparison's CSV cells (floats in shortest round-trip form).
pub(crate) fn cmp_csv(c: &LogitComparison) -> String {
    format!(
        "{},{},{},{},{}",
        c.cosine, c.kl, c.device_top1, c.reference_top1, c.top1_match
    )
}

/// An optional CSV cell: empty when absent.
pub(crate) fn opt<T: std::fmt::Display>(v: Option<T>) -> String {
    v.map(|x| x.to_string()).unwrap_or_default()
}

pub fn kind_name(k: Option<CacheKind>) -> &'static str {
    match k {
        Some(CacheKind::K) => "K",
        Some(CacheKind::V) => "V",
        None => "",
    }
}

/// A heatmap row label for a cache edge: `cache 3 L1 V`.
pub(crate) fn cache_label(id: u32, layer: Option<usize>, kind: Option<CacheKind>) -> String {
    let mut s = format!("cache {id}");
    if let Some(l) = layer {
        s.push_str(&format!(" L{l}"));
    }
    let k = kind_name(kind);
    if !k.is_empty() {
        s.push(' ');
        s.push_str(k);
    }
    s
}

/// A CSV cell with six decimals; empty when not finite.
pub(crate) fn csv6(v: f64) -> String {
    if v.is_finite() {
        format!("{v:.6}")
    } else {
        String::new()
    }
}
