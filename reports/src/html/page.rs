//! report.html (one run) and compare.html (before / after).

use super::style::CSS;
use super::{banner, evidence, provenance};
use crate::section::{Chart, ProbeBlock};
use crate::sections::blocks;
use crate::text::{html, html_visible};
use kvprobe_schema::Results;

fn head(title: &str, body_class: &str) -> String {
    format!(
        "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n\
         <meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n\
         <title>{}</title>\n<style>{CSS}</style>\n</head>\n<body class=\"{body_class}\">\n",
        html(title)
    )
}

const FOOT: &str = "</body>\n</html>\n";

fn title_of(r: &Results) -> String {
    match r.verdict {
        Some(v) => format!("kvprobe {}: {}", r.command, v.name()),
        None if r.incomplete.is_some() => format!("kvprobe {}: incomplete (partial)", r.command),
        None => format!("kvprobe {}", r.command),
    }
}

/// Files of the folder that belong to this report (what a reader can open next).
fn artefacts(r: &Results, charts: &[Chart]) -> String {
    let mut files = vec!["results.json".to_string()];
    files.extend(crate::sections::tables(r).into_iter().map(|(n, _)| n));
    files.extend(crate::sections::array_files(r));
    files.extend(charts.iter().map(|(n, _)| n.to_string()));
    let items: Vec<String> = files
        .iter()
        .map(|f| format!("<code>{}</code>", html(f)))
        .collect();
    format!(
        "<section id=\"artefacts\"><h2>Artefacts in this folder</h2>\n<p>{}</p>\n\
         <p class=\"muted\">Further <code>.npy</code> arrays of the run (such as the compared logits) sit beside these; \
         <code>kvprobe report DIR</code> re-renders this page from results.json.</p></section>\n",
        items.join(" · ")
    )
}

pub fn report(r: &Results, charts: &[Chart]) -> String {
    let blocks = blocks(r, charts);
    let mut s = head(&title_of(r), "run");
    s.push_str(&format!(
        "<h1>kvprobe report — <code>{}</code></h1>\n",
        html_visible(&r.command)
    ));
    s.push_str(&banner(r, None));
    s.push_str(&evidence(r));
    if !blocks.is_empty() {
        s.push_str("<nav class=\"toc\">Probes: ");
        for b in &blocks {
            s.push_str(&format!("<a href=\"#{}\">{}</a>", b.id, b.id));
        }
        s.push_str("<a href=\"#provenance\">provenance</a></nav>\n");
    }
    for b in &blocks {
        s.push_str(&section(b));
    }
    s.push_str(&provenance::section(r));
    s.push_str(&artefacts(r, charts));
    s.push_str(FOOT);
    s
}

fn section(b: &ProbeBlock) -> String {
    format!(
        "<section id=\"{}\"><h2>{}</h2>\n{}{}{}</section>\n",
        b.id,
        html(b.title),
        b.summary,
        b.chart,
        b.detail
    )
}

/// Before / after on one page: verdicts, probe tables side by side, charts paired.
pub fn compare(
    before: &Results,
    before_charts: &[Chart],
    after: &Results,
    after_charts: &[Chart],
) -> String {
    let bb = blocks(before, before_charts);
    let ab = blocks(after, after_charts);
    let verdict = |r: &Results| r.verdict.map(|v| v.name()).unwrap_or("no diagnosis");
    // Wide body: paired heatmaps keep their natural size on a wide screen.
    let mut s = head(
        &format!(
            "kvprobe before/after: {} → {}",
            verdict(before),
            verdict(after)
        ),
        "wide",
    );
    s.push_str("<h1>kvprobe — before the fix / after the fix</h1>\n");
    s.push_str("<div class=\"pair\">\n<div>\n");
    s.push_str(&banner(before, Some("Before the fix")));
    s.push_str(&evidence(before));
    s.push_str("</div>\n<div>\n");
    s.push_str(&banner(after, Some("After the fix")));
    s.push_str(&evidence(after));
    s.push_str("</div>\n</div>\n");

    // The single-run page's order (both lists follow the section registry); a probe that ran on
    // one side only still shows, in its place. Sorting by a pinned list of the older sections
    // put every newer one (stale, causality, splits, ...) above prefill.
    let ids: Vec<&str> = crate::sections::SECTIONS
        .iter()
        .filter_map(|sec| {
            sec.block(before, before_charts)
                .or_else(|| sec.block(after, after_charts))
        })
        .map(|b| b.id)
        .collect();
    for id in ids {
        let find = |v: &[ProbeBlock]| v.iter().position(|b| b.id == id);
        let (bi, ai) = (find(&bb), find(&ab));
        let title = bi
            .map(|i| bb[i].title)
            .or(ai.map(|i| ab[i].title))
            .unwrap_or(id);
        s.push_str(&format!(
            "<section id=\"{id}\"><h2>{}</h2>\n<div class=\"pair\">\n",
            html(title)
        ));
        for (label, blocks, idx) in [("Before", &bb, bi), ("After", &ab, ai)] {
            s.push_str(&format!("<div><h3>{label}</h3>\n"));
            match idx {
                Some(i) => {
                    let b = &blocks[i];
                    s.push_str(&b.summary);
                    s.push_str(&b.chart);
                    s.push_str(&b.detail);
                }
                None => s.push_str("<p class=\"muted\">did not run</p>\n"),
            }
            s.push_str("</div>\n");
        }
        s.push_str("</div></section>\n");
    }
    s.push_str("<section id=\"provenance\"><h2>Provenance</h2>\n<div class=\"pair\">\n<div><h3>Before</h3>\n");
    s.push_str(&provenance::brief(before));
    s.push_str("</div>\n<div><h3>After</h3>\n");
    s.push_str(&provenance::brief(after));
    s.push_str("</div>\n</div></section>\n");
    s.push_str(FOOT);
    s
}
