//! The scan for a NaN or infinity over a weight's f32 values, apart from the load's checks
//! (`finite.rs`), which reach the stored weights (`store.rs`) that call it.

/// Index of the first NaN or infinity in `v`. Per chunk, an OR over "magnitude bits above the
/// largest finite value" is a reduction the compiler vectorises with the baseline x86-64 (SSE2)
/// instructions: a compare and an OR per four values. The largest exponent field it replaced
/// needed an unsigned max SSE2 lacks (2.9 instructions a value, a fifth of a SmolLM2
/// `ref generate`'s instructions in callgrind), an early-exit search before that was slower
/// still. Only the chunk that holds a non-finite value is searched value by value.
pub(crate) fn first_non_finite_f32(v: &[f32]) -> Option<usize> {
    // |x| as bits: non-finite exactly when above f32::MAX's bits (a non-negative i32 compare)
    const MAG: u32 = 0x7fff_ffff;
    const MAX_FINITE: i32 = 0x7f7f_ffff;
    const CHUNK: usize = 4096;
    v.chunks(CHUNK).enumerate().find_map(|(c, chunk)| {
        let any = chunk.iter().fold(0u32, |a, x| {
            a | u32::from((x.to_bits() & MAG) as i32 > MAX_FINITE)
        });
        (any != 0)
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

    #[test]
    fn random_bit_patterns_agree_with_is_finite() {
        // the magnitude compare against a value-by-value search, on random finite values with a
        // sprinkle of NaN/infinity bit patterns (either sign)
        let mut s = 0x1234_5678_9abc_def0u64;
        let mut next = || {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            s
        };
        for _ in 0..200 {
            let v: Vec<f32> = (0..5000)
                .map(|_| {
                    let r = next();
                    let sign = r as u32 & 0x8000_0000;
                    let bits = if r % 97 == 0 {
                        (r >> 11) as u32 | 0x7f80_0000
                    } else {
                        (r >> 20) as u32 & 0x7f7f_ffff
                    };
                    f32::from_bits(bits | sign)
                })
                .collect();
            let want = v.iter().position(|x| !x.is_finite());
            assert_eq!(first_non_finite_f32(&v), want);
        }
    }
}
