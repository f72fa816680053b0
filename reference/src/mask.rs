//! "May attend" masks, row-major `[T*T]` over T positions (query row, key column), and their
//! expansion to the per-head graph layout `[T, n_heads, W + T]`.

/// Causal: row i sees keys 0..=i.
pub fn causal(t: usize) -> Vec<bool> {
    (0..t * t).map(|k| k % t <= k / t).collect()
}

/// Sliding window: row i sees keys i-w ..= i (w previous positions plus itself).
pub fn banded(t: usize, w: usize) -> Vec<bool> {
    (0..t * t)
        .map(|k| {
            let (i, j) = (k / t, k % t);
            j <= i && i - j <= w
        })
        .collect()
}

/// Causal everywhere except the last row, which sees only key `k` and itself (issue 2
/// `--single-key K`).
pub fn single_key(t: usize, k: usize) -> Vec<bool> {
    let mut m = causal(t);
    if t > 0 {
        let last = t - 1;
        for j in 0..t {
            m[last * t + j] = j == k || j == last;
        }
    }
    m
}

/// `[T*T]` over new rows only (no past) → `[T, n_heads, T]`, the same row for every head.
pub fn per_head(mask: &[bool], t: usize, n_heads: usize) -> Vec<bool> {
    let mut out = Vec::with_capacity(t * n_heads * t);
    for i in 0..t {
        let row = &mask[i * t..(i + 1) * t];
        for _ in 0..n_heads {
            out.extend_from_slice(row);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shapes_by_hand() {
        let t = |s: &str| {
            s.chars()
                .filter(|c| *c != ' ')
                .map(|c| c == '1')
                .collect::<Vec<_>>()
        };
        assert_eq!(causal(3), t("100 110 111"));
        assert_eq!(banded(4, 1), t("1000 1100 0110 0011"));
        assert_eq!(single_key(4, 1), t("1000 1100 1110 0101"));
        assert_eq!(per_head(&t("10 11"), 2, 2), t("10 10 11 11"));
    }
}
