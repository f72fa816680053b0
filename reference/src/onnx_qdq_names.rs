//! The names the QDQ graph reader (onnx_qdq.rs) gives the reference's sites: pure functions of
//! a weight's or a site's name.

/// The norm a weight `w` belongs to, as the reference names the site.
pub(crate) fn norm_site(w: &str) -> Option<(Option<usize>, String)> {
    if w == "model.norm.weight" {
        return Some((None, "norm".into()));
    }
    let rest = w.strip_prefix("model.layers.")?;
    let (l, name) = rest.split_once('.')?;
    let name = name.strip_suffix(".weight")?;
    ["input_layernorm", "post_attention_layernorm"]
        .contains(&name)
        .then(|| (l.parse().ok(), name.to_string()))
        .and_then(|(l, n)| Some((Some(l?), n)))
}

/// "`name` of layer l" (or the model's final `name`).
pub(crate) fn at_layer(layer: Option<usize>, name: &str) -> String {
    match layer {
        Some(l) => format!("{name} of layer {l}"),
        None => format!("the final {name}"),
    }
}
