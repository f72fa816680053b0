//! The cause a diagnosis names as a typed hypothesis of the emulator's fault grammar, and the
//! replay that tests it: the emulator built to the device's description with that fault, driven
//! on the device's own tokens, compared per step with the device's logits (issue 34).

use serde::{Deserialize, Serialize};

use crate::device::{CacheKind, GroupKind};

/// A fault's value, typed by what the family's table declares it takes.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case", tag = "type", content = "value")]
pub enum FaultValue {
    /// The fault takes no value (or its documented default).
    None,
    /// One of the words the table lists (`feature-major`, `left-valid`, …).
    Word(String),
    /// A number: a factor, a signed shift, a byte or token count.
    Number(f64),
}

/// One fault of a family's table as a value: name, value and scope (empty lists = the scope's
/// declared default).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FaultHypothesis {
    /// The name in the family's fault table (`tbt-attn-scale`, `kv-swap`, …).
    pub name: String,
    pub value: FaultValue,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub groups: Vec<GroupKind>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub kinds: Vec<CacheKind>,
    /// `layer=N` items: the layers the evidence names (empty = every layer).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub layers: Vec<usize>,
}

impl FaultHypothesis {
    /// The `--fault` argument that states it (`NAME[=VALUE][@SCOPE]`).
    pub fn text(&self) -> String {
        let mut t = self.name.clone();
        match &self.value {
            FaultValue::None => {}
            FaultValue::Word(w) => t += &format!("={w}"),
            FaultValue::Number(x) => {
                let sign = if *x > 0.0 && self.signed() { "+" } else { "" };
                t += &format!("={sign}{}", number(*x));
            }
        }
        let scope: Vec<String> = self
            .groups
            .iter()
            .map(|g| g.suffix())
            .chain(self.kinds.iter().map(|k| match k {
                CacheKind::K => "k",
                CacheKind::V => "v",
            }))
            .map(str::to_string)
            .chain(self.layers.iter().map(|l| format!("layer={l}")))
            .collect();
        if !scope.is_empty() {
            t += &format!("@{}", scope.join(","));
        }
        t
    }

    /// Position shifts are written with their sign (`tbt-position=+1`).
    fn signed(&self) -> bool {
        self.name.ends_with("-position")
    }
}

/// A number as the fault grammar reads it: integers without a fraction, others to 3 places.
fn number(x: f64) -> String {
    if x.fract() == 0.0 && x.abs() < 1e9 {
        format!("{}", x as i64)
    } else {
        let s = format!("{x:.3}");
        s.trim_end_matches('0').trim_end_matches('.').to_string()
    }
}

/// The cause the verdict names: the rule that named it, that rule's own evidence lines (the
/// decisive ones), and the fault hypothesis the replay tested, if the grammar states one.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Hypothesis {
    /// Id of the rule that heads the verdict (docs/diagnosis.md's tables).
    pub rule: String,
    pub decisive: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fault: Option<FaultHypothesis>,
}

/// One step of a replay: misses are 1 − cosine of the logits.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct ReplayStep {
    /// 0 = the prefill's logits, then the tbt steps.
    pub step: usize,
    /// The replay against the device.
    pub replay_miss: f64,
    /// The healthy hypothesis (the precision-matched reference) against the device.
    pub healthy_miss: Option<f64>,
    /// The declared precision: the precision-matched reference against the f32 reference.
    pub precision: Option<f64>,
}

/// One hypothesis replayed on the emulator.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Replay {
    pub fault: FaultHypothesis,
    pub steps: Vec<ReplayStep>,
    /// Medians over the steps.
    pub replay_miss: f64,
    pub healthy_miss: Option<f64>,
    pub precision: Option<f64>,
    /// The replay reproduces the device within its declared precision, clearly better than the
    /// healthy hypothesis does (docs/diagnosis.md, "Replay").
    pub reproduces: bool,
}

/// How to hand the failure to someone without the device: the kvprobe command of the replay
/// that came closest, and how close it came.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Reproducer {
    /// argv of the command (emulator, geometry, fault, prompt, steps); empty when no replay ran.
    pub command: Vec<String>,
    /// argv of a command to run first: a HEF's emulator description (`kvprobe inspect HEF
    /// --emit-sim FILE`, the manifest `command` runs with).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub setup: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replay: Option<Replay>,
    /// Every hypothesis replayed, with its median miss, in the order tried.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tried: Vec<(String, f64)>,
    /// Why there is no replay, or why the closest one does not reproduce.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
}

impl Reproducer {
    /// One line for the verdict's head: the command and how close it came.
    pub fn line(&self) -> String {
        match (&self.replay, &self.note) {
            (Some(r), note) => format!(
                "replay `{}` on the emulator: median miss {:.2e} per step against the device (healthy hypothesis {}, declared precision {}){}{}",
                r.fault.text(),
                r.replay_miss,
                r.healthy_miss.map_or("n/a".into(), |m| format!("{m:.2e}")),
                r.precision.map_or("n/a".into(), |m| format!("{m:.2e}")),
                if r.reproduces { ": reproduces" } else { ": does not reproduce" },
                note.as_deref().map(|n| format!("; {n}")).unwrap_or_default()
            ),
            (None, Some(n)) => format!("no replay: {n}"),
            (None, None) => "no replay".into(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fault_text_follows_the_grammar() {
        let f = |name: &str, value, groups, kinds| FaultHypothesis {
            name: name.into(),
            value,
            groups,
            kinds,
            layers: vec![],
        };
        assert_eq!(
            f("tbt-position", FaultValue::Number(1.0), vec![], vec![]).text(),
            "tbt-position=+1"
        );
        assert_eq!(
            f("tbt-attn-scale", FaultValue::Number(0.85), vec![], vec![]).text(),
            "tbt-attn-scale=0.85"
        );
        assert_eq!(
            f(
                "mask",
                FaultValue::Word("left-valid".into()),
                vec![GroupKind::Prefill],
                vec![]
            )
            .text(),
            "mask=left-valid@prefill"
        );
        assert_eq!(
            f("kv-swap", FaultValue::None, vec![], vec![CacheKind::K]).text(),
            "kv-swap@k"
        );
        let scoped = FaultHypothesis {
            layers: vec![1, 2],
            ..f(
                "tbt-read-layout",
                FaultValue::Word("f8cr".into()),
                vec![],
                vec![CacheKind::V],
            )
        };
        // the grammar's own order: groups, kinds, then each layer as its own item
        assert_eq!(scoped.text(), "tbt-read-layout=f8cr@v,layer=1,layer=2");
        let json = serde_json::to_string(&FaultValue::Number(0.5)).unwrap();
        assert_eq!(json, r#"{"type":"number","value":0.5}"#);
    }
}
