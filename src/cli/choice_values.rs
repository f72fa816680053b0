//! The choices of the device flags (`--cache-bits`, `--quant`, `--cache`, `--weights`,
//! `--rope-theta`, `--ep`) as clap parsers, so `--help` lists them and a typo is refused early.

use clap::builder::{PossibleValue, PossibleValuesParser};

// The choice flags stay strings for the libraries (which parse and refuse them too, for
// manifests and library callers); clap lists the choices in `--help` and refuses a typo early.
// Aliases are the spellings the libraries also accept.

pub(super) fn cache_bits_values() -> impl clap::builder::TypedValueParser<Value = u32> {
    use clap::builder::TypedValueParser;
    PossibleValuesParser::new([
        PossibleValue::new("8").help("uint8 cache edges, as compiled HEFs ship them (default)"),
        PossibleValue::new("16").help("uint16 cache edges"),
    ])
    .try_map(|s| s.parse::<u32>())
}

pub(super) fn quant_values() -> PossibleValuesParser {
    PossibleValuesParser::new([
        PossibleValue::new("edges")
            .alias("int")
            .help("quantise every edge like a compiled HEF (default)"),
        PossibleValue::new("none").help("every edge float"),
    ])
}

pub(super) fn cache_values() -> PossibleValuesParser {
    PossibleValuesParser::new([
        PossibleValue::new("un-expanded")
            .alias("unexpanded")
            .help("one entry per KV head (default)"),
        PossibleValue::new("expanded").help("one entry per attention head"),
    ])
}

pub(super) fn weight_values() -> PossibleValuesParser {
    PossibleValuesParser::new([
        PossibleValue::new("f32").help("the model's weights (default)"),
        PossibleValue::new("int8").help("per-channel int8 weights"),
    ])
}

pub(super) fn rope_theta_values() -> PossibleValuesParser {
    PossibleValuesParser::new([
        PossibleValue::new("plain").help("both halves positive (default)"),
        PossibleValue::new("sign-folded").help("first half negated, HailoRT's fallback"),
    ])
}

pub(super) fn ep_values() -> PossibleValuesParser {
    PossibleValuesParser::new([
        PossibleValue::new("cpu").help("default"),
        PossibleValue::new("qnn").help("Qualcomm Snapdragon NPU"),
        PossibleValue::new("openvino").help("Intel Core Ultra NPU"),
        PossibleValue::new("vitisai")
            .alias("vitis")
            .help("AMD Ryzen AI NPU"),
        PossibleValue::new("coreml").help("Apple Neural Engine"),
    ])
}
