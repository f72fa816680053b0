//! The scan for a NaN or infinity over a weight's f32 values, apart from the load's checks
//! (`finite.rs`), which reach the stored weights (`store.rs`) that call it.

/// Index of the first NaN or infinity in `v`. The largest exponent field of a chunk is a
/// reduction the compiler vectorises, unlike an early-exit search (the largest cost of loading
/// SmolLM2's f32 GGUF in a perf profile); only the chunk that holds a non-finite value is
/// searched value by value.
pub(crate) fn first_non_finite_f32(v: &[f32]) -> Option<usize> {
    const EXP: u32 = 0x7f80_0000;
    const CHUNK: usize = 4096;
    v.chunks(CHUNK).enumerate().find_map(|(c, chunk)| {
        let top = chunk.iter().map(|x| x.to_bits() & EXP).max().unwrap_or(0);
        (top == EXP)
            .then(|| chunk.iter().position(|x| !x.is_finite()))
            .flatten()
            .map(|i| c * CHUNK + i)
    })
}

#[cfg(test)]
mod tests {
    use super::first_non_finite_f32;

    #[test]
    fn the_first_non_finite_value_is_found_in_any_chunk() {
        let mut v = vec![1.5f32; 3 * 4096 + 7];
        assert_eq!(first_non_finite_f32(&v), None);
        assert_eq!(first_non_finite_f32(&[]), None);
        // the largest finite values and subnormals are not flagged
        v[5] = f32::MAX;
        v[6] = -f32::MAX;
        v[7] = f32::MIN_POSITIVE / 2.0;
        assert_eq!(first_non_finite_f32(&v), None);
        for bad in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY, -f32::NAN] {
            for at in [0, 4095, 4096, 2 * 4096 + 1, 3 * 4096 + 6] {
                let mut w = v.clone();
                w[at] = bad;
                w[3 * 4096 + 6] = if at == 3 * 4096 + 6 { bad } else { f32::NAN };
                assert_eq!(first_non_finite_f32(&w), Some(at), "{bad} at {at}");
            }
        }
    }
}
