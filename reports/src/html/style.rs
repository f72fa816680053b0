//! The page's only stylesheet, inlined: system fonts, no external resources (issue 5).

pub const CSS: &str = r#"
:root { color-scheme: light; }
body { font-family: system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; margin: 0 auto; max-width: 1320px; padding: 16px 24px 48px; color: #222; background: #fff; line-height: 1.4; }
h1 { font-size: 1.5em; margin: 0.2em 0 0.6em; }
h2 { font-size: 1.25em; border-bottom: 2px solid #ddd; padding-bottom: 4px; margin-top: 2em; }
h3 { font-size: 1.05em; margin: 1.2em 0 0.4em; }
.banner { border-radius: 8px; padding: 14px 20px; margin: 8px 0 16px; border: 2px solid; }
.banner .verdict { font-size: 1.9em; font-weight: 700; letter-spacing: 0.01em; }
.banner .meta { font-size: 1.05em; margin-top: 4px; }
.banner.good { background: #e6f4ea; border-color: #1a7f37; color: #0f4d22; }
.banner.bad { background: #fdecea; border-color: #c62828; color: #7f1414; }
.banner.warn { background: #fff4e0; border-color: #d48806; color: #6b4300; }
.banner.info { background: #e8f0fb; border-color: #3066be; color: #15396f; }
ul.evidence li { margin: 2px 0; }
ul.warnings li { color: #6b4300; }
table { border-collapse: collapse; margin: 6px 0 12px; font-size: 0.92em; }
th, td { border: 1px solid #d0d0d0; padding: 3px 8px; text-align: left; vertical-align: top; }
th { background: #f3f3f3; }
td { overflow-wrap: anywhere; }
td.num { text-align: right; font-variant-numeric: tabular-nums; }
tr.fail td { background: #fdecea; }
tr.ok td.flag { color: #1a7f37; }
tr.fail td.flag { color: #c62828; font-weight: 600; }
code, pre { font-family: ui-monospace, "DejaVu Sans Mono", Menlo, Consolas, monospace; font-size: 0.92em; }
code.tok { background: #f3f3f3; border: 1px solid #e0e0e0; border-radius: 3px; padding: 0 3px; white-space: pre; }
pre { background: #f7f7f7; border: 1px solid #e3e3e3; padding: 8px 10px; overflow-x: auto; white-space: pre-wrap; word-break: break-all; }
figure.chart { margin: 8px 0 16px; overflow-x: auto; }
figure.chart svg { max-width: 100%; height: auto; display: block; }
details > summary { cursor: pointer; color: #3066be; margin: 4px 0; }
nav.toc a { margin-right: 12px; }
.pair { display: grid; grid-template-columns: 1fr 1fr; gap: 20px; align-items: start; }
.pair > div { min-width: 0; }
.pair h3 { margin-top: 0.4em; }
.muted { color: #777; }
body.wide { max-width: 2700px; }
footer { margin-top: 3em; color: #777; font-size: 0.85em; }
"#;
