//! Seeded mutations of valid inputs: bit flips, interesting bytes, truncation, growth, length
//! fields set to extremes (u32/u64, both byte orders), splices of the seeds, and for JSON numbers
//! replaced by extremes, so most inputs stay well-formed enough to reach the checks behind the
//! first parse.

/// xorshift64*: small, seedable, and the same sequence on every machine.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1)
    }
    pub fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    pub fn below(&mut self, n: usize) -> usize {
        if n == 0 {
            0
        } else {
            (self.next() % n as u64) as usize
        }
    }
}

const EXTREMES: [u64; 10] = [
    0,
    1,
    0x7f,
    0xff,
    0x7fff_ffff,
    0xffff_ffff,
    0x1_0000_0000,
    i64::MAX as u64,
    u64::MAX,
    u64::MAX - 1,
];

const NUMBERS: [&str; 12] = [
    "0",
    "-1",
    "1e308",
    "-1e308",
    "1e39",
    "18446744073709551615",
    "18446744073709551616",
    "4294967296",
    "2147483648",
    "0.0",
    "-0.5",
    "65536",
];

/// One to four mutations of `input`; `others` are the seeds a splice may copy from.
pub fn mutate(rng: &mut Rng, input: &[u8], others: &[Vec<u8>], json: bool) -> Vec<u8> {
    let mut b = input.to_vec();
    for _ in 0..1 + rng.below(4) {
        match rng.below(if json { 9 } else { 8 }) {
            0 => flip_bits(rng, &mut b),
            1 => {
                if !b.is_empty() {
                    let i = rng.below(b.len());
                    b[i] = EXTREMES[rng.below(EXTREMES.len())] as u8;
                }
            }
            2 => b.truncate(rng.below(b.len() + 1)),
            3 => {
                for _ in 0..1 + rng.below(64) {
                    b.insert(rng.below(b.len() + 1), rng.next() as u8);
                }
            }
            4 | 5 => length_field(rng, &mut b),
            6 => splice(rng, &mut b, others),
            7 => {
                // drop or repeat a chunk
                if !b.is_empty() {
                    let s = rng.below(b.len());
                    let e = (s + 1 + rng.below(256)).min(b.len());
                    if rng.below(2) == 0 {
                        b.drain(s..e);
                    } else {
                        let chunk = b[s..e].to_vec();
                        let at = rng.below(b.len() + 1);
                        b.splice(at..at, chunk);
                    }
                }
            }
            _ => json_number(rng, &mut b),
        }
    }
    b
}

fn flip_bits(rng: &mut Rng, b: &mut [u8]) {
    if b.is_empty() {
        return;
    }
    for _ in 0..1 + rng.below(8) {
        let i = rng.below(b.len());
        b[i] ^= 1 << rng.below(8);
    }
}

fn length_field(rng: &mut Rng, b: &mut [u8]) {
    let width = if rng.below(2) == 0 { 4 } else { 8 };
    if b.len() < width {
        return;
    }
    let mut at = rng.below(b.len() - width + 1);
    if rng.below(2) == 0 {
        at -= at % width;
    }
    let v = EXTREMES[rng.below(EXTREMES.len())];
    let bytes = if rng.below(2) == 0 {
        v.to_le_bytes()
    } else {
        v.to_be_bytes()
    };
    let bytes = if width == 4 {
        if rng.below(2) == 0 {
            &bytes[..4]
        } else {
            &bytes[4..]
        }
    } else {
        &bytes[..]
    };
    b[at..at + width].copy_from_slice(bytes);
}

fn splice(rng: &mut Rng, b: &mut Vec<u8>, others: &[Vec<u8>]) {
    let Some(src) = others.get(rng.below(others.len())) else {
        return;
    };
    if src.is_empty() {
        return;
    }
    let s = rng.below(src.len());
    let e = (s + 1 + rng.below(512)).min(src.len());
    let at = rng.below(b.len() + 1);
    let end = (at + rng.below(512)).min(b.len());
    b.splice(at..end, src[s..e].iter().copied());
}

/// Replace one run of digits (a JSON number, most likely) with an extreme number.
fn json_number(rng: &mut Rng, b: &mut Vec<u8>) {
    let starts: Vec<usize> = (0..b.len())
        .filter(|&i| b[i].is_ascii_digit() && (i == 0 || !b[i - 1].is_ascii_digit()))
        .collect();
    let Some(&s) = starts.get(rng.below(starts.len())) else {
        return;
    };
    let mut e = s;
    while e < b.len() && (b[e].is_ascii_digit() || b[e] == b'.' || b[e] == b'e' || b[e] == b'-') {
        e += 1;
    }
    let s = if s > 0 && b[s - 1] == b'-' { s - 1 } else { s };
    let n = NUMBERS[rng.below(NUMBERS.len())];
    b.splice(s..e, n.bytes());
}
