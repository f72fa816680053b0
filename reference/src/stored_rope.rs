//! RoPE tables a device stores (an OpenVINO IR's compressed `cos_cache` / `sin_cache`), used by
//! the reference in place of the tables it computes from `inv_freq`.

/// RoPE tables read from a device file, `[positions][head_dim / 2]` each (rotate_half duplicates them).
#[derive(Debug)]
pub(crate) struct StoredRope {
    pub half: usize,
    pub cos: Vec<f32>,
    pub sin: Vec<f32>,
}

impl StoredRope {
    /// cos/sin `[T][2·half]` for `positions`, None past the table.
    pub fn tables(&self, positions: &[f32]) -> Option<(Vec<f32>, Vec<f32>)> {
        let (h, hd) = (self.half, 2 * self.half);
        let mut cos = vec![0f32; positions.len() * hd];
        let mut sin = vec![0f32; positions.len() * hd];
        for (t, &p) in positions.iter().enumerate() {
            let row = p as usize;
            if p < 0.0 || p.fract() != 0.0 || (row + 1) * h > self.cos.len() {
                return None;
            }
            for i in 0..h {
                for j in [i, i + h] {
                    cos[t * hd + j] = self.cos[row * h + i];
                    sin[t * hd + j] = self.sin[row * h + i];
                }
            }
        }
        Some((cos, sin))
    }
}
