//! The one generator of the unit tests' generated cases: xorshift64*, seeded, so a failing case reproduces from its seed.

/// A small deterministic PRNG (xorshift64*). The seed must not be zero.
pub struct Rng(pub u64);

impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// A number in `0..n` (0 when `n` is 0).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }

    /// An index in `0..len` (0 when `len` is 0).
    pub fn index(&mut self, len: usize) -> usize {
        self.below(len as u64) as usize
    }

    /// One element of a non-empty slice.
    pub fn pick<T: Copy>(&mut self, from: &[T]) -> T {
        from[self.index(from.len())]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_seed_gives_one_sequence_and_every_value_stays_in_range() {
        let (mut a, mut b) = (Rng(7), Rng(7));
        let mut seen = [false; 5];
        for _ in 0..1000 {
            assert_eq!(a.next(), b.next());
            let i = a.index(5);
            b.index(5);
            seen[i] = true;
        }
        assert!(seen.iter().all(|s| *s), "every index of 0..5 comes up");
        assert_eq!(a.below(0), 0);
    }
}
