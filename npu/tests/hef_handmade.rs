//! The hand-assembled fixture (fixtures/hef/handmade_v1.hex): bytes typed in from the contract,
//! so the decoder is checked against something the test encoder did not produce.

use kvprobe_npu::hef::{self, Hef, HefError};
use kvprobe_schema::CacheDirection;

fn handmade() -> Vec<u8> {
    let text = include_str!("fixtures/hef/handmade_v1.hex");
    text.lines()
        .map(|l| l.split('#').next().unwrap_or(""))
        .flat_map(|l| {
            l.split_whitespace()
                .map(|t| u8::from_str_radix(t, 16).expect("hex byte"))
                .collect::<Vec<_>>()
        })
        .collect()
}

#[test]
fn handmade_fixture_decodes_to_the_values_typed_in() {
    let bytes = handmade();
    assert_eq!(bytes.len(), 28 + 159 + 4);
    let h = Hef::parse(bytes).unwrap();
    assert_eq!(h.header.version, 1);
    assert_eq!(h.header.proto_size, 159);
    assert_eq!(h.header.ccws_size, 4);
    assert_eq!(h.header.zero_point(), 28 + 159);
    // Hef::hash() of v1: the u32 CRC's bytes in little-endian memory order (§5.1)
    assert_eq!(h.header_checks.hash_string, "aec63b88");
    assert_eq!(h.hw_arch, 103);
    assert_eq!(h.proto_version, 1);
    assert_eq!(h.extensions, vec![26]);
    assert_eq!(h.groups.len(), 1);
    let g = &h.groups[0];
    assert_eq!(g.name, "h__prefill");
    assert!(!g.net_flow);
    assert_eq!(g.contexts, 2);
    assert_eq!(g.cache_edges.len(), 2);
    let (i, o) = (&g.cache_edges[0], &g.cache_edges[1]);
    assert_eq!(
        (i.cache_id, i.direction, i.name.as_str()),
        (-1, CacheDirection::Input, "c")
    );
    assert_eq!(
        (o.cache_id, o.direction, o.name.as_str()),
        (-1, CacheDirection::Output, "d")
    );
    // E = 48 → page 64 → Ep 64 (contract §1.2 table); in = 2·1, out = 6·1, so L = 8
    assert_eq!((i.entry_size, i.padded_entry_size, i.length), (48, 64, 2));
    assert_eq!((o.entry_size, o.padded_entry_size, o.length), (48, 64, 6));
    assert_eq!((i.quant.zero_point, i.quant.scale), (128.0, 0.5));
    assert_eq!((i.format_code, i.data_bytes, o.context_index), (0, 1, 1));
    assert_eq!(h.resource("r"), Some(&b"ABCD"[..]));
    let ids: Vec<&str> = hef::lint(&h).iter().map(|l| l.id).collect();
    assert!(ids.contains(&"cache-negative-id"), "{ids:?}");
    assert!(ids.contains(&"header-version"), "{ids:?}");
}

#[test]
fn handmade_fixture_with_one_flipped_byte_fails_its_crc() {
    let mut bytes = handmade();
    let n = bytes.len();
    bytes[n - 1] ^= 1;
    assert!(matches!(
        Hef::parse(bytes),
        Err(HefError::HashMismatch { .. })
    ));
}
