//! Which group is prefill and which is tbt (contract §3.2), and which input plays which genai
//! role in a group (§3.1 suffix rule).

use super::config::{resolve_suffix, GenaiConfig, SUFFIX_KEYS};
use super::model::{Group, Layer};
use kvprobe_schema::InputRole;
use serde::Serialize;

#[derive(Debug, Clone, Serialize)]
pub struct GroupRoles {
    pub prefill_suffix: String,
    pub tbt_suffix: String,
    /// Indices of every group whose name ends with the suffix, in HEF order.
    pub prefill_matches: Vec<usize>,
    pub tbt_matches: Vec<usize>,
    /// The server's choice: the last match.
    pub prefill: Option<usize>,
    pub tbt: Option<usize>,
}

/// The suffix table of §3.2, without a LoRA name (the inspector checks the base model).
pub fn resolve_groups(names: &[&str]) -> GroupRoles {
    let (p, t) = if names.len() <= 2 {
        (
            "prefill",
            if names.len() == 2 {
                "tbt"
            } else {
                "base_model__tbt"
            },
        )
    } else {
        ("base_model__prefill", "base_model__tbt")
    };
    let matches = |s: &str| -> Vec<usize> {
        names
            .iter()
            .enumerate()
            .filter(|(_, n)| n.ends_with(s))
            .map(|(i, _)| i)
            .collect()
    };
    let prefill_matches = matches(p);
    let tbt_matches = matches(t);
    GroupRoles {
        prefill_suffix: p.into(),
        tbt_suffix: t.into(),
        prefill: prefill_matches.last().copied(),
        tbt: tbt_matches.last().copied(),
        prefill_matches,
        tbt_matches,
    }
}

/// Model scope of a group name: `smollm2__prefill` → `smollm2`.
pub fn scope(name: &str) -> &str {
    name.rsplit_once("__").map(|(a, _)| a).unwrap_or(name)
}

/// The input of `group` that plays `role` under `config`'s suffixes (or the defaults).
pub fn input_for<'g>(
    group: &'g Group,
    config: Option<&GenaiConfig>,
    role: InputRole,
) -> Option<&'g Layer> {
    let suffix = suffix_for(config, role)?;
    let name = resolve_suffix(group.inputs.iter().map(|l| l.name.as_str()), &suffix)?;
    group.inputs.iter().find(|l| l.name == name)
}

pub fn suffix_for(config: Option<&GenaiConfig>, role: InputRole) -> Option<String> {
    match config {
        Some(c) => c
            .suffixes
            .iter()
            .find(|(r, _)| *r == role)
            .map(|(_, s)| s.clone()),
        None => SUFFIX_KEYS
            .iter()
            .find(|(_, r, _)| *r == role)
            .map(|(_, _, d)| (*d).to_string()),
    }
}

/// Role of a named input in a group, if any suffix resolves to it.
pub fn role_of(group: &Group, config: Option<&GenaiConfig>, name: &str) -> Option<InputRole> {
    SUFFIX_KEYS
        .iter()
        .map(|(_, r, _)| *r)
        .find(|&r| input_for(group, config, r).is_some_and(|l| l.name == name))
}
