//! Corrupt input gives a typed one-line error, never a panic: fixed cases, a randomised test
//! over random bytes and mutations of valid HEFs (bounded cases), and kept regression inputs.

#[path = "hef_encoder.rs"]
mod hef_encoder;

use hef_encoder::*;
use kvprobe_npu::hef::{self, Hef, HefError};
use proptest::prelude::*;

/// Everything the inspector does with a file, so a panic anywhere shows up.
fn exercise(bytes: Vec<u8>) {
    if let Ok(h) = Hef::parse(bytes) {
        let _ = hef::lint(&h);
        let _ = hef::describe::to_device_description(&h);
        let _ = serde_json::to_string(&h);
    }
}

#[test]
fn truncated_file() {
    let b = encode(&healthy());
    for len in [0, 5, 11, 12, 30, 55, 56, 200] {
        let e = Hef::parse(b[..len].to_vec()).unwrap_err();
        assert!(
            matches!(
                e,
                HefError::Truncated { .. } | HefError::ProtoOutOfRange { .. }
            ),
            "len {len}: {e}"
        );
        assert!(!e.to_string().contains('\n'));
    }
}

#[test]
fn bad_magic() {
    let mut b = encode(&healthy());
    b[1] = b'X';
    assert!(matches!(
        Hef::parse(b),
        Err(HefError::BadMagic { found: 0x0158_4546 })
    ));
}

#[test]
fn unknown_version() {
    let mut b = encode(&healthy());
    b[7] = 9;
    assert!(matches!(Hef::parse(b), Err(HefError::UnknownVersion(9))));
}

#[test]
fn bad_checksums_for_each_version() {
    for v in [0u32, 1, 2, 3] {
        let mut s = healthy();
        s.container_version = v;
        s.proto_hash = false;
        if v == 0 {
            // v0 holds only the proto
            s.resources.clear();
            s.ccws.clear();
        }
        let mut b = encode(&s);
        assert!(Hef::parse(b.clone()).is_ok(), "v{v} valid");
        let at = b.len() - 1;
        b[at] ^= 0x80;
        let e = Hef::parse(b).unwrap_err();
        assert!(matches!(e, HefError::HashMismatch { .. }), "v{v}: {e}");
    }
    // v3 hashing the proto only: a flipped proto byte fails the proto hash
    let mut b = encode(&healthy());
    b[60] ^= 0x01;
    assert!(matches!(
        Hef::parse(b),
        Err(HefError::HashMismatch {
            what: "proto XXH3-64 (v3)",
            ..
        })
    ));
}

#[test]
fn garbage_protobuf_is_a_typed_error() {
    // valid v1 container around junk: wire type 7 is invalid
    let proto = [0x0f, 0x01, 0x02];
    // CCWs of zeros pad the file past the 56-byte minimum
    let b2 = container(1, false, &proto, &[0; 64], &[]);
    let e = Hef::parse(b2).unwrap_err();
    assert!(matches!(e, HefError::Proto { .. }), "{e}");
    // a length running past the end of the message
    let b3 = container(1, false, &[0x12, 0x40, 0x00], &[0; 64], &[]);
    assert!(matches!(Hef::parse(b3), Err(HefError::Proto { .. })));
    // a known field with the wrong wire type (header as a varint)
    let b4 = container(1, false, &[0x08, 0x01], &[0; 64], &[]);
    assert!(matches!(Hef::parse(b4), Err(HefError::Proto { .. })));
}

#[test]
fn kept_regression_inputs_do_not_panic() {
    let dir =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/hef/regressions");
    let Ok(entries) = std::fs::read_dir(&dir) else {
        return;
    };
    for e in entries.flatten() {
        exercise(std::fs::read(e.path()).unwrap());
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, max_shrink_iters: 2000, ..ProptestConfig::default() })]

    #[test]
    fn random_bytes_never_panic(mut bytes in proptest::collection::vec(any::<u8>(), 0..512), magic in any::<bool>()) {
        if magic && bytes.len() >= 8 {
            bytes[..4].copy_from_slice(&[1, b'H', b'E', b'F']);
            let v = bytes[4] % 4;
            bytes[4..8].copy_from_slice(&[0, 0, 0, v]);
        }
        exercise(bytes);
    }

    /// Mutations of a valid HEF's protobuf, re-wrapped in a container whose hash matches, so the
    /// decoder (not the hash check) sees the damage.
    #[test]
    fn mutated_protobuf_never_panics(
        edits in proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..8),
        cut in any::<prop::sample::Index>(),
        do_cut in any::<bool>(),
    ) {
        let s = healthy();
        let (mut proto, info) = encode_proto(&s);
        for (ix, v) in &edits {
            let i = ix.index(proto.len());
            proto[i] = *v;
        }
        if do_cut {
            proto.truncate(cut.index(proto.len()));
        }
        exercise(container(3, true, &proto, &s.ccws, &info));
        exercise(container(1, false, &proto, &s.ccws, &info));
    }

    /// Raw byte mutations of whole files (header fields included).
    #[test]
    fn mutated_file_never_panics(edits in proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..6)) {
        let mut b = encode(&healthy());
        for (ix, v) in &edits {
            let i = ix.index(64.min(b.len()));
            b[i] = *v;
        }
        exercise(b);
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    /// Extreme hailo-config.json numbers reach the arithmetic of every check.
    #[test]
    fn extreme_config_values_never_panic(kv in any::<u32>(), p in any::<u32>(), nh in any::<u32>(), nkv in any::<u32>()) {
        let mut s = healthy();
        let cfg = serde_json::json!({
            "eos_token_id": 2,
            "pre_process_params": {
                "kv_cache_size": kv, "prefill_input_tokens_count": p,
                "num_attention_heads": nh, "num_key_value_heads": nkv
            }
        });
        s.resources[0].1 = cfg.to_string().into_bytes();
        exercise(encode(&s));
    }
}

/// Cache edges whose padded dimensions multiply and add past 2^64: the sum wrapped (a debug
/// build panicked on the overflow) and a cache length near 2^64 reached the summary and a
/// manifest. Now the description and the manifest are refused; lint and pairing arithmetic
/// saturate.
#[test]
fn cache_length_near_2_pow_64_is_refused_not_wrapped() {
    for padded in [[u32::MAX, u32::MAX, 16], [u32::MAX, 2, 16], [65536, 1, 16]] {
        let mut s = healthy();
        for g in &mut s.groups {
            for c in &mut g.caches {
                c.padded[0] = padded[0];
                c.padded[1] = padded[1];
            }
        }
        let h = Hef::parse(encode(&s)).unwrap();
        let _ = hef::lint(&h);
        let e = hef::describe::to_device_description(&h).unwrap_err();
        assert!(e.to_string().contains("longer than 65535 entries"), "{e}");
        let id = kvprobe_schema::ModelIdentity {
            path: "x".into(),
            sha256: "y".into(),
            architecture: "z".into(),
        };
        assert!(hef::describe::to_sim_manifest(&h, id).is_err());
    }
}
