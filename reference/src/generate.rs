//! Greedy generation with the reference: what `kvprobe ref generate` prints and the baseline a
//! device's greedy text is read against.

use crate::{Error, Model, Result};

/// Greedy argmax; the first maximum wins on ties (as numpy's argmax).
pub fn argmax(row: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &v) in row.iter().enumerate() {
        if v > row[best] {
            best = i;
        }
    }
    best as u32
}

impl Model {
    /// Greedy decoding with a KV state: the prompt minus its last token fills the state, then
    /// every step attends to the whole state and appends its own K/V. Stops after `max_new`
    /// tokens, at EOS, or at the model's context.
    pub fn greedy(&self, prompt: &[u32], max_new: usize) -> Result<Vec<u32>> {
        let Some((&last, head)) = prompt.split_last() else {
            return Err(Error::InvalidInput(
                "greedy generation needs at least one prompt token".into(),
            ));
        };
        let max_pos = self.config().max_position;
        let eos = self.config().eos_token_id;
        let positions: Vec<usize> = (0..head.len()).collect();
        let mut state = self.prefix_state(head, &positions)?;
        let mut token = last;
        let mut position = head.len();
        let mut out = Vec::new();
        while out.len() < max_new && position < max_pos {
            let logits = self.decode_step(&mut state, token, position)?;
            token = argmax(&logits);
            out.push(token);
            if Some(token) == eos {
                break;
            }
            position += 1;
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::argmax;

    #[test]
    fn first_maximum_wins() {
        assert_eq!(argmax(&[0.0, 2.0, 2.0, 1.0]), 1);
        assert_eq!(argmax(&[-1.0]), 0);
    }
}
