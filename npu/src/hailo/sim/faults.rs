//! The Hailo emulator's faults: the table ([`TABLE`]: names, values, scopes, verdicts; the README
//! table is generated from it), the typed [`FaultKind`] and the no-op checks. The grammar is the
//! contract's (`contract::faults`). Every fault is device-side (compiled graph or runtime), never
//! the driver. What each one does to the emulator:
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
//! | `prefill-position=±N` | the prefill graph's positional input is wired N positions off | — |
//! | `kv-swap` | tbt binds the K ring as V and the V ring as K (reads and writes) | layer |
//! | `gqa-repeat=block` | KV heads expanded ABAB instead of HF repeat_kv AABB; default tbt | prefill, tbt |
//! | `tbt-attn-scale=F` / `prefill-attn-scale=F` | attention scores × F in that group | — |
//! | `softmax=shared-across-heads` | one softmax over all heads' scores of a row (F11); default both | prefill, tbt |
//! | `rope-theta=sign-folded\|plain` | the shipped `rope_theta_data.bin` is written in that sign convention while the graph keeps the emulator's (`--sim-rope-theta`); must differ from it | — |
//! | `rope-k-tile=W` | the graph's K-side cos/sin tables repeat the first W elements of each head's table instead of the whole head_dim-wide one (seed 000: Q and K tables tiled at different widths); default both groups | prefill, tbt |
//! | `rope-scaling=F` | the shipped `rope_theta_data.bin` holds the config's frequencies divided by F (a rope-scaling factor the config does not say, ai-hub-models#337) | — |
//! | `truncate-entry=N` | cache writers keep only the first N bytes of every entry (rest zero); default all writers | prefill, tbt, k, v, layer |
//! | `prefill-truncate=N` | the prefill graph takes only the newest N of the P window rows: the older rows are dropped, their keys unseen and their K/V never written (the slots keep their bytes) | — |
//! | `ring-capacity=N` | the rings hold N entries (P < N < L) while the device declares L: slot `s` lives at `s mod N`, so from N tokens on every write overwrites the token N before it | — |
//! | `ring-write-race` | every cache element a run writes gets its lowest bit from a generator seeded per process and advanced per write: identical requests leave different ring bytes, and the steps that read them different logits | — |

use kvprobe_schema::{GroupKind, Layout, Verdict};

pub use crate::contract::faults::Scope;
use crate::contract::faults::{
    Expected, FaultDecl, FaultTable, FaultText, ScopeKind, SweepValue, Values,
};
use crate::rope::RopeTheta;
use crate::{Error, Result};

const KV_LAYER: &[ScopeKind] = &[ScopeKind::Kv, ScopeKind::Layer];
const GROUP: &[ScopeKind] = &[ScopeKind::Group];
const TBT: &[GroupKind] = &[GroupKind::Tbt];
const LAYOUTS: &[&str] = &["feature-major", "f8cr", "head-major", "tile16"];
const GRAPH_STAGE: Expected = Expected::ByStage {
    prefill: Verdict::PrefillGraph,
    tbt: Verdict::TbtGraph,
};

/// The Hailo emulator's fault table (`--sim`); the README's table is generated from it.
pub const TABLE: FaultTable = FaultTable {
    faults: &[
        FaultDecl {
            name: "tbt-read-layout",
            values: Values::OneOf(LAYOUTS),
            scopes: KV_LAYER,
            default_groups: &[],
            bug_class: "F9: tbt reads the cache in another layout than prefill wrote (`head-major`, `tile16`: test layouts the named `layout` probe never tries)",
            expected: Expected::Always(Verdict::CacheLayoutMismatch),
            sweep: SweepValue::OneOf(&["feature-major", "f8cr"]),
        },
        FaultDecl {
            name: "prefill-write-layout",
            values: Values::OneOf(LAYOUTS),
            scopes: KV_LAYER,
            default_groups: &[],
            bug_class: "the prefill writer is not token-major (`head-major`: one KV head's `[token][dim]` block after another; `tile16`: tokens in tiles of 16, each tile feature-major)",
            expected: Expected::Always(Verdict::CacheLayoutMismatch),
            sweep: SweepValue::OneOf(&["feature-major", "f8cr"]),
        },
        FaultDecl {
            name: "mask",
            values: Values::OneOf(&["left-valid"]),
            scopes: GROUP,
            default_groups: TBT,
            bug_class: "the graph applies the mask as if valid entries were left-aligned",
            expected: Expected::Always(Verdict::MaskConvention),
            sweep: SweepValue::Fixed("left-valid"),
        },
        FaultDecl {
            name: "mask",
            values: Values::OneOf(&["repeat"]),
            scopes: GROUP,
            default_groups: &[],
            bug_class: "F4: one head's mask repeated element-wise",
            expected: Expected::Always(Verdict::MaskConvention),
            sweep: SweepValue::Fixed("repeat"),
        },
        FaultDecl {
            name: "offset",
            values: Values::OneOf(&["after-run"]),
            scopes: &[],
            default_groups: &[],
            bug_class: "the runtime updates the offset after the run",
            expected: Expected::Always(Verdict::CacheOffset),
            sweep: SweepValue::Fixed("after-run"),
        },
        FaultDecl {
            name: "tbt-cache-scale",
            values: Values::Number("F"),
            scopes: KV_LAYER,
            default_groups: &[],
            bug_class: "tbt dequantises the cache with F × the writer's scale",
            expected: Expected::Always(Verdict::CacheQuantization),
            sweep: SweepValue::Factor,
        },
        FaultDecl {
            name: "tbt-position",
            values: Values::Number("±N"),
            scopes: &[],
            default_groups: &[],
            bug_class: "the tbt positional input is N positions off",
            expected: Expected::Always(Verdict::PositionMismatch),
            sweep: SweepValue::SmallSigned,
        },
        FaultDecl {
            name: "prefill-position",
            values: Values::Number("±N"),
            scopes: &[],
            default_groups: &[],
            bug_class: "the prefill positional input is N positions off (the K it caches is rotated for the wrong positions; an off-by-N prefill position counter or BOS handling)",
            expected: Expected::Always(Verdict::PositionMismatch),
            // verified on RoPE models (tests/fault_table_cli.rs); GPT-2's learned positions not yet
            sweep: SweepValue::NotSampled,
        },
        FaultDecl {
            name: "kv-swap",
            values: Values::None,
            scopes: &[ScopeKind::Layer],
            default_groups: &[],
            bug_class: "tbt binds the K ring as V and the V ring as K",
            expected: Expected::Always(Verdict::KvBinding),
            sweep: SweepValue::None,
        },
        FaultDecl {
            name: "gqa-repeat",
            values: Values::OneOf(&["block"]),
            scopes: GROUP,
            default_groups: TBT,
            bug_class: "KV heads expanded in block order",
            expected: GRAPH_STAGE,
            sweep: SweepValue::Fixed("block"),
        },
        FaultDecl {
            name: "tbt-attn-scale",
            values: Values::Number("F"),
            scopes: &[],
            default_groups: &[],
            bug_class: "tbt scales attention scores by F",
            expected: Expected::Always(Verdict::TbtGraph),
            sweep: SweepValue::Factor,
        },
        FaultDecl {
            name: "prefill-attn-scale",
            values: Values::Number("F"),
            scopes: &[],
            default_groups: &[],
            bug_class: "prefill scales attention scores by F",
            expected: Expected::Always(Verdict::PrefillGraph),
            sweep: SweepValue::Factor,
        },
        FaultDecl {
            name: "softmax",
            values: Values::OneOf(&["shared-across-heads"]),
            scopes: GROUP,
            default_groups: &[],
            bug_class: "F11: one softmax over all heads",
            expected: GRAPH_STAGE,
            sweep: SweepValue::Fixed("shared-across-heads"),
        },
        FaultDecl {
            name: "truncate-entry",
            values: Values::Number("N"),
            scopes: &[ScopeKind::Group, ScopeKind::Kv, ScopeKind::Layer],
            default_groups: &[],
            bug_class: "cache entries keep only their first N bytes",
            expected: Expected::Always(Verdict::CacheTruncation),
            sweep: SweepValue::EntryFraction,
        },
        FaultDecl {
            name: "prefill-truncate",
            values: Values::Number("N"),
            scopes: &[],
            default_groups: &[],
            bug_class: "the prefill graph was compiled for N rows, fewer than the P the device declares: the oldest rows of each window are silently dropped (their K/V never written)",
            expected: Expected::Always(Verdict::CapacityOverflow),
            // N is absolute while the sweep draws P per case; tests/capacity_faults.rs runs it
            sweep: SweepValue::NotSampled,
        },
        FaultDecl {
            name: "ring-capacity",
            values: Values::Number("N"),
            scopes: &[],
            default_groups: &[],
            bug_class: "the rings hold N entries, fewer than the L the device declares (contract §2.5: nothing checks KV = L): from N tokens on each write silently overwrites the token N before it",
            expected: Expected::Always(Verdict::CapacityOverflow),
            // N is absolute while the sweep draws L per case; tests/capacity_faults.rs runs it
            sweep: SweepValue::NotSampled,
        },
        FaultDecl {
            name: "ring-write-race",
            values: Values::None,
            scopes: &[],
            default_groups: &[],
            bug_class: "cache writes race the runtime (apple/coreai-models#84's class on a ring): the lowest bit of every element written changes run to run, so identical requests give different caches and logits",
            expected: Expected::Always(Verdict::Nondeterministic),
            sweep: SweepValue::None,
        },
        FaultDecl {
            name: "rope-theta",
            values: Values::OneOf(&["sign-folded", "plain"]),
            scopes: &[],
            default_groups: &[],
            bug_class: "the shipped `rope_theta_data.bin` uses the other RoPE sign convention than the graph",
            expected: Expected::Always(Verdict::PositionMismatch),
            sweep: SweepValue::OtherRopeConvention,
        },
        FaultDecl {
            name: "rope-k-tile",
            values: Values::Number("W"),
            scopes: GROUP,
            default_groups: &[],
            bug_class: "seed 000: the RoPE cos/sin inputs of K are tiled at another width than Q's (each K head repeats the first W elements of its table)",
            expected: Expected::Always(Verdict::PositionMismatch),
            sweep: SweepValue::HeadFraction,
        },
        FaultDecl {
            name: "rope-scaling",
            values: Values::Number("F"),
            scopes: &[],
            default_groups: &[],
            bug_class: "ai-hub-models#337: the compiled theta table uses another rope-scaling factor than the config (frequencies divided by F)",
            expected: Expected::Always(Verdict::PositionMismatch),
            sweep: SweepValue::RopeFactor,
        },
    ],
};

#[derive(Debug, Clone, PartialEq)]
pub enum FaultKind {
    TbtReadLayout(Layout),
    PrefillWriteLayout(Layout),
    MaskLeftValid,
    MaskRepeat,
    OffsetAfterRun,
    TbtCacheScale(f32),
    TbtPosition(i64),
    PrefillPosition(i64),
    KvSwap,
    GqaBlock,
    TbtAttnScale(f32),
    PrefillAttnScale(f32),
    SharedSoftmax,
    TruncateEntry(usize),
    /// The theta table's convention (the graph keeps `SimOptions::rope_theta`).
    RopeTheta(RopeTheta),
    /// The prefill graph keeps the newest N window rows.
    PrefillTruncate(usize),
    /// The rings hold N entries.
    RingCapacity(usize),
    /// The lowest bit of every written cache element comes from a per-process generator.
    RingWriteRace,
    /// K's cos/sin tables repeat the first W elements of each head's table.
    RopeKTile(usize),
    /// The shipped theta table divided by this factor.
    RopeScaling(f32),
}

#[derive(Debug, Clone, PartialEq)]
pub struct Fault {
    /// Exactly as given.
    pub text: String,
    pub kind: FaultKind,
    pub scope: Scope,
}

/// A fault written without `=value`.
fn no_value(f: &FaultText, kind: FaultKind) -> Result<FaultKind> {
    match f.value {
        None => Ok(kind),
        Some(_) => Err(f.bad("takes no value")),
    }
}

/// The range of a fault's factor (`tbt-cache-scale`, `*-attn-scale`, `rope-scaling`).
const MIN_FACTOR: f32 = 1e-6;
const MAX_FACTOR: f32 = 1e6;

fn parse_factor(f: &FaultText) -> Result<f32> {
    let v = f.value.ok_or_else(|| f.bad("needs a value, e.g. =0.5"))?;
    let x: f32 = v
        .parse()
        .map_err(|_| f.bad(format!("`{v}` is not a number")))?;
    if !x.is_finite() || x <= 0.0 {
        return Err(f.bad("the factor must be a positive finite number"));
    }
    // the factor multiplies a scale, a score or a frequency that f32 products then square and
    // sum over a head: past 10^±6 they overflow or underflow, and the emulator's own numbers
    // (not the bug it emulates) turn non-finite (issue 38)
    if !(MIN_FACTOR..=MAX_FACTOR).contains(&x) {
        return Err(f.bad(format!(
            "{x:e} is outside {MIN_FACTOR:e}..{MAX_FACTOR:e}: the emulator's f32 numbers would not stay finite; pick a factor in that range"
        )));
    }
    Ok(x)
}

fn parse_layout(f: &FaultText) -> Result<Layout> {
    let v = f
        .value
        .ok_or_else(|| f.bad("needs a layout: =feature-major or =f8cr"))?;
    Layout::parse_any(v).ok_or_else(|| {
        f.bad(format!(
            "unknown layout `{v}`; use feature-major, f8cr, head-major or tile16"
        ))
    })
}

fn want_value(f: &FaultText, expected: &str) -> Result<()> {
    match f.value {
        Some(x) if x == expected => Ok(()),
        Some(x) => Err(f.bad(format!("unknown value `{x}`; use ={expected}"))),
        None => Err(f.bad(format!("needs ={expected}"))),
    }
}

fn parse_positions(f: &FaultText) -> Result<i64> {
    let v = f
        .value
        .ok_or_else(|| f.bad("needs a signed offset, e.g. =+1 or =-2"))?;
    v.trim_start_matches('+')
        .parse()
        .map_err(|_| f.bad(format!("`{v}` is not a whole number of positions")))
}

fn parse_count(f: &FaultText) -> Result<usize> {
    let v = f
        .value
        .ok_or_else(|| f.bad("needs a number of tokens, e.g. =24"))?;
    match v.parse::<usize>() {
        Ok(n) if n > 0 => Ok(n),
        _ => Err(f.bad(format!("`{v}` is not a positive number of tokens"))),
    }
}

/// The capacity faults against the geometry: `prefill-truncate=N` needs N < P, `ring-capacity=N`
/// needs P < N < L (a prefill window must fit the ring it writes).
pub fn check_capacity(f: &Fault, cache_len: usize, prefill_len: usize) -> Result<()> {
    let (l, p) = (cache_len, prefill_len);
    match f.kind {
        FaultKind::PrefillTruncate(n) if n >= p => Err(Error::NoOpFault {
            fault: f.text.clone(),
            why: format!("the prefill graph takes P = {p} rows; use N below {p}"),
        }),
        FaultKind::RingCapacity(n) if n >= l => Err(Error::NoOpFault {
            fault: f.text.clone(),
            why: format!("the rings hold L = {l} entries; use N below {l}"),
        }),
        FaultKind::RingCapacity(n) if n <= p => Err(FaultText::split(&f.text).bad(format!(
            "a ring of {n} entries cannot take a prefill window of P = {p} rows; use N between {} and {}",
            p + 1,
            l - 1
        ))),
        _ => Ok(()),
    }
}

/// The typed fault of a known name (its value checked).
fn kind(f: &FaultText) -> Result<FaultKind> {
    Ok(match f.name {
        "tbt-read-layout" => FaultKind::TbtReadLayout(parse_layout(f)?),
        "prefill-write-layout" => FaultKind::PrefillWriteLayout(parse_layout(f)?),
        "mask" => match f.value {
            Some("left-valid") => FaultKind::MaskLeftValid,
            Some("repeat") => FaultKind::MaskRepeat,
            _ => return Err(f.bad("use mask=left-valid or mask=repeat")),
        },
        "offset" => want_value(f, "after-run").map(|_| FaultKind::OffsetAfterRun)?,
        "tbt-cache-scale" => FaultKind::TbtCacheScale(parse_factor(f)?),
        "tbt-position" => FaultKind::TbtPosition(parse_positions(f)?),
        "prefill-position" => FaultKind::PrefillPosition(parse_positions(f)?),
        "kv-swap" => no_value(f, FaultKind::KvSwap)?,
        "gqa-repeat" => want_value(f, "block").map(|_| FaultKind::GqaBlock)?,
        "tbt-attn-scale" => FaultKind::TbtAttnScale(parse_factor(f)?),
        "prefill-attn-scale" => FaultKind::PrefillAttnScale(parse_factor(f)?),
        "softmax" => want_value(f, "shared-across-heads").map(|_| FaultKind::SharedSoftmax)?,
        "truncate-entry" => {
            let v = f
                .value
                .ok_or_else(|| f.bad("needs a byte count, e.g. =32"))?;
            FaultKind::TruncateEntry(
                v.parse()
                    .map_err(|_| f.bad(format!("`{v}` is not a byte count")))?,
            )
        }
        "prefill-truncate" => FaultKind::PrefillTruncate(parse_count(f)?),
        "ring-capacity" => FaultKind::RingCapacity(parse_count(f)?),
        "ring-write-race" => no_value(f, FaultKind::RingWriteRace)?,
        "rope-theta" => FaultKind::RopeTheta(
            f.value
                .and_then(RopeTheta::parse)
                .ok_or_else(|| f.bad("use rope-theta=sign-folded or rope-theta=plain"))?,
        ),
        "rope-k-tile" => {
            let v = f
                .value
                .ok_or_else(|| f.bad("needs a width in elements, e.g. =16"))?;
            match v.parse() {
                Ok(w) if w > 0 => FaultKind::RopeKTile(w),
                _ => return Err(f.bad(format!("`{v}` is not a positive width"))),
            }
        }
        "rope-scaling" => FaultKind::RopeScaling(parse_factor(f)?),
        _ => {
            return Err(Error::UnknownFault {
                name: f.name.to_string(),
                known: TABLE.known(),
            })
        }
    })
}

/// Parse one `--fault` value: the name against [`TABLE`], the value into a [`FaultKind`], then
/// the scope the table allows. Model-dependent no-op checks happen in [`validate`].
pub fn parse(text: &str) -> Result<Fault> {
    let f = FaultText::split(text);
    let decl = TABLE.decl(&f)?;
    let kind = kind(&f)?;
    let scope = Scope::parse(&f, decl)?;
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
    pub head_dim: usize,
}

/// Refuse faults that change nothing here or name a layer that does not exist.
pub fn validate(f: &Fault, cx: &FaultContext) -> Result<()> {
    if let Some(ls) = &f.scope.layers {
        if let Some(&l) = ls.iter().find(|&&l| l >= cx.n_layers) {
            return Err(FaultText::split(&f.text).bad(format!(
                "layer={l} does not exist; the model has layers 0..{}",
                cx.n_layers - 1
            )));
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
        | FaultKind::RopeScaling(s)
            if *s == 1.0 =>
        {
            return noop("a factor of 1.0");
        }
        FaultKind::TbtPosition(0) | FaultKind::PrefillPosition(0) => {
            return noop("an offset of 0 positions")
        }
        FaultKind::RopeKTile(_) | FaultKind::RopeScaling(_) if cx.rope_theta.is_none() => {
            return noop("the model has learned positions and no RoPE tables");
        }
        FaultKind::RopeKTile(w) if *w >= cx.head_dim || 2 * *w == cx.head_dim => {
            return noop(&format!(
                "a head's table is {} elements with equal halves: a width of {w} repeats it unchanged",
                cx.head_dim
            ));
        }
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
    use kvprobe_schema::CacheKind;

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
