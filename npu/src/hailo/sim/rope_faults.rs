//! The two RoPE faults of issue 20, as the emulator applies them.
//!
//! - `rope-k-tile=W` (seed 000: "RoPE cos/sin inputs tiled at different widths for K and Q"):
//!   the compiled cos/sin layer of K tiles a `W`-element block across each head where Q's tiles
//!   the whole `head_dim`-wide table, so K element `i` of every head is rotated with the angle of
//!   element `i mod W`. A head's table has equal halves (`[θ, θ]`), so `W = head_dim / 2` changes
//!   nothing (refused as a no-op); any other `W < head_dim` rotates some K pairs with the wrong
//!   frequencies, at every position but 0.
//! - `rope-scaling=F` (qualcomm ai-hub-models#337: a rope-scaling factor of 8 where 32 is right):
//!   the theta table compiled into the device (`rope_theta_data.bin`) holds the config's
//!   frequencies divided by `F`, so Q and K alike rotate as if position `p` were `p / F`.

/// Each `head_dim`-wide block of `table` (one head's cos or sin of one row) repeats its first
/// `w` elements.
pub(super) fn tile_heads(table: &mut [f32], head_dim: usize, w: usize) {
    if head_dim == 0 || w == 0 || w >= head_dim {
        return;
    }
    for head in table.chunks_exact_mut(head_dim) {
        for i in w..head_dim {
            head[i] = head[i % w];
        }
    }
}

/// The shipped theta table with every frequency divided by `factor` (`None`: unchanged).
pub(super) fn scaled(mut table: Vec<f32>, factor: Option<f32>) -> Vec<f32> {
    if let Some(f) = factor {
        table.iter_mut().for_each(|x| *x /= f);
    }
    table
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tiling_repeats_the_first_w_elements_of_each_head() {
        // two heads of 4: [a b c d] with w = 1 → [a a a a]; w = 3 → [a b c a]
        let mut t = vec![1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0];
        tile_heads(&mut t, 4, 3);
        assert_eq!(t, vec![1.0, 2.0, 3.0, 1.0, 5.0, 6.0, 7.0, 5.0]);
        tile_heads(&mut t, 4, 1);
        assert_eq!(
            t,
            vec![1.0; 4].into_iter().chain([5.0; 4]).collect::<Vec<_>>()
        );
    }

    #[test]
    fn half_width_tiling_of_a_table_with_equal_halves_is_the_identity() {
        let mut t = vec![0.1, 0.2, 0.1, 0.2];
        tile_heads(&mut t, 4, 2);
        assert_eq!(t, vec![0.1, 0.2, 0.1, 0.2]);
    }

    #[test]
    fn scaling_divides_every_frequency() {
        assert_eq!(scaled(vec![1.0, 0.5], Some(2.0)), vec![0.5, 0.25]);
        assert_eq!(scaled(vec![1.0], None), vec![1.0]);
    }
}
