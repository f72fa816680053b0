//! The fault grammar every family shares, `NAME[=VALUE][@SCOPE]` with SCOPE a comma list of
//! `prefill`, `tbt`, `k`, `v`, `layer=N`, and the shape of a family's fault table
//! ([`FaultDecl`]). A family parses the value into its own typed fault; the name lookup, the
//! scope, its defaults and the verdict a diagnosis must reach come from the table, so the README,
//! the sweep and the fault-matrix tests read one declaration.

use kvprobe_schema::{CacheKind, GroupKind, Verdict};

use crate::{Error, Result};

/// One `--fault` argument split by the grammar (name and value trimmed), not yet typed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FaultText<'a> {
    /// Exactly as given.
    pub text: &'a str,
    pub name: &'a str,
    pub value: Option<&'a str>,
    pub scope: Option<&'a str>,
}

impl<'a> FaultText<'a> {
    pub fn split(text: &'a str) -> FaultText<'a> {
        let (body, scope) = match text.split_once('@') {
            Some((b, s)) => (b, Some(s)),
            None => (text, None),
        };
        let (name, value) = match body.split_once('=') {
            Some((n, v)) => (n.trim(), Some(v.trim())),
            None => (body.trim(), None),
        };
        FaultText {
            text,
            name,
            value,
            scope,
        }
    }

    /// A `BadFault` error about this fault.
    pub fn bad(&self, detail: impl Into<String>) -> Error {
        Error::BadFault {
            fault: self.text.to_string(),
            detail: detail.into(),
        }
    }

    /// Refuses a scope: the fault applies to every layer.
    pub fn unscoped(&self) -> Result<()> {
        match self.scope {
            Some(s) => Err(Error::FaultScope {
                fault: self.name.to_string(),
                scope: s.to_string(),
                allowed: "no scope (the fault applies to every layer)".into(),
            }),
            None => Ok(()),
        }
    }

    /// Refuses a value and a scope: the fault is its name alone.
    pub fn bare(&self) -> Result<()> {
        if let Some(v) = self.value {
            return Err(self.bad(format!("takes no value (got `{v}`); write `{}`", self.name)));
        }
        self.unscoped()
    }
}

/// More faults than any table has rows times scopes: a longer list is a damaged manifest, and
/// the conflict check below is quadratic in it.
pub const MAX_FAULTS: usize = 256;

/// One parsed fault as the conflict check sees it: its text, its typed value and its scope
/// (`None`: everywhere).
pub type FaultItem<'a, K> = (&'a str, &'a K, Option<&'a Scope>);

/// Refuse two faults of one name whose values differ where their scopes meet: which one the
/// emulator applies would depend on their order, so the run would not say what it tested.
pub fn refuse_conflicts<K: PartialEq>(faults: &[FaultItem<'_, K>]) -> Result<()> {
    if faults.len() > MAX_FAULTS {
        return Err(Error::BadOption {
            flag: "--fault".into(),
            detail: format!(
                "{} faults, more than the {MAX_FAULTS} a run takes; give each fault once",
                faults.len()
            ),
        });
    }
    for (i, &(text_a, kind_a, scope_a)) in faults.iter().enumerate() {
        let name_a = FaultText::split(text_a).name;
        for &(text_b, kind_b, scope_b) in &faults[i + 1..] {
            let b = FaultText::split(text_b);
            let meet = match (scope_a, scope_b) {
                (Some(x), Some(y)) => x.meets(y),
                _ => true,
            };
            if b.name == name_a && kind_a != kind_b && meet {
                return Err(b.bad(format!(
                    "conflicts with `{text_a}` (the same fault with another value where both apply); keep one of them"
                )));
            }
        }
    }
    Ok(())
}

/// What a scope item restricts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ScopeKind {
    /// `prefill`, `tbt`
    Group,
    /// `k`, `v`
    Kv,
    /// `layer=N`
    Layer,
}

impl ScopeKind {
    /// How an error message and the README list the scopes a fault takes.
    pub fn names(s: &[ScopeKind]) -> String {
        if s.is_empty() {
            return "no scope".into();
        }
        s.iter()
            .map(|k| match k {
                ScopeKind::Group => "prefill, tbt",
                ScopeKind::Kv => "k, v",
                ScopeKind::Layer => "layer=N",
            })
            .collect::<Vec<_>>()
            .join(", ")
    }
}

/// Where a fault applies; `None` = everywhere the fault can apply.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Scope {
    pub groups: Option<Vec<GroupKind>>,
    pub kinds: Option<Vec<CacheKind>>,
    pub layers: Option<Vec<usize>>,
}

impl Scope {
    /// Whether some group and edge is in both scopes (`None` holds everything).
    pub fn meets(&self, other: &Scope) -> bool {
        fn meet<T: PartialEq>(a: &Option<Vec<T>>, b: &Option<Vec<T>>) -> bool {
            match (a, b) {
                (Some(a), Some(b)) => a.iter().any(|x| b.contains(x)),
                _ => true,
            }
        }
        meet(&self.groups, &other.groups)
            && meet(&self.kinds, &other.kinds)
            && meet(&self.layers, &other.layers)
    }

    pub fn has_group(&self, g: GroupKind) -> bool {
        self.groups.as_ref().is_none_or(|v| v.contains(&g))
    }
    pub fn has_edge(&self, kind: CacheKind, layer: usize) -> bool {
        self.kinds.as_ref().is_none_or(|v| v.contains(&kind))
            && self.layers.as_ref().is_none_or(|v| v.contains(&layer))
    }

    /// The `@SCOPE` part of `f` under the scopes `decl` allows, with the declared default groups.
    pub fn parse(f: &FaultText, decl: &FaultDecl) -> Result<Scope> {
        let mut scope = Scope::default();
        if let Some(st) = f.scope {
            for item in st.split(',').map(str::trim) {
                scope.add(f, item, decl.scopes)?;
            }
        }
        if scope.groups.is_none() && !decl.default_groups.is_empty() {
            scope.groups = Some(decl.default_groups.to_vec());
        }
        Ok(scope)
    }

    fn add(&mut self, f: &FaultText, item: &str, allowed: &[ScopeKind]) -> Result<()> {
        let (kind, group, kv, layer) = match item {
            "prefill" => (ScopeKind::Group, Some(GroupKind::Prefill), None, None),
            "tbt" => (ScopeKind::Group, Some(GroupKind::Tbt), None, None),
            "k" => (ScopeKind::Kv, None, Some(CacheKind::K), None),
            "v" => (ScopeKind::Kv, None, Some(CacheKind::V), None),
            _ if item.starts_with("layer=") => {
                let n = item["layer=".len()..]
                    .parse()
                    .map_err(|_| f.bad(format!("`{item}`: layer must be a number")))?;
                (ScopeKind::Layer, None, None, Some(n))
            }
            _ => {
                return Err(f.bad(format!(
                    "unknown scope `{item}`; scopes are prefill, tbt, k, v, layer=N"
                )))
            }
        };
        if !allowed.contains(&kind) {
            return Err(Error::FaultScope {
                fault: f.text.to_string(),
                scope: item.to_string(),
                allowed: ScopeKind::names(allowed),
            });
        }
        if let Some(g) = group {
            self.groups.get_or_insert_with(Vec::new).push(g);
        }
        if let Some(k) = kv {
            self.kinds.get_or_insert_with(Vec::new).push(k);
        }
        if let Some(l) = layer {
            self.layers.get_or_insert_with(Vec::new).push(l);
        }
        Ok(())
    }
}

/// The verdict `diagnose` must reach for a fault.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Expected {
    Always(Verdict),
    /// A graph fault: `prefill` when it reaches the prefill group (the earlier stage), else `tbt`.
    ByStage {
        prefill: Verdict,
        tbt: Verdict,
    },
}

/// The values a fault accepts, as the README writes them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Values {
    /// Takes no value.
    None,
    /// Exactly one of these words.
    OneOf(&'static [&'static str]),
    /// A number, written as this placeholder (`F`, `N`, `+N` / `-N`).
    Number(&'static str),
    /// Optionally a number (placeholder), with a documented default.
    OptionalNumber(&'static str),
}

/// How a randomised sweep draws a case of this fault (the sweep's generator follows it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SweepValue {
    None,
    /// This value.
    Fixed(&'static str),
    /// One of these (`f8cr` only where the entry size is a multiple of 8 bytes).
    OneOf(&'static [&'static str]),
    /// A factor away from 1 (e.g. 0.5-2).
    Factor,
    /// ±1 to ±3.
    SmallSigned,
    /// A fraction (1/4, 1/2, 3/4) of the entry size in bytes.
    EntryFraction,
    /// The RoPE convention the graph does not use (rope models only).
    OtherRopeConvention,
    /// A width below the head dimension: head_dim/4 or head_dim/8, at least 2 (rope models
    /// only; head_dim/2 would tile a table that already repeats at that width).
    HeadFraction,
    /// A rope-scaling factor of 2, 4 or 8 (rope models only; 8 is Llama 3's).
    RopeFactor,
    /// Not drawn by the randomised sweep (yet): its verdict is verified only where its own
    /// end-to-end test runs it.
    NotSampled,
}

/// One row of a family's fault table.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct FaultDecl {
    pub name: &'static str,
    pub values: Values,
    pub scopes: &'static [ScopeKind],
    /// Groups it applies to without a group scope; empty = every group.
    pub default_groups: &'static [GroupKind],
    /// The bug class, one line for the README.
    pub bug_class: &'static str,
    pub expected: Expected,
    pub sweep: SweepValue,
}

impl FaultDecl {
    /// A fault with no value and no scope that always expects `verdict` (the host-side faults of
    /// the ANE, ONNX and OpenVINO families), not drawn by the randomised sweep.
    pub const fn plain(name: &'static str, bug_class: &'static str, verdict: Verdict) -> Self {
        FaultDecl {
            name,
            values: Values::None,
            scopes: &[],
            default_groups: &[],
            bug_class,
            expected: Expected::Always(verdict),
            sweep: SweepValue::None,
        }
    }

    /// The verdict for this fault under `scope` (as parsed, defaults applied).
    pub fn expected(&self, scope: &Scope) -> Verdict {
        match self.expected {
            Expected::Always(v) => v,
            Expected::ByStage { prefill, tbt } => {
                if scope.has_group(GroupKind::Prefill) {
                    prefill
                } else {
                    tbt
                }
            }
        }
    }

    /// How the README writes it: `name`, `name=F`, `name[=GAIN]`, `name=a` / `=b`.
    pub fn usage(&self) -> String {
        let n = self.name;
        match self.values {
            Values::None => format!("`{n}`"),
            Values::Number(p) => format!("`{n}={p}`"),
            Values::OptionalNumber(p) => format!("`{n}[={p}]`"),
            Values::OneOf(words) => words
                .iter()
                .enumerate()
                .map(|(i, w)| {
                    if i == 0 {
                        format!("`{n}={w}`")
                    } else {
                        format!("`={w}`")
                    }
                })
                .collect::<Vec<_>>()
                .join(" / "),
        }
    }

    /// Whether `value` selects this row (rows that share a name differ by value).
    fn takes(&self, value: Option<&str>) -> bool {
        match (self.values, value) {
            (Values::OneOf(words), Some(v)) => words.contains(&v),
            _ => true,
        }
    }
}

/// One family's faults, in the order error messages and the README list them.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct FaultTable {
    pub faults: &'static [FaultDecl],
}

impl FaultTable {
    /// A family without faults (hardware, skeletons).
    pub const NONE: FaultTable = FaultTable { faults: &[] };
}

impl FaultTable {
    /// The fault names, each once, in table order (error messages list them).
    pub fn known(&self) -> String {
        let mut names: Vec<&str> = Vec::new();
        for d in self.faults {
            if !names.contains(&d.name) {
                names.push(d.name);
            }
        }
        names.join(", ")
    }

    pub fn has(&self, name: &str) -> bool {
        self.faults.iter().any(|d| d.name == name)
    }

    /// The row for `f`: by name, then by value where rows share a name.
    pub fn decl(&self, f: &FaultText) -> Result<&'static FaultDecl> {
        let mut rows = self.faults.iter().filter(|d| d.name == f.name).peekable();
        let first = rows.peek().copied().ok_or_else(|| Error::UnknownFault {
            name: f.name.to_string(),
            known: self.known(),
        })?;
        Ok(rows.find(|d| d.takes(f.value)).unwrap_or(first))
    }

    /// The README's table of these faults (markdown, one row per declaration).
    pub fn markdown(&self) -> String {
        let mut out = String::from("| fault | scope | bug class | verdict |\n|---|---|---|---|\n");
        for d in self.faults {
            let scope = match (d.scopes.is_empty(), d.default_groups) {
                (true, _) => "—".to_string(),
                (false, []) => ScopeKind::names(d.scopes),
                (false, g) => format!(
                    "{} (default {})",
                    ScopeKind::names(d.scopes),
                    g.iter().map(|g| g.suffix()).collect::<Vec<_>>().join(", ")
                ),
            };
            let verdict = match d.expected {
                Expected::Always(v) => format!("`{}`", v.name()),
                Expected::ByStage { prefill, tbt } => format!(
                    "`{}` where it reaches prefill, else `{}`",
                    prefill.name(),
                    tbt.name()
                ),
            };
            out.push_str(&format!(
                "| {} | {scope} | {} | {verdict} |\n",
                d.usage(),
                d.bug_class
            ));
        }
        out
    }

    /// The verdict `diagnose` must reach for the fault `text` (scope defaults applied).
    pub fn expected(&self, text: &str) -> Result<Verdict> {
        let f = FaultText::split(text);
        let decl = self.decl(&f)?;
        Ok(decl.expected(&Scope::parse(&f, decl)?))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const T: FaultTable = FaultTable {
        faults: &[
            FaultDecl {
                name: "m",
                values: Values::OneOf(&["a"]),
                scopes: &[ScopeKind::Group],
                default_groups: &[GroupKind::Tbt],
                bug_class: "",
                expected: Expected::ByStage {
                    prefill: Verdict::PrefillGraph,
                    tbt: Verdict::TbtGraph,
                },
                sweep: SweepValue::None,
            },
            FaultDecl {
                name: "m",
                values: Values::OneOf(&["b"]),
                scopes: &[ScopeKind::Kv, ScopeKind::Layer],
                default_groups: &[],
                bug_class: "",
                expected: Expected::Always(Verdict::KvBinding),
                sweep: SweepValue::None,
            },
        ],
    };

    #[test]
    fn rows_sharing_a_name_differ_by_value_and_scope_defaults_apply() {
        assert_eq!(T.known(), "m");
        assert_eq!(T.expected("m=a").unwrap(), Verdict::TbtGraph);
        assert_eq!(
            T.expected("m=a@prefill,tbt").unwrap(),
            Verdict::PrefillGraph
        );
        assert_eq!(T.expected("m=b@k,layer=3").unwrap(), Verdict::KvBinding);
        assert!(matches!(
            T.expected("m=b@tbt"),
            Err(Error::FaultScope { .. })
        ));
        assert!(matches!(T.expected("n"), Err(Error::UnknownFault { .. })));
        let f = FaultText::split(" m = b @v");
        assert_eq!((f.name, f.value, f.scope), ("m", Some("b"), Some("v")));
    }
}
