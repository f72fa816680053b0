//! The host side of openvino.genai's stateful LLM pipeline and the NPU plugin's NPUW LLM
//! contract, rule by rule (docs/openvino.md "Host rules" gives each rule's source). Pure
//! functions, unit-tested without OpenVINO.
//!
//! openvino.genai (`src/cpp/src/llm/pipeline_stateful.cpp`, `utils.cpp`): a batch-1 request
//! feeds `input_ids [1, q]`, `attention_mask [1, total]` all ones, `position_ids [1, q]` =
//! `total − q … total − 1`, `beam_idx [1]` = 0, and starts a new conversation with
//! `reset_state()`; the K/V live in the request's variables.
//!
//! NPUW (`src/plugins/intel_npu/src/plugin/npuw/llm_compiled_model.cpp`): the prompt limit is
//! `NPUW_LLM_MAX_PROMPT_LEN` rounded up to a multiple of 64, the response reserve
//! `NPUW_LLM_MIN_RESPONSE_LEN` rounded up to 64; the static KV-cache model is reshaped to their
//! sum, of which a step may fill all but the run's own `NPUW_LLM_MAX_GENERATION_TOKEN_LEN` rows
//! (`llm_infer_request.cpp`: "KV-Cache is full: num_stored_tokens=127 capacity=127" for 64 + 64).

/// NPUW's rounding of both lengths (`align_to(value, 64u)`).
pub const NPUW_ALIGN: usize = 64;
/// NPUW's defaults when the keys are not given (`NPUW_LLM_MAX_PROMPT_LEN`, `..._MIN_RESPONSE_LEN`).
pub const NPUW_DEFAULT_MAX_PROMPT: usize = 1024;
pub const NPUW_DEFAULT_MIN_RESPONSE: usize = 128;
/// NPUW's default `NPUW_LLM_MAX_GENERATION_TOKEN_LEN`: a run after the prompt takes one token
/// (`llm_infer_request.cpp` refuses more: "Input prompt length is greater than output
/// NPUW_LLM_MAX_GENERATION_TOKEN_LEN", measured with 2026.4.1).
pub const NPUW_DEFAULT_MAX_GENERATION: usize = 1;

/// `attention_mask` of a batch-1 request: `[1, total]`, all ones.
pub fn attention_mask(total: usize) -> Vec<i64> {
    vec![1; total]
}

/// `position_ids` of a batch-1 request: `[1, new]` = `total − new … total − 1`.
pub fn position_ids(total: usize, new: usize) -> Vec<i64> {
    (total - new..total).map(|p| p as i64).collect()
}

/// `beam_idx` of a batch-1 greedy request: `[0]` (no beam reorders the cache).
pub const BEAM_IDX: [i32; 1] = [0];

fn align(v: usize) -> usize {
    v.div_ceil(NPUW_ALIGN) * NPUW_ALIGN
}

/// What NPUW derives from its two keys.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NpuwContract {
    /// The longest prompt the static prefill model takes (a longer one is refused).
    pub max_prompt: usize,
    /// The reserve for generated tokens.
    pub min_response: usize,
    /// The most tokens a request holds, prompt and fed generated tokens together: the KV-cache
    /// model's `max_prompt + min_response` positions less the run's own `max_generation` rows.
    /// NPUW 2026.4.1 refuses the step that would hold one more ("KV-Cache is full:
    /// num_stored_tokens=127 capacity=127" at 64 + 64; 191 at 128 + 64; 120 at 64 + 64 with
    /// `NPUW_LLM_MAX_GENERATION_TOKEN_LEN=8`; measured, docs/openvino.md). The pipeline's promise
    /// still holds: a full prompt gets `min_response` tokens, the last of which is never fed.
    pub capacity: usize,
    /// The most tokens one run after the prompt takes (the KV-cache model's input rows).
    pub max_generation: usize,
}

impl NpuwContract {
    pub fn new(
        max_prompt_len: usize,
        min_response_len: usize,
        max_generation: usize,
    ) -> NpuwContract {
        let (max_prompt, min_response) = (align(max_prompt_len), align(min_response_len));
        let max_generation = max_generation.max(1);
        NpuwContract {
            max_prompt,
            min_response,
            capacity: (max_prompt + min_response).saturating_sub(max_generation),
            max_generation,
        }
    }

    /// From the configuration's values (`None` = NPUW's default); a value that is not a whole
    /// number is named.
    pub fn from_config(config: &[(String, String)]) -> std::result::Result<NpuwContract, String> {
        let get = |key: &str, default: usize| -> std::result::Result<usize, String> {
            match config.iter().rev().find(|(k, _)| k == key) {
                None => Ok(default),
                Some((_, v)) => v
                    .parse::<usize>()
                    .map_err(|_| format!("{key}={v}: not a whole number")),
            }
        };
        Ok(NpuwContract::new(
            get("NPUW_LLM_MAX_PROMPT_LEN", NPUW_DEFAULT_MAX_PROMPT)?,
            get("NPUW_LLM_MIN_RESPONSE_LEN", NPUW_DEFAULT_MIN_RESPONSE)?,
            get(
                "NPUW_LLM_MAX_GENERATION_TOKEN_LEN",
                NPUW_DEFAULT_MAX_GENERATION,
            )?,
        ))
    }

    /// How a run of `n` tokens after the prompt is fed: pieces of at most `max_generation`
    /// tokens, in order (a chat turn appended to the kept state; the pieces see what one run
    /// would, since each is appended to the state the one before left).
    pub fn continuation_pieces(&self, n: usize) -> Vec<std::ops::Range<usize>> {
        (0..n)
            .step_by(self.max_generation)
            .map(|a| a..(a + self.max_generation).min(n))
            .collect()
    }

    /// Whether a prompt of `n` tokens is one the pipeline must refuse.
    pub fn refuses_prompt(&self, n: usize) -> bool {
        n > self.max_prompt
    }
}

/// The NPU plugin's configuration for its LLM pipeline with the partitions on the CPU (what
/// openvino.genai's static-pipeline tests pass), then the user's keys, later ones winning.
pub fn npuw_config(
    max_prompt_len: usize,
    min_response_len: usize,
    user: &[(String, String)],
) -> Vec<(String, String)> {
    let mut out: Vec<(String, String)> = [
        ("NPU_USE_NPUW", "YES".to_string()),
        ("NPUW_LLM", "YES".to_string()),
        ("NPUW_DEVICES", "CPU".to_string()),
        ("NPUW_LLM_MAX_PROMPT_LEN", max_prompt_len.to_string()),
        ("NPUW_LLM_MIN_RESPONSE_LEN", min_response_len.to_string()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect();
    for (k, v) in user {
        match out.iter_mut().find(|(ok, _)| ok == k) {
            Some(slot) => slot.1 = v.clone(),
            None => out.push((k.clone(), v.clone())),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn genai_inputs_of_a_prompt_then_a_step() {
        assert_eq!(attention_mask(3), vec![1, 1, 1]);
        assert_eq!(position_ids(5, 5), vec![0, 1, 2, 3, 4]);
        assert_eq!(position_ids(6, 1), vec![5]);
    }

    #[test]
    fn npuw_rounds_both_lengths_up_to_64_and_adds_them() {
        // capacities as NPUW 2026.4.1's own refusal names them ("KV-Cache is full:
        // num_stored_tokens=N capacity=N"), measured with SmolLM2 through Python's openvino
        let c = NpuwContract::new(64, 64, 1);
        assert_eq!((c.max_prompt, c.min_response, c.capacity), (64, 64, 127));
        let c = NpuwContract::new(65, 1, 1);
        assert_eq!((c.max_prompt, c.min_response, c.capacity), (128, 64, 191));
        assert!(!c.refuses_prompt(128) && c.refuses_prompt(129));
        assert_eq!(NpuwContract::new(64, 64, 8).capacity, 120);
        let d = NpuwContract::from_config(&[]).unwrap();
        assert_eq!(d.capacity, 1024 + 128 - 1);
        assert_eq!(d.continuation_pieces(3), vec![0..1, 1..2, 2..3]);
        let cfg = vec![(
            "NPUW_LLM_MAX_GENERATION_TOKEN_LEN".to_string(),
            "16".to_string(),
        )];
        let g = NpuwContract::from_config(&cfg).unwrap();
        assert_eq!(g.continuation_pieces(17), vec![0..16, 16..17]);
        assert_eq!(g.continuation_pieces(16), vec![0..16]);
        let cfg = vec![("NPUW_LLM_MAX_PROMPT_LEN".to_string(), "x".to_string())];
        assert!(NpuwContract::from_config(&cfg)
            .unwrap_err()
            .contains("NPUW_LLM_MAX_PROMPT_LEN=x"));
    }

    #[test]
    fn user_keys_replace_the_pipeline_defaults_or_follow_them() {
        let user = vec![
            ("NPUW_DEVICES".to_string(), "NPU,CPU".to_string()),
            ("NPUW_LLM_OPTIMIZE_V_TENSORS".to_string(), "NO".to_string()),
        ];
        let c = npuw_config(64, 64, &user);
        assert_eq!(c[2], ("NPUW_DEVICES".into(), "NPU,CPU".into()));
        assert_eq!(c.last().unwrap().0, "NPUW_LLM_OPTIMIZE_V_TENSORS");
        assert_eq!(c.len(), 6);
    }
}
