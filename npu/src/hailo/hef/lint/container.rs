//! Checks of the container and the group and layer names.

use std::collections::BTreeMap;

use super::{Facts, Out, RESOURCE_NAMES};
use crate::hailo::hef::model::Hef;
use crate::hailo::hef::{formats, roles};

pub(super) fn container(hef: &Hef, out: &mut Out) {
    let hc = &hef.header_checks;
    if !hc.size_ok {
        out.push(
            "header-size",
            format!("container v{} size equation fails: {}", hef.header.version, hc.size_detail.clone().unwrap_or_default()),
            "re-export the HEF; a truncated or hand-edited container is refused by HailoRT's header validation",
        );
    }
    if !hc.padding_ok {
        out.push(
            "header-padding",
            format!(
                "ccws_size_with_padding {} < hef_padding_size {}",
                hef.header.ccws_size, hef.header.padding_size
            ),
            "re-export the HEF; the in-memory loader rejects this header",
        );
    }
    if hc.file_hash_ok == Some(false) {
        out.push(
            "header-file-hash",
            "header XXH3 does not match the file (HailoRT trusts it unverified because proto_xxh3 is set)".into(),
            "recompute the header hash after editing the file, or re-export; saved contexts key on this hash",
        );
    }
    if hef.header.version != 3 {
        out.push(
            "header-version",
            format!(
                "container version {} (Hailo-10H transfers only v3 HEFs over hRPC)",
                hef.header.version
            ),
            "recompile with Dataflow Compiler 5.0 or later, which writes v3",
        );
    }
    if hef.hw_arch != formats::HW_ARCH_HAILO1XH {
        out.push(
            "hw-arch",
            format!(
                "compiled for {} (arch {}), not HAILO1XH (103)",
                hef.hw_arch_name, hef.hw_arch
            ),
            "compile with --hw-arch hailo10h",
        );
    }
    let bad: Vec<u32> = hef
        .extensions
        .iter()
        .copied()
        .filter(|&i| !formats::extension_supported(i))
        .collect();
    if !bad.is_empty() {
        out.push(
            "extension-unsupported",
            format!("mandatory extension indices {bad:?} are refused by HailoRT 5.2"),
            "compile with a Dataflow Compiler matching the installed HailoRT",
        );
    }
    if hef.proto_version > 0
        && !hef
            .extensions
            .contains(&formats::EXT_PERIPH_CALCULATION_IN_HAILORT)
    {
        out.push(
            "extension-periph",
            "mandatory extension PERIPH_CALCULATION_IN_HAILORT (26) is missing".into(),
            "compile with a Dataflow Compiler that emits extension 26 (any 5.x)",
        );
    }
    for name in RESOURCE_NAMES {
        if !hef.resources.iter().any(|r| r.name == name) {
            out.push(
                "resource-missing",
                format!("external resource {name} is not embedded"),
                "embed the genai resources (hailo-config.json, tokenizer.json, embeddings.bin, rope_theta_data.bin) when compiling",
            );
        }
    }
    for r in &hef.resources {
        if r.range.is_none() {
            out.push(
                "resource-range",
                format!(
                    "resource {} (offset {}, {} bytes) lies outside the {}-byte file",
                    r.name, r.offset, r.size, hef.file_len
                ),
                "the file is truncated or the descriptor is wrong; copy or re-export the HEF",
            );
        } else if r.hash_ok == Some(false) {
            out.push(
                "resource-hash",
                format!("resource {} fails its XXH3 check ({:016x})", r.name, r.xxhash),
                "the resource was edited without updating its hash; rewrite it with a tool that updates xxhash",
            );
        }
    }
}

pub(super) fn naming(hef: &Hef, facts: &Facts, out: &mut Out) {
    let roles = &facts.roles;
    if roles.prefill.is_none() {
        let names: Vec<&str> = hef.groups.iter().map(|g| g.name.as_str()).collect();
        out.push(
            "group-naming",
            format!(
                "no group name ends with \"{}\" (groups: {names:?})",
                roles.prefill_suffix
            ),
            "name the groups <scope>__prefill and <scope>__tbt when compiling",
        );
    }
    for (what, m) in [
        ("prefill", &roles.prefill_matches),
        ("tbt", &roles.tbt_matches),
    ] {
        if m.len() > 1 {
            let names: Vec<&str> = m.iter().map(|&i| hef.groups[i].name.as_str()).collect();
            out.push(
                "group-ambiguous",
                format!(
                    "{} groups match the {what} suffix {names:?}; the server takes the last",
                    m.len()
                ),
                "keep exactly one group per suffix",
            );
        }
    }
    if roles.prefill.is_some() && roles.tbt.is_none() {
        out.push(
            "group-no-tbt",
            format!(
                "no tbt group (suffix \"{}\"): every step runs through prefill",
                roles.tbt_suffix
            ),
            "compile a <scope>__tbt group next to <scope>__prefill",
        );
    }
    if let (Some(p), Some(t)) = (facts.prefill, facts.tbt) {
        let ok = p.name.ends_with("__prefill")
            && t.name.ends_with("__tbt")
            && roles::scope(&p.name) == roles::scope(&t.name);
        if !ok {
            out.push(
                "group-scope",
                format!("groups \"{}\" and \"{}\" do not share one <scope>__prefill / <scope>__tbt naming", p.name, t.name),
                "name both groups from one model scope",
            );
        }
    }
    let mut seen: BTreeMap<&str, &str> = BTreeMap::new();
    for g in &hef.groups {
        if let Some(other) = seen.insert(&g.core_op_name, &g.name) {
            out.push(
                "core-op-duplicate",
                format!("core op \"{}\" appears in groups \"{other}\" and \"{}\"; the cache manager keeps only the first's state", g.core_op_name, g.name),
                "give each group's core op a distinct name",
            );
        }
        if g.core_op_name != g.name {
            out.push(
                "core-op-name",
                format!("group \"{}\" has core op \"{}\"", g.name, g.core_op_name),
                "keep core-op and group names equal so layer network names resolve",
            );
        }
    }
}
