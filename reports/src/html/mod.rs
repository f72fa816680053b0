//! report.html and compare.html: self-contained pages (inline CSS and SVG, no script, no URL).
//!
//! Everything model- or user-derived goes through `text::html*` before it lands in markup.

pub mod page;
pub mod provenance;
pub mod style;

use crate::text::{html, html_visible};
use kvprobe_schema::{Results, Verdict};

/// A table whose cells are already-escaped HTML fragments.
pub(crate) fn table(headers: &[&str], rows: &[(Vec<String>, Option<bool>)]) -> String {
    let mut s = String::from("<table><thead><tr>");
    for h in headers {
        s.push_str(&format!("<th>{}</th>", html(h)));
    }
    s.push_str("</tr></thead><tbody>\n");
    for (cells, ok) in rows {
        let class = match ok {
            Some(true) => " class=\"ok\"",
            Some(false) => " class=\"fail\"",
            None => "",
        };
        s.push_str(&format!("<tr{class}>"));
        for c in cells {
            s.push_str(&format!("<td>{c}</td>"));
        }
        s.push_str("</tr>\n");
    }
    s.push_str("</tbody></table>\n");
    s
}

/// Key/value table; values are already-escaped HTML fragments.
pub(crate) fn kv_table(pairs: &[(&str, String)]) -> String {
    let mut s = String::from("<table><tbody>\n");
    for (k, v) in pairs {
        s.push_str(&format!("<tr><th>{}</th><td>{v}</td></tr>\n", html(k)));
    }
    s.push_str("</tbody></table>\n");
    s
}

/// Multi-line model text for a `<pre>`: newlines and tabs kept, other control characters spelled.
pub(crate) fn html_text(s: &str) -> String {
    s.split('\n')
        .map(|line| {
            line.split('\t')
                .map(html_visible)
                .collect::<Vec<_>>()
                .join("\t")
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// Long tables fold away (a `<details>` works without JavaScript).
pub(crate) fn fold(summary: &str, body: &str, rows: usize) -> String {
    // Short tables stay open; longer ones fold so the charts of later probes stay near the top.
    let open = if rows <= 12 { " open" } else { "" };
    format!(
        "<details{open}><summary>{} ({rows} rows)</summary>\n{body}</details>\n",
        html(summary)
    )
}

/// An SVG for inlining: the namespace attribute is implied inside HTML, and dropping it keeps
/// the page free of any URL (issue 5: no external reference of any kind).
pub(crate) fn inline_svg(svg: &str, label: &str) -> String {
    let body = svg.replacen(" xmlns=\"http://www.w3.org/2000/svg\"", "", 1);
    let body = body.replacen(
        "<svg ",
        &format!("<svg role=\"img\" aria-label=\"{}\" ", html(label)),
        1,
    );
    format!("<figure class=\"chart\">\n{body}</figure>\n")
}

pub(crate) fn banner_class(r: &Results) -> &'static str {
    match r.verdict {
        Some(Verdict::Healthy) => "good",
        Some(Verdict::Unknown) => "warn",
        Some(_) => "bad",
        None if r.incomplete.is_some() => "warn",
        None => "info",
    }
}

/// Plain-words line under the verdict name.
pub(crate) fn verdict_meaning(v: Verdict) -> &'static str {
    match v {
        Verdict::Healthy => "the device matches the reference through the KV-cache path",
        Verdict::PrefillGraph => "the prefill graph itself computes wrong logits",
        Verdict::TbtGraph => {
            "the token-by-token graph computes wrong logits even without the cache"
        }
        Verdict::CacheLayoutMismatch => "the cache reader and writer disagree on the memory layout",
        Verdict::CacheTruncation => "cache entries lose part of their bytes",
        Verdict::MaskConvention => "the tbt graph expects a different attention-mask convention",
        Verdict::CacheOffset => "the cache offset puts tokens in the wrong slots",
        Verdict::CacheQuantization => "writer and reader quantise the cache differently",
        Verdict::PositionMismatch => "the positional input is off by a constant",
        Verdict::KvBinding => "the K and V caches are bound crosswise",
        Verdict::NumericOverflow => "fp16 values overflow to inf/NaN inside the graph",
        Verdict::StaleCache => "state from a previous request changes the next one",
        Verdict::CapacityOverflow => {
            "input past a declared limit came back as output instead of an error"
        }
        Verdict::Nondeterministic => "the same request gives different results run to run",
        Verdict::Unknown => "a fault was seen but no rule explains it",
    }
}

pub(crate) fn banner(r: &Results, heading: Option<&str>) -> String {
    let mut s = format!("<div class=\"banner {}\">", banner_class(r));
    if let Some(h) = heading {
        s.push_str(&format!("<div class=\"meta\">{}</div>", html(h)));
    }
    match r.verdict {
        Some(v) => {
            s.push_str(&format!(
                "<div class=\"verdict\">Verdict: {}</div><div class=\"meta\">{}",
                html(v.name()),
                html(verdict_meaning(v))
            ));
            if let Some(c) = r.confidence {
                s.push_str(&format!(" · confidence {}", crate::text::num(c, 2)));
            }
            s.push_str("</div>");
            let head = crate::summary::Head::of(r);
            if let Some(rule) = &head.rule {
                s.push_str(&format!(
                    "<div class=\"meta\">Cause (rule <code>{}</code>): {}</div>",
                    html(rule),
                    crate::text::html_visible(&head.decisive.join(" · "))
                ));
            }
            if let Some(c) = &head.command {
                s.push_str(&format!(
                    "<div class=\"meta\">Reproducer: <code>{}</code></div>",
                    crate::text::html_visible(c)
                ));
            }
            if let Some(l) = &head.replay {
                s.push_str(&format!(
                    "<div class=\"meta\">{}</div>",
                    crate::text::html_visible(l)
                ));
            }
            if !r.also.is_empty() {
                let also: Vec<&str> = r.also.iter().map(|v| v.name()).collect();
                s.push_str(&format!(
                    "<div class=\"meta\">Also found: {}</div>",
                    html(&also.join(", "))
                ));
            }
            if let Some(st) = r.stage {
                s.push_str(&format!(
                    "<div class=\"meta\">Pipeline stage (stale, causality, splits): {}</div>",
                    html(st.name())
                ));
            }
        }
        None if r.incomplete.is_some() => s.push_str(
            "<div class=\"verdict\">Verdict: incomplete</div><div class=\"meta\">partial results: the device failed before a verdict; the evidence below is what ran before the failure</div>",
        ),
        None => s.push_str(&format!(
            "<div class=\"verdict\">Probe: {}</div><div class=\"meta\">a single probe ran; no diagnosis was made</div>",
            crate::text::html_visible(&r.command)
        )),
    }
    s.push_str("</div>\n");
    s
}

pub(crate) fn evidence(r: &Results) -> String {
    let mut s = String::new();
    if !r.evidence.is_empty() {
        s.push_str("<ul class=\"evidence\">\n");
        for e in &r.evidence {
            s.push_str(&format!("<li>{}</li>\n", crate::text::html_visible(e)));
        }
        s.push_str("</ul>\n");
    }
    if !r.warnings.is_empty() {
        s.push_str("<h3>Warnings</h3><ul class=\"warnings\">\n");
        for w in &r.warnings {
            s.push_str(&format!("<li>{}</li>\n", crate::text::html_visible(w)));
        }
        s.push_str("</ul>\n");
    }
    s
}
