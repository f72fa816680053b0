//! The emulator's fault catalogue: `NAME[=VALUE][@SCOPE]`, SCOPE a comma list of `prefill`, `tbt`,
//! `k`, `v`, `layer=N`. Every fault is device-side (compiled graph or runtime), never the driver.
//!
//! | fault | effect | scopes |
//! |---|---|---|
//! | `tbt-read-layout=feature-major\|f8cr` | tbt decodes its cache reads in that layout (F9) | k, v, layer |
//! | `prefill-write-layout=feature-major\|f8cr` | prefill encodes its cache writes in that layout | k, v, layer |
//! | `…-layout=head-major\|tile16` | test layouts (`Layout::TEST`) the named `layout` probe never tries: one KV head's `[token][dim]` block after another; tokens in tiles of 16, each tile feature-major | k, v, layer |
//! | `mask=left-valid` | the graph applies past-column `c` of the mask to key `W−1−c` (it expects valid entries on the left); default tbt | prefill, tbt |
//! | `mask=repeat` | the graph widens head 0's row element-wise (AABB) instead of tiling (F4): head `h` key `k` uses host head 0 column `(h·KV + k) / NH`; default both | prefill, tbt |
//! | `offset=after-run` | `update_cache_offset` takes effect after the next run instead of before | — |
//! | `tbt-cache-scale=F` | tbt cache inputs declared and dequantised with F × the writer's scale | k, v, layer |
//! | `tbt-position=±N` | the tbt graph's positional input is wired N positions off | — |
//! | `kv-swap` | tbt binds the K ring as V and the V ring as K (reads and writes) | layer |
//! | `gqa-repeat=block` | KV heads expanded ABAB instead of HF repeat_kv AABB; default tbt | prefill, tbt |
//! | `tbt-attn-scale=F` / `prefill-attn-scale=F` | attention scores × F in that group | — |
//! | `softmax=shared-across-heads` | one softmax over all heads' scores of a row (F11); default both | prefill, tbt |
//! | `rope-theta=sign-folded\|plain` | the shipped `rope_theta_data.bin` is written in that sign convention while the graph keeps the emulator's (`--sim-rope-theta`); must differ from it | — |
//! | `truncate-entry=N` | cache writers keep only the first N bytes of every entry (rest zero); default all writers | prefill, tbt, k, v, layer |

use kvprobe_schema::{CacheKind, GroupKind, Layout};

use crate::rope::RopeTheta;
use crate::{Error, Result};

pub const KNOWN: &[&str] = &[
    "tbt-read-layout",
    "prefill-write-layout",
    "mask",
    "offset",
    "tbt-cache-scale",
    "tbt-position",
    "kv-swap",
    "gqa-repeat",
    "tbt-attn-scale",
    "prefill-attn-scale",
    "softmax",
    "truncate-entry",
    "rope-theta",
];

#[derive(Debug, Clone, PartialEq)]
pub enum FaultKind {
    TbtReadLayout(Layout),
    PrefillWriteLayout(Layout),
    MaskLeftValid,
    MaskRepeat,
    OffsetAfterRun,
    TbtCacheScale(f32),
    TbtPosition(i64),
    KvSwap,
    GqaBlock,
    TbtAttnScale(f32),
    PrefillAttnScale(f32),
    SharedSoftmax,
    TruncateEntry(usize),
    /// The theta table's convention (the graph keeps `SimOptions::rope_theta`).
    RopeTheta(RopeTheta),
}

/// Where a fault applies; `None` = everywhere the fault can apply.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Scope {
    pub groups: Option<Vec<GroupKind>>,
    pub kinds: Option<Vec<CacheKind>>,
    pub layers: Option<Vec<usize>>,
}

impl Scope {
    pub fn has_group(&self, g: GroupKind) -> bool {
        self.groups.as_ref().is_none_or(|v| v.contains(&g))
    }
    pub fn has_edge(&self, kind: CacheKind, layer: usize) -> bool {
        self.kinds.as_ref().is_none_or(|v| v.contains(&kind))
            && self.layers.as_ref().is_none_or(|v| v.contains(&layer))
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct Fault {
    /// Exactly as given.
    pub text: String,
    pub kind: FaultKind,
    pub scope: Scope,
}

#[derive(Clone, Copy, PartialEq)]
enum ScopeKind {
    Group,
    Kv,
    Layer,
}

fn allowed_scopes(kind: &FaultKind) -> &'static [ScopeKind] {
    use FaultKind::*;
    use ScopeKind::*;
    match kind {
        TbtReadLayout(_) | PrefillWriteLayout(_) | TbtCacheScale(_) => &[Kv, Layer],
        MaskLeftValid | MaskRepeat | GqaBlock | SharedSoftmax => &[Group],
        KvSwap => &[Layer],
        TruncateEntry(_) => &[Group, Kv, Layer],
        OffsetAfterRun | TbtPosition(_) | TbtAttnScale(_) | PrefillAttnScale(_) | RopeTheta(_) => {
            &[]
        }
    }
}

fn scope_names(s: &[ScopeKind]) -> String {
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

fn bad(fault: &str, detail: impl Into<String>) -> Error {
    Error::BadFault {
        fault: fault.to_string(),
        detail: detail.into(),
    }
}

fn parse_factor(text: &str, v: Option<&str>) -> Result<f32> {
    let v = v.ok_or_else(|| bad(text, "needs a value, e.g. =0.5"))?;
    let f: f32 = v
        .parse()
        .map_err(|_| bad(text, format!("`{v}` is not a number")))?;
    if !f.is_finite() || f <= 0.0 {
        return Err(bad(text, "the factor must be a positive finite number"));
    }
    Ok(f)
}

fn parse_layout(text: &str, v: Option<&str>) -> Result<Layout> {
    let v = v.ok_or_else(|| bad(text, "needs a layout: =feature-major or =f8cr"))?;
    Layout::parse_any(v).ok_or_else(|| {
        bad(
            text,
            format!("unknown layout `{v}`; use feature-major, f8cr, head-major or tile16"),
        )
    })
}

/// Parse one `--fault` value. Model-dependent no-op checks happen in [`validate`].
pub fn parse(text: &str) -> Result<Fault> {
    let (body, scope_txt) = match text.split_once('@') {
        Some((b, s)) => (b, Some(s)),
        None => (text, None),
    };
    let (name, value) = match body.split_once('=') {
        Some((n, v)) => (n.trim(), Some(v.trim())),
        None => (body.trim(), None),
    };
    let want_value = |v: Option<&str>, expected: &str| -> Result<()> {
        match v {
            Some(x) if x == expected => Ok(()),
            Some(x) => Err(bad(text, format!("unknown value `{x}`; use ={expected}"))),
            None => Err(bad(text, format!("needs ={expected}"))),
        }
    };
    let no_value = |v: Option<&str>| -> Result<()> {
        match v {
            None => Ok(()),
            Some(_) => Err(bad(text, "takes no value")),
        }
    };
    let kind = match name {
        "tbt-read-layout" => FaultKind::TbtReadLayout(parse_layout(text, value)?),
        "prefill-write-layout" => FaultKind::PrefillWriteLayout(parse_layout(text, value)?),
        "mask" => match value {
            Some("left-valid") => FaultKind::MaskLeftValid,
            Some("repeat") => FaultKind::MaskRepeat,
            _ => return Err(bad(text, "use mask=left-valid or mask=repeat")),
        },
        "offset" => {
            want_value(value, "after-run")?;
            FaultKind::OffsetAfterRun
        }
        "tbt-cache-scale" => FaultKind::TbtCacheScale(parse_factor(text, value)?),
        "tbt-position" => {
            let v = value.ok_or_else(|| bad(text, "needs a signed offset, e.g. =+1 or =-2"))?;
            let n: i64 = v
                .trim_start_matches('+')
                .parse()
                .map_err(|_| bad(text, format!("`{v}` is not a whole number of positions")))?;
            FaultKind::TbtPosition(n)
        }
        "kv-swap" => {
            no_value(value)?;
            FaultKind::KvSwap
        }
        "gqa-repeat" => {
            want_value(value, "block")?;
            FaultKind::GqaBlock
        }
        "tbt-attn-scale" => FaultKind::TbtAttnScale(parse_factor(text, value)?),
        "prefill-attn-scale" => FaultKind::PrefillAttnScale(parse_factor(text, value)?),
        "softmax" => {
            want_value(value, "shared-across-heads")?;
            FaultKind::SharedSoftmax
        }
        "truncate-entry" => {
            let v = value.ok_or_else(|| bad(text, "needs a byte count, e.g. =32"))?;
            FaultKind::TruncateEntry(
                v.parse()
                    .map_err(|_| bad(text, format!("`{v}` is not a byte count")))?,
            )
        }
        "rope-theta" => FaultKind::RopeTheta(
            value
                .and_then(RopeTheta::parse)
                .ok_or_else(|| bad(text, "use rope-theta=sign-folded or rope-theta=plain"))?,
        ),
        _ if crate::ane::faults::KNOWN.contains(&name) => {
            return Err(Error::WrongDeviceFault {
                fault: name.to_string(),
                device: "--device ane-sim",
                here: "--sim",
                known: KNOWN.join(", "),
            })
        }
        _ => {
            return Err(Error::UnknownFault {
                name: name.to_string(),
                known: KNOWN.join(", "),
            })
        }
    };
    let allowed = allowed_scopes(&kind);
    let mut scope = Scope::default();
    if let Some(st) = scope_txt {
        for item in st.split(',').map(str::trim) {
            enum Item {
                Group(GroupKind),
                Kv(CacheKind),
                Layer(usize),
            }
            let it = match item {
                "prefill" => Item::Group(GroupKind::Prefill),
                "tbt" => Item::Group(GroupKind::Tbt),
                "k" => Item::Kv(CacheKind::K),
                "v" => Item::Kv(CacheKind::V),
                _ if item.starts_with("layer=") => Item::Layer(
                    item["layer=".len()..]
                        .parse()
                        .map_err(|_| bad(text, format!("`{item}`: layer must be a number")))?,
                ),
                _ => {
                    return Err(bad(
                        text,
                        format!("unknown scope `{item}`; scopes are prefill, tbt, k, v, layer=N"),
                    ))
                }
            };
            let sk = match it {
                Item::Group(_) => ScopeKind::Group,
                Item::Kv(_) => ScopeKind::Kv,
                Item::Layer(_) => ScopeKind::Layer,
            };
            if !allowed.contains(&sk) {
                return Err(Error::FaultScope {
                    fault: text.to_string(),
                    scope: item.to_string(),
                    allowed: scope_names(allowed),
                });
            }
            match it {
                Item::Group(g) => scope.groups.get_or_insert_with(Vec::new).push(g),
                Item::Kv(k) => scope.kinds.get_or_insert_with(Vec::new).push(k),
                Item::Layer(l) => scope.layers.get_or_insert_with(Vec::new).push(l),
            }
        }
    }
    // Defaults where the fault is not "everywhere" (see the table above).
    if scope.groups.is_none() && matches!(kind, FaultKind::MaskLeftValid | FaultKind::GqaBlock) {
        scope.groups = Some(vec![GroupKind::Tbt]);
    }
    Ok(Fault {
        text: text.to_string(),
        kind,
        scope,
    })
}

/// What the model/geometry looks like, for the no-op and range checks.
pub struct FaultContext {
    pub n_layers: usize,
    pub n_heads: usize,
    pub n_kv_heads: usize,
    /// `E` of the cache entries in bytes.
    pub entry_size: usize,
    /// Whether every layout fault would be a no-op on this geometry (decided by the caller).
    pub layout_noop: Box<dyn Fn(&Fault) -> bool>,
    /// The graph's RoPE convention, `None` for a model with learned positions.
    pub rope_theta: Option<RopeTheta>,
}

/// Refuse faults that change nothing here or name a layer that does not exist.
pub fn validate(f: &Fault, cx: &FaultContext) -> Result<()> {
    if let Some(ls) = &f.scope.layers {
        if let Some(&l) = ls.iter().find(|&&l| l >= cx.n_layers) {
            return Err(bad(
                &f.text,
                format!(
                    "layer={l} does not exist; the model has layers 0..{}",
                    cx.n_layers - 1
                ),
            ));
        }
    }
    let noop = |why: &str| {
        Err(Error::NoOpFault {
            fault: f.text.clone(),
            why: why.to_string(),
        })
    };
    match &f.kind {
        FaultKind::TbtReadLayout(l) | FaultKind::PrefillWriteLayout(l) => {
            if *l == Layout::TokenMajor {
                return noop("token-major is the healthy layout");
            }
            if (cx.layout_noop)(f) {
                return noop("this layout streams like token-major for these window lengths");
            }
        }
        FaultKind::TbtCacheScale(s)
        | FaultKind::TbtAttnScale(s)
        | FaultKind::PrefillAttnScale(s)
            if *s == 1.0 =>
        {
            return noop("a factor of 1.0");
        }
        FaultKind::TbtPosition(0) => return noop("an offset of 0 positions"),
        FaultKind::RopeTheta(_) if cx.rope_theta.is_none() => {
            return noop("the model has learned positions and ships no theta table");
        }
        FaultKind::RopeTheta(t) if Some(*t) == cx.rope_theta => {
            return noop(&format!(
                "the graph already uses the {} convention (--sim-rope-theta)",
                t.name()
            ));
        }
        FaultKind::GqaBlock if cx.n_kv_heads == cx.n_heads || cx.n_kv_heads == 1 => {
            return noop("block and repeat_kv orders agree when every query head has its own KV head or there is one KV head");
        }
        FaultKind::TruncateEntry(n) if *n >= cx.entry_size => {
            return noop(&format!("entries are only {} bytes", cx.entry_size));
        }
        FaultKind::SharedSoftmax | FaultKind::MaskRepeat if cx.n_heads == 1 => {
            return noop("the model has a single attention head");
        }
        _ => {}
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_names_values_scopes() {
        let f = parse("tbt-read-layout=feature-major@k,layer=2,layer=3").unwrap();
        assert_eq!(f.kind, FaultKind::TbtReadLayout(Layout::FeatureMajor));
        assert_eq!(f.scope.kinds, Some(vec![CacheKind::K]));
        assert_eq!(f.scope.layers, Some(vec![2, 3]));
        assert_eq!(
            parse("tbt-position=+2").unwrap().kind,
            FaultKind::TbtPosition(2)
        );
        assert_eq!(
            parse("tbt-position=-1").unwrap().kind,
            FaultKind::TbtPosition(-1)
        );
        assert_eq!(
            parse("softmax=shared-across-heads@tbt")
                .unwrap()
                .scope
                .groups,
            Some(vec![GroupKind::Tbt])
        );
        assert_eq!(
            parse("softmax=shared-across-heads").unwrap().scope.groups,
            None
        );
        assert_eq!(
            parse("gqa-repeat=block").unwrap().scope.groups,
            Some(vec![GroupKind::Tbt])
        );
    }

    #[test]
    fn rejects_unknown_and_bad_scopes() {
        assert!(matches!(parse("bogus"), Err(Error::UnknownFault { .. })));
        assert!(matches!(
            parse("offset=after-run@tbt"),
            Err(Error::FaultScope { .. })
        ));
        assert!(matches!(parse("kv-swap@k"), Err(Error::FaultScope { .. })));
        assert!(matches!(
            parse("tbt-read-layout=f8cr@prefill"),
            Err(Error::FaultScope { .. })
        ));
        assert!(matches!(
            parse("mask=sideways"),
            Err(Error::BadFault { .. })
        ));
        assert!(matches!(
            parse("tbt-attn-scale=abc"),
            Err(Error::BadFault { .. })
        ));
        assert!(matches!(
            parse("truncate-entry=8@layer=x"),
            Err(Error::BadFault { .. })
        ));
        let msg = parse("kv-swap@tbt").unwrap_err().to_string();
        assert!(!msg.contains('\n'));
        assert!(msg.contains("layer=N"), "{msg}");
    }
}
