//! Checks of `hailo-config.json`.

use super::{Out, Severity};

pub(super) fn config_checks(facts: &super::Facts, out: &mut Out) {
    let Some(cfg) = &facts.config else { return };
    let cfg = match cfg {
        Ok(c) => c,
        Err(e) => {
            out.push(
                "config-invalid",
                format!("hailo-config.json: {e}"),
                "rewrite hailo-config.json as a JSON object",
            );
            return;
        }
    };
    for (k, t) in &cfg.bad_types {
        out.push(
            "config-invalid",
            format!("hailo-config.json: {k} is not a {t}"),
            "fix the value type; the server ignores or rejects it",
        );
    }
    for k in &cfg.unknown_keys {
        if k == "pre_process_params.prefill_input_tokens_size" {
            out.push(
                "config-key-size",
                "pre_process_params.prefill_input_tokens_size is ignored by the server".into(),
                "rename it to prefill_input_tokens_count",
            );
        } else {
            out.push(
                "config-unknown-key",
                format!("hailo-config.json key {k} is not read by the server"),
                "remove it or fix its spelling",
            );
        }
    }
    if cfg.eos_token_id.is_none() {
        out.push(
            "config-missing-key",
            "eos_token_id is missing (required by the server)".into(),
            "add eos_token_id to hailo-config.json",
        );
    }
    for (name, (_, given)) in [
        ("kv_cache_size", cfg.kv_cache_size),
        ("num_attention_heads", cfg.num_attention_heads),
        ("num_key_value_heads", cfg.num_key_value_heads),
        ("prefill_input_tokens_count", cfg.prefill_input_tokens_count),
    ] {
        if !given {
            out.push_sev(
                "config-missing-key",
                Severity::Warning,
                format!("pre_process_params.{name} is absent; the server uses its default"),
                "write the compiled value explicitly",
            );
        }
    }
}
