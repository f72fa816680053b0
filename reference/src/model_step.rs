//! [`Model`]'s one-token step graph: the query at a position over key sets of a state (the seam
//! `step`, `step_many`, `decode_step` and `step_in` share). Kept apart from model.rs for size.

use crate::{Error, GraphInput, GraphOptions, KeySet, KvState, Model, PositionInput, Result};

impl Model {
    pub(crate) fn step_graph(
        &self,
        state: &KvState,
        token: u32,
        position: usize,
        keys: &[KeySet],
        graph: GraphOptions,
    ) -> Result<crate::GraphOutput> {
        let n = state.len();
        if state.layers.len() != self.config.n_layers {
            return Err(Error::InvalidInput(format!(
                "state has {} layers, the model {}",
                state.layers.len(),
                self.config.n_layers
            )));
        }
        self.check_positions(&[position])?;
        let r = keys.len();
        let nh = self.config.n_heads;
        let cols = n + r;
        let mut m = vec![false; r * nh * cols];
        for (i, ks) in keys.iter().enumerate() {
            let mut row = vec![false; cols];
            match ks {
                KeySet::All => row[..n].iter_mut().for_each(|x| *x = true),
                KeySet::Subset(idx) => {
                    for &j in idx {
                        if j >= n {
                            return Err(Error::InvalidInput(format!(
                                "key index {j} is outside the state ({n} entries)"
                            )));
                        }
                        row[j] = true;
                    }
                }
                KeySet::Window(w) => row[n.saturating_sub(*w)..n]
                    .iter_mut()
                    .for_each(|x| *x = true),
                KeySet::None => {}
            }
            row[n + i] = true;
            for h in 0..nh {
                m[(i * nh + h) * cols..(i * nh + h + 1) * cols].copy_from_slice(&row);
            }
        }
        let hidden = self.embed(&vec![token; r])?;
        self.run_graph(&GraphInput {
            hidden,
            positions: PositionInput::Ids(vec![position as f32; r]),
            past: if n > 0 {
                state.layers.clone()
            } else {
                Vec::new()
            },
            mask: m,
            graph,
            last_only: r == 1,
        })
    }
}
