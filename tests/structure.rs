//! The codebase's shape (issue 17), checked on the source text: no library or CLI source file over
//! 600 lines, no function over 120 lines, and no import circle between the files of one crate.
//! Tests, examples, benches and `#[cfg(test)]` modules are outside the limits; the few exceptions
//! are listed in [`EXCEPTIONS`] with the reason each is kept.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

const MAX_FILE_LINES: usize = 600;
const MAX_FN_LINES: usize = 120;

/// `(path or path::fn, why)`: what is allowed past a limit, and why.
/// None today: every file and function is within the limits (issue 17).
const EXCEPTIONS: &[(&str, &str)] = &[];

/// The library and CLI source roots: `(crate, src folder)`.
const CRATES: &[(&str, &str)] = &[
    ("kvprobe", "src"),
    ("kvprobe-schema", "schema/src"),
    ("kvprobe-reference", "reference/src"),
    ("kvprobe-npu", "npu/src"),
    ("kvprobe-probes", "probes/src"),
    ("kvprobe-reports", "reports/src"),
    ("kvprobe-testkit", "testkit/src"),
];

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return;
    };
    let mut entries: Vec<PathBuf> = rd.filter_map(|e| e.ok().map(|e| e.path())).collect();
    entries.sort();
    for p in entries {
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|e| e == "rs") {
            out.push(p);
        }
    }
}

fn rel(p: &Path) -> String {
    p.strip_prefix(root())
        .unwrap_or(p)
        .to_string_lossy()
        .replace('\\', "/")
}

fn excepted(key: &str) -> bool {
    EXCEPTIONS.iter().any(|(k, _)| *k == key)
}

/// The source with comments, string and char literals blanked (same line structure), so braces
/// and `use` paths can be read off it.
fn code_only(src: &str) -> String {
    let b: Vec<char> = src.chars().collect();
    let mut out = String::with_capacity(src.len());
    let mut i = 0;
    let blank = |c: char| if c == '\n' { '\n' } else { ' ' };
    while i < b.len() {
        let c = b[i];
        let next = b.get(i + 1).copied();
        if c == '/' && next == Some('/') {
            while i < b.len() && b[i] != '\n' {
                out.push(' ');
                i += 1;
            }
        } else if c == '/' && next == Some('*') {
            let mut depth = 0;
            while i < b.len() {
                if b[i] == '/' && b.get(i + 1) == Some(&'*') {
                    depth += 1;
                    out.push_str("  ");
                    i += 2;
                } else if b[i] == '*' && b.get(i + 1) == Some(&'/') {
                    depth -= 1;
                    out.push_str("  ");
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    out.push(blank(b[i]));
                    i += 1;
                }
            }
        } else if c == 'r' && (next == Some('"') || next == Some('#')) && !ident_before(&b, i) {
            // raw string r"..." / r#"..."#
            let mut j = i + 1;
            let mut hashes = 0;
            while b.get(j) == Some(&'#') {
                hashes += 1;
                j += 1;
            }
            if b.get(j) != Some(&'"') {
                out.push(c);
                i += 1;
                continue;
            }
            out.push(' ');
            i += 1;
            while i <= j {
                out.push(' ');
                i += 1;
            }
            while i < b.len() {
                if b[i] == '"' && (1..=hashes).all(|k| b.get(i + k) == Some(&'#')) {
                    for _ in 0..=hashes {
                        out.push(' ');
                    }
                    i += hashes + 1;
                    break;
                }
                out.push(blank(b[i]));
                i += 1;
            }
        } else if c == '"' {
            out.push(' ');
            i += 1;
            while i < b.len() && b[i] != '"' {
                if b[i] == '\\' {
                    out.push(' ');
                    i += 1;
                }
                if i < b.len() {
                    out.push(blank(b[i]));
                    i += 1;
                }
            }
            out.push(' ');
            i += 1;
        } else if c == '\'' && is_char_literal(&b, i) {
            let end = char_literal_end(&b, i);
            while i <= end {
                out.push(' ');
                i += 1;
            }
        } else {
            out.push(c);
            i += 1;
        }
    }
    out
}

fn ident_before(b: &[char], i: usize) -> bool {
    i > 0 && (b[i - 1].is_alphanumeric() || b[i - 1] == '_')
}

fn is_char_literal(b: &[char], i: usize) -> bool {
    // 'x' or '\n' / '\u{..}' — not a lifetime 'a
    matches!(
        (b.get(i + 1), b.get(i + 2)),
        (Some('\\'), _) | (Some(_), Some('\''))
    )
}

fn char_literal_end(b: &[char], i: usize) -> usize {
    let mut j = i + 1;
    if b.get(j) == Some(&'\\') {
        j += 2;
    } else {
        j += 1;
    }
    while j < b.len() && b[j] != '\'' {
        j += 1;
    }
    j
}

/// Line ranges `[start, end)` of `#[cfg(test)]` modules.
fn test_modules(lines: &[&str]) -> Vec<(usize, usize)> {
    let mut out = Vec::new();
    let mut i = 0;
    while i < lines.len() {
        if lines[i].trim() == "#[cfg(test)]" {
            let start = i;
            let mut j = i + 1;
            while j < lines.len() && !lines[j].contains('{') && !lines[j].contains(';') {
                j += 1;
            }
            if j < lines.len() && lines[j].contains("mod ") && lines[j].contains('{') {
                let end = block_end(lines, j);
                out.push((start, end + 1));
                i = end + 1;
                continue;
            }
        }
        i += 1;
    }
    out
}

/// The line where the block opened on line `open` closes.
fn block_end(lines: &[&str], open: usize) -> usize {
    let mut depth = 0i64;
    let mut seen = false;
    for (k, l) in lines.iter().enumerate().skip(open) {
        for ch in l.chars() {
            match ch {
                '{' => {
                    depth += 1;
                    seen = true;
                }
                '}' => depth -= 1,
                ';' if !seen && depth == 0 => return k,
                _ => {}
            }
        }
        if seen && depth <= 0 {
            return k;
        }
    }
    lines.len().saturating_sub(1)
}

fn fn_name(line: &str) -> Option<String> {
    let t = line.trim_start();
    let mut words = t.split_whitespace().peekable();
    while let Some(w) = words.next() {
        match w {
            "pub" | "async" | "const" | "unsafe" | "extern" | "default" => continue,
            w if w.starts_with("pub(") => continue,
            w if w.starts_with('"') => continue,
            "fn" => {
                let name = words.next()?;
                let name: String = name
                    .chars()
                    .take_while(|c| c.is_alphanumeric() || *c == '_')
                    .collect();
                return (!name.is_empty()).then_some(name);
            }
            _ => return None,
        }
    }
    None
}

struct FileFacts {
    path: String,
    lines: usize,
    /// `(fn name, lines)`, outside test modules.
    fns: Vec<(String, usize)>,
}

fn file_facts(path: &Path) -> FileFacts {
    let src = std::fs::read_to_string(path).unwrap_or_default();
    let code = code_only(&src);
    let lines: Vec<&str> = code.lines().collect();
    let tests = test_modules(&lines);
    let in_tests = |k: usize| tests.iter().any(|(a, b)| k >= *a && k < *b);
    let mut fns = Vec::new();
    for (k, l) in lines.iter().enumerate() {
        if in_tests(k) {
            continue;
        }
        if let Some(name) = fn_name(l) {
            let end = block_end(&lines, k);
            fns.push((name, end + 1 - k));
        }
    }
    let test_lines: usize = tests.iter().map(|(a, b)| b - a).sum();
    FileFacts {
        path: rel(path),
        lines: src.lines().count() - test_lines,
        fns,
    }
}

fn all_facts() -> Vec<FileFacts> {
    let mut files = Vec::new();
    for (_, dir) in CRATES {
        rust_files(&root().join(dir), &mut files);
    }
    files.iter().map(|p| file_facts(p)).collect()
}

#[test]
fn no_source_file_over_600_lines() {
    let over: Vec<String> = all_facts()
        .iter()
        .filter(|f| f.lines > MAX_FILE_LINES && !excepted(&f.path))
        .map(|f| format!("{} ({} lines outside tests)", f.path, f.lines))
        .collect();
    assert!(
        over.is_empty(),
        "files over {MAX_FILE_LINES} lines:\n{}",
        over.join("\n")
    );
}

#[test]
fn no_function_over_120_lines() {
    let mut over = Vec::new();
    for f in all_facts() {
        for (name, n) in &f.fns {
            let key = format!("{}::{name}", f.path);
            if *n > MAX_FN_LINES && !excepted(&key) && !excepted(&f.path) {
                over.push(format!("{key} ({n} lines)"));
            }
        }
    }
    assert!(
        over.is_empty(),
        "functions over {MAX_FN_LINES} lines:\n{}",
        over.join("\n")
    );
}

/// Module path of a source file inside its crate: `src/a/b.rs` → `a::b`, `src/a/mod.rs` → `a`.
fn module_of(src_root: &Path, file: &Path) -> Vec<String> {
    let r = file.strip_prefix(src_root).unwrap_or(file);
    let mut parts: Vec<String> = r
        .iter()
        .map(|s| s.to_string_lossy().trim_end_matches(".rs").to_string())
        .collect();
    if matches!(
        parts.last().map(String::as_str),
        Some("mod" | "lib" | "main")
    ) {
        parts.pop();
    }
    parts
}

/// `crate::…` and `super::…` paths the code uses, as absolute module paths (longest prefix that
/// names a file of the crate). `pub use` re-exports and `mod` declarations are a module's face, not
/// a dependency, and are not counted.
fn uses(code: &str, me: &[String], modules: &BTreeSet<Vec<String>>) -> BTreeSet<Vec<String>> {
    let mut out = BTreeSet::new();
    let mut stmt = String::new();
    for line in code.lines() {
        let t = line.trim_start();
        if t.starts_with("pub use ") || t.starts_with("pub(crate) use ") {
            stmt = t.to_string();
        } else if !stmt.is_empty() {
            stmt.push_str(t);
        }
        if !stmt.is_empty() {
            if stmt.contains(';') {
                stmt.clear();
            }
            continue;
        }
        let text = t;
        for start in ["crate::", "super::"] {
            let mut from = 0;
            while let Some(pos) = text[from..].find(start) {
                let at = from + pos;
                from = at + start.len();
                if at > 0 {
                    let prev = text[..at].chars().last().unwrap_or(' ');
                    if prev.is_alphanumeric() || prev == '_' {
                        continue;
                    }
                }
                let path: String = text[at..]
                    .chars()
                    .take_while(|c| c.is_alphanumeric() || *c == '_' || *c == ':')
                    .collect();
                let segs: Vec<&str> = path.split("::").filter(|s| !s.is_empty()).collect();
                let mut abs: Vec<String> = Vec::new();
                let mut rest = &segs[..];
                if segs.first() == Some(&"crate") {
                    rest = &segs[1..];
                } else {
                    // super from a file module `a/b.rs` (module a::b) is `a`; the same from
                    // `a/b/mod.rs` (also a::b) is `a`
                    abs = me.to_vec();
                    while rest.first() == Some(&"super") {
                        abs.pop();
                        rest = &rest[1..];
                    }
                }
                for s in rest {
                    let mut next = abs.clone();
                    next.push(s.to_string());
                    if modules.contains(&next) {
                        abs = next;
                    } else {
                        break;
                    }
                }
                if abs != me {
                    out.insert(abs);
                }
            }
        }
    }
    out
}

fn cycles_in(src_root: &Path) -> Vec<Vec<String>> {
    let mut files = Vec::new();
    rust_files(src_root, &mut files);
    let modules: BTreeMap<Vec<String>, PathBuf> = files
        .iter()
        .map(|f| (module_of(src_root, f), f.clone()))
        .collect();
    let names: BTreeSet<Vec<String>> = modules.keys().cloned().collect();
    let mut edges: BTreeMap<Vec<String>, BTreeSet<Vec<String>>> = BTreeMap::new();
    for (m, f) in &modules {
        let src = std::fs::read_to_string(f).unwrap_or_default();
        let code = code_only(&src);
        let lines: Vec<&str> = code.lines().collect();
        let tests = test_modules(&lines);
        let kept: Vec<&str> = lines
            .iter()
            .enumerate()
            .filter(|(k, _)| !tests.iter().any(|(a, b)| k >= a && k < b))
            .map(|(_, l)| *l)
            .collect();
        let mut deps = uses(&kept.join("\n"), m, &names);
        // a module depends on its ancestors only through what it names; the root re-exports
        deps.retain(|d| !d.is_empty());
        edges.insert(m.clone(), deps);
    }
    tarjan(&edges)
        .into_iter()
        .filter(|c| c.len() > 1)
        .map(|c| c.iter().map(|m| rel(&modules[m])).collect::<Vec<_>>())
        .collect()
}

fn tarjan(edges: &BTreeMap<Vec<String>, BTreeSet<Vec<String>>>) -> Vec<Vec<Vec<String>>> {
    struct St<'a> {
        edges: &'a BTreeMap<Vec<String>, BTreeSet<Vec<String>>>,
        index: BTreeMap<Vec<String>, usize>,
        low: BTreeMap<Vec<String>, usize>,
        on: BTreeSet<Vec<String>>,
        stack: Vec<Vec<String>>,
        next: usize,
        out: Vec<Vec<Vec<String>>>,
    }
    fn visit(st: &mut St, v: &Vec<String>) {
        st.index.insert(v.clone(), st.next);
        st.low.insert(v.clone(), st.next);
        st.next += 1;
        st.stack.push(v.clone());
        st.on.insert(v.clone());
        let succ: Vec<Vec<String>> = st.edges.get(v).into_iter().flatten().cloned().collect();
        for w in succ {
            if !st.edges.contains_key(&w) {
                continue;
            }
            if !st.index.contains_key(&w) {
                visit(st, &w);
                let lw = st.low[&w];
                let lv = st.low.get_mut(v).expect("visited");
                *lv = (*lv).min(lw);
            } else if st.on.contains(&w) {
                let iw = st.index[&w];
                let lv = st.low.get_mut(v).expect("visited");
                *lv = (*lv).min(iw);
            }
        }
        if st.low[v] == st.index[v] {
            let mut comp = Vec::new();
            while let Some(w) = st.stack.pop() {
                st.on.remove(&w);
                let done = &w == v;
                comp.push(w);
                if done {
                    break;
                }
            }
            st.out.push(comp);
        }
    }
    let mut st = St {
        edges,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        on: BTreeSet::new(),
        stack: Vec::new(),
        next: 0,
        out: Vec::new(),
    };
    for v in edges.keys() {
        if !st.index.contains_key(v) {
            visit(&mut st, v);
        }
    }
    st.out
}

#[test]
fn no_import_circle_inside_a_crate() {
    let mut found = Vec::new();
    for (name, dir) in CRATES {
        for c in cycles_in(&root().join(dir)) {
            found.push(format!("{name}: {}", c.join(" ↔ ")));
        }
    }
    assert!(found.is_empty(), "import circles:\n{}", found.join("\n"));
}

#[test]
fn the_checks_see_what_they_check() {
    // a failing control for the checker itself: a hand-made circle and a long function are found
    let src = &std::env::temp_dir().join(format!("kvprobe-structure-{}", std::process::id()));
    std::fs::create_dir_all(src).expect("temp folder");
    std::fs::write(src.join("lib.rs"), "mod a;\nmod b;\n").expect("write");
    std::fs::write(src.join("a.rs"), "use crate::b::X;\npub struct Y;\n").expect("write");
    std::fs::write(src.join("b.rs"), "pub struct X;\nfn f(_: crate::a::Y) {}\n").expect("write");
    std::fs::write(src.join("c.rs"), "use super::a::Y;\n").expect("write");
    let c = cycles_in(src);
    assert_eq!(c.len(), 1, "{c:?}");
    assert_eq!(c[0].len(), 2, "{c:?}");
    let body: String = (0..130)
        .map(|i| format!("    let x{i} = \"}}\";\n"))
        .collect();
    let long = format!(
        "pub fn long() {{\n{body}}}\n#[cfg(test)]\nmod tests {{\n    fn t() {{\n{body}    }}\n}}\n"
    );
    std::fs::write(src.join("d.rs"), long).expect("write");
    let f = file_facts(&src.join("d.rs"));
    assert_eq!(f.fns, vec![("long".to_string(), 132)]);
    assert_eq!(f.lines, 132);
    let _ = std::fs::remove_dir_all(src);
}

#[test]
fn every_exception_is_still_needed() {
    let facts = all_facts();
    let mut stale = Vec::new();
    for (key, _) in EXCEPTIONS {
        let needed = facts.iter().any(|f| {
            (f.path == *key && f.lines > MAX_FILE_LINES)
                || f.fns.iter().any(|(name, n)| {
                    *n > MAX_FN_LINES && (format!("{}::{name}", f.path) == *key || f.path == *key)
                })
        });
        if !needed {
            stale.push(*key);
        }
    }
    assert!(
        stale.is_empty(),
        "exceptions no longer needed, remove them:\n{}",
        stale.join("\n")
    );
}
