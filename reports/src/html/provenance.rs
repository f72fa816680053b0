//! The run record: what was run, on what model and device, with which prompt, how long.

use super::{fold, html_text, kv_table, table};
use crate::text::{html_visible, num, shell_join};
use kvprobe_schema::Results;

fn code(s: &str) -> String {
    format!("<code>{}</code>", html_visible(s))
}

fn opt_code(s: &Option<String>) -> String {
    s.as_deref().map(code).unwrap_or_else(|| "—".into())
}

/// Device lines: the HEF (path and sha256) or the emulator manifest in full.
fn device(r: &Results) -> String {
    let p = &r.provenance;
    let mut pairs = vec![("backend", html_visible(&p.backend))];
    for (what, version) in &p.versions {
        pairs.push((what.as_str(), html_visible(version)));
    }
    if p.hef_path.is_some() || p.hef_sha256.is_some() {
        pairs.push(("HEF path", opt_code(&p.hef_path)));
        pairs.push(("HEF sha256", opt_code(&p.hef_sha256)));
    }
    pairs.push((
        "geometry",
        format!(
            "cache length L = {}, prefill rows P = {}",
            p.cache_len, p.prefill_len
        ),
    ));
    if let Some(m) = &p.sim_manifest {
        let faults = if m.faults.is_empty() {
            "none".to_string()
        } else {
            m.faults
                .iter()
                .map(|f| html_visible(f))
                .collect::<Vec<_>>()
                .join(", ")
        };
        pairs.push(("emulated faults", faults));
        let json = serde_json::to_string_pretty(m).unwrap_or_default();
        pairs.push((
            "emulator manifest",
            format!(
                "<details><summary>manifest (JSON)</summary><pre>{}</pre></details>",
                html_text(&json)
            ),
        ));
    }
    kv_table(&pairs)
}

pub fn section(r: &Results) -> String {
    let p = &r.provenance;
    let mut s = String::from("<section id=\"provenance\"><h2>Provenance</h2>\n");
    s.push_str("<h3>Command</h3>\n");
    s.push_str(&format!(
        "<pre>{}</pre>\n",
        html_visible(&shell_join(&p.command))
    ));
    s.push_str(&kv_table(&[
        ("kvprobe version", html_visible(&p.kvprobe_version)),
        ("git hash", opt_code(&p.git_hash)),
        ("results schema", r.schema_version.to_string()),
        ("host", html_visible(&p.host)),
    ]));
    s.push_str("<h3>Model</h3>\n");
    s.push_str(&kv_table(&[
        ("path", code(&p.model_path)),
        ("sha256", code(&p.model_sha256)),
        ("architecture", html_visible(&p.model_architecture)),
    ]));
    s.push_str("<h3>Device</h3>\n");
    s.push_str(&device(r));
    s.push_str("<h3>Prompt</h3>\n");
    s.push_str(&format!("<pre>{}</pre>\n", html_text(&p.prompt)));
    let rows: Vec<_> = p
        .prompt_ids
        .iter()
        .enumerate()
        .map(|(i, id)| {
            let t = p
                .prompt_tokens
                .get(i)
                .map(|t| format!("<code class=\"tok\">{}</code>", html_visible(t)))
                .unwrap_or_default();
            (vec![i.to_string(), id.to_string(), t], None)
        })
        .collect();
    s.push_str(&fold(
        "prompt ids and token texts",
        &table(&["position", "id", "token text"], &rows),
        rows.len(),
    ));
    if !p.timings.is_empty() {
        s.push_str("<h3>Timings</h3>\n");
        let rows: Vec<_> = p
            .timings
            .iter()
            .map(|t| {
                (
                    vec![html_visible(&t.what), format!("{} s", num(t.seconds, 3))],
                    None,
                )
            })
            .collect();
        s.push_str(&table(&["what", "wall time"], &rows));
    }
    s.push_str("</section>\n");
    s
}

/// `name value, …` of the runtime versions, `—` when the run recorded none.
pub(crate) fn versions_line(v: &std::collections::BTreeMap<String, String>) -> String {
    if v.is_empty() {
        return "—".into();
    }
    v.iter()
        .map(|(k, x)| format!("{k} {x}"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// Short provenance for the compare page's side-by-side columns.
pub fn brief(r: &Results) -> String {
    let p = &r.provenance;
    let mut pairs = vec![
        (
            "command",
            format!("<code>{}</code>", html_visible(&shell_join(&p.command))),
        ),
        (
            "kvprobe",
            format!(
                "{} {}",
                html_visible(&p.kvprobe_version),
                p.git_hash.as_deref().map(html_visible).unwrap_or_default()
            ),
        ),
        ("model", code(&p.model_path)),
        ("model sha256", code(&p.model_sha256)),
        ("backend", html_visible(&p.backend)),
        ("versions", html_visible(&versions_line(&p.versions))),
        (
            "geometry",
            format!("L = {}, P = {}", p.cache_len, p.prefill_len),
        ),
    ];
    if p.hef_path.is_some() {
        pairs.push(("HEF", opt_code(&p.hef_path)));
        pairs.push(("HEF sha256", opt_code(&p.hef_sha256)));
    }
    if let Some(m) = &p.sim_manifest {
        let faults = m.faults.iter().map(|f| html_visible(f)).collect::<Vec<_>>();
        pairs.push((
            "emulated faults",
            if faults.is_empty() {
                "none".into()
            } else {
                faults.join(", ")
            },
        ));
    }
    pairs.push(("prompt", format!("<pre>{}</pre>", html_text(&p.prompt))));
    kv_table(&pairs)
}
